//! Raw baselines for vkernel's measurements.
//!
//! The papers compare each kernel operation with the *network penalty*: the
//! time to move n bytes memory to memory in one datagram, with no protocol
//! and no process switch (spec 1 §4). On Linux the nearest equivalents are a
//! bare UDP exchange and a bare UDP stream between two threads, plus TCP as
//! the peer most users would pick instead (spec 5). This crate measures them
//! in the same run, with the same thread [`Placement`] and the same waiting
//! strategy ([`Wait`]) as the vkernel
//! measurements they sit beside.
//!
//! Everything runs on loopback (`127.0.0.1` or `::1`) between threads of the
//! calling process. Every receive has a timeout and every loop is bounded in
//! count and time: a run that stalls returns [`BenchError`], it never hangs.
//!
//! - [`stats`] module: [`Samples`], [`Summary`], [`linear_fit`].
//! - [`placement`] module: CPU pinning ([`Placement`]) and the waiting
//!   strategy ([`Wait`]).
//! - [`udp`] module: [`udp_pingpong`] and [`udp_blast`].
//! - [`tcp`] module: [`tcp_pingpong`].
//! - [`zmqpeer`] module: [`zmq_pingpong`] (ZeroMQ REQ/REP through libzmq).
//! - [`grpcpeer`] module: [`grpc_pingpong`] (gRPC unary through tonic).
//!
//! All four ping-pongs share one shape, `(size, iters, warmup, wait,
//! placement) -> Result<Samples, BenchError>`, so a bench calls them at the
//! same sizes, counts and placement (`examples/peers.rs` prints their
//! medians side by side). gRPC cannot busy-poll: tonic waits in tokio's
//! reactor whatever [`Wait`] is passed.
//!
//! ## System dependencies
//!
//! The ZeroMQ peer runs the real libzmq: the `zmq` crate links the system
//! library found through pkg-config (Debian `libzmq3-dev`, `pkg-config`).
//! The gRPC peer's service is generated at build time (`build.rs`) by
//! `tonic-build` from `proto/echo.proto`, which runs `protoc` (Debian
//! `protobuf-compiler`). Generating from the `.proto` keeps the service
//! exactly what any gRPC user would write, with the stock tonic codec and
//! prost message, rather than a hand-written imitation; the price is the
//! `protoc` build dependency, which `.ci/deps` installs.

#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(not(all(feature = "zmq", feature = "grpc")))]
mod absent;
mod error;
#[cfg(feature = "grpc")]
pub mod grpcpeer;
mod net;
mod pingpong;
pub mod placement;
pub mod stats;
pub mod tcp;
pub mod udp;
#[cfg(feature = "zmq")]
pub mod zmqpeer;

#[cfg(not(feature = "grpc"))]
pub use absent::{grpc_pingpong, MAX_GRPC_PAYLOAD};
#[cfg(not(feature = "zmq"))]
pub use absent::{zmq_pingpong, MAX_ZMQ_MESSAGE};
pub use error::BenchError;
#[cfg(feature = "grpc")]
pub use grpcpeer::{grpc_pingpong, MAX_GRPC_PAYLOAD};
pub use net::{set_socket_buffers, SocketBuffers, DEFAULT_SOCKET_BUFFER, RECV_TIMEOUT};
pub use placement::{Placement, Wait};
pub use stats::{linear_fit, Samples, Summary};
pub use tcp::{tcp_pingpong, tcp_pingpong_at};
pub use udp::{
    udp_blast, udp_blast_with, udp_pingpong, udp_pingpong_at, BlastConfig, Throughput,
    MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6,
};
#[cfg(feature = "zmq")]
pub use zmqpeer::{zmq_pingpong, MAX_ZMQ_MESSAGE};

/// Serializes the tests that move data between threads, so busy-polling
/// runs do not compete for the same CPUs.
#[cfg(test)]
pub(crate) fn net_test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Checks a ping-pong's samples: `n` of them, all positive, in order
/// min ≤ median ≤ p99 ≤ max.
#[cfg(test)]
pub(crate) fn assert_sane(s: &Samples, n: usize) {
    assert_eq!(s.n(), n);
    let sum = s.summary().expect("samples");
    assert!(sum.min_us > 0.0 && sum.min_us <= sum.median_us, "{sum:?}");
    assert!(
        sum.median_us <= sum.p99_us && sum.p99_us <= sum.max_us,
        "{sum:?}"
    );
}

/// The signature all four ping-pongs share.
#[cfg(test)]
pub(crate) type PingPong = fn(usize, usize, usize, Wait, Placement) -> Result<Samples, BenchError>;

/// Runs 200 round trips (after 20 warm-up ones) of each size, blocking and
/// spinning, unpinned, and checks the samples. The caller holds
/// [`net_test_lock`].
#[cfg(test)]
pub(crate) fn assert_round_trips(pingpong: PingPong, sizes: &[usize]) {
    for wait in [Wait::Block, Wait::Spin] {
        for &size in sizes {
            let s = pingpong(size, 200, 20, wait, Placement::UNPINNED)
                .unwrap_or_else(|e| panic!("{wait} {size} B: {e}"));
            assert_sane(&s, 200);
        }
    }
}

/// Checks that a message of `bad_size` bytes and a round count that
/// overflows are refused as invalid arguments.
#[cfg(test)]
pub(crate) fn assert_refuses_bad_counts(pingpong: PingPong, bad_size: usize) {
    for (size, iters) in [(bad_size, 1), (32, usize::MAX)] {
        assert!(
            matches!(
                pingpong(size, iters, 1, Wait::Block, Placement::UNPINNED),
                Err(BenchError::InvalidArgument(_))
            ),
            "{size} B, {iters} rounds"
        );
    }
}
