//! A host's only blocked reader, when a datagram is what it expects next,
//! waits in the main socket itself (`recvmmsg`), not in `poll` and then a
//! read: it must be woken at once by local hand-overs too (an empty
//! datagram), and while it waits no other thread may be left without its
//! answer.

use std::sync::atomic::Ordering::Relaxed;
use std::thread;
use std::time::Duration;

use vkernel::{Kernel, KernelConfig, Message, Pid, Process, Segment};

const ECHO: u32 = 1;
const STOP: u32 = 9;

/// A host whose processes never busy-poll: every wait blocks.
fn blocking_host(peers: Vec<std::net::SocketAddr>) -> Kernel {
    Kernel::start(KernelConfig {
        spin: Duration::ZERO,
        adaptive_spin: false,
        peers,
        ..Default::default()
    })
    .expect("start host")
}

/// Two such hosts that know each other.
fn blocking_pair() -> (Kernel, Kernel) {
    let a = blocking_host(vec![]);
    let b = blocking_host(vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    (a, b)
}

/// Echoes (code ECHO, word 1 + 1) until STOP.
fn serve(p: Process) {
    let mut m = Message::zero();
    loop {
        let i = p.receive(&mut m).expect("receive");
        let stop = m.code() == STOP;
        m.0[1] = m.0[1].wrapping_add(1);
        p.reply(&m, i.from).expect("reply");
        if stop {
            return;
        }
    }
}

fn echo(c: &Process, to: Pid, k: u32) {
    let mut m = Message::with_code(ECHO);
    m.0[1] = k;
    c.send(&mut m, to).expect("send");
    assert_eq!(m.0[1], k + 1);
}

fn stop(c: &Process, to: Pid) {
    let mut m = Message::with_code(STOP);
    c.send(&mut m, to).expect("stop");
}

const N: u32 = 300;

#[test]
fn a_lone_server_of_remote_clients_is_woken_by_a_local_send_not_its_timeout() {
    // The server's last request came from another host, so it waits in
    // the socket; the next comes from its own host, by hand-over, which
    // must wake it with an empty datagram.
    let (a, b) = blocking_pair();
    let server = a.create_process().unwrap();
    let to = server.pid();
    let t = thread::spawn(move || serve(server));
    let local = a.create_process().unwrap();
    let remote = b.create_process().unwrap();
    for k in 0..N {
        echo(&remote, to, k);
        echo(&local, to, k);
    }
    stop(&local, to);
    t.join().unwrap();
    let n = a.net_counters();
    let waits = n.lone_waits.load(Relaxed);
    let woken = n.lone_wakes.load(Relaxed);
    let timeouts = n.lone_timeouts.load(Relaxed);
    // Most local Sends found the server waiting in the socket, and woke
    // it (had the wake-up gone to the eventfd, each of those waits would
    // have lasted the socket's timeout).
    assert!(
        woken >= u64::from(N) / 2,
        "woken {woken} of {waits} lone waits"
    );
    assert!(timeouts <= 5, "{timeouts} of {waits} lone waits timed out");
}

#[test]
fn a_lone_server_takes_remote_requests_and_a_neighbour_gets_its_replies() {
    // Host a: an echo server, alone in the socket between requests, and a
    // neighbour process whose Sends carry a segment (so their replies come
    // to a's main socket, not to an answer socket). Host b: the
    // neighbour's server, and a client of a's server.
    let (a, b) = blocking_pair();
    let sa = a.create_process().unwrap();
    let sa_pid = sa.pid();
    let sb = b.create_process().unwrap();
    let sb_pid = sb.pid();
    let ta = thread::spawn(move || serve(sa));
    let tb = thread::spawn(move || {
        let mut m = Message::zero();
        let mut buf = vec![0u8; 4096];
        loop {
            let i = sb.receive_with_segment(&mut m, &mut buf).expect("receive");
            let stop = m.code() == STOP;
            m.0[1] = i.seg_bytes as u32;
            sb.reply(&m, i.from).expect("reply");
            if stop {
                return;
            }
        }
    });
    let neighbour = {
        let p = a.create_process().unwrap();
        thread::spawn(move || {
            let data = vec![7u8; 1000];
            for _ in 0..N {
                let mut m = Message::with_code(ECHO);
                p.send_with_segment(&mut m, sb_pid, Segment::Read(&data))
                    .expect("neighbour send");
                assert_eq!(m.0[1], 1000);
            }
            stop(&p, sb_pid);
        })
    };
    let c = b.create_process().unwrap();
    for k in 0..N {
        echo(&c, sa_pid, k);
    }
    neighbour.join().unwrap();
    stop(&c, sa_pid);
    ta.join().unwrap();
    tb.join().unwrap();
    let n = a.net_counters();
    assert!(
        n.lone_waits.load(Relaxed) > 0,
        "a's server never waited alone"
    );
    // Nothing waited for a timer to be read: no retransmission on a clean
    // loopback.
    let s = a.stats();
    assert_eq!(s.retransmits, 0, "host a retransmitted");
    assert_eq!(b.stats().retransmits, 0, "host b retransmitted");
}
