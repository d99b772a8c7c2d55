//! CPU cost of the protocol engine alone for one remote null exchange
//! (two engines, datagrams handed over in memory, no sockets, no locks):
//! `cargo run --release -p vkernel-proto --example engine_cost -- 1000000`
//! (`NOMETRICS=1`: without the detailed metrics).

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
