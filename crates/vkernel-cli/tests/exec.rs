//! `vkernel teamserver` and `vkernel run` as real processes on loopback:
//! a program stored on a file server runs on a team server's host with
//! stdio over V pipes; killing `vkernel run` leaves no orphan.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{listening_addr, Proc, BIN};

struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts a service bound to a port the kernel picks (`--bind
/// 127.0.0.1:0`, so no other test can take it between choice and bind);
/// returns it and the address its banner names.
fn start(args: &[&str]) -> (Proc, String) {
    let mut c = Command::new(BIN)
        .args(args)
        .args(["--bind", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    BufReader::new(c.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("banner");
    assert!(line.contains("listening"), "{line}");
    (Proc(c), listening_addr(&line))
}

#[test]
fn run_executes_a_stored_program_on_a_team_server_and_cleans_up() {
    let dir = Scratch(std::env::temp_dir().join(format!("vkernel-exec-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let put = |name: &str, body: &str| {
        let p = dir.0.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    put(
        "hello.sh",
        "#!/bin/sh\necho \"hello $1\"\ntr a-z A-Z\necho warn >&2\nexit 7\n",
    );
    put("pid.sh", "#!/bin/sh\necho $$\nexec sleep 60\n");
    let root = dir.0.to_string_lossy().into_owned();
    let (_fs, fs_addr) = start(&["fileserver", "--root", &root, "--exit-after", "60s"]);
    let (_ts, ts_addr) = start(&[
        "teamserver",
        "--peer",
        &fs_addr,
        "--host-timeout",
        "1s",
        "--exit-after",
        "60s",
    ]);
    let common = [
        "run",
        "--peer",
        fs_addr.as_str(),
        "--peer",
        ts_addr.as_str(),
        "--fs",
        fs_addr.as_str(),
    ];
    // stdin in, stdout and stderr out, exit code back.
    let mut c = Command::new(BIN)
        .args(common)
        .args(["--on", "any", "hello.sh", "there"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b"shout this\n").unwrap();
    let o = c.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(7), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "hello there\nSHOUT THIS\n"
    );
    assert_eq!(String::from_utf8_lossy(&o.stderr), "warn\n");
    // A missing program: a clear error and exit status 1.
    let o = Command::new(BIN)
        .args(common)
        .args(["--on", &ts_addr, "nope.sh"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ENOENT"),
        "{o:?}"
    );
    // SIGKILL the client: the program (and its group) goes too.
    let mut c = Proc(
        Command::new(BIN)
            .args(common)
            .args(["pid.sh"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(c.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line.trim().parse().expect("the program's pid");
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    assert!(proc_dir.exists());
    c.0.kill().unwrap();
    let _ = c.0.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!proc_dir.exists(), "the program outlived its killed client");
}

/// What the first test leaves out: a program ended by a signal gives
/// 128 + N, a team server started with `--refuse-remote` refuses a client
/// on another logical host with a clear error, and `--on` naming a host
/// without a team server fails clearly instead of hanging.
#[test]
fn run_reports_signals_refusals_and_missing_team_servers() {
    let dir = Scratch(std::env::temp_dir().join(format!("vkernel-exec2-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let p = dir.0.join("term.sh");
    std::fs::write(&p, "#!/bin/sh\necho before\nkill -TERM $$\necho after\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = dir.0.to_string_lossy().into_owned();
    let (_fs, fs_addr) = start(&["fileserver", "--root", &root, "--exit-after", "60s"]);
    let (_ts, ts_addr) = start(&["teamserver", "--peer", &fs_addr, "--exit-after", "60s"]);
    let (_strict, strict_addr) = start(&[
        "teamserver",
        "--peer",
        &fs_addr,
        "--refuse-remote",
        "--exit-after",
        "60s",
    ]);
    let run = |on: &str, prog: &str| {
        let mut c = Command::new(BIN);
        c.args(["run", "--peer", &fs_addr, "--peer", &ts_addr])
            .args(["--peer", &strict_addr, "--fs", &fs_addr, "--on", on, prog])
            .stdin(Stdio::null());
        let started = Instant::now();
        let o = c.output().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "`vkernel run` took {:?}",
            started.elapsed()
        );
        o
    };
    // SIGTERM (15) ends the program: exit status 143, output before it kept.
    let o = run(&ts_addr, "term.sh");
    assert_eq!(o.status.code(), Some(128 + 15), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "before\n");
    // The strict team server refuses this client (another logical host).
    let o = run(&strict_addr, "term.sh");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("EACCES"), "{err}");
    assert!(o.stdout.is_empty(), "nothing ran: {o:?}");
    // The file server's host runs no team server.
    let o = run(&fs_addr, "term.sh");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("team server"), "{err}");
}
