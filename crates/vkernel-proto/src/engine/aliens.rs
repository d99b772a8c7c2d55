//! Aliens and saved replies: what a host keeps for remote senders.
//!
//! An *alien* is the descriptor standing for a remote sender's request
//! while a local process holds it: a slot of a fixed pool (at most
//! `alien_per_host` per sending host), whose data buffer is kept across
//! uses. The answer to a finished non-idempotent exchange is *saved* to
//! answer retransmissions until the sender's next request; saved answers
//! are bounded (four per slot) and the one kept longest without use goes
//! first. Both are found by the sender's pid in one table, so a request
//! costs one lookup. Nothing here sends: the engine does, with what these
//! methods return.

use std::collections::VecDeque;
use std::net::SocketAddr;

use super::idmap::{new_map, IdMap};
use super::rights::{self, Denied, Need};
use crate::config::{Micros, MAX_APPEND};
use crate::error::IpcError;
use crate::message::{Message, SegAccess};
use crate::pid::{HostId, Pid};
use crate::stats::Stats;
use crate::wire::{self, Header, PacketType};

/// Whether the receiver has taken the alien's message yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AlienState {
    Queued,
    Received,
    /// Replied to (or forwarded) by the receiver, the answer held until
    /// the receiver's write-behind MoveTos to the sender are acknowledged
    /// (`Engine::behind_drained`). Duplicates get replyPending meanwhile.
    Replied,
}

/// Descriptor standing for a remote sender's request.
pub(super) struct Alien {
    pub(super) src: Pid,
    pub(super) principal: u32,
    pub(super) seq: u32,
    pub(super) receiver: Pid,
    /// The receiver the sender's kernel addressed (and still believes it
    /// awaits after local forwards, which it is not told about).
    pub(super) addressed: Pid,
    pub(super) forwarder: Pid,
    pub(super) msg: Message,
    pub(super) access: SegAccess,
    pub(super) seg_total: u32,
    pub(super) idempotent: bool,
    /// The sender asks that reply data not be sent ahead.
    pub(super) no_ahead: bool,
    pub(super) state: AlienState,
    /// The copy that made this alien was a retransmission: its reply is
    /// flagged `RETRANSMIT` too, so the sender cannot take it for the
    /// answer to its first copy (docs/PROTOCOL.md §3).
    pub(super) retransmitted: bool,
    pub(super) last_heard: Micros,
    pub(super) addr: SocketAddr,
}

impl Alien {
    /// Checks an access to the sender's segment, as declared with the
    /// request (see [`rights::check`]).
    #[inline]
    pub(super) fn check(&self, need: Need, off: usize, len: usize) -> Result<(), Denied> {
        let total = Some(self.seg_total as usize);
        rights::check(self.access, total, need, off, len).map(|_| ())
    }
}

/// A preallocated alien slot; its buffer is kept across uses.
struct Slot {
    alien: Option<Alien>,
    /// The first part of the sender's segment that came with the request.
    data: Vec<u8>,
}

/// The answer to a finished non-idempotent exchange, kept as its parts and
/// encoded again if asked for: a reply without data (the common case) is
/// then saved without an allocation.
struct Saved {
    header: Header,
    msg: Message,
    data: Vec<u8>,
    at: Micros,
}

/// What is kept per remote sender process.
#[derive(Default)]
struct Sender {
    /// Slot of the alien standing for its current request.
    alien: Option<usize>,
    saved: Option<Saved>,
    /// Newest sequence number seen, and when.
    last: Option<(u32, Micros)>,
}

/// What is known of a sender when a request (`seq`) arrives from it.
pub(super) enum Known {
    /// A retransmission of its last finished exchange: send this again.
    Answer(PacketType, Vec<u8>),
    /// Anything else.
    Sender {
        /// An answer to an earlier exchange is saved.
        had_saved: bool,
        /// The slot of its exchange in progress.
        alien: Option<usize>,
        /// Its newest sequence number.
        last: Option<u32>,
    },
}

