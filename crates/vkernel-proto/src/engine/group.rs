//! Process groups (the thesis's chapter 6): one-to-many Send with 0, 1 or
//! many replies.
//!
//! A group id is a pid with the MSB set. Membership is recorded only on the
//! member's own host (a group descriptor per host, as in the thesis); the
//! kernel never knows the whole membership. A Send to a group gives a copy
//! of the message to each local member directly, and sends one RemoteSend
//! addressed to the group to every other host (IP multicast when
//! configured, else unicast fan-out to the known hosts). Each receiving
//! host hands a copy to each of its members. Members Receive normally and
//! Reply to the sender; the sender's kernel takes the first reply as the
//! Send's answer and, in multi-reply mode, queues later ones for GetReply
//! until the sender's next Send. A per-sender sequence number tells late
//! replies apart; a sweep frees unclaimed ones.
//!
//! Reliability is N-reliable, decided by the sender: a 1-reply or
//! multi-reply Send is retransmitted (to all hosts) until its first reply,
//! and each receiving host filters duplicates by (sender, seq), answering a
//! retransmission with replyPending while a member still holds the message,
//! and with the replies its members already sent. A multi-reply Send is
//! sent again a few times after its first reply while the sender still
//! gathers (until its next Send), so a later reply lost on the way is
//! answered again.
//!
//! Segments: members can read the first part of a read-granted segment
//! (appended, concurrently); only the first reply's reply-with-segment data
//! is written (the first replier gets exclusive write). MoveTo/MoveFrom and
//! Forward on a group message are not supported.

use std::collections::VecDeque;
use std::net::SocketAddr;

use rand::Rng;

use super::idmap::{new_map, IdMap};
use super::rights;
use super::{Completion, Engine, Event, PState, Pending, ReplyInfo};
use crate::config::{multicast_addr, Micros, MAX_APPEND};
use crate::error::IpcError;
use crate::message::{GroupMode, Message};
use crate::pid::Pid;
use crate::segment::Seg;
use crate::stats::DropReason;
use crate::wire::{self, Header, Packet, PacketType};

/// The well-known group of every host's kernel server: remote GetPid
/// queries travel on its transport, and a multi-reply query to it reaches
/// every logical host (host selection).
pub const KERNEL_SERVER_GROUP: Pid = Pid(Pid::GROUP_BIT | 1);

/// Later replies one sender may have queued; past it they are dropped.
const MAX_QUEUED_REPLIES: usize = 1024;

/// Whether a member has taken its copy yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CopyState {
    Queued,
    Received,
}

/// One local member's copy of a group message.
struct GroupCopy {
    src: Pid,
    principal: u32,
    seq: u32,
    member: Pid,
    msg: Message,
    data: Vec<u8>,
    mode: GroupMode,
    state: CopyState,
    /// The sender's kernel, or `None` for a sender on this host.
    addr: Option<SocketAddr>,
    at: Micros,
}

/// The newest group message seen from one remote sender (duplicate filter)
/// and the replies its members sent, to answer retransmissions.
struct Seen {
    seq: u32,
    at: Micros,
    replies: Vec<Vec<u8>>,
    /// Which of the 64 sequence numbers below `seq` have arrived (bit
    /// d - 1 for seq - d): a message overtaken by a later one from the
    /// same sender is still delivered, once.
    older: u64,
}

/// Marks `d` (1..=64) below the newest as seen; false if it already was
/// or is too old to tell.
fn mark_older(older: &mut u64, d: u32) -> bool {
    let Some(bit) = d.checked_sub(1).and_then(|k| 1u64.checked_shl(k)) else {
        return false;
    };
    let fresh = *older & bit == 0;
    *older |= bit;
    fresh
}

/// What a local sender's latest group Send still accepts.
struct SenderState {
    seq: u32,
    mode: GroupMode,
    /// False once the sender has moved on to another Send: replies that
    /// still arrive are late.
    open: bool,
    /// Members that replied (a duplicate reply is not queued twice).
    repliers: Vec<Pid>,
    queued: VecDeque<(Pid, Message)>,
    at: Micros,
    /// Multi-reply mode, once answered: copies still to send.
    gather: Option<Gather>,
}

/// A multi-reply Send's datagram, sent again after its first reply.
struct Gather {
    group: Pid,
    bytes: Vec<u8>,
    left: u8,
    rto: Micros,
    next: Micros,
}

/// Copies of a multi-reply Send sent after its first reply (each after
/// twice the previous wait).
const GATHER_RESENDS: u8 = 2;

