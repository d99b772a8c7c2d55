//! The file server end to end: a server on one logical host, clients on
//! the same host or on another (loopback UDP), through Send/Receive/Reply,
//! Forward, reply-with-segment, MoveTo and MoveFrom.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkernel::{Kernel, KernelConfig, Message, Pid, Segment};
use vkernel_fs::client::{Client, ClientError};
use vkernel_fs::server::{FileServer, ServerConfig};
use vkernel_fs::vio::{self, Errno, Request, SetAttr};

fn host(peers: Vec<std::net::SocketAddr>, timeout: Duration) -> Kernel {
    Kernel::start(KernelConfig {
        peers,
        host_timeout: timeout,
        ..Default::default()
    })
    .expect("start host")
}

fn two_hosts(timeout: Duration) -> (Kernel, Kernel) {
    let a = host(vec![], timeout);
    let b = host(vec![a.local_addr()], timeout);
    a.add_peer(b.local_addr());
    assert_ne!(a.host_id(), b.host_id());
    (a, b)
}

fn server(k: &Kernel, root: &Path) -> FileServer {
    FileServer::start(k, root, ServerConfig::default()).expect("file server")
}

/// FNV-1a 64 (integrity by hashing).
fn hash(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn server_err(r: Result<impl std::fmt::Debug, ClientError>) -> Errno {
    match r {
        Err(ClientError::Server(e)) => e,
        other => panic!("expected a server error, got {other:?}"),
    }
}

/// Every operation of the client API against a server.
fn round_trips(c: &Client, root: &Path) {
    // create, write, read, stat
    let (fh, a) = c.create("a.txt", 0o640).unwrap();
    assert!(a.is_file());
    assert_eq!(a.mode & 0o777, 0o640);
    assert_eq!(c.write(fh, 0, b"hello world").unwrap(), 11);
    let mut buf = [0u8; 64];
    assert_eq!(c.read(fh, 6, &mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"world");
    assert_eq!(c.fstat(fh).unwrap().size, 11);
    c.fsync(fh, false).unwrap();
    c.close(fh).unwrap();
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"hello world");
    assert_eq!(c.stat("a.txt").unwrap().size, 11);
    assert_eq!(server_err(c.close(fh)), Errno::EBADF);
    // directories
    c.mkdir("d", 0o750).unwrap();
    assert_eq!(server_err(c.mkdir("d", 0o750)), Errno::EEXIST);
    c.write_file("d/x", b"x", false).unwrap();
    c.write_file("d/y", b"yy", true).unwrap();
    let mut names: Vec<_> = c
        .readdir("d")
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["x", "y"]);
    assert_eq!(server_err(c.rmdir("d")), Errno::ENOTEMPTY);
    // rename, unlink, truncate
    c.rename("d/x", "d/z", 0).unwrap();
    assert_eq!(server_err(c.stat("d/x")), Errno::ENOENT);
    assert_eq!(
        server_err(c.rename("d/y", "d/z", vio::RENAME_NOREPLACE)),
        Errno::EEXIST
    );
    c.truncate("d/y", 1).unwrap();
    assert_eq!(c.read_file("d/y").unwrap(), b"y");
    c.unlink("d/y").unwrap();
    c.unlink("d/z").unwrap();
    c.rmdir("d").unwrap();
    // symlinks and hard links
    let l = c.symlink("a.txt", "l").unwrap();
    assert!(l.is_symlink());
    assert_eq!(c.readlink("l").unwrap(), b"a.txt");
    assert_eq!(c.stat("l").unwrap().size, 11);
    assert!(c.lstat("l").unwrap().is_symlink());
    let h = c.link("a.txt", "hard").unwrap();
    assert_eq!(h.nlink, 2);
    // setattr: chmod, times, size
    let s = SetAttr {
        valid: vio::SET_MODE | vio::SET_MTIME | vio::SET_SIZE,
        mode: 0o600,
        mtime: 1_234_567_890,
        mtime_ns: 42,
        size: 5,
        ..SetAttr::default()
    };
    let a = c.setattr("hard", &s).unwrap();
    assert_eq!(
        (a.mode & 0o777, a.mtime, a.mtime_ns, a.size),
        (0o600, 1_234_567_890, 42, 5)
    );
    assert_eq!(c.read_file("a.txt").unwrap(), b"hello");
    // ftruncate through a handle, O_APPEND, O_EXCL
    let (fh, _) = c.open("a.txt", libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
    c.write(fh, 0, b"!!").unwrap();
    c.ftruncate(fh, 6).unwrap();
    c.close(fh).unwrap();
    assert_eq!(c.read_file("a.txt").unwrap(), b"hello!");
    assert_eq!(
        server_err(c.open(
            "a.txt",
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o600
        )),
        Errno::EEXIST
    );
    assert!(c.statfs().unwrap().bsize > 0);
    // An open file survives the removal of its name.
    let (fh, _) = c.open("hard", libc::O_RDONLY, 0).unwrap();
    c.unlink("hard").unwrap();
    let mut b = [0u8; 6];
    assert_eq!(c.read(fh, 0, &mut b).unwrap(), 6);
    c.close(fh).unwrap();
}

#[test]
fn client_round_trips_local() {
    let dir = tempfile::tempdir().unwrap();
    let k = host(vec![], Duration::from_secs(3));
    let srv = server(&k, dir.path());
    let c = Client::connect(&k, srv.pid(), 4).unwrap();
    round_trips(&c, dir.path());
    assert_eq!(srv.open_handles(), 0, "every handle closed");
}

#[test]
fn client_round_trips_remote() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_hosts(Duration::from_secs(3));
    let srv = server(&a, dir.path());
    let c = Client::connect(&b, srv.pid(), 4).unwrap();
    round_trips(&c, dir.path());
    assert_eq!(srv.open_handles(), 0);
}

