//! Programs attached to a machine host: the same API, the host's pid space.

use std::time::Duration;

mod common;

use common::wait_for;
use vkernel::{IpcError, Kernel, KernelConfig, Message, Scope, Segment};

fn machine_host(name: &str) -> (Kernel, vkernel::AttachServer, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("vk-attach-{}-{name}", std::process::id()));
    let path = dir.join("host.sock");
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let s = k.serve_attach(&path, 0o600).unwrap();
    (k, s, path)
}

#[test]
fn two_attachments_exchange_in_the_hosts_pid_space() {
    let (host, _srv, path) = machine_host("x");
    let a = Kernel::attach(&path).unwrap();
    let b = Kernel::attach(&path).unwrap();
    assert!(a.is_attached());
    assert_eq!(a.host_id(), host.host_id());
    let server = b.create_process().unwrap();
    assert_eq!(server.pid().host(), host.host_id());
    server.set_pid(77, server.pid(), Scope::Local);
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        let mut buf = vec![0u8; 16];
        for _ in 0..100 {
            let i = server.receive_with_segment(&mut m, &mut buf).unwrap();
            assert_eq!(i.seg_bytes, 12);
            assert_eq!(&buf[..5], b"hello");
            m.set_word(1, m.word(1) + 1);
            server.move_to(i.from, 5, b" world").unwrap();
            server.reply(&m, i.from).unwrap();
        }
    });
    let c = a.create_process().unwrap();
    let spid = c.get_pid(77, Scope::Local).unwrap();
    for n in 0..100u32 {
        let mut m = Message::with_code(1);
        m.set_word(1, n);
        let mut seg = *b"hello......!";
        let r = c
            .send_with_segment(&mut m, spid, Segment::ReadWrite(&mut seg))
            .unwrap();
        assert_eq!(r.from, spid);
        assert_eq!(m.word(1), n + 1);
        assert_eq!(&seg, b"hello world!");
    }
    t.join().unwrap();
    assert!(host.process_exists(c.pid()));
    drop(c);
    // The host's embedded processes and attached ones talk too.
    let hp = host.create_process().unwrap();
    let ap = a.create_process().unwrap();
    let apid = ap.pid();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        let i = ap.receive(&mut m).unwrap();
        ap.reply(&m, i.from).unwrap();
    });
    let mut m = Message::with_code(9);
    hp.send(&mut m, apid).unwrap();
    t.join().unwrap();
}

#[test]
fn a_detached_program_leaves_no_process_behind() {
    let (host, _srv, path) = machine_host("d");
    let a = Kernel::attach(&path).unwrap();
    let p = a.create_process().unwrap();
    let pid = p.pid();
    let client = host.create_process().unwrap();
    let t = std::thread::spawn(move || {
        let mut m = Message::with_code(1);
        client.send(&mut m, pid)
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(a);
    // The process is gone once the host has seen the program go.
    let r = t.join().unwrap();
    assert!(matches!(r, Err(IpcError::NoSuchProcess(_))), "{r:?}");
    assert!(!host.process_exists(pid));
    let mut m = Message::zero();
    assert_eq!(p.receive(&mut m), Err(IpcError::Shutdown));
}

#[test]
fn a_lost_host_fails_calls_promptly() {
    let (host, srv, path) = machine_host("l");
    let a = Kernel::attach(&path).unwrap();
    let p = a.create_process().unwrap();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        p.receive(&mut m)
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(srv);
    drop(host);
    assert_eq!(t.join().unwrap(), Err(IpcError::HostLost));
    assert!(a.create_process().is_err());
}

#[test]
fn destroying_an_attached_process_ends_its_call_through_the_host() {
    let (_host, _srv, path) = machine_host("destroy");
    let a = Kernel::attach(&path).unwrap();
    // A server that never receives: the Send waits in the host's engine,
    // its program in the call slot.
    let server = a.create_process().unwrap();
    let spid = server.pid();
    let killer = a.create_process().unwrap();
    for _ in 0..3 {
        let c = a.create_process().unwrap();
        let cpid = c.pid();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut m = Message::with_code(1);
            let _ = tx.send(c.send(&mut m, spid));
        });
        // Long past any spinning: the program waits blocked.
        std::thread::sleep(Duration::from_millis(100));
        killer.destroy(cpid).unwrap();
        // Unwoken, it would wait for ever (the engine forgot the Send
        // with its process, deadline and all).
        let r = rx.recv_timeout(Duration::from_secs(5));
        assert_eq!(r, Ok(Err(IpcError::Destroyed)));
    }
    drop(server);
}

