//! Adaptive retransmission timeout (Jacobson/Karels), per peer host.

use crate::config::Micros;

/// Smoothed RTT state for one peer host.
#[derive(Clone, Copy, Debug)]
pub struct Rtt {
    srtt: Option<Micros>,
    rttvar: Micros,
    /// The longest the host was seen to hold a request before answering
    /// it (half again), as of `busy_at`; the timeout stays above it,
    /// halving every [`BUSY_HALF_LIFE`] after.
    busy: Micros,
    busy_at: Micros,
}

/// How fast a busy host's floor on the timeout fades.
pub const BUSY_HALF_LIFE: Micros = 1_000_000;

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
            busy: 0,
            busy_at: 0,
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

    /// The host held a request `held` µs before answering it (known from
    /// its replyPending: it had the first copy, so the retransmission was
    /// needless). Later timeouts stay above it for a while, so a busy but
    /// healthy host is not sent copies it has no use for.
    pub fn busy(&mut self, now: Micros, held: Micros) {
        let floor = held.saturating_add(held / 2);
        self.busy = self.busy_floor(now).max(floor);
        self.busy_at = now;
    }

    /// The floor [`Rtt::busy`] set, faded to `now`.
    pub fn busy_floor(&self, now: Micros) -> Micros {
        let halvings = now.saturating_sub(self.busy_at) / BUSY_HALF_LIFE;
        self.busy.checked_shr(halvings.min(63) as u32).unwrap_or(0)
    }

    /// [`Rtt::rto`], and not below the busy floor at `now`.
    pub fn rto_at(&self, now: Micros, initial: Micros, min: Micros, max: Micros) -> Micros {
        self.rto(initial, min, max)
            .max(self.busy_floor(now).min(max))
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
