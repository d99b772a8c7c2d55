//! Remote null exchanges between two logical hosts in one process, for
//! profiling: `cargo run --release --example pingpong -- 200000`
//! (`LOCAL=1`: both processes on one host; `PIN=1`: pinned; `NORAW=1`: no
//! raw UDP comparison; `NOMETRICS=1`: detailed metrics off).

use std::time::{Duration, Instant};
use vkernel::{Kernel, KernelConfig, Message};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let spin = Duration::from_millis(100);
    // NOMETRICS=1: without the detailed traffic metrics.
    let metrics = std::env::var("NOMETRICS").is_err();
    let a = Kernel::start(KernelConfig {
        spin,
        metrics,
        ..Default::default()
    })
    .expect("host a");
    let b = Kernel::start(KernelConfig {
        spin,
        metrics,
        peers: vec![a.local_addr()],
        ..Default::default()
    })
    .expect("host b");
    // LOCAL=1: the echo server on the client's own host.
    let server_host = if std::env::var("LOCAL").is_ok() {
        &b
    } else {
        &a
    };
    let (spid, _h) = server_host
        .spawn("echo", |p| {
            if std::env::var("PIN").is_ok() {
                let _ = vkernel::host::pin_to_cpu(1);
            }
            let mut m = Message::zero();
            while let Ok(i) = p.receive(&mut m) {
                let _ = p.reply(&m, i.from);
            }
        })
        .expect("server");
    let c = b.create_process().expect("client");
    if std::env::var("PIN").is_ok() {
        let _ = vkernel::host::pin_to_cpu(0);
    }
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let mut m = Message::with_code(1);
        let t = Instant::now();
        c.send(&mut m, spid).expect("send");
        lat.push(t.elapsed());
    }
    lat.sort();
    // NORAW=1: skip the raw UDP comparison (for profiling vkernel alone).
    let r = if std::env::var("NORAW").is_ok() {
        vec![Duration::ZERO]
    } else {
        raw(n)
    };
    let q = |v: &[Duration], f: f64| v[((v.len() - 1) as f64 * f) as usize];
    let slow = |v: &[Duration]| v.iter().filter(|d| d.as_micros() > 25).count();
    println!(
        "vkernel median {:?} p90 {:?} p99 {:?} >25us {}; raw median {:?} p90 {:?} p99 {:?} >25us {}",
        q(&lat, 0.5),
        q(&lat, 0.9),
        q(&lat, 0.99),
        slow(&lat),
        q(&r, 0.5),
        q(&r, 0.9),
        q(&r, 0.99),
        slow(&r)
    );
}

/// Raw UDP ping-pong between two threads, busy-polling, for comparison.
pub fn raw(n: usize) -> Vec<Duration> {
    use std::net::UdpSocket;
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let c = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.set_nonblocking(true).expect("nb");
    c.set_nonblocking(true).expect("nb");
    let sa = s.local_addr().expect("addr");
    let h = std::thread::spawn(move || {
        let mut b = [0u8; 2048];
        let deadline = Instant::now() + Duration::from_secs(30);
        for _ in 0..n {
            loop {
                if let Ok((k, from)) = s.recv_from(&mut b) {
                    let _ = s.send_to(&b[..k], from);
                    break;
                }
                if Instant::now() > deadline {
                    return;
                }
                std::hint::spin_loop();
            }
        }
    });
    let mut lat = Vec::with_capacity(n);
    let mut b = [0u8; 2048];
    for _ in 0..n {
        let t = Instant::now();
        c.send_to(&[0u8; 32], sa).expect("send");
        // Bounded: a lost datagram (or a starved peer) ends the run.
        let give_up = Instant::now() + Duration::from_secs(1);
        while c.recv_from(&mut b).is_err() {
            if Instant::now() > give_up {
                eprintln!("raw UDP: no answer within 1 s, stopping early");
                h.join().expect("join");
                lat.sort();
                return lat;
            }
            std::hint::spin_loop();
        }
        lat.push(t.elapsed());
    }
    h.join().expect("join");
    lat.sort();
    lat
}
