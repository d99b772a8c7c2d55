//! The runtime of one logical host: the engine behind a mutex, one UDP
//! socket, a background thread for timers, and the waiting strategy.
//!
//! There is no network server thread on the common path. A process that
//! sends puts its datagram on the wire from its own thread, and a process
//! that waits reads the socket itself (busy-polling briefly, then blocking
//! in its own epoll set on its eventfd and, as a socket reader, the socket
//! registered `EPOLLEXCLUSIVE`; a process that does not read the socket
//! blocks on its eventfd alone), so the reply it waits for is usually
//! processed by the thread that wants it. Whoever reads a
//! datagram runs it through the engine and wakes its target. The
//! background thread only reads the socket when no process is waiting, and
//! runs timers.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vkernel_proto::engine::KERNEL_SERVER_LOCAL_ID;
use vkernel_proto::wire::MAX_DATAGRAM;
use vkernel_proto::{Completion, Config, Engine, Event, HostId, IpcError, Micros, Pid, Stats};

use crate::attach::program::Attachment;
use crate::net::{FaultConfig, Net};
use crate::process::{LocalProcess, Process};
use crate::sys::{poll2, poll3, EventFd};
use crate::vocab::CacheLine;
use crate::waiter::Waiter;

/// How a logical host is set up.
#[derive(Clone, Debug)]
pub struct KernelConfig {
    /// UDP address to bind (IPv4 or IPv6). Port 0 picks a free port.
    pub bind: SocketAddr,
    /// Static peer list and/or broadcast addresses, used to find hosts whose
    /// location is unknown, for remote GetPid and for host-id announcements.
    pub peers: Vec<SocketAddr>,
    /// Peers by name (`HOST:PORT`, see [`crate::PeerSpec`]): resolved as
    /// the host starts and again every `resolve_interval`, every address
    /// joining `peers`' role; addresses a name stops yielding are dropped.
    /// A name that does not resolve yet is a warning, not an error.
    pub named_peers: Vec<crate::PeerSpec>,
    /// How often `named_peers` are looked up again.
    pub resolve_interval: Duration,
    /// A fixed logical host id; `None` allocates one by announcement–complaint.
    pub host_id: Option<u16>,
    /// UDP payload size for bulk data; `None` picks 64 KiB on loopback and
    /// an Ethernet-MTU-sized datagram elsewhere.
    pub datagram_size: Option<usize>,
    /// Bulk-data flow-control window in bytes.
    pub window: usize,
    /// Write-behind bound in bytes: a remote MoveTo this small returns once
    /// its data is copied and sent, while the process's unacknowledged
    /// ones stay within it; its Reply to that sender waits for them (see
    /// `vkernel_proto::Config::write_behind`). 0: every MoveTo waits.
    pub write_behind: usize,
    /// A remote operation fails when the peer host is silent this long.
    pub host_timeout: Duration,
    /// The longest a waiting process busy-polls before it blocks (zero:
    /// always block).
    pub spin: Duration,
    /// Spin only as long as spinning pays, learned per process from its
    /// waits (hits vs misses, spinners vs CPUs, preemption), up to `spin`;
    /// `false` always spins all of `spin`. See `spin.rs`.
    pub adaptive_spin: bool,
    /// Default deadline of every Send of this host's processes: a Send not
    /// replied to within it fails with `IpcError::Deadline`. `None` waits
    /// as long as the server's host answers. Per process:
    /// `Process::set_send_deadline`; per call: `Process::send_within`.
    pub send_deadline: Option<Duration>,
    /// Fault injection on outgoing datagrams.
    pub faults: FaultConfig,
    /// Requested socket buffer size (receive and send).
    pub socket_buffer: usize,
    /// Preallocated alien descriptors (incoming remote requests).
    pub alien_pool: usize,
    /// Seed for host-id choice and sequence numbers (`None` = from the clock).
    pub seed: Option<u64>,
    /// Process groups over IP multicast on this UDP port (IPv4; every host
    /// of the cluster must use the same). `None`: unicast fan-out to the
    /// known hosts (loopback, static peer lists).
    pub multicast_port: Option<u16>,
    /// Who may take part in this host's process groups.
    pub group_policy: vkernel_proto::GroupPolicy,
    /// Cluster keys: with any, every datagram is authenticated (see
    /// `docs/SECURITY.md`); two are held during a key rotation.
    pub keys: Vec<vkernel_proto::auth::Key>,
    /// Id of the key to send with (default: the last of `keys`).
    pub send_key: Option<u8>,
    /// With keys: a datagram whose counter (its sender's wall clock, µs)
    /// is older than this host's start minus this is refused as stale, so
    /// nothing captured before a restart is accepted after it (see
    /// `docs/SECURITY.md`).
    pub max_clock_skew: Duration,
    /// Also encrypt message and data (ChaCha20-Poly1305).
    pub encrypt: bool,
    /// Record every datagram and exchange phase in this file (JSON lines;
    /// see `vkernel trace report`).
    pub trace: Option<std::path::PathBuf>,
    /// Keep the detailed metrics (histograms, per-peer traffic); the basic
    /// counters are always kept.
    pub metrics: bool,
    /// Send small datagrams from a socket connected to their peer (faster;
    /// every datagram names the main socket's port for answers). Not with
    /// fault injection, which sends from the main socket.
    pub side_sockets: bool,
    /// Send bursts of equal-sized bulk chunks as one UDP_SEGMENT send
    /// (segmentation offload), where the kernel takes it; off: one
    /// datagram per call (still batched by sendmmsg).
    pub gso: bool,
    /// A remote Send without a segment asks for its answers at the
    /// sending thread's own socket (one per thread and host), so the reply
    /// wakes the thread that waits for it (`waiter::answer_socket`). Needs
    /// `side_sockets`; not with fault injection, which sees every datagram
    /// at the main socket (a tracer records those of answer sockets too).
    pub answer_sockets: bool,
    /// Such a Send (see `answer_sockets`) runs on the sending thread
    /// outside the engine: no engine lock for the exchange, sequence
    /// numbers reserved in blocks (docs/PROTOCOL.md §8g). Not with a
    /// cluster key or exported spans; `VKERNEL_DIRECT_SENDS=off` in the
    /// environment turns it off.
    pub direct_sends: bool,
    /// Export a span per exchange through the global OpenTelemetry tracer
    /// provider (see `otel.rs`); feature `otel`.
    #[cfg(feature = "otel")]
    pub otel: bool,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            peers: Vec::new(),
            named_peers: Vec::new(),
            resolve_interval: Duration::from_secs(10),
            host_id: None,
            datagram_size: None,
            window: 1 << 20,
            write_behind: 512 << 10,
            host_timeout: Duration::from_secs(3),
            spin: crate::spin::AUTO_SPIN_CAP,
            adaptive_spin: true,
            send_deadline: None,
            faults: FaultConfig::default(),
            socket_buffer: 8 << 20,
            alien_pool: 1024,
            seed: None,
            multicast_port: None,
            group_policy: vkernel_proto::GroupPolicy::default(),
            keys: Vec::new(),
            send_key: None,
            max_clock_skew: Duration::from_secs(1),
            encrypt: false,
            trace: None,
            metrics: true,
            side_sockets: true,
            gso: true,
            answer_sockets: true,
            direct_sends: true,
            #[cfg(feature = "otel")]
            otel: false,
        }
    }
}