/// The alien pool and saved answers. See the module docs.
pub(super) struct Aliens {
    slots: Vec<Slot>,
    free: Vec<usize>,
    senders: IdMap<Pid, Sender>,
    /// Senders with a saved answer, and the order the answers were saved
    /// or last re-sent in (oldest first; entries whose answer has since
    /// gone or moved are skipped): eviction without a scan.
    saved_count: usize,
    saved_order: VecDeque<(Pid, Micros)>,
    saved_limit: usize,
    /// Slots in use per sending host; entries stay at zero (removed by
    /// the sweep) rather than churn.
    per_host: IdMap<HostId, usize>,
    per_host_limit: usize,
    /// Bytes of slot buffers kept (their capacities), at most about
    /// [`RETAINED_MAX`] once freed.
    retained: usize,
}

/// Slot buffers kept across uses, in bytes: a large pool whose requests
/// all came with large segments gives the excess back as they are freed.
const RETAINED_MAX: usize = 16 << 20;

impl Aliens {
    /// A pool of `pool` slots, at most `per_host` of them per host.
    pub(super) fn new(pool: usize, per_host: usize, seed: u64) -> Aliens {
        Aliens {
            slots: (0..pool)
                .map(|_| Slot {
                    alien: None,
                    data: Vec::new(),
                })
                .collect(),
            free: (0..pool).rev().collect(),
            senders: new_map(seed),
            saved_count: 0,
            saved_order: VecDeque::new(),
            saved_limit: 4 * pool.max(1),
            per_host: new_map(seed),
            per_host_limit: per_host,
            retained: 0,
        }
    }

    /// Slots in the pool (it never grows).
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The sequence number of `src`'s current request, else of the
    /// newest one seen from it.
    pub(super) fn newest_seq(&self, src: Pid) -> Option<u32> {
        let s = self.senders.get(&src)?;
        s.alien
            .and_then(|i| self.get(i))
            .map(|a| a.seq)
            .or(s.last.map(|(seq, _)| seq))
    }

    /// The alien in slot `i`.
    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<&Alien> {
        self.slots.get(i)?.alien.as_ref()
    }

    /// The alien in slot `i`, to change.
    #[inline]
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut Alien> {
        self.slots.get_mut(i)?.alien.as_mut()
    }

    /// The segment data that came with the request in slot `i`.
    #[inline]
    pub(super) fn data(&self, i: usize) -> &[u8] {
        self.slots.get(i).map_or(&[], |s| &s.data)
    }

    /// The alien in slot `i` and the segment data that came with it.
    #[inline]
    pub(super) fn with_data(&mut self, i: usize) -> Option<(&mut Alien, &mut Vec<u8>)> {
        let s = self.slots.get_mut(i)?;
        Some((s.alien.as_mut()?, &mut s.data))
    }

    /// True if slot `i` holds the request with sequence number `seq`.
    #[inline]
    pub(super) fn is(&self, i: usize, seq: u32) -> bool {
        self.get(i).is_some_and(|a| a.seq == seq)
    }

    /// The slot of `sender`'s request `seq`, whatever its state.
    pub(super) fn of(&self, sender: Pid, seq: u32) -> Option<usize> {
        let i = self.senders.get(&sender)?.alien?;
        self.is(i, seq).then_some(i)
    }

    /// The slot of `sender`'s request that `by` has received.
    #[inline]
    pub(super) fn received(&self, sender: Pid, by: Pid) -> Result<usize, IpcError> {
        let i = self
            .senders
            .get(&sender)
            .and_then(|s| s.alien)
            .ok_or(IpcError::NotAwaitingReply(sender))?;
        match self.get(i) {
            Some(a) if a.receiver == by && a.state == AlienState::Received => Ok(i),
            _ => Err(IpcError::NotAwaitingReply(sender)),
        }
    }

