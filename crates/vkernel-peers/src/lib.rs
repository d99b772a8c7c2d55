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

mod error;
pub mod grpcpeer;
mod net;
pub mod placement;
pub mod stats;
pub mod tcp;
pub mod udp;
pub mod zmqpeer;

pub use error::BenchError;
pub use grpcpeer::{grpc_pingpong, MAX_GRPC_PAYLOAD};
pub use net::{set_socket_buffers, SocketBuffers, DEFAULT_SOCKET_BUFFER, RECV_TIMEOUT};
pub use placement::{Placement, Wait};
pub use stats::{linear_fit, Samples, Summary};
pub use tcp::{tcp_pingpong, tcp_pingpong_at};
pub use udp::{
    udp_blast, udp_blast_with, udp_pingpong, udp_pingpong_at, BlastConfig, Throughput,
    MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6,
};
pub use zmqpeer::{zmq_pingpong, MAX_ZMQ_MESSAGE};

/// Serializes the tests that move data between threads, so busy-polling
/// runs do not compete for the same CPUs.
#[cfg(test)]
pub(crate) fn net_test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}
