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
