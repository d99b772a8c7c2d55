//! Waiting for the other side of a call slot: spin while the policy says
//! spinning pays, then block on a futex. Used alike by a program waiting
//! for its result and by the host's proxy waiting for the next request.

use crate::deadline::Deadline;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::clock::Clock;
use crate::spin::{RunQueue, Spin, SpinPolicy};

use super::shm::{futex_wait, futex_wake};

/// The longest one futex wait lasts before `gone` is asked again: a safety
/// net only, since whoever makes `gone` true also wakes the word (the
/// connection thread a proxy's `req`, the answer reader a program's
/// `done`), so a thousand idle processes cost no wake-ups.
const SLICE: Duration = Duration::from_millis(500);

/// How a wait ended.
pub(crate) enum Waited {
    /// The word changed without blocking.
    Spun,
    /// The word changed after blocking.
    Blocked,
    /// `gone` said stop.
    Gone,
    /// The spin ended and the caller said not to block ([`OnBlock::Return`]).
    NotYet,
}

/// Work a spinning wait does now and then (an embedded host's thread in
/// its inbox reads the host's socket when nobody else does).
pub(crate) trait Tick {
    /// Called every [`TICK_SPINS`] turns of a spin.
    fn tick(&self);
}

/// Turns of a spin between two [`Tick::tick`]s (a few µs).
const TICK_SPINS: u32 = 1024;

/// What a wait does when it stops spinning.
#[derive(Clone, Copy)]
pub(crate) enum OnBlock<'a> {
    /// Blocks on the word.
    Block,
    /// Signals the eventfd, then blocks (an embedded host's thread tells
    /// its background thread that it no longer looks at the socket).
    Nudge(&'a crate::sys::EventFd),
    /// Returns [`Waited::NotYet`]: the caller blocks some other way.
    Return,
}

/// What a side needs to decide how to wait.
pub(crate) struct Pace {
    pub(crate) clock: Clock,
    pub(crate) run_queue: RunQueue,
    pub(crate) cpus: u64,
}

impl Pace {
    pub(crate) fn new() -> Pace {
        Pace {
            clock: Clock::new(),
            run_queue: RunQueue::new(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        }
    }

    /// Waits until `word` no longer holds `old`, spinning first as
    /// `policy` allows, and teaches `policy` how long the wait took.
    /// `parked` is this side's flag that asks the other for a wake-up.
    pub(crate) fn wait(
        &self,
        word: &AtomicU32,
        parked: &AtomicU32,
        old: u32,
        policy: &mut SpinPolicy,
        gone: impl Fn() -> bool,
    ) -> Waited {
        self.wait_until(
            word,
            parked,
            old,
            policy,
            gone,
            Deadline::NONE,
            OnBlock::Block,
            None,
        )
    }

    /// [`Pace::wait`] that also ends (as `Gone`) at `deadline`, a time of
    /// `self.clock` in µs, and does as `on_block` says when it stops
    /// spinning.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn wait_until(
        &self,
        word: &AtomicU32,
        parked: &AtomicU32,
        old: u32,
        policy: &mut SpinPolicy,
        gone: impl Fn() -> bool,
        deadline: Deadline,
        on_block: OnBlock<'_>,
        tick: Option<&dyn Tick>,
    ) -> Waited {
        if word.load(Ordering::Acquire) != old {
            return Waited::Spun;
        }
        // (The clock is read only for a deadline.)
        let gone = || gone() || deadline.at().is_some_and(|d| self.clock.now() >= d);
        if !policy.is_adaptive() && !policy.wants_to_spin() {
            // Told never to spin: block at once (a zero budget still
            // spins a little below, which "block" must not; an adaptive
            // policy goes on below, to keep learning).
            return self.stop_spinning(word, parked, old, &gone, deadline, on_block);
        }
        let start = self.clock.now();
        let contended = |t| self.run_queue.contended(t, self.cpus);
        let mut spin = Spin::begin(policy, start, 0, self.cpus, || contended(start));
        let r = loop {
            if word.load(Ordering::Acquire) != old {
                break Waited::Spun;
            }
            let mut go_on = spin.again(|| self.clock.now(), contended);
            // (Every 64th turn: the turn that finds the word changed stays
            // a load and a compare.)
            let i = spin.turns();
            if go_on && i.is_multiple_of(64) {
                if let Some(t) = tick.filter(|_| i.is_multiple_of(TICK_SPINS)) {
                    t.tick();
                }
                go_on = !gone();
            }
            if !go_on {
                break self.stop_spinning(word, parked, old, &gone, deadline, on_block);
            }
        };
        spin.end(policy, self.clock.now());
        r
    }

    fn stop_spinning(
        &self,
        word: &AtomicU32,
        parked: &AtomicU32,
        old: u32,
        gone: &impl Fn() -> bool,
        deadline: Deadline,
        on_block: OnBlock<'_>,
    ) -> Waited {
        match on_block {
            OnBlock::Return if !gone() => return Waited::NotYet,
            OnBlock::Nudge(n) => n.signal(),
            _ => {}
        }
        self.block(word, parked, old, gone, deadline)
    }

    fn block(
        &self,
        word: &AtomicU32,
        parked: &AtomicU32,
        old: u32,
        gone: &impl Fn() -> bool,
        deadline: Deadline,
    ) -> Waited {
        loop {
            if gone() {
                return Waited::Gone;
            }
            parked.store(1, Ordering::SeqCst);
            if word.load(Ordering::SeqCst) != old {
                parked.store(0, Ordering::Relaxed);
                return Waited::Blocked;
            }
            let slice = deadline
                .left(self.clock.now())
                .map_or(SLICE, |d| SLICE.min(d));
            futex_wait(word, old, slice);
            parked.store(0, Ordering::Relaxed);
            if word.load(Ordering::Acquire) != old {
                return Waited::Blocked;
            }
        }
    }
}

/// Publishes `val` in `word` and wakes the other side if it blocked.
pub(crate) fn publish(word: &AtomicU32, parked: &AtomicU32, val: u32) {
    word.store(val, Ordering::SeqCst);
    if parked.load(Ordering::SeqCst) != 0 {
        futex_wake(word);
    }
}
