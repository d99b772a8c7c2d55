//! The frame every ping-pong shares: the round count, the timed loop that
//! keeps all but the warm-up rounds, and the client/server run.

use std::time::Duration;

use crate::placement::run_pair;
use crate::{BenchError, Placement, Samples};

/// `iters + warmup`, the rounds a run makes, or an error if it overflows.
pub(crate) fn total_rounds(iters: usize, warmup: usize) -> Result<usize, BenchError> {
    iters
        .checked_add(warmup)
        .ok_or_else(|| BenchError::InvalidArgument("iters + warmup overflows".into()))
}

/// Calls `round(k)` for `k` in `0..total`; each call times its own round
/// trip and returns it. The first `warmup` are dropped, the rest kept.
pub(crate) fn timed_rounds(
    total: usize,
    warmup: usize,
    mut round: impl FnMut(usize) -> Result<Duration, BenchError>,
) -> Result<Samples, BenchError> {
    let mut samples = Samples::with_capacity(total.saturating_sub(warmup));
    for k in 0..total {
        let rtt = round(k)?;
        if k >= warmup {
            samples.push(rtt);
        }
    }
    Ok(samples)
}

/// Runs `client` and `server` with [`run_pair`] and returns the client's
/// samples; the client's error, if any, comes before the server's.
pub(crate) fn run_pingpong<C, S>(
    placement: Placement,
    client: C,
    server: S,
) -> Result<Samples, BenchError>
where
    C: FnOnce() -> Result<Samples, BenchError> + Send,
    S: FnOnce() -> Result<(), BenchError> + Send,
{
    let (c, s) = run_pair(placement, client, server);
    let samples = c?;
    s?;
    Ok(samples)
}
