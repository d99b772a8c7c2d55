//! The shared-memory path between attached processes of one user.
//!
//! Each attached process has a peer page (a sealed memory file, one
//! page) besides its call slot. Its host maps it, and so does every
//! program of the same uid that exchanges with the process. The page holds
//! an inbox (a plain Receive waiting outside the engine) and a reply area
//! (this process's own Send waiting for its reply). A Send to a process
//! waiting in its inbox is written straight into it, and the Reply
//! straight into the sender's reply area: no host thread takes part and,
//! while both sides spin, no system call is made.
//!
//! Invariants (docs/PROTOCOL.md, "Attach: the peer page"):
//! - The inbox's state word `st` holds a tag and, while claimed or full,
//!   the claiming sender's pid. Only its owner moves CLOSED→OPEN and
//!   FULL→CLOSED; only a sender OPEN→CLAIMED→FULL (and FULL→OPEN, taking
//!   back its own message at a deadline); only the host OPEN→CLOSED (a
//!   message waits in the engine), CLAIMED/FULL→OPEN for a sender that
//!   died (it may die between its move and its ring) and anything→DEAD.
//!   Every move is a compare-and-swap, so no two parties both win.
//! - `bell` changes after every move the owner must see, and is the word
//!   the owner blocks on; a side wakes the other only if it parked.
//! - The reply word `rst` holds a state and the exchange's sequence. Only
//!   the waiting owner moves it to WAITING; the replier (or the host, when
//!   the receiver died) moves WAITING→REPLYING→REPLIED/FAILED/FORWARDED,
//!   so a late reply to a cancelled or later exchange loses its CAS; the
//!   host also moves REPLYING→FAILED when the replier's program ended
//!   between the two.
//! - The host vouches for nothing on this page: programs share it only
//!   with programs of their own uid, which could already trace each
//!   other. Every word is an atomic and every value read is checked, so a
//!   scribbled page garbles exchanges with its scribbler, never memory.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use vkernel_proto::{IpcError, Message, Pid};

use super::shm::futex_wake;

/// Bytes of the peer page.
pub(crate) const PEER_BYTES: usize = 4096;

/// Inbox tags (the low half of `st`).
pub(crate) const CLOSED: u32 = 0;
/// The owner waits in a plain Receive.
pub(crate) const OPEN: u32 = 1;
/// A sender is writing its message.
pub(crate) const CLAIMED: u32 = 2;
/// A message waits for the owner.
pub(crate) const FULL: u32 = 3;
/// The owner was destroyed.
pub(crate) const DEAD: u32 = 4;

/// Reply states (the low 3 bits of `rst`).
pub(crate) const IDLE: u32 = 0;
/// The owner waits for the reply to exchange `seq`.
pub(crate) const WAITING: u32 = 1;
/// The replier is writing.
pub(crate) const REPLYING: u32 = 2;
/// The reply is in `rmsg` (from `rfrom`).
pub(crate) const REPLIED: u32 = 3;
/// The exchange failed (`rcode`, `rarg`).
pub(crate) const FAILED: u32 = 4;
/// The receiver forwarded the message (`rmsg`) to `rfrom`.
pub(crate) const FORWARDED: u32 = 5;

/// The peer page (all zero: an inbox CLOSED, no reply awaited).
#[derive(Default)]
#[repr(C, align(64))]
pub(crate) struct Peer {
    /// Inbox tag | claimer pid << 32.
    pub(crate) st: AtomicU64,
    /// Bumped after every inbox move the owner must see.
    pub(crate) bell: AtomicU32,
    /// The owner is blocked (or about to block) on `bell`.
    pub(crate) rx_parked: AtomicU32,
    /// Host: messages may wait for the owner in the engine.
    pub(crate) queued: AtomicU32,
    /// Host: the owner's pid.
    pub(crate) owner: AtomicU32,
    _line0: [u32; 10],
    /// The message in the inbox: its sender, the sender's exchange
    /// sequence, principal and forwarder.
    pub(crate) from: AtomicU32,
    pub(crate) seq: AtomicU32,
    pub(crate) principal: AtomicU32,
    pub(crate) forwarder: AtomicU32,
    pub(crate) msg: [AtomicU32; 8],
    _line1: [u32; 4],
    /// Reply state | sequence << 3.
    pub(crate) rst: AtomicU32,
    /// The owner is blocked (or about to block) on `rst`.
    pub(crate) tx_parked: AtomicU32,
    /// Whom the owner waits for.
    pub(crate) rpeer: AtomicU32,
    _line2: [u32; 13],
    /// The reply: who replied (or the forward's target), the error, the
    /// forwarder, the message.
    pub(crate) rfrom: AtomicU32,
    pub(crate) rcode: AtomicU32,
    pub(crate) rarg: AtomicU32,
    pub(crate) rforwarder: AtomicU32,
    pub(crate) rmsg: [AtomicU32; 8],
    _line3: [u32; 4],
    /// Exchanges this process completed here as the receiver (metrics).
    pub(crate) exchanges: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Peer>() <= PEER_BYTES);

