//! Adaptive retransmission timeout (Jacobson/Karels), per peer host.

use crate::config::Micros;

/// Smoothed RTT state for one peer host.
#[derive(Clone, Copy, Debug)]
pub struct Rtt {
    srtt: Option<Micros>,
    rttvar: Micros,
}

impl Default for Rtt {
    fn default() -> Self {
        Rtt::new()
    }
}

impl Rtt {
    /// No samples yet.
    pub const fn new() -> Rtt {
        Rtt {
            srtt: None,
            rttvar: 0,
        }
    }

    /// Feeds one sample (only from exchanges that were not retransmitted).
    pub fn sample(&mut self, s: Micros) {
        match self.srtt {
            None => {
                self.srtt = Some(s);
                self.rttvar = s / 2;
            }
            Some(srtt) => {
                let err = srtt.abs_diff(s);
                self.rttvar = (3 * self.rttvar + err) / 4;
                self.srtt = Some((7 * srtt + s) / 8);
            }
        }
    }

    /// The smoothed RTT, if any sample was taken.
    pub fn srtt(&self) -> Option<Micros> {
        self.srtt
    }

    /// Current timeout: srtt + 4·rttvar, clamped, or `initial` before samples.
    pub fn rto(&self, initial: Micros, min: Micros, max: Micros) -> Micros {
        match self.srtt {
            None => initial.clamp(min, max),
            Some(s) => (s + 4 * self.rttvar).clamp(min, max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapts_to_samples() {
        let mut r = Rtt::new();
        assert_eq!(r.rto(100_000, 1_000, 1_000_000), 100_000);
        for _ in 0..50 {
            r.sample(100);
        }
        assert_eq!(r.rto(100_000, 1_000, 1_000_000), 1_000);
        for _ in 0..50 {
            r.sample(50_000);
        }
        let rto = r.rto(100_000, 1_000, 1_000_000);
        assert!((50_000..200_000).contains(&rto), "{rto}");
    }
}
