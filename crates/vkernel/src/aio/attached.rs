//! An async process of a machine host: one thread per process makes its
//! blocking calls through the call slot and wakes the task; an abandoned
//! call's received message is kept for the next Receive.

use std::future::poll_fn;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use vkernel_proto::{IpcError, Message, Pid};

use crate::process::Process;
use crate::vocab::{Incoming, Reply};

use super::lock;

pub(super) type Job = Box<dyn FnOnce(&Process, &mut Option<(Message, Incoming)>) + Send>;

/// An async process of a machine host: a thread makes its calls.
pub(super) struct AttachedAsync {
    pub(super) jobs: Option<mpsc::Sender<Job>>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for AttachedAsync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedAsync").finish()
    }
}

/// The result of one call made by the thread, and the task to wake.
pub(super) struct CallSlot<T> {
    pub(super) st: Mutex<(Option<T>, Option<Waker>, bool)>,
}

impl AttachedAsync {
    pub(super) fn start(p: Process) -> Result<AttachedAsync, IpcError> {
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
    pub(super) async fn call<T>(
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
pub(super) struct Abandon<'a, T>(&'a Arc<CallSlot<T>>);

impl<T> Drop for Abandon<'_, T> {
    fn drop(&mut self) {
        lock(&self.0.st).2 = true;
    }
}

/// What an abandoned call leaves for the process's next Receive.
pub(super) trait StashIfAbandoned {
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
