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

use crate::peer_exchange::PeerSend;
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

mod peer_path;
mod remote;
mod report;
mod spans;

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
    /// The host exports spans: the program reports those of its
    /// exchanges outside the host (TALLY records).
    pub(crate) spans: bool,
    /// The host takes DETACH (else closing shuts the socket down).
    detach_record: bool,
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
            spans: w.words[5] & 4 != 0,
            detach_record: w.words[5] & 8 != 0,
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
            peers: crate::peer_exchange::Pages::new(),
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

    /// Detaches: the host destroys this program's processes; their calls
    /// fail with `Shutdown`.
    pub(crate) fn close(&self) {
        self.report(&mut Vec::new(), true);
        self.closed.store(true, Ordering::SeqCst);
        if self.detach_record {
            // The host ends the processes and closes its side; what the
            // processes still held here count reaches it as they end.
            self.send_record(kind::DETACH, &[]);
        } else {
            let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Both);
        }
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

/// Other processes' windows a process keeps mapped at most.
const GRANT_CACHE: usize = 64;

/// Moves at least this long copy straight into the other's window
/// (smaller ones go through the host, which costs a copy less to set up).
const GRANT_MIN: usize = 64 << 10;

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
    peers: crate::peer_exchange::Pages<Arc<Shm>>,
    /// Senders received through the inbox and not yet answered, with
    /// their exchange sequence and when it came (wall-clock µs, for its
    /// span; 0 if the host takes none).
    peer_rx: RefCell<HashMap<Pid, (u32, u64)>>,
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
        // (A process destroyed by another has no call answered: the host
        // marks the slot ended and wakes `done`.)
        let gone = || self.at.gone().or_else(|| s.ended());
        let r = self.at.pace.wait(
            &s.done,
            &s.prog_parked,
            seq.wrapping_sub(1),
            &mut policy,
            || gone().is_some(),
        );
        self.spin.set(policy);
        let mut w = self.waits.get();
        match r {
            Waited::Spun | Waited::NotYet => w.unblocked += 1,
            Waited::Blocked => w.blocked += 1,
            Waited::Gone => {
                return Err(gone().unwrap_or(IpcError::HostLost));
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
        // (No call is in flight: the host does not use the window now.)
        self.window.borrow().write_at(0, data);
        Ok(())
    }

    /// Copies the start of the window into `out` (at most `n` bytes).
    fn get(&self, out: &mut [u8], n: usize) -> usize {
        let n = n.min(out.len());
        // (The call has completed.)
        self.window.borrow().read_at(0, &mut out[..n])
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
        if let Some((seq, at)) = self.peer_rx.borrow_mut().remove(&to) {
            self.span_answered(to, seq, at);
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
        if let Some((seq, at)) = self.peer_rx.borrow_mut().remove(&from) {
            self.span_answered(from, seq, at);
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
        if let Some(r) = self.granted_move(to, offset, src) {
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

impl Drop for AttachedProcess {
    fn drop(&mut self) {
        self.report_now();
        let _ = self.call(Op::Exit);
        lock(&self.at.slots).remove(&self.pid);
    }
}
