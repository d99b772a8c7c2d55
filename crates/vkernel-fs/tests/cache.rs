//! Caches of two FUSE mounts of one file server, each on its own logical
//! host: with a 10 s cache lifetime, a change made through one mount must
//! show through the other at once (the server's invalidations), never
//! after the lifetime. Also: listings with attributes and small files
//! read with their open give what a local directory gives.
//!
//! Needs /dev/fuse and fusermount3 (Debian fuse3); skips without them
//! unless VKERNEL_REQUIRE_FUSE=1 (as in CI).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkernel::{Kernel, KernelConfig};
use vkernel_fs::client::Client;
use vkernel_fs::fuse::{self, FuseOptions};
use vkernel_fs::server::{FileServer, ServerConfig};

fn fuse_ready() -> bool {
    let ok = Path::new("/dev/fuse").exists()
        && std::process::Command::new("sh")
            .args(["-c", "command -v fusermount3"])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !ok && std::env::var("VKERNEL_REQUIRE_FUSE").as_deref() == Ok("1") {
        panic!("FUSE tests required but /dev/fuse or fusermount3 is missing");
    }
    if !ok {
        eprintln!("skipping: no /dev/fuse or fusermount3 (VKERNEL_REQUIRE_FUSE=1 fails instead)");
    }
    ok
}

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!(
            "vkfs-cache-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A scratch directory with an export in it, served by a file server on
/// a logical host of its own (fields drop server first, directory last).
struct Served {
    srv: FileServer,
    ks: Kernel,
    export: PathBuf,
    work: Dir,
}

fn served(tag: &str) -> Served {
    let work = Dir::new(tag);
    let export = work.0.join("export");
    std::fs::create_dir_all(&export).unwrap();
    let ks = Kernel::start(KernelConfig::default()).unwrap();
    let srv = FileServer::start(&ks, &export, ServerConfig::default()).unwrap();
    Served {
        srv,
        ks,
        export,
        work,
    }
}

/// A mount of `server` from a logical host of its own.
struct Mount {
    session: Option<fuser::BackgroundSession>,
    at: PathBuf,
    kernel: Kernel,
}

impl Mount {
    fn new(server: &Kernel, pid: vkernel::Pid, at: PathBuf, opts: &FuseOptions) -> Mount {
        let k = Kernel::start(KernelConfig {
            peers: vec![server.local_addr()],
            ..Default::default()
        })
        .unwrap();
        server.add_peer(k.local_addr());
        let c = Arc::new(Client::connect(&k, pid, 6).unwrap());
        std::fs::create_dir_all(&at).unwrap();
        let session = fuse::mount(&k, c, &at, opts).unwrap();
        Mount {
            session: Some(session),
            at,
            kernel: k,
        }
    }

    fn p(&self, name: &str) -> PathBuf {
        self.at.join(name)
    }

    /// Exchanges this mount's host has had with other hosts so far.
    fn exchanges(&self) -> u64 {
        self.kernel.stats().remote_exchanges
    }

    /// [`Mount::exchanges`] once none was made for 100 ms (handles are
    /// closed in batches a little after their release), waiting ≤ 5 s.
    fn settled_exchanges(&self) -> u64 {
        let t = Instant::now();
        loop {
            let n = self.exchanges();
            std::thread::sleep(Duration::from_millis(100));
            if self.exchanges() == n || t.elapsed() > Duration::from_secs(5) {
                return n;
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = fuse::unmount(s, &self.at);
        }
    }
}

/// Two mounts of one served export, each caching 10 s (fields drop in
/// order: the mounts, then the server and the directory).
struct Two {
    a: Mount,
    b: Mount,
    s: Served,
}

fn two_mounts(tag: &str) -> Two {
    let s = served(tag);
    let opts = FuseOptions {
        cache_ttl: Duration::from_secs(10),
        ..FuseOptions::default()
    };
    Two {
        a: Mount::new(&s.ks, s.srv.pid(), s.work.0.join("a"), &opts),
        b: Mount::new(&s.ks, s.srv.pid(), s.work.0.join("b"), &opts),
        s,
    }
}

/// Waits (at most 2 s, far below the 10 s cache lifetime) for `f`.
fn soon(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{what}: still stale after 2 s (caches live 10 s)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_change_through_one_mount_shows_through_the_other_at_once() {
    if !fuse_ready() {
        return;
    }
    let t = two_mounts("two");
    let (a, b, srv) = (&t.a, &t.b, &t.s.srv);
    assert_eq!(srv.watch_stats().watchers, 2, "both mounts watch");

    // B learns that the name is absent (and may cache that for 10 s).
    assert!(!b.p("new.txt").exists());
    std::fs::write(a.p("new.txt"), "one").unwrap();
    soon("a file made through A, seen by B", || {
        std::fs::read(b.p("new.txt")).is_ok_and(|d| d == b"one")
    });

    // B holds its attributes and pages; A appends.
    assert_eq!(std::fs::metadata(b.p("new.txt")).unwrap().len(), 3);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(a.p("new.txt"))
            .unwrap();
        f.write_all(b" two").unwrap();
    }
    soon("a size changed through A, seen by B", || {
        std::fs::metadata(b.p("new.txt")).is_ok_and(|m| m.len() == 7)
    });
    assert_eq!(std::fs::read(b.p("new.txt")).unwrap(), b"one two");

    // Mode, rename, a new directory's entries, unlink.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(b.p("new.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    std::fs::set_permissions(a.p("new.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    soon("a mode changed through A, seen by B", || {
        std::fs::metadata(b.p("new.txt")).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o600)
    });
    std::fs::rename(a.p("new.txt"), a.p("renamed.txt")).unwrap();
    soon("a rename through A, seen by B", || {
        !b.p("new.txt").exists() && b.p("renamed.txt").exists()
    });
    assert_eq!(std::fs::read(b.p("renamed.txt")).unwrap(), b"one two");
    std::fs::create_dir(a.p("d")).unwrap();
    std::fs::write(a.p("d/f"), "x").unwrap();
    soon("a directory made through A, listed by B", || {
        std::fs::read_dir(b.p("d")).is_ok_and(|r| r.count() == 1)
    });
    std::fs::remove_file(a.p("renamed.txt")).unwrap();
    soon("an unlink through A, seen by B", || {
        !b.p("renamed.txt").exists()
    });
    // B's own changes reach A the same way.
    std::fs::write(b.p("d/g"), "from b").unwrap();
    soon("a file made through B, seen by A", || {
        std::fs::read(a.p("d/g")).is_ok_and(|d| d == b"from b")
    });
    assert!(srv.watch_stats().sent > 0);
    assert_eq!(srv.watch_stats().dropped, 0);
}

