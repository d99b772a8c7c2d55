//! A client with the wrong cluster key is told so, not that the name is
//! unknown or the host silent.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;
use common::{Proc, BIN};

fn keyfile(tag: &str, hex: char) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("vk-wrongkey-{tag}-{}", std::process::id()));
    std::fs::write(&p, format!("1:{}\n", hex.to_string().repeat(64))).expect("key file");
    p
}

#[test]
fn ping_with_the_wrong_key_says_authentication_failed() {
    let good = keyfile("a", 'a');
    let bad = keyfile("b", 'b');
    let mut c = Command::new(BIN)
        .args([
            "echo",
            "--bind",
            "127.0.0.1:0",
            "--exit-after",
            "60s",
            "--key-file",
        ])
        .arg(&good)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn echo");
    let mut line = String::new();
    BufReader::new(c.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("banner");
    let _echo = Proc(c);
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .expect("address")
        .to_string();
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
