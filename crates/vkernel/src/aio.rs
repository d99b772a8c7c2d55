//! Async IPC: Send, Receive, Reply and the moves as futures.
//!
//! An [`AsyncProcess`] is a V process whose operations are awaited instead
//! of blocking a thread, so a few runtime threads serve any number of
//! processes. The futures need no particular executor (they use only
//! [`std::task::Waker`]); vkernel is tested with tokio.
//!
//! **How it works.** On a logical host embedded in this program, an
//! operation starts on the engine at once and the future returns
//! `Pending`; whoever completes it (the thread running a local Reply, or
//! the thread that read the answer from the socket) stores the completion
//! in the process's sink and wakes the task. No thread waits per process,
//! and an idle async process holds no file descriptor. Datagrams for
//! async processes are read by the host's background thread (nobody else
//! reads the socket while every process is async).
//!
//! On a machine host (`Kernel::attach`), each async process has one
//! thread that makes the blocking calls through the process's call slot,
//! one at a time, and wakes the task: correct, but a thread per process.
//!
//! **Cancellation.** A process has one operation at a time, so the
//! methods take `&mut self`. Dropping a pending future abandons its
//! operation:
//! - *Send*: on an embedded host the engine forgets the exchange. A
//!   message not yet received is withdrawn from the receiver's queue;
//!   one already received stays with its receiver, whose Reply then fails
//!   with `NotAwaitingReply`. To a remote host nothing more is sent: the
//!   request is no longer retransmitted, and a reply that arrives later is
//!   dropped as a stale duplicate. The server may therefore run a
//!   cancelled request (as after a lost reply in V): cancel only what is
//!   safe to run or not. On a machine host the call cannot be withdrawn
//!   from the slot: it runs to its end, its result is dropped, and the
//!   process's next operation waits for it.
//! - *Receive*: a message that arrived before the drop is not lost; the
//!   next Receive returns it (its segment bytes are not, as the buffer
//!   went with the future).
//! - *MoveTo/MoveFrom*: the move stops; bytes already moved stay moved.
//!
//! Dropping an attached async process whose thread is blocked in a call
//! (a Receive nobody answers) leaves the process and its thread until
//! that call ends or the program exits.
//!
//! Buffers lent to the engine (segments, move buffers) are owned
//! `Vec<u8>`s that the future gives back: the engine may write into them
//! until the operation ends, so they cannot be borrowed slices.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use vkernel_proto::engine::{Completion, Received};
use vkernel_proto::{IpcError, Message, Pid, Scope, SegAccess};

use crate::lent::{Lease, LentBuf};
use crate::process::{LocalProcess, Process};
use crate::trace::Phase;
use crate::vocab::{Incoming, Reply, Segment, WaitCounts};
use crate::waiter::Sink;

/// A V process whose operations are futures (see the [module docs](self)).
///
/// Created by [`crate::Kernel::create_async_process`]; dropping it
/// destroys the process.
#[derive(Debug)]
pub struct AsyncProcess {
    pid: Pid,
    imp: Imp,
}

// The local variant is the common one and is not boxed: a pointer chase
// on every call to save ~200 bytes per async process (with `otel`, the
// spans in progress push it past clippy's limit).
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Imp {
    Local(LocalAsync),
    Attached(AttachedAsync),
}

impl AsyncProcess {
    pub(crate) fn local(p: LocalProcess, sink: Arc<FutureSink>) -> AsyncProcess {
        AsyncProcess {
            pid: p.pid(),
            imp: Imp::Local(LocalAsync {
                p,
                sink,
                stash: None,
                spin: crate::AUTO_SPIN_CAP.as_micros() as u64,
                spin_wanted: None,
                spin_until: None,
                counted: None,
                last_remote: false,
                waits: WaitCounts::default(),
            }),
        }
    }

    pub(crate) fn attached(p: Process) -> Result<AsyncProcess, IpcError> {
        let pid = p.pid();
        Ok(AsyncProcess {
            pid,
            imp: Imp::Attached(AttachedAsync::start(p)?),
        })
    }

    /// This process's pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// True if the process belongs to a machine host this program
    /// attached to (then each async process has a thread; see the module
    /// docs).
    pub fn is_attached(&self) -> bool {
        matches!(self.imp, Imp::Attached(_))
    }

