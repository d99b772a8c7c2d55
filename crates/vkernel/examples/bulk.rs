//! One MoveTo or MoveFrom of N bytes between two logical hosts, repeated,
//! for profiling: `cargo run --release -p vkernel --example bulk -- to 67108864 5`.

use std::time::{Duration, Instant};
use vkernel::{Kernel, KernelConfig, Message, Segment};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let to = args.get(1).is_none_or(|s| s == "to");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64 << 20);
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let spin = Duration::from_millis(100);
    let faults = std::env::var("FAULT")
        .ok()
        .map(|f| vkernel::FaultConfig::parse(&f).expect("FAULT spec"))
        .unwrap_or_default();
    let a = Kernel::start(KernelConfig {
        spin,
        faults: faults.clone(),
        ..Default::default()
    })
    .expect("a");
    let b = Kernel::start(KernelConfig {
        spin,
        faults,
        peers: vec![a.local_addr()],
        ..Default::default()
    })
    .expect("b");
    let (spid, _h) = a
        .spawn("mover", move |p| {
            let mut m = Message::zero();
            let mut buf = vec![7u8; n];
            while let Ok(i) = p.receive(&mut m) {
                let t = Instant::now();
                let r = if to {
                    p.move_to(i.from, 0, &buf)
                } else {
                    p.move_from(i.from, 0, &mut buf)
                };
                r.expect("move");
                let us = t.elapsed().as_micros() as u32;
                m.0[1] = us;
                let _ = p.reply(&m, i.from);
            }
        })
        .expect("server");
    let c = b.create_process().expect("client");
    let mut seg = vec![1u8; n];
    for _ in 0..rounds {
        if std::env::var("FRESH").is_ok() {
            seg = vec![0u8; n];
        }
        let mut m = Message::with_code(1);
        c.send_with_segment(&mut m, spid, Segment::ReadWrite(&mut seg))
            .expect("send");
        let us = m.0[1] as f64;
        println!(
            "{} {} bytes in {:.1} ms: {:.0} MB/s",
            if to { "MoveTo" } else { "MoveFrom" },
            n,
            us / 1e3,
            n as f64 / us
        );
    }
    let (sa, sb) = (a.stats(), b.stats());
    println!(
        "mover bulk retransmits {} owner bulk retransmits {}; net send errors {} {}",
        sa.bulk_retransmits,
        sb.bulk_retransmits,
        a.net_counters()
            .send_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        b.net_counters()
            .send_errors
            .load(std::sync::atomic::Ordering::Relaxed)
    );
}
