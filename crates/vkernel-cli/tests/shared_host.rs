//! One `vkernel host` shared by root and another user (`nobody`, through
//! runuser): the other user's program cannot take over a name root's
//! service registered, and says so; root's clients still reach root's
//! service. The tests need root and runuser; without them they skip,
//! unless VKERNEL_REQUIRE_NETNS=1 (as in CI) makes that a failure.

mod common;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{spawn_serving, wait_for, Proc, BIN};

/// Whether programs can run as `nobody` here.
fn can_run_as_nobody() -> bool {
    let runuser = Command::new("runuser").arg("--help").output().is_ok();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if runuser && root {
        return true;
    }
    let why = if runuser {
        "not root"
    } else {
        "runuser is missing"
    };
    if std::env::var("VKERNEL_REQUIRE_NETNS").as_deref() == Ok("1") {
        panic!("cannot run programs as nobody: {why}");
    }
    eprintln!("skipped: cannot run programs as nobody: {why}");
    false
}

/// A machine host anyone may attach to.
fn host(sock: &std::path::Path) -> Proc {
    let (p, line) = spawn_serving([
        OsStr::new("host"),
        OsStr::new("--exit-after"),
        OsStr::new("120s"),
        OsStr::new("--socket-mode"),
        OsStr::new("666"),
        OsStr::new("--socket"),
        sock.as_os_str(),
    ]);
    assert!(line.contains("programs attach at"), "{line}");
    p
}

/// The pid after `= pid ` in a banner line.
fn banner_pid(line: &str) -> String {
    line.split("= pid ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
        .to_string()
}

/// `vkernel ping -n 3 --attach SOCK` as root: the pid it reached.
fn ping_reaches(sock: &std::path::Path) -> String {
    let out = Command::new(BIN)
        .args(["ping", "-n", "3", "--attach"])
        .arg(sock)
        .output()
        .expect("ping");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    banner_pid(&text)
}

#[test]
fn another_users_echo_cannot_take_over_roots_name() {
    if !can_run_as_nobody() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("vk-cli-shared-{}", std::process::id()));
    let sock = dir.join("host.sock");
    let _h = host(&sock);
    let (_echo, line) = spawn_serving(
        ["echo", "--exit-after", "120s", "--attach"]
            .iter()
            .map(OsStr::new)
            .chain([sock.as_os_str()]),
    );
    let roots = banner_pid(&line);
    assert_eq!(ping_reaches(&sock), roots);

    // nobody's echo under the same name: refused, with one clear line.
    let mut theirs = Proc(
        Command::new("runuser")
            .args(["-u", "nobody", "--", BIN, "echo", "--exit-after", "20s"])
            .arg("--attach")
            .arg(&sock)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runuser"),
    );
    let status = wait_for(
        Duration::from_secs(10),
        "nobody's echo ends at once, refused",
        || theirs.0.try_wait().ok().flatten(),
    );
    let mut err = String::new();
    BufReader::new(theirs.0.stderr.take().expect("stderr"))
        .read_line(&mut err)
        .expect("stderr");
    assert!(!status.success(), "nobody's echo was not refused: {err}");
    assert!(
        err.contains("cannot register \"echo\"") && err.contains("another user"),
        "{err}"
    );
    // Root's clients still reach root's echo.
    assert_eq!(ping_reaches(&sock), roots);

    // A name of its own is fine, and root's ping still finds root's echo.
    let mut own = Command::new("runuser")
        .args(["-u", "nobody", "--", BIN, "echo", "--name", "nobodys-echo"])
        .args(["--exit-after", "20s", "--attach"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("runuser");
    let mut banner = String::new();
    BufReader::new(own.stdout.take().expect("stdout"))
        .read_line(&mut banner)
        .expect("banner");
    let _own = Proc(own);
    assert!(banner.contains("\"nobodys-echo\""), "{banner}");
    assert_eq!(ping_reaches(&sock), roots);
}
