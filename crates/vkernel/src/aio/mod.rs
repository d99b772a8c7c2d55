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
//!
//! By side: `local` (the embedded host's async process: its sink, its
//! busy-polling, the loans of its buffers), `attached` (a machine host's:
//! the thread that makes its calls).

mod attached;
mod local;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vkernel_proto::engine::{Completion, Received};
use vkernel_proto::{IpcError, Message, Pid, Scope, SegAccess};

use crate::process::{LocalProcess, Process};
use crate::trace::Phase;
use crate::vocab::{Incoming, Reply, Segment, WaitCounts};

use attached::AttachedAsync;
pub(crate) use local::FutureSink;
use local::{Loan, LocalAsync, SpinKind};

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
            imp: Imp::Local(LocalAsync::new(p, sink)),
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
            l.spin = crate::spin::SpinPolicy::fixed(d);
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
