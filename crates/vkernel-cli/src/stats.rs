//! Latency summaries.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// min / median / p99 / max of a set of durations.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Summary {
    /// Samples.
    pub n: usize,
    /// Minimum, µs.
    pub min_us: f64,
    /// Median, µs.
    pub median_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
}

impl Summary {
    /// Summarizes samples (empty → zeros).
    pub fn of(samples: &mut [Duration]) -> Summary {
        samples.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let n = samples.len();
        if n == 0 {
            return Summary {
                n,
                min_us: 0.0,
                median_us: 0.0,
                p99_us: 0.0,
                max_us: 0.0,
            };
        }
        let pick = |q: f64| samples[((n as f64 - 1.0) * q).round() as usize];
        Summary {
            n,
            min_us: us(samples[0]),
            median_us: us(pick(0.5)),
            p99_us: us(pick(0.99)),
            max_us: us(samples[n - 1]),
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "min {:8.2} µs  median {:8.2} µs  p99 {:8.2} µs  (n={})",
            self.min_us, self.median_us, self.p99_us, self.n
        )
    }
}