    /// How long a task awaiting an answer keeps its runtime thread busy
    /// (re-waking itself, so other tasks still run) before it sleeps until
    /// woken, which costs a thread wake-up when the answer comes from
    /// another thread. Awaiting another host, it reads the host's socket
    /// itself meanwhile (else the host's background thread does, one more
    /// wake-up per datagram); one process of a host at a time does that,
    /// and at most one per CPU re-polls for a local answer. Zero: never.
    /// Default 1 ms. No effect on a machine host's processes.
    pub fn set_spin(&mut self, d: Duration) {
        if let Imp::Local(l) = &mut self.imp {
            l.spin = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        }
    }

    /// How this process's waits ended: answered while its task was
    /// polling (`unblocked`) or after it slept until woken (`blocked`).
    /// Attached processes report none.
    pub fn wait_counts(&self) -> WaitCounts {
        match &self.imp {
            Imp::Local(l) => l.waits,
            Imp::Attached(_) => WaitCounts::default(),
        }
    }

    /// Send: delivers `msg` to `to` and completes when it is replied to;
    /// the reply overwrites `msg`. Dropping the future abandons the
    /// exchange (module docs).
    pub async fn send(&mut self, msg: &mut Message, to: Pid) -> Result<Reply, IpcError> {
        self.send_inner(msg, to, None).await
    }

    /// [`Self::send`] that fails with [`IpcError::Deadline`] unless
    /// replied to within `deadline` (kept by the kernel, also remotely).
    pub async fn send_within(
        &mut self,
        msg: &mut Message,
        to: Pid,
        deadline: Duration,
    ) -> Result<Reply, IpcError> {
        self.send_inner(msg, to, Some(deadline)).await
    }

    async fn send_inner(
        &mut self,
        msg: &mut Message,
        to: Pid,
        deadline: Option<Duration>,
    ) -> Result<Reply, IpcError> {
        match &mut self.imp {
            Imp::Local(l) => {
                let m = *msg;
                l.p.trace(Phase::Send, l.p.pid(), to, true);
                l.spin_wanted = Some(l.kind_for(to));
                l.start(|p| {
                    p.send_direct(&m, to, deadline, p.pid())
                        .map(|()| None::<()>)
                })?;
                let r = reply_of(l.finish().await, msg);
                l.p.trace(Phase::Complete, l.p.pid(), to, r.is_ok());
                r
            }
            Imp::Attached(a) => {
                let m = *msg;
                let (r, m) = a
                    .call(move |p, _| {
                        let mut m = m;
                        let r = match deadline {
                            Some(d) => p.send_within(&mut m, to, Some(d)),
                            None => p.send(&mut m, to),
                        };
                        (r, m)
                    })
                    .await?;
                *msg = m;
                r
            }
        }
    }

    /// Send with a segment the receiver may read and/or write (`access`)
    /// while the Send is outstanding: `buf` is lent for the exchange and
    /// given back with the result.
    pub async fn send_with_segment(
        &mut self,
        msg: &mut Message,
        to: Pid,
        access: SegAccess,
        buf: Vec<u8>,
    ) -> (Result<Reply, IpcError>, Vec<u8>) {
        if !access.any() {
            // A segment nobody may access is no segment.
            return (self.send_inner(msg, to, None).await, buf);
        }
        match &mut self.imp {
            Imp::Local(l) => {
                let mut loan = Loan::new(buf, access.write);
                let Some(lent) = loan.lend() else {
                    return (Err(IpcError::Busy(Pid::NONE)), loan.finish());
                };
                msg.set_segment(access, loan.len() as u32);
                let m = *msg;
                l.p.trace(Phase::Send, l.p.pid(), to, true);
                l.spin_wanted = Some(l.kind_for(to));
                let r = l.start(move |p| {
                    p.direct(|e, now, me| {
                        e.send_append(now, me, to, m, Some(lent), usize::MAX)?;
                        #[cfg(feature = "otel")]
                        p.otel_sent(e);
                        Ok(None::<()>)
                    })
                });
                if let Err(e) = r {
                    return (Err(e), loan.finish());
                }
                let c = l.finish_holding(&mut loan).await;
                let r = reply_of(c, msg);
                l.p.trace(Phase::Complete, l.p.pid(), to, r.is_ok());
                (r, loan.finish())
            }
            Imp::Attached(a) => {
                let m = *msg;
                let r = a
                    .call(move |p, _| {
                        let mut m = m;
                        let mut buf = buf;
                        let seg = if access.read && access.write {
                            Segment::ReadWrite(&mut buf)
                        } else if access.write {
                            Segment::Write(&mut buf)
                        } else {
                            Segment::Read(&buf)
                        };
                        let r = p.send_with_segment(&mut m, to, seg);
                        (r, m, buf)
                    })
                    .await;
                match r {
                    Ok((r, m, buf)) => {
                        *msg = m;
                        (r, buf)
                    }
                    Err(e) => (Err(e), Vec::new()),
                }
            }
        }
    }

