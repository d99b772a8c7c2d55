//! How long a waiting process busy-polls before it blocks.
//!
//! Spinning pays when the answer comes sooner than a blocked thread can be
//! woken (tens of µs across CPUs in a VM) and a CPU is free to spin on; it
//! costs when waits are long or when the spinner takes the CPU that the
//! work it waits for needs. A fixed budget gets one of those wrong: 50 µs
//! halves a loaded NBD gateway's throughput, and two hosts that each spin
//! a little less than a wake-up takes fall into lockstep where every
//! exchange pays two wake-ups (after one lost datagram, for good).
//!
//! The adaptive policy ([`SpinPolicy::adaptive`]) decides per process from
//! what it saw (all deterministic, unit-tested below):
//! - **hits vs misses**: a score rises with each wait that ended within
//!   the cap (spinning would have caught it) and falls with each that did
//!   not; below a threshold the process blocks at once;
//! - **how long to spin**: twice a decaying maximum of recent waits,
//!   between a floor and the cap, so after a long wait (a loss, an idle
//!   gap) it spins the whole cap for a while and two processes that fell
//!   out of step catch each other again;
//! - **CPUs**: no more spinners on a host than CPUs, and none while the
//!   machine has more runnable threads than CPUs ([`RunQueue`]): then a
//!   spinner only takes a CPU from a thread with work to do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The cap `--spin auto` uses.
pub const AUTO_SPIN_CAP: Duration = Duration::from_micros(1000);

/// The least an adaptive spin lasts once it spins at all: about a wake-up.
const FLOOR_US: u64 = 50;
/// Score bounds: spinning is on at or above `SCORE_ON`.
const SCORE_MAX: u8 = 32;
const SCORE_ON: u8 = 16;
/// What a wait longer than the cap takes off the score.
const LONG_WAIT_PENALTY: u8 = 2;

/// A process's waiting strategy and what it has learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpinPolicy {
    adaptive: bool,
    /// Fixed budget, or the adaptive cap, in µs.
    cap_us: u64,
    /// Decaying maximum of recent waits (µs, at most 4 × cap).
    est_us: u64,
    score: u8,
}

impl SpinPolicy {
    /// Always spin `d` (zero: always block).
    pub(crate) fn fixed(d: Duration) -> SpinPolicy {
        SpinPolicy {
            adaptive: false,
            cap_us: micros(d),
            est_us: 0,
            score: 0,
        }
    }

    /// Spin at most `cap`, as long as spinning pays.
    pub(crate) fn adaptive(cap: Duration) -> SpinPolicy {
        let cap_us = micros(cap);
        SpinPolicy {
            adaptive: true,
            cap_us,
            // Start as a fixed spin would: spinning, a floor's worth.
            est_us: FLOOR_US / 2,
            score: SCORE_MAX,
        }
    }

    /// Is the budget learned (rather than fixed)?
    pub(crate) fn is_adaptive(&self) -> bool {
        self.adaptive
    }

    /// Would the next wait spin, CPUs allowing? (Asked before
    /// [`SpinPolicy::budget_us`] to skip sampling the run queue.)
    pub(crate) fn wants_to_spin(&self) -> bool {
        self.cap_us > 0 && (!self.adaptive || self.score >= SCORE_ON)
    }

    /// How long the next wait may spin (µs), given how many threads of
    /// the host already spin, how many CPUs there are, and whether more
    /// threads are runnable than CPUs.
    pub(crate) fn budget_us(&self, spinners: u64, cpus: u64, contended: bool) -> u64 {
        if !self.adaptive {
            return self.cap_us;
        }
        if self.score < SCORE_ON || spinners >= cpus || contended {
            return 0;
        }
        self.est_us
            .saturating_mul(2)
            .clamp(FLOOR_US.min(self.cap_us), self.cap_us)
    }

