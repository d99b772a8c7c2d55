//! Helpers shared by the CLI's integration tests.
#![allow(dead_code)] // each test binary uses a part

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `vkernel` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_vkernel");

/// A child process killed (and reaped) on drop, so no test leaves one
/// running.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `cond` every few milliseconds until it gives a value; panics
/// with `what` after `limit`. A hang guard, so that a broken build fails
/// instead of holding CI; never a speed check (limits are generous).
pub fn wait_for<T>(limit: Duration, what: &str, mut cond: impl FnMut() -> Option<T>) -> T {
    wait_for_why(limit, what, || cond().ok_or_else(String::new))
}

/// [`wait_for`] whose condition says why it does not hold yet: the last
/// reason goes into the panic message.
pub fn wait_for_why<T>(
    limit: Duration,
    what: &str,
    mut cond: impl FnMut() -> Result<T, String>,
) -> T {
    let t = Instant::now();
    loop {
        let why = match cond() {
            Ok(v) => return v,
            Err(why) => why,
        };
        if t.elapsed() > limit {
            panic!(
                "{what} (waited {limit:?}){}{why}",
                if why.is_empty() { "" } else { "; last: " }
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts `vkernel` with `args` and reads its first stdout line (the
/// banner a service prints once it serves); returns both.
pub fn spawn_serving<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> (Proc, String) {
    let mut c = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn vkernel");
    let mut line = String::new();
    BufReader::new(c.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("banner");
    (Proc(c), line)
}

/// The address in a banner's "listening on ADDR;".
pub fn listening_addr(banner: &str) -> String {
    banner
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .expect("address")
        .to_string()
}

/// Starts `vkernel echo` on a free loopback port with `extra` arguments
/// (it stops by itself after 60 s); returns it, its address and its
/// banner line.
pub fn echo(extra: &[&std::ffi::OsStr]) -> (Proc, String, String) {
    let args = ["echo", "--bind", "127.0.0.1:0", "--exit-after", "60s"];
    let (p, line) = spawn_serving(
        args.iter()
            .map(std::ffi::OsStr::new)
            .chain(extra.iter().copied()),
    );
    let addr = listening_addr(&line);
    (p, addr, line)
}

/// Runs a shell walk-through from the docs as written: `bash -euo
/// pipefail` in the fresh directory `dir`, with this build's `vkernel`
/// first on PATH, in a process group of its own that is killed at the end
/// (servers it left running go too). A hang guard of `limit`; returns the
/// exit status with stdout and stderr.
pub fn run_walk_through(
    script: &str,
    dir: &std::path::Path,
    limit: Duration,
) -> (std::process::ExitStatus, String, String) {
    use std::os::unix::process::CommandExt;
    struct Group(i32);
    impl Drop for Group {
        fn drop(&mut self) {
            // SAFETY: kill takes no pointers; a negative pid names the
            // group this helper created for the script.
            unsafe { libc::kill(-self.0, libc::SIGKILL) };
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (out_f, err_f) = (dir.join(".stdout"), dir.join(".stderr"));
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir) // no target/release here: PATH finds this build
        .env("PATH", path)
        .env_remove("VKERNEL_HOST")
        .env_remove("VKERNEL_CONFIG")
        .process_group(0)
        // Files, not pipes: a server left running must not hold them open.
        .stdout(std::fs::File::create(&out_f).unwrap())
        .stderr(std::fs::File::create(&err_f).unwrap())
        .spawn()
        .unwrap();
    let g = Group(child.id() as i32);
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            drop(g);
            let e = std::fs::read_to_string(&err_f).unwrap_or_default();
            panic!("the walk-through hung (waited {limit:?}):\n{script}\n{e}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(g);
    let o = std::fs::read_to_string(&out_f).unwrap_or_default();
    let e = std::fs::read_to_string(&err_f).unwrap_or_default();
    (status, o, e)
}

/// Sends `signal` (a name, `TERM`, or a number) to `pid` with kill(1).
pub fn kill_with(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

/// Waits up to 5 s for `c` to exit (a hang guard).
pub fn exits_within(c: &mut Child, what: &str) -> std::process::ExitStatus {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        assert!(
            Instant::now() < end,
            "{what} still running 5 s after the signal"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops a service as systemd or podman would (SIGTERM) and checks that
/// it exits 0.
pub fn stop_with_sigterm(mut p: Proc) {
    kill_with(p.0.id(), "TERM");
    let s = exits_within(&mut p.0, "the service");
    assert!(s.success(), "exit after SIGTERM: {s}");
}
