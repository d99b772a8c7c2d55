//! Median round trips of the four loopback peers at 32 B, 1 KiB and 8 KiB,
//! with the same placement and waiting for each.
//!
//! ```sh
//! cargo run --release -p vkernel-peers --example peers -- [block|spin] [iters]
//! ```
//!
//! Threads are pinned to the first two allowed CPUs ([`Placement::spread`]).
//! gRPC always waits in tokio's reactor, so it runs a quarter of the
//! iterations and its row is blocking whatever mode is asked for.

use std::error::Error;

use vkernel_peers::{
    grpc_pingpong, tcp_pingpong, udp_pingpong, zmq_pingpong, BenchError, Placement, Samples, Wait,
};

type Peer = fn(usize, usize, usize, Wait, Placement) -> Result<Samples, BenchError>;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let wait = match args.next().as_deref() {
        None | Some("block") => Wait::Block,
        Some("spin") => Wait::Spin,
        Some(other) => return Err(format!("waiting mode {other:?}: block or spin").into()),
    };
    let iters: usize = args.next().map_or(Ok(2000), |s| s.parse())?;
    let placement = Placement::spread()?;
    let peers: [(&str, Peer, usize); 4] = [
        ("UDP", udp_pingpong, iters),
        ("TCP", tcp_pingpong, iters),
        ("ZeroMQ", zmq_pingpong, iters),
        ("gRPC", grpc_pingpong, (iters / 4).max(1)),
    ];
    let sizes = [32usize, 1024, 8192];
    println!("median round trip, {wait} waiting, {placement}");
    print!("{:<8}", "peer");
    for size in sizes {
        print!("{:>12}", format!("{size} B"));
    }
    println!("{:>8}", "n");
    for (name, run, n) in peers {
        print!("{name:<8}");
        for size in sizes {
            let s = run(size, n, n / 10, wait, placement)?;
            let us = s.median().map_or(f64::NAN, |ns| ns as f64 / 1000.0);
            print!("{:>12}", format!("{us:.1} µs"));
        }
        println!("{n:>8}");
    }
    Ok(())
}
