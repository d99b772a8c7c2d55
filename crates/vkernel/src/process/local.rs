//! A process of a logical host whose engine runs in this program: the
//! primitives on the engine directly.
//!
//! Every call is the same whether the peer is on this logical host or
//! another; the engine decides. A blocking call lends the caller's buffers
//! to the engine and waits for its completion: first busy-polling (also
//! reading the socket), then blocking on the process's own eventfd and,
//! when it is a socket reader, the socket (see `waiter.rs`).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkernel_proto::engine::{Completion, OwnDue, KERNEL_SERVER_LOCAL_ID};
use vkernel_proto::message::{IDEMPOTENT, SEGMENT, SEG_READ, SEG_WRITE};
use vkernel_proto::{IpcError, Message, Micros, Pid, Scope, SegAccess};

use crate::deadline::Deadline;
use crate::kernel::{destroy_local, Reading, Shared, SPIN_BEGINS};
use crate::kernel_server as ks;
use crate::lent::{Lease, Loan};
use crate::spin::{Spin, SpinPolicy};
use crate::sys::poll2;
use crate::trace::Phase;
use crate::waiter::Waiter;

use super::{HostLoad, Incoming, Reply, Segment, WaitCounts};

mod direct_send;
mod host_ops;
mod moves;
#[cfg(feature = "otel")]
mod otel;
mod peer;
mod wait;

pub(crate) use peer::LocalPeer;

use direct_send::ANSWER_BUF;

/// No timer of its own to run (the engine's threads time the exchange).
const NEVER: OwnDue = OwnDue {
    at: Micros::MAX,
    exact: false,
};

/// Counts a thread as spinning while it lives: adds `add` on entry and
/// takes 1 away on exit (see `Shared::spinners` for why those differ).
struct Counted<'a>(&'a AtomicU64);