/// Errors starting a logical host.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The socket could not be set up.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// Another host holds our fixed logical host id.
    #[error("logical host id {0} is already in use by another host")]
    HostIdConflict(HostId),
    /// The host id could not be allocated in time.
    #[error("logical host id allocation did not finish")]
    AllocationTimeout,
    /// A bad configuration value.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The kernel server could not be created.
    #[error("kernel server: {0}")]
    Ipc(#[from] IpcError),
}

pub(crate) struct State {
    pub(crate) engine: Engine,
    pub(crate) waiters: crate::waiter::Waiters,
    conflict: Option<HostId>,
}

/// State shared by a logical host's threads.
pub(crate) struct Shared {
    state: Mutex<State>,
    pub(crate) net: Net,
    clock: crate::clock::Clock,
    next_timer: CacheLine<AtomicU64>,
    /// Processes busy-polling (low 32 bits) and how many spins have begun
    /// (high 32 bits, wrapping): one word, so a spin counts itself in with
    /// one atomic add, and the background thread can tell that spinning
    /// went on while it slept even if none is spinning when it looks. On a
    /// cache line of its own.
    pub(crate) spinners: CacheLine<AtomicU64>,
    /// Processes blocked reading the socket (epoll or poll), and
    /// [`LONE`] while one waits in it alone ([`Shared::enter_reader`]).
    pub(crate) blocked_readers: CacheLine<AtomicU64>,
    /// Processes that would have read the socket but found a lone reader
    /// in it: blocked on their eventfd alone. When the lone reader leaves
    /// while one is, it nudges the background thread to read.
    gated: AtomicU64,
    /// The lone reader's datagrams (only one thread at a time uses it:
    /// never the batch slots of `rx_batch`, which another thread's timer
    /// run may want while the lone reader waits).
    lone_batch: Mutex<Option<Box<crate::net::RecvBatch>>>,
    /// Until when (host clock, µs) the background thread does not wake for
    /// each arrival on the main socket although no process reads it, but
    /// reads it every [`BUSY_POLL_US`]: a process just took a request with
    /// a deep queue behind it and will be back for more (then, if the
    /// queue ran dry, reading the socket itself).
    pub(crate) busy_until: CacheLine<AtomicU64>,
    /// Async processes re-polling their own tasks for a local answer (at
    /// most one per CPU).
    pub(crate) async_spinners: AtomicU64,
    /// An async process stopped reading the socket since the background
    /// thread last looked.
    pub(crate) async_left: AtomicBool,
    /// An async process stopped reading the socket to sleep.
    pub(crate) async_asleep: AtomicBool,
    bg_efd: EventFd,
    stop: AtomicBool,
    /// The last datagram read was a bulk chunk: more are likely, so the
    /// next is peeked at to receive its data in place.
    bulk_rx: AtomicBool,
    /// Bulk chunks may leave gathered from the lent buffers
    /// ([`Net::gathers`]).
    gathers: bool,
    /// Remote Sends ask for their answers at the sending thread's answer
    /// socket (`KernelConfig::answer_sockets`), bound to this address.
    pub(crate) answers: Option<std::net::IpAddr>,
    /// Remote Sends without a segment may run outside the engine
    /// (`KernelConfig::direct_sends`; needs `answers`).
    pub(crate) direct: bool,
    /// What those exchanges counted, for the host's counters.
    pub(crate) direct_tally: crate::process::direct::Tally,
    /// What attached programs reported of their exchanges outside the
    /// host (direct Sends, peer pages), for the host's counters.
    pub(crate) attach_tally: crate::process::direct::Tally,
    /// What those exchanges learned of peer hosts, shared among them.
    pub(crate) direct_peers: crate::process::direct::Peers,
    /// Slots for taking a stream of small bulk chunks 32 at a time
    /// (allocated on first use: 2 MiB).
    rx_batch: Mutex<Option<Box<crate::net::RecvBatch>>>,
    /// Every new process's waiting strategy.
    pub(crate) spin: crate::spin::SpinPolicy,
    /// Online CPUs (spinners beyond them only take time from others).
    pub(crate) cpus: u64,
    /// Whether the machine has more runnable threads than CPUs.
    pub(crate) run_queue: crate::spin::RunQueue,
    pub(crate) send_deadline: Option<Duration>,
    pub(crate) host: HostId,
    pub(crate) tracer: Option<crate::trace::Tracer>,
    /// The peer names this host follows (see `discover.rs`).
    pub(crate) resolver: Arc<crate::discover::Resolver>,
    /// Exchange spans, with `KernelConfig::otel`.
    #[cfg(feature = "otel")]
    pub(crate) otel: Option<crate::otel::Spans>,
}

/// The count part of [`Shared::spinners`].
pub(crate) const SPINNING: u64 = 0xffff_ffff;
/// What a spin adds to [`Shared::spinners`] as it begins (it takes 1 away
/// as it ends).
pub(crate) const SPIN_BEGINS: u64 = 1 + (1 << 32);

/// In [`Shared::blocked_readers`]: a lone reader waits in the socket.
const LONE: u64 = 1 << 63;

/// How a thread blocked as a reader of the main socket waits
/// ([`Shared::enter_reader`]); leaving the role on drop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reading {
    /// In the socket itself, alone ([`Shared::recv_lone`]).
    Lone,
    /// The only reader, in `poll` on the socket and its eventfd.
    Alone,
    /// One of several, in its epoll set (the socket registered exclusive).
    Shared,
    /// Not a reader: a lone one is in the socket. On its eventfd alone;
    /// counted in `Shared::gated` if true.
    Gated(bool),
}

/// A thread's role as a blocked reader of a host's main socket.
pub(crate) struct ReaderRole<'a>(&'a Shared, Reading);

impl ReaderRole<'_> {
    /// How the thread waits.
    pub(crate) fn reading(&self) -> Reading {
        self.1
    }
}

impl Drop for ReaderRole<'_> {
    fn drop(&mut self) {
        let sh = self.0;
        match self.1 {
            Reading::Lone => {
                sh.net.set_lone(false);
                let before = sh.blocked_readers.fetch_sub(1 | LONE, Ordering::SeqCst);
                // A thread that came to read meanwhile is gated, or about
                // to be: nobody reads the socket now but the background
                // thread.
                if before & !LONE > 1 || sh.gated.load(Ordering::SeqCst) > 0 {
                    sh.nudge_background();
                }
            }
            Reading::Alone | Reading::Shared => {
                sh.blocked_readers.fetch_sub(1, Ordering::AcqRel);
            }
            Reading::Gated(true) => {
                sh.gated.fetch_sub(1, Ordering::AcqRel);
            }
            Reading::Gated(false) => {}
        }
    }
}

/// What [`Shared::recv_in_place`] did.
enum InPlace {
    /// Took a datagram (and this completion, if it was the caller's), or
    /// took none but has the caller's completion (from a timer).
    Done(Option<Completion>),
    /// Nothing queued.
    Empty,
    /// Took nothing: read the next datagram as usual.
    No,
    /// Took nothing: the next datagram is a small bulk chunk, best taken
    /// with the ones behind it ([`Shared::recv_batch_from`]).
    Small,
}

/// Bulk chunks below this many data bytes are received in batches, not
/// in place: a copy of so few bytes costs less than the extra call.
const SMALL_CHUNK: usize = 8192;

