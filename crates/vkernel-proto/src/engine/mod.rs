//! The sans-IO kernel of one logical host.
//!
//! [`Engine`] owns every piece of IPC state of a logical host: the process
//! table and message queues, alien descriptors for remote senders, remote
//! exchanges in progress, bulk transfers, the logical-id map and the location
//! cache. It never touches a socket or a clock: callers feed it datagrams and
//! the current time, and drain [`Transmit`]s, [`Event`]s and a timer deadline.
//! That keeps it deterministic, so a seeded simulator can drive it through
//! loss, duplication, reordering and crashes.

mod aliens;
mod bitset;
mod bulk;
mod group;
mod idmap;
mod location;
mod naming;
mod output;
mod rights;
mod timers;

use std::collections::VecDeque;
use std::net::SocketAddr;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub use group::KERNEL_SERVER_GROUP;
pub use naming::Scope;

use crate::config::{Config, Micros, MAX_APPEND};
use crate::error::IpcError;
use crate::message::{Message, SegAccess};
use crate::pid::{HostId, Pid};
use crate::rtt::Rtt;
use crate::segment::Seg;
use crate::stats::{DropReason, Stats};
use crate::wire::{self, Header, Packet, PacketType, Status, F_RETRANSMIT};

use aliens::{Alien, AlienState, Aliens, Known};
use bulk::{InBulk, MoveOp};
use idmap::{new_map, IdMap};
use output::{Chunk, ChunkSrc, Output};
use rights::Need;
use timers::Timers;

/// Local id reserved for the kernel-server process of every logical host.
pub const KERNEL_SERVER_LOCAL_ID: u16 = 1;

/// A datagram the runtime must send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination address.
    pub to: SocketAddr,
    /// The encoded packet.
    pub data: Vec<u8>,
}

/// Something the runtime must act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The blocked operation of this process has completed; call
    /// [`Engine::take_completion`].
    Wake(Pid),
    /// The logical host id is allocated; processes may be created.
    HostReady(HostId),
    /// Another host complained that our fixed host id is in use.
    HostIdConflict(HostId),
    /// The first local member joined a group: receive this multicast group.
    JoinMulticast(SocketAddr),
    /// The last local member left a group: stop receiving its multicast group.
    LeaveMulticast(SocketAddr),
}

/// A message handed to a receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// The sender (the original sender after a Forward).
    pub from: Pid,
    /// The message.
    pub msg: Message,
    /// Bytes of the sender's segment copied into the receive buffer.
    pub seg_bytes: usize,
    /// The process that forwarded it (== `from` if not forwarded).
    pub forwarder: Pid,
    /// The sender's principal (the thesis's `userNumber`; 0 = none).
    pub principal: u32,
}

/// The reply a Send returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyInfo {
    /// The reply message.
    pub msg: Message,
    /// Bytes the replier wrote into the sender's segment with the reply.
    pub seg_bytes: usize,
    /// The process that replied.
    pub from: Pid,
}

/// Result of a blocked operation, taken with [`Engine::take_completion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// A Send finished.
    Send(Result<ReplyInfo, IpcError>),
    /// A Receive got a message.
    Receive(Result<Received, IpcError>),
    /// A MoveTo or MoveFrom finished (bytes moved).
    Move(Result<usize, IpcError>),
    /// A GetPid finished (null pid: not found).
    GetPid(Result<Pid, IpcError>),
}

/// Retransmission state of a remote Send.
#[derive(Debug)]
struct Retx {
    sent_at: Micros,
    next: Micros,
    rto: Micros,
    deadline: Micros,
    retransmitted: bool,
}

/// A Send in progress, kept in the sender's descriptor.
struct Outgoing {
    /// The sender's principal, carried in every datagram of the exchange.
    principal: u32,
    /// When the Send began (latency histograms).
    started: Micros,
    dst: Pid,
    seq: u32,
    msg: Message,
    seg: Option<Seg>,
    access: SegAccess,
    /// At most this many bytes of a read segment travel with the message
    /// (the rest is left for MoveFrom).
    append: usize,
    forwarder: Pid,
    /// The (local) receiver has taken the message.
    received: bool,
    remote: Option<Retx>,
    /// MoveTo transfers arriving into our segment from remote movers.
    inbound: Vec<InBulk>,
    /// Reply data sent ahead went missing once: ask for it to be moved.
    no_ahead: bool,
    /// The Send fails with [`IpcError::Deadline`] if not replied to by then.
    deadline: Option<Micros>,
}

enum PState {
    Ready,
    Receiving {
        from: Option<Pid>,
        buf: Option<Seg>,
        /// Copy into `buf` only from segments at most this long.
        upto: usize,
    },
    Sending(Box<Outgoing>),
    Moving(Box<MoveOp>),
    GettingPid {
        qseq: u32,
    },
}

/// A message queued for a receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    /// From a local sender (the message lives in its descriptor).
    Local(Pid),
    /// From a remote sender (slot, sequence number).
    Alien(usize, u32),
    /// A copy of a group message (copy index, sequence number).
    Group(usize, u32),
}

struct Proc {
    state: PState,
    queue: VecDeque<Pending>,
    completion: Option<Completion>,
    /// The principal this process runs as.
    principal: u32,
    /// If set, only senders with these principals may Send to it.
    admits: Option<Vec<u32>>,
    /// The box of this process's last finished Send, reused by its next
    /// one: a local exchange's box would otherwise be allocated by the
    /// sender's thread and freed by the replier's, every exchange.
    spare: Option<Box<Outgoing>>,
}

enum HostState {
    Allocating {
        candidate: HostId,
        nonce: u32,
        deadline: Micros,
        next_announce: Micros,
    },
    Ready {
        id: HostId,
        nonce: u32,
    },
}

/// Where a packet goes.
#[derive(Clone, Copy)]
enum Dest {
    Addr(SocketAddr),
    Discovery,
}

/// The protocol engine of one logical host. See the module docs.
pub struct Engine {
    cfg: Config,
    host: HostState,
    rng: SmallRng,
    procs: IdMap<u16, Proc>,
    next_local: u16,
    next_seq: u32,
    aliens: Aliens,
    location: location::Locations,
    rtt: IdMap<HostId, Rtt>,
    names: naming::Names,
    groups: group::Groups,
    out: Output,
    timers: Timers,
    stats: Stats,
    auth: Option<crate::auth::Auth>,
    /// Decryption buffer for incoming datagrams (AEAD mode).
    open_buf: Vec<u8>,
    /// The data of a reply sent ahead in chunks ([`Engine::reply_ahead`]),
    /// lent until those chunks are sent or encoded.
    reply_src: Option<Seg>,
    /// The datagram being handled had its data received in place (see
    /// [`Engine::handle_placed`]).
    placed: bool,
    /// The process whose own thread is calling the engine (see
    /// [`Engine::set_caller`]), and its completion, kept for
    /// [`Engine::take_own`] instead of being announced by an event.
    caller: Option<Pid>,
    own: Option<Completion>,
}

/// Serial-number comparison: is `a` older than `b` within a window?
fn seq_older(a: u32, b: u32) -> bool {
    let d = b.wrapping_sub(a);
    d != 0 && d < (1 << 20)
}