#[test]
fn listings_and_small_files_match_a_local_directory() {
    if !fuse_ready() {
        return;
    }
    let Served {
        srv,
        ks,
        export,
        work,
    } = served("list");
    std::fs::create_dir_all(export.join("sub")).unwrap();
    let mut want = Vec::new();
    for i in 0..300 {
        let name = format!("file-{i:03}-{}", "x".repeat(i % 40));
        // Sizes around the 60 KiB that comes with an open.
        let len = [0, 1, 4095, 4096, 61_440, 61_441, 200_000][i % 7];
        let body: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
        std::fs::write(export.join("sub").join(&name), &body).unwrap();
        want.push((name, body));
    }
    let opts = FuseOptions {
        cache_ttl: Duration::from_millis(500),
        ..FuseOptions::default()
    };
    let m = Mount::new(&ks, srv.pid(), work.0.join("m"), &opts);
    let mut names: Vec<String> = std::fs::read_dir(m.p("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut expect: Vec<String> = want.iter().map(|(n, _)| n.clone()).collect();
    expect.sort();
    assert_eq!(names, expect);
    for (name, body) in &want {
        let p = m.p("sub").join(name);
        let md = std::fs::symlink_metadata(&p).unwrap();
        let local = std::fs::symlink_metadata(export.join("sub").join(name)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (md.len(), md.ino(), md.mode(), md.mtime(), md.mtime_nsec()),
            (
                local.len(),
                local.ino(),
                local.mode(),
                local.mtime(),
                local.mtime_nsec()
            ),
            "{name}"
        );
        // Twice: the second may come from the kernel's pages.
        for _ in 0..2 {
            assert_eq!(&std::fs::read(&p).unwrap(), body, "{name}");
        }
    }
    // Changed behind the server's back (on its disk, not through it): no
    // invalidation, so it shows once the cache lifetime has passed.
    let (name, _) = &want[8];
    std::fs::write(export.join("sub").join(name), b"changed").unwrap();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(std::fs::read(m.p("sub").join(name)).unwrap(), b"changed");
}

/// Runs a Python snippet with `path` as argv[1]; its exit status.
fn python(code: &str, path: &Path) -> std::process::Child {
    std::process::Command::new("python3")
        .args(["-c", code])
        .arg(path)
        .spawn()
        .expect("python3")
}

fn waited(mut c: std::process::Child, limit: Duration) -> Option<i32> {
    let t = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s.code();
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn locks_exclude_programs_on_different_clients() {
    use std::os::fd::AsRawFd;
    if !fuse_ready() {
        return;
    }
    let Served {
        srv,
        ks,
        export,
        work,
    } = served("locks");
    std::fs::write(export.join("db"), vec![0u8; 4096]).unwrap();
    let a = Mount::new(&ks, srv.pid(), work.0.join("a"), &FuseOptions::default());
    let b = Mount::new(&ks, srv.pid(), work.0.join("b"), &FuseOptions::default());

    // This process write-locks bytes 0..=99 through A (fcntl F_SETLK).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(a.p("db"))
        .unwrap();
    let setlk = |kind: i32, wait: bool| {
        // SAFETY: a plain flock struct for fcntl on an open descriptor.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = 0;
        fl.l_len = 100;
        let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
        // SAFETY: `f` is open; `fl` lives across the call.
        unsafe { libc::fcntl(f.as_raw_fd(), cmd, &fl) }
    };
    assert_eq!(
        setlk(libc::F_WRLCK, false),
        0,
        "{}",
        std::io::Error::last_os_error()
    );

    // Another program through B: a non-blocking lock of byte 50 fails,
    // F_GETLK names this process, and byte 100 is free.
    let probe = r#"
import fcntl, os, struct, sys
f = open(sys.argv[1], "r+b")
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 50)
    sys.exit(10)
except BlockingIOError:
    pass
q = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 50, 1, 0)
t, w, s, l, pid = struct.unpack("hhqqi", fcntl.fcntl(f, fcntl.F_GETLK, q))
if t != fcntl.F_WRLCK or pid != int(os.environ["HOLDER"]) or (s, l) != (0, 100):
    print("F_GETLK:", t, s, l, pid); sys.exit(11)
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 100)
sys.exit(0)
"#;
    std::env::set_var("HOLDER", std::process::id().to_string());
    assert_eq!(
        waited(python(probe, &b.p("db")), Duration::from_secs(20)),
        Some(0),
        "a lock held through A must exclude a program on B"
    );

    // A blocking lock through B waits until A unlocks.
    let wait = r#"
import fcntl, sys
f = open(sys.argv[1], "r+b")
fcntl.lockf(f, fcntl.LOCK_EX, 1, 10)
sys.exit(0)
"#;
    let mut child = python(wait, &b.p("db"));
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the waiter got the lock while it was held"
    );
    assert_eq!(setlk(libc::F_UNLCK, false), 0);
    assert_eq!(
        waited(child, Duration::from_secs(10)),
        Some(0),
        "the waiter never got the lock"
    );

    // flock: an exclusive flock through A excludes one through B, and is
    // gone when its file is closed.
    let g = std::fs::File::open(a.p("db")).unwrap();
    // SAFETY: flock on an open descriptor (not blocking: a test never
    // hangs).
    assert_eq!(
        unsafe { libc::flock(g.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0,
        "flock: {} (a lock of an exited program left behind?)",
        std::io::Error::last_os_error()
    );
    let try_flock = r#"
import fcntl, sys
f = open(sys.argv[1], "rb")
try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    sys.exit(0)
except BlockingIOError:
    sys.exit(1)
"#;
    assert_eq!(
        waited(python(try_flock, &b.p("db")), Duration::from_secs(20)),
        Some(1)
    );
    drop(g);
    assert_eq!(
        waited(python(try_flock, &b.p("db")), Duration::from_secs(20)),
        Some(0)
    );
}

#[test]
fn extended_attributes_as_on_a_local_disk() {
    use rustix::fs::XattrFlags;
    if !fuse_ready() {
        return;
    }
    let Served {
        srv,
        ks,
        export,
        work,
    } = served("xattr");
    std::fs::write(export.join("f"), b"x").unwrap();
    let a = Mount::new(&ks, srv.pid(), work.0.join("a"), &FuseOptions::default());
    let b = Mount::new(&ks, srv.pid(), work.0.join("b"), &FuseOptions::default());
    let get = |p: &Path, n: &str| {
        let mut buf = [0u8; 64];
        rustix::fs::getxattr(p, n, &mut buf[..]).map(|k| buf[..k].to_vec())
    };
    let (fa, fb, local) = (a.p("f"), b.p("f"), export.join("f"));
    rustix::fs::setxattr(&fa, "user.colour", b"blue", XattrFlags::empty()).unwrap();
    assert_eq!(
        get(&local, "user.colour").unwrap(),
        b"blue",
        "on the server's disk"
    );
    assert_eq!(
        get(&fb, "user.colour").unwrap(),
        b"blue",
        "through the other mount"
    );
    assert_eq!(
        rustix::fs::setxattr(&fa, "user.colour", b"red", XattrFlags::CREATE),
        Err(rustix::io::Errno::EXIST)
    );
    assert_eq!(
        rustix::fs::setxattr(&fa, "user.size", b"1", XattrFlags::REPLACE),
        Err(rustix::io::Errno::NODATA)
    );
    rustix::fs::setxattr(&fb, "user.size", b"12", XattrFlags::empty()).unwrap();
    let mut list = [0u8; 256];
    let n = rustix::fs::listxattr(&fa, &mut list[..]).unwrap();
    let mut names: Vec<&[u8]> = list[..n]
        .split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .collect();
    names.sort();
    assert_eq!(names, vec![&b"user.colour"[..], &b"user.size"[..]]);
    // Root's namespaces for a root mount; ACL names are not supported.
    rustix::fs::setxattr(&fa, "trusted.v", b"t", XattrFlags::empty()).unwrap();
    assert_eq!(get(&local, "trusted.v").unwrap(), b"t");
    assert_eq!(
        rustix::fs::setxattr(&fa, "system.x", b"1", XattrFlags::empty()),
        Err(rustix::io::Errno::OPNOTSUPP)
    );
    // Writes still work (the kernel asks for security.capability first).
    for i in 0..20 {
        std::fs::write(&fa, format!("{i}")).unwrap();
    }
    rustix::fs::removexattr(&fa, "user.colour").unwrap();
    assert_eq!(get(&fb, "user.colour"), Err(rustix::io::Errno::NODATA));
    assert_eq!(get(&local, "user.colour"), Err(rustix::io::Errno::NODATA));
}

#[test]
fn a_file_held_whole_opens_without_the_server_until_another_client_changes_it() {
    if !fuse_ready() {
        return;
    }
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::FileExt;
    let t = two_mounts("held");
    let (a, b) = (&t.a, &t.b);
    let body = |i: u8| vec![b'a' + i % 26; 5000];
    std::fs::write(a.p("f"), body(0)).unwrap();
    // A's handle is closed at the server a little after the write returns
    // (the kernel's release is asynchronous); until then the file may
    // still change, so a copy B took now could be invalidated in the
    // middle of the count below (a CI run saw 2 exchanges more: B's
    // next open and close after the callback).
    a.settled_exchanges();
    // B reads it once whole (its open brings it), then opens it again and
    // again without an exchange.
    assert_eq!(std::fs::read(b.p("f")).unwrap(), body(0));
    let before = b.settled_exchanges();
    for _ in 0..20 {
        assert_eq!(std::fs::read(b.p("f")).unwrap(), body(0));
    }
    assert_eq!(
        b.exchanges(),
        before,
        "opens of a held file asked the server"
    );
    // So does A, which wrote it from empty.
    let before = a.settled_exchanges();
    for _ in 0..20 {
        assert_eq!(std::fs::read(a.p("f")).unwrap(), body(0));
    }
    assert_eq!(
        a.exchanges(),
        before,
        "A asked the server for what it wrote"
    );

    // A rewrites it in place, same size: the very next open through B
    // (no waiting) sees the new data, every time.
    for i in 1..=20u8 {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(a.p("f"))
            .unwrap();
        f.write_all_at(&body(i), 0).unwrap();
        drop(f);
        assert_eq!(
            std::fs::read(b.p("f")).unwrap(),
            body(i),
            "B read stale data right after A's write {i} returned"
        );
    }

    // A file open from B's copy: still readable and fstat-able after its
    // last name goes, and a change by A shows in it once told.
    std::fs::write(a.p("g"), "held").unwrap();
    assert_eq!(std::fs::read(b.p("g")).unwrap(), b"held");
    let mut g = std::fs::File::open(b.p("g")).unwrap();
    std::fs::remove_file(b.p("g")).unwrap();
    assert_eq!(g.metadata().unwrap().len(), 4);
    let mut s = String::new();
    g.read_to_string(&mut s).unwrap();
    assert_eq!(s, "held");
    std::fs::write(a.p("h"), "one").unwrap();
    assert_eq!(std::fs::read(b.p("h")).unwrap(), b"one");
    let mut h = std::fs::File::open(b.p("h")).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(a.p("h"))
        .unwrap();
    f.write_all(b" two").unwrap();
    drop(f);
    soon("an append through A, read through B's open file", || {
        let mut s = String::new();
        h.rewind().is_ok() && h.read_to_string(&mut s).is_ok() && s == "one two"
    });
}
