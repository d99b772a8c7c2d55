//! The program's side of an attachment: [`Attachment`] is the connection to
//! the machine host, [`AttachedProcess`] a process whose calls run in the
//! host through its call slot.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use vkernel_proto::{HostId, IpcError, Message, Pid, Scope};

use crate::process::{HostLoad, Incoming, Reply, Segment, WaitCounts};
use crate::spin::SpinPolicy;

use super::control::{self, ask, kind, Record};
use super::direct::{DirectPath, Waiting, Went};
use super::peer::{self, Inbound, Outcome, Peer, PEER_BYTES};
use super::shm::CounterPage;
use super::shm::{futex_wake, Shm};
use super::slot::{Op, Slot, NONE64, SLOT_BYTES};
use super::wait::{publish, Pace, Waited};
use super::{lock, MAX_WINDOW, MIN_WINDOW};
use crate::deadline::Deadline;
use crate::direct::Ev;
use crate::trace::{self, Phase};
use vkernel_proto::auth::{AuthConfig, Sealer};

/// A process's call slot and peer page, as its program maps them.
type Pages = (Arc<Shm>, Option<Arc<Shm>>);

/// A program's connection to its machine host.
pub(crate) struct Attachment {
    sock: OwnedFd,
    send_lock: Mutex<()>,
    pub(crate) host: HostId,
    pub(crate) host_addr: Option<SocketAddr>,
    /// The host went away (the socket ended).
    lost: AtomicBool,
    /// This program detached (dropped its `Kernel`).
    closed: AtomicBool,
    answers: Mutex<HashMap<u32, Record>>,
    answered: Condvar,
    next_id: AtomicU32,
    /// Every live process's slot and peer page, to wake their waits when
    /// the host goes.
    slots: Mutex<HashMap<Pid, Pages>>,
    /// The principal the host gave this program.
    principal: u32,
    /// Exchanges with processes of this uid may go through peer pages
    /// (unless `VKERNEL_ATTACH_PEER=off`).
    peer_on: bool,
    pub(crate) pace: Pace,
    /// Remote Sends may go on a process's own socket (unless
    /// `VKERNEL_ATTACH_DIRECT=off`, or the host refused once).
    direct_on: AtomicBool,
    /// Every new process's waiting strategy and Send deadline.
    spin: SpinPolicy,
    send_deadline: Option<Duration>,
    pub(crate) net_counters: crate::net::NetCounters,
    /// Events of its processes not yet reported to the host (TALLY
    /// records of [`Ev`]s).
    reports: Mutex<Vec<u8>>,
    /// The keyed host's keys and counter (None: not asked yet).
    sealer: Mutex<Option<Option<Sealer>>>,
    /// What its processes' direct Sends know of peer hosts, together.
    peer_times: Arc<vkernel_proto::rtt::PeerTimes>,
    /// The host traces (`--trace`): the program traces its exchanges
    /// outside the host and sends the lines (TRACE records).
    pub(crate) tracing: bool,
    traces: Mutex<Vec<u8>>,
    /// The host keeps latency histograms (`--metrics`): peer-page
    /// exchanges are timed for them.
    pub(crate) metrics: bool,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("host", &self.host)
            .finish()
    }
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl Attachment {
    /// Connects to the machine host at `path` and says hello; starts the
    /// thread that reads the host's answers.
    pub(crate) fn connect(
        path: &Path,
        spin: SpinPolicy,
        send_deadline: Option<Duration>,
    ) -> std::io::Result<Arc<Attachment>> {
        let sock = control::socket()?;
        let addr = rustix::net::SocketAddrUnix::new(path)?;
        rustix::net::connect(&sock, &addr).map_err(|e| {
            std::io::Error::new(
                std::io::Error::from(e).kind(),
                format!(
                    "cannot attach to the machine host at {}: {e} (is `vkernel host` running? the path can be set with {})",
                    path.display(),
                    super::ENV
                ),
            )
        })?;
        control::send(
            &sock,
            &[kind::HELLO, control::MAGIC, control::VERSION, 0, 0, 0, 0, 0],
            &[],
            &[],
        )?;
        let w = control::recv(&sock)?
            .ok_or_else(|| io_err("the machine host closed the connection (refused?)"))?;
        if w.kind() != kind::WELCOME || w.words[1] != control::MAGIC {
            return Err(io_err("not a vkernel machine host"));
        }
        if w.words[2] != control::VERSION {
            return Err(io_err(format!(
                "the machine host speaks attach protocol {} (this program {})",
                w.words[2],
                control::VERSION
            )));
        }
        let host_addr = std::str::from_utf8(&w.payload)
            .ok()
            .and_then(|s| s.parse().ok());
        let a = Arc::new(Attachment {
            sock,
            send_lock: Mutex::new(()),
            host: HostId(w.words[3] as u16),
            host_addr,
            lost: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            answers: Mutex::new(HashMap::new()),
            answered: Condvar::new(),
            next_id: AtomicU32::new(1),
            slots: Mutex::new(HashMap::new()),
            principal: w.words[4],
            peer_on: enabled("VKERNEL_ATTACH_PEER"),
            pace: Pace::new(),
            direct_on: AtomicBool::new(enabled("VKERNEL_ATTACH_DIRECT")),
            spin,
            send_deadline,
            net_counters: crate::net::NetCounters::default(),
            reports: Mutex::new(Vec::new()),
            sealer: Mutex::new(None),
            peer_times: Default::default(),
            tracing: w.words[5] & 1 != 0,
            metrics: w.words[5] & 2 != 0,
            traces: Mutex::new(Vec::new()),
        });
        let r = a.clone();
        std::thread::Builder::new()
            .name("vk-attach".into())
            .spawn(move || r.read_answers())?;
        Ok(a)
    }

    fn read_answers(&self) {
        while let Ok(Some(r)) = control::recv(&self.sock) {
            if r.kind() == kind::ANSWER {
                lock(&self.answers).insert(r.words[1], r);
                self.answered.notify_all();
            }
        }
        self.lost.store(true, Ordering::SeqCst);
        // Hold the lock while notifying so no asker misses it.
        drop(lock(&self.answers));
        self.answered.notify_all();
        for (s, pg) in lock(&self.slots).values() {
            // SAFETY: a slot mapping is SLOT_BYTES long and page-aligned.
            let slot = unsafe { Slot::at(s.as_ptr()) };
            futex_wake(&slot.done);
            if let Some(pg) = pg {
                // SAFETY: a peer page mapping is PEER_BYTES long and
                // page-aligned.
                let p = unsafe { Peer::at(pg.as_ptr()) };
                futex_wake(&p.bell);
                futex_wake(&p.rst);
            }
        }
    }

    /// Why calls fail now, if they do.
    fn gone(&self) -> Option<IpcError> {
        if self.closed.load(Ordering::Acquire) {
            Some(IpcError::Shutdown)
        } else if self.lost.load(Ordering::Acquire) {
            Some(IpcError::HostLost)
        } else {
            None
        }
    }

    /// Sends a record that asks something and waits for its answer.
    fn ask(
        &self,
        mut words: [u32; 8],
        payload: &[u8],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<Record, IpcError> {
        if let Some(e) = self.gone() {
            return Err(e);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        words[1] = id;
        {
            let _g = lock(&self.send_lock);
            control::send(&self.sock, &words, payload, fds).map_err(|_| IpcError::HostLost)?;
        }
        let mut answers = lock(&self.answers);
        loop {
            if let Some(r) = answers.remove(&id) {
                return match r.words[2] {
                    0 => Ok(r),
                    c => Err(IpcError::from_code(c, r.words[3])),
                };
            }
            if let Some(e) = self.gone() {
                return Err(e);
            }
            answers = self
                .answered
                .wait_timeout(answers, Duration::from_millis(100))
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }

    /// Asks a question about the host (see `control::ask`).
    pub(crate) fn question(&self, what: u32, a: u32, payload: &[u8]) -> Result<Record, IpcError> {
        self.ask([kind::ASK, 0, what, a, 0, 0, 0, 0], payload, &[])
    }

    /// Creates a process on the host.
    pub(crate) fn create_process(self: &Arc<Self>) -> Result<AttachedProcess, IpcError> {
        let res = |_| IpcError::NoResources;
        let (slot, slot_fd) = Shm::create("vkernel-slot", SLOT_BYTES).map_err(res)?;
        let (window, window_fd) = Shm::create("vkernel-window", MIN_WINDOW).map_err(res)?;
        let page = if self.peer_on {
            Some(Shm::create("vkernel-peer", PEER_BYTES).map_err(res)?)
        } else {
            None
        };
        let mut fds = vec![slot_fd.as_fd(), window_fd.as_fd()];
        if let Some((_, f)) = &page {
            fds.push(f.as_fd());
        }
        let r = self.ask([kind::CREATE, 0, 0, 0, 0, 0, 0, 0], &[], &fds)?;
        let pid = Pid(r.words[4]);
        let peer = page.filter(|_| r.words[5] == 1).map(|(p, _)| Arc::new(p));
        let slot = Arc::new(slot);
        lock(&self.slots).insert(pid, (slot.clone(), peer.clone()));
        let p = AttachedProcess {
            at: self.clone(),
            pid,
            slot,
            window: RefCell::new(window),
            seq: Cell::new(0),
            spin: Cell::new(self.spin),
            waits: Cell::new(WaitCounts::default()),
            send_deadline: Cell::new(self.send_deadline),
            peer,
            peers: RefCell::new(HashMap::new()),
            peer_rx: RefCell::new(HashMap::new()),
            peer_seq: Cell::new(0),
            principal: Cell::new(self.principal),
            restricted: Cell::new(false),
            windows: RefCell::new(HashMap::new()),
            direct: RefCell::new(None),
            pending: RefCell::new(Vec::new()),
            local_n: Cell::new(0),
            local_hist: RefCell::new(Default::default()),
            _not_sync: PhantomData,
        };
        Ok(p)
    }

    /// The window of `pid` and its generation, if the host gives it to
    /// this program (as [`Attachment::peer_page`]).
    fn window_of(&self, pid: Pid) -> Option<(u32, Arc<Shm>)> {
        let r = self
            .ask([kind::ASK, 0, ask::WINDOW_OF, pid.0, 0, 0, 0, 0], &[], &[])
            .ok()?;
        let g = r.words[4];
        let fd = r.fds.into_iter().next()?;
        let w = Shm::adopt_with(&fd, MIN_WINDOW, MAX_WINDOW, true).ok()?;
        Some((g, Arc::new(w)))
    }

    /// The peer page of `pid`, if the host gives it to this program (a
    /// process of the same uid).
    fn peer_page(&self, pid: Pid) -> Option<Arc<Shm>> {
        let r = self
            .ask([kind::ASK, 0, ask::PEER_PAGE, pid.0, 0, 0, 0, 0], &[], &[])
            .ok()?;
        let fd = r.fds.into_iter().next()?;
        Shm::adopt(&fd, PEER_BYTES, PEER_BYTES).ok().map(Arc::new)
    }

    /// The host's keys and its packet counter's page, asked for once
    /// (a keyed host's direct path, docs/PROTOCOL.md §8f).
    fn lent_sealer(&self) -> Option<Sealer> {
        let mut g = lock(&self.sealer);
        if let Some(s) = &*g {
            return s.clone();
        }
        let s = self
            .ask([kind::ASK, 0, ask::KEYS, 0, 0, 0, 0, 0], &[], &[])
            .ok()
            .and_then(|r| {
                let cfg = AuthConfig::from_bytes(&r.payload)?;
                let page = CounterPage::adopt(r.fds.first()?).ok()?;
                Some(Sealer::lent(cfg, Arc::new(page), self.pace.clock.now()))
            });
        *g = Some(s.clone());
        s
    }

    /// Traces `kind` at wall-clock time `t` for the host's trace, sent in
    /// batches of 32 KiB (and with each report sent now).
    pub(crate) fn trace(&self, t: u64, kind: trace::Kind) {
        let mut b = lock(&self.traces);
        trace::write_line(&mut *b, t, self.host.0, kind);
        if b.len() >= TRACE_BYTES {
            let lines = std::mem::take(&mut *b);
            drop(b);
            self.send_record(kind::TRACE, &lines);
        }
    }

    fn send_record(&self, what: u32, payload: &[u8]) {
        let words = [what, 0, 0, 0, 0, 0, 0, 0];
        let _g = lock(&self.send_lock);
        // (Lost with the host: they go with it.)
        let _ = control::send(&self.sock, &words, payload, &[]);
    }

    /// Returns once the host has taken every record sent before (it takes
    /// a connection's records in order; a question's answer follows them).
    pub(crate) fn synced(&self) {
        let _ = self.question(ask::PROCESS_EXISTS, 0, &[]);
    }

    /// Adds `evs` (emptied) to what is reported to the host, and sends
    /// the report if it has grown large or `now`.
    pub(crate) fn report(&self, evs: &mut Vec<Ev>, now: bool) {
        let mut b = lock(&self.reports);
        for e in evs.drain(..) {
            e.encode(&mut b);
        }
        if !b.is_empty() && (now || b.len() >= REPORT_BYTES) {
            let payload = std::mem::take(&mut *b);
            drop(b);
            self.send_record(kind::TALLY, &payload);
        } else {
            drop(b);
        }
        if now && self.tracing {
            let lines = std::mem::take(&mut *lock(&self.traces));
            if !lines.is_empty() {
                self.send_record(kind::TRACE, &lines);
            }
        }
    }

    /// Detaches: the host destroys this program's processes; their calls
    /// fail with `Shutdown`.
    pub(crate) fn close(&self) {
        self.report(&mut Vec::new(), true);
        self.closed.store(true, Ordering::SeqCst);
        let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Both);
    }
}

/// Whether a shortcut is used: peer pages (`VKERNEL_ATTACH_PEER`) and
/// direct remote Sends (`VKERNEL_ATTACH_DIRECT`) are on unless the
/// variable says off, to compare or to rule them out.
fn enabled(var: &str) -> bool {
    !matches!(
        std::env::var(var).as_deref(),
        Ok("0" | "off" | "no" | "false")
    )
}

/// A process hands its events to the attachment's report this many at a
/// time ([`AttachedProcess::counted`]), and the report goes to the host at
/// [`REPORT_BYTES`] (just under a record's 128 KiB): a program's counts
/// reach its host within 1024 events of each process and 7680 of the
/// program (a direct Send makes about 4), and whenever it asks the host
/// for statistics or ends. Rarely: a report wakes a host thread, which on
/// a small machine takes a CPU from the exchanges it counts.
const PENDING_EVENTS: usize = 1024;
const REPORT_BYTES: usize = 7680 * Ev::BYTES;
/// One peer-page exchange in this many is timed for the host's latency
/// histogram, standing for them all (the count is exact).
const LATENCY_SAMPLE: u64 = 8;
/// Peer-page exchanges counted before they go to `pending` as one event.
const LOCAL_BATCH: u64 = 4096;
/// Trace lines go to the host in batches of this many bytes (or sooner).
const TRACE_BYTES: usize = 32 << 10;

/// Peer pages a process keeps mapped at most (beyond, it forgets them).
const PEER_CACHE: usize = 1024;

/// Other processes' windows a process keeps mapped at most.
const GRANT_CACHE: usize = 64;

/// Moves at least this long copy straight into the other's window
/// (smaller ones go through the host, which costs a copy less to set up).
const GRANT_MIN: usize = 64 << 10;

/// How long a sender spins for a busy receiver's inbox to open before it
/// lets the engine queue its message.
const CLAIM_SPIN: Duration = Duration::from_micros(20);

/// How often a sender that does not spin yields its CPU for a busy
/// receiver's inbox to open before it lets the engine queue its message.
const CLAIM_YIELDS: u32 = 4;

/// What a Send through a peer page came to.
enum PeerSend {
    Done(Result<Reply, IpcError>),
    /// The receiver forwarded it: send it on to `to` as from `forwarder`.
    Forwarded {
        to: Pid,
        forwarder: Pid,
    },
    /// Not this way: through the host.
    NotHere,
}

/// A process of the machine host, driven from this program.
pub(crate) struct AttachedProcess {
    at: Arc<Attachment>,
    pid: Pid,
    slot: Arc<Shm>,
    /// Bytes that travel with a call (segments, moved data, documents).
    window: RefCell<Shm>,
    seq: Cell<u32>,
    spin: Cell<SpinPolicy>,
    waits: Cell<WaitCounts>,
    send_deadline: Cell<Option<Duration>>,
    /// This process's peer page (none if the host did not take it).
    peer: Option<Arc<Shm>>,
    /// Other processes' peer pages (None: not given; use the host).
    peers: RefCell<HashMap<Pid, Option<Arc<Shm>>>>,
    /// Senders received through the inbox and not yet answered, with
    /// their exchange sequence.
    peer_rx: RefCell<HashMap<Pid, u32>>,
    peer_seq: Cell<u32>,
    principal: Cell<u32>,
    /// `restrict_senders` is in force: the engine must check senders.
    restricted: Cell<bool>,
    /// Other processes' windows mapped for granted moves, with their
    /// generation.
    windows: RefCell<HashMap<Pid, (u32, Arc<Shm>)>>,
    /// This process's socket for remote Sends, once it made one.
    direct: RefCell<Option<DirectPath>>,
    /// What it did outside the host (direct Sends, peer-page exchanges)
    /// and has not handed to the attachment's reports yet.
    pending: RefCell<Vec<Ev>>,
    /// Peer-page exchanges not yet in `pending` (without the host's
    /// latency histograms, one event reports many).
    local_n: Cell<u64>,
    /// Their latencies, if the host keeps histograms.
    local_hist: RefCell<vkernel_proto::stats::Histogram>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for AttachedProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedProcess")
            .field("pid", &self.pid)
            .finish()
    }
}

fn micros64(d: Option<Duration>) -> u64 {
    d.map_or(NONE64, |d| {
        u64::try_from(d.as_micros()).unwrap_or(NONE64 - 1)
    })
}

fn clamp32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl AttachedProcess {
    fn slot(&self) -> &Slot {
        // SAFETY: the slot mapping is SLOT_BYTES long, page-aligned, and
        // lives as long as `self`.
        unsafe { Slot::at(self.slot.as_ptr()) }
    }

    /// Runs `op` (its arguments already in the slot) and waits for it.
    fn call(&self, op: Op) -> Result<(), IpcError> {
        if let Some(e) = self.at.gone() {
            return Err(e);
        }
        let s = self.slot();
        let seq = self.seq.get().wrapping_add(1);
        s.op.store(op as u32, Ordering::Relaxed);
        publish(&s.req, &s.host_parked, seq);
        self.seq.set(seq);
        let mut policy = self.spin.get();
        let r = self.at.pace.wait(
            &s.done,
            &s.prog_parked,
            seq.wrapping_sub(1),
            &mut policy,
            || self.at.gone().is_some(),
        );
        self.spin.set(policy);
        let mut w = self.waits.get();
        match r {
            Waited::Spun => w.unblocked += 1,
            Waited::Blocked => w.blocked += 1,
            Waited::Gone => {
                return Err(self.at.gone().unwrap_or(IpcError::HostLost));
            }
        }
        self.waits.set(w);
        if s.done.load(Ordering::Acquire) != seq {
            // A host that answers out of turn is broken or hostile.
            return Err(IpcError::HostLost);
        }
        s.result()
    }

    /// Makes the window at least `n` bytes long.
    fn window_for(&self, n: usize) -> Result<(), IpcError> {
        if n <= self.window.borrow().len() {
            return Ok(());
        }
        if n > MAX_WINDOW {
            return Err(IpcError::SegmentTooLarge { max: MAX_WINDOW });
        }
        let len = n.next_power_of_two().clamp(MIN_WINDOW, MAX_WINDOW);
        let (w, fd) = Shm::create("vkernel-window", len).map_err(|_| IpcError::NoResources)?;
        self.at.ask(
            [kind::WINDOW, 0, self.pid.0, 0, 0, 0, 0, 0],
            &[],
            &[fd.as_fd()],
        )?;
        self.call(Op::AdoptWindow)?;
        *self.window.borrow_mut() = w;
        Ok(())
    }

    /// Copies `data` to the start of the window.
    fn put(&self, data: &[u8]) -> Result<(), IpcError> {
        self.window_for(data.len())?;
        let w = self.window.borrow();
        // SAFETY: no call is in flight, so the host does not use the
        // window now; bytes are only copied.
        unsafe { w.bytes_mut(data.len()) }.copy_from_slice(data);
        Ok(())
    }

    /// Copies the start of the window into `out` (at most `n` bytes).
    fn get(&self, out: &mut [u8], n: usize) -> usize {
        let w = self.window.borrow();
        let n = n.min(out.len()).min(w.len());
        // SAFETY: as in `put`: the call has completed.
        out[..n].copy_from_slice(unsafe { &w.bytes_mut(n)[..n] });
        n
    }

    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    pub(crate) fn set_spin(&self, d: Duration) {
        self.spin.set(SpinPolicy::fixed(d));
        self.set_host_spin(0, d);
    }

    pub(crate) fn set_spin_auto(&self, cap: Duration) {
        self.spin.set(SpinPolicy::adaptive(cap));
        self.set_host_spin(1, cap);
    }

    fn set_host_spin(&self, adaptive: u32, d: Duration) {
        let s = self.slot();
        s.set_arg(0, adaptive);
        s.set_arg64(1, micros64(Some(d)));
        let _ = self.call(Op::SetSpin);
    }

    pub(crate) fn wait_counts(&self) -> WaitCounts {
        self.waits.get()
    }

    pub(crate) fn set_principal(&self, principal: u32) {
        self.slot().set_arg(0, principal);
        if self.call(Op::SetPrincipal).is_ok() {
            self.principal.set(principal);
        }
    }

    pub(crate) fn restrict_senders(&self, principals: Option<Vec<u32>>) {
        self.restricted.set(principals.is_some());
        let s = self.slot();
        match principals {
            None => s.set_arg(0, u32::MAX),
            Some(list) => {
                let bytes: Vec<u8> = list.iter().flat_map(|p| p.to_le_bytes()).collect();
                if self.put(&bytes).is_err() {
                    return;
                }
                s.set_arg(0, clamp32(list.len()));
            }
        }
        let _ = self.call(Op::RestrictSenders);
    }

    pub(crate) fn set_socket_reader(&self, on: bool) {
        self.slot().set_arg(0, u32::from(on));
        let _ = self.call(Op::SetSocketReader);
    }

    pub(crate) fn set_send_deadline(&self, d: Option<Duration>) {
        self.send_deadline.set(d);
    }

    pub(crate) fn send_deadline(&self) -> Option<Duration> {
        self.send_deadline.get()
    }

    pub(crate) fn send(&self, msg: &mut Message, to: Pid) -> Result<Reply, IpcError> {
        self.send_within(msg, to, self.send_deadline.get())
    }

    pub(crate) fn send_within(
        &self,
        msg: &mut Message,
        to: Pid,
        deadline: Option<Duration>,
    ) -> Result<Reply, IpcError> {
        let (mut to, mut fwd) = (to, self.pid);
        let clock = &self.at.pace.clock;
        let at = Deadline::after_now(|| clock.now(), deadline);
        loop {
            match self.peer_send(msg, to, fwd, at) {
                PeerSend::Done(r) => return r,
                PeerSend::Forwarded { to: t, forwarder } => (to, fwd) = (t, forwarder),
                PeerSend::NotHere => break,
            }
        }
        if let Some(r) = self.direct_send(msg, &mut to, &mut fwd, at) {
            return r;
        }
        self.end_direct_lease(to);
        let s = self.slot();
        s.set_arg(0, to.0);
        // What is left of the deadline after the paths tried first.
        s.set_arg64(1, micros64(at.left(clock.now())));
        s.set_arg(3, fwd.0);
        s.set_arg(4, u32::from(fwd != self.pid));
        s.set_msg(msg);
        let r = self.call(Op::Send);
        let from = Pid(s.out(0));
        // A local receiver may have forwarded it to another host, which
        // the host's engine did with a number newer than the block.
        if r.is_err() || from.host() != self.at.host {
            self.end_direct_lease(Pid(0));
        }
        r?;
        *msg = s.rmsg();
        Ok(Reply {
            from,
            seg_bytes: s.out(1) as usize,
        })
    }

    /// A remote Send on this process's own socket, if the host allows it
    /// (see `direct.rs`). `None`: through the host, to `to` as forwarded
    /// by `fwd` (changed if the receiver forwarded it meanwhile).
    fn direct_send(
        &self,
        msg: &mut Message,
        to: &mut Pid,
        fwd: &mut Pid,
        at: Deadline,
    ) -> Option<Result<Reply, IpcError>> {
        if !to.is_process()
            || to.host() == self.at.host
            || !self.at.direct_on.load(Ordering::Relaxed)
        {
            return None;
        }
        if let Some(e) = self.slot().ended() {
            return Some(Err(e));
        }
        let refuse = || {
            self.at.direct_on.store(false, Ordering::Relaxed);
            None
        };
        let now = self.at.pace.clock.now();
        let mut path = self.direct.borrow_mut();
        if path.is_none() {
            let peers = self.at.peer_times.clone();
            match self.at.host_addr.map(|a| DirectPath::new(a, peers)) {
                Some(Ok(p)) => *path = Some(p),
                _ => return refuse(),
            }
        }
        let path = path.as_mut()?;
        let host = to.host();
        if let Some(n) = path.must_ask(host, now) {
            let words = [
                kind::ASK,
                0,
                ask::DIRECT,
                u32::from(host.0),
                self.pid.0,
                n,
                u32::from(path.port()),
                0,
            ];
            // What it learned of `host` goes back with the question.
            let back = path.lend_back(host).unwrap_or_default();
            match self.at.ask(words, back.as_bytes(), &[]) {
                Ok(r) => {
                    // ADDR;timers=…[;keyed][;faults=SPEC] (PROTOCOL.md §8f)
                    let doc = std::str::from_utf8(&r.payload).unwrap_or_default();
                    let mut parts = doc.split(';');
                    let loc = parts.next().and_then(|a| a.parse().ok());
                    let mut keyed = false;
                    for p in parts {
                        match p.split_once('=') {
                            Some(("timers", t)) => path.set_timers(t),
                            Some(("now", t)) => path.set_host_clock(t, now),
                            Some(("rtt", w)) => path.take_lent(host, w, now),
                            Some(("faults", f)) => path.set_faults(f),
                            None if p == "keyed" => keyed = true,
                            _ => {}
                        }
                    }
                    // A keyed host: its datagrams are sealed with its keys
                    // and its one counter, lent once to the program.
                    let sealer = if keyed { self.at.lent_sealer() } else { None };
                    if keyed && sealer.is_none() {
                        return refuse();
                    }
                    path.set_sealer(sealer);
                    path.learn(host, loc, r.words[4], r.words[5].min(n), now);
                }
                // The call through the host will say so.
                Err(IpcError::HostLost | IpcError::Shutdown) => return None,
                Err(_) => return refuse(),
            }
        }
        if !path.can_send(host) {
            return None;
        }
        let (mut policy, mut waits) = (self.spin.get(), self.waits.get());
        // (The host marks the slot when it destroys the process.)
        let gone = || self.at.gone().or_else(|| self.slot().ended());
        let trace = |tx: bool, d: &[u8]| {
            if let Some(k) = trace::datagram_kind(tx, d) {
                self.at.trace(trace::wall_us(), k);
            }
        };
        let mut w = Waiting {
            pace: &self.at.pace,
            policy: &mut policy,
            waits: &mut waits,
            gone: &gone,
            deadline: at,
            trace: self
                .at
                .tracing
                .then_some(&trace as &super::direct::TraceFn<'_>),
        };
        let t0 = trace::wall_us();
        let went = path.send(
            &mut w,
            &self.at.net_counters,
            self.pid,
            *to,
            *fwd,
            *msg,
            self.principal.get(),
        );
        self.counted(path.events());
        self.spin.set(policy);
        self.waits.set(waits);
        if self.at.tracing && !matches!(went, Went::Forwarded { .. }) {
            let by = match &went {
                Went::Done(Ok(info)) => info.from,
                _ => *to,
            };
            let ok = matches!(went, Went::Done(Ok(_)));
            self.at
                .trace(t0, trace::phase_kind(Phase::Send, self.pid, *to, true));
            let end = trace::wall_us();
            self.at
                .trace(end, trace::phase_kind(Phase::Complete, self.pid, by, ok));
        }
        match went {
            Went::Done(r) => Some(r.map(|info| {
                *msg = info.msg;
                Reply {
                    from: info.from,
                    seg_bytes: 0,
                }
            })),
            Went::Forwarded {
                to: t,
                forwarder,
                msg: m,
            } => {
                (*to, *fwd, *msg) = (t, forwarder, m);
                None
            }
        }
    }

    /// The host is about to send for this process (with a number newer
    /// than any reserved): the direct path asks for new ones next time.
    /// Only a Send the host makes to another host or a group carries a
    /// sequence number: one to this host's process does not, unless its
    /// receiver forwards it away (then the caller ends the block after).
    fn end_direct_lease(&self, to: Pid) {
        if to.is_process() && to.host() == self.at.host {
            return;
        }
        if let Some(p) = self.direct.borrow_mut().as_mut() {
            p.end_lease();
        }
    }

    pub(crate) fn send_with_segment_within(
        &self,
        msg: &mut Message,
        to: Pid,
        seg: Segment<'_>,
        append: usize,
        deadline: Option<Duration>,
    ) -> Result<Reply, IpcError> {
        let (data, access): (&[u8], u32) = match &seg {
            Segment::Read(b) => (b, 1),
            Segment::Write(b) => (b, 2),
            Segment::ReadWrite(b) => (b, 3),
        };
        let len = data.len();
        self.put(data)?;
        self.end_direct_lease(to);
        let s = self.slot();
        s.set_arg(0, to.0);
        s.set_arg(1, access);
        s.set_arg(2, clamp32(len));
        s.set_arg64(3, append.min(u64::MAX as usize) as u64);
        s.set_arg64(5, micros64(deadline));
        s.set_msg(msg);
        let r = self.call(Op::SendSegment);
        // What the receiver wrote (by MoveTo or with its reply) comes back
        // even when the exchange then failed, as it would in place.
        match seg {
            Segment::Write(b) | Segment::ReadWrite(b) => {
                self.get(b, len);
            }
            Segment::Read(_) => {}
        }
        r?;
        *msg = s.rmsg();
        Ok(Reply {
            from: Pid(s.out(0)),
            seg_bytes: (s.out(1) as usize).min(len),
        })
    }

    pub(crate) fn receive(&self, msg: &mut Message) -> Result<Incoming, IpcError> {
        if let Some(r) = self.peer_receive(msg) {
            return r;
        }
        self.receive_op(msg, None, None, usize::MAX).map(|(i, _)| i)
    }

    pub(crate) fn receive_with_segment_upto(
        &self,
        msg: &mut Message,
        buf: &mut [u8],
        upto: usize,
    ) -> Result<Incoming, IpcError> {
        // A plain Send may come through the inbox (with no segment, so no
        // bytes); one with a segment comes through the host, which then
        // closes the inbox.
        if let Some(r) = self.peer_receive(msg) {
            return r;
        }
        self.receive_op(msg, None, Some(buf), upto).map(|(i, _)| i)
    }

    pub(crate) fn receive_specific(
        &self,
        msg: &mut Message,
        from: Pid,
    ) -> Result<Option<Incoming>, IpcError> {
        let (i, found) = self.receive_op(msg, Some(from), None, usize::MAX)?;
        Ok(found.then_some(i))
    }

    /// Receive in all its forms; the flag is false when ReceiveSpecific's
    /// process does not exist.
    fn receive_op(
        &self,
        msg: &mut Message,
        from: Option<Pid>,
        buf: Option<&mut [u8]>,
        upto: usize,
    ) -> Result<(Incoming, bool), IpcError> {
        let want = buf.as_ref().map_or(0, |b| b.len());
        self.window_for(want)?;
        let s = self.slot();
        s.set_arg(0, u32::from(buf.is_some()));
        s.set_arg(1, clamp32(want));
        s.set_arg64(2, upto.min(u64::MAX as usize) as u64);
        s.set_arg(4, from.map_or(0, |p| p.0));
        s.set_arg(5, u32::from(from.is_some()));
        self.call(Op::Receive)?;
        let seg_bytes = (s.out(1) as usize).min(want);
        if let Some(b) = buf {
            self.get(b, seg_bytes);
        }
        *msg = s.rmsg();
        Ok((
            Incoming {
                from: Pid(s.out(0)),
                seg_bytes,
                forwarder: Pid(s.out(2)),
                principal: s.out(3),
            },
            s.out(4) != 0,
        ))
    }

    pub(crate) fn reply(&self, msg: &Message, to: Pid) -> Result<(), IpcError> {
        if let Some(seq) = self.peer_rx.borrow_mut().remove(&to) {
            let how = Outcome::Replied {
                from: self.pid,
                msg: *msg,
            };
            if self.at.tracing {
                let k = trace::phase_kind(Phase::Reply, to, self.pid, true);
                self.at.trace(trace::wall_us(), k);
            }
            return self.peer_finish(to, seq, how);
        }
        let s = self.slot();
        s.set_arg(0, to.0);
        s.set_msg(msg);
        self.call(Op::Reply)
    }

    pub(crate) fn reply_with_segment(
        &self,
        msg: &Message,
        to: Pid,
        offset: u32,
        data: &[u8],
    ) -> Result<(), IpcError> {
        if self.peer_rx.borrow().contains_key(&to) {
            // The sender granted no segment (it would have come through
            // the host): as the engine says.
            if !data.is_empty() {
                return Err(IpcError::AccessDenied(to));
            }
            return self.reply(msg, to);
        }
        self.put(data)?;
        let s = self.slot();
        s.set_arg(0, to.0);
        s.set_arg(1, offset);
        s.set_arg(2, clamp32(data.len()));
        s.set_msg(msg);
        self.call(Op::ReplySegment)
    }

    pub(crate) fn forward(&self, msg: &Message, from: Pid, to: Pid) -> Result<(), IpcError> {
        if let Some(seq) = self.peer_rx.borrow_mut().remove(&from) {
            if !to.is_process() {
                return Err(IpcError::InvalidPid(to));
            }
            // The sender sends it on, as from this forwarder.
            let how = Outcome::Forwarded {
                to,
                forwarder: self.pid,
                msg: *msg,
            };
            return self.peer_finish(from, seq, how);
        }
        let s = self.slot();
        s.set_arg(0, from.0);
        s.set_arg(1, to.0);
        s.set_msg(msg);
        self.call(Op::Forward)
    }

    pub(crate) fn move_to(&self, to: Pid, offset: u32, src: &[u8]) -> Result<usize, IpcError> {
        if self.peer_rx.borrow().contains_key(&to) {
            return Err(IpcError::AccessDenied(to));
        }
        if let Some(r) = self.granted_move(to, offset, src.len(), |w| w.copy_from_slice(src)) {
            return r;
        }
        self.put(src)?;
        let s = self.slot();
        s.set_arg(0, to.0);
        s.set_arg(1, offset);
        s.set_arg(2, clamp32(src.len()));
        self.call(Op::MoveTo)?;
        Ok(s.out(0) as usize)
    }

    pub(crate) fn move_from(
        &self,
        from: Pid,
        offset: u32,
        dest: &mut [u8],
    ) -> Result<usize, IpcError> {
        if self.peer_rx.borrow().contains_key(&from) {
            return Err(IpcError::AccessDenied(from));
        }
        if let Some(r) = self.granted_move_from(from, offset, dest) {
            return r;
        }
        self.window_for(dest.len())?;
        let s = self.slot();
        s.set_arg(0, from.0);
        s.set_arg(1, offset);
        s.set_arg(2, clamp32(dest.len()));
        self.call(Op::MoveFrom)?;
        let n = s.out(0) as usize;
        Ok(self.get(dest, n))
    }

    pub(crate) fn set_pid(&self, logical: u32, pid: Pid, scope: Scope) {
        let s = self.slot();
        s.set_arg(0, logical);
        s.set_arg(1, pid.0);
        s.set_arg(2, super::scope_code(scope));
        let _ = self.call(Op::SetPid);
    }

    pub(crate) fn get_pid(&self, logical: u32, scope: Scope) -> Result<Pid, IpcError> {
        let s = self.slot();
        s.set_arg(0, logical);
        s.set_arg(1, super::scope_code(scope));
        self.call(Op::GetPid)?;
        Ok(Pid(s.out(0)))
    }

    pub(crate) fn allocate_group_id(&self) -> Result<Pid, IpcError> {
        self.call(Op::AllocateGroup)?;
        Ok(Pid(self.slot().out(0)))
    }

    pub(crate) fn join_group(&self, group: Pid, pid: Pid) -> Result<(), IpcError> {
        self.group_op(Op::JoinGroup, group, pid)
    }

    pub(crate) fn leave_group(&self, group: Pid, pid: Pid) -> Result<(), IpcError> {
        self.group_op(Op::LeaveGroup, group, pid)
    }

    fn group_op(&self, op: Op, group: Pid, pid: Pid) -> Result<(), IpcError> {
        let s = self.slot();
        s.set_arg(0, group.0);
        s.set_arg(1, pid.0);
        self.call(op)
    }

    pub(crate) fn get_reply(&self, msg: &mut Message) -> Option<Pid> {
        self.call(Op::GetReply).ok()?;
        let s = self.slot();
        if s.out(0) == 0 {
            return None;
        }
        *msg = s.rmsg();
        Some(Pid(s.out(1)))
    }

    pub(crate) fn host_stats(&self, host: HostId) -> Result<String, IpcError> {
        self.report_now();
        // (The slot is another channel: wait until the host has the report.)
        self.at.synced();
        for _ in 0..4 {
            self.slot().set_arg(0, u32::from(host.0));
            match self.call(Op::HostStats) {
                Ok(()) => {
                    let n = self.slot().out(0) as usize;
                    let mut b = vec![0u8; n];
                    let n = self.get(&mut b, n);
                    b.truncate(n);
                    return String::from_utf8(b).map_err(|_| IpcError::Refused(self.pid));
                }
                // The document is larger than the window: make room.
                Err(IpcError::SegmentTooLarge { max }) if max > self.window.borrow().len() => {
                    self.window_for(max)?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(IpcError::SegmentTooLarge {
            max: self.window.borrow().len(),
        })
    }

    pub(crate) fn select_hosts(
        &self,
        max: usize,
        limit: Duration,
        idle_load: f64,
    ) -> Result<Vec<HostLoad>, IpcError> {
        let s = self.slot();
        s.set_arg(0, clamp32(max));
        s.set_arg64(1, micros64(Some(limit)));
        s.set_arg64(3, idle_load.to_bits());
        self.call(Op::SelectHosts)?;
        let n = s.out(0) as usize;
        let mut b = vec![0u8; n * super::HOST_LOAD_BYTES];
        let want = b.len();
        let got = self.get(&mut b, want);
        Ok(b[..got]
            .chunks_exact(super::HOST_LOAD_BYTES)
            .map(super::host_load_from)
            .collect())
    }

    pub(crate) fn get_time(&self) -> Duration {
        match self.call(Op::GetTime) {
            Ok(()) => Duration::from_micros(self.slot().out64(0)),
            Err(_) => Duration::ZERO,
        }
    }

    pub(crate) fn process_exists(&self, pid: Pid) -> Result<bool, IpcError> {
        self.slot().set_arg(0, pid.0);
        self.call(Op::ProcessExists)?;
        Ok(self.slot().out(0) != 0)
    }

    pub(crate) fn destroy(&self, pid: Pid) -> Result<(), IpcError> {
        self.slot().set_arg(0, pid.0);
        self.call(Op::Destroy)
    }
}

/// The shared-memory path (see `peer.rs`).
impl AttachedProcess {
    fn own_peer(&self) -> Option<&Peer> {
        // SAFETY: the page mapping is PEER_BYTES long, page-aligned, and
        // lives as long as `self`.
        self.peer.as_ref().map(|p| unsafe { Peer::at(p.as_ptr()) })
    }

    /// `pid`'s peer page, asked of the host once.
    fn peer_of(&self, pid: Pid) -> Option<Arc<Shm>> {
        if let Some(v) = self.peers.borrow().get(&pid) {
            return v.clone();
        }
        let v = self.at.peer_page(pid);
        let mut m = self.peers.borrow_mut();
        if m.len() >= PEER_CACHE {
            m.clear();
        }
        m.insert(pid, v.clone());
        v
    }

    /// Sends through `to`'s inbox if it waits there.
    fn peer_send(&self, msg: &mut Message, to: Pid, fwd: Pid, deadline: Deadline) -> PeerSend {
        // (The clock only when the host keeps latency histograms.)
        // One exchange in LATENCY_SAMPLE is timed for the host's
        // histogram (two clock reads are a tenth of a peer-page exchange).
        let timed = self.at.metrics && self.local_n.get().is_multiple_of(LATENCY_SAMPLE);
        let start = if timed { self.at.pace.clock.now() } else { 0 };
        let t0 = if self.at.tracing { trace::wall_us() } else { 0 };
        let Some(mine) = self.own_peer() else {
            return PeerSend::NotHere;
        };
        if to.host() != self.at.host
            || !to.is_process()
            || to == self.pid
            || self.at.gone().is_some()
        {
            return PeerSend::NotHere;
        }
        let Some(page) = self.peer_of(to) else {
            return PeerSend::NotHere;
        };
        // SAFETY: adopted as exactly PEER_BYTES, page-aligned, held here.
        let p = unsafe { Peer::at(page.as_ptr()) };
        let seq = peer::next_seq(self.peer_seq.get());
        self.peer_seq.set(seq);
        mine.rpeer.store(to.0, Ordering::Relaxed);
        mine.rst
            .store(peer::rst(seq, peer::WAITING), Ordering::SeqCst);
        if !self.claim_soon(p) {
            mine.rst.store(peer::rst(seq, peer::IDLE), Ordering::SeqCst);
            if p.tag() == peer::DEAD {
                self.peers.borrow_mut().remove(&to);
            }
            return PeerSend::NotHere;
        }
        // As the engine does for a Send without a segment: no segment
        // flags, and words 6 and 7 (the kernel's segment words) zero.
        let mut out = *msg;
        out.set_segment(vkernel_proto::SegAccess::NONE, 0);
        if !p.fill(self.pid, seq, self.principal.get(), fwd, &out) {
            mine.rst.store(peer::rst(seq, peer::IDLE), Ordering::SeqCst);
            self.peers.borrow_mut().remove(&to);
            return PeerSend::Done(Err(IpcError::NoSuchProcess(to)));
        }
        let mut policy = self.spin.get();
        let mut w = self.waits.get();
        let mut deadline = deadline;
        let state = loop {
            let r = mine.rst.load(Ordering::Acquire);
            let state = r & 7;
            if r >> 3 != seq || !matches!(state, peer::WAITING | peer::REPLYING) {
                break state;
            }
            match self.at.pace.wait_until(
                &mine.rst,
                &mine.tx_parked,
                r,
                &mut policy,
                || self.at.gone().is_some(),
                deadline,
            ) {
                Waited::Spun => w.unblocked += 1,
                Waited::Blocked => w.blocked += 1,
                Waited::Gone => {
                    // Abandon the exchange, unless its answer is already
                    // being written (then it is taken, as the engine takes
                    // a reply that beat the deadline).
                    let cancelled = mine
                        .rst
                        .compare_exchange(
                            peer::rst(seq, peer::WAITING),
                            peer::rst(seq, peer::IDLE),
                            Ordering::SeqCst,
                            Ordering::Relaxed,
                        )
                        .is_ok();
                    if let Some(e) = self.at.gone() {
                        return PeerSend::Done(Err(e));
                    }
                    if cancelled {
                        // Not taken yet? Then the receiver never sees it.
                        p.withdraw(self.pid);
                        return PeerSend::Done(Err(IpcError::Deadline(to)));
                    }
                    deadline = Deadline::NONE;
                }
            }
        };
        self.spin.set(policy);
        self.waits.set(w);
        match mine.outcome(state) {
            Outcome::Replied { from, msg: m } => {
                *msg = m;
                // Counted here and reported in a few events per batch
                // (no report, so no host wake-up, per exchange).
                if timed {
                    let latency = self.at.pace.clock.now().saturating_sub(start);
                    // (Standing for the LATENCY_SAMPLE exchanges around it.)
                    let mut h = self.local_hist.borrow_mut();
                    let b = vkernel_proto::stats::Histogram::bucket(latency);
                    h.counts[b] += LATENCY_SAMPLE;
                    h.sums[b] += latency * LATENCY_SAMPLE;
                }
                let n = self.local_n.get() + 1;
                self.local_n.set(n);
                if n >= LOCAL_BATCH {
                    self.flush_local();
                }
                if self.at.tracing {
                    self.at
                        .trace(t0, trace::phase_kind(Phase::Send, self.pid, to, true));
                    let end = trace::wall_us();
                    self.at.trace(
                        end,
                        trace::phase_kind(Phase::Complete, self.pid, from, true),
                    );
                }
                PeerSend::Done(Ok(Reply { from, seg_bytes: 0 }))
            }
            // (The host gone: that is why, whatever the receiver said.)
            Outcome::Failed(e) => PeerSend::Done(Err(self.at.gone().unwrap_or(e))),
            Outcome::Forwarded {
                to,
                forwarder,
                msg: m,
            } => {
                *msg = m;
                PeerSend::Forwarded { to, forwarder }
            }
        }
    }

    /// Claims `p`'s inbox, waiting a little for a receiver that is busy
    /// but will soon receive again (a server between Reply and Receive).
    fn claim_soon(&self, p: &Peer) -> bool {
        if p.claim(self.pid) {
            return true;
        }
        let policy = self.spin.get();
        let spin = policy.wants_to_spin();
        // An adaptive policy that stopped spinning has learned that waits
        // here are long: go through the host at once, as before.
        if !spin && policy.is_adaptive() {
            return false;
        }
        let clock = &self.at.pace.clock;
        let start = clock.now();
        let limit = CLAIM_SPIN.as_micros() as u64;
        let mut i: u32 = 0;
        // Only while the receiver is busy and nothing queues ahead of us.
        while p.tag() == peer::CLOSED && p.queued.load(Ordering::Relaxed) == 0 {
            i = i.wrapping_add(1);
            if !spin {
                // Told not to spin, but the receiver may be one this
                // thread's wake-up preempted on this CPU just before it
                // opened its inbox: let it run, briefly. (Without this,
                // most blocking exchanges went through the host.)
                if i > CLAIM_YIELDS {
                    return false;
                }
                std::thread::yield_now();
                continue;
            }
            if i.is_multiple_of(64) && clock.now().saturating_sub(start) >= limit {
                return false;
            }
            std::hint::spin_loop();
        }
        p.claim(self.pid)
    }

    /// A plain Receive through the inbox, unless messages wait in the
    /// engine (or the engine must check senders).
    fn peer_receive(&self, msg: &mut Message) -> Option<Result<Incoming, IpcError>> {
        let p = self.own_peer()?;
        if self.restricted.get() || p.queued.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let mut bell = p.bell.load(Ordering::SeqCst);
        if !p.open() {
            return (p.tag() == peer::DEAD).then(|| Err(p.dead_error()));
        }
        // A message the host queued meanwhile goes first (it closes an
        // open inbox when it queues one; this covers the moment before).
        if p.queued.load(Ordering::SeqCst) != 0 && p.close_if_open() {
            return None;
        }
        let mut policy = self.spin.get();
        let mut w = self.waits.get();
        let r = loop {
            match p.tag() {
                peer::OPEN | peer::CLAIMED => {
                    match self
                        .at
                        .pace
                        .wait(&p.bell, &p.rx_parked, bell, &mut policy, || {
                            self.at.gone().is_some()
                        }) {
                        Waited::Spun => w.unblocked += 1,
                        Waited::Blocked => w.blocked += 1,
                        Waited::Gone => {
                            p.close_if_open();
                            break Some(Err(self.at.gone().unwrap_or(IpcError::HostLost)));
                        }
                    }
                    bell = p.bell.load(Ordering::SeqCst);
                }
                peer::FULL => {
                    let Some(i): Option<Inbound> = p.take() else {
                        // Withdrawn by its sender: the inbox is open again.
                        bell = p.bell.load(Ordering::SeqCst);
                        continue;
                    };
                    self.peer_rx.borrow_mut().insert(i.from, i.seq);
                    *msg = i.msg;
                    if self.at.tracing {
                        let k = trace::phase_kind(Phase::Deliver, i.from, self.pid, true);
                        self.at.trace(trace::wall_us(), k);
                    }
                    break Some(Ok(Incoming {
                        from: i.from,
                        seg_bytes: 0,
                        forwarder: i.forwarder,
                        principal: i.principal,
                    }));
                }
                peer::DEAD => break Some(Err(p.dead_error())),
                // The host closed it: a message waits in the engine.
                _ => break None,
            }
        };
        self.spin.set(policy);
        self.waits.set(w);
        r
    }

    /// MoveTo/MoveFrom straight between this program's memory and the
    /// other process's window, mapped here, if the host grants it (same
    /// uid, peer pages, the other's Send lending its window now): one copy
    /// instead of two. `None`: not granted; move through the host.
    fn granted_move(
        &self,
        other: Pid,
        offset: u32,
        n: usize,
        copy: impl FnOnce(&mut [u8]),
    ) -> Option<Result<usize, IpcError>> {
        self.grant(other, offset, n, true).map(|r| {
            r.map(|(w, off)| {
                // SAFETY: the host granted [off, off + n) of the window for
                // the other's outstanding Send, during which it does not
                // touch those bytes; bytes are only copied.
                copy(unsafe { &mut w.bytes_mut(off + n)[off..] });
                n
            })
        })
    }

    fn granted_move_from(
        &self,
        other: Pid,
        offset: u32,
        dest: &mut [u8],
    ) -> Option<Result<usize, IpcError>> {
        let n = dest.len();
        self.grant(other, offset, n, false).map(|r| {
            r.map(|(w, off)| {
                // SAFETY: as in `granted_move`.
                dest.copy_from_slice(unsafe { &w.bytes_mut(off + n)[off..] });
                n
            })
        })
    }

    /// Asks the host for a grant; returns the other's window (mapped,
    /// checked to hold the range) and the range's start.
    fn grant(
        &self,
        other: Pid,
        offset: u32,
        n: usize,
        write: bool,
    ) -> Option<Result<(Arc<Shm>, usize), IpcError>> {
        if n < GRANT_MIN || self.peer.is_none() || other.host() != self.at.host {
            return None;
        }
        let s = self.slot();
        s.set_arg(0, other.0);
        s.set_arg(1, offset);
        s.set_arg(2, clamp32(n));
        s.set_arg(3, u32::from(write));
        match self.call(Op::MoveGrant) {
            Ok(()) => {}
            Err(IpcError::Refused(_)) => return None,
            Err(e) => return Some(Err(e)),
        }
        let generation = s.out(0);
        let cached = self
            .windows
            .borrow()
            .get(&other)
            .filter(|(g, _)| *g == generation)
            .map(|(_, w)| w.clone());
        let w = match cached {
            Some(w) => w,
            None => {
                let (g, w) = self.at.window_of(other)?;
                let mut m = self.windows.borrow_mut();
                if m.len() >= GRANT_CACHE {
                    m.clear();
                }
                m.insert(other, (g, w.clone()));
                if g != generation {
                    // It grew meanwhile: the host's answer is stale.
                    return None;
                }
                w
            }
        };
        let off = offset as usize;
        if off.checked_add(n).is_none_or(|end| end > w.len()) {
            return Some(Err(IpcError::OutOfBounds(other)));
        }
        Some(Ok((w, off)))
    }

    /// Ends exchange `seq` of `to`, received through the inbox.
    fn peer_finish(&self, to: Pid, seq: u32, how: Outcome) -> Result<(), IpcError> {
        let page = self.peer_of(to).ok_or(IpcError::NotAwaitingReply(to))?;
        // SAFETY: adopted as exactly PEER_BYTES, page-aligned, held here.
        let p = unsafe { Peer::at(page.as_ptr()) };
        if p.finish(seq, how) {
            Ok(())
        } else {
            Err(IpcError::NotAwaitingReply(to))
        }
    }
}

impl AttachedProcess {
    /// Takes `evs` (emptied) into the process's pending events, handing
    /// them to the attachment's report every [`PENDING_EVENTS`].
    fn counted(&self, evs: &mut Vec<Ev>) {
        if evs.is_empty() {
            return;
        }
        let mut p = self.pending.borrow_mut();
        p.append(evs);
        if p.len() >= PENDING_EVENTS {
            self.at.report(&mut p, false);
        }
    }

    /// Moves the peer-page exchanges counted so far into `pending`.
    fn flush_local(&self) {
        let n = self.local_n.replace(0);
        if n == 0 {
            return;
        }
        let h = std::mem::take(&mut *self.local_hist.borrow_mut());
        let mut evs = vec![Ev::LocalExchanges(n)];
        for (b, (&count, &sum)) in h.counts.iter().zip(&h.sums).enumerate() {
            if count > 0 {
                evs.push(Ev::LocalLatency {
                    bucket: b as u8,
                    count,
                    sum,
                });
            }
        }
        self.counted(&mut evs);
    }

    /// Sends what this process counted to the host now.
    fn report_now(&self) {
        self.flush_local();
        self.at.report(&mut self.pending.borrow_mut(), true);
    }
}

impl Drop for AttachedProcess {
    fn drop(&mut self) {
        self.report_now();
        let _ = self.call(Op::Exit);
        lock(&self.at.slots).remove(&self.pid);
    }
}

/// Kernel-level questions an attached program asks its host.
impl Attachment {
    pub(crate) fn process_exists(&self, pid: Pid) -> bool {
        self.question(ask::PROCESS_EXISTS, pid.0, &[])
            .is_ok_and(|r| r.words[4] != 0)
    }

    pub(crate) fn document(&self, what: u32) -> String {
        self.report(&mut Vec::new(), true);
        self.question(what, 0, &[])
            .ok()
            .and_then(|r| String::from_utf8(r.payload).ok())
            .unwrap_or_default()
    }

    pub(crate) fn srtt(&self, host: HostId) -> Option<Duration> {
        let r = self.question(ask::SRTT, u32::from(host.0), &[]).ok()?;
        (r.words[4] != 0).then(|| Duration::from_micros(u64::from(r.words[5])))
    }

    /// Asks the machine host to add a peer: an address, or a name it then
    /// follows (the text of a [`crate::PeerSpec`]).
    pub(crate) fn add_peer(&self, peer: &str) {
        let _ = self.question(ask::ADD_PEER, 0, peer.as_bytes());
    }
}
