//! A logical host's shared state ([`Shared`]): the engine behind its
//! mutex, the socket, the counters threads use to tell who reads it, and
//! the one way into the engine ([`Shared::with_engine`] and its variants),
//! which runs due timers, sends what the engine produced and wakes whom it
//! completed once the lock is released.
//!
//! Reading the sockets is in `reading.rs`, the background thread in
//! `background.rs`; both are more `impl Shared`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vkernel_proto::{Completion, Engine, Event, HostId, Micros, Pid};

use crate::net::Net;
use crate::sys::EventFd;
use crate::vocab::CacheLine;
use crate::waiter::Waiter;

pub(crate) struct State {
    pub(crate) engine: Engine,
    pub(crate) waiters: crate::waiter::Waiters,
    pub(super) conflict: Option<HostId>,
}

/// State shared by a logical host's threads.
pub(crate) struct Shared {
    pub(super) state: Mutex<State>,
    pub(crate) net: Net,
    pub(super) clock: crate::clock::Clock,
    pub(super) next_timer: CacheLine<AtomicU64>,
    /// Processes busy-polling (low 32 bits) and how many spins have begun
    /// (high 32 bits, wrapping): one word, so a spin counts itself in with
    /// one atomic add, and the background thread can tell that spinning
    /// went on while it slept even if none is spinning when it looks. On a
    /// cache line of its own.
    pub(crate) spinners: CacheLine<AtomicU64>,
    /// Processes blocked reading the socket (epoll or poll), and
    /// [`LONE`](super::reading::LONE) while one waits in it alone ([`Shared::enter_reader`]).
    pub(crate) blocked_readers: CacheLine<AtomicU64>,
    /// Processes that would have read the socket but found a lone reader
    /// in it: blocked on their eventfd alone. When the lone reader leaves
    /// while one is, it nudges the background thread to read.
    pub(super) gated: AtomicU64,
    /// The lone reader's datagrams (only one thread at a time uses it:
    /// never the batch slots of `rx_batch`, which another thread's timer
    /// run may want while the lone reader waits).
    pub(super) lone_batch: Mutex<Option<Box<crate::net::RecvBatch>>>,
    /// Until when (host clock, µs) the background thread does not wake for
    /// each arrival on the main socket although no process reads it, but
    /// reads it every [`BUSY_POLL_US`](super::background::BUSY_POLL_US): a process just took a request with
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
    pub(crate) bg_efd: EventFd,
    pub(super) stop: AtomicBool,
    /// The last datagram read was a bulk chunk: more are likely, so the
    /// next is peeked at to receive its data in place.
    pub(super) bulk_rx: AtomicBool,
    /// Bulk chunks may leave gathered from the lent buffers
    /// ([`Net::gathers`]).
    pub(super) gathers: bool,
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
    /// When each peer's traffic last moved, and which have series of
    /// their own (read with the counters: [`Shared::snapshot`]).
    pub(crate) peer_book: Mutex<crate::metrics::PeerBook>,
    /// What those exchanges learned of peer hosts, shared among them.
    pub(crate) direct_peers: crate::process::direct::Peers,
    /// Slots for taking a stream of small bulk chunks 32 at a time
    /// (allocated on first use: 2 MiB).
    pub(super) rx_batch: Mutex<Option<Box<crate::net::RecvBatch>>>,
    /// Every new process's waiting strategy.
    pub(crate) spin: crate::spin::SpinPolicy,
    /// Online CPUs (spinners beyond them only take time from others).
    pub(crate) cpus: u64,
    /// Whether the machine has more runnable threads than CPUs.
    pub(crate) run_queue: crate::spin::RunQueue,
    /// How threads wait in peer-page exchanges (`process/local/peer.rs`).
    pub(crate) pace: crate::attach::wait::Pace,
    /// Exchanges through the pages of processes since destroyed.
    pub(crate) peer_retired: AtomicU64,
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
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
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

