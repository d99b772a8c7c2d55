//! Pipes and remote execution end to end: real logical hosts on loopback
//! UDP, a real file server, real OS child processes.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vkernel::{Kernel, KernelConfig, Message, Pid, Segment};
use vkernel_fs::server::{FileServer, ServerConfig};
use vkernel_team::pipe::{End, PipeError, PipeServer, Pipes};
use vkernel_team::team::{self, Exit, TeamConfig, TeamServer};
use vkernel_team::Status;

fn host(peers: Vec<std::net::SocketAddr>) -> Kernel {
    Kernel::start(KernelConfig {
        peers,
        host_timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .expect("host")
}

/// `n` hosts that all know each other.
fn hosts(n: usize) -> Vec<Kernel> {
    let first = host(vec![]);
    let mut v = vec![first];
    for _ in 1..n {
        let peers = v.iter().map(|k| k.local_addr()).collect();
        v.push(host(peers));
    }
    for a in &v {
        for b in &v {
            if a.host_id() != b.host_id() {
                a.add_peer(b.local_addr());
            }
        }
    }
    v
}

fn status(r: Result<impl std::fmt::Debug, PipeError>) -> Status {
    match r {
        Err(PipeError::Status(s)) => s,
        other => panic!("expected a status, got {other:?}"),
    }
}

#[test]
fn pipes_keep_order_block_when_full_and_end_after_the_writer() {
    let ks = hosts(2);
    let srv = PipeServer::start(&ks[0]).unwrap();
    let pipes = Pipes { server: srv.pid() };
    // Order across many writes of odd sizes, reader on another host.
    let w = ks[0].create_process().unwrap();
    let id = pipes.create(&w, 0).unwrap();
    let reader = ks[1].create_process().unwrap();
    pipes.hand_off(&w, id, End::Read, reader.pid()).unwrap();
    let total: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let data = total.clone();
    let wh = std::thread::spawn(move || {
        let mut off = 0;
        let mut step = 1;
        while off < data.len() {
            let n = step.min(data.len() - off);
            pipes.write(&w, id, &data[off..off + n]).unwrap();
            off += n;
            step = step * 3 % 40_000 + 1;
        }
        // The writer leaves without closing: its buffered data must
        // survive, then the reader sees end of file.
        drop(w);
    });
    let mut got = Vec::new();
    let mut buf = vec![0u8; 50_000];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = pipes.read(&reader, id, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        assert!(Instant::now() < deadline, "pipe never reached end of file");
    }
    wh.join().unwrap();
    assert_eq!(got.len(), total.len());
    assert!(got == total, "bytes arrive in write order");

    // A full pipe holds the writer (delayed Reply) until a read makes room.
    let w = ks[0].create_process().unwrap();
    let id = pipes.create(&w, vkernel_team::pipe::CHUNK).unwrap();
    let r = ks[0].create_process().unwrap();
    pipes.hand_off(&w, id, End::Read, r.pid()).unwrap();
    let finished = Arc::new(AtomicBool::new(false));
    let f2 = finished.clone();
    let wh = std::thread::spawn(move || {
        pipes
            .write(&w, id, &[1u8; 3 * vkernel_team::pipe::CHUNK])
            .unwrap();
        f2.store(true, Ordering::SeqCst);
        pipes.close(&w, id, End::Write).unwrap();
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !finished.load(Ordering::SeqCst),
        "a writer to a full pipe stays blocked"
    );
    let mut n = 0;
    loop {
        let k = pipes.read(&r, id, &mut buf).unwrap();
        if k == 0 {
            break;
        }
        n += k;
    }
    wh.join().unwrap();
    assert!(finished.load(Ordering::SeqCst));
    assert_eq!(n, 3 * vkernel_team::pipe::CHUNK);
}

#[test]
fn pipe_ends_change_hands_and_bad_requests_get_errors() {
    let ks = hosts(2);
    let srv = PipeServer::start(&ks[0]).unwrap();
    let pipes = Pipes { server: srv.pid() };
    let a = ks[0].create_process().unwrap();
    let b = ks[1].create_process().unwrap();
    let id = pipes.create(&a, 0).unwrap();
    pipes.hand_off(&a, id, End::Write, b.pid()).unwrap();
    // The old holder may no longer write; the new one may.
    assert_eq!(status(pipes.write(&a, id, b"x")), Status::EBADF);
    assert_eq!(
        status(pipes.hand_off(&a, id, End::Write, a.pid())),
        Status::EBADF
    );
    pipes.write(&b, id, b"from b").unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(pipes.read(&a, id, &mut buf).unwrap(), 6);
    assert_eq!(&buf[..6], b"from b");
    // Closing the read end makes writes fail with EPIPE.
    pipes.close(&a, id, End::Read).unwrap();
    assert_eq!(status(pipes.write(&b, id, b"y")), Status::EPIPE);
    pipes.close(&b, id, End::Write).unwrap();
    // The pipe is gone once both ends are closed.
    assert_eq!(status(pipes.read(&a, id, &mut buf)), Status::EBADF);
    // Malformed requests: unknown pipe, bad end, unknown code, bad size.
    assert_eq!(status(pipes.write(&a, 999, b"z")), Status::EBADF);
    let mut m = Message::with_code(vkernel_team::pipe::CLOSE);
    m.0[1] = id;
    m.0[2] = 7;
    a.send(&mut m, srv.pid()).unwrap();
    assert_eq!(Status(m.0[0]), Status::EINVAL);
    let mut m = Message::with_code(0x50_50ff);
    a.send(&mut m, srv.pid()).unwrap();
    assert_eq!(Status(m.0[0]), Status::ENOSYS);
    let mut m = Message::with_code(vkernel_team::pipe::CREATE);
    m.0[1] = 5;
    a.send(&mut m, srv.pid()).unwrap();
    assert_eq!(Status(m.0[0]), Status::EINVAL, "capacity below one chunk");
    let mut m = Message::with_code(vkernel_team::pipe::WRITE);
    m.0[1] = pipes.create(&a, 0).unwrap();
    m.0[2] = 100;
    a.send_with_segment(&mut m, srv.pid(), Segment::Read(&[0u8; 10]))
        .unwrap();
    assert_eq!(Status(m.0[0]), Status::EINVAL, "length beyond the data");
    // Still serving.
    let id = pipes.create(&a, 0).unwrap();
    pipes.write(&a, id, b"ok").unwrap();
    assert_eq!(pipes.read(&a, id, &mut buf).unwrap(), 2);
}

/// A file server on host 0 exporting programs; returns it and its root.
fn programs(k: &Kernel) -> (FileServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, body: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    put(
        "greet.sh",
        b"#!/bin/sh\necho \"hello $1\"\nread line\necho \"got $line\"\necho oops >&2\nexit 3\n",
    );
    put("cat", &std::fs::read("/bin/cat").unwrap());
    put("sleeper.sh", b"#!/bin/sh\nexec sleep 30\n");
    let fs = FileServer::start(k, dir.path(), ServerConfig::default()).unwrap();
    (fs, dir)
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

#[test]
fn programs_run_on_another_host_with_stdio_over_pipes() {
    let ks: Vec<Arc<Kernel>> = hosts(3).into_iter().map(Arc::new).collect();
    let (fs, _root) = programs(&ks[0]);
    let ts = TeamServer::start(ks[1].clone(), TeamConfig::default()).unwrap();
    let (out, err) = (Sink::default(), Sink::default());
    let argv = vec![b"greet.sh".to_vec(), b"world".to_vec()];
    let e = team::run(
        &ks[2],
        ts.pid(),
        fs.pid(),
        &argv,
        Some(Box::new(std::io::Cursor::new(b"some input\n".to_vec()))),
        Box::new(out.clone()),
        Box::new(err.clone()),
    )
    .unwrap();
    assert_eq!(
        e,
        Exit {
            code: 3,
            signal: None
        }
    );
    assert_eq!(
        String::from_utf8_lossy(&out.take()),
        "hello world\ngot some input\n"
    );
    assert_eq!(err.take(), b"oops\n");
    // An ELF binary, with a megabyte through stdin and back.
    let input: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    let e = team::run(
        &ks[2],
        ts.pid(),
        fs.pid(),
        &[b"cat".to_vec()],
        Some(Box::new(std::io::Cursor::new(input.clone()))),
        Box::new(out.clone()),
        Box::new(err.clone()),
    )
    .unwrap();
    assert_eq!(e.code, 0);
    assert!(out.take() == input, "cat gives back its input");
    // Clear errors: missing program, not a program.
    let r = team::run(
        &ks[2],
        ts.pid(),
        fs.pid(),
        &[b"missing".to_vec()],
        None,
        Box::new(out.clone()),
        Box::new(err.clone()),
    );
    assert!(
        matches!(r, Err(team::RunError::Status(Status::ENOENT))),
        "{r:?}"
    );
    // Host selection by the team servers' group: the only one answers.
    let p = ks[2].create_process().unwrap();
    let chosen = team::select_team(&p, 4, Duration::from_millis(300), 0.0).unwrap();
    assert_eq!(chosen, ts.pid());
}

/// RUN by hand (to learn the OS pid); returns (reply, os pid).
fn raw_run(p: &vkernel::Process, team: Pid, fs: Pid, prog: &[u8]) -> Message {
    let mut m = Message::with_code(team::RUN);
    m.0[1] = fs.0;
    p.send_with_segment(&mut m, team, Segment::Read(prog))
        .unwrap();
    m
}

#[test]
fn a_vanished_client_leaves_no_orphan_and_policy_refuses() {
    let ks: Vec<Arc<Kernel>> = hosts(2).into_iter().map(Arc::new).collect();
    let (fs, _root) = programs(&ks[0]);
    let ts = TeamServer::start(ks[1].clone(), TeamConfig::default()).unwrap();
    // A client host that disappears while its program runs.
    let c = host(vec![ks[0].local_addr(), ks[1].local_addr()]);
    ks[1].add_peer(c.local_addr());
    let p = c.create_process().unwrap();
    let m = raw_run(&p, ts.pid(), fs.pid(), b"sleeper.sh");
    assert_eq!(Status(m.0[0]), Status::OK);
    let os_pid = m.0[6];
    let proc_dir = std::path::PathBuf::from(format!("/proc/{os_pid}"));
    assert!(proc_dir.exists(), "the program runs");
    drop(p);
    drop(c);
    // Detected within host timeout (2 s) + a check interval.
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!proc_dir.exists(), "the job was killed with its client");

    // Policy: refuse remote requests; only principal 7.
    let strict = TeamServer::start(
        ks[0].clone(),
        TeamConfig {
            refuse_remote: true,
            ..Default::default()
        },
    );
    // One team server per host registers the name; a second on ks[0] is
    // still addressable by pid.
    let strict = strict.unwrap();
    let remote = ks[1].create_process().unwrap();
    let m = raw_run(&remote, strict.pid(), fs.pid(), b"greet.sh");
    assert_eq!(Status(m.0[0]), Status::EACCES, "remote request refused");
    let picky = TeamServer::start(
        ks[1].clone(),
        TeamConfig {
            allowed_principals: Some(vec![7]),
            ..Default::default()
        },
    )
    .unwrap();
    let anyone = ks[1].create_process().unwrap();
    let m = raw_run(&anyone, picky.pid(), fs.pid(), b"greet.sh");
    assert_eq!(Status(m.0[0]), Status::EACCES, "principal 0 refused");
    let seven = ks[1].create_process().unwrap();
    seven.set_principal(7);
    let m = raw_run(&seven, picky.pid(), fs.pid(), b"greet.sh");
    assert_eq!(Status(m.0[0]), Status::OK, "principal 7 admitted");
}

/// A reader of an empty pipe is held (delayed Reply) until data arrives,
/// and the server's pipe table is bounded.
#[test]
fn an_empty_pipe_holds_its_reader_and_pipes_are_bounded() {
    let ks = hosts(1);
    let srv = PipeServer::start(&ks[0]).unwrap();
    let pipes = Pipes { server: srv.pid() };
    let w = ks[0].create_process().unwrap();
    let id = pipes.create(&w, 0).unwrap();
    let r = ks[0].create_process().unwrap();
    pipes.hand_off(&w, id, End::Read, r.pid()).unwrap();
    let got = Arc::new(AtomicBool::new(false));
    let g2 = got.clone();
    let rh = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        let n = pipes.read(&r, id, &mut buf).unwrap();
        g2.store(true, Ordering::SeqCst);
        buf[..n].to_vec()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!got.load(Ordering::SeqCst), "the reader waits for data");
    pipes.write(&w, id, b"late").unwrap();
    assert_eq!(rh.join().unwrap(), b"late");
    // The table is bounded: creations past the limit get ENFILE.
    let mut n = 1;
    let err = loop {
        match pipes.create(&w, 0) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n <= vkernel_team::pipe::MAX_PIPES, "no limit");
    };
    assert_eq!(n, vkernel_team::pipe::MAX_PIPES);
    assert!(matches!(err, PipeError::Status(Status::ENFILE)), "{err:?}");
}