    /// Receive: completes with the next message (first come, first
    /// served). A message taken by a dropped Receive is returned here.
    pub async fn receive(&mut self, msg: &mut Message) -> Result<Incoming, IpcError> {
        self.receive_inner(msg, None).await
    }

    /// ReceiveSpecific: the next message from `from` only; `Ok(None)` if
    /// `from` does not exist (V's convention of returning 0).
    pub async fn receive_specific(
        &mut self,
        msg: &mut Message,
        from: Pid,
    ) -> Result<Option<Incoming>, IpcError> {
        match self.receive_inner(msg, Some(from)).await {
            Ok(i) => Ok(Some(i)),
            Err(IpcError::NoSuchProcess(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn receive_inner(
        &mut self,
        msg: &mut Message,
        from: Option<Pid>,
    ) -> Result<Incoming, IpcError> {
        match &mut self.imp {
            Imp::Local(l) => {
                if let Some(r) = l.take_stash(from) {
                    return Ok(incoming(r, msg));
                }
                l.spin_wanted = Some(if l.last_remote {
                    SpinKind::Socket
                } else {
                    SpinKind::Local
                });
                let r = l.start(|p| {
                    p.direct(|e, now, me| e.receive_upto(now, me, from, None, usize::MAX))
                })?;
                let r = match r {
                    Some(r) => r,
                    None => match l.finish().await {
                        Completion::Receive(r) => r?,
                        _ => return Err(IpcError::Busy(l.p.pid())),
                    },
                };
                l.p.trace(Phase::Deliver, r.from, l.p.pid(), true);
                l.last_remote = r.from.host() != l.p.pid().host();
                Ok(incoming(r, msg))
            }
            Imp::Attached(a) => {
                let (r, m) = a
                    .call(move |p, stash| {
                        if let Some((m, i)) =
                            stash.take_if(|(_, i)| from.is_none_or(|f| f == i.from))
                        {
                            return (Ok(i), m);
                        }
                        let mut m = Message::zero();
                        let r = match from {
                            None => p.receive(&mut m),
                            Some(f) => p
                                .receive_specific(&mut m, f)
                                .and_then(|o| o.ok_or(IpcError::NoSuchProcess(f))),
                        };
                        (r, m)
                    })
                    .await?;
                if r.is_ok() {
                    *msg = m;
                }
                r
            }
        }
    }

    /// Reply: `to` must be awaiting reply from this process. Completes at
    /// once (a V Reply never waits).
    pub async fn reply(&mut self, msg: &Message, to: Pid) -> Result<(), IpcError> {
        match &mut self.imp {
            Imp::Local(l) => l.p.reply(msg, to),
            Imp::Attached(a) => {
                let m = *msg;
                a.call(move |p, _| p.reply(&m, to)).await?
            }
        }
    }

    /// Reply-with-segment: also writes `data` at `offset` in `to`'s
    /// write-granted segment. Completes at once unless the data must be
    /// moved and acknowledged before the reply (a large reply to a remote
    /// request that is not idempotent); then it awaits that move.
    pub async fn reply_with_segment(
        &mut self,
        msg: &Message,
        to: Pid,
        offset: u32,
        data: &[u8],
    ) -> Result<(), IpcError> {
        match &mut self.imp {
            Imp::Local(l) => match l.p.reply_with_segment_now(msg, to, offset, data) {
                Err(IpcError::SegmentTooLarge { .. }) => {
                    let (r, _) = self.move_to(to, offset, data.to_vec()).await;
                    r?;
                    self.reply(msg, to).await
                }
                r => r,
            },
            Imp::Attached(a) => {
                let m = *msg;
                let data = data.to_vec();
                a.call(move |p, _| p.reply_with_segment(&m, to, offset, &data))
                    .await?
            }
        }
    }

    /// Forward: passes `from`'s request (as `msg`) to `to` as if `from`
    /// had sent it; `from` must be awaiting reply from this process.
    /// Completes at once.
    pub async fn forward(&mut self, msg: &Message, from: Pid, to: Pid) -> Result<(), IpcError> {
        match &mut self.imp {
            Imp::Local(l) => l.p.forward(msg, from, to),
            Imp::Attached(a) => {
                let m = *msg;
                a.call(move |p, _| p.forward(&m, from, to)).await?
            }
        }
    }

    /// MoveTo: copies `data` into `to`'s write-granted segment at
    /// `offset` (`to` must be awaiting reply from this process). Gives
    /// `data` back with the bytes moved.
    pub async fn move_to(
        &mut self,
        to: Pid,
        offset: u32,
        data: Vec<u8>,
    ) -> (Result<usize, IpcError>, Vec<u8>) {
        match &mut self.imp {
            Imp::Local(l) => l.moved(to, offset, Loan::new(data, false), true).await,
            Imp::Attached(a) => {
                match a
                    .call(move |p, _| (p.move_to(to, offset, &data), data))
                    .await
                {
                    Ok(r) => r,
                    Err(e) => (Err(e), Vec::new()),
                }
            }
        }
    }

    /// MoveFrom: fills `buf` from `from`'s read-granted segment at
    /// `offset` (`from` must be awaiting reply from this process). Gives
    /// `buf` back with the bytes moved.
    pub async fn move_from(
        &mut self,
        from: Pid,
        offset: u32,
        buf: Vec<u8>,
    ) -> (Result<usize, IpcError>, Vec<u8>) {
        match &mut self.imp {
            Imp::Local(l) => l.moved(from, offset, Loan::new(buf, true), false).await,
            Imp::Attached(a) => {
                match a
                    .call(move |p, _| {
                        let mut buf = buf;
                        (p.move_from(from, offset, &mut buf), buf)
                    })
                    .await
                {
                    Ok(r) => r,
                    Err(e) => (Err(e), Vec::new()),
                }
            }
        }
    }

    /// SetPid: registers `pid` under `logical` in `scope`.
    pub async fn set_pid(&mut self, logical: u32, pid: Pid, scope: Scope) -> Result<(), IpcError> {
        match &mut self.imp {
            Imp::Local(l) => {
                l.p.set_pid(logical, pid, scope);
                Ok(())
            }
            Imp::Attached(a) => a.call(move |p, _| p.set_pid(logical, pid, scope)).await,
        }
    }

    /// GetPid: the process registered under `logical` (asking other hosts
    /// for `Scope::Any`/`Remote`).
    pub async fn get_pid(&mut self, logical: u32, scope: Scope) -> Result<Pid, IpcError> {
        match &mut self.imp {
            Imp::Local(l) => {
                match l.start(|p| p.direct(|e, now, me| e.get_pid(now, me, logical, scope)))? {
                    Some(pid) => Ok(pid),
                    None => match l.finish().await {
                        Completion::GetPid(r) => r,
                        _ => Err(IpcError::Busy(l.p.pid())),
                    },
                }
            }
            Imp::Attached(a) => a.call(move |p, _| p.get_pid(logical, scope)).await?,
        }
    }
}

/// The reply of a finished Send.
fn reply_of(c: Completion, msg: &mut Message) -> Result<Reply, IpcError> {
    match c {
        Completion::Send(Ok(r)) => {
            *msg = r.msg;
            Ok(Reply {
                from: r.from,
                seg_bytes: r.seg_bytes,
            })
        }
        Completion::Send(Err(e)) => Err(e),
        _ => Err(IpcError::Busy(Pid::NONE)),
    }
}

fn incoming(r: Received, msg: &mut Message) -> Incoming {
    *msg = r.msg;
    Incoming {
        from: r.from,
        seg_bytes: r.seg_bytes,
        forwarder: r.forwarder,
        principal: r.principal,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Where the engine puts an async process's completion, and the task to
/// wake for it.
#[derive(Default)]
pub(crate) struct FutureSink {
    st: Mutex<SinkState>,
    /// `st` holds something for the task (a completion, or the
    /// destruction): a busy-polling task looks here, not under the lock.
    ready: AtomicBool,
}

#[derive(Default)]
struct SinkState {
    done: Option<Completion>,
    waker: Option<Waker>,
    destroyed: bool,
}

impl FutureSink {
    /// The completion, if one came (no lock unless one did).
    fn ready(&self) -> Option<Completion> {
        if !self.ready.load(Ordering::Acquire) {
            return None;
        }
        let mut st = lock(&self.st);
        if let Some(c) = st.done.take() {
            self.ready.store(st.destroyed, Ordering::Release);
            return Some(c);
        }
        st.destroyed
            .then_some(Completion::Send(Err(IpcError::Destroyed)))
    }

    /// [`Self::ready`], or registers the task to be woken.
    fn poll(&self, cx: &mut Context<'_>) -> Poll<Completion> {
        let mut st = lock(&self.st);
        if let Some(c) = st.done.take() {
            self.ready.store(st.destroyed, Ordering::Release);
            return Poll::Ready(c);
        }
        if st.destroyed {
            return Poll::Ready(Completion::Send(Err(IpcError::Destroyed)));
        }
        match &mut st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn take(&self) -> Option<Completion> {
        let mut st = lock(&self.st);
        let c = st.done.take();
        self.ready.store(st.destroyed, Ordering::Release);
        c
    }

    fn wake_task(&self) {
        let w = lock(&self.st).waker.take();
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl Sink for FutureSink {
    fn complete(&self, c: Completion) -> bool {
        let mut st = lock(&self.st);
        st.done = Some(c);
        self.ready.store(true, Ordering::Release);
        st.waker.is_some()
    }

    fn wake(&self) {
        self.wake_task();
    }

    fn destroyed(&self) {
        lock(&self.st).destroyed = true;
        self.ready.store(true, Ordering::Release);
        self.wake_task();
    }
}

/// An async process of an embedded host.
struct LocalAsync {
    p: LocalProcess,
    sink: Arc<FutureSink>,
    /// A message a dropped Receive took: the next Receive returns it.
    stash: Option<Received>,
    /// Busy-poll budget of a wait, µs.
    spin: u64,
    /// How the operation in progress may busy-poll, if at all.
    spin_wanted: Option<SpinKind>,
    /// When this wait's busy-polling ends (host clock).
    spin_until: Option<u64>,
    /// Counted among the host's spinners of this kind.
    counted: Option<SpinKind>,
    /// The last message received came from another host.
    last_remote: bool,
    /// How this process's waits ended.
    waits: WaitCounts,
}

impl std::fmt::Debug for LocalAsync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalAsync")
            .field("pid", &self.p.pid())
            .finish()
    }
}

impl LocalAsync {
    /// Starts an operation (the sink is empty: every earlier one was
    /// finished or cancelled).
    fn start<R>(
        &mut self,
        f: impl FnOnce(&LocalProcess) -> Result<Option<R>, IpcError>,
    ) -> Result<Option<R>, IpcError> {
        let _ = self.sink.take();
        f(&self.p)
    }

    /// Awaits the completion of the operation started; cancels it if the
    /// future is dropped first.
    async fn finish(&mut self) -> Completion {
        self.finish_with(None).await
    }

    /// [`Self::finish`] for an operation that holds `loan`: a drop
    /// cancels the operation before the loan ends.
    async fn finish_holding(&mut self, loan: &mut Loan) -> Completion {
        self.finish_with(Some(loan)).await
    }

    async fn finish_with(&mut self, loan: Option<&mut Loan>) -> Completion {
        let mut guard = Pending {
            l: self,
            loan,
            on: true,
        };
        let mut slept = false;
        let c = poll_fn(|cx| {
            let l = &mut *guard.l;
            if let Some(c) = l.sink.ready() {
                l.stop_spin();
                l.count_wait(slept);
                return Poll::Ready(c);
            }
            // While busy-polling, the task wakes itself: no waker needs
            // registering (a completion meanwhile sets `ready`, seen on
            // the next turn); one that stops registers before sleeping.
            if let Some(kind) = l.spin_turn() {
                let c = match kind {
                    SpinKind::Socket => l.p.poll_turn().or_else(|| l.sink.take()),
                    SpinKind::Local => None,
                };
                if let Some(c) = c {
                    l.stop_spin();
                    l.count_wait(slept);
                    return Poll::Ready(c);
                }
                // Poll again after the other ready tasks.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if let Poll::Ready(c) = l.sink.poll(cx) {
                l.count_wait(slept);
                return Poll::Ready(c);
            }
            slept = true;
            Poll::Pending
        })
        .await;
        guard.on = false;
        c
    }

    fn count_wait(&mut self, slept: bool) {
        if slept {
            self.waits.blocked += 1;
        } else {
            self.waits.unblocked += 1;
        }
    }

    /// How an operation with `peer` busy-polls.
    fn kind_for(&self, peer: Pid) -> SpinKind {
        if peer.host() != self.p.pid().host() || peer.is_group() {
            SpinKind::Socket
        } else {
            SpinKind::Local
        }
    }

    /// Whether (and how) this poll of a pending wait busy-polls: within
    /// the budget, and if the host's limits allow (one socket reader, one
    /// local spinner per CPU).
    fn spin_turn(&mut self) -> Option<SpinKind> {
        let kind = self.spin_wanted?;
        let now = self.p.now();
        if self.spin == 0 {
            self.spin_wanted = None;
            return None;
        }
        let until = *self.spin_until.get_or_insert(now.saturating_add(self.spin));
        if now >= until {
            self.stop_spin_for(true);
            self.spin_wanted = None;
            return None;
        }
        if self.counted.is_none() {
            let ok = match kind {
                SpinKind::Socket if self.p.spinners() == 0 => {
                    self.p.count_spinning(true, false);
                    true
                }
                SpinKind::Socket => false,
                SpinKind::Local => self.p.enter_local_spin(),
            };
            if !ok {
                // Sleep until woken; try again on the next wait.
                self.spin_wanted = None;
                return None;
            }
            self.counted = Some(kind);
        }
        Some(kind)
    }

    /// Stops busy-polling after the answer came.
    fn stop_spin(&mut self) {
        self.stop_spin_for(false);
    }

    /// Stops busy-polling; `sleeping`: the wait goes on without it.
    fn stop_spin_for(&mut self, sleeping: bool) {
        match self.counted.take() {
            Some(SpinKind::Socket) => self.p.count_spinning(false, sleeping),
            Some(SpinKind::Local) => self.p.leave_local_spin(),
            None => {}
        }
        self.spin_until = None;
    }

    async fn moved(
        &mut self,
        peer: Pid,
        offset: u32,
        mut loan: Loan,
        to: bool,
    ) -> (Result<usize, IpcError>, Vec<u8>) {
        let Some(lent) = loan.lend() else {
            return (Err(IpcError::Busy(Pid::NONE)), loan.finish());
        };
        self.spin_wanted = Some(self.kind_for(peer));
        let r = self.start(|p| {
            p.direct(|e, now, me| {
                if to {
                    e.move_to(now, me, peer, offset, lent)
                } else {
                    e.move_from(now, me, peer, offset, lent)
                }
            })
        });
        let r = match r {
            Ok(Some(n)) => Ok(n),
            Ok(None) => match self.finish_holding(&mut loan).await {
                Completion::Move(r) => r,
                _ => Err(IpcError::Busy(self.p.pid())),
            },
            Err(e) => Err(e),
        };
        (r, loan.finish())
    }

    fn take_stash(&mut self, from: Option<Pid>) -> Option<Received> {
        self.stash.take_if(|r| from.is_none_or(|f| f == r.from))
    }
}

/// How a pending wait busy-polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpinKind {
    /// Reads the host's socket (awaiting another host).
    Socket,
    /// Only re-polls its task (awaiting a process of this host).
    Local,
}

/// Cancels the operation of a dropped future.
struct Pending<'a, 'b> {
    l: &'a mut LocalAsync,
    /// The buffer the operation holds: its loan ends after the cancel.
    loan: Option<&'b mut Loan>,
    on: bool,
}

impl Drop for Pending<'_, '_> {
    fn drop(&mut self) {
        if !self.on {
            return;
        }
        self.l.stop_spin_for(true);
        self.l.p.cancel_direct();
        if let Some(l) = self.loan.take() {
            l.end();
        }
        // A message that arrived before the cancel stays with the process.
        if let Some(Completion::Receive(Ok(mut r))) = self.l.sink.take() {
            r.seg_bytes = 0;
            self.l.stash = Some(r);
        }
    }
}

/// An owned buffer lent to the engine for one operation.
struct Loan {
    buf: Vec<u8>,
    writable: bool,
    lease: Option<Lease>,
}

impl Loan {
    fn new(buf: Vec<u8>, writable: bool) -> Loan {
        Loan {
            buf,
            writable,
            lease: None,
        }
    }

    fn len(&self) -> usize {
        self.buf.len()
    }

    /// The engine's view of the buffer (once).
    fn lend(&mut self) -> Option<Box<LentBuf>> {
        if self.lease.is_some() {
            return None;
        }
        // The heap block does not move while `buf` is not touched, even if
        // the future holding this loan moves, and a leaked future leaks it.
        let (lease, lent) = if self.writable {
            Lease::exclusive(&mut self.buf)
        } else {
            Lease::shared(&self.buf)
        };
        self.lease = Some(lease);
        Some(lent)
    }

    /// Ends the loan (the operation finished or was cancelled, so the
    /// engine let go) and gives the buffer back.
    fn finish(mut self) -> Vec<u8> {
        self.end();
        std::mem::take(&mut self.buf)
    }

    /// Ends the loan; aborts if the engine still holds the view (a
    /// kernel bug that would become a use-after-free).
    fn end(&mut self) {
        if let Some(l) = self.lease.take() {
            l.release();
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        self.end();
    }
}

type Job = Box<dyn FnOnce(&Process, &mut Option<(Message, Incoming)>) + Send>;

/// An async process of a machine host: a thread makes its calls.
struct AttachedAsync {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for AttachedAsync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedAsync").finish()
    }
}

/// The result of one call made by the thread, and the task to wake.
struct CallSlot<T> {
    st: Mutex<(Option<T>, Option<Waker>, bool)>,
}

impl AttachedAsync {
    fn start(p: Process) -> Result<AttachedAsync, IpcError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("vk-async-{}", p.pid()))
            .spawn(move || {
                // A message a dropped Receive took, for the next Receive.
                let mut stash = None;
                while let Ok(job) = rx.recv() {
                    job(&p, &mut stash);
                }
            })
            .map_err(|_| IpcError::TableFull)?;
        Ok(AttachedAsync {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Runs `f` on the process's thread and awaits its result.
    async fn call<T>(
        &mut self,
        f: impl FnOnce(&Process, &mut Option<(Message, Incoming)>) -> T + Send + 'static,
    ) -> Result<T, IpcError>
    where
        T: StashIfAbandoned + Send + 'static,
    {
        let slot = Arc::new(CallSlot {
            st: Mutex::new((None, None, false)),
        });
        let s2 = slot.clone();
        let job: Job = Box::new(move |p, stash| {
            let r = f(p, stash);
            let mut st = lock(&s2.st);
            if st.2 {
                // Abandoned: keep a received message for the next Receive.
                drop(st);
                r.stash(stash);
                return;
            }
            st.0 = Some(r);
            let w = st.1.take();
            drop(st);
            if let Some(w) = w {
                w.wake();
            }
        });
        let Some(tx) = &self.jobs else {
            return Err(IpcError::Shutdown);
        };
        tx.send(job).map_err(|_| IpcError::Shutdown)?;
        let guard = Abandon(&slot);
        let r = poll_fn(|cx| {
            let mut st = lock(&slot.st);
            match st.0.take() {
                Some(r) => Poll::Ready(r),
                None => {
                    st.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await;
        std::mem::forget(guard);
        Ok(r)
    }
}

/// Marks a call's result unwanted when its future is dropped.
struct Abandon<'a, T>(&'a Arc<CallSlot<T>>);

impl<T> Drop for Abandon<'_, T> {
    fn drop(&mut self) {
        lock(&self.0.st).2 = true;
    }
}

/// What an abandoned call leaves for the process's next Receive.
trait StashIfAbandoned {
    fn stash(self, _stash: &mut Option<(Message, Incoming)>)
    where
        Self: Sized,
    {
    }
}

impl StashIfAbandoned for (Result<Incoming, IpcError>, Message) {
    fn stash(self, stash: &mut Option<(Message, Incoming)>) {
        if let (Ok(i), m) = self {
            *stash = Some((m, i));
        }
    }
}
impl StashIfAbandoned for (Result<Reply, IpcError>, Message) {}
impl StashIfAbandoned for (Result<Reply, IpcError>, Message, Vec<u8>) {}
impl StashIfAbandoned for (Result<usize, IpcError>, Vec<u8>) {}
impl StashIfAbandoned for Result<(), IpcError> {}
impl StashIfAbandoned for Result<Pid, IpcError> {}
impl StashIfAbandoned for () {}

impl Drop for AttachedAsync {
    fn drop(&mut self) {
        // Closing the channel ends the thread after its current call; the
        // process is destroyed when the thread drops it. A call still
        // blocked (a Receive nobody answers, say) keeps the process and
        // its thread until it ends or the program exits, so the thread is
        // not joined.
        self.jobs = None;
        self.thread = None;
    }
}
