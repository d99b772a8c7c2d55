//! Remote Sends of attached programs on their own sockets (docs/PROTOCOL.md
//! §8f): they bypass the machine host's threads, yet keep the protocol's
//! guarantees — exactly-once execution under loss, duplication and
//! reordering, forwards anywhere, clear errors.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::wait_for;
use vkernel::{FaultConfig, IpcError, Kernel, KernelConfig, Message, Pid, Process, Segment, Stats};

/// RemoteSend datagrams a host has sent.
fn remote_sends(s: &Stats) -> u64 {
    s.tx[2]
}

/// RemoteSend datagrams the machine host's engine sent (its counters
/// less what attached programs reported of their own direct Sends).
fn engine_sends(m: &Machine) -> u64 {
    loop {
        let r = remote_sends(&m.srv().reported());
        let all = remote_sends(&m.host.stats());
        if remote_sends(&m.srv().reported()) == r {
            return all - r;
        }
    }
}

struct Machine {
    host: Kernel,
    srv: Option<vkernel::AttachServer>,
    path: std::path::PathBuf,
}

fn machine(name: &str) -> Machine {
    let dir = std::env::temp_dir().join(format!("vk-direct-{}-{name}", std::process::id()));
    let path = dir.join("host.sock");
    let host = Kernel::start(KernelConfig::default()).unwrap();
    let srv = Some(host.serve_attach(&path, 0o600).unwrap());
    Machine { host, srv, path }
}

impl Machine {
    fn srv(&self) -> &vkernel::AttachServer {
        self.srv.as_ref().unwrap()
    }
}

/// Another logical host on loopback, each knowing where the other is.
fn remote_of(m: &Machine, faults: FaultConfig) -> Kernel {
    let r = Kernel::start(KernelConfig {
        faults,
        host_timeout: Duration::from_secs(10),
        ..KernelConfig::default()
    })
    .unwrap();
    r.add_peer(m.host.local_addr());
    m.host.add_peer(r.local_addr());
    r
}

const STOP: u32 = 0xdead;

/// Runs `f` as a new process of `k` on a thread of its own.
fn serve<T: Send + 'static>(
    k: &Kernel,
    f: impl FnOnce(Process) -> T + Send + 'static,
) -> (Pid, std::thread::JoinHandle<T>) {
    let p = k.create_process().unwrap();
    (p.pid(), std::thread::spawn(move || f(p)))
}

/// An echo server that first sleeps for what `delay` says of each
/// request, until STOP.
fn echo_after(p: Process, delay: impl Fn(&Message) -> Duration) {
    let mut msg = Message::zero();
    while let Ok(i) = p.receive(&mut msg) {
        std::thread::sleep(delay(&msg));
        let _ = p.reply(&msg, i.from);
        if msg.code() == STOP {
            break;
        }
    }
}

/// A server that answers word 1 + 1 and counts each request id (word 2)
/// it executed, until STOP.
fn counting_server(p: Process) -> HashMap<u32, u32> {
    let mut seen = HashMap::new();
    let mut m = Message::zero();
    let mut buf = vec![0u8; 64];
    loop {
        let i = p.receive_with_segment(&mut m, &mut buf).unwrap();
        if m.code() == STOP {
            p.reply(&m, i.from).unwrap();
            return seen;
        }
        *seen.entry(m.word(2)).or_insert(0) += 1;
        m.set_word(1, m.word(1) + 1);
        p.reply(&m, i.from).unwrap();
    }
}

/// Sends until the host has granted the direct path (its first Sends go
/// through the host, which finds where the remote host is).
fn until_direct(m: &Machine, c: &Process, to: Pid) {
    wait_for(Duration::from_secs(5), "the direct path", || {
        let before = engine_sends(m);
        let mut msg = Message::with_code(1);
        msg.set_word(2, u32::MAX);
        c.send(&mut msg, to).unwrap();
        let direct = engine_sends(m) == before && m.srv().direct_grants() > 0;
        std::thread::sleep(Duration::from_millis(5));
        direct.then_some(())
    });
}

fn stop(c: &Process, to: Pid) {
    let mut m = Message::with_code(STOP);
    c.send(&mut m, to).unwrap();
}

