//! The sans-IO kernel of one logical host.
//!
//! [`Engine`] holds every piece of IPC state of a logical host. It never
//! touches a socket or a clock: callers feed it datagrams and the current
//! time, and drain [`Transmit`]s, [`Event`]s and a timer deadline. That
//! keeps it deterministic, so a seeded simulator can drive it through
//! loss, duplication, reordering and crashes.
//!
//! # Call contract
//!
//! Every entry point that takes `now` must get a time no earlier than the
//! last one given. One engine call at a time (the runtime holds a lock);
//! after each call, or batch of calls under one lock:
//!
//! 1. **Queries** (`&self`): [`Engine::host_id`], [`Engine::stats`],
//!    [`Engine::process_exists`], [`Engine::location_of`], ... — any time.
//! 2. **Inputs** (`handle_*`): [`Engine::handle_datagram`] for each
//!    datagram received ([`Engine::placement`] then
//!    [`Engine::handle_placed`] to receive a bulk chunk's data straight
//!    into a lent buffer), and [`Engine::handle_timeout`] once
//!    [`Engine::poll_timeout`] has passed.
//! 3. **Mutators** (the primitives): [`Engine::send`], [`Engine::receive`],
//!    [`Engine::reply`], [`Engine::forward`], [`Engine::move_to`],
//!    [`Engine::move_from`], [`Engine::set_pid`], [`Engine::get_pid`],
//!    group operations, process creation and destruction. An immediate
//!    answer is returned; otherwise the process is blocked until a
//!    completion. Lent buffers ([`Seg`]) stay lent until then.
//! 4. **Outputs** (`poll_*`), until empty, under the same borrow as the
//!    calls that produced them: [`Engine::send_chunk_batch`] (bulk chunks from
//!    lent memory; optional), [`Engine::poll_transmit`] or
//!    [`Engine::poll_transmit_into`] (datagrams; hand buffers back with
//!    [`Engine::recycle`]), [`Engine::poll_event`] (on
//!    [`Event::Wake`], [`Engine::take_completion`]), and
//!    [`Engine::poll_timeout`] for the next deadline.
//!    [`Engine::has_output`] says whether there is anything to drain.
//!    A thread that calls on behalf of a process it will wait for may say
//!    so with [`Engine::set_caller`] and take that process's completion
//!    with [`Engine::take_own`] (no event).
//!
//! # Where things are
//!
//! State is split into owned sub-machines, each with its own tests:
//! `aliens.rs` (remote senders' requests and saved replies),
//! `location.rs` (host → address cache), `output.rs` (output queues and
//! buffer reuse), `timers.rs` (the deadline and sweep), `rights.rs` (the
//! one segment-rights check), plus `naming.rs` (`Names`) and `group.rs`
//! (`Groups`). The primitives are `impl Engine` blocks by concern:
//! `procs.rs` (process table), `exchange.rs` (Send/Receive/Reply/Forward),
//! `remote.rs` (datagrams in), `transmit.rs` (datagrams out), `bulk/`
//! (MoveTo/MoveFrom), `naming.rs`, `group.rs`.
//!
//! A new packet type: its number and fields in `wire.rs` (and
//! `docs/PROTOCOL.md`), its counters in `stats.rs`, a `match` arm in
//! `Engine::handle_packet` (`remote.rs`) calling an `on_*` handler in the
//! file of its concern, sent with `Engine::emit` (or as a chunk).

mod aliens;
mod bitset;
mod bulk;
mod congestion;
mod exchange;
mod group;
mod idmap;
mod idset;
mod location;
mod naming;
mod output;
mod procs;
mod remote;
mod rights;
mod timers;
mod transmit;

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
use crate::segment::{RawBytes, RawBytesMut, Seg, SegMem, Slice, SliceMut};
use crate::stats::{DropReason, Stats};
use crate::wire::{self, Header, Packet, PacketType, Status, F_RETRANSMIT};

use crate::sender::Due;
use aliens::{Alien, AlienState, Aliens, Known};
use bulk::HeldOp;
use bulk::{InBulk, MoveOp};
use idmap::{new_map, IdMap};
use output::{Chunk, ChunkSrc, Output};
use procs::{Outgoing, PState, Pending, Proc, Retx};
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

