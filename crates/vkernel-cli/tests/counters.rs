//! What `ping` reports agrees with what happened: bulk chunks re-sent
//! under loss are counted as retransmissions.

use std::process::Command;

mod common;
use common::BIN;

#[test]
fn ping_counts_bulk_retransmissions() {
    let (_echo, addr, _) = common::echo(&[]);
    let o = Command::new(BIN)
        .args(["ping", "--peer", &addr, "-n", "8", "--bulk", "4194304"])
        .args(["--fault", "loss=0.05,seed=11"])
        .output()
        .expect("run ping");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    // "retransmissions T (R requests, B bulk chunks)"
    let tail = out
        .split("retransmissions ")
        .nth(1)
        .unwrap_or_else(|| panic!("no retransmissions line: {out}"));
    let nums: Vec<u64> = tail
        .split(|ch: char| !ch.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .take(3)
        .map(|w| w.parse().expect("number"))
        .collect();
    assert_eq!(nums.len(), 3, "{out}");
    assert!(
        nums[2] > 0,
        "bulk chunks lost at 5 % but none re-sent: {out}"
    );
    assert_eq!(nums[0], nums[1] + nums[2], "{out}");
}

/// `ping --bulk --json` reports the rate and the counters, for the move
/// echo (transport alone) and the older inverting one: the same bytes
/// moved, and the move echo's rate is the one its median gives.
#[test]
fn ping_bulk_json_reports_the_rate_of_both_echoes() {
    let (_echo, addr, _) = common::echo(&[]);
    for invert in [false, true] {
        let mut c = Command::new(BIN);
        c.args(["ping", "--peer", &addr, "-n", "3", "--warmup", "1"])
            .args(["--bulk", "4194304", "--json"]);
        if invert {
            c.arg("--invert");
        }
        let o = c.output().expect("run ping");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{out}");
        let j: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
        assert_eq!(j["failures"], 0, "{out}");
        let median = j["summary"]["median_us"].as_f64().expect("median");
        let rate = j["mb_per_s"].as_f64().expect("mb_per_s");
        let want = 2.0 * 4_194_304.0 / median;
        assert!((rate - want).abs() < 1e-6 * want, "{rate} vs {want}: {out}");
        assert!(j["bulk_duplicates"].is_u64(), "{out}");
    }
    // A plain ping has no rate.
    let o = Command::new(BIN)
        .args(["ping", "--peer", &addr, "-n", "3", "--json"])
        .output()
        .expect("run ping");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(j["mb_per_s"].is_null(), "{j}");
    // --invert needs --bulk.
    let o = Command::new(BIN)
        .args(["ping", "--peer", &addr, "--invert"])
        .output()
        .expect("run ping");
    assert!(!o.status.success());
}

/// `--cipher aes-256-gcm` encrypts with AES-256-GCM: a ping and an echo
/// that both name it exchange (bulk included); one that does not is
/// refused; the flag without `--encrypt`, or an unknown cipher, is a
/// usage error.
#[test]
fn ping_and_echo_agree_on_the_cipher() {
    let key = "1:4242424242424242424242424242424242424242424242424242424242424242";
    let args = ["--key", key, "--encrypt", "--cipher", "aes-256-gcm"];
    let aes: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let (_echo, addr, _) = common::echo(&aes);
    let ping = |extra: &[&str]| {
        Command::new(BIN)
            .args(["ping", "--peer", &addr, "-n", "3", "--warmup", "0"])
            .args(["--bulk", "1048576", "--deadline", "2s", "--key", key])
            .args(extra)
            .output()
            .expect("run ping")
    };
    let o = ping(&["--encrypt", "--cipher", "aes-256-gcm"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("failures 0"), "{out}");
    let o = ping(&["--encrypt"]);
    assert!(!o.status.success(), "ChaCha20-Poly1305 against AES-256-GCM");
    let o = ping(&["--cipher", "aes-256-gcm"]);
    assert_eq!(o.status.code(), Some(2), "--cipher without --encrypt");
    let o = ping(&["--encrypt", "--cipher", "rot13"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("chacha20-poly1305 or aes-256-gcm"));
}