/// `attach_role` (examples/attach_role.rs), a separate program.
fn role(args: &[&str]) -> std::process::Child {
    role_with(args, "on")
}

/// The `attach_role` binary cargo built beside this test.
fn role_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    profile_dir.join("examples/attach_role")
}

fn pid_line(c: &mut std::process::Child) -> vkernel::Pid {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    vkernel::Pid(u32::from_str_radix(line.trim(), 16).expect("a pid"))
}

#[test]
fn a_program_killed_with_sigkill_loses_its_processes_and_names() {
    let (host, _srv, path) = machine_host("k");
    let mut child = role(&["sleeper", path.to_str().unwrap(), "sleepy"]);
    let pid = pid_line(&mut child);
    let client = host.create_process().unwrap();
    assert_eq!(
        client.get_pid(vkernel::service::id("sleepy"), Scope::Local),
        Ok(pid)
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut m = Message::with_code(1);
        let r = client.send(&mut m, pid);
        tx.send(std::time::Instant::now()).unwrap();
        (r, client)
    });
    // The Send is queued at the sleeper's process, which never receives.
    std::thread::sleep(Duration::from_millis(100));
    assert!(rx.try_recv().is_err(), "the Send should still be blocked");
    child.kill().unwrap();
    let killed = std::time::Instant::now();
    child.wait().unwrap();
    let (r, client) = t.join().unwrap();
    let failed = rx.recv().unwrap();
    eprintln!(
        "blocked Send failed {:.1} ms after kill -9",
        failed.saturating_duration_since(killed).as_secs_f64() * 1e3
    );
    assert_eq!(r, Err(IpcError::NoSuchProcess(pid)));
    assert!(!host.process_exists(pid));
    assert!(client
        .get_pid(vkernel::service::id("sleepy"), Scope::Local)
        .unwrap()
        .is_none());
}

#[test]
fn a_hostile_program_scribbling_on_its_pages_harms_no_one_else() {
    let (host, srv, path) = machine_host("h");
    let mut hostile = role(&["hostile", path.to_str().unwrap(), "2"]);
    let a = Kernel::attach(&path).unwrap();
    let server = a.create_process().unwrap();
    let spid = server.pid();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        let mut buf = [0u8; 64];
        let mut n = 0;
        loop {
            let i = match server.receive_with_segment(&mut m, &mut buf) {
                Ok(i) => i,
                Err(e) => panic!("server: {e:?}"),
            };
            if m.code() == 2 {
                let _ = server.reply(&m, i.from);
                break;
            }
            m.set_word(1, m.word(1) ^ 0xffff_ffff);
            if let Err(e) = server.reply_with_segment(&m, i.from, 0, &buf[..i.seg_bytes]) {
                panic!("server reply: {e:?}");
            }
            n += 1;
        }
        n
    });
    // And a plain echo, which exchanges through peer pages.
    let b = Kernel::attach(&path).unwrap();
    let echo = b.create_process().unwrap();
    let epid = echo.pid();
    let e = std::thread::spawn(move || {
        let mut m = Message::zero();
        loop {
            let i = echo.receive(&mut m).expect("echo");
            let stop = m.code() == 2;
            m.set_word(1, m.word(1) + 1);
            echo.reply(&m, i.from).expect("echo reply");
            if stop {
                break;
            }
        }
    });
    let c = a.create_process().unwrap();
    let mut rounds = 0u32;
    wait_for(Duration::from_secs(60), "the hostile program ends", || {
        let mut m = Message::with_code(1);
        m.set_word(1, rounds);
        c.send(&mut m, epid).unwrap();
        assert_eq!(m.word(1), rounds + 1);
        let mut m = Message::with_code(1);
        m.set_word(1, rounds);
        let mut seg = rounds.to_le_bytes().repeat(8);
        let want = seg.clone();
        c.send_with_segment(&mut m, spid, Segment::ReadWrite(&mut seg))
            .unwrap();
        assert_eq!(m.word(1), rounds ^ 0xffff_ffff);
        assert_eq!(seg, want);
        rounds += 1;
        (hostile.try_wait().unwrap().is_some() && rounds >= 100).then_some(())
    });
    assert!(
        hostile.wait().unwrap().success(),
        "the hostile program ran to its end"
    );
    let mut m = Message::with_code(2);
    c.send(&mut m, spid).unwrap();
    assert_eq!(t.join().unwrap(), rounds);
    let mut m = Message::with_code(2);
    c.send(&mut m, epid).unwrap();
    e.join().unwrap();
    assert!(srv.peer_exchanges() >= u64::from(rounds));
    // The host still serves new programs.
    assert!(Kernel::attach(&path).unwrap().create_process().is_ok());
    assert!(srv.attached() >= 1);
    drop(host);
}

