//! Send deadlines on real hosts: a server that receives and never replies
//! costs its client `IpcError::Deadline`, not a hang (issue 19 item 1).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use vkernel::{IpcError, Kernel, KernelConfig, Message, Pid, Segment};

mod common;

/// A process on `k` that receives one request and never replies; it
/// stays blocked until `release` is dropped.
fn silent_server(k: &Kernel) -> (Pid, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let p = k.create_process().expect("server process");
    let pid = p.pid();
    let (tx, rx) = mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        let mut m = Message::zero();
        let _ = p.receive(&mut m);
        let _ = rx.recv();
    });
    (pid, tx, h)
}

#[test]
fn remote_send_to_a_server_that_never_replies_ends_at_its_deadline() {
    let (a, b) = common::two_hosts();
    let (s, release, h) = silent_server(&a);
    let c = b.create_process().unwrap();
    let mut seg = vec![0u8; 100_000];
    let t = Instant::now();
    let r = c.send_with_segment_within(
        &mut Message::with_code(1),
        s,
        Segment::ReadWrite(&mut seg),
        usize::MAX,
        Some(Duration::from_millis(500)),
    );
    eprintln!("remote: {r:?} after {:?}", t.elapsed());
    assert_eq!(r.unwrap_err(), IpcError::Deadline(s));
    // The process is usable again at once: a Send to a live echo works.
    let e = a.create_process().unwrap();
    let epid = e.pid();
    let eh = std::thread::spawn(move || {
        let mut m = Message::zero();
        let i = e.receive(&mut m).unwrap();
        e.reply(&m, i.from).unwrap();
    });
    let mut m = Message::with_code(7);
    c.send_within(&mut m, epid, Some(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(m.code(), 7);
    eh.join().unwrap();
    drop(release);
    h.join().unwrap();
}

#[test]
fn host_default_deadline_bounds_a_local_send() {
    let k = Kernel::start(KernelConfig {
        send_deadline: Some(Duration::from_millis(300)),
        ..Default::default()
    })
    .unwrap();
    let (s, release, h) = silent_server(&k);
    let c = k.create_process().unwrap();
    assert_eq!(c.send_deadline(), Some(Duration::from_millis(300)));
    let t = Instant::now();
    let r = c.send(&mut Message::with_code(1), s);
    eprintln!("local: {r:?} after {:?}", t.elapsed());
    assert_eq!(r.unwrap_err(), IpcError::Deadline(s));
    assert_eq!(k.stats().deadlines, 1);
    drop(release);
    h.join().unwrap();
}

/// A short deadline ends the Send on time, not at the next tick of a
/// socket's timeout or of another thread's timer. Before, a 3 ms
/// deadline to a remote server took 25–50 ms through the engine (the
/// thread waited in its answer socket for its retransmission timer
/// only), about 8 ms directly (the socket's timeout ends on the kernel's
/// 4 ms tick, up to two ticks late) and 6–8 ms with a segment. Blocking
/// waits (no spinning), as a spinning wait looks at the clock anyway.
#[test]
fn a_short_deadline_ends_a_remote_send_on_time() {
    let block = |peers: Vec<std::net::SocketAddr>, direct_sends| {
        Kernel::start(KernelConfig {
            peers,
            spin: Duration::ZERO,
            adaptive_spin: false,
            direct_sends,
            ..Default::default()
        })
        .unwrap()
    };
    let a = block(vec![], true);
    let s = a.create_process().unwrap();
    let spid = s.pid();
    // Answers code 0 (so a client's host learns where `a` is, which a
    // direct Send needs), takes every other request and answers none,
    // until its host stops.
    let h = std::thread::spawn(move || {
        let mut m = Message::zero();
        while let Ok(i) = s.receive(&mut m) {
            if m.code() == 0 {
                let _ = s.reply(&m, i.from);
            }
        }
    });
    let deadline = Duration::from_millis(3);
    for (what, direct_sends, with_segment) in [
        ("direct", true, false),
        ("segment", true, true),
        ("engine", false, false),
    ] {
        let b = block(vec![a.local_addr()], direct_sends);
        a.add_peer(b.local_addr());
        let c = b.create_process().unwrap();
        c.send(&mut Message::with_code(0), spid).unwrap();
        let mut took: Vec<Duration> = (0..9)
            .map(|_| {
                let mut seg = [0u8; 64];
                let mut m = Message::with_code(1);
                let t = Instant::now();
                let r = if with_segment {
                    let seg = Segment::ReadWrite(&mut seg);
                    c.send_with_segment_within(&mut m, spid, seg, usize::MAX, Some(deadline))
                } else {
                    c.send_within(&mut m, spid, Some(deadline))
                };
                assert_eq!(r.unwrap_err(), IpcError::Deadline(spid));
                t.elapsed()
            })
            .collect();
        let direct = b
            .net_counters()
            .direct_sends
            .load(std::sync::atomic::Ordering::Relaxed);
        took.sort();
        eprintln!("{what}: {direct} direct Sends, {took:?}");
        assert_eq!(
            direct > 0,
            what == "direct",
            "{what}: {direct} direct Sends"
        );
        // (The median, so one wait that a busy machine delays does not
        // decide it.)
        assert!(
            took[4] < deadline + Duration::from_millis(2),
            "{what}: a 3 ms deadline took {:?} (median)",
            took[4]
        );
    }
    drop(a);
    h.join().unwrap();
}
