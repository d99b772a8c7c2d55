//! Congestion control for bulk transfers: a loss-based window in chunks
//! (slow start, then one chunk per window of acknowledgements; cut to 0.7×
//! at most once per window of data on loss, to the floor on a timeout), kept
//! per peer host so that a MoveTo in small units starts where the last one
//! ended. The flow-control window (`Config::window`) caps it.

/// Chunks below which the window is never cut: two keep acknowledgements
/// flowing (one `ACK_NOW` per half window).
pub(crate) const FLOOR: usize = 2;
/// Initial window in chunks (as TCP's IW10).
const INITIAL: usize = 10;

/// A congestion window and where it stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cwnd {
    /// Chunks that may be in flight.
    pub(crate) chunks: usize,
    /// Slow start below this.
    ssthresh: usize,
    /// Acknowledged chunks counted towards the next increase.
    acc: usize,
    /// Losses of chunks sent at or before this mark (a transmission counter
    /// or a chunk index, as the caller counts) were caused by the window
    /// already cut for: they do not cut it again.
    recover: u32,
}

impl Cwnd {
    /// A fresh window for a transfer capped at `cap` chunks.
    pub(crate) fn new(cap: usize) -> Cwnd {
        Cwnd {
            chunks: INITIAL.min(cap).max(1),
            ssthresh: cap.max(1),
            acc: 0,
            recover: 0,
        }
    }

    /// The window a transfer with cap `cap` may use now.
    pub(crate) fn limit(&self, cap: usize) -> usize {
        self.chunks.min(cap).max(1)
    }

    /// `n` chunks were newly acknowledged (or received).
    pub(crate) fn acked(&mut self, n: usize, cap: usize) {
        if self.chunks < self.ssthresh {
            self.chunks += n;
        } else {
            self.acc += n;
            while self.acc >= self.chunks {
                self.acc -= self.chunks;
                self.chunks += 1;
            }
        }
        self.chunks = self.chunks.min(cap.max(1));
    }

    /// A chunk sent at `mark` was lost; `now_mark` is the mark of the
    /// latest transmission. True if that cut the window.
    pub(crate) fn lost(&mut self, mark: u32, now_mark: u32) -> bool {
        if mark <= self.recover {
            return false;
        }
        self.ssthresh = (self.chunks * 7 / 10).max(FLOOR);
        self.chunks = self.ssthresh;
        self.acc = 0;
        self.recover = now_mark;
        true
    }

    /// No acknowledgement came within the retransmission timeout.
    pub(crate) fn timed_out(&mut self, now_mark: u32) {
        self.ssthresh = (self.chunks / 2).max(FLOOR);
        self.chunks = FLOOR;
        self.acc = 0;
        self.recover = now_mark;
    }

    /// The window to start the next transfer to the same host with: its
    /// size and threshold, not its loss bookkeeping.
    pub(crate) fn carried(&self) -> Cwnd {
        Cwnd {
            acc: 0,
            recover: 0,
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_fast_then_slowly_and_is_capped() {
        let mut c = Cwnd::new(100);
        assert_eq!(c.chunks, INITIAL);
        c.acked(10, 100);
        assert_eq!(c.chunks, 20, "slow start doubles per window");
        assert!(c.lost(5, 30));
        assert_eq!(c.chunks, 14);
        for _ in 0..14 {
            c.acked(1, 100);
        }
        assert_eq!(c.chunks, 15, "one chunk per window of acknowledgements");
        c.acked(10_000, 100);
        assert!(c.chunks <= 100);
    }

    #[test]
    fn cuts_once_per_window_of_data_and_never_below_the_floor() {
        let mut c = Cwnd::new(64);
        c.acked(54, 64);
        assert_eq!(c.chunks, 64);
        assert!(c.lost(3, 70));
        assert_eq!(c.chunks, 44);
        assert!(!c.lost(60, 71), "sent before the cut: same episode");
        assert!(c.lost(72, 90), "sent after the cut: a new episode");
        for m in 0..100 {
            c.lost(100 + m, 100 + m);
        }
        assert_eq!(c.chunks, FLOOR);
        c.timed_out(500);
        assert_eq!(c.chunks, FLOOR);
        assert_eq!(c.limit(64), FLOOR);
        assert_eq!(Cwnd::new(1).limit(1), 1);
    }
}