impl<'a> Counted<'a> {
    fn enter(role: &'a AtomicU64, add: u64) -> Counted<'a> {
        role.fetch_add(add, Ordering::AcqRel);
        Counted(role)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a wait should poll the socket while spinning.
#[derive(Clone, Copy)]
enum Expect {
    Remote,
    Either,
    /// A Receive: like the last message received (a server of remote
    /// clients polls the socket every turn, one of local clients rarely,
    /// so it sees a local sender's hand-over without a syscall's delay).
    Receive,
    Local,
}

/// A process of this logical host, driven by the engine in this program
/// (see [`super::Process`] for the public handle).
pub(crate) struct LocalProcess {
    shared: Arc<Shared>,
    pid: Pid,
    waiter: Arc<Waiter>,
    spin: std::cell::Cell<SpinPolicy>,
    waits: std::cell::Cell<WaitCounts>,
    send_deadline: std::cell::Cell<Option<Duration>>,
    socket_reader: std::cell::Cell<bool>,
    /// The last message received came from another host.
    last_from_remote: std::cell::Cell<bool>,
    /// Remote Sends without a segment may run outside the engine (a
    /// program's own process; not a machine host's proxy, whose program
    /// holds sequence numbers of its own).
    direct_ok: std::cell::Cell<bool>,
    /// Its sequence numbers and destination for those (made by the first).
    /// (Taken out while a direct Send runs.)
    lease: std::cell::Cell<Option<Box<super::direct::Lease>>>,
    /// The replies it holds while more requests wait for it, if it
    /// batches them ([`super::Process::set_reply_batching`]); boxed, so
    /// that a process is no larger for it.
    held: std::cell::Cell<Option<Box<Held>>>,
    /// Its peer page and what it knows of others' (`local/peer.rs`).
    peer: Option<Box<peer::PeerSide>>,
    /// Exchange spans in progress (OpenTelemetry); boxed, so that a
    /// process is no larger for it.
    #[cfg(feature = "otel")]
    otel: std::cell::RefCell<Box<crate::otel::InProgress>>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl std::fmt::Debug for LocalProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalProcess")
            .field("pid", &self.pid)
            .finish()
    }
}

/// Replies held to leave together ([`LocalProcess::reply`]).
#[derive(Default)]
struct Held {
    replies: Vec<vkernel_proto::engine::Transmit>,
    /// When the first of them was made (the engine's clock).
    since: Micros,
}

/// The most replies a process holds: one `sendmmsg` call's worth.
const HELD_MAX: usize = 16;

/// The longest a held reply waits for the replies after it (µs), checked
/// whenever the process receives or replies.
const HELD_US: Micros = 50;

/// The largest STATS document [`super::Process::host_stats`] takes.
const MAX_STATS: usize = 64 << 20;

impl LocalProcess {
    pub(crate) fn new(shared: Arc<Shared>, pid: Pid) -> Result<LocalProcess, IpcError> {
        Ok(Self::with_waiter(shared, pid, Waiter::new()))
    }

    /// A process whose operations complete into `sink` (started with the
    /// `*_direct` calls): it holds no descriptor unless it blocks.
    pub(crate) fn with_sink(
        shared: Arc<Shared>,
        pid: Pid,
        sink: Arc<dyn crate::waiter::Sink>,
    ) -> LocalProcess {
        let waiter = Waiter::new();
        waiter.set_sink(sink);
        Self::with_waiter(shared, pid, waiter)
    }

    fn with_waiter(shared: Arc<Shared>, pid: Pid, waiter: Waiter) -> LocalProcess {
        let waiter = Arc::new(waiter);
        shared.register(pid, waiter.clone());
        let spin = std::cell::Cell::new(shared.spin);
        let send_deadline = std::cell::Cell::new(shared.send_deadline);
        LocalProcess {
            shared,
            pid,
            waiter,
            spin,
            waits: std::cell::Cell::new(WaitCounts::default()),
            send_deadline,
            socket_reader: std::cell::Cell::new(true),
            last_from_remote: std::cell::Cell::new(true),
            direct_ok: std::cell::Cell::new(false),
            lease: std::cell::Cell::new(None),
            held: std::cell::Cell::new(None),
            peer: None,
            #[cfg(feature = "otel")]
            otel: std::cell::RefCell::default(),
            _not_sync: PhantomData,
        }
    }

    /// Lets this process's remote Sends without a segment run on its
    /// thread, outside the engine, where the host allows it
    /// (`KernelConfig::direct_sends`).
    pub(crate) fn allow_direct(self) -> LocalProcess {
        self.direct_ok.set(self.shared.direct);
        self
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Makes this process busy-poll exactly `d` before it blocks when it
    /// waits, whatever happens (zero: always block). By default it follows
    /// the host's `KernelConfig::spin` and `adaptive_spin`.
    pub(crate) fn set_spin(&self, d: Duration) {
        self.spin.set(SpinPolicy::fixed(d));
    }

    /// Makes this process busy-poll at most `cap` before it blocks, and
    /// only as long as spinning pays (see `KernelConfig::adaptive_spin`).
    pub(crate) fn set_spin_auto(&self, cap: Duration) {
        self.spin.set(SpinPolicy::adaptive(cap));
    }

    /// How this process's waits have ended so far.
    pub(crate) fn wait_counts(&self) -> WaitCounts {
        self.waits.get()
    }

    /// Sets the principal this process runs as (the thesis's
    /// `userNumber`): it travels with every Send and services may decide
    /// by it.
    pub(crate) fn set_principal(&self, principal: u32) {
        self.peer_principal(principal);
        let _ = self
            .shared
            .with_engine(|e, _| e.set_principal(self.pid, principal));
    }

    /// Only senders running as one of `principals` may Send to this
    /// process (`None`: anyone); others get [`IpcError::AccessDenied`].
    pub(crate) fn restrict_senders(&self, principals: Option<Vec<u32>>) {
        if let Some(ps) = &self.peer {
            ps.restricted.set(principals.is_some());
        }
        let _ = self
            .shared
            .with_engine(|e, _| e.restrict_senders(self.pid, principals));
    }

    /// Whether this process, when blocked, also reads the host's socket
    /// (default true: a waiting process usually reads its own reply). A
    /// process that rarely talks to other hosts can turn it off to avoid
    /// being woken by every datagram.
    pub(crate) fn set_socket_reader(&self, on: bool) {
        self.socket_reader.set(on);
    }

    /// This process's pid.
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Send: delivers `msg` to `to` and blocks until it is received and
    /// replied to; the reply overwrites `msg`.
    pub(crate) fn send(&self, msg: &mut Message, to: Pid) -> Result<Reply, IpcError> {
        self.send_within(msg, to, self.send_deadline.get())
    }

    /// Sets the deadline of this process's Sends (the host's
    /// `KernelConfig::send_deadline` by default): a Send not replied to
    /// within it fails with [`IpcError::Deadline`] and its exchange is
    /// abandoned. `None` waits as long as the server's host answers.
    pub(crate) fn set_send_deadline(&self, d: Option<Duration>) {
        self.send_deadline.set(d);
    }

    /// The deadline of this process's Sends.
    pub(crate) fn send_deadline(&self) -> Option<Duration> {
        self.send_deadline.get()
    }

    /// [`super::Process::send`] with this call's own deadline (`None`: none).
    pub(crate) fn send_within(
        &self,
        msg: &mut Message,
        to: Pid,
        deadline: Option<Duration>,
    ) -> Result<Reply, IpcError> {
        self.send_within_as(msg, to, deadline, self.pid)
    }

    /// [`LocalProcess::send_within`] of a message `forwarder` forwarded
    /// (a machine host's shared-memory exchange; see `attach::peer`).
    pub(crate) fn send_within_as(
        &self,
        msg: &mut Message,
        to: Pid,
        deadline: Option<Duration>,
        forwarder: Pid,
    ) -> Result<Reply, IpcError> {
        msg.set_flag(SEGMENT | SEG_READ | SEG_WRITE, false);
        let (to, forwarder, deadline) = match self.send_by_pages(msg, to, forwarder, deadline) {
            Ok(r) => return r,
            Err(rest) => rest,
        };
        if forwarder == self.pid {
            if let Some(r) = self.try_direct(msg, to, deadline) {
                return r;
            }
        }
        self.trace(Phase::Send, self.pid, to, true);
        self.send_through_engine(msg, to, deadline, forwarder)
    }

    /// [`LocalProcess::send_within_as`] through the engine, its Send phase
    /// traced already.
    fn send_through_engine(
        &self,
        msg: &mut Message,
        to: Pid,
        deadline: Option<Duration>,
        forwarder: Pid,
    ) -> Result<Reply, IpcError> {
        self.engine_sends_for_me(to);
        let m = *msg;
        let sh = &self.shared;
        // To another host: the reply comes to this thread's answer socket.
        let answer = match sh.answers {
            Some(ip) if to.is_process() && to.host() != sh.host => {
                crate::waiter::answer_socket(sh.net.serial(), ip).map(|(s, _)| s)
            }
            _ => None,
        };
        let due = sh
            .with_engine_via(None, answer.as_ref(), |e, now| {
                e.set_answer_source(answer.is_some());
                let r = e.send_as(now, self.pid, to, m, None, usize::MAX, forwarder);
                e.set_answer_source(false);
                r?;
                #[cfg(feature = "otel")]
                self.otel_sent(e);
                if let Some(d) = deadline {
                    e.set_send_deadline(self.pid, now.saturating_add(micros(d)));
                }
                Ok(e.own_deadline(self.pid))
            })
            .0?;
        let answer = answer.filter(|_| due.is_some());
        self.finish_send_via(msg, to, answer.as_ref(), due.unwrap_or(NEVER))
    }

    /// The engine is about to send to `to` for this process: a RemoteSend
    /// (to another host or a group) would carry a number newer than any
    /// reserved for direct Sends, so those must not be used after it.
    fn engine_sends_for_me(&self, to: Pid) {
        if to.is_process() && to.host() == self.shared.host {
            return;
        }
        if let Some(mut l) = self.lease.take() {
            l.end();
            self.lease.set(Some(l));
        }
    }

    /// Send with a segment the receiver may access while this process awaits
    /// its reply. The segment's rights are set in `msg` from `seg`.
    pub(crate) fn send_with_segment(
        &self,
        msg: &mut Message,
        to: Pid,
        seg: Segment<'_>,
    ) -> Result<Reply, IpcError> {
        self.send_with_segment_append(msg, to, seg, usize::MAX)
    }

    /// [`super::Process::send_with_segment`] with at most `append` bytes of a
    /// readable segment travelling with the message (the receiver gets
    /// them by receive-with-segment and may MoveFrom the rest). A segment
    /// laid out as data-out followed by room for data-in keeps the room
    /// off the wire by appending only the data-out part.
    pub(crate) fn send_with_segment_append(
        &self,
        msg: &mut Message,
        to: Pid,
        seg: Segment<'_>,
        append: usize,
    ) -> Result<Reply, IpcError> {
        self.send_with_segment_within(msg, to, seg, append, self.send_deadline.get())
    }

    /// [`super::Process::send_with_segment_append`] with this call's own deadline
    /// (`None`: none); see [`super::Process::set_send_deadline`].
    pub(crate) fn send_with_segment_within(
        &self,
        msg: &mut Message,
        to: Pid,
        seg: Segment<'_>,
        append: usize,
        deadline: Option<Duration>,
    ) -> Result<Reply, IpcError> {
        let (loan, access) = match seg {
            Segment::Read(b) => (Loan::Own(b), SegAccess::READ),
            Segment::Write(b) => (Loan::OwnMut(b), SegAccess::WRITE),
            Segment::ReadWrite(b) => (Loan::OwnMut(b), SegAccess::READ_WRITE),
        };
        self.send_loan_within(msg, to, loan, access, append, deadline)
    }

    /// [`Self::send_with_segment_within`] of any lent memory (a window).
    pub(crate) fn send_loan_within(
        &self,
        msg: &mut Message,
        to: Pid,
        loan: Loan<'_>,
        access: SegAccess,
        append: usize,
        deadline: Option<Duration>,
    ) -> Result<Reply, IpcError> {
        let (lease, lent) = loan.lend();
        msg.set_segment(access, vkernel_proto::SegMem::len(&*lent) as u32);
        self.engine_sends_for_me(to);
        let m = *msg;
        self.trace(Phase::Send, self.pid, to, true);
        let r = self.shared.with_engine(|e, now| {
            e.send_append(now, self.pid, to, m, Some(lent), append)?;
            #[cfg(feature = "otel")]
            self.otel_sent(e);
            if let Some(d) = deadline {
                e.set_send_deadline(self.pid, now.saturating_add(micros(d)));
            }
            Ok(())
        });
        let r = r.and_then(|()| self.finish_send(msg, to));
        lease.release();
        r
    }

    fn finish_send(&self, msg: &mut Message, to: Pid) -> Result<Reply, IpcError> {
        self.finish_send_via(msg, to, None, NEVER)
    }

    /// [`LocalProcess::finish_send`] of a Send whose answers come to the
    /// thread's answer socket `answer`, timed by this thread from `due`.
    fn finish_send_via(
        &self,
        msg: &mut Message,
        to: Pid,
        answer: Option<&Arc<std::net::UdpSocket>>,
        due: OwnDue,
    ) -> Result<Reply, IpcError> {
        let r = match self.wait_via(self.expect_for(to), answer, due) {
            Ok(Completion::Send(Ok(r))) => {
                *msg = r.msg;
                Ok(Reply {
                    from: r.from,
                    seg_bytes: r.seg_bytes,
                })
            }
            Ok(Completion::Send(Err(e))) | Err(e) => Err(e),
            Ok(_) => Err(self.stray_completion()),
        };
        let by = r.as_ref().map_or(to, |r| r.from);
        // The span first, with the error's text; `trace` then has none
        // left to end.
        #[cfg(feature = "otel")]
        self.otel_complete(r.as_ref().map(|r| r.from).map_err(|e| e.to_string()));
        self.trace(Phase::Complete, self.pid, by, r.is_ok());
        r
    }

    /// A wait ended with another operation's completion: cancel the
    /// engine's state for this one, so it drops any lent buffer before the
    /// caller's lease ends, and report the process as busy.
    fn stray_completion(&self) -> IpcError {
        self.shared.with_engine(|e, _| e.cancel(self.pid));
        IpcError::Busy(self.pid)
    }

    pub(crate) fn trace(&self, p: Phase, src: Pid, dst: Pid, ok: bool) {
        if let Some(t) = &self.shared.tracer {
            t.phase(p, src, dst, ok);
        }
        #[cfg(feature = "otel")]
        self.otel_phase(p, src, dst, ok);
    }

    /// Completions of operations started with `*_direct` go to `sink`.
    pub(crate) fn set_sink(&self, sink: Arc<dyn crate::waiter::Sink>) {
        self.waiter.set_sink(sink);
    }

    /// Starts a Send whose completion goes to this process's sink, and
    /// returns without waiting for it.
    pub(crate) fn send_direct(
        &self,
        msg: &Message,
        to: Pid,
        deadline: Option<Duration>,
        forwarder: Pid,
    ) -> Result<(), IpcError> {
        let mut m = *msg;
        m.set_flag(SEGMENT | SEG_READ | SEG_WRITE, false);
        self.trace(Phase::Send, self.pid, to, true);
        self.direct(|e, now, me| {
            e.send_as(now, me, to, m, None, usize::MAX, forwarder)?;
            #[cfg(feature = "otel")]
            self.otel_sent(e);
            if let Some(d) = deadline {
                e.set_send_deadline(me, now.saturating_add(micros(d)));
            }
            Ok(None::<()>)
        })
        .map(|_| ())
    }

    /// Abandons the operation started with a `*_direct` call: the engine
    /// forgets it (a queued message is withdrawn, a remote request is no
    /// longer retransmitted and its late reply is dropped) and its
    /// completion no longer goes to the sink. A completion the sink took
    /// before stays there.
    pub(crate) fn cancel_direct(&self) {
        let w = &self.waiter;
        self.shared.with_engine(|e, _| {
            w.arm(false);
            e.cancel(self.pid);
        });
    }

    /// Starts an operation whose completion goes to the sink: `f` runs
    /// on the engine with this pid; `Ok(None)` means it is in progress,
    /// `Ok(Some(r))` that it finished at once. Buffers lent to `f` must
    /// stay alive and unmoved until the completion arrives or
    /// [`Self::cancel_direct`].
    pub(crate) fn direct<R>(
        &self,
        f: impl FnOnce(&mut vkernel_proto::engine::Engine, u64, Pid) -> Result<Option<R>, IpcError>,
    ) -> Result<Option<R>, IpcError> {
        let w = &self.waiter;
        self.shared.with_engine(|e, now| {
            let was = w.arm(true);
            let r = f(e, now, self.pid);
            match r {
                Ok(None) => {}
                Ok(Some(_)) => {
                    w.arm(false);
                }
                Err(_) => {
                    w.arm(was);
                }
            }
            r
        })
    }

    /// Counts this process as a spinner (it reads the socket) or not,
    /// for a wait that is not a blocking one (an async process's). One
    /// that stops because it is going to sleep wakes the background
    /// thread to read the socket now (`nudge`); one that got its answer
    /// does not (a wake-up per exchange would cost more than the
    /// exchange), and the background thread looks again within 1 ms.
    pub(crate) fn count_spinning(&self, on: bool, nudge: bool) {
        let sh = &self.shared;
        if on {
            sh.spinners.fetch_add(SPIN_BEGINS, Ordering::AcqRel);
        } else {
            sh.spinners.fetch_sub(1, Ordering::AcqRel);
            sh.async_left.store(true, Ordering::Release);
            if nudge {
                sh.async_asleep.store(true, Ordering::Release);
                sh.nudge_background();
            }
        }
    }

    /// Counts this async process among those re-polling for a local
    /// answer, if fewer than one per CPU already are.
    pub(crate) fn enter_local_spin(&self) -> bool {
        let sh = &self.shared;
        if sh.async_spinners.fetch_add(1, Ordering::AcqRel) < sh.cpus {
            return true;
        }
        sh.async_spinners.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// Undoes [`Self::enter_local_spin`].
    pub(crate) fn leave_local_spin(&self) {
        self.shared.async_spinners.fetch_sub(1, Ordering::AcqRel);
    }

    /// Processes spinning on this host (each reads the socket).
    pub(crate) fn spinners(&self) -> u64 {
        self.shared.spinning()
    }

    /// The host's clock, µs.
    pub(crate) fn now(&self) -> u64 {
        self.shared.now()
    }

    /// One busy-poll turn of a wait that is not a blocking one: reads at
    /// most one datagram and runs due timers; this process's completion,
    /// if that datagram brought it, comes back here instead of to the
    /// sink.
    pub(crate) fn poll_turn(&self) -> Option<Completion> {
        let sh = &self.shared;
        let (_, c) = sh.poll_socket_as(Some(self.pid), 1);
        sh.run_timers_if_due();
        if c.is_some() {
            self.waiter.arm(false);
        }
        c
    }

    /// Asks the engine to report messages left queued for this process to
    /// its sink (`Sink::queue_state`), and reports the queue now.
    pub(crate) fn watch_queue(&self) {
        let w = &self.waiter;
        self.shared.with_engine(|e, _| {
            e.watch_queue(self.pid, true);
            w.queue_state(e.has_queued(self.pid));
        });
    }

    /// Reports to the sink whether messages wait in the queue (after a
    /// Receive took one, say).
    pub(crate) fn refresh_queue_state(&self) {
        let w = &self.waiter;
        self.shared
            .with_engine(|e, _| w.queue_state(e.has_queued(self.pid)));
    }

    /// Starts a Receive whose completion goes to this process's sink;
    /// returns the message at once if one was queued.
    pub(crate) fn receive_direct(
        &self,
    ) -> Result<Option<vkernel_proto::engine::Received>, IpcError> {
        let r = self.direct(|e, now, me| e.receive_upto(now, me, None, None, usize::MAX))?;
        if let Some(rcv) = &r {
            self.trace(Phase::Deliver, rcv.from, self.pid, true);
        }
        Ok(r)
    }

    /// Receive: blocks until a message arrives (first come, first served).
    pub(crate) fn receive(&self, msg: &mut Message) -> Result<Incoming, IpcError> {
        self.receive_inner(msg, None, None, usize::MAX)
    }

    /// [`super::Process::receive_with_segment`] that copies only from a segment
    /// at most `upto` bytes long (`Incoming::seg_bytes` is 0 otherwise): a
    /// dispatcher that hands large requests to workers, which receive them
    /// again, need not copy their first part.
    pub(crate) fn receive_with_segment_upto(
        &self,
        msg: &mut Message,
        buf: &mut [u8],
        upto: usize,
    ) -> Result<Incoming, IpcError> {
        self.receive_inner(msg, None, Some(Loan::OwnMut(buf)), upto)
    }

    /// [`Self::receive_with_segment_upto`] into any lent memory (a window).
    pub(crate) fn receive_loan_upto(
        &self,
        msg: &mut Message,
        buf: Loan<'_>,
        upto: usize,
    ) -> Result<Incoming, IpcError> {
        self.receive_inner(msg, None, Some(buf), upto)
    }

    /// ReceiveSpecific: waits for a message from `from` only. Returns
    /// `Ok(None)` if `from` does not exist (the V convention of returning 0).
    pub(crate) fn receive_specific(
        &self,
        msg: &mut Message,
        from: Pid,
    ) -> Result<Option<Incoming>, IpcError> {
        if from.host() != self.shared.host && from.is_process() && !self.process_exists(from)? {
            return Ok(None);
        }
        match self.receive_inner(msg, Some(from), None, usize::MAX) {
            Ok(i) => Ok(Some(i)),
            Err(IpcError::NoSuchProcess(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn receive_inner(
        &self,
        msg: &mut Message,
        from: Option<Pid>,
        buf: Option<Loan<'_>>,
        upto: usize,
    ) -> Result<Incoming, IpcError> {
        if from.is_none() {
            if let Some(r) = self.peer_receive(msg) {
                return r;
            }
        }
        // A queued message is copied into the caller's own slice at once;
        // only a Receive that must wait lends it to the engine. A window
        // is lent either way (the engine only copies into it).
        let (mut own, mut lease, mut lent) = (None, None, None);
        match buf {
            Some(Loan::OwnMut(b)) => own = Some(b),
            Some(loan) => {
                let (l, s) = loan.lend();
                (lease, lent) = (Some(l), Some(s));
            }
            None => {}
        }
        let sh = &*self.shared;
        let r = sh.with_engine(|e, now| {
            let queued = match lent.as_deref_mut() {
                Some(w) => e.receive_queued_into(self.pid, from, Some(w), upto),
                None => e.receive_queued(self.pid, from, own.as_deref_mut(), upto),
            };
            let r = match queued {
                Ok(None) => {
                    let lent = lent.take().or_else(|| {
                        own.take().map(|b| {
                            let (l, s) = Lease::exclusive(b);
                            lease = Some(l);
                            s
                        })
                    });
                    let lent = lent.map(|s| s as vkernel_proto::Seg);
                    e.receive_upto(now, self.pid, from, lent, upto)
                }
                r => r,
            };
            if let Ok(Some(_)) = &r {
                sh.note_busy(e.queue_len(self.pid));
                self.waiter.queue_state(e.has_queued(self.pid));
            }
            r
        });
        // Held replies leave before this process waits, and when old.
        if matches!(r, Ok(Some(_))) {
            self.flush_old_replies();
        } else {
            self.flush_replies();
        }
        let r = match r {
            Ok(Some(rcv)) => Ok(rcv),
            Ok(None) => match self.wait(Expect::Receive) {
                Ok(Completion::Receive(r)) => r,
                Ok(_) => Err(self.stray_completion()),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        // (A window copied into at once was never handed over.)
        drop(lent);
        if let Some(l) = lease {
            l.release();
        }
        let rcv = r?;
        self.last_from_remote
            .set(rcv.from.host() != self.shared.host);
        *msg = rcv.msg;
        self.trace(Phase::Deliver, rcv.from, self.pid, true);
        Ok(Incoming {
            from: rcv.from,
            seg_bytes: rcv.seg_bytes,
            forwarder: rcv.forwarder,
            principal: rcv.principal,
        })
    }

    /// Reply: `to` must be awaiting reply from this process. Does not block.
    ///
    /// A process that batches its replies holds a reply to another host
    /// while more requests are queued for it, and sends what it holds in
    /// one call once none is, or [`HELD_MAX`] are held, or the first has
    /// waited [`HELD_US`]; before any other operation; and before it waits.
    pub(crate) fn reply(&self, msg: &Message, to: Pid) -> Result<(), IpcError> {
        let m = *msg;
        self.trace(Phase::Reply, to, self.pid, true);
        if let Some(r) = self.peer_reply(&m, to) {
            return r;
        }
        let Some(mut h) = self.held.take() else {
            return self
                .shared
                .with_engine(|e, now| e.reply(now, self.pid, to, m, None));
        };
        let had = h.replies.len();
        let mut more = false;
        let (r, now) = self.shared.with_engine_holding(&mut h.replies, |e, now| {
            let r = e.reply(now, self.pid, to, m, None);
            more = e.queue_len(self.pid) > 0;
            (r, now)
        });
        if had == 0 {
            h.since = now;
        }
        if !more || h.replies.len() >= HELD_MAX || now.saturating_sub(h.since) >= HELD_US {
            self.shared.send_held(&mut h.replies);
        }
        self.held.set(Some(h));
        r
    }

    /// Starts or stops holding replies (see [`LocalProcess::reply`]);
    /// stopping sends what is held.
    pub(crate) fn set_reply_batching(&self, on: bool) {
        match (on, self.held.take()) {
            (true, None) => self.held.set(Some(Box::default())),
            (false, Some(mut h)) => self.shared.send_held(&mut h.replies),
            (_, h) => self.held.set(h),
        }
    }

    /// Sends the replies this process holds, if any: before an operation
    /// other than Receive and Reply, and before it waits.
    pub(crate) fn flush_replies(&self) {
        if let Some(mut h) = self.held.take() {
            self.shared.send_held(&mut h.replies);
            self.held.set(Some(h));
        }
    }

    /// [`LocalProcess::flush_replies`] if the first held reply has waited
    /// [`HELD_US`] (a Receive that found a request queued).
    fn flush_old_replies(&self) {
        if let Some(mut h) = self.held.take() {
            if !h.replies.is_empty() && self.shared.now().saturating_sub(h.since) >= HELD_US {
                self.shared.send_held(&mut h.replies);
            }
            self.held.set(Some(h));
        }
    }

    /// Forward: passes `from`'s request (as `msg`) to `to` as if `from` had
    /// sent it; `from` must be awaiting reply from this process.
    pub(crate) fn forward(&self, msg: &Message, from: Pid, to: Pid) -> Result<(), IpcError> {
        if let Some(r) = self.peer_forward(msg, from, to) {
            return r;
        }
        let m = *msg;
        self.shared
            .with_engine(|e, now| e.forward(now, self.pid, from, to, m))
    }
}

impl Drop for LocalProcess {
    fn drop(&mut self) {
        self.flush_replies();
        let pid = self.pid;
        if let Some(l) = self.lease.get_mut().as_mut() {
            l.flush(
                &self.shared.direct_tally,
                &self.shared.net.counters.direct_sends,
                true,
            );
        }
        if !self.waiter.destroyed.load(Ordering::Acquire) {
            let _ = self
                .shared
                .with_engine(|e, now| e.destroy_process(now, pid));
        }
        self.shared.unregister(pid);
        // Its page dies too: Sends waiting on it fail, its counts stay.
        if let Some(p) = self.waiter.peer() {
            p.page.die(&IpcError::Destroyed);
            self.shared.peer_died(&self.waiter, pid);
        }
    }
}

/// `d` in engine time (µs), saturating.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