#[test]
fn a_hundred_programs_attach_to_one_host() {
    let (host, srv, path) = machine_host("c");
    let p = path.to_str().unwrap().to_string();
    let mut kids: Vec<_> = (0..100)
        .map(|i| role(&["sleeper", &p, &format!("s{i}")]))
        .collect();
    let pids: Vec<_> = kids.iter_mut().map(pid_line).collect();
    assert_eq!(srv.attached(), 100);
    let client = host.create_process().unwrap();
    for (i, pid) in pids.iter().enumerate() {
        let found = client.get_pid(vkernel::service::id(&format!("s{i}")), Scope::Local);
        assert_eq!(found, Ok(*pid));
    }
    // The host maps each program's slot and window ...
    let mapped = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains("memfd:vkernel-"))
            .count()
    };
    // (Other tests in this process may map some too: count the change.)
    let before = mapped();
    assert!(before >= 200, "{before} mappings");
    for k in &mut kids {
        k.kill().unwrap();
        k.wait().unwrap();
    }
    wait_for(
        Duration::from_secs(30),
        "the killed programs' processes go",
        || (!pids.iter().any(|p| host.process_exists(*p)) && srv.attached() == 0).then_some(()),
    );
    // ... and unmaps them once the programs are gone.
    wait_for(Duration::from_secs(30), "their mappings go", || {
        (mapped() <= before - 200).then_some(())
    });
}

#[test]
fn large_moves_between_attached_programs_are_exact_and_checked() {
    let (_host, srv, path) = machine_host("m");
    let a = Kernel::attach(&path).unwrap();
    let b = Kernel::attach(&path).unwrap();
    let server = b.create_process().unwrap();
    let spid = server.pid();
    const N: usize = 3 << 20;
    let pattern: Vec<u8> = (0..N).map(|i| (i * 7 + i / 4093) as u8).collect();
    let want = pattern.clone();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        // 1: fill the client's segment from offset 1000; 2: read it back.
        let i = server.receive(&mut m).unwrap();
        assert_eq!(
            server.move_to(i.from, 1000, &pattern[..N - 1000]),
            Ok(N - 1000)
        );
        assert_eq!(
            server.move_to(i.from, 1001, &pattern[..N - 1000]),
            Err(IpcError::OutOfBounds(i.from))
        );
        server.reply(&m, i.from).unwrap();
        let i = server.receive(&mut m).unwrap();
        let mut back = vec![0u8; N];
        assert_eq!(server.move_from(i.from, 0, &mut back), Ok(N));
        assert_eq!(
            server.move_from(i.from, 1, &mut back),
            Err(IpcError::OutOfBounds(i.from))
        );
        server.reply(&m, i.from).unwrap();
        // Only while the Send is outstanding.
        assert_eq!(
            server.move_from(i.from, 0, &mut vec![0u8; N]),
            Err(IpcError::NotAwaitingReply(i.from))
        );
        back
    });
    let c = a.create_process().unwrap();
    let mut seg = vec![0xaa_u8; N];
    let mut m = Message::with_code(1);
    c.send_with_segment(&mut m, spid, Segment::Write(&mut seg))
        .unwrap();
    assert!(
        seg[..1000].iter().all(|&x| x == 0xaa),
        "bytes not moved to stay"
    );
    assert!(seg[1000..] == want[..N - 1000], "moved bytes exact");
    let mut m = Message::with_code(2);
    c.send_with_segment(&mut m, spid, Segment::Read(&seg))
        .unwrap();
    assert!(t.join().unwrap() == seg, "read back exact");
    // Both moves copied straight between the programs (same uid).
    assert_eq!(srv.granted_moves(), 2);
}

/// Both ways attached programs of one uid exchange: through peer pages
/// (the default) and through the host's engine.
const PEER_MODES: [&str; 2] = ["on", "off"];