/// True if the datagram (or its fixed part) is a bulk chunk: MoveTo
/// data, or MoveFrom data coming back.
fn is_bulk(d: &[u8]) -> bool {
    let pt = d.get(vkernel_proto::wire::field::PTYPE).copied();
    pt.and_then(vkernel_proto::wire::PacketType::from_u8)
        .is_some_and(|t| t.is_bulk())
}

/// True if the datagram is a RemoteSend asking for its answers at its
/// source address.
fn asks_answer_at_source(d: &[u8]) -> bool {
    use vkernel_proto::wire::{field, PacketType, F_ANSWER_SOURCE};
    d.get(field::PTYPE).copied() == Some(PacketType::RemoteSend as u8)
        && d.get(field::FLAGS)
            .is_some_and(|f| f & F_ANSWER_SOURCE != 0)
}

/// True if the datagram is a RemoteReply.
fn is_reply(d: &[u8]) -> bool {
    use vkernel_proto::wire::{field, PacketType};
    d.get(field::PTYPE).copied() == Some(PacketType::RemoteReply as u8)
}

/// A thread's reused vectors: datagrams to send, waiters to signal, and
/// sent datagrams' buffers to hand back to the engine.
type Scratch = (
    Vec<vkernel_proto::engine::Transmit>,
    Vec<Arc<Waiter>>,
    Vec<Vec<u8>>,
);

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
    static RECV_BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; MAX_DATAGRAM + 1]);
    /// This thread holds the batch slots and is handling what it read
    /// there (see [`Shared::read_unread_main`]).
    static IN_BATCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The most `recvmmsg` calls [`Shared::read_unread_main`] makes before
