//! The engine's timer: one deadline for everything, and the sweep period.
//!
//! Every state that waits on time (a Send's retransmission, a move's
//! window, a query, an alien's expiry) arms the deadline when it starts
//! waiting ([`Timers::arm`] only ever brings it closer); the runtime reads
//! it with `Engine::poll_timeout` and calls `Engine::handle_timeout` once
//! it passes, which walks the states and sets the next deadline. The
//! deadline may be early: a state that no longer waits is simply skipped.
//! Aliens and saved answers expire in a sweep run at most once per period.

use crate::config::Micros;

/// The deadline and the sweep's schedule. See the module docs.
pub(super) struct Timers {
    next: Micros,
    next_sweep: Micros,
}

impl Timers {
    /// Timers due at once (a new engine looks at everything).
    pub(super) fn new(now: Micros) -> Timers {
        Timers {
            next: now,
            next_sweep: now,
        }
    }

    /// Asks for a call by `t` at the latest.
    #[inline]
    pub(super) fn arm(&mut self, t: Micros) {
        if t < self.next {
            self.next = t;
        }
    }

    /// The deadline.
    #[inline]
    pub(super) fn deadline(&self) -> Micros {
        self.next
    }

    /// Sets the deadline after a pass over every timer.
    #[inline]
    pub(super) fn set(&mut self, next: Micros) {
        self.next = next;
    }

    /// True if the sweep is due at `now`; it is then scheduled `period`
    /// later.
    #[inline]
    pub(super) fn sweep_due(&mut self, now: Micros, period: Micros) -> bool {
        if now < self.next_sweep {
            return false;
        }
        self.next_sweep = now + period;
        true
    }

    /// When the next sweep is due.
    #[inline]
    pub(super) fn next_sweep(&self) -> Micros {
        self.next_sweep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arming_only_brings_the_deadline_closer() {
        let mut t = Timers::new(100);
        t.set(Micros::MAX);
        t.arm(50);
        t.arm(70);
        assert_eq!(t.deadline(), 50);
        t.set(80);
        assert_eq!(t.deadline(), 80);
    }

    #[test]
    fn the_sweep_runs_once_per_period() {
        let mut t = Timers::new(0);
        assert!(t.sweep_due(0, 10));
        assert!(!t.sweep_due(9, 10));
        assert_eq!(t.next_sweep(), 10);
        assert!(t.sweep_due(12, 10));
        assert_eq!(t.next_sweep(), 22);
    }
}
