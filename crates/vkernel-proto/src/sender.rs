//! The sender's side of one remote exchange: the one place its rules
//! live. The engine keeps one [`Retx`] per remote Send in the sender's
//! descriptor; a Send run outside the engine ([`crate::direct`]) keeps
//! one too. Both feed the same per-peer [`Rtt`].
//!
//! The rules (docs/PROTOCOL.md §5, ARCHITECTURE.md "When not to
//! retransmit"):
//! - the first copy waits the peer's send timeout; each copy doubles it,
//!   up to `max_rto`;
//! - a due first copy waits one more timeout while the peer answers only
//!   older Sends ([`Rtt::older_served`]) or another Send's copy is
//!   probing it ([`Rtt::probing`]), but never past `max_rto` after the
//!   first copy;
//! - a replyPending renews the host timeout; unless it is busy (the peer
//!   dropped the request for lack of buffers) it also raises the timeout
//!   to the peer's current one, and the first such proves the copies
//!   needless ([`Rtt::held`]) and resolves Karn's ambiguity;
//! - a reply to the first copy (not flagged a copy) proves every copy
//!   needless; a reply to a copy, with no replyPending before, proves one
//!   was needed ([`Rtt::lost`]);
//! - a round-trip sample is taken when no copy was sent, or when the
//!   reply or a replyPending shows the first copy was the one served.

use crate::config::Micros;
use crate::error::IpcError;
use crate::pid::Pid;
use crate::rtt::Rtt;
use crate::wire::Status;

/// The error a nAck with `status` from `from` ends a Send with.
pub fn nack_error(status: Status, from: Pid) -> IpcError {
    match status {
        Status::Busy => IpcError::NoResources,
        Status::AccessDenied => IpcError::AccessDenied(from),
        _ => IpcError::NoSuchProcess(from),
    }
}

/// Retransmission state of one remote Send. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retx {
    sent_at: Micros,
    next: Micros,
    rto: Micros,
    deadline: Micros,
    retransmitted: bool,
    copies: u32,
    pending_seen: bool,
    self_timed: bool,
}

/// What [`Retx::due`] finds at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Nothing is due.
    Idle,
    /// The peer's host was silent for the host timeout.
    Dead,
    /// A first copy is due, but the peer is busy or being probed: call
    /// [`Retx::defer`].
    Defer,
    /// Send a copy, then call [`Retx::copy_sent`].
    Retransmit,
}

/// What a reply told about the exchange ([`Retx::on_reply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answered {
    /// Copies the reply proved needless (it answers the first).
    pub needless_copies: u32,
    /// The round-trip sample taken, if any (Karn's rule).
    pub sample: Option<Micros>,
    /// Time from the first copy to the reply.
    pub waited: Micros,
}

impl Retx {
    /// The first copy sent at `now`, with the peer's timeout `rto`;
    /// `self_timed`: the sending thread runs this Send's timers.
    pub fn start(now: Micros, rto: Micros, host_timeout: Micros, self_timed: bool) -> Retx {
        Retx {
            sent_at: now,
            next: now + rto,
            rto,
            deadline: now + host_timeout,
            retransmitted: false,
            copies: 0,
            pending_seen: false,
            self_timed,
        }
    }

    /// When the first copy went.
    pub fn sent_at(&self) -> Micros {
        self.sent_at
    }

    /// When a copy is next due.
    pub fn next(&self) -> Micros {
        self.next
    }

    /// When the peer's host is taken for dead.
    pub fn deadline(&self) -> Micros {
        self.deadline
    }

    /// The earlier of [`Retx::next`] and [`Retx::deadline`].
    pub fn next_timer(&self) -> Micros {
        self.next.min(self.deadline)
    }

    /// The current timeout.
    pub fn rto(&self) -> Micros {
        self.rto
    }

    /// Copies sent after the first.
    pub fn copies(&self) -> u32 {
        self.copies
    }

    /// Whether any copy was sent.
    pub fn retransmitted(&self) -> bool {
        self.retransmitted
    }

    /// Whether the sending thread runs this Send's timers (the engine's
    /// shared deadline leaves it out).
    pub fn self_timed(&self) -> bool {
        self.self_timed
    }

    /// May a due copy wait at all? Only a first copy to one process
    /// (`group`: to a group), and not past `max_rto` after it.
    pub fn may_defer(&self, now: Micros, group: bool, max_rto: Micros) -> bool {
        !self.retransmitted && !group && now < self.sent_at + max_rto
    }

    /// Should a due copy wait one more timeout, by what `peer` shows?
    pub fn waits(&self, now: Micros, group: bool, max_rto: Micros, peer: Option<&Rtt>) -> bool {
        self.may_defer(now, group, max_rto)
            && peer.is_some_and(|t| {
                t.older_served(now, self.sent_at, self.rto) || t.probing(now, self.rto)
            })
    }

    /// What is due at `now`.
    pub fn due(&self, now: Micros, group: bool, max_rto: Micros, peer: Option<&Rtt>) -> Due {
        if now >= self.deadline {
            Due::Dead
        } else if now < self.next {
            Due::Idle
        } else if self.waits(now, group, max_rto, peer) {
            Due::Defer
        } else {
            Due::Retransmit
        }
    }

    /// A due copy waits one more timeout.
    pub fn defer(&mut self, now: Micros) {
        self.next = now + self.rto;
    }

