//! Latency summaries.

use std::time::Duration;

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