/// A bulk chunk handed to the runtime by [`Engine::send_chunk_batch`]: its
/// header, and where its data lies in the lent buffer.
#[derive(Clone, Copy)]
pub struct Gathered<'a> {
    /// Destination address.
    pub to: SocketAddr,
    /// The encoded header and message ([`crate::wire::FIXED_BYTES`]).
    pub head: &'a [u8],
    /// Where the chunk's data lies in the lent buffer (memory another
    /// program may write: only the OS reads it).
    pub data: RawBytes<'a>,
    lent: &'a dyn SegMem,
    start: usize,
}

impl<'a> Gathered<'a> {
    /// The chunk of `head` and `lent`'s bytes `range`, to `to`; `None` if
    /// the range is not within `lent`.
    pub fn new(
        to: SocketAddr,
        head: &'a [u8],
        lent: &'a dyn SegMem,
        range: std::ops::Range<usize>,
    ) -> Option<Gathered<'a>> {
        Some(Gathered {
            to,
            head,
            data: lent.raw(range.start, range.len())?,
            lent,
            start: range.start,
        })
    }

    /// Appends a copy of the chunk's data to `out` (for a runtime that
    /// cannot gather, and for tests).
    pub fn copy_data(&self, out: &mut Vec<u8>) -> bool {
        self.lent.append_to(self.start, self.data.len(), out)
    }
}

/// Where the data of a bulk datagram belongs ([`Engine::placement`]): a
/// range of a lent buffer, to receive straight into.
pub struct Place<'a> {
    lent: &'a mut dyn SegMem,
    off: usize,
    len: usize,
}

