//! A server's dispatcher and worker pool.
//!
//! One registered pid, the *dispatcher*, receives every request and
//! Forwards it to an idle *worker* process, so several requests are in
//! flight behind one name. A forwarded request keeps its sender: the
//! worker replies, moves data and reads the appended segment exactly as if
//! the client had sent to it. Requests that arrive while every worker is
//! busy wait in the dispatcher's queue, up to a bound.
//!
//! Workers and dispatcher are threads of one team and share the idle set,
//! so a worker that finishes joins it without an exchange; it Sends the
//! pool's idle code to the dispatcher only when requests are queued.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::{Incoming, IpcError, Kernel, Message, Pid, Process, Scope};
use vkernel_proto::MAX_APPEND;

/// One request as a dispatcher or worker received it.
#[derive(Debug)]
pub struct Request<'a> {
    /// The process that received it (reply, move data and forward with it).
    pub process: &'a Process,
    /// The request message.
    pub message: Message,
    /// The sender.
    pub from: Pid,
    /// The principal the sender runs as (0 = none).
    pub principal: u32,
    /// The first part of the sender's read-granted segment that arrived
    /// with the request.
    pub appended: &'a [u8],
}

/// What a service does with its requests.
pub trait Handler: Send + Sync + 'static {
    /// Buffers a thread keeps from one request to the next.
    type Scratch: Default + Send + 'static;

    /// Executes one request and answers it. An `Err` means the client was
    /// left unanswered (a move or reply failed): the pool answers
    /// [`Handler::failed`] so its Send ends.
    fn handle(&self, r: Request<'_>, scratch: &mut Self::Scratch) -> Result<(), IpcError>;

    /// The answer to a request that could not be executed (forwarding or
    /// handling failed).
    fn failed(&self) -> Message;

    /// The answer to a request refused because the queue is full.
    fn busy(&self) -> Message;

    /// Whether the dispatcher executes `r` itself rather than hand it to a
    /// worker: worth it when the request is cheaper than the wake-up a
    /// hand-off costs. Only requests whose segment is at most
    /// [`PoolConfig::inline_upto`] bytes arrive with their appended part.
    fn runs_inline(&self, r: &Request<'_>) -> bool {
        let _ = r;
        false
    }
}

/// How a [`WorkerPool`] is set up.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Prefix of the thread names (`NAME-dispatch`, `NAME-wN`).
    pub name: String,
    /// Worker processes (requests executed at once).
    pub workers: usize,
    /// Requests queued while every worker is busy; beyond this the
    /// dispatcher answers [`Handler::busy`].
    pub queue: usize,
    /// Request code a worker Sends the dispatcher to say it is idle (the
    /// dispatcher accepts it from its workers only).
    pub idle_code: u32,
    /// Segments up to this long are received by the dispatcher with their
    /// appended part (for [`Handler::runs_inline`]); 0 = never.
    pub inline_upto: usize,
    /// Logical id the dispatcher registers under (any scope), if any.
    pub logical_id: Option<u32>,
    /// How long workers busy-poll for their next request before they
    /// block (zero: always block); `None` follows the host's policy. A
    /// worker's next request rarely comes within a spin when clients do
    /// other work between requests (a FUSE mount, a disk), and on a
    /// machine with few CPUs the spinners take the CPU that work needs.
    pub worker_spin: Option<std::time::Duration>,
}

/// A running dispatcher and its workers. Dropping it does not stop them;
/// they end when their logical host shuts down.
#[derive(Debug)]
pub struct WorkerPool {
    pid: Pid,
    threads: Vec<JoinHandle<()>>,
}

struct Idle {
    /// Workers waiting for a request.
    set: Mutex<Vec<Pid>>,
    /// Requests queued at the dispatcher. A worker that joins the idle set
    /// while this is non-zero Sends the idle code to wake the dispatcher.
    queued: AtomicUsize,
}

impl Idle {
    fn set(&self) -> MutexGuard<'_, Vec<Pid>> {
        match self.set.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Puts `w` in the idle set (once).
    fn add(&self, w: Pid) {
        let mut g = self.set();
        if !g.contains(&w) {
            g.push(w);
        }
    }
}