/// `st` for a tag and a pid.
pub(crate) fn st(tag: u32, pid: Pid) -> u64 {
    u64::from(tag) | (u64::from(pid.0) << 32)
}

/// `rst` for a sequence and a state.
pub(crate) fn rst(seq: u32, state: u32) -> u32 {
    (seq << 3) | state
}

/// Sequences are 29 bits; 0 is never used.
pub(crate) fn next_seq(s: u32) -> u32 {
    match s.wrapping_add(1) & ((1 << 29) - 1) {
        0 => 1,
        n => n,
    }
}

/// What a receiver took from its inbox.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inbound {
    pub(crate) from: Pid,
    pub(crate) seq: u32,
    pub(crate) principal: u32,
    pub(crate) forwarder: Pid,
    pub(crate) msg: Message,
}

/// How the owner's Send ended.
pub(crate) enum Outcome {
    Replied {
        from: Pid,
        msg: Message,
    },
    Failed(IpcError),
    Forwarded {
        to: Pid,
        forwarder: Pid,
        msg: Message,
    },
}

fn load(ws: &[AtomicU32; 8]) -> Message {
    Message(std::array::from_fn(|i| ws[i].load(Ordering::Relaxed)))
}

fn store(ws: &[AtomicU32; 8], m: &Message) {
    for (w, v) in ws.iter().zip(m.0) {
        w.store(v, Ordering::Relaxed);
    }
}

impl Peer {
    /// The page at the start of a mapping.
    ///
    /// # Safety
    /// `p` must point to at least [`PEER_BYTES`] of page-aligned memory
    /// that stays mapped while the returned reference lives.
    pub(crate) unsafe fn at<'a>(p: *mut u8) -> &'a Peer {
        // SAFETY: aligned (pages are), large enough (checked at compile
        // time above), and every field is an atomic or padding, so any bit
        // pattern, written by anyone at any time, is a valid `Peer`.
        unsafe { &*(p as *const Peer) }
    }

    /// The inbox's tag now.
    pub(crate) fn tag(&self) -> u32 {
        self.st.load(Ordering::Acquire) as u32
    }