impl Engine {
    /// A new engine. With no fixed host id it starts announcement–complaint.
    pub fn new(cfg: Config, now: Micros) -> Engine {
        let mut rng = SmallRng::seed_from_u64(cfg.seed);
        let hs = rng.gen::<u64>();
        let nonce = rng.gen::<u32>() | 1;
        let host = match cfg.host_id {
            Some(id) => HostState::Ready { id, nonce },
            None => HostState::Allocating {
                candidate: HostId(rng.gen_range(1..=HostId::MAX)),
                nonce,
                deadline: now + cfg.alloc_timeout,
                next_announce: now,
            },
        };
        let cfg_auth = cfg.auth.clone();
        let mut e = Engine {
            next_local: rng.gen_range(2..0x8000),
            next_seq: rng.gen(),
            aliens: Aliens::new(cfg.alien_pool, cfg.alien_per_host, hs),
            location: location::Locations::new(cfg.location_cache, hs),
            cfg,
            host,
            rng,
            procs: new_map(hs),
            rtt: new_map(hs),
            names: naming::Names::new(hs),
            groups: group::Groups::new(hs),
            out: Output::default(),
            timers: Timers::new(now),
            stats: Stats::default(),
            auth: cfg_auth.map(|a| crate::auth::Auth::new(a, now)),
            open_buf: Vec::new(),
            reply_src: None,
            placed: false,
            caller: None,
            own: None,
        };
        if let HostState::Ready { id, nonce } = e.host {
            e.out.event(Event::HostReady(id));
            e.announce(id, nonce);
        }
        e
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The logical host id, once allocated.
    pub fn host_id(&self) -> Option<HostId> {
        match self.host {
            HostState::Ready { id, .. } => Some(id),
            HostState::Allocating { .. } => None,
        }
    }

    fn my_host(&self) -> Result<HostId, IpcError> {
        self.host_id().ok_or(IpcError::NoHostId)
    }

    /// Protocol counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Number of live local processes.
    pub fn process_count(&self) -> usize {
        self.procs.len()
    }

    /// Messages queued for local receivers (not yet received).
    pub fn queued_messages(&self) -> usize {
        self.procs.values().map(|p| p.queue.len()).sum()
    }

    /// The latest time an entry point was given: datagrams sealed later
    /// carry counters that follow it (see `auth::COUNTER_LAG`).
    fn tick(&mut self, now: Micros) {
        if let Some(a) = self.auth.as_mut() {
            a.tick(now);
        }
    }

    /// Next datagram to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some(t) = self.out.pop_notice() {
            return Some(t);
        }
        if self.out.has_chunks() {
            self.encode_chunks();
        }
        let mut t = self.out.pop()?;
        // Named before sealing: the port is under the MAC.
        if self.cfg.reply_port != 0 {
            if let Some(mut r) = wire::RawHeader::new_checked(&mut t.data[..]) {
                r.set_reply_port(self.cfg.reply_port);
            }
        }
        if self.cfg.metrics && t.data.len() >= wire::FIXED_BYTES {
            let d = &t.data;
            let r = wire::RawHeader::new_checked(&d[..]);
            if let Some((pt, dst)) = r.and_then(|r| Some((r.ptype()?, r.dst()))) {
                let len = d.len();
                self.stats
                    .datagram(true, dst.host().0, pt, len, len - wire::FIXED_BYTES);
            }
        }
        // Sealed here, on the way out, so every transmission (and every
        // re-send of a kept answer) gets a fresh counter.
        if let Some(a) = self.auth.as_mut() {
            a.seal(&mut t.data);
        }
        Some(t)
    }

    /// Hands back a sent datagram's buffer for reuse by a later message
    /// (kept only if small, and only a few).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.out.recycle(buf);
    }

    /// [`Engine::poll_transmit`] into the caller's buffer: the next
    /// datagram replaces `buf`'s contents and its destination is returned;
    /// `buf`'s old allocation is kept for a later datagram (the two are
    /// swapped, nothing is copied).
    pub fn poll_transmit_into(&mut self, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        let t = self.poll_transmit()?;
        let old = std::mem::replace(buf, t.data);
        self.out.recycle(old);
        Some(t.to)
    }

    /// Next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.poll_event()
    }

    /// Earliest time at which [`Engine::handle_timeout`] has work (may be early).
    pub fn poll_timeout(&self) -> Micros {
        self.timers.deadline()
    }

    /// The completion of `pid`'s blocked operation, if it has completed.
    pub fn take_completion(&mut self, pid: Pid) -> Option<Completion> {
        if self.caller == Some(pid) {
            if let Some(c) = self.own.take() {
                return Some(c);
            }
        }
        self.procs.get_mut(&pid.local())?.completion.take()
    }

    /// Says which process's own thread makes the engine calls that follow
    /// (`None`: another thread). Its completion is then kept for
    /// [`Engine::take_own`], with no [`Event::Wake`]: the thread that
    /// wants it is the one calling, so the runtime need not look for it.
    pub fn set_caller(&mut self, pid: Option<Pid>) {
        if let (Some(c), Some(who)) = (self.own.take(), self.caller) {
            // Not taken: hand it over the usual way.
            if let Some(p) = self.procs.get_mut(&who.local()) {
                p.completion = Some(c);
                self.out.event(Event::Wake(who));
            }
        }
        self.caller = pid;
    }

    /// The caller's completion (see [`Engine::set_caller`]), if one came.
    pub fn take_own(&mut self) -> Option<Completion> {
        self.own.take()
    }

    /// True if datagrams, bulk chunks or events wait to be taken.
    pub fn has_output(&self) -> bool {
        self.out.any()
    }

    fn arm(&mut self, t: Micros) {
        self.timers.arm(t);
    }

    fn new_seq(&mut self) -> u32 {
        self.next_seq = self.next_seq.wrapping_add(1);
        self.next_seq
    }

    fn is_local(&self, pid: Pid) -> bool {
        self.host_id() == Some(pid.host())
    }

    fn proc_mut(&mut self, pid: Pid) -> Option<&mut Proc> {
        if !self.is_local(pid) {
            return None;
        }
        self.procs.get_mut(&pid.local())
    }

    fn complete(&mut self, pid: Pid, c: Completion) {
        let own = self.caller == Some(pid);
        let Some(p) = self.proc_mut(pid) else { return };
        p.set_state(PState::Ready);
        if own {
            self.own = Some(c);
        } else {
            p.completion = Some(c);
            self.out.event(Event::Wake(pid));
        }
    }

    fn rto_for(&self, host: HostId) -> Micros {
        self.rtt.get(&host).copied().unwrap_or_default().rto(
            self.cfg.initial_rto,
            self.cfg.min_rto,
            self.max_rto(),
        )
    }

    /// Ceiling of the retransmission timeout: an eighth of the host timeout
    /// at most, so a busy-but-alive peer is polled (and answers replyPending)
    /// often enough that a few lost polls in a row do not look like death.
    pub(crate) fn max_rto(&self) -> Micros {
        self.cfg
            .max_rto
            .min(self.cfg.host_timeout / 8)
            .max(self.cfg.min_rto)
    }

    /// The smoothed round-trip time to `host`, if measured.
    pub fn srtt(&self, host: HostId) -> Option<Micros> {
        self.rtt.get(&host).and_then(|r| r.srtt())
    }

    // ---------------------------------------------------------------- output

    fn emit(&mut self, dest: Dest, h: &Header, msg: &Message, data: &[u8]) {
        // Encoded into the datagram's own buffer (with room for the
        // authentication trailer), not into a scratch buffer then copied.
        let buf = self.out.encode(h, msg, data);
        match dest {
            Dest::Addr(to) => self.emit_raw(to, h.ptype, buf),
            Dest::Discovery => {
                for to in self.cfg.discovery.clone() {
                    self.emit_raw(to, h.ptype, buf.clone());
                }
            }
        }
    }

    fn emit_raw(&mut self, to: SocketAddr, ptype: PacketType, bytes: Vec<u8>) {
        self.stats.tx_type(ptype, bytes.len());
        self.out.push(to, bytes);
    }

    fn lookup(&mut self, host: HostId) -> Option<SocketAddr> {
        self.location.lookup(host)
    }

    fn learn(&mut self, host: HostId, addr: SocketAddr) {
        if host.is_valid() && Some(host) != self.host_id() {
            self.location.learn(host, addr);
        }
    }

    /// The cached address of a logical host.
    pub fn location_of(&self, host: HostId) -> Option<SocketAddr> {
        self.location.get(host)
    }

    /// Adds an address to query when a host's location is unknown.
    pub fn add_discovery(&mut self, a: SocketAddr) {
        if !self.cfg.discovery.contains(&a) {
            self.cfg.discovery.push(a);
        }
    }

    // ------------------------------------------------------------- processes

    /// Creates a process; its pid's local part comes from a counter.
    pub fn create_process(&mut self) -> Result<Pid, IpcError> {
        let host = self.my_host()?;
        for _ in 0..0x10000 {
            let l = self.next_local;
            self.next_local = self.next_local.wrapping_add(1);
            if l <= KERNEL_SERVER_LOCAL_ID || self.procs.contains_key(&l) {
                continue;
            }
            self.procs.insert(l, Proc::new());
            return Ok(Pid::new(host, l));
        }
        Err(IpcError::TableFull)
    }

    /// Creates the kernel-server process (fixed local id 1).
    pub fn create_kernel_server(&mut self) -> Result<Pid, IpcError> {
        let host = self.my_host()?;
        if self.procs.contains_key(&KERNEL_SERVER_LOCAL_ID) {
            return Err(IpcError::Busy(Pid::new(host, KERNEL_SERVER_LOCAL_ID)));
        }
        self.procs.insert(KERNEL_SERVER_LOCAL_ID, Proc::new());
        let pid = Pid::new(host, KERNEL_SERVER_LOCAL_ID);
        self.join_group(KERNEL_SERVER_GROUP, pid, pid)?;
        Ok(pid)
    }

    /// True if `pid` is a live process of this host.
    pub fn process_exists(&self, pid: Pid) -> bool {
        self.is_local(pid) && pid.is_process() && self.procs.contains_key(&pid.local())
    }

    /// Sets the principal `pid` runs as (carried with its Sends).
    pub fn set_principal(&mut self, pid: Pid, principal: u32) -> Result<(), IpcError> {
        let p = self.proc_mut(pid).ok_or(IpcError::NotAProcess(pid))?;
        p.principal = principal;
        Ok(())
    }

    /// Restricts who may Send to `pid`: only senders running as one of
    /// `principals` (`None` lifts the restriction). Others get
    /// [`IpcError::AccessDenied`].
    pub fn restrict_senders(
        &mut self,
        pid: Pid,
        principals: Option<Vec<u32>>,
    ) -> Result<(), IpcError> {
        let p = self.proc_mut(pid).ok_or(IpcError::NotAProcess(pid))?;
        p.admits = principals;
        Ok(())
    }

    /// The principal a local process runs as (0 if unknown).
    pub fn principal_of(&self, pid: Pid) -> u32 {
        if !self.is_local(pid) {
            return 0;
        }
        self.procs.get(&pid.local()).map_or(0, |p| p.principal)
    }

    /// True if local process `dst` accepts Sends from `principal`.
    fn admits(&self, dst: Pid, principal: u32) -> bool {
        self.procs
            .get(&dst.local())
            .and_then(|p| p.admits.as_ref())
            .is_none_or(|a| a.contains(&principal))
    }

    /// Destroys a local process: its blocked operation fails, senders waiting
    /// on it get `NoSuchProcess`, and remote senders are nAcked.
    pub fn destroy_process(&mut self, now: Micros, pid: Pid) -> Result<(), IpcError> {
        self.tick(now);
        if !self.process_exists(pid) {
            return Err(IpcError::NoSuchProcess(pid));
        }
        let Some(p) = self.procs.remove(&pid.local()) else {
            return Err(IpcError::NoSuchProcess(pid));
        };
        if self.caller == Some(pid) {
            self.own = None;
        }
        if let PState::GettingPid { qseq } = p.state {
            self.names.forget_query(qseq);
        }
        self.names.forget_pid(pid);
        self.group_forget(pid);
        for pend in p.queue {
            self.fail_pending(now, pend, pid);
        }
        // Local senders awaiting reply from it (already received).
        let waiting: Vec<Pid> = self
            .procs
            .iter()
            .filter_map(|(&l, q)| match &q.state {
                PState::Sending(o) if o.dst == pid && o.remote.is_none() => {
                    Some(Pid::new(pid.host(), l))
                }
                _ => None,
            })
            .collect();
        for s in waiting {
            self.complete(s, Completion::Send(Err(IpcError::NoSuchProcess(pid))));
            self.stats.local_exchanges += 1;
        }
        // Aliens it had received: nAck their senders.
        for i in self.aliens.held_by(pid) {
            self.nack_alien(i, Status::NoSuchProcess);
        }
        Ok(())
    }

    fn fail_pending(&mut self, _now: Micros, pend: Pending, dead: Pid) {
        match pend {
            Pending::Local(s) => {
                self.complete(s, Completion::Send(Err(IpcError::NoSuchProcess(dead))));
            }
            Pending::Alien(i, seq) => {
                if self.aliens.is(i, seq) {
                    self.nack_alien(i, Status::NoSuchProcess);
                }
            }
            // A member's copy: the group's other members may still answer.
            Pending::Group(..) => {}
        }
    }

    fn nack_alien(&mut self, i: usize, status: Status) {
        let Some(a) = self.aliens.get(i) else {
            return;
        };
        let mut h = Header::new(PacketType::NAck);
        h.status = status;
        h.seq = a.seq;
        h.src = a.receiver;
        h.dst = a.src;
        let to = a.addr;
        self.emit(Dest::Addr(to), &h, &Message::zero(), &[]);
        self.free_alien(i);
    }

    // ------------------------------------------------------------------ Send

    /// Starts a Send from `src` to `dst`. The sender is blocked until a
    /// [`Completion::Send`] arrives (an immediate error is returned directly).
    /// `seg` is the sender's segment, with rights declared in `msg`.
    pub fn send(
        &mut self,
        now: Micros,
        src: Pid,
        dst: Pid,
        msg: Message,
        seg: Option<Seg>,
    ) -> Result<(), IpcError> {
        self.tick(now);
        self.send_append(now, src, dst, msg, seg, usize::MAX)
    }

    /// [`Engine::send`] with at most `append` bytes of a read segment
    /// travelling with the message (capped at [`MAX_APPEND`]); a sender
    /// whose segment ends in space for the reply's data keeps that space
    /// off the wire.
    pub fn send_append(
        &mut self,
        now: Micros,
        src: Pid,
        dst: Pid,
        mut msg: Message,
        seg: Option<Seg>,
        append: usize,
    ) -> Result<(), IpcError> {
        self.tick(now);
        self.check_ready_caller(src)?;
        if !dst.is_process() && !dst.is_group() {
            return Err(IpcError::InvalidPid(dst));
        }
        let (access, seg) = rights::grant(&mut msg, seg);
        let principal = self.principal_of(src);
        let out = Outgoing {
            principal,
            started: now,
            dst,
            seq: self.new_seq(),
            msg,
            seg,
            access,
            append,
            forwarder: src,
            received: false,
            remote: None,
            inbound: Vec::new(),
            no_ahead: false,
            deadline: None,
        };
        self.group_new_send(src);
        if dst.is_group() {
            let sent = out.msg;
            let mode = self.group_send(now, src, dst, out.msg, out.seg.as_ref(), out.seq)?;
            self.set_sending(src, out);
            self.transmit_send(now, src, false);
            if mode == crate::message::GroupMode::NoReply {
                // A notification: sent once, the sender does not block.
                self.complete(
                    src,
                    Completion::Send(Ok(ReplyInfo {
                        msg: sent,
                        seg_bytes: 0,
                        from: dst,
                    })),
                );
            }
            return Ok(());
        }
        if self.is_local(dst) {
            if !self.process_exists(dst) {
                return Err(IpcError::NoSuchProcess(dst));
            }
            if !self.admits(dst, principal) {
                return Err(IpcError::AccessDenied(dst));
            }
            self.set_sending(src, out);
            self.enqueue(now, dst, Pending::Local(src));
        } else {
            self.set_sending(src, out);
            self.transmit_send(now, src, false);
        }
        Ok(())
    }

    /// Bounds `pid`'s current Send: unless replied to by `at`, it
    /// completes with [`IpcError::Deadline`] and the exchange is abandoned
    /// (segment released, inbound bulk dropped, a late reply discarded).
    /// No effect if `pid` is not blocked in a Send.
    pub fn set_send_deadline(&mut self, pid: Pid, at: Micros) {
        if let Some(o) = self.outgoing_mut(pid) {
            o.deadline = Some(at);
            self.arm(at);
        }
    }

    fn check_ready_caller(&self, pid: Pid) -> Result<(), IpcError> {
        self.my_host()?;
        match self.procs.get(&pid.local()) {
            Some(p) if self.is_local(pid) => match p.state {
                PState::Ready => Ok(()),
                _ => Err(IpcError::Busy(pid)),
            },
            _ => Err(IpcError::NotAProcess(pid)),
        }
    }

    fn set_sending(&mut self, pid: Pid, out: Outgoing) {
        if let Some(p) = self.proc_mut(pid) {
            let b = p.boxed(out);
            p.set_state(PState::Sending(b));
            p.completion = None;
        }
    }

    fn set_state(&mut self, pid: Pid, st: PState) {
        if let Some(p) = self.proc_mut(pid) {
            p.set_state(st);
            p.completion = None;
        }
    }

    fn outgoing(&self, pid: Pid) -> Option<&Outgoing> {
        if !self.is_local(pid) {
            return None;
        }
        match &self.procs.get(&pid.local())?.state {
            PState::Sending(o) => Some(o),
            _ => None,
        }
    }

    fn outgoing_mut(&mut self, pid: Pid) -> Option<&mut Outgoing> {
        match &mut self.proc_mut(pid)?.state {
            PState::Sending(o) => Some(o),
            _ => None,
        }
    }

    /// (Re)transmits the RemoteSend of `src`'s current exchange.
    fn transmit_send(&mut self, now: Micros, src: Pid, retransmission: bool) {
        let Some((dst, bytes)) = self.encode_send(src, retransmission) else {
            return;
        };
        if dst.is_group() {
            for to in self.group_dests(dst) {
                self.emit_raw(to, PacketType::RemoteSend, bytes.clone());
            }
        } else {
            self.emit_send(dst, bytes);
        }
        let rto = self.rto_for(dst.host());
        let host_timeout = self.cfg.host_timeout;
        let max_rto = self.max_rto();
        let Some(o) = self.outgoing_mut(src) else {
            return;
        };
        let next = match &mut o.remote {
            Some(r) if retransmission => {
                r.retransmitted = true;
                r.rto = (r.rto * 2).min(max_rto);
                r.next = now + r.rto;
                r.next
            }
            _ => {
                o.remote = Some(Retx {
                    sent_at: now,
                    next: now + rto,
                    rto,
                    deadline: now + host_timeout,
                    retransmitted: false,
                });
                now + rto
            }
        };
        if retransmission {
            self.stats.retransmits += 1;
        }
        self.arm(next);
    }

    /// The RemoteSend datagram of `src`'s current exchange, and its
    /// destination.
    pub(crate) fn encode_send(&mut self, src: Pid, retransmission: bool) -> Option<(Pid, Vec<u8>)> {
        let mut bytes = self.out.buffer();
        let Some(o) = self.outgoing(src) else {
            self.recycle(bytes);
            return None;
        };
        let dst = o.dst;
        let mut h = Header::new(PacketType::RemoteSend);
        h.seq = o.seq;
        h.src = src;
        h.dst = dst;
        h.forwarder = o.forwarder;
        h.user = o.principal;
        h.flags = if retransmission { F_RETRANSMIT } else { 0 }
            | if o.no_ahead { wire::F_REPLY_DATA } else { 0 };
        let msg = o.msg;
        let append = rights::appends(o.access, &o.msg);
        let (data, total): (&[u8], u32) = match (&o.seg, append) {
            (Some(s), true) => {
                let b = s.bytes();
                (&b[..b.len().min(MAX_APPEND).min(o.append)], b.len() as u32)
            }
            (Some(s), false) => (&[], s.len() as u32),
            _ => (&[], 0),
        };
        h.total_length = total;
        wire::encode_into(&h, &msg, data, &mut bytes);
        Some((dst, bytes))
    }

    fn emit_send(&mut self, dst: Pid, bytes: Vec<u8>) {
        match self.lookup(dst.host()) {
            Some(a) => self.emit_raw(a, PacketType::RemoteSend, bytes),
            // Location unknown: fan out; the answer teaches where it is.
            None => {
                for to in self.cfg.discovery.clone() {
                    self.emit_raw(to, PacketType::RemoteSend, bytes.clone());
                }
            }
        }
    }

    fn enqueue(&mut self, now: Micros, dst: Pid, pend: Pending) {
        let Some(p) = self.proc_mut(dst) else { return };
        p.queue.push_back(pend);
        if let PState::Receiving { .. } = p.state {
            self.try_deliver(now, dst);
        }
    }

    /// The sender of a queued message, or `None` if the entry went stale
    /// (sender cancelled, destroyed, re-sent elsewhere, or alien freed).
    fn pending_sender(&self, pend: Pending, receiver: Pid) -> Option<Pid> {
        match pend {
            Pending::Local(s) => self
                .outgoing(s)
                .filter(|o| o.dst == receiver && !o.received && o.remote.is_none())
                .map(|_| s),
            Pending::Alien(i, seq) => self
                .aliens
                .get(i)
                .filter(|a| a.seq == seq && a.receiver == receiver && a.state == AlienState::Queued)
                .map(|a| a.src),
            Pending::Group(i, seq) => self.groups.pending_sender(i, seq, receiver),
        }
    }

    /// Abandons whatever `pid` is blocked in, releasing every lent buffer.
    /// Used by the runtime when it must return without a completion.
    pub fn cancel(&mut self, pid: Pid) {
        if self.caller == Some(pid) {
            self.own = None;
        }
        if let Some(p) = self.proc_mut(pid) {
            let old = p.set_state(PState::Ready);
            p.completion = None;
            if let PState::GettingPid { qseq } = old {
                self.names.forget_query(qseq);
            }
        }
    }

    /// If `pid` is receiving and a matching message is queued, deliver it.
    fn try_deliver(&mut self, _now: Micros, pid: Pid) -> bool {
        let Some(p) = self.proc_mut(pid) else {
            return false;
        };
        let PState::Receiving { from, .. } = &p.state else {
            return false;
        };
        let from = *from;
        // Scan the queue without allocating: take it out, look, put it back.
        let mut queue = std::mem::take(&mut p.queue);
        let mut chosen = None;
        let mut i = 0;
        while i < queue.len() {
            match self.pending_sender(queue[i], pid) {
                // Stale entry (sender cancelled or gone): drop it.
                None => {
                    queue.remove(i);
                }
                Some(s) if from.is_none_or(|f| f == s) => {
                    chosen = queue.remove(i);
                    break;
                }
                Some(_) => i += 1,
            }
        }
        let Some(p) = self.proc_mut(pid) else {
            return false;
        };
        p.queue = queue;
        let Some(pend) = chosen else {
            return false;
        };
        let PState::Receiving { buf, upto, .. } = std::mem::replace(&mut p.state, PState::Ready)
        else {
            return false;
        };
        let r = self.deliver(pid, pend, buf, upto);
        self.complete(pid, Completion::Receive(Ok(r)));
        true
    }

    /// Hands a queued message to `receiver`, copying the segment's first
    /// part (of a segment at most `upto` bytes long).
    fn deliver(
        &mut self,
        receiver: Pid,
        pend: Pending,
        mut buf: Option<Seg>,
        upto: usize,
    ) -> Received {
        match pend {
            Pending::Local(s) => {
                let Some(o) = self.outgoing_mut(s) else {
                    return Received {
                        from: s,
                        msg: Message::zero(),
                        seg_bytes: 0,
                        forwarder: s,
                        principal: 0,
                    };
                };
                o.received = true;
                let mut n = 0;
                let append = rights::appends(o.access, &o.msg);
                let seg = o.seg.as_ref().filter(|s| s.len() <= upto);
                if let (Some(b), Some(seg), true) = (buf.as_mut(), seg, append) {
                    n = b.len().min(seg.len()).min(o.append);
                    b.bytes_mut()[..n].copy_from_slice(&seg.bytes()[..n]);
                }
                let _ = receiver;
                Received {
                    from: s,
                    msg: o.msg,
                    seg_bytes: n,
                    forwarder: o.forwarder,
                    principal: o.principal,
                }
            }
            Pending::Group(i, _) => {
                let Some((src, msg, data, principal)) = self.groups.take(i) else {
                    return Received {
                        from: Pid::NONE,
                        msg: Message::zero(),
                        seg_bytes: 0,
                        forwarder: Pid::NONE,
                        principal: 0,
                    };
                };
                let mut n = 0;
                if let Some(b) = buf.as_mut() {
                    n = b.len().min(data.len());
                    b.bytes_mut()[..n].copy_from_slice(&data[..n]);
                }
                Received {
                    from: src,
                    msg,
                    seg_bytes: n,
                    forwarder: src,
                    principal,
                }
            }
            Pending::Alien(i, _) => {
                let Some((a, data)) = self.aliens.with_data(i) else {
                    return Received {
                        from: Pid::NONE,
                        msg: Message::zero(),
                        seg_bytes: 0,
                        forwarder: Pid::NONE,
                        principal: 0,
                    };
                };
                a.state = AlienState::Received;
                let mut n = 0;
                if let Some(b) = buf.as_mut().filter(|_| a.seg_total as usize <= upto) {
                    n = b.len().min(data.len());
                    b.bytes_mut()[..n].copy_from_slice(&data[..n]);
                }
                Received {
                    from: a.src,
                    msg: a.msg,
                    seg_bytes: n,
                    forwarder: a.forwarder,
                    principal: a.principal,
                }
            }
        }
    }

    // --------------------------------------------------------------- Receive

    /// Receive (or ReceiveSpecific with `from`). Returns the message at once
    /// if one is queued; otherwise the process blocks until a
    /// [`Completion::Receive`]. `buf` receives the first part of a
    /// read-granted segment.
    pub fn receive(
        &mut self,
        now: Micros,
        pid: Pid,
        from: Option<Pid>,
        buf: Option<Seg>,
    ) -> Result<Option<Received>, IpcError> {
        self.receive_upto(now, pid, from, buf, usize::MAX)
    }

    /// [`Engine::receive`] that copies into `buf` only from a segment at
    /// most `upto` bytes long (a dispatcher that hands large requests on
    /// need not copy their first part).
    pub fn receive_upto(
        &mut self,
        now: Micros,
        pid: Pid,
        from: Option<Pid>,
        buf: Option<Seg>,
        upto: usize,
    ) -> Result<Option<Received>, IpcError> {
        self.check_ready_caller(pid)?;
        if let Some(f) = from {
            if !f.is_process() || (self.is_local(f) && !self.process_exists(f)) {
                return Err(IpcError::NoSuchProcess(f));
            }
        }
        self.set_state(pid, PState::Receiving { from, buf, upto });
        if self.try_deliver(now, pid) {
            if let Some(Completion::Receive(r)) = self.take_completion(pid) {
                // Delivered synchronously: no wake needed.
                self.out.forget_wake(pid);
                return r.map(Some);
            }
        }
        Ok(None)
    }

    /// Abandons a blocked Receive (e.g. the caller's wait timed out).
    pub fn cancel_receive(&mut self, pid: Pid) -> bool {
        if let Some(p) = self.proc_mut(pid) {
            if let PState::Receiving { .. } = p.state {
                p.state = PState::Ready;
                return true;
            }
        }
        false
    }

    // ----------------------------------------------------------------- Reply

    /// Replies to `to`, which must be awaiting reply from `replier`. With
    /// `seg = Some((offset, data))` the data is written into the sender's
    /// write-granted segment at `offset` (reply-with-segment).
    pub fn reply(
        &mut self,
        now: Micros,
        replier: Pid,
        to: Pid,
        msg: Message,
        seg: Option<(u32, &[u8])>,
    ) -> Result<(), IpcError> {
        self.tick(now);
        self.check_ready_caller(replier)?;
        // More than one datagram: `reply_ahead` (a local sender's segment
        // takes any size, by copy).
        if seg.is_some_and(|(_, d)| d.len() > MAX_APPEND) && !self.is_local(to) {
            return Err(IpcError::SegmentTooLarge { max: MAX_APPEND });
        }
        // A remote sender's alien, looked up once for both uses below.
        let alien = if self.is_local(to) {
            None
        } else {
            self.aliens.received(to, replier).ok()
        };
        let one_to_one = match alien {
            Some(_) => true,
            None => self.in_exchange_with(to, replier),
        };
        if !one_to_one {
            if let Some(r) = self.group_reply(now, replier, to, msg, seg) {
                return r;
            }
        }
        if self.is_local(to) {
            let Some(o) = self.outgoing_mut(to) else {
                return Err(IpcError::NotAwaitingReply(to));
            };
            if o.dst != replier || !o.received || o.remote.is_some() {
                return Err(IpcError::NotAwaitingReply(to));
            }
            let mut n = 0;
            if let Some((off, d)) = seg {
                if !d.is_empty() {
                    rights::write(o.access, o.seg.as_mut(), off as usize, d.len())
                        .map_err(|e| e.error(to))?
                        .copy_from_slice(d);
                    n = d.len();
                }
            }
            let started = o.started;
            self.stats.local_exchanges += 1;
            if self.cfg.metrics {
                self.stats
                    .local_latency_us
                    .record(now.saturating_sub(started));
            }
            self.complete(
                to,
                Completion::Send(Ok(ReplyInfo {
                    msg,
                    seg_bytes: n,
                    from: replier,
                })),
            );
            return Ok(());
        }
        let i = match alien {
            Some(i) => i,
            None => self.aliens.received(to, replier)?,
        };
        let (src, seq, addr, idem) = {
            let Some(a) = self.aliens.get(i) else {
                return Err(IpcError::NotAwaitingReply(to));
            };
            if let Some((off, d)) = seg.filter(|(_, d)| !d.is_empty()) {
                a.check(Need::Write, off as usize, d.len())
                    .map_err(|e| e.error(to))?;
            }
            (a.src, a.seq, a.addr, a.idempotent)
        };
        let mut h = Header::new(PacketType::RemoteReply);
        h.seq = seq;
        h.src = replier;
        h.dst = src;
        h.forwarder = replier;
        let data: &[u8] = match seg {
            Some((off, d)) if !d.is_empty() => {
                h.remote_addr = off;
                h.total_length = d.len() as u32;
                d
            }
            _ => &[],
        };
        let bytes = self.out.encode(&h, &msg, data);
        self.emit_raw(addr, PacketType::RemoteReply, bytes);
        if !idem {
            self.save(now, src, h, msg, data);
        }
        self.free_alien(i);
        Ok(())
    }

    /// True if `to` awaits a reply from `replier` in a one-to-one exchange.
    fn in_exchange_with(&self, to: Pid, replier: Pid) -> bool {
        if self.is_local(to) {
            self.outgoing(to)
                .is_some_and(|o| o.dst == replier && o.received && o.remote.is_none())
        } else {
            self.aliens.received(to, replier).is_ok()
        }
    }

    /// Keeps a finished exchange's answer to re-send to retransmissions.
    fn save(&mut self, now: Micros, src: Pid, header: Header, msg: Message, data: &[u8]) {
        let stats = &mut self.stats;
        self.aliens.save(now, src, header, msg, data, stats);
        self.arm(now + self.cfg.alien_timeout / 4);
    }

    // --------------------------------------------------------------- Forward

    /// Forwards `from`'s message (now `msg`) to `to`, as if `from` had sent
    /// it. `from` must be awaiting reply from `forwarder`.
    pub fn forward(
        &mut self,
        now: Micros,
        forwarder: Pid,
        from: Pid,
        to: Pid,
        msg: Message,
    ) -> Result<(), IpcError> {
        self.tick(now);
        self.check_ready_caller(forwarder)?;
        if !to.is_process() {
            return Err(IpcError::InvalidPid(to));
        }
        if self.is_local(from) {
            let seq = self.new_seq();
            let to_local = self.is_local(to);
            if to_local && !self.process_exists(to) {
                return Err(IpcError::NoSuchProcess(to));
            }
            let p = self.outgoing(from).map_or(0, |o| o.principal);
            if to_local && !self.admits(to, p) {
                return Err(IpcError::AccessDenied(to));
            }
            let Some(o) = self.outgoing_mut(from) else {
                return Err(IpcError::NotAwaitingReply(from));
            };
            if o.dst != forwarder || !o.received || o.remote.is_some() {
                return Err(IpcError::NotAwaitingReply(from));
            }
            let seg_len = o.seg.as_ref().map_or(0, |s| s.len() as u32);
            o.msg = rights::carry(&o.msg, msg, seg_len);
            o.dst = to;
            o.forwarder = forwarder;
            o.received = false;
            o.seq = seq;
            o.inbound.clear();
            if to_local {
                self.enqueue(now, to, Pending::Local(from));
            } else {
                self.transmit_send(now, from, false);
            }
            return Ok(());
        }
        let i = self.aliens.received(from, forwarder)?;
        if self.is_local(to) {
            if !self.process_exists(to) {
                return Err(IpcError::NoSuchProcess(to));
            }
            let p = self.aliens.get(i).map_or(0, |a| a.principal);
            if !self.admits(to, p) {
                return Err(IpcError::AccessDenied(to));
            }
            let seq = {
                let Some(a) = self.aliens.get_mut(i) else {
                    return Err(IpcError::NotAwaitingReply(from));
                };
                a.msg = rights::carry(&a.msg, msg, a.seg_total);
                a.receiver = to;
                a.forwarder = forwarder;
                a.state = AlienState::Queued;
                a.seq
            };
            self.enqueue(now, to, Pending::Alien(i, seq));
            return Ok(());
        }
        // Remote to remote: ask the sender's kernel to re-send.
        let (seq, addr) = {
            let Some(a) = self.aliens.get(i) else {
                return Err(IpcError::NotAwaitingReply(from));
            };
            (a.seq, a.addr)
        };
        let mut h = Header::new(PacketType::RemoteForward);
        h.seq = seq;
        h.src = forwarder;
        h.dst = from;
        h.forwarder = to;
        let bytes = wire::encode(&h, &msg, &[]);
        self.emit_raw(addr, PacketType::RemoteForward, bytes);
        self.save(now, from, h, msg, &[]);
        self.free_alien(i);
        Ok(())
    }

    // --------------------------------------------------------------- datagrams

    /// Processes one received datagram. Malformed or unexpected datagrams are
    /// counted and dropped; this never panics.
    pub fn handle_datagram(&mut self, now: Micros, from: SocketAddr, buf: &[u8]) {
        self.tick(now);
        let Some(mut auth) = self.auth.take() else {
            // A keyed datagram at a host without keys: we cannot check it.
            // (Read from the bytes: a datagram too short to decode counts.)
            let keyed = buf.get(wire::field::KEY_ID).is_some_and(|&k| k != 0);
            if keyed && buf.get(wire::field::MAGIC) == Some(&wire::MAGIC) {
                self.stats.auth_rejects[crate::auth::Reject::UnknownKey as usize] += 1;
                self.notify_auth_failed(now, from, buf);
                return;
            }
            if Self::is_auth_notice(buf) {
                self.stats.auth_refused_by_peer += 1;
                return;
            }
            return self.handle_plain(now, from, buf);
        };
        let mut scratch = std::mem::take(&mut self.open_buf);
        match auth.open(buf, &mut scratch) {
            Ok(inner) => {
                self.auth = Some(auth);
                self.handle_plain(now, from, inner);
            }
            Err(crate::auth::Reject::NoKey) if Self::is_auth_notice(buf) => {
                self.auth = Some(auth);
                self.stats.auth_refused_by_peer += 1;
            }
            Err(r) => {
                self.auth = Some(auth);
                self.stats.auth_rejects[r as usize] += 1;
                if !matches!(r, crate::auth::Reject::Replay | crate::auth::Reject::Stale) {
                    self.notify_auth_failed(now, from, buf);
                }
            }
        }
        self.open_buf = scratch;
    }

    /// Is this an unauthenticated NAck saying our datagram failed
    /// authentication at its sender?
    fn is_auth_notice(buf: &[u8]) -> bool {
        wire::decode(buf).is_ok_and(|p| {
            p.header.ptype == PacketType::NAck && p.header.status == Status::AuthFailed
        })
    }

    /// Tells `to` (unauthenticated, rate-limited) that a datagram from it
    /// failed authentication here, so its user learns the keys differ
    /// instead of seeing silence. The receiver only counts it.
    fn notify_auth_failed(&mut self, now: Micros, from: SocketAddr, buf: &[u8]) {
        // To the port the datagram names for answers (it may have left
        // from a send-only side socket); unverified, but a notice is
        // only counted, and goes to the sender's own address.
        let mut to = from;
        if let Some(&[a, b]) = buf.get(wire::field::REPLY_PORT) {
            let port = u16::from_be_bytes([a, b]);
            if port != 0 {
                to.set_port(port);
            }
        }
        let mut h = Header::new(PacketType::NAck);
        h.status = Status::AuthFailed;
        let data = wire::encode(&h, &Message::zero(), &[]);
        self.out.notice(now, to, data);
    }

    fn handle_plain(&mut self, now: Micros, from: SocketAddr, buf: &[u8]) {
        let pkt = match wire::decode(buf) {
            Ok(p) => p,
            Err(e) => {
                self.stats.decode_error(e);
                return;
            }
        };
        self.handle_packet(now, from, &pkt);
    }

    /// Where the data of the bulk datagram whose fixed part is `head`
    /// belongs, if it is a chunk not yet received of a transfer into a
    /// buffer lent here (and no cluster key is in use: a MAC must be
    /// checked before data lands). The runtime may then receive the
    /// datagram's data straight there and call [`Engine::handle_placed`]
    /// while it still holds this borrow's lock.
    pub fn placement(&mut self, head: &[u8]) -> Option<&mut [u8]> {
        if self.auth.is_some() {
            return None;
        }
        let (h, msg, len) = wire::decode_fixed(head).ok()?;
        self.chunk_place(&h, &msg, len)
    }

    /// Handles a bulk datagram whose data the runtime received straight
    /// into the place [`Engine::placement`] gave for its fixed part `head`.
    pub fn handle_placed(&mut self, now: Micros, from: SocketAddr, head: &[u8]) {
        self.tick(now);
        let Ok((header, msg, len)) = wire::decode_fixed(head) else {
            return;
        };
        // The handlers see a stand-in of the data's length and copy
        // nothing while `placed` is set.
        static STAND_IN: [u8; wire::MAX_DATAGRAM] = [0; wire::MAX_DATAGRAM];
        let Some(data) = STAND_IN.get(..len) else {
            return;
        };
        self.placed = true;
        self.handle_packet(now, from, &Packet { header, msg, data });
        self.placed = false;
    }

    fn handle_packet(&mut self, now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
        let pkt = *pkt;
        // Answers go to the sender's main socket, which need not be the
        // socket this datagram left from (see `Header::reply_port`).
        let from = match pkt.header.reply_port {
            0 => from,
            port => SocketAddr::new(from.ip(), port),
        };
        let len = wire::FIXED_BYTES + pkt.data.len();
        self.stats.rx_type(pkt.header.ptype, len);
        let h = pkt.header;
        if self.cfg.metrics {
            self.stats
                .datagram(false, h.src.host().0, h.ptype, len, pkt.data.len());
        }
        match h.ptype {
            PacketType::LogicalHostRequest | PacketType::LogicalHostComplaint => {
                return self.on_host_alloc(now, from, &pkt);
            }
            _ => {}
        }
        let Some(me) = self.host_id() else {
            self.stats.drop(DropReason::NotReady);
            return;
        };
        if h.src.host() == me {
            self.stats.drop(DropReason::OwnEcho);
            return;
        }
        let to_group = h.ptype == PacketType::RemoteSend && h.dst.is_group();
        if h.ptype != PacketType::RemoteGetPid && !to_group && h.dst.host() != me {
            self.stats.drop(DropReason::NotForUs);
            return;
        }
        if !h.src.is_process() {
            self.stats.drop(DropReason::Malformed);
            return;
        }
        self.learn(h.src.host(), from);
        match h.ptype {
            PacketType::RemoteSend => self.on_remote_send(now, from, &pkt),
            PacketType::RemoteReply => self.on_remote_reply(now, &pkt),
            PacketType::RemoteForward => self.on_remote_forward(now, &pkt),
            PacketType::NAck => self.on_nack(now, &pkt),
            PacketType::ReplyPending => self.on_reply_pending(now, &pkt),
            PacketType::RemoteGetPid => self.on_getpid(now, from, &pkt),
            PacketType::RemoteGetPidReply => self.on_getpid_reply(now, &pkt),
            PacketType::MoveToRequest => self.on_move_to_request(now, from, &pkt),
            PacketType::MoveToReply => self.on_move_to_reply(now, &pkt),
            PacketType::MoveFromRequest => self.on_move_from_request(now, from, &pkt),
            PacketType::MoveFromReply => self.on_move_from_reply(now, &pkt),
            PacketType::LogicalHostRequest | PacketType::LogicalHostComplaint => {}
        }
    }

    fn reply_pending(&mut self, to: SocketAddr, src: Pid, dst: Pid, seq: u32) {
        let mut h = Header::new(PacketType::ReplyPending);
        h.seq = seq;
        h.src = dst;
        h.dst = src;
        self.emit(Dest::Addr(to), &h, &Message::zero(), &[]);
    }

    fn on_remote_send(&mut self, now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
        let h = pkt.header;
        if h.dst.is_group() {
            return self.on_group_send(now, from, pkt);
        }
        let Some(me) = self.host_id() else { return };
        // What is known of this sender (one lookup: every remote request
        // takes this path).
        let (had_saved, prev_alien, last) =
            match self.aliens.known(h.src, h.seq, now, &mut self.stats) {
                // Retransmission of a finished non-idempotent exchange.
                Known::Answer(t, b) => return self.emit_raw(from, t, b),
                Known::Sender {
                    had_saved,
                    alien,
                    last,
                } => (had_saved, alien, last),
            };
        // Duplicate of an exchange in progress?
        if let Some(i) = prev_alien {
            if self.aliens.is(i, h.seq) {
                self.stats.duplicates += 1;
                if let Some(a) = self.aliens.get_mut(i) {
                    a.last_heard = now;
                    a.addr = from;
                    a.no_ahead |= h.flags & wire::F_REPLY_DATA != 0;
                }
                self.reply_pending(from, h.src, h.dst, h.seq);
                return;
            }
        }
        // The same seq with no alien left is an idempotent request whose
        // reply was lost: execute it again. Older ones are stale.
        if last.is_some_and(|last| seq_older(h.seq, last)) {
            self.stats.drop(DropReason::Stale);
            return;
        }
        let refusal = match self.procs.get(&h.dst.local()) {
            Some(p) if h.dst.is_process() && h.dst.host() == me => {
                let admitted = p.admits.as_ref().is_none_or(|a| a.contains(&h.user));
                (!admitted).then_some(Status::AccessDenied)
            }
            _ => Some(Status::NoSuchProcess),
        };
        if let Some(status) = refusal {
            let mut n = Header::new(PacketType::NAck);
            n.status = status;
            n.seq = h.seq;
            n.src = h.dst;
            n.dst = h.src;
            self.emit(Dest::Addr(from), &n, &Message::zero(), &[]);
            return;
        }
        // The newest seq again, with neither an alien nor a saved answer:
        // the request ran and its answer is gone (evicted from the bounded
        // table, or expired). Only an idempotent request may run again; a
        // non-idempotent one is dropped and its sender times out.
        if last == Some(h.seq) && !pkt.msg.idempotent() {
            self.stats.drop(DropReason::Stale);
            return;
        }
        // A new message from this sender acknowledges its previous exchange.
        if had_saved {
            self.aliens.forget_saved(h.src);
        }
        if let Some(old) = prev_alien {
            self.free_alien(old);
        }
        let access = pkt.msg.seg_access();
        let mut msg = pkt.msg;
        msg.set_seg_addr(0);
        msg.set_seg_len(h.total_length);
        let alien = Alien {
            src: h.src,
            principal: h.user,
            seq: h.seq,
            receiver: h.dst,
            addressed: h.dst,
            forwarder: h.forwarder,
            msg,
            access,
            seg_total: h.total_length,
            idempotent: pkt.msg.idempotent(),
            no_ahead: h.flags & wire::F_REPLY_DATA != 0,
            state: AlienState::Queued,
            last_heard: now,
            addr: from,
        };
        let Some(i) = self.aliens.admit(alien, pkt.data, now, &mut self.stats) else {
            self.stats.drop(DropReason::NoBuffers);
            self.reply_pending(from, h.src, h.dst, h.seq);
            return;
        };
        self.arm(now + self.cfg.alien_timeout);
        self.enqueue(now, h.dst, Pending::Alien(i, h.seq));
    }

    fn free_alien(&mut self, i: usize) {
        self.aliens.free(i, &mut self.stats);
    }

    /// The local process awaiting a remote reply with this sequence number.
    fn remote_waiter(&mut self, pid: Pid, seq: u32) -> Option<&mut Outgoing> {
        let o = self.outgoing_mut(pid)?;
        (o.seq == seq && o.remote.is_some()).then_some(o)
    }

    fn on_remote_reply(&mut self, now: Micros, pkt: &Packet<'_>) {
        if self.on_group_reply(now, pkt) {
            return;
        }
        let h = pkt.header;
        let Some(o) = self.remote_waiter(h.dst, h.seq) else {
            self.stats.drop(DropReason::NoMatch);
            return;
        };
        // Segment data sent ahead of the reply must all be here; if not,
        // ask again at once (the request is idempotent, it runs again).
        let ahead = if h.flags & wire::F_REPLY_DATA != 0 {
            h.local_addr as usize
        } else {
            0
        };
        if ahead > 0 {
            let base = (h.remote_addr as usize).checked_sub(ahead);
            let whole = o.inbound.iter().any(|b| {
                b.ahead
                    && b.mover == h.src
                    && Some(b.base) == base
                    && b.total == ahead
                    && b.got.full()
            });
            if !whole {
                // Once: the request goes again, asking for the data to be
                // moved (MoveTo retransmits selectively; sending ahead
                // again could lose a piece every time on a lossy path).
                o.no_ahead = true;
                self.stats.drop(DropReason::ReplyDataMissing);
                self.transmit_send(now, h.dst, true);
                return;
            }
        }
        let mut n = ahead;
        let mut violation = false;
        if !pkt.data.is_empty() {
            let off = h.remote_addr as usize;
            match rights::write(o.access, o.seg.as_mut(), off, pkt.data.len()) {
                Ok(place) => {
                    place.copy_from_slice(pkt.data);
                    n += pkt.data.len();
                }
                Err(_) => violation = true,
            }
        }
        let sample = o
            .remote
            .as_ref()
            .filter(|r| !r.retransmitted)
            .map(|r| now.saturating_sub(r.sent_at));
        let whole = o.remote.as_ref().map(|r| now.saturating_sub(r.sent_at));
        if violation {
            self.stats.drop(DropReason::SegmentViolation);
        }
        if let Some(s) = sample {
            self.rtt.entry(h.src.host()).or_default().sample(s);
        }
        self.stats.remote_exchanges += 1;
        if let (Some(l), true) = (whole, self.cfg.metrics) {
            self.stats.remote_latency_us.record(l);
        }
        self.complete(
            h.dst,
            Completion::Send(Ok(ReplyInfo {
                msg: pkt.msg,
                seg_bytes: n,
                from: h.src,
            })),
        );
    }

    fn on_remote_forward(&mut self, now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        let new_dst = h.forwarder;
        let seq = self.new_seq();
        let Some(o) = self.remote_waiter(h.dst, h.seq) else {
            self.stats.drop(DropReason::NoMatch);
            return;
        };
        if !new_dst.is_process() {
            self.stats.drop(DropReason::Malformed);
            return;
        }
        let seg_len = o.seg.as_ref().map_or(0, |s| s.len() as u32);
        o.msg = rights::carry(&o.msg, pkt.msg, seg_len);
        o.dst = new_dst;
        o.forwarder = h.src;
        o.seq = seq;
        o.remote = None;
        o.received = false;
        o.inbound.clear();
        let principal = o.principal;
        if self.is_local(new_dst) {
            if !self.admits(new_dst, principal) {
                self.complete(
                    h.dst,
                    Completion::Send(Err(IpcError::AccessDenied(new_dst))),
                );
            } else if self.process_exists(new_dst) {
                self.enqueue(now, new_dst, Pending::Local(h.dst));
            } else {
                self.complete(
                    h.dst,
                    Completion::Send(Err(IpcError::NoSuchProcess(new_dst))),
                );
            }
        } else {
            self.transmit_send(now, h.dst, false);
        }
    }

    fn on_nack(&mut self, _now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        if self.remote_waiter(h.dst, h.seq).is_some() {
            let err = match h.status {
                Status::Busy => IpcError::NoResources,
                Status::AccessDenied => IpcError::AccessDenied(h.src),
                _ => IpcError::NoSuchProcess(h.src),
            };
            self.complete(h.dst, Completion::Send(Err(err)));
            return;
        }
        self.stats.drop(DropReason::NoMatch);
    }

    fn on_reply_pending(&mut self, now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        let host_timeout = self.cfg.host_timeout;
        let rto = self.rto_for(h.src.host());
        if let Some(o) = self.remote_waiter(h.dst, h.seq) {
            if let Some(r) = o.remote.as_mut() {
                r.deadline = now + host_timeout;
                r.rto = rto.max(r.rto);
                r.next = now + r.rto;
                let next = r.next;
                self.arm(next);
            }
            return;
        }
        if self.bulk_pending(now, &h) {
            return;
        }
        self.stats.drop(DropReason::NoMatch);
    }

    // ---------------------------------------------------------------- timers

    /// Runs every timer due at `now`: retransmissions, timeouts, alien expiry.
    pub fn handle_timeout(&mut self, now: Micros) {
        self.tick(now);
        let mut next = Micros::MAX;
        self.host_alloc_timer(now, &mut next);
        // Remote sends.
        let mut retx = Vec::new();
        let mut dead = Vec::new();
        let mut late = Vec::new();
        let host = self.host_id();
        for (&l, p) in &self.procs {
            let Some(h) = host else { break };
            if let PState::Sending(o) = &p.state {
                if let Some(d) = o.deadline {
                    if now >= d {
                        late.push((Pid::new(h, l), o.dst));
                        continue;
                    }
                    next = next.min(d);
                }
                if let Some(r) = &o.remote {
                    if now >= r.deadline {
                        dead.push((Pid::new(h, l), o.dst));
                    } else if now >= r.next {
                        retx.push(Pid::new(h, l));
                    } else {
                        next = next.min(r.next).min(r.deadline);
                    }
                }
            }
        }
        for (pid, dst) in dead {
            self.stats.timeouts += 1;
            self.complete(pid, Completion::Send(Err(IpcError::Timeout(dst))));
        }
        for (pid, dst) in late {
            self.stats.deadlines += 1;
            self.complete(pid, Completion::Send(Err(IpcError::Deadline(dst))));
        }
        for pid in retx {
            self.transmit_send(now, pid, true);
            if let Some(r) = self.outgoing(pid).and_then(|o| o.remote.as_ref()) {
                next = next.min(r.next).min(r.deadline);
            }
        }
        self.bulk_timers(now, &mut next);
        self.naming_timers(now, &mut next);
        self.group_timers(now, &mut next);
        // Alien expiry (sweep at most every quarter timeout).
        if self.timers.sweep_due(now, self.cfg.alien_timeout / 4) {
            let stats = &mut self.stats;
            self.aliens.sweep(now, self.cfg.alien_timeout, stats);
            self.group_sweep(now);
        }
        if self.aliens.busy() || self.group_busy() {
            next = next.min(self.timers.next_sweep());
        }
        self.timers.set(next);
    }

    /// Fails every blocked operation with `Shutdown` (the runtime is stopping).
    pub fn shutdown(&mut self) {
        let Some(h) = self.host_id() else { return };
        let blocked: Vec<(Pid, Completion)> = self
            .procs
            .iter()
            .filter_map(|(&l, p)| {
                let c = match p.state {
                    PState::Ready => return None,
                    PState::Receiving { .. } => Completion::Receive(Err(IpcError::Shutdown)),
                    PState::Sending(_) => Completion::Send(Err(IpcError::Shutdown)),
                    PState::Moving(_) => Completion::Move(Err(IpcError::Shutdown)),
                    PState::GettingPid { .. } => Completion::GetPid(Err(IpcError::Shutdown)),
                };
                Some((Pid::new(h, l), c))
            })
            .collect();
        for (p, c) in blocked {
            self.complete(p, c);
        }
    }

    /// A random number from the engine's seeded generator.
    pub(crate) fn random_u32(&mut self) -> u32 {
        self.rng.gen()
    }
}

impl Proc {
    fn new() -> Proc {
        Proc {
            state: PState::Ready,
            queue: VecDeque::new(),
            completion: None,
            principal: 0,
            admits: None,
            spare: None,
        }
    }

    /// Replaces the state and returns the old one, except that a finished
    /// Send's box is kept for the next Send (`Ready` is returned for it).
    /// Its lent segment and inbound transfers are dropped now: the lease on
    /// the caller's buffer ends with the state.
    fn set_state(&mut self, st: PState) -> PState {
        match std::mem::replace(&mut self.state, st) {
            PState::Sending(mut b) => {
                b.seg = None;
                b.inbound = Vec::new();
                self.spare = Some(b);
                PState::Ready
            }
            old => old,
        }
    }

    /// A box holding `out`: the spare one if there is one.
    fn boxed(&mut self, out: Outgoing) -> Box<Outgoing> {
        match self.spare.take() {
            Some(mut b) => {
                *b = out;
                b
            }
            None => Box::new(out),
        }
    }
}

#[cfg(test)]
mod tests;