#[test]
fn remote_sends_leave_from_the_programs_own_socket() {
    let m = machine("own");
    let remote = remote_of(&m, FaultConfig::default());
    let (spid, server) = serve(&remote, counting_server);
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    until_direct(&m, &c, spid);
    let host_sends = engine_sends(&m);
    for n in 0..2_000u32 {
        let mut msg = Message::with_code(1);
        msg.set_word(1, n);
        msg.set_word(2, n);
        let r = c.send(&mut msg, spid).unwrap();
        assert_eq!((r.from, msg.word(1)), (spid, n + 1));
    }
    // Not one of them went out through the machine host's engine.
    assert_eq!(engine_sends(&m), host_sends);
    stop(&c, spid);
    let seen = server.join().unwrap();
    assert!((0..2_000).all(|n| seen.get(&n) == Some(&1)));
    // The remote host still knows the machine host at its main socket.
    let mut back = Message::with_code(1);
    let hp = m.host.create_process().unwrap();
    let hpid = hp.pid();
    let t = std::thread::spawn(move || {
        let mut msg = Message::zero();
        let i = hp.receive(&mut msg).unwrap();
        hp.reply(&msg, i.from).unwrap();
    });
    remote
        .create_process()
        .unwrap()
        .send(&mut back, hpid)
        .unwrap();
    t.join().unwrap();
}

#[test]
fn exactly_once_under_loss_duplication_and_reordering() {
    let m = machine("lossy");
    let faults = FaultConfig {
        loss: 0.15,
        duplicate: 0.1,
        reorder: 0.1,
        seed: 7,
        ..FaultConfig::default()
    };
    let remote = remote_of(&m, faults);
    let (spid, server) = serve(&remote, counting_server);
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    until_direct(&m, &c, spid);
    let grants = m.srv().direct_grants();
    for n in 0..400u32 {
        let mut msg = Message::with_code(1);
        msg.set_word(1, n);
        msg.set_word(2, n);
        // Every seventh goes through the host (it carries a segment): the
        // two paths' sequence numbers must stay in one order.
        let r = if n % 7 == 3 {
            let seg = [1u8; 8];
            c.send_with_segment(&mut msg, spid, Segment::Read(&seg))
        } else {
            c.send(&mut msg, spid)
        };
        let r = r.unwrap_or_else(|e| panic!("request {n}: {e}"));
        assert_eq!((r.from, msg.word(1)), (spid, n + 1), "request {n}");
    }
    stop(&c, spid);
    let seen = server.join().unwrap();
    for n in 0..400u32 {
        assert_eq!(seen.get(&n), Some(&1), "request {n} executed once");
    }
    // The direct path was asked again after each Send through the host,
    // and the faults did happen.
    assert!(m.srv().direct_grants() > grants);
    let net = remote.net_counters();
    assert!(net.injected_loss.load(Ordering::Relaxed) > 0);
    assert!(
        remote.stats().duplicates > 0,
        "retransmissions were answered"
    );
}