/// The group state of one logical host.
pub(crate) struct Groups {
    members: IdMap<u32, Vec<Pid>>,
    copies: Vec<Option<GroupCopy>>,
    free: Vec<usize>,
    /// (member << 32 | sender) → copy index.
    by_pair: IdMap<u64, usize>,
    seen: IdMap<Pid, Seen>,
    senders: IdMap<u16, SenderState>,
}

fn pair(member: Pid, src: Pid) -> u64 {
    ((member.0 as u64) << 32) | src.0 as u64
}

impl Groups {
    pub(crate) fn new(seed: u64) -> Groups {
        Groups {
            members: new_map(seed),
            copies: Vec::new(),
            free: Vec::new(),
            by_pair: new_map(seed),
            seen: new_map(seed),
            senders: new_map(seed),
        }
    }

    fn copy(&self, i: usize) -> Option<&GroupCopy> {
        self.copies.get(i).and_then(|c| c.as_ref())
    }

    /// The sender of a queued group delivery, if it is still valid.
    pub(crate) fn pending_sender(&self, i: usize, seq: u32, receiver: Pid) -> Option<Pid> {
        self.copy(i)
            .filter(|c| c.seq == seq && c.member == receiver && c.state == CopyState::Queued)
            .map(|c| c.src)
    }

    /// Hands copy `i` to its member: (sender, message, appended bytes,
    /// sender's principal).
    /// A Reply by the member to that sender now answers this copy; an
    /// older one it still held from the same sender is given up (it could
    /// no longer be told apart).
    pub(crate) fn take(&mut self, i: usize) -> Option<(Pid, Message, &[u8], u32)> {
        let c = self.copies.get_mut(i)?.as_mut()?;
        c.state = CopyState::Received;
        let key = pair(c.member, c.src);
        if let Some(old) = self.by_pair.insert(key, i) {
            if old != i {
                if let Some(o) = self.copies.get_mut(old) {
                    if o.take().is_some() {
                        self.free.push(old);
                    }
                }
            }
        }
        let c = self.copies.get(i)?.as_ref()?;
        Some((c.src, c.msg, &c.data, c.principal))
    }

    fn free_copy(&mut self, i: usize) {
        if let Some(c) = self.copies.get_mut(i).and_then(|c| c.take()) {
            if self.by_pair.get(&pair(c.member, c.src)) == Some(&i) {
                self.by_pair.remove(&pair(c.member, c.src));
            }
            self.free.push(i);
        }
    }

    fn is_member(&self, group: Pid, pid: Pid) -> bool {
        self.members.get(&group.0).is_some_and(|m| m.contains(&pid))
    }
}

impl Engine {
    // ------------------------------------------------------------ membership

    /// AllocateGroupId: a fresh random group id outside the well-known
    /// range; `pid` (local) becomes its first member. Ids are not checked
    /// for collisions across hosts (the thesis's m²/n argument).
    pub fn allocate_group_id(&mut self, pid: Pid) -> Result<Pid, IpcError> {
        if !self.process_exists(pid) {
            return Err(IpcError::NotAProcess(pid));
        }
        let g = loop {
            let g = Pid(self.rng.gen::<u32>() | Pid::GROUP_BIT);
            if !g.is_well_known_group() && !self.groups.members.contains_key(&g.0) {
                break g;
            }
        };
        self.join_group(g, pid, pid)?;
        Ok(g)
    }

    /// JoinGroup for a process of this host, asked by `requester` (which
    /// may be on another host; the group policy decides). The runtime
    /// carries requests for processes on other hosts to those hosts'
    /// kernel servers.
    pub fn join_group(&mut self, group: Pid, pid: Pid, requester: Pid) -> Result<(), IpcError> {
        if !group.is_group() {
            return Err(IpcError::InvalidPid(group));
        }
        if !self.process_exists(pid) {
            return Err(IpcError::NoSuchProcess(pid));
        }
        if !self.is_local(requester) {
            let p = &self.cfg.group_policy;
            if p.refuse_remote_joins || !p.trusts(requester.host()) {
                return Err(IpcError::AccessDenied(group));
            }
        } else {
            self.may_change_membership(group, pid, requester, true)?;
        }
        let m = self.groups.members.entry(group.0).or_default();
        if m.contains(&pid) {
            return Ok(());
        }
        m.push(pid);
        if m.len() == 1 {
            if let Some(port) = self.cfg.multicast_port {
                self.out
                    .event(Event::JoinMulticast(multicast_addr(group, port)));
            }
        }
        Ok(())
    }