impl WorkerPool {
    /// Starts the dispatcher and `cfg.workers` workers on `kernel`, each
    /// executing requests with `handler`.
    pub fn start<H: Handler>(
        kernel: &Kernel,
        cfg: PoolConfig,
        handler: Arc<H>,
    ) -> Result<WorkerPool, IpcError> {
        let idle = Arc::new(Idle {
            set: Mutex::new(Vec::new()),
            queued: AtomicUsize::new(0),
        });
        let dispatcher = kernel.create_process()?;
        let dpid = dispatcher.pid();
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..cfg.workers.max(1) {
            let (h, id, c) = (handler.clone(), idle.clone(), cfg.clone());
            let name = format!("{}-w{i}", cfg.name);
            let (wpid, t) = kernel.spawn(&name, move |p| worker(p, dpid, &c, &*h, &id))?;
            workers.push(wpid);
            threads.push(t);
        }
        if let Some(lid) = cfg.logical_id {
            dispatcher.set_pid(lid, dpid, Scope::Any);
        }
        idle.set().extend(workers.iter().copied());
        let t = std::thread::Builder::new()
            .name(format!("{}-dispatch", cfg.name))
            .spawn(move || {
                Dispatcher {
                    p: dispatcher,
                    workers,
                    cfg,
                    idle,
                    book: Book::default(),
                }
                .run(&*handler)
            })
            .map_err(|_| IpcError::TableFull)?;
        threads.push(t);
        Ok(WorkerPool { pid: dpid, threads })
    }

    /// The pid clients send to (the dispatcher).
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Waits for the pool's threads (they end when the host shuts down).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// An error after which the process can do nothing: its host shut down,
/// it was destroyed, or (attached) its machine host went away. A server
/// then ends, rather than retry a call that fails at once forever.
fn ends(e: &IpcError) -> bool {
    matches!(
        e,
        IpcError::Shutdown | IpcError::Destroyed | IpcError::HostLost
    )
}

/// Executes one request and answers [`Handler::failed`] if it left the
/// client unanswered. `false` when the host is going away.
fn execute<H: Handler>(
    h: &H,
    p: &Process,
    m: Message,
    i: &Incoming,
    appended: &[u8],
    scratch: &mut H::Scratch,
    what: &str,
) -> bool {
    let r = Request {
        process: p,
        message: m,
        from: i.from,
        principal: i.principal,
        appended: &appended[..i.seg_bytes.min(appended.len())],
    };
    match h.handle(r, scratch) {
        Ok(()) => true,
        // The client sees the host go (timeout or no such process) and
        // may find a restarted server.
        Err(e) if ends(&e) => false,
        Err(e) => {
            tracing::debug!("{what}: request {:#x} from {}: {e}", m.code(), i.from);
            let _ = p.reply(&h.failed(), i.from);
            true
        }
    }
}

/// A worker: executes one request at a time.
fn worker<H: Handler>(p: Process, dispatcher: Pid, cfg: &PoolConfig, h: &H, idle: &Idle) {
    // The dispatcher receives every request, so it alone waits on the
    // socket: a datagram then wakes it directly instead of an idle worker
    // that would only pass it on. A worker's own remote waits (bulk moves)
    // are served by whichever thread reads the socket next.
    p.set_socket_reader(false);
    if let Some(d) = cfg.worker_spin {
        p.set_spin(d);
    }
    let mut m = Message::zero();
    let mut appended = vec![0u8; MAX_APPEND];
    let mut scratch = H::Scratch::default();
    loop {
        let i = match p.receive_with_segment(&mut m, &mut appended) {
            Ok(i) => i,
            Err(e) if ends(&e) => return,
            Err(e) => {
                tracing::debug!("{} worker: receive: {e}", cfg.name);
                continue;
            }
        };
        if !execute(h, &p, m, &i, &appended, &mut scratch, &cfg.name) {
            return;
        }
        // Joining the set before reading the queue length (and the
        // dispatcher publishing the length before looking at the set)
        // means one of the two always sees the other.
        idle.add(p.pid());
        fence(Ordering::SeqCst);
        if idle.queued.load(Ordering::SeqCst) == 0 {
            continue;
        }
        let mut m = Message::with_code(cfg.idle_code);
        match p.send(&mut m, dispatcher) {
            Ok(_) => {}
            Err(e) if ends(&e) => return,
            Err(e) => tracing::debug!("{} worker: idle: {e}", cfg.name),
        }
    }
}

struct Dispatcher {
    p: Process,
    workers: Vec<Pid>,
    cfg: PoolConfig,
    idle: Arc<Idle>,
    book: Book,
}

/// The dispatcher's queue and hand-outs, apart from IPC.
#[derive(Default)]
struct Book {
    /// Requests waiting for a worker, oldest first.
    pending: VecDeque<(Message, Pid)>,
    /// Which client's request each busy worker was handed.
    assigned: Vec<(Pid, Pid)>,
}

impl Book {
    /// The superseded-exchange rule. A process has one Send outstanding,
    /// so a new request from `from` means the kernel has ended its
    /// previous exchange (e.g. an idempotent request re-executed after a
    /// late reply), and Forward names the exchange by pid only: a queued
    /// request from the same pid is stale (forwarding it would pair it
    /// with the new exchange's data and reply), and a worker handed the
    /// previous request may never receive it. Returns those workers, to be
    /// counted idle again.
    fn supersede(&mut self, from: Pid) -> Vec<Pid> {
        self.pending.retain(|(_, f)| *f != from);
        let freed = self
            .assigned
            .iter()
            .filter(|&&(_, c)| c == from)
            .map(|&(w, _)| w)
            .collect();
        self.assigned.retain(|&(_, c)| c != from);
        freed
    }