/// `attach_role` with peer pages `on` or `off` (`VKERNEL_ATTACH_PEER`).
fn role_with(args: &[&str], peer: &str) -> std::process::Child {
    std::process::Command::new(role_bin())
        .args(args)
        .env("VKERNEL_ATTACH_PEER", peer)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run examples/attach_role (built by cargo test)")
}

fn read_line(r: &mut impl std::io::BufRead) -> String {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    line.trim().to_string()
}

#[test]
fn a_receiver_killed_holding_a_message_fails_its_sender_either_way() {
    use std::io::BufReader;
    for mode in PEER_MODES {
        let (_host, srv, path) = machine_host(&format!("k{mode}"));
        let p = path.to_str().unwrap();
        let mut holder = role_with(&["holder", p], mode);
        let mut hout = BufReader::new(holder.stdout.take().unwrap());
        let hpid = read_line(&mut hout);
        // The holder is waiting in Receive well before the Send.
        std::thread::sleep(Duration::from_millis(100));
        let mut sender = role_with(&["send", p, &hpid, "1"], mode);
        let mut sout = BufReader::new(sender.stdout.take().unwrap());
        let got = read_line(&mut hout);
        assert!(got.starts_with("got "), "{mode}: holder said {got:?}");
        let before = srv.peer_exchanges();
        assert_eq!(before > 0, mode == "on", "{mode}: {before} peer exchanges");
        holder.kill().unwrap();
        let _ = holder.wait();
        let said = read_line(&mut sout);
        assert!(
            said.contains("does not exist"),
            "{mode}: sender said {said:?}"
        );
        wait_for(Duration::from_secs(10), "the sender to end", || {
            sender.try_wait().ok().flatten()
        });
    }
}

#[test]
fn exchanges_stay_exact_when_peer_and_engine_paths_mix() {
    let (host, srv, path) = machine_host("mix");
    let a = Kernel::attach(&path).unwrap();
    let b = Kernel::attach(&path).unwrap();
    let server = b.create_process().unwrap();
    let spid = server.pid();
    let rounds = 3_000u32;
    // One server, three clients: an attached program spinning, one
    // blocking, and a process of the host itself (always the engine).
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        let mut seen = 0;
        while seen < 3 * rounds {
            let i = server.receive(&mut m).unwrap();
            m.set_word(1, m.word(1) + 1);
            server.reply(&m, i.from).unwrap();
            seen += 1;
        }
    });
    let spinner = a.create_process().unwrap();
    spinner.set_spin(Duration::from_micros(200));
    let c = Kernel::attach(&path).unwrap();
    let blocker = c.create_process().unwrap();
    blocker.set_spin(Duration::ZERO);
    let embedded = host.create_process().unwrap();
    let run = |p: vkernel::Process| {
        std::thread::spawn(move || {
            for n in 0..rounds {
                let mut m = Message::with_code(1);
                m.set_word(1, n);
                let r = p.send(&mut m, spid).unwrap();
                assert_eq!((r.from, m.word(1)), (spid, n + 1));
            }
        })
    };
    let ts = [run(spinner), run(blocker), run(embedded)];
    for t in ts {
        t.join().unwrap();
    }
    t.join().unwrap();
    assert!(srv.peer_exchanges() > 0, "some went through peer pages");
}

#[test]
fn a_message_received_through_a_peer_page_can_be_forwarded_anywhere() {
    let (host, _srv, path) = machine_host("fwd");
    let a = Kernel::attach(&path).unwrap();
    let b = Kernel::attach(&path).unwrap();
    let front = b.create_process().unwrap();
    let fpid = front.pid();
    // Two back ends: another attached program, and a process of the host.
    let k = Kernel::attach(&path).unwrap();
    let back_a = k.create_process().unwrap();
    let back_h = host.create_process().unwrap();
    let backs = [back_a.pid(), back_h.pid()];
    let front_t = std::thread::spawn(move || {
        let mut m = Message::zero();
        for n in 0..40u32 {
            let i = front.receive(&mut m).unwrap();
            front.forward(&m, i.from, backs[(n % 2) as usize]).unwrap();
        }
    });
    let serve = |p: vkernel::Process| {
        std::thread::spawn(move || {
            let mut m = Message::zero();
            for _ in 0..20 {
                let i = p.receive(&mut m).unwrap();
                assert_eq!(i.forwarder, fpid, "the forwarder is told");
                m.set_word(2, p.pid().0);
                p.reply(&m, i.from).unwrap();
            }
        })
    };
    let ts = [serve(back_a), serve(back_h)];
    let c = a.create_process().unwrap();
    for n in 0..40u32 {
        let mut m = Message::with_code(3);
        let r = c.send(&mut m, fpid).unwrap();
        assert_eq!(r.from, backs[(n % 2) as usize]);
        assert_eq!(m.word(2), r.from.0);
    }
    front_t.join().unwrap();
    for t in ts {
        t.join().unwrap();
    }
}

