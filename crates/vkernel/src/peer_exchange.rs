//! A Send and a plain Receive through peer pages (`attach/peer.rs`), for
//! any process that has one: an attached program's process (its page is
//! shared memory) and a thread's process of an embedded host (its page is
//! on the heap). Both run this one mechanism: the same claim, the same
//! wait, the same withdrawal at a deadline; each kind of process only
//! says where pages are, when it is gone, and what it counts.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use vkernel_proto::{IpcError, Message, Pid};

use crate::attach::peer::{self, Inbound, Outcome, Peer};
use crate::attach::wait::{OnBlock, Pace, Tick, Waited};
use crate::deadline::Deadline;
use crate::spin::SpinPolicy;
use crate::vocab::{Reply, WaitCounts};

/// Other processes' pages a process remembers at most (beyond, it
/// forgets them all).
const PAGE_CACHE: usize = 1024;

/// The pages of other processes a process has looked up, by pid (None:
/// that process has none for it).
pub(crate) struct Pages<T>(RefCell<HashMap<Pid, Option<T>>>);

impl<T: Clone> Pages<T> {
    /// None looked up yet.
    pub(crate) fn new() -> Pages<T> {
        Pages(RefCell::new(HashMap::new()))
    }

    /// `pid`'s page, fetched once.
    pub(crate) fn get(&self, pid: Pid, fetch: impl FnOnce() -> Option<T>) -> Option<T> {
        if let Some(v) = self.0.borrow().get(&pid) {
            return v.clone();
        }
        let v = fetch();
        let mut m = self.0.borrow_mut();
        if m.len() >= PAGE_CACHE {
            m.clear();
        }
        m.insert(pid, v.clone());
        v
    }

    /// Forgets `pid`'s page (it died).
    pub(crate) fn forget(&self, pid: Pid) {
        self.0.borrow_mut().remove(&pid);
    }
}

/// Whether `me`, a process of `host`, may send to `to` through a peer
/// page: another process of the same host (not a group, not itself).
pub(crate) fn reachable(me: Pid, host: vkernel_proto::HostId, to: Pid) -> bool {
    to.host() == host && to.is_process() && to != me
}

/// What a Send through a peer page came to, for its caller.
pub(crate) enum PeerSend {
    /// Replied to, or failed.
    Done(Result<Reply, IpcError>),
    /// The receiver forwarded it: send it on to `to` as from `forwarder`.
    Forwarded { to: Pid, forwarder: Pid },
    /// Not this way: through the host's engine.
    NotHere,
}

/// How long a sender spins for a busy receiver's inbox to open before it
/// lets the engine queue its message.
const CLAIM_SPIN: Duration = Duration::from_micros(20);

/// How often a sender that does not spin yields its CPU for a busy
/// receiver's inbox to open before it lets the engine queue its message.
const CLAIM_YIELDS: u32 = 4;

/// The waiting side of a process: how it waits and what it learned.
pub(crate) struct Side<'a> {
    /// Its clock, run queue and CPUs.
    pub(crate) pace: &'a Pace,
    /// Its spin policy.
    pub(crate) spin: &'a Cell<SpinPolicy>,
    /// How its waits ended.
    pub(crate) waits: &'a Cell<WaitCounts>,
    /// Where to count hand-offs (a message that woke a blocked
    /// receiver), if its host counts them here.
    pub(crate) handoffs: Option<&'a std::sync::atomic::AtomicU64>,
    /// What a sender's wait for its answer does when it stops spinning.
    pub(crate) on_block: OnBlock<'a>,
    /// Whether a Receive blocks in the inbox (else it closes the inbox and
    /// receives through the engine, which blocks as the host's socket
    /// reader, when its spin ends).
    pub(crate) block_in_inbox: bool,
    /// What a Receive spinning in the inbox does now and then.
    pub(crate) tick: Option<&'a dyn Tick>,
}

