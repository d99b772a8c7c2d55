//! CPU cost of the protocol engine alone for one remote null exchange
//! (two engines, datagrams handed over in memory, no sockets, no locks):
//! `cargo run --release -p vkernel-proto --example engine_cost -- 1000000`
//! (`NOMETRICS=1`: without the detailed metrics; `PHASES=1`: also the
//! median of each engine call on the path, from the TSC).

use std::net::SocketAddr;
use std::time::Instant;
use vkernel_proto::{Completion, Config, Engine, HostId, Message};

fn pump(a: &mut Engine, b: &mut Engine, aa: SocketAddr, ba: SocketAddr, now: u64) -> usize {
    let mut n = 0;
    loop {
        let mut moved = false;
        while let Some(t) = a.poll_transmit() {
            moved = true;
            n += 1;
            if t.to == ba {
                b.handle_datagram(now, aa, &t.data);
            }
        }
        while let Some(t) = b.poll_transmit() {
            moved = true;
            n += 1;
            if t.to == aa {
                a.handle_datagram(now, ba, &t.data);
            }
        }
        if !moved {
            return n;
        }
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let aa: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let ba: SocketAddr = "127.0.0.1:2".parse().unwrap();
    let mk = |id: u16, peer: SocketAddr, seed: u64| {
        Engine::new(
            Config {
                host_id: Some(HostId(id)),
                discovery: vec![peer],
                seed,
                metrics: std::env::var("NOMETRICS").is_err(),
                ..Config::default()
            },
            0,
        )
    };
    let mut a = mk(1, ba, 1);
    let mut b = mk(2, aa, 2);
    let c = a.create_process().unwrap();
    let s = b.create_process().unwrap();
    pump(&mut a, &mut b, aa, ba, 0);
    if std::env::var("PHASES").is_ok() {
        return phases(&mut a, &mut b, c, s, aa, ba, n);
    }
    let warmup = 1000;
    let mut dgrams = 0;
    let mut t = Instant::now();
    for now in 1..=n + warmup {
        if now == warmup + 1 {
            dgrams = 0;
            t = Instant::now();
        }
        assert!(b.receive(now, s, None, None).unwrap().is_none());
        a.send(now, c, s, Message::with_code(1), None).unwrap();
        dgrams += pump(&mut a, &mut b, aa, ba, now);
        let r = match b.take_completion(s) {
            Some(Completion::Receive(r)) => r.unwrap(),
            other => panic!("{other:?}"),
        };
        while b.poll_event().is_some() {}
        b.reply(now, s, r.from, r.msg, None).unwrap();
        dgrams += pump(&mut a, &mut b, aa, ba, now);
        match a.take_completion(c) {
            Some(Completion::Send(Ok(_))) => {}
            other => panic!("{other:?}"),
        }
        while a.poll_event().is_some() {}
    }
    let el = t.elapsed();
    println!(
        "{:.0} ns per remote exchange (both engines), {} datagrams per exchange",
        el.as_nanos() as f64 / n as f64,
        dgrams as f64 / n as f64
    );
}

/// Median cost of each engine call of a remote exchange, in TSC ticks
/// converted to ns.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn phases(
    a: &mut Engine,
    b: &mut Engine,
    c: vkernel_proto::Pid,
    s: vkernel_proto::Pid,
    aa: SocketAddr,
    ba: SocketAddr,
    n: u64,
) {
    // SAFETY: RDTSC has no memory effects.
    let tsc = || unsafe { core::arch::x86_64::_rdtsc() };
    let names = [
        "server receive (posts)",
        "client send",
        "client poll_transmit",
        "server handle RemoteSend",
        "server take_completion",
        "server reply",
        "server poll_transmit",
        "client handle RemoteReply",
        "client take_completion",
    ];
    let mut v: Vec<Vec<u64>> = vec![Vec::with_capacity(n as usize); names.len()];
    for now in 1..=n {
        let t0 = tsc();
        assert!(b.receive(now, s, None, None).unwrap().is_none());
        let t1 = tsc();
        a.send(now, c, s, Message::with_code(1), None).unwrap();
        let t2 = tsc();
        let tx = a.poll_transmit().unwrap();
        let t3 = tsc();
        b.handle_datagram(now, aa, &tx.data);
        let t4 = tsc();
        let r = match b.take_completion(s) {
            Some(Completion::Receive(r)) => r.unwrap(),
            other => panic!("{other:?}"),
        };
        while b.poll_event().is_some() {}
        let t5 = tsc();
        b.reply(now, s, r.from, r.msg, None).unwrap();
        let t6 = tsc();
        let tx2 = b.poll_transmit().unwrap();
        let t7 = tsc();
        a.handle_datagram(now, ba, &tx2.data);
        let t8 = tsc();
        assert!(matches!(
            a.take_completion(c),
            Some(Completion::Send(Ok(_)))
        ));
        while a.poll_event().is_some() {}
        let t9 = tsc();
        a.recycle(tx.data);
        b.recycle(tx2.data);
        for (i, d) in [
            t1 - t0,
            t2 - t1,
            t3 - t2,
            t4 - t3,
            t5 - t4,
            t6 - t5,
            t7 - t6,
            t8 - t7,
            t9 - t8,
        ]
        .into_iter()
        .enumerate()
        {
            v[i].push(d);
        }
    }
    let t = Instant::now();
    let c0 = tsc();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let ghz = (tsc() - c0) as f64 / t.elapsed().as_nanos() as f64;
    let mut total = 0.0;
    for (name, mut d) in names.iter().zip(v) {
        d.sort_unstable();
        let m = d[d.len() / 2] as f64 / ghz;
        total += m;
        println!("{name:28} {m:6.0} ns");
    }
    println!("{:28} {total:6.0} ns (medians, TSC read included)", "sum");
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
fn phases(
    _: &mut Engine,
    _: &mut Engine,
    _: vkernel_proto::Pid,
    _: vkernel_proto::Pid,
    _: SocketAddr,
    _: SocketAddr,
    _: u64,
) {
    println!("PHASES needs x86-64 (TSC)");
}
