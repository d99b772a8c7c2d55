//! An async process of an embedded host: the sink its completions go to
//! ([`FutureSink`]), how its tasks busy-poll or sleep, and the loans of
//! the owned buffers the engine may write until an operation ends.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use vkernel_proto::engine::{Completion, Received};
use vkernel_proto::{IpcError, Pid};

use crate::lent::{Lease, LentBuf};
use crate::process::LocalProcess;
use crate::spin::{Spin, SpinPolicy};
use crate::vocab::WaitCounts;
use crate::waiter::Sink;

use super::lock;

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
pub(super) struct LocalAsync {
    pub(super) p: LocalProcess,
    pub(super) sink: Arc<FutureSink>,
    /// A message a dropped Receive took: the next Receive returns it.
    pub(super) stash: Option<Received>,
    /// How long a wait busy-polls (a fixed budget).
    pub(super) spin: SpinPolicy,
    /// How the operation in progress may busy-poll, if at all.
    pub(super) spin_wanted: Option<SpinKind>,
    /// This wait's busy-polling, once begun.
    pub(super) spinning: Option<Spin>,
    /// Counted among the host's spinners of this kind.
    pub(super) counted: Option<SpinKind>,
    /// The last message received came from another host.
    pub(super) last_remote: bool,
    /// How this process's waits ended.
    pub(super) waits: WaitCounts,
}

impl std::fmt::Debug for LocalAsync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalAsync")
            .field("pid", &self.p.pid())
            .finish()
    }
}

impl LocalAsync {
    /// The async side of `p`, whose completions go to `sink`.
    pub(super) fn new(p: LocalProcess, sink: Arc<FutureSink>) -> LocalAsync {
        LocalAsync {
            p,
            sink,
            stash: None,
            spin: SpinPolicy::fixed(crate::AUTO_SPIN_CAP),
            spin_wanted: None,
            spinning: None,
            counted: None,
            last_remote: false,
            waits: WaitCounts::default(),
        }
    }

    /// Starts an operation (the sink is empty: every earlier one was
    /// finished or cancelled).
    pub(super) fn start<R>(
        &mut self,
        f: impl FnOnce(&LocalProcess) -> Result<Option<R>, IpcError>,
    ) -> Result<Option<R>, IpcError> {
        let _ = self.sink.take();
        f(&self.p)
    }

    /// Awaits the completion of the operation started; cancels it if the
    /// future is dropped first.
    pub(super) async fn finish(&mut self) -> Completion {
        self.finish_with(None).await
    }

    /// [`Self::finish`] for an operation that holds `loan`: a drop
    /// cancels the operation before the loan ends.
    pub(super) async fn finish_holding(&mut self, loan: &mut Loan) -> Completion {
        self.finish_with(Some(loan)).await
    }

    pub(super) async fn finish_with(&mut self, loan: Option<&mut Loan>) -> Completion {
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

    pub(super) fn count_wait(&mut self, slept: bool) {
        if slept {
            self.waits.blocked += 1;
        } else {
            self.waits.unblocked += 1;
        }
    }

    /// How an operation with `peer` busy-polls.
    pub(super) fn kind_for(&self, peer: Pid) -> SpinKind {
        if peer.host() != self.p.pid().host() || peer.is_group() {
            SpinKind::Socket
        } else {
            SpinKind::Local
        }
    }

    /// Whether (and how) this poll of a pending wait busy-polls: within
    /// the budget, and if the host's limits allow (one socket reader, one
    /// local spinner per CPU).
    pub(super) fn spin_turn(&mut self) -> Option<SpinKind> {
        let kind = self.spin_wanted?;
        let now = self.p.now();
        // (Each turn is a whole poll of the task: costly.)
        let mut spin = self
            .spinning
            .unwrap_or_else(|| Spin::begin(&self.spin, now, 0, 1, || false).costly_turns(1));
        if !spin.again(|| now, |_| false) {
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
        self.spinning = Some(spin);
        Some(kind)
    }

    /// Stops busy-polling after the answer came.
    pub(super) fn stop_spin(&mut self) {
        self.stop_spin_for(false);
    }

    /// Stops busy-polling; `sleeping`: the wait goes on without it.
    pub(super) fn stop_spin_for(&mut self, sleeping: bool) {
        match self.counted.take() {
            Some(SpinKind::Socket) => self.p.count_spinning(false, sleeping),
            Some(SpinKind::Local) => self.p.leave_local_spin(),
            None => {}
        }
        self.spinning = None;
    }

    pub(super) async fn moved(
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

    pub(super) fn take_stash(&mut self, from: Option<Pid>) -> Option<Received> {
        self.stash.take_if(|r| from.is_none_or(|f| f == r.from))
    }
}

/// How a pending wait busy-polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SpinKind {
    /// Reads the host's socket (awaiting another host).
    Socket,
    /// Only re-polls its task (awaiting a process of this host).
    Local,
}

/// Cancels the operation of a dropped future.
pub(super) struct Pending<'a, 'b> {
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
pub(super) struct Loan {
    buf: Vec<u8>,
    writable: bool,
    lease: Option<Lease>,
}

impl Loan {
    pub(super) fn new(buf: Vec<u8>, writable: bool) -> Loan {
        Loan {
            buf,
            writable,
            lease: None,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.buf.len()
    }

    /// The engine's view of the buffer (once).
    pub(super) fn lend(&mut self) -> Option<Box<LentBuf>> {
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
    pub(super) fn finish(mut self) -> Vec<u8> {
        self.end();
        std::mem::take(&mut self.buf)
    }

    /// Ends the loan; aborts if the engine still holds the view (a
    /// kernel bug that would become a use-after-free).
    pub(super) fn end(&mut self) {
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
