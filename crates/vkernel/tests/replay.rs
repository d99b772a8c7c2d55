//! Replay across a restart (issue 19 item 2): datagrams captured on the
//! wire before a keyed host restarts are refused after it, although the
//! restarted host remembers nothing of what it saw.
//!
//! Real UDP on loopback: host A reaches host B only through a relay in
//! this test, which forwards both ways and records every datagram A sends.
//! After B restarts (same host id, key, port and seed, so its processes get
//! the same pids), the relay sends B every recorded datagram again.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use vkernel::{HostId, Kernel, KernelConfig, Message};
use vkernel_proto::auth::{Key, Reject};

const KEY: Key = Key {
    id: 1,
    secret: [0x5a; 32],
};

fn host(bind: SocketAddr, id: u16, peers: Vec<SocketAddr>) -> Kernel {
    Kernel::start(KernelConfig {
        bind,
        peers,
        host_id: Some(id),
        keys: vec![KEY],
        // Same seed: the restarted host gives its processes the same pids.
        seed: Some(0x5eed + u64::from(id)),
        // Answers go to the datagram's source (the relay), not to a port
        // the datagram names, so every exchange crosses the relay.
        side_sockets: false,
        max_clock_skew: Duration::from_millis(100),
        ..Default::default()
    })
    .expect("start host")
}

/// A process on `k` that counts and answers every message it receives.
fn counter(k: &Kernel) -> (vkernel::Pid, Arc<AtomicU64>) {
    let p = k.create_process().expect("counter process");
    let pid = p.pid();
    let n = Arc::new(AtomicU64::new(0));
    let seen = n.clone();
    thread::spawn(move || {
        let mut m = Message::zero();
        while let Ok(from) = p.receive(&mut m) {
            seen.fetch_add(1, Ordering::SeqCst);
            let _ = p.reply(&m, from.from);
        }
    });
    (pid, n)
}

struct Relay {
    addr: SocketAddr,
    sock: Arc<UdpSocket>,
    captured: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Relay {
    /// Forwards datagrams from `a` to `b` (recording them) and from `b`
    /// to `a`; `a` is learned from the first datagram not from `b`.
    fn start(b: SocketAddr) -> Relay {
        let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").expect("relay socket"));
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("timeout");
        let addr = sock.local_addr().expect("relay addr");
        let captured = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, c, st) = (sock.clone(), captured.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let mut a: Option<SocketAddr> = None;
            let mut buf = vec![0u8; 70_000];
            let end = Instant::now() + Duration::from_secs(60);
            while !st.load(Ordering::SeqCst) && Instant::now() < end {
                let Ok((n, from)) = s.recv_from(&mut buf) else {
                    continue;
                };
                if from == b {
                    if let Some(a) = a {
                        let _ = s.send_to(&buf[..n], a);
                    }
                } else {
                    a = Some(from);
                    c.lock().unwrap().push(buf[..n].to_vec());
                    let _ = s.send_to(&buf[..n], b);
                }
            }
        });
        Relay {
            addr,
            sock,
            captured,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn datagrams_captured_before_a_restart_are_refused_after_it() {
    // B on a fixed loopback port (found free first), A behind the relay.
    let b_addr = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port");
    let b = host(b_addr, 77, vec![]);
    let relay = Relay::start(b_addr);
    let a = host("127.0.0.1:0".parse().unwrap(), 78, vec![relay.addr]);
    let (pid, count) = counter(&b);
    let client = a.create_process().expect("client");
    for i in 0..5u32 {
        let mut m = Message::with_code(1);
        m.0[1] = i;
        client
            .send(&mut m, pid)
            .expect("exchange through the relay");
    }
    // A request to B's kernel server too (it would run again on replay).
    client.host_stats(HostId(77)).expect("STATS of B");
    assert_eq!(count.load(Ordering::SeqCst), 5);
    let captured = relay.captured.lock().unwrap().clone();
    assert!(captured.len() >= 6, "{} datagrams", captured.len());

    // B restarts: same id, key, port and seed, an empty memory.
    drop(b);
    thread::sleep(Duration::from_millis(300));
    let b2 = host(b_addr, 77, vec![]);
    let (pid2, count2) = counter(&b2);
    assert_eq!(pid2, pid, "the restarted counter has the old pid");
    let before = b2.stats();

    // Every captured datagram, replayed to the restarted host.
    for d in &captured {
        relay.sock.send_to(d, b_addr).expect("replay");
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let want = before.auth_rejects_of(Reject::Stale) + captured.len() as u64;
    while b2.stats().auth_rejects_of(Reject::Stale) < want && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    thread::sleep(Duration::from_millis(200));
    let after = b2.stats();
    eprintln!(
        "replayed {}: stale {}, replay {}, counter saw {}",
        captured.len(),
        after.auth_rejects_of(Reject::Stale),
        after.auth_rejects_of(Reject::Replay),
        count2.load(Ordering::SeqCst)
    );
    assert_eq!(
        count2.load(Ordering::SeqCst),
        0,
        "replayed requests ran again on the restarted host"
    );
    assert_eq!(
        after.auth_rejects_of(Reject::Stale) - before.auth_rejects_of(Reject::Stale),
        captured.len() as u64,
        "every replayed datagram is refused as stale"
    );

    // A, which ran all along and sent nothing since, still gets through.
    let mut m = Message::with_code(1);
    client
        .send(&mut m, pid)
        .expect("a fresh exchange after the restart");
    assert_eq!(count2.load(Ordering::SeqCst), 1);
}