    /// LeaveGroup for a process of this host (see [`Engine::join_group`]).
    /// Leaving a group one is not in is not an error.
    pub fn leave_group(&mut self, group: Pid, pid: Pid, requester: Pid) -> Result<(), IpcError> {
        if !group.is_group() {
            return Err(IpcError::InvalidPid(group));
        }
        if !self.is_local(pid) {
            return Err(IpcError::InvalidPid(pid));
        }
        if !self.is_local(requester) && requester != pid {
            let p = &self.cfg.group_policy;
            if p.refuse_remote_joins || !p.trusts(requester.host()) {
                return Err(IpcError::AccessDenied(group));
            }
        } else if self.is_local(requester) {
            self.may_change_membership(group, pid, requester, false)?;
        }
        self.remove_member(group, pid);
        Ok(())
    }

    /// The rule of a host shared by several users, for a request from a
    /// local process: a requester running as a principal other than 0
    /// may join or remove only processes of its own principal, and may
    /// join a group only if the group's members on this host (if any)
    /// all run as its principal. Principal 0 (root's programs on a
    /// machine host, the host's own processes, an embedded program's
    /// processes unless they set one) may do either.
    fn may_change_membership(
        &self,
        group: Pid,
        pid: Pid,
        requester: Pid,
        join: bool,
    ) -> Result<(), IpcError> {
        let who = self.principal_of(requester);
        if who == 0 {
            return Ok(());
        }
        if self.principal_of(pid) != who {
            return Err(IpcError::AccessDenied(pid));
        }
        let held_by_other = |m: &Vec<Pid>| m.iter().any(|&p| self.principal_of(p) != who);
        if join && self.groups.members.get(&group.0).is_some_and(held_by_other) {
            return Err(IpcError::AccessDenied(group));
        }
        Ok(())
    }

    fn remove_member(&mut self, group: Pid, pid: Pid) {
        let Some(m) = self.groups.members.get_mut(&group.0) else {
            return;
        };
        m.retain(|&p| p != pid);
        if m.is_empty() {
            self.groups.members.remove(&group.0);
            if let Some(port) = self.cfg.multicast_port {
                self.out
                    .event(Event::LeaveMulticast(multicast_addr(group, port)));
            }
        }
    }

    /// The local members of `group`.
    pub fn group_members(&self, group: Pid) -> Vec<Pid> {
        self.groups
            .members
            .get(&group.0)
            .cloned()
            .unwrap_or_default()
    }

    /// Forgets a destroyed process's memberships, copies and queued replies.
    pub(crate) fn group_forget(&mut self, pid: Pid) {
        let groups: Vec<u32> = self
            .groups
            .members
            .iter()
            .filter(|(_, m)| m.contains(&pid))
            .map(|(&g, _)| g)
            .collect();
        for g in groups {
            self.remove_member(Pid(g), pid);
        }
        let held: Vec<usize> = (0..self.groups.copies.len())
            .filter(|&i| self.groups.copy(i).is_some_and(|c| c.member == pid))
            .collect();
        for i in held {
            self.groups.free_copy(i);
        }
        self.groups.senders.remove(&pid.local());
    }

    /// GetReply: the next queued reply to `pid`'s latest multi-reply group
    /// Send, or `None`.
    pub fn get_reply(&mut self, pid: Pid) -> Option<(Pid, Message)> {
        if !self.is_local(pid) {
            return None;
        }
        self.groups
            .senders
            .get_mut(&pid.local())?
            .queued
            .pop_front()
    }

    // ------------------------------------------------------------------ Send

    /// A new Send by `src` ends whatever its previous group Send accepted.
    pub(crate) fn group_new_send(&mut self, src: Pid) {
        if let Some(s) = self.groups.senders.get_mut(&src.local()) {
            s.open = false;
            s.queued.clear();
            s.gather = None;
        }
    }