#[test]
fn a_forward_reaches_hosts_and_processes_the_direct_path_cannot() {
    let m = machine("fwd");
    let remote = remote_of(&m, FaultConfig::default());
    let third = remote_of(&m, FaultConfig::default());
    third.add_peer(remote.local_addr());
    remote.add_peer(third.local_addr());
    let served = std::sync::Arc::new(AtomicU64::new(0));
    let echo = |k: &Kernel, tag: u32, served: std::sync::Arc<AtomicU64>| {
        serve(k, move |p| {
            let mut msg = Message::zero();
            loop {
                let i = p.receive(&mut msg).unwrap();
                if msg.code() == STOP {
                    p.reply(&msg, i.from).unwrap();
                    return;
                }
                served.fetch_add(1, Ordering::Relaxed);
                msg.set_word(3, tag);
                p.reply(&msg, i.from).unwrap();
            }
        })
    };
    let (on_third, t3) = echo(&third, 3, served.clone());
    let (on_machine, tm) = echo(&m.host, 1, served.clone());
    // On the remote host: forwards odd requests to the machine host's
    // process, even ones to the third host.
    let (fwd, tf) = serve(&remote, move |p| {
        let mut msg = Message::zero();
        loop {
            let i = p.receive(&mut msg).unwrap();
            if msg.code() == STOP {
                p.reply(&msg, i.from).unwrap();
                return;
            }
            let to = if msg.word(1) % 2 == 1 {
                on_machine
            } else {
                on_third
            };
            msg.set_word(2, 99);
            p.forward(&msg, i.from, to).unwrap();
        }
    });
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    // The third host's location, for the direct path to follow a forward.
    let mut w = Message::with_code(5);
    w.set_word(1, 0);
    c.send(&mut w, on_third).unwrap();
    until_direct(&m, &c, on_third);
    until_direct(&m, &c, fwd);
    let host_sends = engine_sends(&m);
    for n in 0..50u32 {
        let mut msg = Message::with_code(5);
        msg.set_word(1, n);
        let r = c.send(&mut msg, fwd).unwrap();
        let (want_from, tag) = if n % 2 == 1 {
            (on_machine, 1)
        } else {
            (on_third, 3)
        };
        assert_eq!(
            (r.from, msg.word(2), msg.word(3)),
            (want_from, 99, tag),
            "request {n}"
        );
    }
    // Forwards to the third host were followed on the direct path (those
    // to the machine host's own process went through the host, which
    // delivers them locally): no RemoteSend left the machine host.
    assert_eq!(engine_sends(&m), host_sends);
    for to in [fwd, on_third, on_machine] {
        stop(&c, to);
    }
    for t in [t3, tm, tf] {
        t.join().unwrap();
    }
    assert!(served.load(Ordering::Relaxed) >= 50);
}

#[test]
fn errors_on_the_direct_path_are_clear() {
    let mut m = machine("err");
    let remote = remote_of(&m, FaultConfig::default());
    let (spid, server) = serve(&remote, counting_server);
    // Takes one request and never answers it.
    let (mute, _keep) = serve(&remote, |p| {
        let mut msg = Message::zero();
        let _held = p.receive(&mut msg);
        std::thread::sleep(Duration::from_secs(4));
    });
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    until_direct(&m, &c, spid);
    let ghost = Pid::new(spid.host(), spid.local().wrapping_add(1000));
    let mut msg = Message::with_code(1);
    assert!(matches!(
        c.send(&mut msg, ghost),
        Err(IpcError::NoSuchProcess(p)) if p == ghost
    ));
    let t0 = Instant::now();
    let r = c.send_within(&mut msg, mute, Some(Duration::from_millis(100)));
    assert!(
        matches!(r, Err(IpcError::Deadline(p)) if p == mute),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(1));
    stop(&c, spid);
    server.join().unwrap();
    // The machine host goes while a Send waits on the direct path: the
    // program hears of it promptly.
    let (mute2, _keep2) = serve(&remote, |p| {
        let mut msg = Message::zero();
        let _held = p.receive(&mut msg);
        std::thread::sleep(Duration::from_secs(4));
    });
    let t = std::thread::spawn(move || {
        let mut msg = Message::with_code(1);
        let t0 = Instant::now();
        (c.send(&mut msg, mute2), t0)
    });
    std::thread::sleep(Duration::from_millis(100));
    let gone = Instant::now();
    m.srv.take();
    let (r, _) = t.join().unwrap();
    assert!(
        matches!(r, Err(IpcError::HostLost | IpcError::Shutdown)),
        "{r:?}"
    );
    assert!(
        gone.elapsed() < Duration::from_secs(2),
        "{:?}",
        gone.elapsed()
    );
}

