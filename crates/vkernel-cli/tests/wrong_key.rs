//! A client with the wrong cluster key is told so, not that the name is
//! unknown or the host silent.

use std::process::Command;

mod common;
use common::BIN;

fn keyfile(tag: &str, hex: char) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("vk-wrongkey-{tag}-{}", std::process::id()));
    std::fs::write(&p, format!("1:{}\n", hex.to_string().repeat(64))).expect("key file");
    p
}

#[test]
fn ping_with_the_wrong_key_says_authentication_failed() {
    let good = keyfile("a", 'a');
    let bad = keyfile("b", 'b');
    let (_echo, addr, line) = common::echo(&["--key-file".as_ref(), good.as_os_str()]);
    let pid = line
        .rsplit("= pid ")
        .next()
        .expect("pid")
        .trim()
        .to_string();
    let ping = |extra: &[&str], key: &std::path::Path| {
        let o = Command::new(BIN)
            .args(["ping", "--peer", &addr, "-n", "3", "--stop-on-error"])
            .args(["--host-timeout", "1s", "--key-file"])
            .arg(key)
            .args(extra)
            .output()
            .expect("run ping");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    // The right key works (the test can tell the two apart).
    let (ok, err) = ping(&[], &good);
    assert!(ok, "{err}");
    // By name and by pid, the wrong key is named as the cause.
    for extra in [&[][..], &["--pid", pid.as_str()][..]] {
        let (ok, err) = ping(extra, &bad);
        assert!(!ok, "a wrong key must fail");
        assert!(err.contains("failed authentication"), "{extra:?}: {err}");
    }
    let _ = std::fs::remove_file(good);
    let _ = std::fs::remove_file(bad);
}
