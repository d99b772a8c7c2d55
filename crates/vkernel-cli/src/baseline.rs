//! The raw baselines beside vkernel's figures, from the `vkernel_bench`
//! crate, run with the same placement and waiting as the vkernel
//! measurements and summarized the same way (clock overhead subtracted).

use crate::stats::{clock_overhead, Summary};
use crate::vkbench::Placement;
use std::time::Duration;
use vkernel_bench as raw;

fn wait(pl: Placement) -> raw::Wait {
    if pl.spin {
        raw::Wait::Spin
    } else {
        raw::Wait::Block
    }
}

fn placement(pl: Placement) -> raw::Placement {
    if pl.pinned {
        let n = vkernel::host::online_cpus().max(1);
        raw::Placement::pinned(0, 1 % n)
    } else {
        raw::Placement::UNPINNED
    }
}

/// The samples as durations, the clock's overhead subtracted.
fn durations(s: raw::Samples) -> Vec<Duration> {
    let o = clock_overhead();
    s.ns.into_iter()
        .map(|ns| Duration::from_nanos(ns).saturating_sub(o))
        .collect()
}

fn summary(s: raw::Samples) -> Summary {
    Summary::of(&mut durations(s))
}

/// The round trips of [`udp_rtt`] themselves, for pooling over rounds.
pub fn udp_samples(
    size: usize,
    iters: usize,
    warmup: usize,
    pl: Placement,
) -> Result<Vec<Duration>, String> {
    raw::udp_pingpong(size, iters, warmup, wait(pl), placement(pl))
        .map(durations)
        .map_err(|e| format!("raw UDP: {e}"))
}

/// Round-trip time of `size`-byte UDP datagrams between two threads.
pub fn udp_rtt(size: usize, iters: usize, warmup: usize, pl: Placement) -> Result<Summary, String> {
    raw::udp_pingpong(size, iters, warmup, wait(pl), placement(pl))
        .map(summary)
        .map_err(|e| format!("raw UDP: {e}"))
}

/// Round-trip time of `size`-byte messages over TCP (NODELAY) on loopback.
pub fn tcp_rtt(size: usize, iters: usize, warmup: usize, pl: Placement) -> Result<Summary, String> {
    raw::tcp_pingpong(size, iters, warmup, wait(pl), placement(pl))
        .map(summary)
        .map_err(|e| format!("TCP: {e}"))
}

/// Round-trip time of `size`-byte ZeroMQ REQ/REP messages (libzmq, TCP on
/// loopback).
pub fn zmq_rtt(size: usize, iters: usize, warmup: usize, pl: Placement) -> Result<Summary, String> {
    raw::zmq_pingpong(size, iters, warmup, wait(pl), placement(pl))
        .map(summary)
        .map_err(|e| format!("ZeroMQ: {e}"))
}

/// Round-trip time of unary gRPC calls carrying `size` bytes (tonic; it
/// always waits in its reactor, whatever the placement's waiting).
pub fn grpc_rtt(
    size: usize,
    iters: usize,
    warmup: usize,
    pl: Placement,
) -> Result<Summary, String> {
    raw::grpc_pingpong(size, iters, warmup, wait(pl), placement(pl))
        .map(summary)
        .map_err(|e| format!("gRPC: {e}"))
}

/// A raw UDP blast's outcome.
#[derive(Clone, Copy, Debug)]
pub struct Blast {
    /// Delivered payload bytes per second / 1e6 (median of the runs).
    pub mbps: f64,
    /// Fraction of datagrams lost in that run.
    pub loss: f64,
}

/// Throughput of streaming `total` bytes in `dgram`-byte UDP datagrams,
/// memory to memory, with no flow control or acknowledgement (the physical
/// limit; only bytes that arrived count): the median of `runs` runs.
pub fn udp_blast(total: usize, dgram: usize, pl: Placement, runs: usize) -> Result<Blast, String> {
    let mut v = Vec::new();
    for _ in 0..runs.max(1) {
        let t = raw::udp_blast(total, dgram, wait(pl), None, placement(pl))
            .map_err(|e| format!("raw UDP blast: {e}"))?;
        if !t.verified {
            return Err("raw UDP blast delivered wrong bytes".into());
        }
        v.push(Blast {
            mbps: t.bytes_per_sec / 1e6,
            loss: t.loss,
        });
    }
    v.sort_by(|a, b| a.mbps.total_cmp(&b.mbps));
    Ok(v[v.len() / 2])
}