#[test]
fn server_is_found_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_hosts(Duration::from_secs(3));
    let srv = FileServer::start(
        &a,
        dir.path(),
        ServerConfig {
            logical_id: Some(0x4649_4c45),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let p = b.create_process().unwrap();
    let pid = p.get_pid(0x4649_4c45, vkernel::Scope::Remote).unwrap();
    assert_eq!(pid, srv.pid());
}

#[test]
fn large_files_keep_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_hosts(Duration::from_secs(5));
    // A small transfer unit so large requests take several MoveTo/MoveFrom.
    let srv = FileServer::start(
        &a,
        dir.path(),
        ServerConfig {
            transfer_unit: 16 << 10,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut c = Client::connect(&b, srv.pid(), 4).unwrap();
    c.set_max_request(1 << 20);
    let t = Instant::now();
    for (i, &n) in [0usize, 1, 4095, 4096, 65_536, (1 << 20) + 7, 16 << 20]
        .iter()
        .enumerate()
    {
        let data = pattern(n, i as u64 + 1);
        let name = format!("f{n}");
        c.write_file(&name, &data, true).unwrap();
        let back = c.read_file(&name).unwrap();
        assert_eq!(back.len(), n);
        assert_eq!(hash(&back), hash(&data), "size {n} through the client");
        let disk = std::fs::read(dir.path().join(&name)).unwrap();
        assert_eq!(hash(&disk), hash(&data), "size {n} on the server's disk");
        // Unaligned reads in the middle (read-ahead must not shift data).
        if n > 10_000 {
            let (fh, _) = c.open(&name, libc::O_RDONLY, 0).unwrap();
            let mut part = vec![0u8; 5000];
            for off in [1usize, 3333, n / 2, n - 5000] {
                assert_eq!(c.read(fh, off as u64, &mut part).unwrap(), 5000);
                assert_eq!(part[..], data[off..off + 5000], "size {n} at {off}");
            }
            c.close(fh).unwrap();
        }
    }
    assert!(t.elapsed() < Duration::from_secs(60));
    assert!(
        srv.stats()
            .read_ahead_hits
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "sequential reads were served from read-ahead"
    );
}

#[test]
fn concurrent_clients_different_and_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_hosts(Duration::from_secs(5));
    let srv = server(&a, dir.path());
    let remote = Arc::new(Client::connect(&b, srv.pid(), 8).unwrap());
    let local = Arc::new(Client::connect(&a, srv.pid(), 8).unwrap());
    const N: usize = 8;
    const BLOCK: usize = 8192;
    const BLOCKS: usize = 32;
    // The shared file is created first; every client owns some blocks of it.
    let (fh, _) = remote.create("shared", 0o644).unwrap();
    remote.close(fh).unwrap();
    let mut threads = Vec::new();
    for t in 0..N {
        let c = if t % 2 == 0 {
            remote.clone()
        } else {
            local.clone()
        };
        threads.push(std::thread::spawn(move || {
            let data = pattern(200_000 + t * 1000, t as u64 + 100);
            c.write_file(format!("own{t}"), &data, false).unwrap();
            let (fh, _) = c.open("shared", libc::O_WRONLY, 0).unwrap();
            for blk in (t..BLOCKS).step_by(N) {
                let b = vec![blk as u8 + 1; BLOCK];
                c.write(fh, (blk * BLOCK) as u64, &b).unwrap();
            }
            c.fsync(fh, false).unwrap();
            c.close(fh).unwrap();
            assert_eq!(hash(&c.read_file(format!("own{t}")).unwrap()), hash(&data));
        }));
    }
    for t in threads {
        t.join().expect("client thread");
    }
    let shared = std::fs::read(dir.path().join("shared")).unwrap();
    assert_eq!(shared.len(), BLOCK * BLOCKS);
    for (i, chunk) in shared.chunks(BLOCK).enumerate() {
        assert!(chunk.iter().all(|&x| x == i as u8 + 1), "block {i}");
    }
    // Appends from many clients to one file all land (O_APPEND at the server).
    let mut threads = Vec::new();
    for t in 0..4 {
        let c = if t % 2 == 0 {
            remote.clone()
        } else {
            local.clone()
        };
        threads.push(std::thread::spawn(move || {
            let (fh, _) = c
                .open(
                    "log",
                    libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
                    0o644,
                )
                .unwrap();
            for i in 0..50 {
                c.write(fh, 0, format!("{t}:{i:03}\n").as_bytes()).unwrap();
            }
            c.close(fh).unwrap();
        }));
    }
    for t in threads {
        t.join().expect("appender");
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert_eq!(log.lines().count(), 200);
    assert!(log.lines().all(|l| l.len() == 5));
}

#[test]
fn confinement_battery() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("export");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(outer.path().join("secret"), b"top secret").unwrap();
    std::fs::create_dir(outer.path().join("outside")).unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/ok"), b"fine").unwrap();
    let sym = |t: &str, l: &str| std::os::unix::fs::symlink(t, root.join(l)).unwrap();
    sym("/etc/passwd", "abs");
    sym("../secret", "rel");
    sym("../outside", "outdir");
    sym("sub/../../secret", "dotdot_in_link");
    sym("loop2", "loop1");
    sym("loop1", "loop2");
    sym("/proc/self/root/etc/passwd", "magic");
    sym("sub", "insub");
    let (a, b) = two_hosts(Duration::from_secs(3));
    let srv = server(&a, &root);
    let c = Client::connect(&b, srv.pid(), 2).unwrap();

    let exdev = Errno::EXDEV;
    let cases: Vec<(&str, Errno)> = vec![
        ("../secret", exdev),
        ("sub/../../secret", exdev),
        ("/etc/passwd", exdev),
        ("abs", exdev),
        ("rel", exdev),
        ("dotdot_in_link", exdev),
        ("outdir/x", exdev),
        ("loop1", Errno::ELOOP),
        ("magic", exdev),
        ("insub/../../secret", exdev),
    ];
    for (p, want) in &cases {
        assert_eq!(server_err(c.stat(p)), *want, "stat {p}");
        assert_eq!(server_err(c.read_file(p)), *want, "read {p}");
        assert_eq!(
            server_err(c.open(p, libc::O_WRONLY | libc::O_CREAT, 0o644)),
            *want,
            "create {p}"
        );
    }
    // Writing through links that point outside, or into outside dirs.
    for p in ["outdir/new", "../outside/new", "/tmp/new"] {
        assert_eq!(server_err(c.write_file(p, b"x", false)), exdev, "{p}");
        assert_eq!(server_err(c.mkdir(p, 0o755)), exdev, "mkdir {p}");
        assert_eq!(server_err(c.symlink("x", p)), exdev, "symlink {p}");
    }
    assert_eq!(server_err(c.rename("sub/ok", "../stolen", 0)), exdev);
    assert_eq!(server_err(c.link("sub/ok", "outdir/h",)), exdev);
    assert_eq!(server_err(c.unlink("../secret")), exdev);
    assert_eq!(server_err(c.rmdir("../outside")), exdev);
    assert_eq!(server_err(c.truncate("rel", 0)), exdev);
    assert_eq!(server_err(c.readdir("outdir")), exdev);
    assert_eq!(server_err(c.readdir("..")), exdev);
    assert_eq!(server_err(c.chmod("outdir/..", 0o777)), exdev);
    // Lexical refusals.
    assert_eq!(server_err(c.stat("a\0b")), Errno::EINVAL);
    assert_eq!(server_err(c.stat("x".repeat(256))), Errno::ENAMETOOLONG);
    // Deeper than PATH_MAX is walked (and here absent); over the
    // request limit it is too long.
    assert_eq!(server_err(c.stat("d/".repeat(2049))), Errno::ENOENT);
    let over = "d/".repeat(vio::MAX_REQUEST_PATH / 2 + 1);
    assert_eq!(server_err(c.stat(over)), Errno::ENAMETOOLONG);
    assert_eq!(server_err(c.unlink("sub/..")), Errno::EINVAL);
    assert_eq!(server_err(c.rmdir("")), Errno::EINVAL);
    // The links themselves can be looked at but never followed out.
    assert!(c.lstat("rel").unwrap().is_symlink());
    assert_eq!(c.readlink("abs").unwrap(), b"/etc/passwd");
    // Nothing outside changed.
    assert_eq!(
        std::fs::read(outer.path().join("secret")).unwrap(),
        b"top secret"
    );
    assert_eq!(
        std::fs::read_dir(outer.path().join("outside"))
            .unwrap()
            .count(),
        0
    );
    assert!(!outer.path().join("stolen").exists());
    // Legitimate paths still work.
    assert_eq!(c.read_file("sub/ok").unwrap(), b"fine");
    assert_eq!(c.read_file("insub/ok").unwrap(), b"fine");
    assert_eq!(c.read_file("sub/../sub/ok").unwrap(), b"fine");
}

/// Sends a raw request with an optional segment; returns the reply.
fn raw(p: &vkernel::Process, to: Pid, mut m: Message, seg: Option<Segment<'_>>) -> Message {
    match seg {
        Some(s) => p.send_with_segment(&mut m, to, s).expect("exchange"),
        None => p.send(&mut m, to).expect("exchange"),
    };
    m
}

#[test]
fn malformed_requests_get_errors_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"data").unwrap();
    let (a, b) = two_hosts(Duration::from_secs(3));
    let srv = server(&a, dir.path());
    let s = srv.pid();
    let p = b.create_process().unwrap();
    let st = |m: Message| vio::status(&m);
    // Unknown code.
    assert_eq!(
        st(raw(&p, s, Message::with_code(0x56_0777), None)),
        Errno::ENOSYS
    );
    assert_eq!(
        st(raw(&p, s, Message::with_code(0x12_3456), None)),
        Errno::ENOSYS
    );
    // Path length beyond the limit, and beyond the segment.
    let mut m = Request::Stat {
        path_len: vio::MAX_REQUEST_PATH as u32 + 1,
        nofollow: false,
    }
    .encode();
    assert_eq!(st(raw(&p, s, m, None)), Errno::ENAMETOOLONG);
    m = Request::Stat {
        path_len: 100,
        nofollow: false,
    }
    .encode();
    let mut small = *b"f\0\0\0";
    assert_eq!(
        st(raw(&p, s, m, Some(Segment::ReadWrite(&mut small)))),
        Errno::EPROTO
    );
    // A path request without a segment, a stat without room for the answer.
    assert_eq!(
        st(raw(&p, s, Request::Unlink { path_len: 1 }.encode(), None)),
        Errno::EPROTO
    );
    let m = Request::Stat {
        path_len: 1,
        nofollow: false,
    }
    .encode();
    assert_eq!(st(raw(&p, s, m, Some(Segment::Read(b"f")))), Errno::EPROTO);
    // Handles that do not exist.
    let mut page = vec![0u8; 4096];
    let m = Request::Read {
        handle: 0xdead,
        offset: 0,
        count: 4096,
    }
    .encode();
    assert_eq!(
        st(raw(&p, s, m, Some(Segment::Write(&mut page)))),
        Errno::EBADF
    );
    let m = Request::Write {
        handle: 7,
        offset: 0,
        count: 4,
        flags: 0,
    }
    .encode();
    assert_eq!(
        st(raw(&p, s, m, Some(Segment::Read(b"abcd")))),
        Errno::EBADF
    );
    assert_eq!(
        st(raw(&p, s, Request::Close { handle: 0 }.encode(), None)),
        Errno::EBADF
    );
    // A real handle with a READ larger than its segment, a WRITE without data.
    let c = Client::connect(&b, s, 1).unwrap();
    let (fh, _) = c.open("f", libc::O_RDWR, 0).unwrap();
    let m = Request::Read {
        handle: fh.0,
        offset: 0,
        count: 1 << 20,
    }
    .encode();
    assert_eq!(
        st(raw(&p, s, m, Some(Segment::Write(&mut page)))),
        Errno::EPROTO
    );
    let m = Request::Write {
        handle: fh.0,
        offset: 0,
        count: 10,
        flags: 0,
    }
    .encode();
    assert_eq!(st(raw(&p, s, m, None)), Errno::EPROTO);
    let m = Request::Write {
        handle: fh.0,
        offset: u64::MAX - 2,
        count: 4,
        flags: 0,
    }
    .encode();
    assert_eq!(
        st(raw(&p, s, m, Some(Segment::Read(b"abcd")))),
        Errno::EINVAL
    );
    // Another host's handle is not ours.
    let other = a.create_process().unwrap();
    let m = Request::Fstat { handle: fh.0 }.encode();
    let mut out = [0u8; vio::ATTR_LEN];
    assert_eq!(
        st(raw(&other, s, m, Some(Segment::Write(&mut out)))),
        Errno::EBADF
    );
    // A bad SETATTR record, bad flags.
    let mut rec = SetAttr {
        valid: 0xffff,
        ..SetAttr::default()
    }
    .encode()
    .to_vec();
    rec.extend_from_slice(b"f");
    rec.resize(vio::ATTR_LEN.max(rec.len()), 0);
    let m = Request::Setattr { path_len: 1 }.encode();
    assert_eq!(
        st(raw(&p, s, m, Some(Segment::ReadWrite(&mut rec)))),
        Errno::EINVAL
    );
    let mut m = Message::with_code(vio::FSYNC);
    m.0[1] = fh.0;
    m.0[2] = 0x80;
    assert_eq!(st(raw(&p, s, m, None)), Errno::EINVAL);
    let m = Request::Open {
        prefetch: false,
        path_len: 1,
        flags: libc::O_PATH as u32,
        mode: 0,
        owner: vio::Owner::default(),
    }
    .encode();
    let mut seg = *b"f";
    assert_eq!(
        st(raw(&p, s, m, Some(Segment::ReadWrite(&mut seg)))),
        Errno::EINVAL
    );
    // Random garbage in every word.
    let mut x: u32 = 12345;
    for _ in 0..300 {
        let mut m = Message::zero();
        for w in m.0.iter_mut().take(6) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *w = x;
        }
        m.0[0] = 0x56_0000 | (m.0[0] & 0x1f);
        let mut seg = vec![0u8; 256];
        let r = raw(&p, s, m, Some(Segment::ReadWrite(&mut seg)));
        let _ = vio::status(&r);
    }
    // Still serving, and the file is intact.
    let mut b4 = [0u8; 4];
    assert_eq!(c.read(fh, 0, &mut b4).unwrap(), 4);
    assert_eq!(&b4, b"data");
    c.close(fh).unwrap();
    assert_eq!(c.read_file("f").unwrap(), b"data");
    assert!(
        srv.stats()
            .errors
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 15
    );
}