    fn ring(&self) {
        self.bell.fetch_add(1, Ordering::SeqCst);
        if self.rx_parked.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.bell);
        }
    }

    fn cas_st(&self, from: u64, to: u64) -> bool {
        self.st
            .compare_exchange(from, to, Ordering::SeqCst, Ordering::Acquire)
            .is_ok()
    }

    /// Owner: opens the inbox for a Receive (false: not CLOSED).
    pub(crate) fn open(&self) -> bool {
        self.cas_st(st(CLOSED, Pid(0)), st(OPEN, Pid(0)))
    }

    /// Owner: why its inbox is DEAD.
    pub(crate) fn dead_error(&self) -> IpcError {
        let code = (self.st.load(Ordering::Acquire) >> 32) as u32;
        match IpcError::from_code(code, 0) {
            e @ (IpcError::HostLost | IpcError::Destroyed) => e,
            _ => IpcError::Destroyed,
        }
    }

    /// Owner or host: closes an inbox nobody claimed (false: too late).
    pub(crate) fn close_if_open(&self) -> bool {
        self.cas_st(st(OPEN, Pid(0)), st(CLOSED, Pid(0)))
    }

    /// Sender `me`: claims an open inbox.
    pub(crate) fn claim(&self, me: Pid) -> bool {
        self.cas_st(st(OPEN, Pid(0)), st(CLAIMED, me))
    }

    /// Sender `me`, after [`Peer::claim`]: writes the message and hands it
    /// over (false: the owner died meanwhile).
    pub(crate) fn fill(&self, me: Pid, seq: u32, principal: u32, fwd: Pid, msg: &Message) -> bool {
        self.from.store(me.0, Ordering::Relaxed);
        self.seq.store(seq, Ordering::Relaxed);
        self.principal.store(principal, Ordering::Relaxed);
        self.forwarder.store(fwd.0, Ordering::Relaxed);
        store(&self.msg, msg);
        if !self.cas_st(st(CLAIMED, me), st(FULL, me)) {
            return false;
        }
        self.ring();
        true
    }

    /// Owner: takes the message of a FULL inbox and closes it (`None`:
    /// its sender withdrew it meanwhile; the inbox is open again).
    pub(crate) fn take(&self) -> Option<Inbound> {
        let full = self.st.load(Ordering::Acquire);
        let i = Inbound {
            from: Pid(self.from.load(Ordering::Relaxed)),
            seq: self.seq.load(Ordering::Relaxed),
            principal: self.principal.load(Ordering::Relaxed),
            forwarder: Pid(self.forwarder.load(Ordering::Relaxed)),
            msg: load(&self.msg),
        };
        if full as u32 != FULL || !self.cas_st(full, st(CLOSED, Pid(0))) {
            return None;
        }
        self.exchanges.fetch_add(1, Ordering::Relaxed);
        Some(i)
    }

    /// Sender `me`, whose deadline passed: takes back a message the owner
    /// has not taken yet (false: it has).
    pub(crate) fn withdraw(&self, me: Pid) -> bool {
        if self.cas_st(st(FULL, me), st(OPEN, Pid(0))) {
            self.ring();
            return true;
        }
        false
    }

    /// Host: a message waits in the engine; a Receive waiting in the inbox
    /// must take it from there.
    pub(crate) fn set_queued(&self, nonempty: bool) {
        self.queued.store(u32::from(nonempty), Ordering::SeqCst);
        if nonempty && self.close_if_open() {
            self.ring();
        }
    }

    /// Host: `who` died. A claim it left will never be filled, and a
    /// message it left the owner has not taken is taken back (its Send is
    /// over; and it may have died between filling the inbox and ringing,
    /// so the owner was never told): the inbox opens again, rung.
    pub(crate) fn sender_died(&self, who: Pid) {
        if self.cas_st(st(CLAIMED, who), st(OPEN, Pid(0)))
            || self.cas_st(st(FULL, who), st(OPEN, Pid(0)))
        {
            self.ring();
        }
    }

    /// Host: the owner was destroyed. Its own Send, if waiting here,
    /// fails with `err`.
    pub(crate) fn die(&self, err: &IpcError) {
        // The error's code rides in the claimer half, for the owner.
        self.st.store(st(DEAD, Pid(err.code().0)), Ordering::SeqCst);
        self.ring();
        let r = self.rst.load(Ordering::Acquire);
        if r & 7 == WAITING {
            self.finish(r >> 3, Outcome::Failed(*err));
        }
    }

    /// Ends the owner's exchange `seq` if it still waits for it (false:
    /// cancelled, ended, or another exchange now).
    pub(crate) fn finish(&self, seq: u32, how: Outcome) -> bool {
        if self
            .rst
            .compare_exchange(
                rst(seq, WAITING),
                rst(seq, REPLYING),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        let state = match how {
            Outcome::Replied { from, msg } => {
                self.rfrom.store(from.0, Ordering::Relaxed);
                store(&self.rmsg, &msg);
                REPLIED
            }
            Outcome::Failed(e) => {
                let (c, a) = e.code();
                self.rcode.store(c, Ordering::Relaxed);
                self.rarg.store(a, Ordering::Relaxed);
                FAILED
            }
            Outcome::Forwarded { to, forwarder, msg } => {
                self.rfrom.store(to.0, Ordering::Relaxed);
                self.rforwarder.store(forwarder.0, Ordering::Relaxed);
                store(&self.rmsg, &msg);
                FORWARDED
            }
        };
        self.rst.store(rst(seq, state), Ordering::SeqCst);
        if self.tx_parked.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.rst);
        }
        true
    }

    /// Host: `dead` was destroyed; if the owner waits for it, that Send
    /// fails with `why`.
    pub(crate) fn fail_if_waiting_on(&self, dead: Pid, why: IpcError) {
        let r = self.rst.load(Ordering::Acquire);
        if r & 7 == WAITING && self.rpeer.load(Ordering::Acquire) == dead.0 {
            self.finish(r >> 3, Outcome::Failed(why));
        }
    }

    /// Host: `dead`, a program that is gone, was writing the reply the
    /// owner waits for (it died between claiming the reply area and
    /// marking it written): that Send fails with `why`. Only for a
    /// process whose every thread is gone: a live replier's last store
    /// would land on the owner's next exchange.
    pub(crate) fn fail_if_replying(&self, dead: Pid, why: IpcError) {
        let r = self.rst.load(Ordering::Acquire);
        if r & 7 != REPLYING || self.rpeer.load(Ordering::Acquire) != dead.0 {
            return;
        }
        let (c, a) = why.code();
        self.rcode.store(c, Ordering::Relaxed);
        self.rarg.store(a, Ordering::Relaxed);
        if self
            .rst
            .compare_exchange(r, rst(r >> 3, FAILED), Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
            && self.tx_parked.load(Ordering::SeqCst) != 0
        {
            futex_wake(&self.rst);
        }
    }

    /// Owner: how its exchange ended (after `rst` left WAITING/REPLYING).
    pub(crate) fn outcome(&self, state: u32) -> Outcome {
        match state {
            REPLIED => Outcome::Replied {
                from: Pid(self.rfrom.load(Ordering::Relaxed)),
                msg: load(&self.rmsg),
            },
            FORWARDED => Outcome::Forwarded {
                to: Pid(self.rfrom.load(Ordering::Relaxed)),
                forwarder: Pid(self.rforwarder.load(Ordering::Relaxed)),
                msg: load(&self.rmsg),
            },
            FAILED => Outcome::Failed(IpcError::from_code(
                self.rcode.load(Ordering::Relaxed),
                self.rarg.load(Ordering::Relaxed),
            )),
            // Only a scribbler leaves anything else here.
            _ => Outcome::Failed(IpcError::HostLost),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::shm::Shm;

    fn page() -> Shm {
        Shm::create("vkernel-peer-test", PEER_BYTES)
            .expect("memfd")
            .0
    }

    #[test]
    fn an_exchange_through_the_inbox_and_the_reply_area() {
        let (rm, sm) = (page(), page());
        // SAFETY: both mappings are PEER_BYTES long and page-aligned.
        let (r, s) = unsafe { (Peer::at(rm.as_ptr()), Peer::at(sm.as_ptr())) };
        let (rp, sp) = (Pid(0x0001_0005), Pid(0x0001_0006));
        assert!(!s.claim(sp), "closed: no claim");
        assert!(r.open());
        assert!(!r.open(), "opened once");
        s.rpeer.store(rp.0, Ordering::Relaxed);
        s.rst.store(rst(7, WAITING), Ordering::SeqCst);
        assert!(r.claim(sp));
        assert!(!r.claim(Pid(9)), "claimed once");
        let b = r.bell.load(Ordering::SeqCst);
        assert!(r.fill(sp, 7, 42, sp, &Message::with_code(3)));
        assert_ne!(r.bell.load(Ordering::SeqCst), b, "the owner is rung");
        assert_eq!(r.tag(), FULL);
        let i = r.take().expect("full");
        assert_eq!((i.from, i.seq, i.principal, i.msg.code()), (sp, 7, 42, 3));
        assert_eq!(r.tag(), CLOSED);
        assert!(!s.finish(6, Outcome::Failed(IpcError::HostLost)), "stale");
        let reply = Message::with_code(4);
        assert!(s.finish(
            7,
            Outcome::Replied {
                from: rp,
                msg: reply
            }
        ));
        assert!(!s.finish(7, Outcome::Failed(IpcError::HostLost)), "once");
        match s.outcome(s.rst.load(Ordering::SeqCst) & 7) {
            Outcome::Replied { from, msg } => assert_eq!((from, msg.code()), (rp, 4)),
            _ => panic!("not replied"),
        }
    }

    #[test]
    fn the_host_closes_kicks_and_fails() {
        let (rm, sm) = (page(), page());
        // SAFETY: as above.
        let (r, s) = unsafe { (Peer::at(rm.as_ptr()), Peer::at(sm.as_ptr())) };
        let (rp, sp) = (Pid(0x0001_0005), Pid(0x0001_0006));
        assert!(r.open());
        r.set_queued(true);
        assert_eq!(r.tag(), CLOSED, "an engine message closes the inbox");
        r.set_queued(false);
        assert!(r.open());
        assert!(r.claim(sp));
        r.sender_died(sp);
        assert_eq!(r.tag(), OPEN, "a dead claimer's claim is undone");
        s.rpeer.store(rp.0, Ordering::Relaxed);
        s.rst.store(rst(3, WAITING), Ordering::SeqCst);
        assert!(r.claim(sp));
        r.die(&IpcError::Destroyed);
        assert!(!r.fill(sp, 3, 0, sp, &Message::zero()), "dead owner");
        s.fail_if_waiting_on(Pid(77), IpcError::NoSuchProcess(Pid(77)));
        assert_eq!(s.rst.load(Ordering::SeqCst) & 7, WAITING, "not on 77");
        s.fail_if_waiting_on(rp, IpcError::NoSuchProcess(rp));
        match s.outcome(s.rst.load(Ordering::SeqCst) & 7) {
            Outcome::Failed(e) => assert_eq!(e, IpcError::NoSuchProcess(rp)),
            _ => panic!("not failed"),
        }
    }

    #[test]
    fn a_reply_whose_writer_died_midway_fails() {
        let sm = page();
        // SAFETY: as above.
        let s = unsafe { Peer::at(sm.as_ptr()) };
        let rp = Pid(0x0001_0005);
        s.rpeer.store(rp.0, Ordering::Relaxed);
        s.rst.store(rst(9, WAITING), Ordering::SeqCst);
        // The replier's first CAS, then it is killed.
        s.rst.store(rst(9, REPLYING), Ordering::SeqCst);
        s.fail_if_replying(Pid(77), IpcError::NoSuchProcess(Pid(77)));
        assert_eq!(s.rst.load(Ordering::SeqCst) & 7, REPLYING, "not 77's");
        s.fail_if_replying(rp, IpcError::NoSuchProcess(rp));
        assert_eq!(s.rst.load(Ordering::SeqCst), rst(9, FAILED));
        match s.outcome(FAILED) {
            Outcome::Failed(e) => assert_eq!(e, IpcError::NoSuchProcess(rp)),
            _ => panic!("not failed"),
        }
        // A finished reply is left alone.
        s.rst.store(rst(10, REPLIED), Ordering::SeqCst);
        s.fail_if_replying(rp, IpcError::NoSuchProcess(rp));
        assert_eq!(s.rst.load(Ordering::SeqCst), rst(10, REPLIED));
    }

    #[test]
    fn a_dead_senders_claim_or_message_is_taken_back() {
        let rm = page();
        // SAFETY: as above.
        let r = unsafe { Peer::at(rm.as_ptr()) };
        let (a, b) = (Pid(0x0001_0006), Pid(0x0001_0007));
        assert!(r.open() && r.claim(a) && r.fill(a, 1, 0, a, &Message::zero()));
        r.sender_died(b);
        assert_eq!(r.tag(), FULL, "another sender's message stays");
        let bell = r.bell.load(Ordering::SeqCst);
        r.sender_died(a);
        assert_eq!(r.tag(), OPEN, "the dead sender's message is taken back");
        assert_ne!(r.bell.load(Ordering::SeqCst), bell, "and the owner rung");
        assert!(r.take().is_none());
    }

    #[test]
    fn a_sender_withdraws_only_what_was_not_taken() {
        let rm = page();
        // SAFETY: as above.
        let r = unsafe { Peer::at(rm.as_ptr()) };
        let sp = Pid(0x0001_0006);
        assert!(r.open() && r.claim(sp));
        assert!(r.fill(sp, 1, 0, sp, &Message::zero()));
        assert!(r.withdraw(sp));
        assert_eq!(r.tag(), OPEN, "open for the next sender");
        assert!(r.take().is_none(), "nothing to take");
        assert!(r.claim(sp) && r.fill(sp, 2, 0, sp, &Message::zero()));
        assert_eq!(r.take().map(|i| i.seq), Some(2));
        assert!(!r.withdraw(sp), "taken: too late");
    }

    #[test]
    fn sequences_skip_zero_and_wrap_in_29_bits() {
        assert_eq!(next_seq((1 << 29) - 1), 1);
        assert_eq!(next_seq(5), 6);
        assert_eq!(rst(next_seq(u32::MAX), REPLIED) & 7, REPLIED);
    }
}
