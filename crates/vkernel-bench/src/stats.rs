//! Timing helpers; the summary type is the peers' [`Summary`].

use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use vkernel_peers::Summary;

/// The cost of the timing itself: median of back-to-back `Instant` reads,
/// measured once. Per-operation samples subtract it ("loop overhead
/// subtracted", as the papers' method asks).
pub fn clock_overhead() -> Duration {
    static O: OnceLock<Duration> = OnceLock::new();
    *O.get_or_init(|| {
        let mut v: Vec<Duration> = (0..2001)
            .map(|_| {
                let t = Instant::now();
                t.elapsed()
            })
            .collect();
        v.sort_unstable();
        v[v.len() / 2]
    })
}

/// One timed sample with the clock overhead taken off.
pub fn sample(since: Instant) -> Duration {
    since.elapsed().saturating_sub(clock_overhead())
}

/// Small-sample helpers over f64 figures (throughputs, ratios).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