#[test]
fn a_program_of_another_user_exchanges_through_the_host_only() {
    use std::io::BufReader;
    let dir = std::env::temp_dir().join(format!("vk-attach-{}-uid", std::process::id()));
    let path = dir.join("host.sock");
    let host = Kernel::start(KernelConfig::default()).unwrap();
    let srv = host.serve_attach(&path, 0o666).unwrap();
    let a = Kernel::attach(&path).unwrap();
    let server = a.create_process().unwrap();
    let spid = server.pid();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        let mut principals = Vec::new();
        for _ in 0..50 {
            let i = server.receive(&mut m).unwrap();
            principals.push(i.principal);
            m.set_word(1, m.word(1) + 1);
            server.reply(&m, i.from).unwrap();
        }
        principals
    });
    use std::os::unix::process::CommandExt;
    let mut other = std::process::Command::new(role_bin())
        .args(["send", path.to_str().unwrap(), &format!("{spid}"), "50"])
        .uid(65534)
        .gid(65534)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let said = read_line(&mut BufReader::new(other.stdout.take().unwrap()));
    let _ = other.wait();
    assert_eq!(said, "ok");
    let principals = t.join().unwrap();
    assert!(principals.iter().all(|p| *p == 65534), "{principals:?}");
    assert_eq!(srv.peer_exchanges(), 0, "no page crosses users");
    drop(srv);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_deadline_bounds_a_send_through_a_peer_page() {
    let (_host, srv, path) = machine_host("dl");
    let a = Kernel::attach(&path).unwrap();
    let b = Kernel::attach(&path).unwrap();
    let server = b.create_process().unwrap();
    let spid = server.pid();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        // Takes the first message and answers only when told to.
        let i = server.receive(&mut m).unwrap();
        rx.recv().unwrap();
        let late = server.reply(&m, i.from);
        // The next one is answered at once.
        let j = server.receive(&mut m).unwrap();
        server.reply(&m, j.from).unwrap();
        late
    });
    let c = a.create_process().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut m = Message::with_code(1);
    let r = c.send_within(&mut m, spid, Some(Duration::from_millis(100)));
    assert_eq!(r, Err(IpcError::Deadline(spid)));
    assert!(srv.peer_exchanges() >= 1, "it went through the inbox");
    tx.send(()).unwrap();
    let mut m = Message::with_code(2);
    c.send(&mut m, spid).unwrap();
    assert_eq!(m.code(), 2, "the answer to this Send, not the late one");
    assert_eq!(
        t.join().unwrap(),
        Err(IpcError::NotAwaitingReply(c.pid())),
        "a late reply is refused"
    );
}

#[test]
fn words_6_and_7_arrive_as_the_engine_leaves_them() {
    let (host, _srv, path) = machine_host("w67");
    let a = Kernel::attach(&path).unwrap();
    let b = Kernel::attach(&path).unwrap();
    let server = b.create_process().unwrap();
    let spid = server.pid();
    let hs = host.create_process().unwrap();
    let hpid = hs.pid();
    let serve = |p: vkernel::Process| {
        std::thread::spawn(move || {
            let mut m = Message::zero();
            let i = p.receive(&mut m).unwrap();
            let seen = (m.word(0), m.word(6), m.word(7));
            p.reply(&m, i.from).unwrap();
            seen
        })
    };
    let (t1, t2) = (serve(server), serve(hs));
    let c = a.create_process().unwrap();
    for to in [spid, hpid] {
        let mut m = Message::with_code(5);
        m.0[0] |= vkernel::message::SEG_READ;
        m.0[6] = 0x66;
        m.0[7] = 0x77;
        c.send(&mut m, to).unwrap();
    }
    // Through a peer page and through the engine alike: no segment.
    assert_eq!(t1.join().unwrap(), (5, 0, 0));
    assert_eq!(t2.join().unwrap(), (5, 0, 0));
}