#[test]
fn killed_server_gives_a_clear_error_and_fsynced_data_survives() {
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_millis(800);
    let mut a = host(vec![], timeout);
    let b = host(vec![a.local_addr()], timeout);
    a.add_peer(b.local_addr());
    let srv = server(&a, dir.path());
    let c = Arc::new(Client::connect(&b, srv.pid(), 4).unwrap());
    let durable = pattern(3 << 20, 77);
    c.write_file("durable", &durable, true).unwrap();
    // A large write in flight when the server's host dies.
    let c2 = c.clone();
    let writer = std::thread::spawn(move || {
        let big = pattern(64 << 20, 5);
        let t = Instant::now();
        let (fh, _) = c2.create("big", 0o644)?;
        let mut r = Ok(0);
        for _ in 0..50 {
            r = c2.write(fh, 0, &big);
            if r.is_err() {
                break;
            }
        }
        r.map(|_| t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    a.shutdown();
    let t = Instant::now();
    let r = writer.join().expect("writer thread");
    assert!(r.is_err(), "a write to a dead server must fail: {r:?}");
    let e = r.unwrap_err();
    assert_eq!(e.errno(), Errno::ENOTCONN, "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "error came in {:?}",
        t.elapsed()
    );
    // New requests fail promptly too.
    let t = Instant::now();
    assert!(matches!(c.stat("durable"), Err(ClientError::Ipc(_))));
    assert!(t.elapsed() < Duration::from_secs(10));
    srv.join();
    drop(a);
    // Restart on the same tree: the fsynced file is intact.
    let a2 = host(vec![b.local_addr()], Duration::from_secs(3));
    b.add_peer(a2.local_addr());
    let srv2 = server(&a2, dir.path());
    let c = Client::connect(&b, srv2.pid(), 2).unwrap();
    assert_eq!(hash(&c.read_file("durable").unwrap()), hash(&durable));
}

/// Program loading: header read, then the image; a non-program, a file
/// without execute permission and an image over the limit are refused.
#[test]
fn programs_load_by_header_then_image() {
    use std::os::unix::fs::PermissionsExt;
    use vkernel_fs::client::ProgramKind;
    let (a, b) = two_hosts(Duration::from_secs(5));
    let dir = tempfile::tempdir().unwrap();
    let _s = server(&a, dir.path());
    let c = Client::connect(&b, _s.pid(), 2).unwrap();
    let mut elf = b"\x7fELF".to_vec();
    elf.extend(pattern(20 << 20, 7));
    let put = |name: &str, data: &[u8], mode: u32| {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    put("big", &elf, 0o755);
    put("tiny.sh", b"#!/bin/sh\necho hi\n", 0o755);
    put("data", b"just bytes, not a program", 0o755);
    put("noexec", &elf[..5000], 0o644);
    let img = c.load_program("big", 64 << 20).unwrap();
    assert_eq!(img.kind, ProgramKind::Elf);
    assert_eq!(hash(&img.image), hash(&elf));
    let img = c.load_program("tiny.sh", 1 << 20).unwrap();
    assert_eq!(img.kind, ProgramKind::Script);
    assert_eq!(img.image, b"#!/bin/sh\necho hi\n");
    assert_eq!(server_err(c.load_program("data", 1 << 20)), Errno::ENOEXEC);
    assert_eq!(server_err(c.load_program("noexec", 1 << 20)), Errno::EACCES);
    assert_eq!(server_err(c.load_program("big", 1 << 20)), Errno::EFBIG);
    assert_eq!(
        server_err(c.load_program("missing", 1 << 20)),
        Errno::ENOENT
    );
}

/// Reads answered with the reply (data sent ahead, then moved when a
/// piece is lost) and writes pulled by MoveFrom stay exact under 5 %
/// loss, duplication and reordering.
#[test]
fn large_reads_and_writes_are_exact_on_a_lossy_network() {
    let faults = vkernel::FaultConfig {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.02,
        seed: 5,
        ..vkernel::FaultConfig::default()
    };
    let start = |peers, seed: u64| {
        Kernel::start(KernelConfig {
            peers,
            host_timeout: Duration::from_secs(5),
            faults: vkernel::FaultConfig {
                seed,
                ..faults.clone()
            },
            ..Default::default()
        })
        .expect("start host")
    };
    let a = start(vec![], 5);
    let b = start(vec![a.local_addr()], 6);
    a.add_peer(b.local_addr());
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&a, dir.path());
    let c = Client::connect(&b, srv.pid(), 4).unwrap();
    for (i, n) in [100_000usize, 700_000, 3 << 20].into_iter().enumerate() {
        let data = pattern(n, 40 + i as u64);
        let name = format!("lossy{n}");
        c.write_file(&name, &data, true).unwrap();
        // Enough reads sent ahead (11 chunks each for 700 kB) that some
        // certainly lose a piece.
        for _ in 0..if n == 700_000 { 30 } else { 1 } {
            let back = c.read_file(&name).unwrap();
            assert_eq!(hash(&back), hash(&data), "{n} bytes read back");
        }
    }
    assert!(b.stats().drops_of(vkernel::DropReason::ReplyDataMissing) > 0);
}

/// The requests that spare exchanges (OPENREAD, READDIRPLUS, WRITE with
/// attributes, parent attributes, CLOSEV) answer what separate requests
/// and a local stat answer.
#[test]
fn compound_answers_match_separate_requests() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_hosts(Duration::from_secs(3));
    let srv = server(&a, dir.path());
    let c = Client::connect(&b, srv.pid(), 4).unwrap();
    let local = |p: &str| std::fs::symlink_metadata(dir.path().join(p)).unwrap();
    let same_dir = |got: Option<vio::Attr>, p: &str| {
        let got = got.expect("directory attributes answered");
        let m = local(p);
        assert_eq!(
            (got.ino, got.mtime, got.mtime_ns, got.nlink as u64, got.size),
            (
                m.ino(),
                m.mtime(),
                m.mtime_nsec() as u32,
                m.nlink(),
                m.size()
            ),
            "{p}"
        );
    };
    // MKDIR, OPEN creating, UNLINK, RMDIR with the directory's attributes.
    let (_, d) = c.mkdir_in("d", 0o755, vio::Owner::default()).unwrap();
    same_dir(d, "");
    let (fh, fa, d, made) = c
        .create_in(
            "d/f",
            libc::O_CREAT | libc::O_RDWR,
            0o644,
            vio::Owner::default(),
        )
        .unwrap();
    same_dir(d, "d");
    assert_eq!(fa.ino, local("d/f").ino());
    assert!(made, "the open made the file");
    let (again, _, none, made) = c
        .create_in(
            "d/f",
            libc::O_CREAT | libc::O_RDONLY,
            0o644,
            vio::Owner::default(),
        )
        .unwrap();
    assert!(!made && none.is_none(), "an existing file: not made here");
    c.close(again).unwrap();
    // WRITE with attributes: written before the answer.
    let data = pattern(70_000, 3);
    let (n, wa) = c.write_attr(fh, 0, &data).unwrap();
    assert_eq!(n, data.len());
    let wa = wa.expect("attributes after the write");
    assert_eq!(
        (wa.size, wa.mtime_ns),
        (70_000, local("d/f").mtime_nsec() as u32)
    );
    // OPENREAD: the first 60 KiB with the open, and all of a small file.
    let (rh, ra, head) = c.open_read("d/f", libc::O_RDONLY, 1 << 20).unwrap();
    assert_eq!(ra.size, 70_000);
    assert_eq!(head.unwrap(), data[..vkernel_fs::client::OPEN_READ_MAX]);
    c.write_file("d/small", b"tiny", false).unwrap();
    let (sh, _, small) = c.open_read("d/small", libc::O_RDONLY, 1 << 20).unwrap();
    assert_eq!(small.unwrap(), b"tiny");
    // READDIRPLUS: the same names as READDIR, each with lstat's answer.
    for i in 0..200 {
        std::fs::write(dir.path().join(format!("d/e{i:03}")), vec![b'x'; i]).unwrap();
    }
    let (dh, count) = c.opendir("d").unwrap();
    let mut at = 0;
    let mut seen = 0;
    loop {
        let chunk = c
            .readdirplus_at(dh, at)
            .unwrap()
            .expect("READDIRPLUS known");
        for (e, attr) in &chunk.entries {
            let name = String::from_utf8(e.name.clone()).unwrap();
            let m = local(&format!("d/{name}"));
            assert_eq!(
                (attr.ino, attr.size, attr.mode),
                (m.ino(), m.size(), m.mode())
            );
            seen += 1;
        }
        if chunk.done {
            break;
        }
        at = chunk.next;
    }
    assert_eq!(seen, count as usize);
    assert_eq!(seen, 202);
    // CLOSEV: every handle gone in one request; a bad one reported.
    let before = srv.open_handles();
    c.close_many(&[fh, rh, sh, dh]).unwrap();
    assert_eq!(srv.open_handles(), before - 4);
    assert_eq!(
        server_err(c.close_many(&[vkernel_fs::client::Fh(0xdead)])),
        Errno::EBADF
    );
    // UNLINK and RMDIR answer the directory after the change.
    for i in 0..200 {
        c.unlink(format!("d/e{i:03}")).unwrap();
    }
    same_dir(c.unlink_in("d/small").unwrap(), "d");
    same_dir(c.unlink_in("d/f").unwrap(), "d");
    same_dir(c.rmdir_in("d").unwrap(), "");
}

/// A client that holds a lock and vanishes (its host shut down) does not
/// block the others for good: the server finds it gone and grants the
/// waiting lock. Locks from two clients exclude each other meanwhile.
#[test]
fn a_vanished_clients_locks_are_released() {
    use vkernel_fs::client::LockRequest;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("db"), b"0123456789").unwrap();
    let ks = host(vec![], Duration::from_secs(1));
    let srv = server(&ks, dir.path());
    let ka = host(vec![ks.local_addr()], Duration::from_secs(1));
    let kb = host(vec![ks.local_addr()], Duration::from_secs(1));
    ks.add_peer(ka.local_addr());
    ks.add_peer(kb.local_addr());
    let a = Client::connect(&ka, srv.pid(), 2).unwrap();
    let b = Client::connect(&kb, srv.pid(), 2).unwrap();
    let (fa, _) = a.open("db", libc::O_RDWR, 0).unwrap();
    let (fb, _) = b.open("db", libc::O_RDWR, 0).unwrap();
    let l = |owner| LockRequest {
        kind: vio::LOCK_WRITE,
        owner,
        pid: 1,
        start: 0,
        end: u64::MAX,
    };
    a.lock(fa, &l(7), false).unwrap();
    assert_eq!(server_err(b.lock(fb, &l(7), false)), Errno::EAGAIN);
    let holder = b.test_lock(fb, &l(7)).unwrap().expect("a conflicting lock");
    assert_eq!((holder.kind, holder.start), (vio::LOCK_WRITE, 0));
    // A vanishes without unlocking.
    drop(a);
    drop(ka);
    let t = Instant::now();
    b.lock(fb, &l(7), true).unwrap();
    let waited = t.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "granted after {waited:?}; the checker runs every 5 s"
    );
    assert!(b.test_lock(fb, &l(8)).unwrap().is_some(), "B holds it now");
}