#[test]
fn a_host_that_injects_faults_applies_them_to_its_programs_sockets() {
    // ISSUE 49 item 3: a fault injector on the machine host switched its
    // programs' direct path off (their sockets would bypass it). The host
    // now hands its programs its fault spec, and their sockets pass the
    // same injector code (`FaultState::inject`), each with its own stream.
    let dir = std::env::temp_dir().join(format!("vk-direct-{}-faulty", std::process::id()));
    let path = dir.join("host.sock");
    let host = Kernel::start(KernelConfig {
        faults: FaultConfig {
            loss: 0.1,
            duplicate: 0.1,
            reorder: 0.05,
            delay_rate: 0.05,
            delay: Duration::from_millis(2),
            seed: 3,
        },
        host_timeout: Duration::from_secs(5),
        ..KernelConfig::default()
    })
    .unwrap();
    let srv = Some(host.serve_attach(&path, 0o600).unwrap());
    let m = Machine { host, srv, path };
    let remote = remote_of(&m, FaultConfig::default());
    let (spid, server) = serve(&remote, counting_server);
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    until_direct(&m, &c, spid);
    for n in 0..200u32 {
        let mut msg = Message::with_code(1);
        msg.set_word(1, n);
        msg.set_word(2, n);
        c.send(&mut msg, spid).unwrap();
        assert_eq!(msg.word(1), n + 1);
    }
    stop(&c, spid);
    let seen = server.join().unwrap();
    assert!(
        seen.iter().all(|(&id, &n)| n == 1 || id == u32::MAX),
        "each exactly once"
    );
    assert!(m.srv().direct_grants() > 0, "the direct path was granted");
    let nc = a.net_counters();
    let (lost, dup) = (
        nc.injected_loss.load(Ordering::Relaxed),
        nc.injected_dup.load(Ordering::Relaxed),
    );
    eprintln!("the program's socket: {lost} datagrams lost, {dup} duplicated by the host's faults");
    assert!(
        lost > 0 && dup > 0,
        "the faults applied to the program's socket"
    );
}

#[test]
fn destroying_a_process_blocked_on_the_direct_path_ends_its_send_at_once() {
    let m = machine("destroy");
    let remote = remote_of(&m, FaultConfig::default());
    let (spid, server) = serve(&remote, counting_server);
    const HOLD: u32 = 7;
    // Answers nothing with code HOLD, until STOP.
    let (mute, muted) = serve(&remote, |p| {
        let mut msg = Message::zero();
        while let Ok(i) = p.receive(&mut msg) {
            if msg.code() == STOP {
                let _ = p.reply(&msg, i.from);
                return;
            }
        }
    });
    let a = Kernel::attach(&m.path).unwrap();
    let killer = m.host.create_process().unwrap();
    let mut took = Vec::new();
    for _ in 0..5 {
        let c = a.create_process().unwrap();
        until_direct(&m, &c, spid);
        let host_sends = engine_sends(&m);
        let cpid = c.pid();
        let t = std::thread::spawn(move || {
            let mut msg = Message::with_code(HOLD);
            // (A deadline, so that a Send nothing wakes fails the test
            // rather than hangs it.)
            let r = c.send_within(&mut msg, mute, Some(Duration::from_secs(2)));
            // Destroyed, the process sends nothing more directly.
            let again = c.send_within(&mut msg, mute, Some(Duration::from_secs(2)));
            (r, again, Instant::now())
        });
        // Long past any spinning: the Send waits blocked.
        std::thread::sleep(Duration::from_millis(150));
        let at = Instant::now();
        killer.destroy(cpid).unwrap();
        let (r, again, end) = t.join().unwrap();
        assert_eq!(r, Err(IpcError::Destroyed));
        assert!(again.is_err(), "{again:?}");
        // Both went directly, or nowhere: not through the host.
        assert_eq!(engine_sends(&m), host_sends);
        took.push(end.saturating_duration_since(at));
    }
    took.sort();
    // Unwoken, it would wait for the server (seconds here: for ever).
    assert!(
        took[2] < Duration::from_millis(10),
        "Sends ended {took:?} after their processes were destroyed"
    );
    stop(&killer, spid);
    server.join().unwrap();
    stop(&killer, mute);
    muted.join().unwrap();
}

/// Takes every request and answers none until its host stops (but code
/// 0, answered, so that a client's host learns where it is).
fn mute_server(p: Process) {
    let mut m = Message::zero();
    while let Ok(i) = p.receive(&mut m) {
        if m.code() == 0 {
            let _ = p.reply(&m, i.from);
        }
    }
}