    /// A copy went at `now`: the timeout doubles (up to `max_rto`), and
    /// `peer` (none for a group) is marked probed.
    pub fn copy_sent(&mut self, now: Micros, max_rto: Micros, peer: Option<&mut Rtt>) {
        self.retransmitted = true;
        self.copies += 1;
        self.rto = (self.rto * 2).min(max_rto);
        self.next = now + self.rto;
        if let Some(p) = peer {
            p.probed(now);
        }
    }

    /// The peer is alive (a bulk request for this exchange came): the
    /// host timeout starts again.
    pub fn alive(&mut self, now: Micros, host_timeout: Micros) {
        self.deadline = now + host_timeout;
    }

    /// A replyPending came at `now` (`busy`: dropped for lack of buffers,
    /// not held); `fresh_rto` is the peer's timeout now.
    pub fn on_reply_pending(
        &mut self,
        now: Micros,
        busy: bool,
        fresh_rto: Micros,
        host_timeout: Micros,
        peer: &mut Rtt,
    ) {
        // Busy: the peer is alive but did not hold the request, so it
        // says nothing of the round trip, no copy was needless, and a
        // probe stays out.
        let first = !busy && !self.pending_seen;
        let needless = first && self.retransmitted;
        let waited = now.saturating_sub(self.sent_at);
        self.deadline = now + host_timeout;
        if !busy {
            self.pending_seen = true;
            self.rto = fresh_rto.max(self.rto);
        }
        self.next = now + self.rto;
        if busy {
            return;
        }
        if first {
            peer.held(now, waited);
        }
        peer.heard(now, needless);
    }

    /// The reply came at `now`; `to_first`: it answers the first copy
    /// (not flagged a copy). Updates `peer`.
    pub fn on_reply(&self, now: Micros, to_first: bool, peer: &mut Rtt) -> Answered {
        let doubt = self.retransmitted && !self.pending_seen;
        let needless = doubt && to_first;
        let needed = doubt && !to_first;
        let waited = now.saturating_sub(self.sent_at);
        let sample = (!self.retransmitted || self.pending_seen || needless).then_some(waited);
        peer.answered(now, self.sent_at);
        peer.heard(now, needless);
        if needed {
            peer.lost(now);
        }
        if let Some(s) = sample {
            if needless {
                peer.held(now, s);
            }
            peer.sample(s);
        }
        Answered {
            needless_copies: if to_first { self.copies } else { 0 },
            sample,
            waited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Micros = 100_000;
    const HOST: Micros = 800_000;

    #[test]
    fn copies_back_off_to_the_ceiling() {
        let mut r = Retx::start(0, 30_000, HOST, false);
        assert_eq!(r.due(29_999, false, MAX, None), Due::Idle);
        assert_eq!(r.due(30_000, false, MAX, None), Due::Retransmit);
        let mut p = Rtt::new();
        r.copy_sent(30_000, MAX, Some(&mut p));
        assert_eq!((r.rto(), r.next(), r.copies()), (60_000, 90_000, 1));
        assert!(p.probing(30_001, 10_000), "the copy marks the peer probed");
        r.copy_sent(90_000, MAX, None);
        assert_eq!(r.rto(), MAX);
        assert_eq!(r.due(HOST, false, MAX, None), Due::Dead);
    }

    #[test]
    fn a_busy_reply_pending_renews_the_host_timeout_only() {
        let mut r = Retx::start(0, 4_000, HOST, false);
        r.copy_sent(4_000, MAX, None);
        let mut p = Rtt::new();
        let before = p;
        r.on_reply_pending(5_000, true, 20_000, HOST, &mut p);
        assert_eq!(r.rto(), 8_000, "not raised to the fresh timeout");
        assert_eq!(r.deadline(), 5_000 + HOST);
        assert_eq!(format!("{p:?}"), format!("{before:?}"), "peer untouched");
        // Not busy: raised, and the copy proved needless.
        r.on_reply_pending(6_000, false, 20_000, HOST, &mut p);
        assert_eq!(r.rto(), 20_000);
        assert!(p.send_rto(6_000, 1_000, 1_000, MAX) >= 12_000, "held floor");
        let a = r.on_reply(7_000, false, &mut p);
        assert_eq!(a.sample, Some(7_000), "replyPending resolved Karn");
        assert_eq!(a.needless_copies, 0);
    }

    #[test]
    fn a_reply_to_the_first_copy_makes_every_copy_needless() {
        let mut r = Retx::start(0, 1_000, HOST, false);
        r.copy_sent(1_000, MAX, None);
        r.copy_sent(3_000, MAX, None);
        let mut p = Rtt::new();
        let a = r.on_reply(3_500, true, &mut p);
        assert_eq!((a.needless_copies, a.sample), (2, Some(3_500)));
        // To a copy: needed, no sample.
        let a = r.on_reply(3_500, false, &mut Rtt::new());
        assert_eq!((a.needless_copies, a.sample), (0, None));
    }

    #[test]
    fn a_due_first_copy_defers_behind_a_busy_peer_but_not_past_max_rto() {
        let mut p = Rtt::new();
        let r = Retx::start(500, 2_000, HOST, false);
        // The peer answered an older Send just before this one fell due.
        p.answered(2_400, 0);
        assert_eq!(r.due(2_500, false, MAX, Some(&p)), Due::Defer);
        assert_eq!(r.due(2_500, true, MAX, Some(&p)), Due::Retransmit, "group");
        assert_eq!(r.due(2_500, false, MAX, None), Due::Retransmit);
        assert_eq!(r.due(MAX + 500, false, MAX, Some(&p)), Due::Retransmit);
    }
}