    /// Send to a group (called by [`Engine::send`] with the sender already
    /// checked and its exchange recorded).
    pub(crate) fn group_send(
        &mut self,
        now: Micros,
        src: Pid,
        group: Pid,
        msg: Message,
        seg: Option<&Seg>,
        seq: u32,
    ) -> Result<GroupMode, IpcError> {
        let mode = msg.group_mode().ok_or(IpcError::InvalidPid(group))?;
        self.stats.group_sends += 1;
        self.groups.senders.insert(
            src.local(),
            SenderState {
                seq,
                mode,
                open: true,
                repliers: Vec::new(),
                queued: VecDeque::new(),
                at: now,
                gather: None,
            },
        );
        // Local members get their copies without the network.
        let append = rights::appends(msg.seg_access(), &msg);
        let mut data = Vec::new();
        if let Some(s) = seg.filter(|_| append) {
            s.append_to(0, s.len().min(MAX_APPEND), &mut data);
        }
        let members = self.group_members(group);
        let principal = self.principal_of(src);
        for m in members {
            if m != src {
                self.deliver_copy(now, src, seq, m, msg, &data, mode, None, principal);
            }
        }
        Ok(mode)
    }

    /// Where a group message goes: the multicast address, or every known
    /// host (discovery list and location cache).
    pub(crate) fn group_dests(&self, group: Pid) -> Vec<SocketAddr> {
        if let Some(port) = self.cfg.multicast_port {
            return vec![multicast_addr(group, port)];
        }
        let mut v = self.cfg.discovery.clone();
        for a in self.location.addrs() {
            if !v.contains(&a) {
                v.push(a);
            }
        }
        v
    }

    /// Queues a copy of a group message for a local member.
    #[allow(clippy::too_many_arguments)]
    fn deliver_copy(
        &mut self,
        now: Micros,
        src: Pid,
        seq: u32,
        member: Pid,
        msg: Message,
        data: &[u8],
        mode: GroupMode,
        addr: Option<SocketAddr>,
        principal: u32,
    ) {
        // A member that does not admit the sender's principal gets nothing.
        if !self.admits(member, principal) {
            return;
        }
        let i = match self.groups.free.pop() {
            Some(i) => i,
            None if self.groups.copies.len() < self.cfg.group_copies => {
                self.groups.copies.push(None);
                self.groups.copies.len() - 1
            }
            None => {
                self.stats.group_copies_exhausted += 1;
                return;
            }
        };
        let mut m = msg;
        m.set_seg_addr(0);
        self.groups.copies[i] = Some(GroupCopy {
            src,
            principal,
            seq,
            member,
            msg: m,
            data: data.to_vec(),
            mode,
            state: CopyState::Queued,
            addr,
            at: now,
        });
        self.stats.group_deliveries += 1;
        self.arm(now + self.cfg.alien_timeout);
        self.enqueue(now, member, Pending::Group(i, seq));
    }

    /// A RemoteSend addressed to a group.
    pub(crate) fn on_group_send(&mut self, now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
        let h = pkt.header;
        if !self.cfg.group_policy.trusts(h.src.host()) {
            self.stats.drop(DropReason::Untrusted);
            return;
        }
        let Some(mode) = pkt.msg.group_mode() else {
            self.stats.drop(DropReason::Malformed);
            return;
        };
        if let Some(s) = self.groups.seen.get_mut(&h.src) {
            if s.seq == h.seq {
                // A retransmission: re-send the replies already made and say
                // a member is still at work if one is.
                s.at = now;
                let replies = s.replies.clone();
                self.stats.duplicates += 1;
                for r in replies {
                    self.emit_raw(from, PacketType::RemoteReply, r);
                }
                let working = self
                    .groups
                    .copies
                    .iter()
                    .flatten()
                    .find(|c| c.src == h.src && c.seq == h.seq && c.addr.is_some());
                if let (Some(c), false) = (working, mode == GroupMode::NoReply) {
                    let member = c.member;
                    self.reply_pending(from, h.src, member, h.seq);
                }
                return;
            }
            if super::seq_older(h.seq, s.seq) {
                // Several threads read the socket, so a group message can be
                // handled after a later one from the same sender: a
                // notification (the sender does not wait for it), or a
                // Send answered by another host first. Deliver it if it is
                // new; a reply to it reaches the sender late and is dropped
                // there.
                let d = s.seq.wrapping_sub(h.seq);
                if !mark_older(&mut s.older, d) {
                    self.stats.drop(DropReason::Stale);
                    return;
                }
                return self.deliver_group_copies(now, from, pkt, mode);
            }
        }
        let older = match self.groups.seen.get(&h.src) {
            Some(prev) => {
                let shift = h.seq.wrapping_sub(prev.seq);
                let mut o = prev.older.checked_shl(shift).unwrap_or(0);
                mark_older(&mut o, shift);
                o
            }
            None => 0,
        };
        self.groups.seen.insert(
            h.src,
            Seen {
                seq: h.seq,
                at: now,
                replies: Vec::new(),
                older,
            },
        );
        self.deliver_group_copies(now, from, pkt, mode);
    }

