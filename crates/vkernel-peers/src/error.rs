//! The crate's error type.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use crate::RECV_TIMEOUT;

/// Why a baseline run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A parameter is out of range (size, window, datagram size, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Baselines run on loopback only.
    #[error("{0} is not a loopback address (only 127.0.0.1 / ::1 are used)")]
    NotLoopback(IpAddr),
    /// A socket or system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The calling thread could not be pinned to a CPU.
    #[error("pinning thread to CPU {cpu}: {source}")]
    Pin {
        /// The CPU asked for.
        cpu: usize,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Nothing arrived within the time limit: the run stalled.
    #[error("{what}: nothing arrived within {after:?}")]
    Timeout {
        /// What was being waited for.
        what: &'static str,
        /// How long was waited.
        after: Duration,
    },
    /// A peer sent something that does not belong to the run
    /// (short echo, wrong contents, malformed datagram).
    #[error("protocol: {0}")]
    Protocol(String),
    /// One of the run's threads panicked.
    #[error("{0} thread panicked")]
    Panicked(&'static str),
    /// This peer was left out of the build (feature `zmq` or `grpc` off:
    /// a production binary without the benchmark peers).
    #[error("the {0} peer is not built into this binary (cargo feature `{1}`)")]
    NotBuilt(&'static str, &'static str),
}

impl BenchError {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: &'static str) -> impl FnOnce(io::Error) -> BenchError {
        move |source| BenchError::Io { context, source }
    }

    /// Wraps a non-I/O error (libzmq's, tonic's) with what was being done.
    #[cfg(any(feature = "zmq", feature = "grpc"))]
    pub(crate) fn other<E: std::fmt::Display>(
        context: &'static str,
    ) -> impl FnOnce(E) -> BenchError {
        move |e| BenchError::Io {
            context,
            source: io::Error::other(e.to_string()),
        }
    }

    /// Nothing arrived for `what` within [`RECV_TIMEOUT`].
    pub(crate) fn timeout(what: &'static str) -> BenchError {
        BenchError::Timeout {
            what,
            after: RECV_TIMEOUT,
        }
    }
}
