//! A call's deadline: one instant of the host's µs clock, made once from
//! the caller's timeout and handed down every path the call takes, so a
//! path that falls back to another passes on only the time left.

use std::time::Duration;

/// When a blocking call fails with `Deadline`, if ever. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deadline(Option<u64>);

impl Deadline {
    /// No deadline.
    pub(crate) const NONE: Deadline = Deadline(None);

    /// `timeout` after `now` (µs of the host's clock; saturating).
    pub(crate) fn after(now: u64, timeout: Option<Duration>) -> Deadline {
        Deadline(
            timeout.map(|d| now.saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))),
        )
    }

    /// `timeout` after the clock's time, read by `now` only if there is a
    /// timeout (a fast path reads no clock it does not need).
    pub(crate) fn after_now(now: impl FnOnce() -> u64, timeout: Option<Duration>) -> Deadline {
        match timeout {
            Some(_) => Deadline::after(now(), timeout),
            None => Deadline::NONE,
        }
    }

    /// The instant, if any.
    pub(crate) fn at(self) -> Option<u64> {
        self.0
    }

    /// Whether the deadline is exactly `t` (a wait until `t` must then
    /// end on time).
    pub(crate) fn is_at(self, t: u64) -> bool {
        self.0 == Some(t)
    }

    /// Whether it has passed at `now`.
    pub(crate) fn passed(self, now: u64) -> bool {
        self.0.is_some_and(|d| now >= d)
    }

    /// The time left at `now` (zero once passed); None: no deadline.
    pub(crate) fn left(self, now: u64) -> Option<Duration> {
        self.0.map(|d| Duration::from_micros(d.saturating_sub(now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_left_shrinks_and_ends_at_zero() {
        let d = Deadline::after(1_000, Some(Duration::from_millis(3)));
        assert_eq!(d.at(), Some(4_000));
        assert_eq!(d.left(2_500), Some(Duration::from_micros(1_500)));
        assert_eq!(d.left(9_000), Some(Duration::ZERO));
        assert!(!d.passed(3_999) && d.passed(4_000));
        assert!(d.is_at(4_000));
        let none = Deadline::after(1_000, None);
        assert_eq!(
            (none, none.left(5), none.passed(u64::MAX)),
            (Deadline::NONE, None, false)
        );
        assert_eq!(
            Deadline::after(u64::MAX - 1, Some(Duration::MAX)).at(),
            Some(u64::MAX)
        );
    }
}