impl Side<'_> {
    /// Counts a hand-off if `parked` says the other side blocked.
    pub(crate) fn handed_off(&self, parked: &std::sync::atomic::AtomicU32) {
        if let Some(h) = self.handoffs {
            if parked.load(Ordering::Relaxed) != 0 {
                h.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// What a Send through a peer page came to.
pub(crate) enum Sent {
    /// The receiver does not wait in its inbox (`dead`: it never will).
    NotHere { dead: bool },
    /// Ended: replied, failed or forwarded.
    Ended(Outcome),
    /// The receiver died before taking it.
    NoSuchProcess,
    /// The deadline passed before the receiver took it (withdrawn).
    Deadline,
    /// The caller went (`gone`) meanwhile.
    Gone(IpcError),
}

impl Sent {
    /// How the exchange with `to` ended, if it went through the page;
    /// else Err(None) (send through the engine) or the error. A dead
    /// page is forgotten from `pages`.
    pub(crate) fn outcome<T: Clone>(
        self,
        to: Pid,
        pages: &Pages<T>,
    ) -> Result<Outcome, Option<IpcError>> {
        match self {
            Sent::Ended(how) => Ok(how),
            Sent::NotHere { dead } => {
                if dead {
                    pages.forget(to);
                }
                Err(None)
            }
            Sent::NoSuchProcess => {
                pages.forget(to);
                Err(Some(IpcError::NoSuchProcess(to)))
            }
            Sent::Deadline => Err(Some(IpcError::Deadline(to))),
            Sent::Gone(e) => Err(Some(e)),
        }
    }
}

/// Sends `msg` as `me` (exchange `seq`, `principal`, forwarded by `fwd`)
/// into the inbox `to_page` of `to`, if it waits there, and waits in
/// `mine`'s reply area for the answer. `gone` says why to stop waiting.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send(
    side: &Side<'_>,
    mine: &Peer,
    to_page: &Peer,
    me: Pid,
    to: Pid,
    seq: u32,
    principal: u32,
    fwd: Pid,
    msg: &Message,
    deadline: Deadline,
    gone: impl Fn() -> Option<IpcError>,
) -> Sent {
    let p = to_page;
    mine.rpeer.store(to.0, Ordering::Relaxed);
    mine.rst
        .store(peer::rst(seq, peer::WAITING), Ordering::SeqCst);
    if !claim_soon(side, p, me) {
        mine.rst.store(peer::rst(seq, peer::IDLE), Ordering::SeqCst);
        return Sent::NotHere {
            dead: p.tag() == peer::DEAD,
        };
    }
    // As the engine does for a Send without a segment: no segment flags,
    // and words 6 and 7 (the kernel's segment words) zero.
    let mut out = *msg;
    out.set_segment(vkernel_proto::SegAccess::NONE, 0);
    if !p.fill(me, seq, principal, fwd, &out) {
        mine.rst.store(peer::rst(seq, peer::IDLE), Ordering::SeqCst);
        return Sent::NoSuchProcess;
    }
    side.handed_off(&p.rx_parked);
    let mut policy = side.spin.get();
    let mut w = side.waits.get();
    let mut deadline = deadline;
    let r = loop {
        let r = mine.rst.load(Ordering::Acquire);
        let state = r & 7;
        if r >> 3 != seq || !matches!(state, peer::WAITING | peer::REPLYING) {
            break Sent::Ended(mine.outcome(state));
        }
        match side.pace.wait_until(
            &mine.rst,
            &mine.tx_parked,
            r,
            &mut policy,
            || gone().is_some(),
            deadline,
            side.on_block,
            None,
        ) {
            Waited::Spun | Waited::NotYet => w.unblocked += 1,
            Waited::Blocked => w.blocked += 1,
            Waited::Gone => {
                // Abandon the exchange, unless its answer is already being
                // written (then it is taken, as the engine takes a reply
                // that beat the deadline).
                let cancelled = mine
                    .rst
                    .compare_exchange(
                        peer::rst(seq, peer::WAITING),
                        peer::rst(seq, peer::IDLE),
                        Ordering::SeqCst,
                        Ordering::Relaxed,
                    )
                    .is_ok();
                if let Some(e) = gone() {
                    break Sent::Gone(e);
                }
                if cancelled {
                    // Not taken yet? Then the receiver never sees it.
                    p.withdraw(me);
                    break Sent::Deadline;
                }
                deadline = Deadline::NONE;
            }
        }
    };
    side.spin.set(policy);
    side.waits.set(w);
    r
}

/// Claims `p`'s inbox for `me`, waiting a little for a receiver that is
/// busy but will soon receive again (a server between Reply and Receive).
fn claim_soon(side: &Side<'_>, p: &Peer, me: Pid) -> bool {
    if p.claim(me) {
        return true;
    }
    let policy = side.spin.get();
    let spin = policy.wants_to_spin();
    // An adaptive policy that stopped spinning has learned that waits here
    // are long: go through the engine at once, as before.
    if !spin && policy.is_adaptive() {
        return false;
    }
    let clock = &side.pace.clock;
    let start = clock.now();
    let limit = CLAIM_SPIN.as_micros() as u64;
    let mut i: u32 = 0;
    // Only while the receiver is busy and nothing queues ahead of us.
    while p.tag() == peer::CLOSED && p.queued.load(Ordering::Relaxed) == 0 {
        i = i.wrapping_add(1);
        if !spin {
            // Told not to spin, but the receiver may be one this thread's
            // wake-up preempted on this CPU just before it opened its
            // inbox: let it run, briefly. (Without this, most blocking
            // exchanges went through the host.)
            if i > CLAIM_YIELDS {
                return false;
            }
            std::thread::yield_now();
            continue;
        }
        if i.is_multiple_of(64) && clock.now().saturating_sub(start) >= limit {
            return false;
        }
        std::hint::spin_loop();
    }
    p.claim(me)
}

/// A plain Receive through the inbox `p`, unless messages wait in the
/// engine. None: receive through the engine (a message waits there, or
/// the inbox was closed for one meanwhile).
pub(crate) fn receive(
    side: &Side<'_>,
    p: &Peer,
    gone: impl Fn() -> Option<IpcError>,
) -> Option<Result<Inbound, IpcError>> {
    if p.queued.load(Ordering::SeqCst) != 0 {
        return None;
    }
    let mut bell = p.bell.load(Ordering::SeqCst);
    if !p.open() {
        return (p.tag() == peer::DEAD).then(|| Err(p.dead_error()));
    }
    // A message the engine queued meanwhile goes first (whoever queues one
    // closes an open inbox; this covers the moment before).
    if p.queued.load(Ordering::SeqCst) != 0 && p.close_if_open() {
        return None;
    }
    let mut policy = side.spin.get();
    let mut w = side.waits.get();
    let r = loop {
        match p.tag() {
            peer::OPEN | peer::CLAIMED => {
                // A message queued in the engine while the inbox could not
                // be closed (claimed by a sender that then died, or whose
                // deadline withdrew its message) goes first: the engine
                // closed nothing, and the inbox is open again.
                if p.queued.load(Ordering::SeqCst) != 0 && p.close_if_open() {
                    break None;
                }
                match side.pace.wait_until(
                    &p.bell,
                    &p.rx_parked,
                    bell,
                    &mut policy,
                    || gone().is_some(),
                    Deadline::NONE,
                    if side.block_in_inbox {
                        side.on_block
                    } else {
                        OnBlock::Return
                    },
                    side.tick,
                ) {
                    Waited::Spun => w.unblocked += 1,
                    Waited::Blocked => w.blocked += 1,
                    // Nothing came while it spun: through the engine,
                    // unless a sender has claimed the inbox meanwhile.
                    Waited::NotYet => {
                        if p.close_if_open() {
                            break None;
                        }
                    }
                    Waited::Gone => {
                        p.close_if_open();
                        break Some(Err(gone().unwrap_or(IpcError::HostLost)));
                    }
                }
                bell = p.bell.load(Ordering::SeqCst);
            }
            peer::FULL => match p.take() {
                Some(i) => break Some(Ok(i)),
                // Withdrawn by its sender: the inbox is open again.
                None => bell = p.bell.load(Ordering::SeqCst),
            },
            peer::DEAD => break Some(Err(p.dead_error())),
            // Closed for us: a message waits in the engine.
            _ => break None,
        }
    };
    side.spin.set(policy);
    side.waits.set(w);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// The owner of `page`, receiving on its own thread until `stop`.
    fn owner_receiving(
        page: &std::sync::Arc<Peer>,
        stop: &std::sync::Arc<AtomicU64>,
    ) -> std::thread::JoinHandle<Option<Result<u32, IpcError>>> {
        let (p2, stop2) = (page.clone(), stop.clone());
        let owner = std::thread::spawn(move || {
            let pace = Pace::new();
            let (spin, waits) = (
                Cell::new(SpinPolicy::fixed(Duration::ZERO)),
                Cell::new(WaitCounts::default()),
            );
            let side = Side {
                pace: &pace,
                spin: &spin,
                waits: &waits,
                handoffs: None,
                on_block: OnBlock::Block,
                block_in_inbox: true,
                tick: None,
            };
            let gone = || (stop2.load(Ordering::SeqCst) != 0).then_some(IpcError::HostLost);
            receive(&side, &p2, gone).map(|r| r.map(|i| i.seq))
        });
        // The owner opens its inbox and blocks.
        let t = std::time::Instant::now();
        while page.tag() != peer::OPEN || page.rx_parked.load(Ordering::SeqCst) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the owner never waited"
            );
            std::thread::yield_now();
        }
        owner
    }

    /// Waits up to 5 s for `owner` to end; then ends its wait if it is
    /// still in it (so the test ends) and returns what it received.
    fn ended(
        owner: std::thread::JoinHandle<Option<Result<u32, IpcError>>>,
        page: &Peer,
        stop: &AtomicU64,
    ) -> Option<Result<u32, IpcError>> {
        let t = std::time::Instant::now();
        while !owner.is_finished() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(1, Ordering::SeqCst);
        page.bell.fetch_add(1, Ordering::SeqCst);
        crate::attach::shm::futex_wake(&page.bell);
        owner.join().expect("the owner's thread")
    }

    #[test]
    fn a_message_queued_behind_a_dead_claim_is_not_left_waiting() {
        // The engine queued a message while a sender held the inbox
        // claimed; the sender died and the host reopened the inbox. The
        // receiver must take the message from the engine, not wait on.
        let page = std::sync::Arc::new(Peer::default());
        let stop = std::sync::Arc::new(AtomicU64::new(0));
        let owner = owner_receiving(&page, &stop);
        let dead = Pid(0x0001_0009);
        assert!(page.claim(dead));
        page.set_queued(true);
        assert_eq!(page.tag(), peer::CLAIMED, "a claimed inbox is not closed");
        page.sender_died(dead);
        let r = ended(owner, &page, &stop);
        assert!(r.is_none(), "through the engine, not waiting on: {r:?}");
        assert_eq!(page.tag(), peer::CLOSED);
    }

    #[test]
    fn a_sender_killed_between_filling_and_ringing_leaves_no_hang() {
        // A program killed after its CAS to FULL but before it rang the
        // bell: the owner, blocked on the bell, never learns of the
        // message, and no other sender can claim the full inbox. The
        // host's handling of the death must reopen it, rung.
        let page = std::sync::Arc::new(Peer::default());
        let stop = std::sync::Arc::new(AtomicU64::new(0));
        let owner = owner_receiving(&page, &stop);
        let dead = Pid(0x0001_0009);
        assert!(page.claim(dead));
        // (fill's CAS, without its ring)
        page.st.store(peer::st(peer::FULL, dead), Ordering::SeqCst);
        page.sender_died(dead);
        assert_eq!(page.tag(), peer::OPEN, "the dead sender's message is gone");
        let live = Pid(0x0001_000a);
        let t = std::time::Instant::now();
        while !page.claim(live) {
            assert!(t.elapsed() < Duration::from_secs(5), "never open again");
            std::thread::yield_now();
        }
        assert!(page.fill(live, 77, 0, live, &Message::zero()));
        let r = ended(owner, &page, &stop);
        assert_eq!(r, Some(Ok(77)), "the next sender's message is received");
    }
}