    /// Whether a spin of `budget_us` by this policy yields its CPU now and
    /// then ([`Spin::again`]): an adaptive budget raised by a long wait (at
    /// least [`YIELD_BUDGET_US`]). The peer it waits for may then be
    /// queued behind it on this CPU (a thread woken by this one's datagram
    /// is often placed on the waker's CPU), and a spinner that never
    /// yields holds it off for the whole budget: after each loss two hosts
    /// fell into a lockstep of 1 ms a datagram. Steady short waits (and a
    /// stray one of tens of µs) keep the budget low: two spinners on
    /// separate CPUs pay no syscalls for nothing (yielding at any raised
    /// budget doubled the p99 of a clean ping). A fixed spin is the
    /// user's choice and never yields (at 500 µs it made a remote
    /// exchange 2.5× slower).
    pub(crate) fn yields_at(&self, budget_us: u64) -> bool {
        self.adaptive && budget_us >= YIELD_BUDGET_US
    }

    /// Learns from a finished wait: how long it lasted.
    pub(crate) fn record(&mut self, waited_us: u64) {
        if !self.adaptive {
            return;
        }
        let w = waited_us.min(self.cap_us.saturating_mul(4));
        self.est_us = w.max(self.est_us - self.est_us / 8);
        self.score = if waited_us <= self.cap_us {
            (self.score + 1).min(SCORE_MAX)
        } else {
            self.score.saturating_sub(LONG_WAIT_PENALTY)
        };
    }
}

/// One wait's spin: the turns of every busy-polling wait of the crate
/// (a call slot's or peer page's futex word, an embedded process's
/// completion and socket, a direct Send's datagrams, an async operation's
/// poll) are paced here, so they share one rule for how long to spin,
/// when to look at the clock and when to give the CPU away. What a turn
/// looks at, and how the wait blocks after, is the waiter's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spin {
    start: u64,
    budget_us: u64,
    may_yield: bool,
    /// The clock and the run queue are looked at when `turn & mask` is 0
    /// (every 64th turn, or every `costly_turns`-th; a power of two, so no
    /// division on a turn).
    mask: u32,
    /// Each turn makes a system call (or a task's poll): no pause after
    /// it, and a crowded machine stops the spin (else it yields).
    costly: bool,
    turn: u32,
}

impl Spin {
    /// A wait begun at `start` (µs) by a process with `policy`, with
    /// `spinners` of its host already spinning on `cpus` CPUs; `contended`
    /// says whether more threads are runnable than CPUs (asked only of an
    /// adaptive policy that would spin).
    pub(crate) fn begin(
        policy: &SpinPolicy,
        start: u64,
        spinners: u64,
        cpus: u64,
        contended: impl FnOnce() -> bool,
    ) -> Spin {
        let budget_us = if policy.wants_to_spin() {
            let busy = policy.is_adaptive() && contended();
            policy.budget_us(spinners, cpus, busy)
        } else {
            0
        };
        Spin {
            start,
            budget_us,
            may_yield: policy.yields_at(budget_us),
            mask: 63,
            costly: false,
            turn: 0,
        }
    }

    /// Turns that each make a system call (or are a task's poll): the
    /// clock and the run queue are looked at every `n`-th (rounded up to a
    /// power of two), a turn does not pause, and a crowded machine stops
    /// the spin (the answer wakes a blocked reader as soon as a spinning
    /// one).
    pub(crate) fn costly_turns(mut self, n: u32) -> Spin {
        self.mask = n.max(1).next_power_of_two() - 1;
        self.costly = true;
        self
    }

    /// When the wait began (µs).
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// How long it may spin (µs); 0: it blocks at once.
    pub(crate) fn budget_us(&self) -> u64 {
        self.budget_us
    }

    /// Empty looks so far.
    pub(crate) fn turns(&self) -> u32 {
        self.turn
    }

    /// After an empty look: whether to look again (having paused, or
    /// given the CPU away), or stop spinning and block. `now` reads the
    /// clock (µs) and `contended` says whether more threads are runnable
    /// than CPUs; both are asked only every few turns. A spin whose
    /// budget was raised by a long wait ([`SpinPolicy::yields_at`])
    /// yields every 16th turn: the peer it waits for may be queued behind
    /// it on this CPU.
    #[inline]
    pub(crate) fn again(
        &mut self,
        now: impl FnOnce() -> u64,
        contended: impl FnOnce(u64) -> bool,
    ) -> bool {
        self.again_after(false, now, contended)
    }

