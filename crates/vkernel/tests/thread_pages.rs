//! Threads of one program exchange through peer pages (issue 49: the
//! threads' fast path is the attached programs' mechanism,
//! `peer_exchange.rs`), and everything the engine decides still holds:
//! counters, restricted senders, what a receiver may do to a sender that
//! lent no segment, a remote Send to a receiver waiting in its inbox.

use std::time::{Duration, Instant};

use vkernel::{IpcError, Kernel, KernelConfig, Message, Pid, Process};

const ECHO: u32 = 1;
/// Answered with MoveTo, MoveFrom and a reply with a segment to the
/// sender, each one's error in words 1..=3.
const TRY_SEGMENT: u32 = 2;
const STOP: u32 = 9;

fn host(pages: bool) -> Kernel {
    Kernel::start(KernelConfig {
        // (The switch of every path outside the engine.)
        direct_sends: pages,
        ..Default::default()
    })
    .expect("host")
}

/// A spin long enough that a receiver waits in its inbox between
/// requests and a sender waits for it to open, however busy the machine
/// (the adaptive default blocks instead when CPUs are taken: then the
/// engine carries the exchange, as it should).
const SPIN: Duration = Duration::from_millis(2);

/// One test at a time: each spins two or three threads for [`SPIN`] at a
/// time, and four at once on a small machine would hold each other off
/// the CPUs for longer than a retransmission timeout.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A server process of `k` spinning [`SPIN`], on a thread of its own.
fn spawn_server(k: &Kernel) -> (Pid, std::thread::JoinHandle<()>) {
    let p = k.create_process().unwrap();
    p.set_spin(SPIN);
    (p.pid(), std::thread::spawn(move || serve(p)))
}

/// A client process of `k` spinning [`SPIN`].
fn client(k: &Kernel) -> Process {
    let c = k.create_process().unwrap();
    c.set_spin(SPIN);
    c
}

fn code(r: Result<usize, IpcError>) -> u32 {
    r.err().map_or(0, |e| e.code().0)
}

/// Echoes until STOP; TRY_SEGMENT as described above.
fn serve(p: Process) {
    let mut m = Message::zero();
    while let Ok(i) = p.receive(&mut m) {
        match m.code() {
            TRY_SEGMENT => {
                let mut b = [0u8; 8];
                m.set_word(1, code(p.move_to(i.from, 0, &[1; 8])));
                m.set_word(2, code(p.move_from(i.from, 0, &mut b)));
                let r = p.reply_with_segment(&m, i.from, 0, &[1; 8]);
                m.set_word(3, r.err().map_or(0, |e| e.code().0));
                let _ = p.reply(&m, i.from);
            }
            c => {
                m.set_word(1, m.word(1).wrapping_add(1));
                let _ = p.reply(&m, i.from);
                if c == STOP {
                    return;
                }
            }
        }
    }
}

fn echo(c: &Process, to: Pid, k: u32) -> Result<(), IpcError> {
    let mut m = Message::with_code(ECHO);
    m.set_word(1, k);
    c.send(&mut m, to)?;
    assert_eq!(m.word(1), k.wrapping_add(1), "the reply to request {k}");
    Ok(())
}

fn stop(c: &Process, to: Pid) {
    let mut m = Message::with_code(STOP);
    let _ = c.send(&mut m, to);
}

#[test]
fn threads_exchange_through_pages_and_are_counted_as_local() {
    let _one = serial();
    let k = host(true);
    let (s, h) = spawn_server(&k);
    let c = client(&k);
    let (s0, p0) = (k.stats(), k.peer_exchanges());
    let n = 5000;
    for i in 0..n {
        echo(&c, s, i).unwrap();
    }
    let (s1, p1) = (k.stats(), k.peer_exchanges());
    let pages = p1 - p0;
    eprintln!("{pages} of {n} exchanges through pages");
    // The server spins between requests, so its inbox is open when most
    // requests come.
    assert!(pages > u64::from(n) / 2, "{pages} of {n} through pages");
    assert_eq!(
        s1.local_exchanges - s0.local_exchanges,
        u64::from(n),
        "every exchange counted once, whichever way it went"
    );
    assert_eq!(
        s1.local_latency_us.count() - s0.local_latency_us.count(),
        u64::from(n),
        "and timed (a sample standing for the rest)"
    );
    stop(&c, s);
    h.join().unwrap();
    // A process's count outlives it.
    drop(c);
    assert!(
        k.peer_exchanges() >= p1,
        "counts kept after the process went"
    );
}