    /// `w` is idle: whatever it was handed is over.
    fn release(&mut self, w: Pid) {
        self.assigned.retain(|&(x, _)| x != w);
    }

    fn is_assigned(&self, w: Pid) -> bool {
        self.assigned.iter().any(|&(x, _)| x == w)
    }
}

impl Dispatcher {
    fn run<H: Handler>(mut self, h: &H) {
        let mut m = Message::zero();
        let mut appended = vec![
            0u8;
            if self.cfg.inline_upto > 0 {
                MAX_APPEND
            } else {
                0
            }
        ];
        let mut scratch = H::Scratch::default();
        loop {
            // The first part of a segment too large to run here is not
            // copied: the worker it goes to receives it again.
            let r = if self.cfg.inline_upto > 0 {
                self.p
                    .receive_with_segment_upto(&mut m, &mut appended, self.cfg.inline_upto)
            } else {
                self.p.receive(&mut m)
            };
            let i = match r {
                Ok(i) => i,
                Err(e) if ends(&e) => return,
                Err(e) => {
                    tracing::debug!("{} dispatcher: receive: {e}", self.cfg.name);
                    continue;
                }
            };
            let worker = self.workers.contains(&i.from);
            if worker && m.code() == self.cfg.idle_code {
                // A worker saw queued requests as it went idle: hand them out.
                let _ = self.p.reply(&Message::zero(), i.from);
            } else {
                self.supersede(i.from);
                let inline = !worker && {
                    let seg = &appended[..i.seg_bytes.min(appended.len())];
                    h.runs_inline(&Request {
                        process: &self.p,
                        message: m,
                        from: i.from,
                        principal: i.principal,
                        appended: seg,
                    })
                };
                if inline {
                    if !execute(h, &self.p, m, &i, &appended, &mut scratch, &self.cfg.name) {
                        return;
                    }
                } else if self.book.pending.len() < self.cfg.queue {
                    self.book.pending.push_back((m, i.from));
                } else {
                    let _ = self.p.reply(&h.busy(), i.from);
                }
            }
            self.hand_out(h);
        }
    }

    /// Applies the superseded-exchange rule ([`Book::supersede`]).
    fn supersede(&mut self, from: Pid) {
        for w in self.book.supersede(from) {
            self.idle.add(w);
        }
    }

    /// Hands queued requests to idle workers, oldest first.
    fn hand_out<H: Handler>(&mut self, h: &H) {
        loop {
            self.idle
                .queued
                .store(self.book.pending.len(), Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.book.pending.is_empty() {
                return;
            }
            let Some(w) = self.idle.set().pop() else {
                return;
            };
            self.book.release(w);
            // Skip senders that have gone.
            while let Some((m, from)) = self.book.pending.pop_front() {
                match self.p.forward(&m, from, w) {
                    Ok(()) => {
                        self.book.assigned.push((w, from));
                        break;
                    }
                    Err(e) => {
                        tracing::debug!("{}: forward to worker {w}: {e}", self.cfg.name);
                        let _ = self.p.reply(&h.failed(), from);
                    }
                }
            }
            if !self.book.is_assigned(w) {
                self.idle.add(w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_request_supersedes_the_senders_queued_and_assigned_ones() {
        let (c, d) = (Pid(0x0001_0101), Pid(0x0001_0102));
        let (w1, w2) = (Pid(0x0001_0201), Pid(0x0001_0202));
        let mut b = Book::default();
        b.pending.push_back((Message::with_code(1), c));
        b.pending.push_back((Message::with_code(2), d));
        b.assigned.push((w1, c));
        b.assigned.push((w2, d));
        // C sends again: its queued request goes, and the worker handed
        // its earlier one is free; D's are untouched.
        assert_eq!(b.supersede(c), vec![w1]);
        assert_eq!(b.pending.len(), 1);
        assert_eq!(b.pending[0].1, d);
        assert!(!b.is_assigned(w1));
        assert!(b.is_assigned(w2));
        // A sender with nothing outstanding frees nobody.
        assert_eq!(b.supersede(c), Vec::<Pid>::new());
        b.release(w2);
        assert!(!b.is_assigned(w2));
    }
}