    /// [`Spin::again`] after a look that made a system call (`called`):
    /// then no pause (it has waited long enough).
    #[inline]
    pub(crate) fn again_after(
        &mut self,
        called: bool,
        now: impl FnOnce() -> u64,
        contended: impl FnOnce(u64) -> bool,
    ) -> bool {
        if self.budget_us == 0 {
            return false;
        }
        self.turn = self.turn.wrapping_add(1);
        if self.turn & self.mask == 0 {
            let t = now();
            if t.saturating_sub(self.start) >= self.budget_us {
                return false;
            }
            // More runnable threads than CPUs: the answerer is often one
            // waiting for a CPU (a server, the host's proxy); let it run.
            // Not otherwise: two spinners the scheduler put on one CPU
            // would yield to each other for good instead of being spread
            // by the idle CPU's load balancing.
            if contended(t) {
                if self.costly {
                    return false;
                }
                std::thread::yield_now();
                return true;
            }
        }
        if self.may_yield && self.turn.is_multiple_of(16) {
            std::thread::yield_now();
        } else if !self.costly && !called {
            std::hint::spin_loop();
        }
        true
    }

    /// Teaches `policy` how long the wait (spin and block) took, ending
    /// at `now`.
    pub(crate) fn end(&self, policy: &mut SpinPolicy, now: u64) {
        policy.record(now.saturating_sub(self.start));
    }
}

/// The least budget at which a spin yields ([`SpinPolicy::yields_at`]).
const YIELD_BUDGET_US: u64 = 10 * FLOOR_US;

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX / 8)) as u64
}

/// Samples how many threads the machine has runnable (the `R` of
/// `/proc/loadavg`'s `R/T` field), at most once per [`SAMPLE_GAP_US`],
/// smoothed: more runnable threads than CPUs means a spinner takes a CPU
/// that another thread is waiting for.
pub(crate) struct RunQueue {
    file: Option<std::fs::File>,
    next_sample: AtomicU64,
    /// Exponentially weighted mean of the samples, × 16.
    mean_x16: AtomicU64,
}

/// Least time between two samples of the run queue (µs).
pub(crate) const SAMPLE_GAP_US: u64 = 1000;

impl RunQueue {
    pub(crate) fn new() -> RunQueue {
        RunQueue {
            file: std::fs::File::open("/proc/loadavg").ok(),
            next_sample: AtomicU64::new(0),
            mean_x16: AtomicU64::new(0),
        }
    }

    /// Are more threads runnable than there are CPUs (on average, lately)?
    /// `now` is in µs; one caller per gap reads the file, the rest use the
    /// last mean. Without `/proc` it never says so.
    pub(crate) fn contended(&self, now: u64, cpus: u64) -> bool {
        let next = self.next_sample.load(Ordering::Relaxed);
        if now >= next
            && self
                .next_sample
                .compare_exchange(
                    next,
                    now + SAMPLE_GAP_US,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            if let Some(r) = self.read() {
                let m = self.mean_x16.load(Ordering::Relaxed);
                self.mean_x16.store(smooth(m, r), Ordering::Relaxed);
            }
        }
        over(self.mean_x16.load(Ordering::Relaxed), cpus)
    }

    fn read(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let n = self.file.as_ref()?.read_at(&mut buf, 0).ok()?;
        running(std::str::from_utf8(&buf[..n]).ok()?)
    }
}