#[test]
fn a_receiver_may_not_move_or_write_into_a_sender_that_lent_nothing() {
    let _one = serial();
    // Through a page or through the engine, the same errors.
    let mut seen = Vec::new();
    for pages in [true, false] {
        let k = host(pages);
        let (s, h) = spawn_server(&k);
        let c = client(&k);
        // Until one went through a page, if any may (bounded).
        let mut m = Message::with_code(TRY_SEGMENT);
        let mut through = 0;
        for _ in 0..50 {
            echo(&c, s, 0).unwrap();
            let p0 = k.peer_exchanges();
            m = Message::with_code(TRY_SEGMENT);
            c.send(&mut m, s).unwrap();
            through = k.peer_exchanges() - p0;
            if through > 0 || !pages {
                break;
            }
        }
        seen.push(((m.word(1), m.word(2), m.word(3)), through));
        stop(&c, s);
        h.join().unwrap();
    }
    eprintln!("(move_to, move_from, reply_with_segment), by page: {seen:?}");
    assert_eq!(seen[0].0, seen[1].0, "the same errors both ways");
    assert!(seen[0].0 .0 != 0 && seen[0].0 .1 != 0, "refused: {seen:?}");
    assert_eq!(seen[0].1, 1, "the first one went through a page");
    assert_eq!(seen[1].1, 0, "no pages on a host without the path");
}

#[test]
fn a_restricted_receiver_is_checked_by_the_engine() {
    let _one = serial();
    let k = host(true);
    let p = k.create_process().unwrap();
    let to = p.pid();
    p.restrict_senders(Some(vec![42]));
    let h = std::thread::spawn(move || serve(p));
    let c = k.create_process().unwrap();
    let mut m = Message::with_code(ECHO);
    assert_eq!(c.send(&mut m, to), Err(IpcError::AccessDenied(to)));
    c.set_principal(42);
    echo(&c, to, 1).unwrap();
    stop(&c, to);
    h.join().unwrap();
}

#[test]
fn a_remote_send_reaches_a_receiver_that_waits_in_its_inbox() {
    let _one = serial();
    // Host a's server waits in its inbox after a local request (a server
    // of remote clients waits in the engine, reading the socket); a
    // request from host b then reaches a's socket, which the spinning
    // server reads now and then, and a's engine queues it and closes the
    // inbox. Each must be answered promptly, not at a retransmission or by
    // chance.
    let a = host(true);
    let b = Kernel::start(KernelConfig {
        peers: vec![a.local_addr()],
        ..Default::default()
    })
    .unwrap();
    a.add_peer(b.local_addr());
    let (s, h) = spawn_server(&a);
    let local = client(&a);
    let remote = b.create_process().unwrap();
    echo(&remote, s, 0).unwrap();
    let retx = b.stats().retransmits;
    let mut worst = Duration::ZERO;
    for i in 0..300 {
        // Two local ones: the second through the inbox, and the server
        // waits there again when the remote one comes.
        echo(&local, s, i).unwrap();
        echo(&local, s, i).unwrap();
        let t = Instant::now();
        echo(&remote, s, i).unwrap();
        worst = worst.max(t.elapsed());
    }
    eprintln!(
        "worst remote exchange {worst:?}; {} local ones through pages",
        a.peer_exchanges()
    );
    assert!(a.peer_exchanges() > 0, "the inbox was used");
    assert_eq!(
        b.stats().retransmits,
        retx,
        "no request waited to be resent"
    );
    stop(&local, s);
    h.join().unwrap();
}