impl Place<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The range's address, for the OS to receive into.
    pub fn raw(&mut self) -> Option<RawBytesMut<'_>> {
        self.lent.raw_mut(self.off, self.len)
    }

    /// Appends the range's first `n` bytes to `out` (to put a datagram
    /// back together that was received here but was not the chunk).
    pub fn append_to(&self, n: usize, out: &mut Vec<u8>) -> bool {
        self.lent.append_to(self.off, n.min(self.len), out)
    }

    /// Copies `data` (exactly the range's length) in: for a runtime that
    /// cannot receive into an address, and for tests.
    pub fn fill(&mut self, data: &[u8]) -> bool {
        data.len() == self.len && self.lent.write_at(self.off, data)
    }
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
    /// A message was queued for this process, which is not receiving it
    /// (only for processes under [`Engine::watch_queue`]).
    Queued(Pid),
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
    /// By local id (pages made and freed as needed, never rehashed);
    /// boxed, so a page holds 256 pointers, not 256 processes.
    procs: crate::local_table::LocalTable<Box<Proc>>,
    /// Local ids of the processes blocked in a Send (a superset: entries
    /// whose Send ended are dropped when next looked at). Timers and
    /// destruction look only at these, so idle processes cost nothing.
    sending: idset::IdSet,
    /// Local ids of the processes blocked in a remote MoveTo/MoveFrom (a
    /// superset, as `sending`): bulk timers look only at these.
    moving: idset::IdSet,
    /// Write-behind MoveTos in flight, by transfer id (`bulk/`).
    behind: std::collections::HashMap<u32, bulk::Behind>,
    /// Write-behind MoveTos started so far (their order, `bulk/behind.rs`).
    behind_order: u64,
    /// Replies and Forwards held for write-behind MoveTos, oldest first.
    held: Vec<bulk::Held>,
    next_local: u16,
    next_seq: u32,
    aliens: Aliens,
    location: location::Locations,
    /// What this host knows of its peers' round trips, shared with the
    /// runtime's senders ([`Engine::peer_times`]).
    rtt: std::sync::Arc<crate::rtt::PeerTimes>,
    /// Bulk congestion window per peer host, carried from one transfer
    /// to the next.
    cwnds: IdMap<HostId, congestion::Cwnd>,
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
    /// The next RemoteSends encoded (first transmissions of Sends without
    /// a segment) ask for their answers at their source address (see
    /// [`Engine::set_answer_source`]).
    answer_source: bool,
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
            procs: crate::local_table::LocalTable::new(),
            sending: idset::IdSet::default(),
            moving: idset::IdSet::default(),
            behind: std::collections::HashMap::new(),
            behind_order: 0,
            held: Vec::new(),
            rtt: Default::default(),
            cwnds: new_map(hs),
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
            answer_source: false,
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

    #[inline]
    fn my_host(&self) -> Result<HostId, IpcError> {
        self.host_id().ok_or(IpcError::NoHostId)
    }

    /// Protocol counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Drops the traffic counters of peer host `host`, which the runtime
    /// found gone ([`Stats::forget_peer`]).
    pub fn forget_peer_traffic(&mut self, host: HostId) {
        self.stats.forget_peer(host.0);
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
    #[inline]
    fn tick(&mut self, now: Micros) {
        if let Some(a) = self.auth.as_mut() {
            a.tick(now);
        }
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
        self.procs.get_mut(pid.local())?.completion.take()
    }

    /// Says which process's own thread makes the engine calls that follow
    /// (`None`: another thread). Its completion is then kept for
    /// [`Engine::take_own`], with no [`Event::Wake`]: the thread that
    /// wants it is the one calling, so the runtime need not look for it.
    pub fn set_caller(&mut self, pid: Option<Pid>) {
        if let (Some(c), Some(who)) = (self.own.take(), self.caller) {
            // Not taken: hand it over the usual way.
            if let Some(p) = self.procs.get_mut(who.local()) {
                p.completion = Some(c);
                self.out.event(Event::Wake(who));
            }
        }
        self.caller = pid;
    }

    /// While on, the first transmission of a Send without a segment to
    /// one remote process carries `F_ANSWER_SOURCE` (docs/PROTOCOL.md
    /// §1): its receiver answers the socket it left from, which the
    /// runtime makes the sending thread's own, so the thread reads its own
    /// reply. Retransmissions never carry it (they may leave from any
    /// thread; their answers go to the main socket). The runtime turns it
    /// on around one call and off again.
    pub fn set_answer_source(&mut self, on: bool) {
        self.answer_source = on;
    }

    /// The caller's completion (see [`Engine::set_caller`]), if one came.
    pub fn take_own(&mut self) -> Option<Completion> {
        self.own.take()
    }

    /// True if datagrams, bulk chunks or events wait to be taken.
    pub fn has_output(&self) -> bool {
        self.out.any()
    }

    #[inline]
    fn arm(&mut self, t: Micros) {
        self.timers.arm(t);
    }

    /// Hands out `n` sequence numbers for a process whose program sends
    /// some of its Sends itself ([`crate::direct`]); returns the first.
    /// Every number this engine gives out later is newer, so a receiver
    /// never takes a later exchange for a stale one.
    pub fn reserve_seqs(&mut self, n: u32) -> u32 {
        let first = self.next_seq.wrapping_add(1);
        self.next_seq = self.next_seq.wrapping_add(n);
        first
    }

    /// Whether datagrams are authenticated (a cluster key is configured).
    pub fn is_keyed(&self) -> bool {
        self.auth.is_some()
    }

    /// The sending half of the host's keys, for threads that send for
    /// the host outside the engine (None: no key).
    pub fn sealer(&self) -> Option<crate::auth::Sealer> {
        self.auth.as_ref().map(|a| a.sealer().clone())
    }

    /// Moves the host's packet counter into `cell` (a page the runtime
    /// shares with programs that send for the host), keeping its value.
    /// No effect without a key.
    pub fn share_counter(&mut self, cell: std::sync::Arc<dyn crate::auth::CounterCell>) {
        if let Some(a) = self.auth.as_mut() {
            a.share_counter(cell);
        }
    }

    #[inline]
    fn new_seq(&mut self) -> u32 {
        self.next_seq = self.next_seq.wrapping_add(1);
        self.next_seq
    }

    #[inline]
    fn is_local(&self, pid: Pid) -> bool {
        self.host_id() == Some(pid.host())
    }

    #[inline]
    fn proc_ref(&self, pid: Pid) -> Option<&Proc> {
        if !self.is_local(pid) {
            return None;
        }
        self.procs.get(pid.local()).map(|p| &**p)
    }

    #[inline]
    fn proc_mut(&mut self, pid: Pid) -> Option<&mut Proc> {
        if !self.is_local(pid) {
            return None;
        }
        self.procs.get_mut(pid.local()).map(|p| &mut **p)
    }

    #[inline]
    fn complete(&mut self, pid: Pid, c: Completion) {
        let own = self.caller == Some(pid);
        self.sending.remove(&pid.local());
        let Some(p) = self.proc_mut(pid) else { return };
        p.set_state(PState::Ready);
        if own {
            self.own = Some(c);
        } else {
            p.completion = Some(c);
            self.out.event(Event::Wake(pid));
        }
    }

    /// The retransmission timeout of bulk data to `host`: the round trip's
    /// alone (a lost chunk is the network's doing).
    fn rto_for(&self, host: HostId) -> Micros {
        self.rtt.get(host).unwrap_or_default().rto(
            self.cfg.initial_rto,
            self.cfg.min_rto,
            self.max_rto(),
        )
    }

    /// The retransmission timeout at `now` of a RemoteSend to `host`: also
    /// at least the floor a busy `host` earned (`Rtt::held`).
    fn send_rto_for(&self, now: Micros, host: HostId) -> Micros {
        self.rtt_of(now, host)
            .send_rto(now, self.cfg.initial_rto, self.cfg.min_rto, self.max_rto())
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

    /// The round-trip state of `host` at `now` (a fresh one if never
    /// measured: [`Engine::fresh_rtt`]).
    pub fn rtt_of(&self, now: Micros, host: HostId) -> crate::rtt::Rtt {
        self.rtt
            .get(host)
            .unwrap_or_else(|| self.fresh_rtt(now, host))
    }

    /// The host's store of what it knows of its peers, for the runtime's
    /// threads that send for it outside the engine (one store per host).
    pub fn peer_times(&self) -> std::sync::Arc<crate::rtt::PeerTimes> {
        self.rtt.clone()
    }

    /// What is known of a host never measured: nothing, unless it is at a
    /// loopback address (on this machine), which starts with the floor
    /// `Config::local_send_floor`.
    fn fresh_rtt(&self, now: Micros, host: HostId) -> crate::rtt::Rtt {
        crate::rtt::Rtt::for_peer(now, self.location_of(host), self.cfg.local_send_floor)
    }

    /// The smoothed round-trip time to `host`, if measured.
    pub fn srtt(&self, host: HostId) -> Option<Micros> {
        self.rtt.get(host).and_then(|r| r.srtt())
    }

    #[inline]
    fn lookup(&mut self, host: HostId) -> Option<SocketAddr> {
        self.location.lookup(host)
    }

    #[inline]
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

    /// The sequence number of the exchange `sender` has in progress, as
    /// its datagrams carry it: a local sender's current Send, or the
    /// newest request of a remote one. (Trace spans are joined by it.)
    pub fn exchange_seq(&self, sender: Pid) -> Option<u32> {
        if self.is_local(sender) {
            match &self.proc_ref(sender)?.state {
                PState::Sending(o) => Some(o.seq),
                _ => None,
            }
        } else {
            self.aliens.newest_seq(sender)
        }
    }

    /// Stops querying an address when a host's location is unknown (a
    /// peer name no longer resolves to it). The location cache keeps what
    /// it learned from that host's own datagrams.
    pub fn remove_discovery(&mut self, a: SocketAddr) {
        self.cfg.discovery.retain(|d| *d != a);
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
        let mut wait = Vec::new();
        let host = self.host_id();
        let mut ended = Vec::new();
        // Hosts a first copy goes to in this pass: the probe
        // (`Rtt::probing`) is recorded only when it is sent, after the
        // loop, so without this every Send a stall made late at once
        // would go again in the same pass.
        let mut probing_now: Vec<HostId> = Vec::new();
        let max_rto = self.max_rto();
        for l in self.sending.iter() {
            let Some(h) = host else { break };
            let Some(p) = self.procs.get(l) else {
                ended.push(l);
                continue;
            };
            if let PState::Sending(o) = &p.state {
                if let Some(d) = o.deadline {
                    if now >= d {
                        late.push((Pid::new(h, l), o.dst));
                        continue;
                    }
                    next = next.min(d);
                }
                if let Some(r) = &o.remote {
                    let group = o.dst.is_group();
                    let peer = self.rtt.get(o.dst.host());
                    match r.due(now, group, max_rto, peer.as_ref()) {
                        Due::Dead => dead.push((Pid::new(h, l), o.dst)),
                        Due::Defer => wait.push(Pid::new(h, l)),
                        // Behind another Send's probe sent in this pass.
                        Due::Retransmit
                            if r.may_defer(now, group, max_rto)
                                && probing_now.contains(&o.dst.host()) =>
                        {
                            wait.push(Pid::new(h, l))
                        }
                        Due::Retransmit => {
                            if !r.retransmitted() && !group {
                                probing_now.push(o.dst.host());
                            }
                            retx.push(Pid::new(h, l));
                        }
                        Due::Idle if !r.self_timed() => next = next.min(r.next_timer()),
                        Due::Idle => {}
                    }
                }
            } else {
                ended.push(l);
            }
        }
        for l in ended {
            self.sending.remove(&l);
        }
        for (pid, dst) in dead {
            self.stats.timeouts += 1;
            self.complete(pid, Completion::Send(Err(IpcError::Timeout(dst))));
        }
        for (pid, dst) in late {
            self.stats.deadlines += 1;
            self.complete(pid, Completion::Send(Err(IpcError::Deadline(dst))));
        }
        for pid in wait {
            self.stats.retransmits_deferred += 1;
            if let Some(r) = self.outgoing_mut(pid).and_then(|o| o.remote.as_mut()) {
                r.defer(now);
                if !r.self_timed() {
                    next = next.min(r.next_timer());
                }
            }
        }
        for pid in retx {
            self.transmit_send(now, pid, true);
            if let Some(r) = self.outgoing(pid).and_then(|o| o.remote.as_ref()) {
                if !r.self_timed() {
                    next = next.min(r.next_timer());
                }
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

    /// When `pid`'s remote Send needs its own thread to run
    /// [`Engine::handle_timeout`] (retransmission or host timeout), if
    /// that thread times it: a Send whose first copy asked for its answers
    /// at the thread's socket ([`Engine::set_answer_source`]) is left out
    /// of [`Engine::poll_timeout`], so that no other thread wakes for a
    /// deadline that is nearly always stale (the reply comes first).
    /// With the Send's own deadline ([`Engine::set_send_deadline`]) when
    /// that comes first, and then `exact`: the caller set it and should
    /// be woken on time, while a retransmission may run a little late.
    pub fn own_deadline(&self, pid: Pid) -> Option<OwnDue> {
        let o = self.outgoing(pid)?;
        let r = o.remote.as_ref()?;
        let timer = r.next_timer();
        let due = match o.deadline {
            Some(d) if d <= timer => OwnDue { at: d, exact: true },
            _ => OwnDue {
                at: timer,
                exact: false,
            },
        };
        r.self_timed().then_some(due)
    }

    /// Adds to `out` the processes whose remote Send
    /// [`Engine::handle_timeout`] would retransmit at `now`. A runtime that
    /// receives some answers where only the waiting thread looks (an
    /// answer socket) reads what waits there first, so that a reply that
    /// came but was not read yet (its thread not scheduled) is not taken
    /// for a loss.
    pub fn due_retransmissions(&self, now: Micros, out: &mut Vec<Pid>) {
        let Some(h) = self.host_id() else { return };
        for l in self.sending.iter() {
            if let Some(PState::Sending(o)) = self.procs.get(l).map(|p| &p.state) {
                let peer = self.rtt.get(o.dst.host());
                let max_rto = self.max_rto();
                if o.remote.as_ref().is_some_and(|r| {
                    r.due(now, o.dst.is_group(), max_rto, peer.as_ref()) == Due::Retransmit
                }) {
                    out.push(Pid::new(h, l));
                }
            }
        }
    }

    /// Fails every blocked operation with `Shutdown` and sends nothing
    /// more (the runtime is stopping).
    pub fn shutdown(&mut self) {
        self.out.close();
        let Some(h) = self.host_id() else { return };
        let blocked: Vec<(Pid, Completion)> = self
            .procs
            .iter()
            .filter_map(|(l, p)| {
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

/// When a thread that times its own Send must look at its timers
/// ([`Engine::own_deadline`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnDue {
    /// The engine's time (µs).
    pub at: Micros,
    /// The Send's deadline: wake on time (a retransmission timer, not
    /// exact, may be run a little late).
    pub exact: bool,
}

#[cfg(test)]
mod tests;

/// Encodes into `out` (cleared first) a packet whose data is `seg`'s bytes
/// `range`, copied once. False, with `out` empty, if `range` is not
/// within `seg`.
fn encode_lent(
    h: &Header,
    msg: &Message,
    seg: &dyn SegMem,
    range: std::ops::Range<usize>,
    out: &mut Vec<u8>,
) -> bool {
    let n = range.len();
    out.clear();
    // Room for the authentication trailer too: sealing never reallocates.
    out.reserve(wire::FIXED_BYTES + n + crate::auth::TRAILER_BYTES);
    wire::encode_head(h, msg, n, out);
    if seg.append_to(range.start, n, out) {
        return true;
    }
    out.clear();
    false
}
