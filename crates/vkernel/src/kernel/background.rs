//! The background (timer) thread of a host: it reads the main socket
//! only while no process does, runs the engine's timers when nobody else
//! will, and watches the multicast socket; with it, the hints processes
//! give it (a nudge, a busy server holding it off) and the start of the
//! peer-name resolver thread.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::sys::poll3;

use super::shared::SPINNING;
use super::Shared;

impl Shared {
    /// Makes the background thread look again at who reads the socket
    /// (a spinner that stopped does not block as a reader itself).
    pub(crate) fn nudge_background(&self) {
        self.bg_efd.signal();
    }

    /// A process took a request with `queued` more behind it: with a deep
    /// queue, the background thread reads the socket every
    /// [`BUSY_POLL_US`] for a moment rather than waking for each arrival
    /// (a wake-up per few requests; the process reads the socket itself
    /// once its queue is drained).
    pub(crate) fn note_busy(&self, queued: usize) {
        if queued < BUSY_QUEUE {
            return;
        }
        let now = self.now();
        let was = self.busy_until.load(Ordering::Relaxed);
        // Store only a real change: the background thread reads this line.
        if now + BUSY_WINDOW_US > was + BUSY_WINDOW_US / 4 {
            self.busy_until
                .store(now + BUSY_WINDOW_US, Ordering::Relaxed);
            if was <= now {
                let c = &self.net.counters.busy_holds;
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Runs engine timers if one is due.
    pub(crate) fn run_timers_if_due(&self) {
        if self.now() >= self.next_timer.load(Ordering::Acquire) {
            self.with_engine(|_, _| ());
        }
    }

    /// Time until the next engine timer, capped.
    pub(crate) fn time_to_timer(&self, cap: Duration) -> Duration {
        let t = self.next_timer.load(Ordering::Acquire);
        let now = self.now();
        Duration::from_micros(t.saturating_sub(now)).min(cap)
    }

    /// Starts the thread that looks peer names up again, if there are
    /// names and it is not running. It holds the host weakly and is not
    /// joined: it ends at its next wake-up after the host stops.
    pub(crate) fn start_resolver(self: &Arc<Self>) -> std::io::Result<()> {
        if self.resolver.needs_thread() {
            let r = self.resolver.clone();
            let host = Arc::downgrade(self);
            std::thread::Builder::new()
                .name(format!("vk-{}-resolve", self.host))
                .spawn(move || r.run(host))?;
        }
        Ok(())
    }

    pub(super) fn background(self: Arc<Self>) {
        let mut last_spin = u64::MAX;
        while !self.stopping() {
            // Spinning now, or begun since the last look: a process between
            // two waits (in its Send's engine call, say) is not counted, but
            // it will be again in a moment.
            let spin = self.spinners.load(Ordering::Acquire);
            // (Not if the last one to stop was an async task going to
            // sleep: it will not read again soon, and waits for this
            // thread to read its answer.)
            let async_asleep = self.async_asleep.swap(false, Ordering::AcqRel);
            let spinning = spin & SPINNING != 0 || (spin != last_spin && !async_asleep);
            last_spin = spin;
            let left_to_busy = self
                .busy_until
                .load(Ordering::Relaxed)
                .saturating_sub(self.now());
            let idle_readers = !spinning && self.readers() == 0 && left_to_busy == 0;
            // An async task that got its answer stopped reading the socket
            // without waking this thread (it will likely read again in a
            // moment): look again soon rather than in 25 ms.
            let async_left = self.async_left.swap(false, Ordering::AcqRel);
            let mut cap = if idle_readers {
                Duration::from_millis(100)
            } else if async_left {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(25)
            };
            if self.net.has_faults() {
                cap = cap.min(Duration::from_millis(1));
            }
            // Processes spinning run due timers themselves (every 32nd
            // turn); waking for a timer then would only take a CPU from
            // them, and the timer is usually stale (a retransmission
            // deadline of an exchange answered long ago). A process that
            // stops spinning and blocks as a socket reader wakes for due
            // timers itself; otherwise one waits at most `cap` (25 ms).
            let mut timeout = if spinning && !self.net.has_faults() {
                cap
            } else {
                self.time_to_timer(cap)
            };
            // Held off the socket by a busy process: not woken by each
            // arrival, but still reading what waits every millisecond
            // (a slow server's queue may stay deep for long; the others'
            // datagrams, and a full pool's replyPending, must not wait
            // for it).
            if left_to_busy > 0 {
                timeout = timeout.min(Duration::from_micros(left_to_busy.min(BUSY_POLL_US)));
            }
            // Group messages by multicast arrive on their own socket, which
            // only this thread watches.
            let mfd = self.net.mcast_fd();
            let r = if idle_readers {
                poll3(self.bg_efd.fd(), Some(self.net.fd()), mfd, timeout)
            } else {
                poll3(self.bg_efd.fd(), mfd, None, timeout)
            };
            if r[0] || !idle_readers {
                self.bg_efd.drain();
            }
            let mcast_ready = if idle_readers {
                r[2]
            } else {
                r[1] && mfd.is_some()
            };
            if self.readers() == 0 || mcast_ready {
                let n = self.poll_socket(256);
                let c = &self.net.counters.background_reads;
                c.fetch_add(n as u64, Ordering::Relaxed);
            }
            self.run_timers_if_due();
            self.net.flush_due();
            if let Some(t) = &self.tracer {
                t.flush();
            }
        }
    }
}

/// Messages queued behind the one a process takes from which the
/// background thread leaves the socket to it ([`Shared::note_busy`]).
/// Below, the hold costs more than it saves: with a few clients the
/// background thread's reads are rare, and in this VM the hold made every
/// exchange dearer (BENCHMARKS.md, 2026-11-28 late and 2026-11-29).
const BUSY_QUEUE: usize = 16;

/// How long (µs) one such request holds the background thread off; each
/// later one renews it. Datagrams wait unread at most [`BUSY_POLL_US`]
/// meanwhile.
const BUSY_WINDOW_US: u64 = 5_000;

/// While held off, the background thread still reads the socket this
/// often (µs): one wake-up per millisecond instead of one per few
/// requests.
pub(super) const BUSY_POLL_US: u64 = 1_000;
