//! The raw baselines beside vkernel's figures, from the `vkernel_peers`
//! crate, run with the same placement and waiting as the vkernel
//! measurements and summarized the same way (clock overhead subtracted).

use crate::stats::{clock_overhead, Summary};
use crate::Mode;
use std::time::Duration;
use vkernel_peers as raw;

/// The samples as durations, the clock's overhead subtracted.
fn durations(s: raw::Samples) -> Vec<Duration> {
    let o = clock_overhead();
    s.ns.into_iter()
        .map(|ns| Duration::from_nanos(ns).saturating_sub(o))
        .collect()
}

/// A peer's ping-pong: `(size, iters, warmup, wait, placement)`.
type PingPong =
    fn(usize, usize, usize, raw::Wait, raw::Placement) -> Result<raw::Samples, raw::BenchError>;

/// Runs ping-pong `f` in mode `pl`; errors are prefixed with `what`.
fn samples(
    f: PingPong,
    what: &str,
    size: usize,
    iters: usize,
    warmup: usize,
    pl: Mode,
) -> Result<Vec<Duration>, String> {
    f(size, iters, warmup, pl.wait, pl.cpus)
        .map(durations)
        .map_err(|e| format!("{what}: {e}"))
}

/// The round trips of [`udp_rtt`] themselves, for pooling over rounds.
pub fn udp_samples(
    size: usize,
    iters: usize,
    warmup: usize,
    pl: Mode,
) -> Result<Vec<Duration>, String> {
    samples(raw::udp_pingpong, "raw UDP", size, iters, warmup, pl)
}

/// Round-trip time of `size`-byte UDP datagrams between two threads.
pub fn udp_rtt(size: usize, iters: usize, warmup: usize, pl: Mode) -> Result<Summary, String> {
    udp_samples(size, iters, warmup, pl).map(|mut v| Summary::of(&mut v))
}

/// Round-trip time of `size`-byte messages over TCP (NODELAY) on loopback.
pub fn tcp_rtt(size: usize, iters: usize, warmup: usize, pl: Mode) -> Result<Summary, String> {
    samples(raw::tcp_pingpong, "TCP", size, iters, warmup, pl).map(|mut v| Summary::of(&mut v))
}

/// Round-trip time of `size`-byte ZeroMQ REQ/REP messages (libzmq, TCP on
/// loopback).
pub fn zmq_rtt(size: usize, iters: usize, warmup: usize, pl: Mode) -> Result<Summary, String> {
    samples(raw::zmq_pingpong, "ZeroMQ", size, iters, warmup, pl).map(|mut v| Summary::of(&mut v))
}

/// Round-trip time of unary gRPC calls carrying `size` bytes (tonic; it
/// always waits in its reactor, whatever the mode's waiting).
pub fn grpc_rtt(size: usize, iters: usize, warmup: usize, pl: Mode) -> Result<Summary, String> {
    samples(raw::grpc_pingpong, "gRPC", size, iters, warmup, pl).map(|mut v| Summary::of(&mut v))
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
pub fn udp_blast(total: usize, dgram: usize, pl: Mode, runs: usize) -> Result<Blast, String> {
    let mut v = Vec::new();
    for _ in 0..runs.max(1) {
        let t = raw::udp_blast(total, dgram, pl.wait, None, pl.cpus)
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

/// A raw UDP echo server thread (`raw-server`, 32-byte datagrams) on a
/// free loopback port, waiting as `wait` says; stops when `stop` is set
/// (checked between datagrams, and every 10 ms when blocking), and
/// returns the CPU time it used. Section 18's baseline.
pub fn udp_echo_server(
    wait: raw::Wait,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<(std::net::SocketAddr, std::thread::JoinHandle<Duration>), String> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let a = s.local_addr().map_err(|e| e.to_string())?;
    match wait {
        raw::Wait::Spin => s.set_nonblocking(true),
        raw::Wait::Block => s.set_read_timeout(Some(Duration::from_millis(10))),
    }
    .map_err(|e| e.to_string())?;
    let h = std::thread::Builder::new()
        .name("raw-server".into())
        .spawn(move || {
            let mut b = [0u8; 64];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((n, from)) = s.recv_from(&mut b) {
                    let _ = s.send_to(&b[..n], from);
                } else if wait == raw::Wait::Spin {
                    std::hint::spin_loop();
                }
            }
            vkernel::host::thread_cpu_time()
        })
        .map_err(|e| e.to_string())?;
    Ok((a, h))
}