    /// Queues a copy of a group message for each local member.
    fn deliver_group_copies(
        &mut self,
        now: Micros,
        from: SocketAddr,
        pkt: &Packet<'_>,
        mode: GroupMode,
    ) {
        let h = pkt.header;
        let mut msg = pkt.msg;
        msg.set_seg_len(h.total_length);
        let members = self.group_members(h.dst);
        for m in members {
            self.deliver_copy(
                now,
                h.src,
                h.seq,
                m,
                msg,
                pkt.data,
                mode,
                Some(from),
                h.user,
            );
        }
    }

    // ----------------------------------------------------------------- Reply

    /// Reply by a member to a group message it received from `to`. `None`
    /// if `replier` holds no group message from `to` (the caller then
    /// reports the ordinary error).
    pub(crate) fn group_reply(
        &mut self,
        now: Micros,
        replier: Pid,
        to: Pid,
        msg: Message,
        seg: Option<(u32, &[u8])>,
    ) -> Option<Result<(), IpcError>> {
        let &i = self.groups.by_pair.get(&pair(replier, to))?;
        let c = self.groups.copy(i)?;
        if c.state != CopyState::Received {
            return None;
        }
        let (seq, mode, addr) = (c.seq, c.mode, c.addr);
        self.groups.free_copy(i);
        if mode == GroupMode::NoReply {
            // 0-reply: replies cause no traffic.
            return Some(Ok(()));
        }
        let data = seg.map_or(&[][..], |(_, d)| d);
        let off = seg.map_or(0, |(o, _)| o);
        match addr {
            None => {
                self.group_reply_arrived(now, to, seq, replier, msg, off, data);
                Some(Ok(()))
            }
            Some(a) => {
                let mut h = Header::new(PacketType::RemoteReply);
                h.seq = seq;
                h.src = replier;
                h.dst = to;
                h.forwarder = replier;
                if !data.is_empty() {
                    h.remote_addr = off;
                    h.total_length = data.len() as u32;
                }
                let bytes = wire::encode(&h, &msg, data);
                self.emit_raw(a, PacketType::RemoteReply, bytes.clone());
                if let Some(s) = self.groups.seen.get_mut(&to) {
                    if s.seq == seq {
                        s.replies.push(bytes);
                    }
                }
                Some(Ok(()))
            }
        }
    }

    /// True if a RemoteReply is for a group Send of `h.dst` (handled here).
    pub(crate) fn on_group_reply(&mut self, now: Micros, pkt: &Packet<'_>) -> bool {
        let h = pkt.header;
        // Ours if it answers the sender's group Send, or a recent one (a
        // late reply) and no one-to-one exchange of the sender matches it.
        let for_group = match self.groups.senders.get(&h.dst.local()) {
            Some(s) if self.is_local(h.dst) => {
                s.seq == h.seq
                    || !self
                        .outgoing(h.dst)
                        .is_some_and(|o| o.seq == h.seq && !o.dst.is_group())
            }
            _ => false,
        };
        if !for_group {
            return false;
        }
        if !self.cfg.group_policy.trusts(h.src.host()) {
            self.stats.drop(DropReason::Untrusted);
            return true;
        }
        self.group_reply_arrived(now, h.dst, h.seq, h.src, pkt.msg, h.remote_addr, pkt.data);
        true
    }

    /// A member's reply reaches the sender's kernel: the first answers the
    /// Send, later ones queue (multi-reply) or are dropped.
    #[allow(clippy::too_many_arguments)]
    fn group_reply_arrived(
        &mut self,
        now: Micros,
        sender: Pid,
        seq: u32,
        from: Pid,
        msg: Message,
        off: u32,
        data: &[u8],
    ) {
        let Some(s) = self.groups.senders.get_mut(&sender.local()) else {
            self.stats.drop(DropReason::LateReply);
            return;
        };
        if s.seq == seq && s.repliers.contains(&from) {
            // Made again for a later copy of the Send.
            self.stats.duplicates += 1;
            return;
        }
        if s.seq != seq || !s.open {
            self.stats.drop(DropReason::LateReply);
            return;
        }
        s.repliers.push(from);
        self.stats.group_replies += 1;
        let first = s.repliers.len() == 1;
        let mode = s.mode;
        if !first {
            if mode == GroupMode::Many && s.queued.len() < MAX_QUEUED_REPLIES {
                s.queued.push_back((from, msg));
            } else {
                self.stats.drop(DropReason::LateReply);
            }
            return;
        }
        // The first reply answers the Send; its segment data is written
        // (the first replier's exclusive write).
        let mut n = 0;
        let sample = match self.proc_mut(sender).map(|p| &mut p.state) {
            Some(PState::Sending(o)) if o.seq == seq => {
                if !data.is_empty() {
                    match rights::write(o.access, o.seg.as_mut(), off as usize, data.len()) {
                        Ok(seg) => match seg.write_at(off as usize, data) {
                            true => n = data.len(),
                            false => self.stats.drop(DropReason::SegmentViolation),
                        },
                        Err(_) => self.stats.drop(DropReason::SegmentViolation),
                    }
                }
                true
            }
            _ => false,
        };
        if sample {
            if mode == GroupMode::Many {
                self.start_gather(now, sender);
            }
            self.complete(
                sender,
                Completion::Send(Ok(ReplyInfo {
                    msg,
                    seg_bytes: n,
                    from,
                })),
            );
        }
    }

