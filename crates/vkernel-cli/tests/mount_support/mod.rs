//! The FUSE tests' common parts: a scratch directory, `vkernel` child
//! processes stopped on drop, a file server with one or two mounts of it,
//! and shell scripts run under a deadline.
#![allow(dead_code)] // each test binary uses a part

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
pub const BIN: &str = env!("CARGO_BIN_EXE_vkernel");

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// None (with a printed reason) if the FUSE tests cannot run here.
pub fn fuse_available() -> Option<()> {
    let mut missing = Vec::new();
    if !Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse");
    }
    for c in ["fusermount3", "git", "sqlite3", "tar", "sha256sum", "diff"] {
        if !have(c) {
            missing.push(c);
        }
    }
    if missing.is_empty() {
        return Some(());
    }
    if std::env::var("VKERNEL_REQUIRE_FUSE").as_deref() == Ok("1") {
        panic!("FUSE tests required but missing: {missing:?} (install fuse3, git, sqlite3)");
    }
    eprintln!(
        "skipping FUSE test: missing {missing:?} (set VKERNEL_REQUIRE_FUSE=1 to fail instead)"
    );
    None
}

/// A scratch directory removed on drop (after the mount is gone).
pub struct Scratch(pub PathBuf);

/// A scratch directory and the subdirectories `names` made in it.
pub fn scratch_with(tag: &str, names: &[&str]) -> (Scratch, Vec<PathBuf>) {
    let work = Scratch::new(tag);
    let dirs: Vec<PathBuf> = names.iter().map(|n| work.path().join(n)).collect();
    for d in &dirs {
        std::fs::create_dir(d).expect("scratch subdirectory");
    }
    (work, dirs)
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let p =
            std::env::temp_dir().join(format!("vkernel-fuse-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }

    /// A scratch directory with a short path (a Unix socket's path must
    /// fit in 108 bytes).
    pub fn short(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("v{tag}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !mounted(&self.0.join("mnt")) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub fn mounted(mnt: &Path) -> bool {
    let m = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let want = mnt.to_string_lossy().to_string();
    m.lines()
        .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
}

/// A child process stopped (TERM, then KILL) when dropped.
pub struct Proc {
    pub child: Child,
    pub name: &'static str,
}

impl Proc {
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// Waits up to `limit` for the exit status.
    pub fn wait_for(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGTERM);
            if self.wait_for(Duration::from_secs(5)).is_none() {
                eprintln!("{} did not stop on SIGTERM; killing it", self.name);
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

/// Starts `vkernel ARGS` and waits (bounded) for a stdout line containing
/// `ready`; returns the process and that line.
pub fn start(name: &'static str, args: &[&str], ready: &str) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn vkernel");
    let out = child.stdout.take().expect("stdout");
    let p = Proc { child, name };
    let (tx, rx) = mpsc::channel();
    let ready = ready.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains(&ready) {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{name} did not become ready"));
    (p, line)
}

/// A file server and a mount of it, torn down (unmounted) on drop.
pub struct Mount {
    pub mnt: PathBuf,
    pub mount: Option<Proc>,
    pub server: Option<Proc>,
}

impl Mount {
    pub fn new(root: &Path, mnt: &Path) -> Mount {
        Mount::with(root, mnt, &[])
    }

    /// A mount with extra `vkernel mount` arguments.
    pub fn with(root: &Path, mnt: &Path, extra: &[&str]) -> Mount {
        let (server, addr) = fileserver(root, "127.0.0.1:0");
        let mut args = vec![
            "mount",
            &addr,
            mnt.to_str().unwrap(),
            "--host-timeout",
            "2s",
            "--rediscover",
            "3s",
        ];
        args.extend_from_slice(extra);
        let (mount, _) = start("mount", &args, "mounted at");
        assert!(mounted(mnt), "{} is not in /proc/mounts", mnt.display());
        Mount {
            mnt: mnt.to_path_buf(),
            mount: Some(mount),
            server: Some(server),
        }
    }

    /// SIGTERM the mount process: it must unmount and exit 0.
    pub fn unmount(&mut self) {
        if let Some(mut m) = self.mount.take() {
            m.signal(libc::SIGTERM);
            let st = m.wait_for(Duration::from_secs(10));
            assert!(
                st.is_some_and(|s| s.success()),
                "mount exited with {st:?} after SIGTERM"
            );
            assert!(!mounted(&self.mnt), "still mounted after SIGTERM");
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        drop(self.mount.take());
        if mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .status();
        }
        drop(self.server.take());
    }
}

/// Runs `sh -c script` in `dir` with a deadline; returns (status ok, stdout).
pub fn sh(dir: &Path, script: &str, limit: Duration) -> (bool, String) {
    let child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "V Tester")
        .env("GIT_AUTHOR_EMAIL", "v@example.org")
        .env("GIT_COMMITTER_NAME", "V Tester")
        .env("GIT_COMMITTER_EMAIL", "v@example.org")
        .env("GIT_AUTHOR_DATE", "2001-02-03T04:05:06Z")
        .env("GIT_COMMITTER_DATE", "2001-02-03T04:05:06Z")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .env("TZ", "UTC")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        // E.g. the working directory is on a mount whose server died.
        Err(e) => return (false, format!("cannot start sh in {}: {e}", dir.display())),
    };
    let mut out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let t = Instant::now();
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break Some(s);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = reader.join().unwrap_or_default();
    match status {
        Some(s) => (s.success(), out),
        None => panic!("`{script}` did not finish within {limit:?}; output so far:\n{out}"),
    }
}

/// `vkernel fileserver` of `root` on `bind`: the process and its address.
pub fn fileserver(root: &Path, bind: &str) -> (Proc, String) {
    let (server, line) = start(
        "fileserver",
        &[
            "fileserver",
            "--root",
            root.to_str().unwrap(),
            "--bind",
            bind,
        ],
        "listening on",
    );
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .expect("server address")
        .to_string();
    (server, addr)
}

/// Two mounts of one new file server at `a` and `b`, torn down on drop.
pub fn two_mounts(root: &Path, a: &Path, b: &Path) -> (Mount, Mount) {
    let (server, addr) = fileserver(root, "127.0.0.1:0");
    let one = |mnt: &Path| {
        let (p, _) = start(
            "mount",
            &["mount", &addr, mnt.to_str().unwrap()],
            "mounted at",
        );
        assert!(mounted(mnt), "{} is not in /proc/mounts", mnt.display());
        Mount {
            mnt: mnt.to_path_buf(),
            mount: Some(p),
            server: None,
        }
    };
    let (ma, mut mb) = (one(a), one(b));
    // The server goes last, with the second mount.
    mb.server = Some(server);
    (ma, mb)
}

/// fsync(2) of a directory on a mount: the removals answered early in it
/// are at the server once it returns (the rule in docs/VIO.md).
pub fn fsync_dir(dir: &Path) {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .unwrap_or_else(|e| panic!("fsync of {}: {e}", dir.display()));
}