/// WRITE_APPEND goes at the end as the server finds it, whatever offset
/// the client sends and even on a handle opened without O_APPEND: appends
/// from two clients on two hosts never land on each other.
#[test]
fn appends_from_two_clients_land_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_hosts(Duration::from_secs(5));
    let srv = server(&a, dir.path());
    let clients = [
        Arc::new(Client::connect(&a, srv.pid(), 2).unwrap()),
        Arc::new(Client::connect(&b, srv.pid(), 2).unwrap()),
    ];
    let (fh, _) = clients[0].create("log", 0o644).unwrap();
    clients[0].close(fh).unwrap();
    const N: usize = 300;
    let threads: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(t, c)| {
            let c = c.clone();
            std::thread::spawn(move || {
                let (fh, _) = c.open("log", libc::O_WRONLY, 0).unwrap();
                for i in 0..N {
                    let line = format!("{t} {i:04}\n");
                    // A stale offset (0): the server must not use it.
                    let (n, attr) = c.append_attr(fh, 0, line.as_bytes()).unwrap();
                    assert_eq!(n, line.len());
                    assert!(attr.is_some_and(|a| a.size >= ((i + 1) * line.len()) as u64));
                }
                c.close(fh).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let text = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * N, "{text}");
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len(), 2 * N, "every line once");
    // A handle opened O_APPEND: plain writes append (as older clients
    // expect), WRITE_AT writes where it says.
    let c = &clients[1];
    let (fh, _) = c.open("log", libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
    c.write(fh, 0, b"tail\n").unwrap();
    c.write_flagged(fh, 0, b"X", vio::WRITE_AT).unwrap();
    c.close(fh).unwrap();
    let text = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(text.starts_with('X') && text.ends_with("tail\n"), "{text}");
}
