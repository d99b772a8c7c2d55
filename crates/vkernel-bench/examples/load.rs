//! One server, k client threads, for a profiler: section 18's blocking or
//! busy-polling load on vkernel or on a raw UDP echo server, for a fixed
//! time, then exchanges per second and the clients' host counters.
//!
//! `cargo run --release -p vkernel-bench --example load -- K SECS [raw] [spin|default]`
//! (`spin`: the vkernel processes busy-poll; `default`: they wait as with
//! no setting; the raw server always blocks)
//! (e.g. under `perf record -g` or `strace -c -f`).
//! Under `taskset -c 0` every thread shares one CPU: no cross-CPU wake-ups,
//! so `load 1 2` against `load 1 2 raw` gives the CPU an exchange costs,
//! repeatable within ~1 % (BENCHMARKS.md, 2026-11-29 (last)).

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkernel::Message;
use vkernel_bench::{vkbench, Mode};
use vkernel_peers::Wait;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: load K SECS [raw] [spin|default]";
    let k: usize = args.first().and_then(|a| a.parse().ok()).ok_or(usage)?;
    let secs: f64 = args.get(1).and_then(|a| a.parse().ok()).ok_or(usage)?;
    let raw = args.iter().any(|a| a == "raw");
    let mode = if args.iter().any(|a| a == "spin") {
        Mode::SPIN
    } else {
        Mode::BLOCK
    };
    let dur = Duration::from_secs_f64(secs.clamp(0.1, 60.0));
    let done = Arc::new(AtomicU64::new(0));
    let client_cpu = AtomicU64::new(0);
    if raw {
        let stop = Arc::new(AtomicBool::new(false));
        let (a, h) = vkernel_bench::baseline::udp_echo_server(Wait::Block, stop.clone())?;
        let deadline = Instant::now() + dur;
        std::thread::scope(|sc| {
            for _ in 0..k {
                let done = done.clone();
                let client_cpu = &client_cpu;
                sc.spawn(move || {
                    let Ok(c) = UdpSocket::bind("127.0.0.1:0") else {
                        return;
                    };
                    if c.connect(a).is_err()
                        || c.set_read_timeout(Some(Duration::from_millis(200)))
                            .is_err()
                    {
                        return;
                    }
                    let mut b = [0u8; 64];
                    while Instant::now() < deadline {
                        if c.send(&[7u8; 32]).is_ok() && c.recv(&mut b).is_ok() {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    client_cpu.fetch_add(
                        vkernel::host::thread_cpu_time().as_nanos() as u64,
                        Ordering::Relaxed,
                    );
                });
            }
        });
        stop.store(true, Ordering::Relaxed);
        let cpu = h.join().unwrap_or_default();
        server_cpu(cpu, done.load(Ordering::Relaxed));
    } else {
        let default = args.iter().any(|a| a == "default");
        let (ka, kb, server, sh) = vkbench::server_pair((!default).then_some(mode))?;
        let s0 = kb.stats();
        let probe = kb.create_process().map_err(|e| e.to_string())?;
        let c0 = vkbench::server_cpu(&probe, server)?;
        let deadline = Instant::now() + dur;
        std::thread::scope(|sc| -> Result<(), String> {
            for _ in 0..k {
                let p = kb.create_process().map_err(|e| e.to_string())?;
                let done = done.clone();
                let client_cpu = &client_cpu;
                sc.spawn(move || {
                    while Instant::now() < deadline {
                        let mut m = Message::with_code(1);
                        if p.send(&mut m, server).is_ok() {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    client_cpu.fetch_add(
                        vkernel::host::thread_cpu_time().as_nanos() as u64,
                        Ordering::Relaxed,
                    );
                });
            }
            Ok(())
        })?;
        let s1 = kb.stats();
        let c1 = vkbench::server_cpu(&probe, server)?;
        server_cpu(c1.saturating_sub(c0), done.load(Ordering::Relaxed));
        println!(
            "retransmits {} (needless {})",
            s1.retransmits - s0.retransmits,
            s1.retransmits_needless - s0.retransmits_needless
        );
        for (name, h) in [("server host", &ka), ("client host", &kb)] {
            let c = h.net_counters();
            println!(
                "{name}: background reads {}, hand-offs {}, idle wakes {}, answers {}, \
                 held replies {} in {} sends, lone waits {} ({} woken, {} timed out)",
                c.background_reads.load(Ordering::Relaxed),
                c.handoffs.load(Ordering::Relaxed),
                c.idle_wakes.load(Ordering::Relaxed),
                c.answers.load(Ordering::Relaxed),
                c.held_datagrams.load(Ordering::Relaxed),
                c.held_sends.load(Ordering::Relaxed),
                c.lone_waits.load(Ordering::Relaxed),
                c.lone_wakes.load(Ordering::Relaxed),
                c.lone_timeouts.load(Ordering::Relaxed)
            );
        }
        vkbench::stop_server(&probe, server, sh);
    }
    let n = done.load(Ordering::Relaxed);
    println!(
        "client threads CPU: {:.2} µs per exchange",
        client_cpu.load(Ordering::Relaxed) as f64 / 1e3 / n.max(1) as f64
    );
    println!(
        "{} k={k}: {:.0} exchanges/s",
        if raw { "raw" } else { "vkernel" },
        n as f64 / dur.as_secs_f64()
    );
    Ok(())
}

/// Prints the server thread's CPU time per exchange.
fn server_cpu(cpu: Duration, n: u64) {
    println!(
        "server thread CPU: {:.2} s, {:.2} µs per exchange",
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / n.max(1) as f64
    );
}