#[test]
fn a_short_deadline_on_the_direct_path_ends_on_time() {
    // ISSUE 49, divergence 6: the attached direct path waited in socket
    // timeouts rounded to powers of two milliseconds, which this kernel
    // ends on its 4 ms tick, so a 3 ms deadline took 8 ms or more. It now
    // waits as an embedded direct Send does (to the microsecond).
    let m = machine("deadline");
    let remote = remote_of(&m, FaultConfig::default());
    let (spid, server) = serve(&remote, mute_server);
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    c.set_spin(Duration::ZERO);
    wait_for(Duration::from_secs(5), "the direct path", || {
        let before = engine_sends(&m);
        c.send(&mut Message::with_code(0), spid).unwrap();
        (engine_sends(&m) == before && m.srv().direct_grants() > 0).then_some(())
    });
    let host_sends = engine_sends(&m);
    let deadline = Duration::from_millis(3);
    let mut took: Vec<Duration> = (0..9)
        .map(|_| {
            let mut msg = Message::with_code(1);
            let t = Instant::now();
            let r = c.send_within(&mut msg, spid, Some(deadline));
            assert_eq!(r.unwrap_err(), IpcError::Deadline(spid));
            t.elapsed()
        })
        .collect();
    took.sort();
    eprintln!("attached direct, 3 ms deadline: {took:?}");
    assert_eq!(
        engine_sends(&m),
        host_sends,
        "the Sends went on the direct path"
    );
    assert!(
        took[4] < deadline + Duration::from_millis(2),
        "a 3 ms deadline took {:?} (median)",
        took[4]
    );
    drop(remote);
    server.join().unwrap();
}

#[test]
fn a_send_that_falls_back_to_the_host_keeps_only_the_time_left() {
    // ISSUE 49, divergence 7: a Send forwarded back to the program's own
    // host leaves the direct path for the host's slot; the slot's Send got
    // the caller's whole deadline again.
    let m = machine("left");
    let remote = remote_of(&m, FaultConfig::default());
    // On the machine host: takes requests and answers none.
    let (mute, hm) = serve(&m.host, mute_server);
    // On the remote host: answers code 0; holds others 150 ms, then
    // forwards them to `mute`, back on the program's host.
    let (fwd, hf) = serve(&remote, move |p| {
        let mut msg = Message::zero();
        while let Ok(i) = p.receive(&mut msg) {
            if msg.code() == 0 {
                let _ = p.reply(&msg, i.from);
                continue;
            }
            std::thread::sleep(Duration::from_millis(150));
            let _ = p.forward(&msg, i.from, mute);
        }
    });
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    wait_for(Duration::from_secs(5), "the direct path", || {
        let before = engine_sends(&m);
        c.send(&mut Message::with_code(0), fwd).unwrap();
        (engine_sends(&m) == before && m.srv().direct_grants() > 0).then_some(())
    });
    let deadline = Duration::from_millis(300);
    for _ in 0..2 {
        let mut msg = Message::with_code(1);
        let t = Instant::now();
        let r = c.send_within(&mut msg, fwd, Some(deadline));
        let took = t.elapsed();
        eprintln!("forwarded home, 300 ms deadline: {r:?} after {took:?}");
        assert_eq!(r.unwrap_err(), IpcError::Deadline(mute));
        assert!(
            took < deadline + Duration::from_millis(100),
            "a 300 ms deadline took {took:?}: the host's part had the whole deadline again"
        );
    }
    drop(c);
    drop(a);
    drop(remote);
    hf.join().unwrap();
    drop(m);
    hm.join().unwrap();
}