    /// Slots of the requests `pid` has received.
    pub(super) fn held_by(&self, pid: Pid) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| {
                self.get(i)
                    .is_some_and(|a| a.receiver == pid && a.state == AlienState::Received)
            })
            .collect()
    }

    /// What is known of `src` as its request `seq` arrives. A
    /// retransmission of the exchange whose answer is saved gets that
    /// answer, counted as re-sent.
    #[inline]
    pub(super) fn known(&mut self, src: Pid, seq: u32, now: Micros, stats: &mut Stats) -> Known {
        let Some(s) = self.senders.get_mut(&src) else {
            return Known::Sender {
                had_saved: false,
                alien: None,
                last: None,
            };
        };
        if let Some(sv) = s.saved.as_mut().filter(|sv| sv.header.seq == seq) {
            sv.at = now;
            // Flagged as a copy: the sender learns its retransmission was
            // not needless (the first answer was lost).
            let mut h = sv.header;
            h.flags |= wire::F_RETRANSMIT;
            let answer = (h.ptype, wire::encode(&h, &sv.msg, &sv.data));
            stats.duplicates += 1;
            stats.saved_replies_resent += 1;
            self.note_saved(src, now);
            return Known::Answer(answer.0, answer.1);
        }
        Known::Sender {
            had_saved: s.saved.is_some(),
            alien: s.alien,
            last: s.last.map(|(seq, _)| seq),
        }
    }

    /// Drops `src`'s saved answer: its new request acknowledges it.
    #[inline]
    pub(super) fn forget_saved(&mut self, src: Pid) {
        if let Some(s) = self.senders.get_mut(&src) {
            if s.saved.take().is_some() {
                self.saved_count -= 1;
            }
        }
    }

    /// Takes a slot for `a` (with `data`, the first part of its segment),
    /// unless the pool or its host's share is used up.
    pub(super) fn admit(
        &mut self,
        a: Alien,
        data: &[u8],
        now: Micros,
        stats: &mut Stats,
    ) -> Option<usize> {
        let per_host = self.per_host.entry(a.src.host()).or_insert(0);
        if *per_host >= self.per_host_limit {
            return None;
        }
        let i = self.free.pop()?;
        *per_host += 1;
        stats.aliens_in_use += 1;
        let snd = self.senders.entry(a.src).or_default();
        snd.last = Some((a.seq, now));
        snd.alien = Some(i);
        let slot = &mut self.slots[i];
        let kept = slot.data.capacity();
        slot.data.clear();
        slot.data.extend_from_slice(data);
        self.retained += slot.data.capacity() - kept;
        slot.alien = Some(a);
        Some(i)
    }

    /// Frees slot `i` (if in use).
    #[inline]
    pub(super) fn free(&mut self, i: usize, stats: &mut Stats) {
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        let Some(a) = slot.alien.take() else { return };
        let cap = slot.data.capacity();
        if cap > MAX_APPEND || self.retained > RETAINED_MAX {
            self.retained -= cap;
            slot.data = Vec::new();
        }
        // (Unless the sender's newer request holds another slot.)
        if let Some(s) = self.senders.get_mut(&a.src) {
            if s.alien == Some(i) {
                s.alien = None;
            }
        }
        if let Some(c) = self.per_host.get_mut(&a.src.host()) {
            *c = c.saturating_sub(1);
        }
        stats.aliens_in_use = stats.aliens_in_use.saturating_sub(1);
        self.free.push(i);
    }

    /// Keeps a finished exchange's answer to re-send to retransmissions;
    /// past the bound the one kept longest without use goes.
    pub(super) fn save(
        &mut self,
        now: Micros,
        src: Pid,
        header: Header,
        msg: Message,
        data: &[u8],
        stats: &mut Stats,
    ) {
        let has = self.senders.get(&src).is_some_and(|s| s.saved.is_some());
        if !has && self.saved_count >= self.saved_limit {
            self.evict_oldest_saved(stats);
        }
        let e = self.senders.entry(src).or_default();
        if e.saved.is_none() {
            self.saved_count += 1;
        }
        e.saved = Some(Saved {
            header,
            msg,
            data: data.to_vec(),
            at: now,
        });
        self.note_saved(src, now);
    }

    /// Records that `src`'s saved answer was saved or re-sent at `at`;
    /// drops the entries gone stale once they outnumber the live ones.
    fn note_saved(&mut self, src: Pid, at: Micros) {
        self.saved_order.push_back((src, at));
        if self.saved_order.len() > 2 * self.saved_count + 64 {
            let senders = &self.senders;
            self.saved_order.retain(|(p, at)| {
                senders
                    .get(p)
                    .and_then(|s| s.saved.as_ref())
                    .is_some_and(|v| v.at == *at)
            });
        }
    }

    /// Drops the saved answer kept longest without use.
    fn evict_oldest_saved(&mut self, stats: &mut Stats) {
        while let Some((p, at)) = self.saved_order.pop_front() {
            if let Some(s) = self.senders.get_mut(&p) {
                if s.saved.as_ref().is_some_and(|v| v.at == at) {
                    s.saved = None;
                    self.saved_count -= 1;
                    stats.saved_replies_evicted += 1;
                    return;
                }
            }
        }
    }

    /// Frees aliens not heard from for `timeout`, drops answers saved
    /// longer than that and forgets sequence numbers twice as old.
    pub(super) fn sweep(&mut self, now: Micros, timeout: Micros, stats: &mut Stats) {
        let expired: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                self.get(i)
                    .is_some_and(|a| now.saturating_sub(a.last_heard) > timeout)
            })
            .collect();
        for i in expired {
            self.free(i, stats);
        }
        let horizon = timeout * 2;
        let mut saved_count = 0;
        self.senders.retain(|_, s| {
            if s.saved
                .as_ref()
                .is_some_and(|v| now.saturating_sub(v.at) > timeout)
            {
                s.saved = None;
            }
            if s.last.is_some_and(|(_, t)| now.saturating_sub(t) > horizon) {
                s.last = None;
            }
            saved_count += usize::from(s.saved.is_some());
            s.alien.is_some() || s.saved.is_some() || s.last.is_some()
        });
        self.saved_count = saved_count;
        if saved_count == 0 {
            self.saved_order.clear();
        }
        self.per_host.retain(|_, c| *c > 0);
    }

    /// True while a sweep has something to do.
    pub(super) fn busy(&self) -> bool {
        self.free.len() < self.slots.len() || !self.senders.is_empty() || !self.per_host.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(host: u16, l: u16) -> Pid {
        Pid::new(HostId(host), l)
    }

    fn alien(src: Pid, seq: u32, now: Micros) -> Alien {
        Alien {
            src,
            principal: 0,
            seq,
            receiver: pid(1, 2),
            addressed: pid(1, 2),
            forwarder: src,
            msg: Message::zero(),
            access: SegAccess::NONE,
            seg_total: 0,
            idempotent: false,
            no_ahead: false,
            retransmitted: false,
            state: AlienState::Queued,
            last_heard: now,
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
        }
    }

    #[test]
    fn the_pool_and_each_hosts_share_are_bounded() {
        let mut st = Stats::default();
        let mut a = Aliens::new(3, 2, 1);
        let i = a.admit(alien(pid(2, 5), 1, 0), b"ab", 0, &mut st).unwrap();
        assert!(a.admit(alien(pid(2, 6), 1, 0), b"", 0, &mut st).is_some());
        assert!(a.admit(alien(pid(2, 7), 1, 0), b"", 0, &mut st).is_none());
        assert!(a.admit(alien(pid(3, 7), 1, 0), b"", 0, &mut st).is_some());
        assert!(a.admit(alien(pid(4, 7), 1, 0), b"", 0, &mut st).is_none());
        assert_eq!(st.aliens_in_use, 3);
        assert_eq!(a.with_data(i).map(|(_, d)| d.clone()), Some(b"ab".to_vec()));
        a.free(i, &mut st);
        a.free(i, &mut st);
        assert_eq!(st.aliens_in_use, 2);
        assert!(a.get(i).is_none());
        assert!(a.admit(alien(pid(2, 7), 1, 0), b"", 0, &mut st).is_some());
        assert_eq!(a.capacity(), 3);
    }

    #[test]
    fn received_names_only_the_receiver_holding_it() {
        let mut st = Stats::default();
        let mut a = Aliens::new(2, 2, 1);
        let s = pid(2, 5);
        let i = a.admit(alien(s, 9, 0), b"", 0, &mut st).unwrap();
        assert!(a.received(s, pid(1, 2)).is_err(), "still queued");
        a.get_mut(i).unwrap().state = AlienState::Received;
        assert_eq!(a.received(s, pid(1, 2)), Ok(i));
        assert!(a.received(s, pid(1, 3)).is_err());
        assert_eq!(a.held_by(pid(1, 2)), vec![i]);
        assert!(a.is(i, 9) && !a.is(i, 8));
    }

    #[test]
    fn a_retransmission_gets_the_saved_answer_and_the_oldest_goes_first() {
        let mut st = Stats::default();
        let mut a = Aliens::new(1, 1, 1);
        let h = |seq| {
            let mut h = Header::new(PacketType::RemoteReply);
            h.seq = seq;
            h
        };
        for k in 0..4u16 {
            a.save(
                u64::from(k),
                pid(2, k + 2),
                h(7),
                Message::zero(),
                b"",
                &mut st,
            );
        }
        // The first saved is re-sent, so the second is now the oldest.
        assert!(matches!(
            a.known(pid(2, 2), 7, 10, &mut st),
            Known::Answer(PacketType::RemoteReply, _)
        ));
        a.save(11, pid(2, 9), h(7), Message::zero(), b"", &mut st);
        assert_eq!(st.saved_replies_evicted, 1);
        assert!(matches!(
            a.known(pid(2, 3), 7, 12, &mut st),
            Known::Sender {
                had_saved: false,
                ..
            }
        ));
        assert!(matches!(
            a.known(pid(2, 2), 8, 12, &mut st),
            Known::Sender {
                had_saved: true,
                ..
            }
        ));
        a.forget_saved(pid(2, 2));
        assert!(matches!(
            a.known(pid(2, 2), 7, 12, &mut st),
            Known::Sender {
                had_saved: false,
                ..
            }
        ));
    }

    #[test]
    fn freed_buffers_are_kept_only_up_to_the_budget() {
        let mut st = Stats::default();
        let n = 2 * RETAINED_MAX / MAX_APPEND;
        let mut a = Aliens::new(n, n, 1);
        let big = vec![7u8; MAX_APPEND];
        let slots: Vec<usize> = (0..n)
            .map(|k| {
                a.admit(alien(pid(2, k as u16 + 2), 1, 0), &big, 0, &mut st)
                    .unwrap()
            })
            .collect();
        assert!(a.retained >= n * MAX_APPEND, "all in use: {}", a.retained);
        for i in slots {
            a.free(i, &mut st);
        }
        assert!(a.retained <= RETAINED_MAX + MAX_APPEND, "{}", a.retained);
        let kept: usize = a.slots.iter().map(|s| s.data.capacity()).sum();
        assert_eq!(kept, a.retained, "the count is the buffers' capacity");
        // A small request reuses a kept buffer without growing it.
        let i = a.admit(alien(pid(3, 2), 1, 0), b"xy", 0, &mut st).unwrap();
        assert_eq!(a.data(i), b"xy");
        assert_eq!(kept, a.retained);
    }

    #[test]
    fn the_sweep_frees_what_went_quiet() {
        let mut st = Stats::default();
        let mut a = Aliens::new(2, 2, 1);
        a.admit(alien(pid(2, 5), 1, 0), b"", 0, &mut st).unwrap();
        a.save(
            0,
            pid(2, 6),
            Header::new(PacketType::RemoteReply),
            Message::zero(),
            b"",
            &mut st,
        );
        a.sweep(100, 100, &mut st);
        assert!(a.busy(), "not yet expired");
        a.sweep(101, 100, &mut st);
        assert_eq!(st.aliens_in_use, 0);
        assert!(a.busy(), "sequence numbers are kept twice as long");
        a.sweep(201, 100, &mut st);
        assert!(!a.busy());
    }
}
