//! Latency samples, their summary, and the least-squares fit the papers use
//! for the network penalty, P(n) = a·n + b.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A set of measured durations, in nanoseconds, in measurement order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Samples {
    /// The durations, nanoseconds.
    pub ns: Vec<u64>,
}

impl Samples {
    /// An empty set with room for `n` samples.
    pub fn with_capacity(n: usize) -> Samples {
        Samples {
            ns: Vec::with_capacity(n),
        }
    }

    /// Adds one sample (saturating at `u64::MAX` ns, about 584 years).
    pub fn push(&mut self, d: Duration) {
        self.ns
            .push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Number of samples.
    pub fn n(&self) -> usize {
        self.ns.len()
    }

    /// True if there are no samples.
    pub fn is_empty(&self) -> bool {
        self.ns.is_empty()
    }

    /// Smallest sample, ns.
    pub fn min(&self) -> Option<u64> {
        self.ns.iter().copied().min()
    }

    /// Largest sample, ns.
    pub fn max(&self) -> Option<u64> {
        self.ns.iter().copied().max()
    }

    /// Arithmetic mean, ns.
    pub fn mean(&self) -> Option<f64> {
        if self.ns.is_empty() {
            return None;
        }
        let sum: u128 = self.ns.iter().map(|&x| u128::from(x)).sum();
        Some(sum as f64 / self.ns.len() as f64)
    }

    /// Median (the lower middle sample for an even count), ns.
    pub fn median(&self) -> Option<u64> {
        self.percentile(50.0)
    }

    /// 99th percentile, ns.
    pub fn p99(&self) -> Option<u64> {
        self.percentile(99.0)
    }

    /// The `p`-th percentile (0 ≤ p ≤ 100, clamped) by the nearest-rank
    /// method: the smallest sample with at least p % of samples ≤ it.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        if self.ns.is_empty() {
            return None;
        }
        let mut v = self.ns.clone();
        let k = rank(v.len(), p);
        Some(*v.select_nth_unstable(k).1)
    }

    /// min / median / p99 / max / mean in one pass over a sorted copy;
    /// `None` if there are no samples.
    pub fn summary(&self) -> Option<Summary> {
        if self.ns.is_empty() {
            return None;
        }
        let mut d: Vec<Duration> = self.ns.iter().map(|&n| Duration::from_nanos(n)).collect();
        Some(Summary::of(&mut d))
    }
}

impl From<Vec<u64>> for Samples {
    fn from(ns: Vec<u64>) -> Samples {
        Samples { ns }
    }
}

/// Zero-based index of the nearest-rank `p`-th percentile among `n > 0`
/// sorted samples.
fn rank(n: usize, p: f64) -> usize {
    let p = if p.is_nan() {
        50.0
    } else {
        p.clamp(0.0, 100.0)
    };
    let r = (p / 100.0 * n as f64).ceil() as usize;
    r.clamp(1, n) - 1
}

/// Summary statistics of a set of times, in microseconds: the one summary
/// of the peers and of `vkernel bench` (its JSON field names are the
/// report's).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest sample.
    pub min_us: f64,
    /// Median (nearest rank).
    pub median_us: f64,
    /// 99th percentile (nearest rank).
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Arithmetic mean.
    pub mean_us: f64,
}

impl Summary {
    /// Summarizes `samples`, sorting them; all zeros if there are none.
    pub fn of(samples: &mut [Duration]) -> Summary {
        samples.sort_unstable();
        let n = samples.len();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        if n == 0 {
            return Summary {
                n,
                min_us: 0.0,
                median_us: 0.0,
                p99_us: 0.0,
                max_us: 0.0,
                mean_us: 0.0,
            };
        }
        Summary {
            n,
            min_us: us(samples[0]),
            median_us: us(samples[rank(n, 50.0)]),
            p99_us: us(samples[rank(n, 99.0)]),
            max_us: us(samples[n - 1]),
            mean_us: samples.iter().map(|&d| us(d)).sum::<f64>() / n as f64,
        }
    }