#[test]
fn exchanges_outside_the_host_reach_its_counters() {
    // ISSUE 49 item 3: direct Sends and peer-page exchanges of attached
    // programs were missing from the machine host's counters (and so
    // from `vkernel stats`, /metrics and the traffic characterization).
    let m = machine("counted");
    let remote = remote_of(&m, FaultConfig::default());
    let (spid, server) = serve(&remote, counting_server);
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    until_direct(&m, &c, spid);
    // A server in a second program of this uid: exchanges by peer page.
    let b = Kernel::attach(&m.path).unwrap();
    let (epid, echo) = {
        let p = b.create_process().unwrap();
        let pid = p.pid();
        // (A plain Receive: a peer-page sender finds it in its inbox.)
        let echo = move || {
            let mut m = Message::zero();
            while let Ok(i) = p.receive(&mut m) {
                let stop = m.code() == STOP;
                m.set_word(1, m.word(1) + 1);
                let _ = p.reply(&m, i.from);
                if stop {
                    break;
                }
            }
        };
        (pid, std::thread::spawn(echo))
    };
    let before = m.host.stats();
    let (peer_before, sends_before) = (m.srv().peer_exchanges(), engine_sends(&m));
    const N: u32 = 500;
    for n in 0..N {
        for to in [spid, epid] {
            let mut msg = Message::with_code(1);
            msg.set_word(1, n);
            msg.set_word(2, n);
            c.send(&mut msg, to).unwrap();
            assert_eq!(msg.word(1), n + 1);
        }
    }
    let by_page = m.srv().peer_exchanges() - peer_before;
    assert!(by_page >= u64::from(N) / 2, "by peer page: {by_page}");
    assert_eq!(
        engine_sends(&m),
        sends_before,
        "not through the host's engine"
    );
    // Asking for the host's statistics reports what the program counted.
    let doc = c.host_stats(m.host.host_id()).unwrap();
    let after = m.host.stats();
    let remote_n = after.remote_exchanges - before.remote_exchanges;
    let local_n = after.local_exchanges - before.local_exchanges;
    eprintln!("host counted {remote_n} remote and {local_n} local exchanges of {N} each");
    assert!(
        remote_n >= u64::from(N),
        "direct Sends in the host's counters: {remote_n}"
    );
    assert!(
        local_n >= by_page,
        "peer-page exchanges in the host's counters: {local_n}"
    );
    assert!(
        after.tx[2] - before.tx[2] >= u64::from(N),
        "their RemoteSends counted as sent"
    );
    assert!(doc.contains("remote_exchanges"), "{doc}");
    stop(&c, spid);
    stop(&c, epid);
    server.join().unwrap();
    echo.join().unwrap();
}

#[test]
fn a_keyed_host_lends_its_keys_to_its_own_programs_direct_path() {
    // ISSUE 49 item 3: a cluster key switched the attached direct path
    // off. The host lends a program of its own uid its keys and the page
    // of its one packet counter (ASK KEYS), so the program's datagrams are
    // sealed in the host's counter order and its remote Sends stay direct.
    let key = vkernel::auth::Key {
        id: 3,
        secret: [0x5a; 32],
    };
    for encrypt in [false, true] {
        let keyed = |peers| KernelConfig {
            keys: vec![key.clone()],
            encrypt,
            peers,
            host_timeout: Duration::from_secs(5),
            ..KernelConfig::default()
        };
        let dir =
            std::env::temp_dir().join(format!("vk-direct-{}-keyed-{encrypt}", std::process::id()));
        let path = dir.join("host.sock");
        let host = Kernel::start(keyed(vec![])).unwrap();
        let srv = Some(host.serve_attach(&path, 0o600).unwrap());
        let m = Machine { host, srv, path };
        let remote = Kernel::start(keyed(vec![m.host.local_addr()])).unwrap();
        m.host.add_peer(remote.local_addr());
        let (spid, server) = serve(&remote, counting_server);
        let a = Kernel::attach(&m.path).unwrap();
        let c = a.create_process().unwrap();
        until_direct(&m, &c, spid);
        let host_sends = engine_sends(&m);
        for n in 0..300u32 {
            let mut msg = Message::with_code(1);
            msg.set_word(1, n);
            msg.set_word(2, n);
            c.send(&mut msg, spid).unwrap();
            assert_eq!(msg.word(1), n + 1);
            // The host's own Sends for the process between direct ones:
            // the receiver's replay window sees one counter order.
            if n % 60 == 0 {
                let mut seg = [7u8; 16];
                let mut msg = Message::with_code(1);
                msg.set_word(2, 100_000 + n);
                c.send_with_segment(&mut msg, spid, Segment::ReadWrite(&mut seg))
                    .unwrap();
            }
        }
        assert!(
            engine_sends(&m) - host_sends <= 10,
            "the plain Sends went direct ({} through the host)",
            engine_sends(&m) - host_sends
        );
        stop(&c, spid);
        let seen = server.join().unwrap();
        // (u32::MAX: `until_direct`'s warm-up requests.)
        assert!(seen.iter().all(|(&id, &n)| n == 1 || id == u32::MAX));
        assert_eq!(seen.len(), 300 + 5 + 1, "every request ran");
        let rejects = |k: &Kernel| k.stats().auth_rejects.iter().sum::<u64>();
        assert_eq!(
            (rejects(&remote), rejects(&m.host)),
            (0, 0),
            "encrypt={encrypt}: every datagram authentic and in order"
        );
    }
}

