//! The ZeroMQ and gRPC peers of a build without them (features `zmq`,
//! `grpc` off): same signatures, each run fails with
//! [`BenchError::NotBuilt`], which the bench prints in the peer's row.

#![allow(dead_code)]

use crate::{BenchError, Placement, Samples, Wait};

/// The largest ZeroMQ message a run takes (as with the feature on).
#[cfg(not(feature = "zmq"))]
pub const MAX_ZMQ_MESSAGE: usize = 64 << 20;

/// The largest gRPC payload a run takes (as with the feature on).
#[cfg(not(feature = "grpc"))]
pub const MAX_GRPC_PAYLOAD: usize = 4 << 20;

/// ZeroMQ REQ/REP ping-pong: not built into this binary.
#[cfg(not(feature = "zmq"))]
pub fn zmq_pingpong(
    _size: usize,
    _iters: usize,
    _warmup: usize,
    _wait: Wait,
    _placement: Placement,
) -> Result<Samples, BenchError> {
    Err(BenchError::NotBuilt("ZeroMQ", "zmq"))
}

/// gRPC unary ping-pong: not built into this binary.
#[cfg(not(feature = "grpc"))]
pub fn grpc_pingpong(
    _size: usize,
    _iters: usize,
    _warmup: usize,
    _wait: Wait,
    _placement: Placement,
) -> Result<Samples, BenchError> {
    Err(BenchError::NotBuilt("gRPC", "grpc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "zmq"))]
    #[test]
    fn a_zmq_run_says_it_is_not_built() {
        let e = zmq_pingpong(32, 1, 0, Wait::Block, Placement::default()).unwrap_err();
        assert!(e.to_string().contains("not built"), "{e}");
    }
}