/// timeouts.
const UNREAD_BATCHES: usize = 2;

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    pub(crate) fn now(&self) -> Micros {
        self.clock.now()
    }

    /// Runs `f` on the engine, then timers if due; sends what it produced
    /// and wakes whom it completed, after releasing the lock.
    pub(crate) fn with_engine<R>(&self, f: impl FnOnce(&mut Engine, Micros) -> R) -> R {
        self.with_engine_as(None, f).0
    }

    /// [`Shared::with_engine`] run by the waiting process `me`: its own
    /// completion, if `f` produced it, is returned instead of being handed
    /// over through its waiter (no slot lock, no wake flag: the thread
    /// that wants the completion is the one holding it).
    pub(crate) fn with_engine_as<R>(
        &self,
        me: Option<Pid>,
        f: impl FnOnce(&mut Engine, Micros) -> R,
    ) -> (R, Option<Completion>) {
        self.with_engine_via(me, None, f)
    }

    /// [`Shared::with_engine_as`] sending the RemoteSends that ask for
    /// answers at their source (`F_ANSWER_SOURCE`) from `via`, the calling
    /// thread's answer socket.
    pub(crate) fn with_engine_via<R>(
        &self,
        me: Option<Pid>,
        via: Option<&Arc<std::net::UdpSocket>>,
        f: impl FnOnce(&mut Engine, Micros) -> R,
    ) -> (R, Option<Completion>) {
        self.with_engine_out(me, via, None, f)
    }

    /// [`Shared::with_engine`] whose replies are appended to `hold`
    /// instead of being sent (a process holding its replies:
    /// [`Shared::send_held`] sends them); the processes it completed are
    /// woken as usual.
    pub(crate) fn with_engine_holding<R>(
        &self,
        hold: &mut Vec<vkernel_proto::engine::Transmit>,
        f: impl FnOnce(&mut Engine, Micros) -> R,
    ) -> R {
        self.with_engine_out(None, None, Some(hold), f).0
    }

    /// Sends the datagrams `held` (emptying it) in as few calls as the
    /// socket allows; their buffers go back to the engine with this
    /// thread's next call.
    pub(crate) fn send_held(&self, held: &mut Vec<vkernel_proto::engine::Transmit>) {
        if held.is_empty() {
            return;
        }
        // (`try_with`: a process may be dropped as its thread ends.)
        let mut sent = SCRATCH
            .try_with(|s| std::mem::take(&mut s.borrow_mut().2))
            .unwrap_or_default();
        self.net.send_many(held, &mut sent);
        let _ = SCRATCH.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.2.is_empty() {
                s.2 = sent;
            }
        });
    }

    fn with_engine_out<R>(
        &self,
        me: Option<Pid>,
        via: Option<&Arc<std::net::UdpSocket>>,
        mut hold: Option<&mut Vec<vkernel_proto::engine::Transmit>>,
        f: impl FnOnce(&mut Engine, Micros) -> R,
    ) -> (R, Option<Completion>) {
        // Reuse this thread's vectors: no allocation on the common path.
        let (mut out, mut wakes, mut sent) = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
        let (r, mine) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            for b in sent.drain(..) {
                st.engine.recycle(b);
            }
            let now = self.now();
            if me.is_some() {
                st.engine.set_caller(me);
            }
            let r = f(&mut st.engine, now);
            if now >= st.engine.poll_timeout() {
                if self.answers.is_some() {
                    self.read_unread_answers(st, now);
                }
                // Another thread holding datagrams it read but has not
                // handled yet (waiting for this lock) runs the timers
                // itself once it has: an acknowledgement among them is
                // then not taken for a loss.
                if self.read_unread_main(st, now) {
                    st.engine.handle_timeout(now);
                }
            }
            let mine = if me.is_some() {
                let c = st.engine.take_own();
                st.engine.set_caller(None);
                c
            } else {
                None
            };
            if st.engine.has_output() {
                self.take_output(st, &mut out, &mut wakes);
            }
            // Store only a change: spinning threads read this line.
            let t = st.engine.poll_timeout();
            if self.next_timer.load(Ordering::Relaxed) != t {
                self.next_timer.store(t, Ordering::Release);
            }
            (r, mine)
        };
        if let Some(tr) = &self.tracer {
            for t in &out {
                tr.datagram(true, &t.data);
            }
        }
        for t in out.drain(..) {
            // Only replies wait; anything else this call made (a timer's
            // retransmission, say) leaves now.
            if let Some(h) = hold.as_mut().filter(|_| is_reply(&t.data)) {
                h.push(t);
                continue;
            }
            if let Some(v) = via.filter(|_| asks_answer_at_source(&t.data)) {
                self.net.send_from(v, t.to, &t.data);
                sent.push(t.data);
            } else if let Some(b) = self.net.send(t.to, t.data) {
                sent.push(b);
            }
        }
        if !wakes.is_empty() {
            let n = wakes.len() as u64;
            self.net.counters.handoffs.fetch_add(n, Ordering::Relaxed);
            for w in wakes.drain(..) {
                w.signal();
            }
        }
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            // Keep the larger buffers (a nested call may have left some).
            if s.0.capacity() < out.capacity() {
                s.0 = out;
            }
            if s.1.capacity() < wakes.capacity() {
                s.1 = wakes;
            }
            if s.2.is_empty() {
                s.2 = sent;
            }
        });
        (r, mine)
    }

    /// Before retransmissions are due: reads what waits in the answer
    /// sockets of the processes concerned whose threads are blocked (not
    /// scheduled yet since their reply came, on a loaded machine), so the
    /// reply is taken as such rather than the request sent again. Their
    /// completions wake them as usual.
    fn read_unread_answers(&self, st: &mut State, now: Micros) {
        let mut due = Vec::new();
        st.engine.due_retransmissions(now, &mut due);
        if due.is_empty() {
            return;
        }
        // Answers to Sends without a segment carry no data: a fixed part
        // and at most an authentication trailer.
        let mut buf = [0u8; 1024];
        for pid in due {
            let Some(sock) = st.waiters.get(&pid).and_then(|w| w.blocked_in_answer()) else {
                continue;
            };
            for _ in 0..4 {
                let Some((len, from)) = self.net.recv_answer(&sock, &mut buf) else {
                    break;
                };
                self.net
                    .counters
                    .answers_for_others
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(tr) = &self.tracer {
                    tr.datagram(false, &buf[..len]);
                }
                st.engine.handle_datagram(now, from, &buf[..len]);
            }
        }
    }

    /// Before timeouts fire: takes what waits in the main socket, so that
    /// an answer that came in time is seen as such. A process moving data
    /// write-behind does not wait, so nothing of it reads the transfers'
    /// acknowledgements; when its next call found a probe due, the
    /// acknowledgement was often queued unread, and the probe (or, later,
    /// a timeout and a window cut) needless.
    ///
    /// False if another thread holds the batch slots: it is reading, or
    /// holds datagrams it has not handled yet. (The slots are taken after
    /// the engine lock here, before it in `recv_batch_from`: so only
    /// tried, never waited for.)
    fn read_unread_main(&self, st: &mut State, now: Micros) -> bool {
        let Ok(mut slot) = self.rx_batch.try_lock() else {
            // This thread's own batch has been handled by now.
            return IN_BATCH.with(|b| b.get());
        };
        let b = slot.get_or_insert_with(Box::default);
        for _ in 0..UNREAD_BATCHES {
            let k = self.net.recv_batch(b, false);
            for (data, from) in b.datagrams() {
                if let Some(tr) = &self.tracer {
                    tr.datagram(false, data);
                }
                st.engine.handle_datagram(now, from, data);
            }
            if k < crate::net::RECV_BATCH {
                break;
            }
        }
        true
    }

    /// Takes what the engine produced under the lock: bulk chunks are sent
    /// now, datagrams go to `out` and waiters to signal to `wakes`, both
    /// for after the lock is released.
    fn take_output(
        &self,
        st: &mut State,
        out: &mut Vec<vkernel_proto::engine::Transmit>,
        wakes: &mut Vec<Arc<Waiter>>,
    ) {
        // Bulk chunks go out from the lent buffers, under the lock that
        // keeps those lent (no copy into a datagram first), unless a
        // tracer or a fault injector (other than loss) needs whole
        // datagrams.
        if self.tracer.is_none() && self.gathers {
            st.engine.send_chunk_batch(|b| self.net.send_batch(b));
        }
        while let Some(t) = st.engine.poll_transmit() {
            out.push(t);
        }
        while let Some(e) = st.engine.poll_event() {
            match e {
                Event::Wake(p) => {
                    if let Some(w) = st.waiters.get(&p) {
                        // Hand the completion over now, so the woken
                        // thread need not take the engine lock again.
                        if let Some(c) = st.engine.take_completion(p) {
                            let receive = matches!(c, Completion::Receive(_));
                            match w.complete_armed(c) {
                                Ok(wake) => {
                                    if receive {
                                        w.queue_state(st.engine.has_queued(p));
                                    }
                                    if wake {
                                        wakes.push(w.clone());
                                    }
                                    continue;
                                }
                                Err(c) => w.deliver(c),
                            }
                        }
                        // A spinning process sees the flag; only one
                        // blocked in the kernel needs a signal, sent
                        // after the lock is released.
                        if w.wake_spinning() {
                            wakes.push(w.clone());
                        }
                    }
                }
                Event::Queued(p) => {
                    if let Some(w) = st.waiters.get(&p) {
                        w.queue_state(true);
                    }
                }
                Event::HostIdConflict(h) => st.conflict = Some(h),
                Event::HostReady(_) => {}
                Event::JoinMulticast(a) => self.net.join_multicast(a),
                Event::LeaveMulticast(a) => self.net.leave_multicast(a),
            }
        }
    }

    /// Reads and processes what waits on the calling thread's answer
    /// socket `sock` (at most 8 datagrams, up to the one that completes
    /// `me`'s operation): that completion, if one came.
    pub(crate) fn poll_answer(&self, me: Pid, sock: &std::net::UdpSocket) -> Option<Completion> {
        let mut mine = None;
        RECV_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            for _ in 0..8 {
                let Some((len, from)) = self.net.recv_answer(sock, &mut buf) else {
                    break;
                };
                mine = self.handle_answer(me, from, &buf[..len]);
                if mine.is_some() {
                    // Done: no empty read after the reply.
                    break;
                }
            }
        });
        mine
    }

    /// Handles a datagram read from `me`'s thread's answer socket: `me`'s
    /// completion, if it produced it.
    pub(crate) fn handle_answer(
        &self,
        me: Pid,
        from: SocketAddr,
        data: &[u8],
    ) -> Option<Completion> {
        if let Some(tr) = &self.tracer {
            tr.datagram(false, data);
        }
        self.with_engine_as(Some(me), |e, now| e.handle_datagram(now, from, data))
            .1
    }

    /// Reads and processes up to `max` queued datagrams.
    pub(crate) fn poll_socket(&self, max: usize) -> usize {
        self.poll_socket_as(None, max).0
    }

    /// [`Shared::poll_socket`] by the waiting process `me`: returns its own
    /// completion if one of the datagrams produced it. (It still drains up
    /// to `max`: a datagram left behind might wait for a timer, since
    /// exclusive epoll wakes one reader per arrival.)
    pub(crate) fn poll_socket_as(
        &self,
        me: Option<Pid>,
        max: usize,
    ) -> (usize, Option<Completion>) {
        let mut n = 0;
        let mut mine = None;
        RECV_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            while n < max {
                // A lone reader waits in the main socket: leave it to it
                // (`try_recv` below then reads the group socket only).
                let lone = self.net.lone();
                // (Not while tracing: the tracer records whole datagrams.)
                if !lone && self.bulk_rx.load(Ordering::Relaxed) && self.tracer.is_none() {
                    match self.recv_in_place(me, &mut buf) {
                        InPlace::Done(c) => {
                            n += 1;
                            if c.is_some() {
                                mine = c;
                            }
                            continue;
                        }
                        InPlace::Empty if !self.net.has_multicast_socket() => break,
                        InPlace::Small => {
                            let (k, c) = self.recv_batch_from(me).unwrap_or((0, None));
                            n += k;
                            if c.is_some() {
                                mine = c;
                            }
                            if k > 0 {
                                continue;
                            }
                        }
                        _ => {}
                    }
                }
                // Small datagrams, when the caller takes several: all that
                // are queued by one recvmmsg, under one engine lock (a
                // loaded server's Sends; and a lone one costs one call,
                // not a second empty recv).
                if !lone
                    && max > 1
                    && self.tracer.is_none()
                    && !self.bulk_rx.load(Ordering::Relaxed)
                {
                    if let Some((k, c)) = self.recv_batch_from(me) {
                        n += k;
                        if c.is_some() {
                            mine = c;
                        }
                        if k == crate::net::RECV_BATCH {
                            continue;
                        }
                        if !self.net.has_multicast_socket() {
                            break;
                        }
                    }
                }
                let Some((len, from)) = self.net.try_recv(&mut buf) else {
                    break;
                };
                n += 1;
                let data = &buf[..len];
                let bulk = is_bulk(data);
                if bulk != self.bulk_rx.load(Ordering::Relaxed) {
                    self.bulk_rx.store(bulk, Ordering::Relaxed);
                }
                if let Some(tr) = &self.tracer {
                    tr.datagram(false, data);
                }
                let (_, c) = self.with_engine_as(me, |e, now| e.handle_datagram(now, from, data));
                if c.is_some() {
                    mine = c;
                }
            }
        });
        (n, mine)
    }

    /// Takes the next datagram, receiving a bulk chunk's data straight into
    /// the lent buffer it is for (one copy fewer), under the engine lock
    /// that keeps the buffer lent. Another reader may take the datagram
    /// between the peek and the receive: then what arrived (whatever it
    /// is) is put together and handled as usual, and the place, which only
    /// a chunk not yet received gets, waits for the real chunk.
    fn recv_in_place(&self, me: Option<Pid>, spill: &mut [u8]) -> InPlace {
        use vkernel_proto::wire::FIXED_BYTES;
        let mut head = [0u8; FIXED_BYTES];
        let Some((k, _)) = self.net.peek(&mut head) else {
            return InPlace::Empty;
        };
        if k < FIXED_BYTES || !is_bulk(&head) {
            self.bulk_rx.store(false, Ordering::Relaxed);
            return InPlace::No;
        }
        let len_field = vkernel_proto::wire::field::LENGTH;
        let data_len = head
            .get(len_field)
            .and_then(|b| b.try_into().ok())
            .map_or(usize::MAX, |b| u32::from_be_bytes(b) as usize);
        if data_len < SMALL_CHUNK {
            return InPlace::Small;
        }
        let (done, mine) = self.with_engine_as(me, |e, now| {
            // Peek again under the lock: the datagram peeked before may have
            // been taken and handled since, and its transfer forgotten by
            // the engine (an exchange remembers its last few), which would then
            // offer its place again; whatever this thread then received
            // would land there and nothing would put the real data back.
            // A datagram still queued now is handled only after this lock
            // is released, so if another reader takes it, its data is
            // written over whatever lands in the place meanwhile.
            let mut again = [0u8; FIXED_BYTES];
            let still = self
                .net
                .peek(&mut again)
                .is_some_and(|(k, _)| k >= FIXED_BYTES && again == head);
            let slot = if still { e.placement(&head) } else { None };
            let Some(slot) = slot else {
                // Not placeable (held already, say): read it as usual,
                // under this lock rather than taking it again.
                let Some((len, from)) = self.net.try_recv(spill) else {
                    return false;
                };
                e.handle_datagram(now, from, &spill[..len]);
                return true;
            };
            let want = slot.len();
            let mut got = [0u8; FIXED_BYTES];
            let Some((len, from)) = self.net.recv_parts(&mut got, slot, spill) else {
                return false;
            };
            let c = &self.net.counters;
            if len == FIXED_BYTES + want && got == head {
                c.bulk_in_place.fetch_add(1, Ordering::Relaxed);
                e.handle_placed(now, from, &got);
            } else {
                c.bulk_in_place_missed.fetch_add(1, Ordering::Relaxed);
                let mut whole = Vec::with_capacity(len);
                whole.extend_from_slice(&got[..len.min(FIXED_BYTES)]);
                let in_slot = len.saturating_sub(FIXED_BYTES).min(want);
                whole.extend_from_slice(&slot[..in_slot]);
                let rest = len.saturating_sub(FIXED_BYTES + want);
                whole.extend_from_slice(&spill[..rest.min(spill.len())]);
                e.handle_datagram(now, from, &whole);
            }
            true
        });
        // (A completion of the caller's from a timer run in the same call
        // is returned even if no datagram was taken.)
        if done || mine.is_some() {
            InPlace::Done(mine)
        } else {
            InPlace::No
        }
    }

    /// Takes up to 32 queued datagrams in one call and handles them under
    /// one engine lock: how many, and `me`'s completion if one of them
    /// produced it; `None` if another thread holds the slots (nothing was
    /// read).
    fn recv_batch_from(&self, me: Option<Pid>) -> Option<(usize, Option<Completion>)> {
        let mut slot = self.rx_batch.try_lock().ok()?;
        let b = slot.get_or_insert_with(Box::default);
        if self.net.recv_batch(b, false) == 0 {
            return Some((0, None));
        }
        Some(self.handle_batch(me, b))
    }

    /// Waits in the main socket as its lone reader (the caller holds the
    /// [`Reading::Lone`] role, and its thread is noted as waiting there)
    /// until datagrams come, a wake-up, or the receive timeout; then
    /// handles them as [`Shared::recv_batch_from`] does. How many, and
    /// `me`'s completion if one of them produced it.
    pub(crate) fn recv_lone(&self, me: Pid) -> (usize, Option<Completion>) {
        // Never contended: the role is one thread's at a time.
        let mut slot = match self.lone_batch.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let b = slot.get_or_insert_with(Box::default);
        let n = self.net.recv_batch(b, true);
        // Others may read again (new readers still wait for the role to
        // end).
        self.net.set_lone(false);
        let c = &self.net.counters;
        c.lone_waits.fetch_add(1, Ordering::Relaxed);
        if b.wakes > 0 {
            c.lone_wakes.fetch_add(1, Ordering::Relaxed);
        } else if n == 0 {
            c.lone_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        if n == 0 {
            return (0, None);
        }
        self.handle_batch(Some(me), b)
    }

    /// Handles the datagrams of `b` under one engine lock.
    fn handle_batch(
        &self,
        me: Option<Pid>,
        b: &crate::net::RecvBatch,
    ) -> (usize, Option<Completion>) {
        // As one datagram at a time would: a bulk stream's next chunks are
        // received in place.
        let bulk = b.datagrams().last().is_some_and(|(d, _)| is_bulk(d));
        if bulk != self.bulk_rx.load(Ordering::Relaxed) {
            self.bulk_rx.store(bulk, Ordering::Relaxed);
        }
        IN_BATCH.with(|x| x.set(true));
        let (_, mine) = self.with_engine_as(me, |e, now| {
            for (data, from) in b.datagrams() {
                e.handle_datagram(now, from, data);
            }
        });
        IN_BATCH.with(|x| x.set(false));
        (b.len(), mine)
    }

    /// Whether a reader blocking for up to `timeout` may wait in the
    /// socket itself ([`Shared::enter_reader`]): the next timer is far
    /// enough off for the socket's millisecond timeout (which this sets),
    /// and datagrams are taken whole (no bulk stream received in place,
    /// no tracer).
    pub(crate) fn may_wait_lone(&self, timeout: Duration) -> bool {
        self.tracer.is_none()
            && !self.bulk_rx.load(Ordering::Relaxed)
            && self.net.set_recv_timeout(timeout)
    }

    /// Enters a thread blocking as a reader of the main socket. `may_lone`:
    /// it can wait in the socket itself (`recvmmsg`, one system call where
    /// `poll` and a read take two), which it then does if no other reader
    /// is blocked. While it does, nobody else reads the socket, since a
    /// wake-up (an empty datagram) another took would leave it asleep: a
    /// thread that comes to read meanwhile waits on its eventfd, and, if
    /// it `needs_socket` (what it waits for may come in a datagram), the
    /// lone reader has the background thread read once it leaves.
    pub(crate) fn enter_reader(&self, may_lone: bool, needs_socket: bool) -> ReaderRole<'_> {
        let r = &self.blocked_readers;
        if may_lone
            && r.compare_exchange(0, 1 | LONE, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.net.set_lone(true);
            return ReaderRole(self, Reading::Lone);
        }
        let before = r.fetch_add(1, Ordering::SeqCst);
        if before & LONE != 0 {
            // Counted as gated before leaving the readers: the lone reader
            // sees one or the other.
            if needs_socket {
                self.gated.fetch_add(1, Ordering::SeqCst);
            }
            r.fetch_sub(1, Ordering::SeqCst);
            return ReaderRole(self, Reading::Gated(needs_socket));
        }
        ReaderRole(
            self,
            if before == 0 {
                Reading::Alone
            } else {
                Reading::Shared
            },
        )
    }

    /// Threads that will read the socket promptly (spinning or blocked on
    /// it; a lone reader counts once).
    pub(crate) fn readers(&self) -> usize {
        (self.spinning() + (self.blocked_readers.load(Ordering::Acquire) & !LONE)) as usize
    }

    /// Processes busy-polling now.
    /// Makes the background thread look again at who reads the socket
    /// (a spinner that stopped does not block as a reader itself).
    pub(crate) fn nudge_background(&self) {
        self.bg_efd.signal();
    }

    pub(crate) fn spinning(&self) -> u64 {
        self.spinners.load(Ordering::Acquire) & SPINNING
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

    /// The counters and gauges, copied under the lock.
    pub(crate) fn snapshot(&self) -> (Stats, crate::metrics::Gauges) {
        self.with_engine(|e, now| {
            let mut s = e.stats().clone();
            self.direct_tally.fold_into(&mut s);
            self.attach_tally.fold_into(&mut s);
            (
                s,
                crate::metrics::Gauges {
                    host: e.host_id().map_or(0, |h| h.0),
                    processes: e.process_count() as u64,
                    queued: e.queued_messages() as u64,
                    uptime_us: now,
                },
            )
        })
    }

    pub(crate) fn register(&self, pid: Pid, w: Arc<Waiter>) {
        self.lock().waiters.insert(pid, w);
    }

    pub(crate) fn unregister(&self, pid: Pid) -> Option<Arc<Waiter>> {
        self.lock().waiters.remove(&pid)
    }

    /// Wakes `w`'s thread if it reads its own socket in a direct Send
    /// (an embedded process's answer socket, an attached program's
    /// socket): call after setting what it should notice (`destroyed`,
    /// `stop`, the slot's `ended`).
    pub(crate) fn wake_direct(&self, w: &Waiter) {
        if let Some(port) = w.answer_port() {
            self.net.wake_answer(port);
        }
    }

    /// Notes where attached process `pid` runs its own remote Sends (its
    /// socket's `port`), to wake them when it is destroyed.
    pub(crate) fn note_direct_port(&self, pid: Pid, port: u16) {
        if let Some(w) = self.lock().waiters.get(&pid) {
            w.set_answer_port(port);
        }
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
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

    fn background(self: Arc<Self>) {
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
const BUSY_POLL_US: u64 = 1_000;

/// One logical host: a kernel instance with its own UDP port, run by this
/// program ([`Kernel::start`]) or by a machine host this program attached
/// to ([`Kernel::attach`]). The API is the same either way.
///
/// Dropping it shuts the host down (or detaches): blocked operations fail
/// with [`IpcError::Shutdown`].
pub struct Kernel {
    imp: Imp,
}

enum Imp {
    Embedded(Embedded),
    Attached(Arc<Attachment>),
}

/// A logical host run by this program.
struct Embedded {
    shared: Arc<Shared>,
    bg: Option<JoinHandle<()>>,
    ks: Option<JoinHandle<()>>,
}

/// The engine's authentication settings from the host configuration; warns
/// (once per process) when datagrams will not be authenticated.
fn auth_config(
    cfg: &KernelConfig,
    seed: u64,
) -> Result<Option<vkernel_proto::auth::AuthConfig>, KernelError> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if cfg.keys.is_empty() {
        if cfg.encrypt {
            return Err(KernelError::Config("--encrypt needs a cluster key".into()));
        }
        if !cfg.bind.ip().is_loopback() && !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "no cluster key: interkernel datagrams are not authenticated (anyone who can reach {} can speak for any host)",
                cfg.bind
            );
        }
        return Ok(None);
    }
    let send_key = match cfg.send_key {
        Some(id) => id,
        None => cfg.keys.last().map_or(0, |k| k.id),
    };
    if !cfg.keys.iter().any(|k| k.id == send_key) {
        return Err(KernelError::Config(format!(
            "send key {send_key} is not among the configured keys"
        )));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    Ok(Some(vkernel_proto::auth::AuthConfig {
        keys: cfg.keys.clone(),
        send_key,
        encrypt: cfg.encrypt,
        // Above any counter this host id used before a restart, and the
        // base of the floor below which counters are refused.
        counter_start: now,
        max_skew: cfg.max_clock_skew.as_micros().min(u128::from(u64::MAX)) as u64,
        salt: (seed ^ (seed >> 32)) as u32 ^ now as u32,
    }))
}

fn default_datagram(ip: IpAddr) -> usize {
    if ip.is_loopback() {
        MAX_DATAGRAM
    } else if ip.is_ipv4() {
        1472
    } else {
        1452
    }
}

impl Kernel {
    /// Starts a logical host with the given configuration.
    pub fn start(cfg: KernelConfig) -> Result<Kernel, KernelError> {
        let mut net = Net::bind(cfg.bind, cfg.faults.clone(), cfg.socket_buffer)?;
        if let Some(port) = cfg.multicast_port {
            net.bind_multicast(port)?;
        }
        net.set_gso(cfg.gso);
        let side = cfg.side_sockets && net.use_side_sockets()?;
        let me = net.local_addr()?;
        let seed = cfg.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ ((std::process::id() as u64) << 32) ^ me.port() as u64
        });
        if let Some(h) = cfg.host_id {
            if !HostId(h).is_valid() {
                return Err(KernelError::Config(format!(
                    "host id {h:#x} must be in 1..=0x7fff"
                )));
            }
        }
        let datagram_size = cfg
            .datagram_size
            .unwrap_or_else(|| default_datagram(me.ip()));
        if !(256..=MAX_DATAGRAM).contains(&datagram_size) {
            return Err(KernelError::Config(format!(
                "datagram size {datagram_size} must be in 256..={MAX_DATAGRAM}"
            )));
        }
        let host_timeout = cfg.host_timeout.as_micros() as Micros;
        let auth = auth_config(&cfg, seed)?;
        let resolver = Arc::new(crate::discover::Resolver::new(
            me,
            &cfg.peers,
            cfg.resolve_interval,
        ));
        let mut discovery: Vec<SocketAddr> = cfg.peers.clone();
        discovery.extend(resolver.initial(&cfg.named_peers));
        let mut seen = std::collections::HashSet::new();
        discovery.retain(|p| *p != me && seen.insert(*p));
        let ecfg = Config {
            host_id: cfg.host_id.map(HostId),
            discovery,
            datagram_size,
            window: cfg.window.max(datagram_size),
            write_behind: cfg.write_behind,
            alien_pool: cfg.alien_pool.max(1),
            alien_per_host: (cfg.alien_pool / 2).max(1),
            host_timeout,
            alien_timeout: host_timeout * 2 + 2_000_000,
            seed,
            multicast_port: cfg.multicast_port,
            group_policy: cfg.group_policy.clone(),
            auth,
            metrics: cfg.metrics,
            // Named in every datagram, so that small ones may leave from a
            // side socket (see `Net::send`).
            reply_port: if side { me.port() } else { 0 },
            ..Config::default()
        };
        let alloc_wait = Duration::from_micros(ecfg.alloc_timeout) * 4 + Duration::from_secs(1);
        let state = State {
            engine: Engine::new(ecfg, 0),
            waiters: crate::waiter::Waiters::default(),
            conflict: None,
        };
        let gathers = net.gathers();
        // (Side sockets are off with a fault injector, which sends from
        // the main socket; answer sockets are not: it sends from them too.)
        let answers = (cfg.answer_sockets && (side || net.has_faults()) && cfg.side_sockets)
            .then_some(me.ip());
        #[cfg(feature = "otel")]
        let spans = cfg.otel;
        #[cfg(not(feature = "otel"))]
        let spans = false;
        let direct = cfg.direct_sends
            && answers.is_some()
            && !spans
            && std::env::var_os("VKERNEL_DIRECT_SENDS").is_none_or(|v| v != "off");
        let mut shared = Shared {
            state: Mutex::new(state),
            net,
            gathers,
            answers,
            direct,
            direct_tally: Default::default(),
            attach_tally: Default::default(),
            direct_peers: Default::default(),
            clock: crate::clock::Clock::new(),
            next_timer: CacheLine(AtomicU64::new(0)),
            spinners: CacheLine(AtomicU64::new(0)),
            blocked_readers: CacheLine(AtomicU64::new(0)),
            gated: AtomicU64::new(0),
            lone_batch: Mutex::new(None),
            busy_until: CacheLine(AtomicU64::new(0)),
            async_spinners: AtomicU64::new(0),
            async_left: AtomicBool::new(false),
            async_asleep: AtomicBool::new(false),
            bg_efd: EventFd::new()?,
            stop: AtomicBool::new(false),
            bulk_rx: AtomicBool::new(false),
            rx_batch: Mutex::new(None),
            spin: if cfg.adaptive_spin {
                crate::spin::SpinPolicy::adaptive(cfg.spin)
            } else {
                crate::spin::SpinPolicy::fixed(cfg.spin)
            },
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            run_queue: crate::spin::RunQueue::new(),
            send_deadline: cfg.send_deadline,
            host: HostId(0),
            tracer: match &cfg.trace {
                Some(p) => Some(crate::trace::Tracer::create(p)?),
                None => None,
            },
            resolver,
            #[cfg(feature = "otel")]
            otel: cfg.otel.then(crate::otel::Spans::new),
        };
        // Allocate the host id before anyone else sees the state.
        let deadline = Instant::now() + alloc_wait;
        let started = Instant::now();
        // A fixed id is announced once; give a holder a moment to complain.
        let fixed_wait =
            if cfg.host_id.is_some() && !shared.lock().engine.config().discovery.is_empty() {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
        let host = loop {
            shared.poll_socket(256);
            shared.run_timers_if_due();
            let (id, conflict) = {
                let st = shared.lock();
                (st.engine.host_id(), st.conflict)
            };
            if let Some(c) = conflict {
                return Err(KernelError::HostIdConflict(c));
            }
            if let Some(id) = id {
                if cfg.host_id.is_none() || started.elapsed() >= fixed_wait {
                    break id;
                }
            }
            if Instant::now() >= deadline {
                return Err(KernelError::AllocationTimeout);
            }
            poll2(
                shared.net.fd(),
                None,
                shared.time_to_timer(Duration::from_millis(10)),
            );
        };
        shared.host = host;
        if let Some(t) = &shared.tracer {
            t.set_host(host.0);
        }
        let shared = Arc::new(shared);
        shared.start_resolver()?;
        let bg = {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("vk-{host}-timer"))
                .spawn(move || s.background())?
        };
        let mut emb = Embedded {
            shared,
            bg: Some(bg),
            ks: None,
        };
        let kpid = emb.shared.with_engine(|e, _| e.create_kernel_server())?;
        let ks = LocalProcess::new(emb.shared.clone(), kpid)?;
        emb.ks = Some(
            std::thread::Builder::new()
                .name(format!("vk-{host}-kserver"))
                .spawn(move || crate::kernel_server::run(ks))?,
        );
        Ok(Kernel {
            imp: Imp::Embedded(emb),
        })
    }

    /// Attaches this program to the machine host listening on `path` (see
    /// `vkernel host`): processes created through the returned handle are
    /// that host's processes, in its pid space, with its names, groups,
    /// kernel server and sockets.
    pub fn attach(path: impl AsRef<std::path::Path>) -> Result<Kernel, KernelError> {
        Kernel::attach_with(path, &KernelConfig::default())
    }

    /// [`Kernel::attach`] whose processes wait as `cfg.spin` and
    /// `cfg.adaptive_spin` say and default to `cfg.send_deadline`; the
    /// rest of `cfg` is the machine host's business.
    pub fn attach_with(
        path: impl AsRef<std::path::Path>,
        cfg: &KernelConfig,
    ) -> Result<Kernel, KernelError> {
        let spin = if cfg.adaptive_spin {
            crate::spin::SpinPolicy::adaptive(cfg.spin)
        } else {
            crate::spin::SpinPolicy::fixed(cfg.spin)
        };
        let a = Attachment::connect(path.as_ref(), spin, cfg.send_deadline)?;
        Ok(Kernel {
            imp: Imp::Attached(a),
        })
    }

    /// [`Kernel::attach`] to the machine host at
    /// [`crate::attach::default_path`] (`$VKERNEL_HOST`, or the per-user
    /// default).
    pub fn attach_default() -> Result<Kernel, KernelError> {
        Kernel::attach(crate::attach::default_path())
    }

    /// True if this handle is attached to a machine host rather than
    /// running its own.
    pub fn is_attached(&self) -> bool {
        matches!(self.imp, Imp::Attached(_))
    }

    /// Makes this host a machine host: programs may attach to it through
    /// a Unix socket at `path` whose permission bits are `mode` (who may
    /// attach). Stops serving when the returned handle is dropped.
    pub fn serve_attach(
        &self,
        path: impl AsRef<std::path::Path>,
        mode: u32,
    ) -> Result<crate::attach::AttachServer, KernelError> {
        match &self.imp {
            Imp::Embedded(e) => Ok(crate::attach::AttachServer::start(
                e.shared.clone(),
                path.as_ref(),
                mode,
            )?),
            Imp::Attached(_) => Err(KernelError::Config(
                "an attached program cannot serve attachments; run `vkernel host`".into(),
            )),
        }
    }

    /// This host's logical id.
    pub fn host_id(&self) -> HostId {
        match &self.imp {
            Imp::Embedded(e) => e.shared.host,
            Imp::Attached(a) => a.host,
        }
    }

    /// The pid of this host's kernel-server process.
    pub fn kernel_server(&self) -> Pid {
        Pid::new(self.host_id(), KERNEL_SERVER_LOCAL_ID)
    }

    /// The UDP address this host listens on.
    pub fn local_addr(&self) -> SocketAddr {
        let a = match &self.imp {
            Imp::Embedded(e) => e.shared.net.local_addr().ok(),
            Imp::Attached(a) => a.host_addr,
        };
        a.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Receive buffer granted by the OS.
    /// (0 for an attached program, which has no socket of its own.)
    pub fn socket_buffer(&self) -> usize {
        match &self.imp {
            Imp::Embedded(e) => e.shared.net.rcvbuf(),
            Imp::Attached(_) => 0,
        }
    }

    /// Adds a peer address (static peer list) at run time.
    pub fn add_peer(&self, a: SocketAddr) {
        match &self.imp {
            Imp::Embedded(e) => {
                e.shared.resolver.add_static(a);
                e.shared.with_engine(|e, _| e.add_discovery(a));
            }
            Imp::Attached(at) => at.add_peer(&a.to_string()),
        }
    }

    /// Adds a peer at run time: an address as [`Kernel::add_peer`] does, a
    /// name to be followed from now on (looked up at once on the host's
    /// resolver thread, then every `resolve_interval`). Attached, the
    /// machine host follows the name, since it owns the socket.
    pub fn add_peer_spec(&self, p: &crate::PeerSpec) -> Result<(), KernelError> {
        match (&self.imp, p) {
            (_, crate::PeerSpec::Addr(a)) => {
                self.add_peer(*a);
                Ok(())
            }
            (Imp::Embedded(e), name) => {
                e.shared.resolver.add_name(name.clone());
                Ok(e.shared.start_resolver()?)
            }
            (Imp::Attached(at), name) => {
                at.add_peer(&name.to_string());
                Ok(())
            }
        }
    }

    /// Creates a process owned by the caller (a V process is a thread that
    /// uses this handle).
    pub fn create_process(&self) -> Result<Process, IpcError> {
        match &self.imp {
            Imp::Embedded(e) => {
                let pid = e.shared.with_engine(|e, _| e.create_process())?;
                Ok(LocalProcess::new(e.shared.clone(), pid)?
                    .allow_direct()
                    .into())
            }
            Imp::Attached(a) => Ok(a.create_process()?.into()),
        }
    }

    /// Creates a process whose operations are futures (see [`crate::aio`]):
    /// a few runtime threads can serve any number of them.
    pub fn create_async_process(&self) -> Result<crate::AsyncProcess, IpcError> {
        match &self.imp {
            Imp::Embedded(e) => {
                let pid = e.shared.with_engine(|e, _| e.create_process())?;
                let sink = Arc::new(crate::aio::FutureSink::default());
                let p = LocalProcess::with_sink(e.shared.clone(), pid, sink.clone());
                Ok(crate::AsyncProcess::local(p, sink))
            }
            Imp::Attached(a) => crate::AsyncProcess::attached(a.create_process()?.into()),
        }
    }

    /// Creates a process and runs `f` with it on a new thread.
    pub fn spawn<F>(&self, name: &str, f: F) -> Result<(Pid, JoinHandle<()>), IpcError>
    where
        F: FnOnce(Process) + Send + 'static,
    {
        let p = self.create_process()?;
        let pid = p.pid();
        let h = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || f(p))
            .map_err(|_| IpcError::TableFull)?;
        Ok((pid, h))
    }

    /// True if `pid` is a live process of this host.
    pub fn process_exists(&self, pid: Pid) -> bool {
        match &self.imp {
            Imp::Embedded(e) => e.shared.with_engine(|e, _| e.process_exists(pid)),
            Imp::Attached(a) => a.process_exists(pid),
        }
    }

    /// A copy of the protocol counters.
    /// (Attached: the machine host's, read from its JSON document.)
    pub fn stats(&self) -> Stats {
        match &self.imp {
            Imp::Embedded(e) => e.shared.snapshot().0,
            Imp::Attached(a) => crate::metrics::stats_from_json(
                &a.document(crate::attach::control::ask::STATS_JSON),
            ),
        }
    }

    /// Every counter and gauge as JSON (the same document `vkernel stats`
    /// reads from a host's kernel server).
    pub fn stats_json(&self) -> String {
        match &self.imp {
            Imp::Embedded(e) => {
                let (s, g) = e.shared.snapshot();
                crate::metrics::to_json(&s, &g)
            }
            Imp::Attached(a) => a.document(crate::attach::control::ask::STATS_JSON),
        }
    }

    /// Every counter and gauge in the Prometheus text format.
    pub fn prometheus(&self) -> String {
        match &self.imp {
            Imp::Embedded(e) => {
                let (s, g) = e.shared.snapshot();
                crate::metrics::to_prometheus(&s, &g)
            }
            Imp::Attached(a) => a.document(crate::attach::control::ask::PROMETHEUS),
        }
    }

    /// Serves `/metrics` (Prometheus) and `/stats.json` over HTTP on
    /// `addr` until the host shuts down; returns the bound address.
    pub fn serve_metrics(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        match &self.imp {
            Imp::Embedded(e) => crate::metrics::serve(e.shared.clone(), addr),
            Imp::Attached(_) => Err(std::io::Error::other(
                "an attached program's metrics are the machine host's: serve them there (`vkernel host --metrics`)",
            )),
        }
    }

    /// Datagram-layer counters (injected faults, send errors).
    /// (An attached program sends no datagrams itself: all zero.)
    pub fn net_counters(&self) -> &crate::net::NetCounters {
        match &self.imp {
            Imp::Embedded(e) => &e.shared.net.counters,
            Imp::Attached(a) => &a.net_counters,
        }
    }

    /// Bulk bursts sent: (segmented sends, datagrams in them, sendmmsg
    /// calls).
    pub fn batch_counts(&self) -> (u64, u64, u64) {
        match &self.imp {
            Imp::Embedded(e) => e.shared.net.batch_counts(),
            Imp::Attached(_) => (0, 0, 0),
        }
    }

    /// Measured smoothed RTT to a host, if any.
    pub fn srtt(&self, host: HostId) -> Option<Duration> {
        match &self.imp {
            Imp::Embedded(e) => e
                .shared
                .with_engine(|e, _| e.srtt(host))
                .map(Duration::from_micros),
            Imp::Attached(a) => a.srtt(host),
        }
    }

    /// Stops the host; blocked operations fail with `Shutdown`.
    pub fn shutdown(&mut self) {
        let e = match &mut self.imp {
            Imp::Embedded(e) => e,
            Imp::Attached(a) => return a.close(),
        };
        if e.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        e.shared.with_engine(|e, _| e.shutdown());
        let direct: Vec<_> = e.shared.lock().waiters.values().cloned().collect();
        for w in &direct {
            e.shared.wake_direct(w);
        }
        e.shared.resolver.stop();
        e.shared.bg_efd.signal();
        if let Some(h) = e.bg.take() {
            let _ = h.join();
        }
        if let Some(h) = e.ks.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(crate) fn destroy_local(shared: &Shared, pid: Pid) -> Result<(), IpcError> {
    shared.with_engine(|e, now| e.destroy_process(now, pid))?;
    if let Some(w) = shared.unregister(pid) {
        w.destroy();
        shared.wake_direct(&w);
    }
    Ok(())
}