    /// Every statistic halved: from round-trip times to the one-way
    /// "network penalty" the papers tabulate (A→B then B→A, divided by 2).
    pub fn one_way(&self) -> Summary {
        Summary {
            n: self.n,
            min_us: self.min_us / 2.0,
            median_us: self.median_us / 2.0,
            p99_us: self.p99_us / 2.0,
            max_us: self.max_us / 2.0,
            mean_us: self.mean_us / 2.0,
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

/// Ordinary least-squares fit of `y = a·x + b` to `(x, y)` points, returning
/// `(a, b)` — the papers' P(n) = a·n + b with n in bytes.
///
/// `None` if there are fewer than two points, all x are equal, or a value
/// is not finite.
pub fn linear_fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < 2 || points.iter().any(|(x, y)| !x.is_finite() || !y.is_finite()) {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        return None;
    }
    let a = sxy / sxx;
    Some((a, my - a * mx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_samples() {
        let s = Samples::default();
        assert_eq!(s.n(), 0);
        assert!(s.min().is_none() && s.median().is_none() && s.p99().is_none());
        assert!(s.mean().is_none() && s.summary().is_none());
    }

    #[test]
    fn percentiles_nearest_rank() {
        let s = Samples::from((1..=100).rev().collect::<Vec<u64>>());
        assert_eq!(s.min(), Some(1));
        assert_eq!(s.max(), Some(100));
        assert_eq!(s.median(), Some(50));
        assert_eq!(s.p99(), Some(99));
        assert_eq!(s.percentile(100.0), Some(100));
        assert_eq!(s.percentile(0.0), Some(1));
        assert_eq!(s.mean(), Some(50.5));
        let sum = s.summary().expect("non-empty");
        assert_eq!(sum.n, 100);
        let ns = |us: f64| (us * 1e3).round() as u64;
        assert_eq!(
            (ns(sum.min_us), ns(sum.median_us), ns(sum.p99_us)),
            (1, 50, 99)
        );
        let one = sum.one_way();
        assert_eq!((ns(one.median_us), ns(one.p99_us * 2.0)), (25, 99));
        assert!((one.mean_us * 1e3 - 25.25).abs() < 1e-9);
        let single = Samples::from(vec![7]).summary().expect("non-empty");
        assert_eq!(ns(single.median_us), 7);
    }

    #[test]
    fn push_and_json() {
        let mut s = Samples::with_capacity(2);
        s.push(Duration::from_micros(3));
        s.push(Duration::from_nanos(5));
        assert_eq!(s.ns, vec![3000, 5]);
        let j = serde_json::to_string(&s.summary()).expect("serialize");
        assert!(j.contains("\"median_us\":0.005"), "{j}");
        let back: Summary = serde_json::from_str(&j).expect("deserialize");
        assert_eq!(back.n, 2);
    }

    #[test]
    fn fit_exact_and_degenerate() {
        // The papers' 8 MHz / 3 Mb fit, sampled exactly.
        let pts: Vec<(f64, f64)> = [64.0, 128.0, 256.0, 512.0, 1024.0]
            .iter()
            .map(|&n| (n, 0.0064 * n + 0.390))
            .collect();
        let (a, b) = linear_fit(&pts).expect("fit");
        assert!((a - 0.0064).abs() < 1e-12 && (b - 0.390).abs() < 1e-9);
        // The thesis' 3 Mb / 8 MHz measured points give about the printed fit.
        let measured = [
            (64.0, 0.80),
            (128.0, 1.20),
            (256.0, 2.00),
            (512.0, 3.65),
            (1024.0, 6.95),
        ];
        let (a, b) = linear_fit(&measured).expect("fit");
        assert!(
            (a - 0.0064).abs() < 0.0002 && (b - 0.390).abs() < 0.05,
            "{a} {b}"
        );
        assert!(linear_fit(&[]).is_none());
        assert!(linear_fit(&[(1.0, 2.0)]).is_none());
        assert!(linear_fit(&[(1.0, 2.0), (1.0, 3.0)]).is_none());
        assert!(linear_fit(&[(1.0, f64::NAN), (2.0, 3.0)]).is_none());
    }
}