/// The runnable count of a `/proc/loadavg` line (`0.5 0.3 0.1 2/81 123`).
fn running(line: &str) -> Option<u64> {
    line.split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// The mean (× 16) after one more sample: an eighth of the way to it.
fn smooth(mean_x16: u64, sample: u64) -> u64 {
    (mean_x16 * 7 + sample.min(1 << 20) * 16) / 8
}

/// Do the other runnable threads (the sample counts the thread taking it,
/// which is about to wait) keep every CPU busy on average? Then a spinner
/// takes a CPU from a thread with work. (A client and the server it just
/// woke make two; a loaded gateway on two CPUs samples four.)
fn over(mean_x16: u64, cpus: u64) -> bool {
    mean_x16 >= (cpus + 1) * 16
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_micros(1000);

    #[test]
    fn fixed_spins_its_budget_whatever_happens() {
        let mut p = SpinPolicy::fixed(Duration::from_micros(50));
        for _ in 0..100 {
            p.record(1_000_000);
        }
        assert_eq!(p.budget_us(5, 2, false), 50);
        assert_eq!(SpinPolicy::fixed(Duration::ZERO).budget_us(0, 2, false), 0);
    }

    #[test]
    fn short_waits_keep_a_floor_spin() {
        let mut p = SpinPolicy::adaptive(CAP);
        assert_eq!(p.budget_us(0, 2, false), FLOOR_US);
        for _ in 0..100 {
            p.record(8);
        }
        assert_eq!(p.budget_us(0, 2, false), FLOOR_US);
    }

    #[test]
    fn after_a_long_wait_it_spins_the_whole_cap_then_settles() {
        let mut p = SpinPolicy::adaptive(CAP);
        for _ in 0..50 {
            p.record(8);
        }
        // A lost datagram: the wait lasted a retransmission timeout.
        p.record(6_000);
        assert_eq!(p.budget_us(0, 2, false), 1000, "catch the peer up");
        // Two peers out of step: each wait is about two wake-ups.
        for _ in 0..3 {
            p.record(150);
            assert_eq!(p.budget_us(0, 2, false), 1000);
        }
        // Back in step: the budget decays to the floor again.
        for _ in 0..60 {
            p.record(8);
        }
        assert_eq!(p.budget_us(0, 2, false), FLOOR_US);
    }

    #[test]
    fn mostly_long_waits_stop_the_spinning_and_short_ones_restart_it() {
        let mut p = SpinPolicy::adaptive(CAP);
        // An idle server: requests seconds apart.
        let mut n = 0;
        while p.budget_us(0, 2, false) > 0 {
            p.record(2_000_000);
            n += 1;
            assert!(n < 100);
        }
        assert_eq!(n, 9, "(32 - 16) / 2 + 1 long waits");
        for _ in 0..10 {
            p.record(2_000_000);
        }
        // Back to a busy client: spinning resumes after SCORE_ON short waits.
        let mut k = 0;
        while p.budget_us(0, 2, false) == 0 {
            p.record(20);
            k += 1;
            assert!(k < 100);
        }
        assert_eq!(k, 16);
    }

    #[test]
    fn a_lossy_link_keeps_spinning_but_mostly_long_waits_do_not() {
        // One exchange in four loses a datagram and waits a retransmission
        // timeout; the other three are quick: spinning still pays.
        let mut p = SpinPolicy::adaptive(CAP);
        for i in 0..400 {
            p.record(if i % 4 == 3 { 6_000 } else { 20 });
            assert!(p.budget_us(0, 2, false) > 0, "stopped after {i} waits");
        }
        // One in two long: it stops.
        for i in 0..400 {
            p.record(if i % 2 == 1 { 6_000 } else { 20 });
        }
        assert_eq!(p.budget_us(0, 2, false), 0);
    }

    #[test]
    fn a_crowded_machine_stops_the_spinning() {
        let p = SpinPolicy::adaptive(CAP);
        assert!(p.budget_us(0, 2, false) > 0);
        assert_eq!(p.budget_us(0, 2, true), 0);
        // A fixed spin is the user's explicit choice.
        assert_eq!(SpinPolicy::fixed(CAP).budget_us(0, 2, true), 1000);
    }

    #[test]
    fn no_more_spinners_than_cpus() {
        let p = SpinPolicy::adaptive(CAP);
        assert!(p.budget_us(1, 2, false) > 0);
        assert_eq!(p.budget_us(2, 2, false), 0);
        assert_eq!(p.budget_us(1, 1, false), 0);
    }

    /// Turns `spin` takes before it stops, the clock advancing `step` µs
    /// a look and the run queue `contended` (at most `limit`).
    fn turns_until_stop(mut spin: Spin, step: u64, contended: bool, limit: u32) -> u32 {
        let clock = std::cell::Cell::new(spin.start());
        let mut looks = 0;
        while looks < limit {
            clock.set(clock.get() + step);
            if !spin.again(|| clock.get(), |_| contended) {
                break;
            }
            looks += 1;
        }
        looks
    }

    #[test]
    fn one_spin_paces_every_wait() {
        let fixed = |us| SpinPolicy::fixed(Duration::from_micros(us));
        // A zero budget blocks at once, and never asks the clock.
        let mut z = Spin::begin(&fixed(0), 0, 0, 2, || panic!("not asked"));
        assert!(!z.again(|| panic!("no clock"), |_| panic!("no run queue")));
        // The budget ends it: the clock is read every 64th look.
        let s = Spin::begin(&fixed(100), 1_000, 0, 2, || false);
        assert_eq!(s.budget_us(), 100);
        let n = turns_until_stop(s, 1, false, 10_000);
        assert_eq!(n, 127, "stops at the first 64th look past 100 µs");
        // Costly turns look every n-th.
        let n = turns_until_stop(s.costly_turns(8), 10, false, 10_000);
        assert_eq!(n, 15, "stops at the 16th look, 160 µs in");
        // Crowded: a cheap spin yields and goes on; a costly one stops.
        assert_eq!(turns_until_stop(s, 0, true, 1_000), 1_000);
        assert_eq!(turns_until_stop(s.costly_turns(8), 0, true, 1_000), 7);
        // An adaptive policy asks the run queue, and spins nothing when
        // crowded; with more spinners than CPUs too.
        let a = SpinPolicy::adaptive(CAP);
        assert_eq!(Spin::begin(&a, 0, 0, 2, || true).budget_us(), 0);
        assert_eq!(Spin::begin(&a, 0, 2, 2, || false).budget_us(), 0);
        assert_eq!(Spin::begin(&a, 0, 0, 2, || false).budget_us(), FLOOR_US);
        // It learns from the whole wait.
        let mut p = SpinPolicy::adaptive(CAP);
        Spin::begin(&p, 0, 0, 2, || false).end(&mut p, 6_000);
        assert_eq!(Spin::begin(&p, 0, 0, 2, || false).budget_us(), 1000);
    }

    #[test]
    fn a_spin_yields_only_when_its_budget_grew() {
        let p = SpinPolicy::adaptive(CAP);
        assert!(!p.yields_at(FLOOR_US));
        assert!(!p.yields_at(YIELD_BUDGET_US - 1));
        assert!(p.yields_at(YIELD_BUDGET_US));
        // A lost datagram raises the budget to the cap: it yields then.
        let mut p = SpinPolicy::adaptive(CAP);
        p.record(6_000);
        assert!(p.yields_at(p.budget_us(0, 2, false)));
        // A stray wait of a few hundred µs does not.
        let mut p = SpinPolicy::adaptive(CAP);
        p.record(200);
        assert!(!p.yields_at(p.budget_us(0, 2, false)));
        // Nor does a fixed spin, however long.
        let p = SpinPolicy::fixed(CAP);
        assert!(!p.yields_at(p.budget_us(0, 2, false)));
    }

    #[test]
    fn a_cap_below_the_floor_is_the_budget() {
        let p = SpinPolicy::adaptive(Duration::from_micros(10));
        assert_eq!(p.budget_us(0, 2, false), 10);
    }

    #[test]
    fn the_run_queue_is_read_from_loadavg_and_smoothed() {
        assert_eq!(running("1.76 0.84 0.44 3/81 5551\n"), Some(3));
        assert_eq!(running("garbage"), None);
        assert_eq!(running("1 2 3 x/4 5"), None);
        // Two CPUs: the sampler and its peer, with a third thread half the
        // time, is not crowded; four runnable (a loaded gateway) is.
        let mut m = 0;
        for i in 0..200 {
            m = smooth(m, 2 + i % 2);
            assert!(!over(m, 2));
        }
        m = smooth(m, 6);
        assert!(!over(m, 2), "one sample is noise");
        for _ in 0..20 {
            m = smooth(m, 4);
        }
        assert!(over(m, 2));
        // The live file parses (this runs on Linux).
        let q = RunQueue::new();
        assert!(q.read().is_some_and(|r| r >= 1), "this thread is runnable");
        let _ = q.contended(0, 2);
    }
}
