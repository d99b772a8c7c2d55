//! 64 MiB moved by MoveTo in units against one MoveTo, for several
//! write-behind bounds, in one run (pairs of hosts on loopback, transfers
//! alternating, median of 5): `cargo run --release -p vkernel --example
//! write_behind -- [unit bytes, default 65536] [spin µs, default 1000]`.

use std::time::{Duration, Instant};
use vkernel::{Kernel, KernelConfig, Message, Process, Segment};

const TOTAL: usize = 64 << 20;

fn pair(write_behind: usize, spin: Duration) -> (Kernel, Kernel) {
    let a = Kernel::start(KernelConfig {
        write_behind,
        spin,
        ..Default::default()
    })
    .expect("host a");
    let b = Kernel::start(KernelConfig {
        write_behind,
        spin,
        peers: vec![a.local_addr()],
        ..Default::default()
    })
    .expect("host b");
    (a, b)
}

/// Writes its sender's whole segment in `m.0[1]`-byte MoveTos.
fn mover(p: Process) {
    let mut m = Message::zero();
    let buf = vec![7u8; TOTAL];
    while let Ok(i) = p.receive(&mut m) {
        let unit = (m.0[1] as usize).max(1);
        let mut off = 0;
        while off < TOTAL {
            let end = (off + unit).min(TOTAL);
            p.move_to(i.from, off as u32, &buf[off..end])
                .expect("move_to");
            off = end;
        }
        let _ = p.reply(&m, i.from);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let unit: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64 << 10);
    let spin_us = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let spin = Duration::from_micros(spin_us);
    println!(
        "64 MiB in {unit}-byte MoveTo units / one MoveTo; adaptive spin ≤ {spin_us} µs, unpinned"
    );
    let bounds = [0usize, 128 << 10, 512 << 10, 2 << 20];
    let hosts: Vec<_> = bounds
        .iter()
        .map(|&wb| {
            let (a, b) = pair(wb, spin);
            let (spid, _h) = a.spawn("mover", mover).expect("mover");
            let c = b.create_process().expect("client");
            (a, b, spid, c)
        })
        .collect();
    let mut seg = vec![1u8; TOTAL];
    let mut mbps = vec![(Vec::new(), Vec::new()); bounds.len()];
    for _ in 0..5 {
        for (k, (_, _, spid, c)) in hosts.iter().enumerate() {
            for u in [unit, TOTAL] {
                let mut m = Message::with_code(1);
                m.0[1] = u as u32;
                let t = Instant::now();
                c.send_with_segment(&mut m, *spid, Segment::Write(&mut seg))
                    .expect("send");
                let r = TOTAL as f64 / t.elapsed().as_secs_f64() / 1e6;
                if u == unit {
                    mbps[k].0.push(r);
                } else {
                    mbps[k].1.push(r);
                }
            }
        }
    }
    for (wb, (units, ones)) in bounds.iter().zip(mbps) {
        let (u, o) = (median(units), median(ones));
        println!(
            "  write-behind ≤ {:>5} KiB: units {u:6.0} MB/s, one MoveTo {o:6.0} MB/s: {:.2}×",
            wb >> 10,
            u / o
        );
    }
    std::process::exit(0);
}
