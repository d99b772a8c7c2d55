//! `vkernel disk`, `vkernel disk-cli` and `vkernel nbd` as separate OS
//! processes over loopback, with real NBD clients where installed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;
use common::{Proc, BIN};

/// Starts a vkernel command that exits by itself, and returns it with the
/// first `n` lines it printed.
fn start(args: &[&str], n: usize) -> (Proc, Vec<String>) {
    let mut c = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn vkernel");
    let mut r = BufReader::new(c.stdout.take().expect("stdout"));
    let mut lines = Vec::new();
    for _ in 0..n {
        let mut l = String::new();
        r.read_line(&mut l).expect("banner");
        lines.push(l);
    }
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    (Proc(c), lines)
}

/// The word after `marker` in `line`.
fn after(line: &str, marker: &str) -> String {
    line.split_whitespace()
        .skip_while(|w| *w != marker)
        .nth(1)
        .unwrap_or_else(|| panic!("no `{marker}` in {line:?}"))
        .trim_end_matches([';', ','])
        .to_string()
}

fn vk(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN).args(args).output().expect("run vkernel");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var("VKERNEL_REQUIRE_NBD_TOOLS").as_deref() == Ok("1") {
        panic!("{tool} is required (VKERNEL_REQUIRE_NBD_TOOLS=1) but not installed");
    }
    ok
}

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vk-disk-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmpdir");
    d
}

#[test]
fn disk_with_nbd_disk_cli_and_a_remote_gateway_agree_on_the_bytes() {
    let dir = tmp("agree");
    let (_disk, lines) = start(
        &[
            "disk",
            "--backing",
            "ram:4M",
            "--owner-key",
            "0x77",
            "--nbd",
            "127.0.0.1:0",
            "--exit-after",
            "60s",
        ],
        2,
    );
    let disk_addr = after(&lines[0], "on");
    assert!(lines[1].contains("NBD export"), "{lines:?}");
    let local_nbd = after(&lines[1], "on");

    // disk-cli: capacity, a write of a file and a read back of it.
    let peer = ["--peer", disk_addr.as_str(), "--disk-key", "0x77"];
    let (ok, out, err) = vk(&[&["disk-cli"][..], &peer, &["capacity"]].concat());
    assert!(ok, "{out}{err}");
    assert!(out.contains("8192 blocks of 512 bytes"), "{out}");
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let input = dir.join("in.bin");
    std::fs::write(&input, &data).expect("write input");
    let input_s = input.to_str().expect("utf-8 path");
    let (ok, out, err) = vk(&[
        &["disk-cli"][..],
        &peer,
        &["write", "--offset", "1M", "--input", input_s, "--fua"],
    ]
    .concat());
    assert!(ok && out.contains("wrote 65536 bytes"), "{out}{err}");
    let back = dir.join("back.bin");
    let back_s = back.to_str().expect("utf-8 path");
    let (ok, out, err) = vk(&[
        &["disk-cli"][..],
        &peer,
        &["read", "--offset", "1M", "--length", "64K", "--out", back_s],
    ]
    .concat());
    assert!(ok, "{out}{err}");
    assert_eq!(std::fs::read(&back).expect("read back"), data);

    // A wrong key is refused with a clear error, not a hang.
    let (ok, _, err) = vk(&[
        "disk-cli",
        "--peer",
        &disk_addr,
        "--disk-key",
        "0x78",
        "capacity",
    ]);
    assert!(!ok && !err.is_empty(), "{err}");

    // A gateway on another logical host (another OS process).
    let (_gw, glines) = start(
        &[
            "nbd",
            "--peer",
            &disk_addr,
            "--disk-key",
            "0x77",
            "--listen",
            "127.0.0.1:0",
            "--exit-after",
            "60s",
        ],
        1,
    );
    let remote_nbd = after(&glines[0], "on");

    if !have("nbdcopy") {
        return;
    }
    // Both exports hold the bytes disk-cli wrote; a write through one is
    // read through the other (each round writes a different pattern, so
    // the second round cannot pass on the first round's bytes).
    let copy = |from: &str, to: &str| {
        let st = Command::new("nbdcopy")
            .args([from, to])
            .status()
            .expect("nbdcopy");
        assert!(st.success(), "nbdcopy {from} {to}");
    };
    let whole = dir.join("whole.img");
    let again = dir.join("again.img");
    let (whole_s, again_s) = (
        whole.to_str().expect("utf-8 path"),
        again.to_str().expect("utf-8 path"),
    );
    for (round, (a, b)) in [(&local_nbd, &remote_nbd), (&remote_nbd, &local_nbd)]
        .into_iter()
        .enumerate()
    {
        let (a, b) = (format!("nbd://{a}"), format!("nbd://{b}"));
        copy(&a, whole_s);
        let img = std::fs::read(&whole).expect("image");
        assert_eq!(img.len(), 4 << 20);
        assert_eq!(&img[1 << 20..(1 << 20) + data.len()], &data[..]);
        let mut changed = img.clone();
        for (i, x) in changed.iter_mut().enumerate().take(1 << 20) {
            *x = (i % 13) as u8 ^ (0x40 << round);
        }
        assert_ne!(changed, img);
        std::fs::write(&whole, &changed).expect("write image");
        copy(whole_s, &a);
        copy(&b, again_s);
        assert!(
            std::fs::read(&again).expect("again") == changed,
            "a write through {a} did not read back through {b}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn disk_refuses_a_bad_nbd_address_clearly() {
    let (ok, _, err) = vk(&[
        "disk",
        "--backing",
        "ram:1M",
        "--nbd",
        "not-an-address",
        "--exit-after",
        "1s",
    ]);
    assert!(!ok, "{err}");
    assert!(err.contains("--nbd") || err.contains("address"), "{err}");
}