    pub(super) fn with_engine_out<R>(
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

    /// Takes what the engine produced under the lock: bulk chunks are sent
    /// now, datagrams go to `out` and waiters to signal to `wakes`, both
    /// for after the lock is released.
    pub(super) fn take_output(
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
                                Err(c) => {
                                    // (Its inbox, if any, must know.)
                                    if receive {
                                        w.queue_state(st.engine.has_queued(p));
                                    }
                                    w.deliver(c)
                                }
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

    /// Processes busy-polling now.
    pub(crate) fn spinning(&self) -> u64 {
        self.spinners.load(Ordering::Acquire) & SPINNING
    }

    /// The counters and gauges, copied under the lock. Peers found gone
    /// ([`crate::metrics::PeerBook`]) are dropped from every counter.
    pub(crate) fn snapshot(&self) -> crate::metrics::Snapshot {
        // Exchanges through live processes' peer pages count there.
        let waiters: Vec<_> = self.lock().waiters.values().cloned().collect();
        self.with_engine(|e, now| {
            let mut s = e.stats().clone();
            self.direct_tally.fold_into(&mut s);
            let metrics = e.config().metrics;
            for p in waiters.iter().filter_map(|w| w.peer()) {
                p.fold_into(&mut s, metrics);
            }
            self.attach_tally.fold_into(&mut s);
            // The silence after which the engine forgets a peer's senders.
            let horizon = 2 * e.config().alien_timeout;
            let mut book = match self.peer_book.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let (peers, gone) = book.read(&mut s, now, horizon);
            for h in gone {
                e.forget_peer_traffic(HostId(h));
                self.direct_tally.forget_peer(h);
                self.attach_tally.forget_peer(h);
            }
            crate::metrics::Snapshot {
                stats: s,
                gauges: crate::metrics::Gauges {
                    host: e.host_id().map_or(0, |h| h.0),
                    processes: e.process_count() as u64,
                    queued: e.queued_messages() as u64,
                    uptime_us: now,
                },
                peers,
            }
        })
    }

    pub(crate) fn register(&self, pid: Pid, w: Arc<Waiter>) {
        self.lock().waiters.insert(pid, w);
    }

    pub(crate) fn unregister(&self, pid: Pid) -> Option<Arc<Waiter>> {
        self.lock().waiters.remove(&pid)
    }

    /// Exchanges between this host's threads' processes through their
    /// peer pages so far.
    pub(crate) fn peer_exchanges(&self) -> u64 {
        let live: u64 = (self.lock().waiters.values())
            .filter_map(|w| w.peer())
            .map(|p| p.exchanges())
            .sum();
        live + self.peer_retired.load(Ordering::Relaxed)
    }

    /// Whether this host exports exchange spans (`KernelConfig::otel`).
    pub(crate) fn exports_spans(&self) -> bool {
        #[cfg(feature = "otel")]
        return self.otel.is_some();
        #[cfg(not(feature = "otel"))]
        false
    }

    /// `pid`'s peer page, if it is a process of this host with one.
    pub(crate) fn peer_of(&self, pid: Pid) -> Option<Arc<crate::process::LocalPeer>> {
        self.lock().waiters.get(&pid)?.peer().cloned()
    }

    /// `dead` was destroyed: its page's counts go to the host's, and
    /// every Send waiting on it through a page fails.
    pub(crate) fn peer_died(&self, dead: &Waiter, pid: Pid) {
        let Some(page) = dead.peer() else {
            return;
        };
        // (Once: a destroyed process is dropped later.)
        if page.page.owner.swap(0, Ordering::AcqRel) == 0 {
            return;
        }
        let metrics = self.with_engine(|e, _| e.config().metrics);
        self.direct_tally.fold_peer(page, metrics);
        self.peer_retired
            .fetch_add(page.exchanges(), Ordering::Relaxed);
        let why = if self.stopping() {
            vkernel_proto::IpcError::Shutdown
        } else {
            vkernel_proto::IpcError::NoSuchProcess(pid)
        };
        let all: Vec<_> = self.lock().waiters.values().cloned().collect();
        for p in all.iter().filter_map(|w| w.peer()) {
            p.page.fail_if_waiting_on(pid, why);
            p.page.sender_died(pid);
        }
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
}

/// A thread spinning in its inbox reads the host's socket now and then if
/// nobody else does: a datagram for its process (a remote Send) is queued
/// by the engine, which closes the inbox and so ends the spin.
impl crate::attach::wait::Tick for Shared {
    fn tick(&self) {
        if self.readers() == 0 {
            let _ = self.poll_socket_as(None, 1);
        }
    }
}