    // ---------------------------------------------------------------- timers

    /// Keeps `sender`'s answered multi-reply Send to send again.
    fn start_gather(&mut self, now: Micros, sender: Pid) {
        let rto = self
            .outgoing(sender)
            .and_then(|o| o.remote.as_ref())
            .map_or(self.cfg.min_rto, |r| r.rto());
        let Some((group, bytes)) = self.encode_send(sender, true) else {
            return;
        };
        if !group.is_group() {
            return;
        }
        let next = now + rto;
        if let Some(s) = self.groups.senders.get_mut(&sender.local()) {
            s.gather = Some(Gather {
                group,
                bytes,
                left: GATHER_RESENDS,
                rto,
                next,
            });
            self.arm(next);
        }
    }

    /// Sends the due copies of answered multi-reply Sends.
    pub(crate) fn group_timers(&mut self, now: Micros, next: &mut Micros) {
        let due: Vec<u16> = self
            .groups
            .senders
            .iter()
            .filter_map(|(&l, s)| {
                let g = s.gather.as_ref()?;
                if now >= g.next {
                    return Some(l);
                }
                *next = (*next).min(g.next);
                None
            })
            .collect();
        let max_rto = self.max_rto();
        for l in due {
            let Some(s) = self.groups.senders.get_mut(&l) else {
                continue;
            };
            let Some(mut g) = s.gather.take() else {
                continue;
            };
            g.left = g.left.saturating_sub(1);
            g.rto = (g.rto * 2).min(max_rto);
            g.next = now + g.rto;
            let (group, bytes) = (g.group, g.bytes.clone());
            if g.left > 0 {
                *next = (*next).min(g.next);
                s.gather = Some(g);
            }
            self.stats.retransmits += 1;
            for to in self.group_dests(group) {
                self.emit_raw(to, PacketType::RemoteSend, bytes.clone());
            }
        }
    }

    /// Frees unclaimed copies, queued replies and duplicate-filter entries.
    pub(crate) fn group_sweep(&mut self, now: Micros) {
        let keep = self.cfg.alien_timeout;
        let old: Vec<usize> = (0..self.groups.copies.len())
            .filter(|&i| {
                self.groups
                    .copy(i)
                    .is_some_and(|c| now.saturating_sub(c.at) > keep)
            })
            .collect();
        for i in old {
            self.groups.free_copy(i);
        }
        // A sender still blocked in its group Send keeps its state.
        let host = self.host_id();
        let stale: Vec<u16> = self
            .groups
            .senders
            .iter()
            .filter(|(&l, s)| {
                let blocked = host.is_some_and(
                    |h| matches!(self.outgoing(Pid::new(h, l)), Some(o) if o.seq == s.seq),
                );
                now.saturating_sub(s.at) > keep && !blocked
            })
            .map(|(&l, _)| l)
            .collect();
        for l in stale {
            self.groups.senders.remove(&l);
        }
        self.groups
            .seen
            .retain(|_, s| now.saturating_sub(s.at) <= 2 * keep);
    }

    /// True while the group layer holds anything the sweep must free.
    pub(crate) fn group_busy(&self) -> bool {
        !self.groups.senders.is_empty()
            || !self.groups.seen.is_empty()
            || self.groups.free.len() < self.groups.copies.len()
    }

    /// True if `pid` is a member of `group` on this host.
    pub fn is_group_member(&self, group: Pid, pid: Pid) -> bool {
        self.groups.is_member(group, pid)
    }
}