#[test]
fn a_tracing_host_records_its_programs_exchanges_outside_it() {
    // ISSUE 49 item 3: a tracer switched the attached direct path off, and
    // peer-page exchanges were never in the host's trace. The program now
    // traces both and sends the lines to its host (TRACE records), which
    // writes those of its own host id into its --trace file.
    let dir = std::env::temp_dir().join(format!("vk-direct-{}-traced", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (path, file) = (dir.join("host.sock"), dir.join("host.jsonl"));
    let host = Kernel::start(KernelConfig {
        trace: Some(file.clone()),
        ..KernelConfig::default()
    })
    .unwrap();
    let srv = Some(host.serve_attach(&path, 0o600).unwrap());
    let m = Machine { host, srv, path };
    let remote = remote_of(&m, FaultConfig::default());
    let (spid, server) = serve(&remote, counting_server);
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    until_direct(&m, &c, spid);
    let b = Kernel::attach(&m.path).unwrap();
    let p = b.create_process().unwrap();
    let epid = p.pid();
    let echo = std::thread::spawn(move || echo_after(p, |_| Duration::ZERO));
    for n in 0..50u32 {
        for to in [spid, epid] {
            let mut msg = Message::with_code(1);
            msg.set_word(2, n);
            c.send(&mut msg, to).unwrap();
        }
    }
    assert!(m.srv().direct_grants() > 0, "direct on a tracing host");
    let by_page = m.srv().peer_exchanges();
    stop(&c, spid);
    stop(&c, epid);
    server.join().unwrap();
    echo.join().unwrap();
    // The programs' last lines go with their processes' ends; a question
    // to the host returns once it has taken them.
    drop(c);
    let _ = a.create_process().unwrap();
    let _ = b.create_process().unwrap();
    drop((a, b));
    let me = m.host.host_id().0;
    drop(m);
    let text = std::fs::read_to_string(&file).unwrap();
    let events: Vec<_> = text
        .lines()
        .map(|l| vkernel::trace::Event::parse(l).unwrap())
        .collect();
    assert!(events.iter().all(|e| e.host == me));
    use vkernel::trace::Kind;
    let count = |f: &dyn Fn(&Kind) -> bool| events.iter().filter(|e| f(&e.kind)).count();
    let to_remote = count(&|k| matches!(k, Kind::Send(x) if x.dst == spid.0));
    let to_page = count(&|k| matches!(k, Kind::Send(x) if x.dst == epid.0));
    let delivered = count(&|k| matches!(k, Kind::Deliver(x) if x.dst == epid.0));
    let tx = count(&|k| matches!(k, Kind::Tx(d) if d.dst == spid.0));
    let rx = count(&|k| matches!(k, Kind::Rx(d) if d.src == spid.0));
    eprintln!(
        "traced: {to_remote} Sends to the remote server ({tx} tx, {rx} rx), \
         {to_page} by peer page ({delivered} delivered)"
    );
    assert!(
        to_remote >= 50 && tx >= 50 && rx >= 50,
        "direct Sends traced"
    );
    assert!(by_page > 0, "some Sends went by peer page");
    assert!(
        to_page as u64 >= by_page && delivered as u64 >= by_page,
        "every peer-page exchange traced ({by_page} by peer page)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_program_returns_what_it_learned_of_a_peer_with_its_next_block() {
    // ISSUE 49 item 1: one timing store per logical host. The host lends
    // its timing of the destination with each block of sequence numbers,
    // and the program hands back what its direct Sends learned with its
    // next question, so the host's engine knows round trips it never ran.
    let m = machine("lend");
    let remote = remote_of(&m, FaultConfig::default());
    // Answers at once while warming up, then after 2 ms (word 3 = 1).
    let (spid, server) = serve(&remote, |p| {
        echo_after(p, |m| {
            Duration::from_millis(if m.word(3) == 1 { 2 } else { 0 })
        })
    });
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    until_direct(&m, &c, spid);
    let rh = remote.host_id();
    let before = m.host.srtt(rh);
    let engine = engine_sends(&m);
    // Past one block (1024): the next question carries the program's
    // timing back.
    for n in 0..1100u32 {
        let mut msg = Message::with_code(1);
        msg.set_word(2, n);
        msg.set_word(3, 1);
        c.send(&mut msg, spid).unwrap();
    }
    let through = engine_sends(&m) - engine;
    let after = m.host.srtt(rh);
    eprintln!("host's srtt of the peer: {before:?} before, {after:?} after; {through} Sends through its engine");
    assert!(
        through < 20,
        "the Sends went direct ({through} through the host)"
    );
    assert!(
        after.is_some_and(|a| a >= Duration::from_micros(1_800)),
        "the host's store has the program's 2 ms round trips: {after:?}"
    );
    stop(&c, spid);
    server.join().unwrap();
}

#[test]
fn a_due_copy_behind_a_busy_server_waits_on_the_attached_path_too() {
    // ISSUE 49, divergence 4: an attached program's direct Sends ran a
    // plain timer with a store per process, so a first copy fell due and
    // went out while the server was busy with the program's other Sends
    // (the embedded and engine paths wait: ARCHITECTURE.md, "When not to
    // retransmit"). They run the engine's rules now, with one store per
    // program.
    let m = machine("busy");
    let remote = remote_of(&m, FaultConfig::default());
    // One request at a time, 15 ms each (code 0, the warm-up: at once).
    let (spid, server) = serve(&remote, |p| {
        echo_after(p, |m| {
            Duration::from_millis(if m.code() == 1 { 15 } else { 0 })
        })
    });
    let a = Kernel::attach(&m.path).unwrap();
    let clients: Vec<Process> = (0..3).map(|_| a.create_process().unwrap()).collect();
    for c in &clients {
        wait_for(Duration::from_secs(5), "the direct path", || {
            let before = engine_sends(&m);
            c.send(&mut Message::with_code(0), spid).unwrap();
            (engine_sends(&m) == before).then_some(())
        });
    }
    let dups = remote.stats().duplicates;
    let threads: Vec<_> = clients
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                for _ in 0..8 {
                    c.send(&mut Message::with_code(1), spid).unwrap();
                }
                // (Its counts reach the host as it ends.)
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A question returns once the host has taken the program's reports.
    let _ = a.create_process().unwrap();
    let r = m.srv().reported();
    let copies_seen = remote.stats().duplicates - dups;
    eprintln!(
        "attached direct Sends behind a busy server: {} deferred, {} sent again, \
         {copies_seen} copies reached the server",
        r.retransmits_deferred, r.retransmits
    );
    assert!(r.retransmits_deferred > 0, "due first copies waited");
    assert_eq!(copies_seen, 0, "no needless copy reached the busy server");
    let c = a.create_process().unwrap();
    stop(&c, spid);
    server.join().unwrap();
}

#[test]
fn a_program_that_closes_its_kernel_first_still_reports() {
    // Found by the conformance suite's Python row: a program whose kernel
    // closed before its process lost what the process had counted outside
    // the host (it reports as it ends, over the kernel's connection, which
    // closing shut down). Now the kernel detaches (DETACH) and the host
    // takes reports until the connection closes.
    let m = machine("detach");
    let remote = remote_of(&m, FaultConfig::default());
    let (spid, server) = serve(&remote, counting_server);
    let before = m.host.stats().remote_exchanges;
    let a = Kernel::attach(&m.path).unwrap();
    let c = a.create_process().unwrap();
    until_direct(&m, &c, spid);
    const N: u32 = 50;
    for n in 0..N {
        let mut msg = Message::with_code(1);
        msg.set_word(1, n);
        msg.set_word(2, n);
        c.send(&mut msg, spid).unwrap();
    }
    let cpid = c.pid();
    drop(a);
    // Its processes went with it...
    wait_for(Duration::from_secs(5), "the process's end", || {
        (!m.host.process_exists(cpid)).then_some(())
    });
    // ...and what the one still held counted arrives as it ends.
    drop(c);
    wait_for(Duration::from_secs(5), "the process's report", || {
        let n = m.host.stats().remote_exchanges - before;
        (n >= u64::from(N)).then_some(())
    });
    stop(&remote.create_process().unwrap(), spid);
    server.join().unwrap();
    wait_for(
        Duration::from_secs(5),
        "the program's connection to close",
        || (m.srv().attached() == 0).then_some(()),
    );
}
