//! The machine host's side: the attach socket, one thread per attached
//! program reading its records, and one proxy thread per attached process
//! that runs the calls its program posts in the call slot, with the same
//! `LocalProcess` code an embedded program runs.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use vkernel_proto::{HostId, IpcError, Message, Pid, SegAccess};

use crate::kernel::{destroy_local, Shared};
use crate::lent::Loan;
use crate::process::LocalProcess;
use crate::spin::SpinPolicy;

use super::control::{self, ask, kind, Record};
use super::peer::{Peer, PEER_BYTES};
use super::shm::{futex_wake, Shm};
use super::slot::{Op, Slot, NONE64, SLOT_BYTES};
use super::wait::{publish, Pace, Waited};
use super::{lock, MAX_WINDOW, MIN_WINDOW};

mod questions;
mod rights;
mod sink;

use sink::{write_received, SlotSink};

/// The longest a proxy spins for its program's next call: a program's
/// next call usually follows at once (a Reply after a Receive, the next
/// Send of a loop) or not for a long time, and a proxy spinning longer
/// only takes the CPU its program needs.
const PROXY_SPIN_CAP: Duration = Duration::from_micros(50);

/// Processes one attached program may have at once.
pub const MAX_PROCESSES_PER_PROGRAM: usize = 4096;

/// A machine host's attach socket: programs connect to it and their
/// processes become processes of this host. Dropping it closes the socket
/// and destroys every attached program's processes.
pub struct AttachServer {
    path: PathBuf,
    inner: Arc<Inner>,
    accept: Option<JoinHandle<()>>,
}

/// A program's connection: its socket and the thread serving it.
type Conn = (Arc<OwnedFd>, Option<JoinHandle<()>>);

struct Inner {
    shared: Arc<Shared>,
    listener: OwnedFd,
    stop: AtomicBool,
    /// Every connection, to end them on shutdown.
    conns: Mutex<HashMap<u64, Conn>>,
    next_conn: AtomicU64,
    pace: Arc<Pace>,
    /// This host's effective uid: programs of the same uid (or root) may
    /// change the host's configuration.
    owner_uid: u32,
    peers: Arc<Peers>,
    /// The page of the host's packet counter, when it has keys, to hand
    /// to programs that send for it.
    counter: Option<Arc<OwnedFd>>,
    /// The host keeps latency histograms (`Config::metrics`), as of its
    /// start.
    metrics: bool,
}

/// An attached process's peer page, as the host keeps it.
struct PeerEntry {
    /// Its program's uid: only programs of this uid get the page.
    uid: u32,
    page: Arc<Shm>,
    /// The file, to hand to those programs.
    fd: Arc<OwnedFd>,
    /// Its window, for movers of the same uid.
    win: Mutex<WinGrant>,
}

/// A process's window as movers may map it.
struct WinGrant {
    fd: Arc<OwnedFd>,
    /// Bumped when the process adopts a larger window.
    generation: u32,
    /// While a Send whose segment is the window's first `n` bytes is
    /// outstanding: `n`.
    segment: Option<usize>,
}

impl PeerEntry {
    fn peer(&self) -> &Peer {
        // SAFETY: the page mapping is PEER_BYTES long (checked when
        // adopted), page-aligned, and kept by this entry.
        unsafe { Peer::at(self.page.as_ptr()) }
    }
}

/// Every attached process's peer page (see `peer.rs`).
#[derive(Default)]
struct Peers {
    map: Mutex<HashMap<Pid, Arc<PeerEntry>>>,
    /// The host is going: a Send waiting for a process that goes with it
    /// fails with `HostLost`, as on the slot paths, not `NoSuchProcess`.
    host_going: AtomicBool,
    /// Exchanges through the pages of processes now gone.
    retired: AtomicU64,
    /// Moves granted straight between programs.
    grants: AtomicU64,
    /// Processes allowed to send remote Sends themselves (`ask::DIRECT`
    /// answered with sequence numbers).
    direct: AtomicU64,
}

impl Peers {
    /// `pid` was destroyed: its inbox closes for good and its own Send (if
    /// waiting there) fails, both with `err`; every Send waiting for it
    /// there fails (also one it was replying to); a claim or a message it
    /// left in an inbox is taken back.
    fn died(&self, pid: Pid, err: &IpcError) {
        let mut m = lock(&self.map);
        if let Some(e) = m.remove(&pid) {
            e.peer().die(err);
            let n = e.peer().exchanges.load(Ordering::Relaxed);
            self.retired.fetch_add(n, Ordering::Relaxed);
        }
        let why = if self.host_going.load(Ordering::Acquire) {
            IpcError::HostLost
        } else {
            IpcError::NoSuchProcess(pid)
        };
        for e in m.values() {
            let p = e.peer();
            p.fail_if_waiting_on(pid, why);
            // (A program's processes end with it: `pid` writes no more.)
            p.fail_if_replying(pid, why);
            p.sender_died(pid);
        }
    }
}

impl std::fmt::Debug for AttachServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachServer")
            .field("path", &self.path)
            .finish()
    }
}

impl AttachServer {
    /// Listens on `path` with permission bits `mode` (who may attach).
    /// A socket file left by a host that died is replaced; one a live host
    /// still serves is an error.
    pub(crate) fn start(
        shared: Arc<Shared>,
        path: &Path,
        mode: u32,
    ) -> std::io::Result<AttachServer> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::create_dir_all(dir)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
            }
        }
        let addr = rustix::net::SocketAddrUnix::new(path)?;
        if path.exists() {
            let probe = control::socket()?;
            if rustix::net::connect(&probe, &addr).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("a machine host already serves {}", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = control::socket()?;
        rustix::net::bind(&listener, &addr)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o777))?;
        }
        rustix::net::listen(&listener, 128)?;
        // A keyed host's counter moves to a page its programs share.
        let counter = if shared.with_engine(|e, _| e.is_keyed()) {
            let (page, fd) = super::shm::CounterPage::create()?;
            shared.with_engine(|e, _| e.share_counter(Arc::new(page)));
            Some(Arc::new(fd))
        } else {
            None
        };
        let metrics = shared.with_engine(|e, _| e.config().metrics);
        let inner = Arc::new(Inner {
            shared,
            listener,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            pace: Arc::new(Pace::new()),
            owner_uid: rustix::process::geteuid().as_raw(),
            peers: Arc::new(Peers::default()),
            counter,
            metrics,
        });
        let i = inner.clone();
        let accept = std::thread::Builder::new()
            .name("vk-attach-accept".into())
            .spawn(move || i.accept_loop())?;
        Ok(AttachServer {
            path: path.to_path_buf(),
            inner,
            accept: Some(accept),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Programs attached now.
    pub fn attached(&self) -> usize {
        lock(&self.inner.conns).len()
    }

    /// Exchanges between attached processes that went through their peer
    /// pages (shared memory, not the host's engine) so far.
    pub fn peer_exchanges(&self) -> u64 {
        let p = &self.inner.peers;
        let live: u64 = lock(&p.map)
            .values()
            .map(|e| e.peer().exchanges.load(Ordering::Relaxed))
            .sum();
        live + p.retired.load(Ordering::Relaxed)
    }

    /// MoveTo/MoveFrom calls between attached processes that copied
    /// straight between the programs (a window granted by the host)
    /// rather than through it, so far.
    pub fn granted_moves(&self) -> u64 {
        self.inner.peers.grants.load(Ordering::Relaxed)
    }

    /// What attached programs reported of their exchanges outside this
    /// host's engine (direct Sends and peer-page exchanges): part of the
    /// host's counters (`Kernel::stats`), here alone.
    pub fn reported(&self) -> vkernel_proto::Stats {
        let mut s = vkernel_proto::Stats::default();
        self.inner.shared.attach_tally.fold_into(&mut s);
        s
    }

    /// Blocks of sequence numbers handed to attached processes that send
    /// their remote Sends on their own sockets (docs/PROTOCOL.md §8f), so
    /// far: those exchanges do not pass through this host's engine.
    pub fn direct_grants(&self) -> u64 {
        self.inner.peers.direct.load(Ordering::Relaxed)
    }
}

impl Drop for AttachServer {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.peers.host_going.store(true, Ordering::SeqCst);
        let _ = rustix::net::shutdown(&self.inner.listener, rustix::net::Shutdown::Both);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let conns: Vec<_> = lock(&self.inner.conns).drain().collect();
        for (_, (fd, _)) in &conns {
            let _ = rustix::net::shutdown(&**fd, rustix::net::Shutdown::Both);
        }
        for (_, (_, h)) in conns {
            if let Some(h) = h {
                let _ = h.join();
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Inner {
    fn accept_loop(self: Arc<Self>) {
        while !self.stop.load(Ordering::Acquire) {
            let fd =
                match rustix::net::accept_with(&self.listener, rustix::net::SocketFlags::CLOEXEC) {
                    Ok(fd) => Arc::new(fd),
                    Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => continue,
                    Err(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE) => {
                        tracing::warn!(
                            "attach: out of file descriptors; refusing programs for 100 ms"
                        );
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    Err(_) => break,
                };
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
            let me = self.clone();
            let f = fd.clone();
            // Registered under the lock the thread takes to remove itself,
            // so its removal comes after this.
            let mut conns = lock(&self.conns);
            let h = std::thread::Builder::new()
                .name(format!("vk-attach-{id}"))
                .spawn(move || {
                    me.serve(&f);
                    lock(&me.conns).remove(&id);
                });
            match h {
                Ok(h) => {
                    conns.insert(id, (fd, Some(h)));
                }
                Err(e) => tracing::warn!("attach: cannot start a connection thread: {e}"),
            }
        }
    }

    /// Serves one attached program until its socket ends, then destroys
    /// its processes.
    fn serve(&self, fd: &OwnedFd) {
        let cred = match crate::sys::peer_cred(fd.as_raw_fd()) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("attach: cannot read a program's credentials: {e}; closed");
                return;
            }
        };
        // A program that stops reading its answers is cut off, rather
        // than holding this thread (and its processes' cleanup) forever.
        let _ = rustix::net::sockopt::set_socket_timeout(
            fd,
            rustix::net::sockopt::Timeout::Send,
            Some(Duration::from_secs(2)),
        );
        let uid = cred.uid;
        // A program in another PID namespace (a container sharing only
        // the socket) has no pid here; nothing below needs one.
        let who = cred
            .pid
            .map_or("another PID namespace".into(), |p| p.to_string());
        let hello = match control::recv(fd) {
            Ok(Some(r)) => r,
            _ => return,
        };
        if hello.kind() != kind::HELLO || hello.words[1] != control::MAGIC {
            tracing::warn!("attach: a program (pid {who}) did not say hello; closed");
            return;
        }
        // Root's programs run as principal 0 (none, as an embedded program
        // does); anyone else's as their uid.
        let principal = uid;
        let addr = self
            .shared
            .net
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let welcome = [
            kind::WELCOME,
            control::MAGIC,
            control::VERSION,
            u32::from(self.shared.host.0),
            principal,
            // Bit 0: this host traces (the program sends its lines); bit
            // 1: it keeps latency histograms (the program times for them);
            // bit 2: it exports spans (the program reports its own); bit
            // 3: it takes DETACH.
            u32::from(self.shared.tracer.is_some())
                | u32::from(self.metrics) << 1
                | u32::from(self.shared.exports_spans()) << 2
                | 1 << 3,
            0,
            0,
        ];
        if control::send(fd, &welcome, addr.as_bytes(), &[]).is_err() {
            return;
        }
        tracing::debug!(
            uid,
            pid = %who,
            "attach: program attached"
        );
        let mut procs: HashMap<Pid, Proxy> = HashMap::new();
        let mut detached = false;
        while let Ok(Some(r)) = control::recv(fd) {
            if self.take_report(&r) {
                continue;
            }
            if r.kind() == kind::DETACH {
                detached = true;
                break;
            }
            let id = r.words[1];
            let mut file = None;
            let answer = match r.kind() {
                kind::CREATE => self.create(r, uid, principal, &mut procs),
                kind::WINDOW => adopt_window(r, &procs),
                kind::ASK if matches!(r.words[2], ask::PEER_PAGE | ask::WINDOW_OF) => {
                    let has_peer = procs.values().any(|p| p.peer);
                    let window = r.words[2] == ask::WINDOW_OF;
                    self.peer_page(Pid(r.words[3]), uid, has_peer, window)
                        .map(|(f, g)| {
                            file = Some(f);
                            ([g, 0], Vec::new())
                        })
                }
                kind::ASK if r.words[2] == ask::DIRECT => self.direct(&r, uid, &procs),
                kind::ASK if r.words[2] == ask::KEYS => self.keys(uid).map(|(f, doc)| {
                    file = Some(f);
                    ([0, 0], doc)
                }),
                kind::ASK => self.answer(&r, uid),
                _ => Err(IpcError::Refused(Pid(0))),
            };
            procs.retain(|_, p| !p.ended.load(Ordering::Acquire));
            let (words, payload) = match answer {
                Ok((v, payload)) => ([kind::ANSWER, id, 0, 0, v[0], v[1], 0, 0], payload),
                Err(e) => {
                    let (c, a) = e.code();
                    ([kind::ANSWER, id, c, a, 0, 0, 0, 0], Vec::new())
                }
            };
            let fds: Vec<_> = file.iter().map(|f| f.as_fd()).collect();
            if control::send(fd, &words, &payload, &fds).is_err() {
                break;
            }
        }
        // The program detached or died: its processes go with it (unless
        // gone already: `Ctx::end`).
        for (pid, p) in &procs {
            p.stop.store(true, Ordering::SeqCst);
            if p.ended.swap(true, Ordering::SeqCst) {
                continue;
            }
            let _ = destroy_local(&self.shared, *pid);
            if let Some(slot) = p.slot.upgrade() {
                // SAFETY: the slot mapping is SLOT_BYTES long and
                // page-aligned, and kept by `slot`.
                futex_wake(&unsafe { Slot::at(slot.as_ptr()) }.req);
            }
        }
        // Not joined: a proxy in the middle of a long call (a host
        // query, say) ends by itself when that call fails or returns, and
        // must not hold up this cleanup (or the host's shutdown).
        drop(procs);
        tracing::debug!(uid, "attach: program detached");
        if detached {
            // Its reader ends (and its processes' calls); the reports of
            // processes it still holds come until it closes the socket.
            let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Write);
            while let Ok(Some(r)) = control::recv(fd) {
                self.take_report(&r);
            }
        }
    }

    /// Takes a report record (TALLY, TRACE; no answer); false if `r` is
    /// not one.
    fn take_report(&self, r: &Record) -> bool {
        match r.kind() {
            kind::TRACE => {
                if let Some(t) = &self.shared.tracer {
                    t.append_reported(&r.payload);
                }
                true
            }
            kind::TALLY => {
                // What the program's processes did outside the host
                // (direct Sends, peer-page exchanges): no answer.
                // (Not through the engine: a host thread that is no
                // process's must not run the engine's calls here.)
                self.shared
                    .attach_tally
                    .report(&self.shared, &r.payload, self.metrics);
                true
            }
            _ => false,
        }
    }

    fn create(
        &self,
        r: Record,
        uid: u32,
        principal: u32,
        procs: &mut HashMap<Pid, Proxy>,
    ) -> Result<([u32; 2], Vec<u8>), IpcError> {
        let refused = |_| IpcError::Refused(Pid(0));
        let mut fds = r.fds.into_iter();
        let (Some(slot_fd), Some(window_fd), peer_fd, None) =
            (fds.next(), fds.next(), fds.next(), fds.next())
        else {
            return Err(IpcError::Refused(Pid(0)));
        };
        if procs.len() >= MAX_PROCESSES_PER_PROGRAM {
            return Err(IpcError::TableFull);
        }
        let slot = Shm::adopt(&slot_fd, SLOT_BYTES, SLOT_BYTES).map_err(refused)?;
        let window = Shm::adopt(&window_fd, MIN_WINDOW, MAX_WINDOW).map_err(refused)?;
        let window_fd = Arc::new(window_fd);
        let peer = match peer_fd {
            Some(f) => {
                let page = Shm::adopt(&f, PEER_BYTES, PEER_BYTES).map_err(refused)?;
                Some((Arc::new(page), Arc::new(f)))
            }
            None => None,
        };
        let pid = self.shared.with_engine(|e, _| e.create_process())?;
        let p = LocalProcess::new(self.shared.clone(), pid)?;
        if principal != 0 {
            p.set_principal(principal);
        }
        let slot = Arc::new(slot);
        let stop = Arc::new(AtomicBool::new(false));
        let pending = Arc::new(Mutex::new(None));
        let sink = Arc::new(SlotSink {
            slot: slot.clone(),
            seq: AtomicU32::new(0),
            stop: stop.clone(),
            peer: peer.as_ref().map(|(page, _)| page.clone()),
            pid,
            peers: self.peers.clone(),
            #[cfg(feature = "otel")]
            spans: self
                .shared
                .exports_spans()
                .then(|| (Arc::downgrade(&self.shared), Mutex::new(None))),
        });
        p.set_sink(sink.clone());
        let entry = peer.as_ref().map(|(page, f)| {
            // SAFETY: adopted above as exactly PEER_BYTES, page-aligned.
            unsafe { Peer::at(page.as_ptr()) }
                .owner
                .store(pid.0, Ordering::SeqCst);
            Arc::new(PeerEntry {
                uid,
                page: page.clone(),
                fd: f.clone(),
                win: Mutex::new(WinGrant {
                    fd: window_fd.clone(),
                    generation: 1,
                    segment: None,
                }),
            })
        });
        if let Some(e) = &entry {
            lock(&self.peers.map).insert(pid, e.clone());
            p.watch_queue();
        }
        let has_peer = peer.is_some();
        let ended = Arc::new(AtomicBool::new(false));
        let proxy = Proxy {
            slot: Arc::downgrade(&slot),
            stop: stop.clone(),
            pending: pending.clone(),
            ended: ended.clone(),
            peer: has_peer,
        };
        let ctx = Ctx {
            p,
            sink,
            has_peer,
            entry,
            peers: self.peers.clone(),
            slot: slot.clone(),
            window,
            pending,
            stop,
            ended,
            uid,
            principal,
        };
        let pace = self.pace.clone();
        // Detached: a thread that ends is gone at once, stack and all.
        std::thread::Builder::new()
            .name(format!("vk-proxy-{pid}"))
            .spawn(move || ctx.run(&pace))
            .map_err(|_| IpcError::NoResources)?;
        procs.insert(pid, proxy);
        Ok(([pid.0, u32::from(has_peer)], Vec::new()))
    }
}

/// Takes a larger window a program sent for one of its processes; its
/// proxy switches to it at the next ADOPT_WINDOW call.
fn adopt_window(r: Record, procs: &HashMap<Pid, Proxy>) -> Result<([u32; 2], Vec<u8>), IpcError> {
    let pid = Pid(r.words[2]);
    let p = procs.get(&pid).ok_or(IpcError::NoSuchProcess(pid))?;
    let fd = r.fds.into_iter().next().ok_or(IpcError::Refused(pid))?;
    let w = Shm::adopt(&fd, MIN_WINDOW, MAX_WINDOW).map_err(|_| IpcError::Refused(pid))?;
    *lock(&p.pending) = Some((w, fd));
    Ok(([0, 0], Vec::new()))
}

/// The connection thread's handle on one proxy. It owns nothing the
/// process needs: the proxy thread (detached) holds the slot and the
/// window and lets them go when the process ends.
struct Proxy {
    slot: Weak<Shm>,
    stop: Arc<AtomicBool>,
    pending: Arc<Mutex<Option<(Shm, OwnedFd)>>>,
    /// Its process has ended (its proxy thread is ending).
    ended: Arc<AtomicBool>,
    /// It has a peer page.
    peer: bool,
}

/// Who answers a call: the proxy now, or the sink when it completes.
#[derive(PartialEq, Eq)]
enum Answer {
    Now,
    Later,
}

/// What a proxy thread owns.
struct Ctx {
    p: LocalProcess,
    sink: Arc<SlotSink>,
    /// The process has a peer page, whose `queued` word follows the
    /// engine's queue.
    has_peer: bool,
    slot: Arc<Shm>,
    window: Shm,
    pending: Arc<Mutex<Option<(Shm, OwnedFd)>>>,
    stop: Arc<AtomicBool>,
    /// Set once the process is ended (see [`Ctx::end`]).
    ended: Arc<AtomicBool>,
    /// The process's entry among the peers (if it has a peer page).
    entry: Option<Arc<PeerEntry>>,
    peers: Arc<Peers>,
    uid: u32,
    principal: u32,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        self.end();
    }
}

/// A Send's forwarder: the sender, unless the program says a peer
/// forwarded the message to it (see `peer.rs`).
fn forwarder(s: &Slot, me: Pid) -> Pid {
    if s.arg(4) == 1 {
        Pid(s.arg(3))
    } else {
        me
    }
}

fn deadline(us: u64) -> Option<Duration> {
    (us != NONE64).then(|| Duration::from_micros(us))
}

fn len_in(window: &Shm, n: u32, pid: Pid) -> Result<usize, IpcError> {
    let n = n as usize;
    if n > window.len() {
        return Err(IpcError::OutOfBounds(pid));
    }
    Ok(n)
}

impl Ctx {
    fn run(mut self, pace: &Pace) {
        // SAFETY: the slot mapping is SLOT_BYTES long, page-aligned, and
        // owned (through the Arc) for as long as this thread runs.
        let slot = unsafe { Slot::at(self.slot.as_ptr()) };
        let slot: &Slot = slot;
        // From the last call answered (none yet: 0), not from `req`: the
        // program may have posted its first call before this thread ran.
        let mut last = slot.done.load(Ordering::Acquire);
        let mut policy = SpinPolicy::adaptive(PROXY_SPIN_CAP);
        loop {
            let w = pace.wait(&slot.req, &slot.host_parked, last, &mut policy, || {
                self.stop.load(Ordering::Acquire)
            });
            if matches!(w, Waited::Gone) {
                break;
            }
            let seq = slot.req.load(Ordering::Acquire);
            last = seq;
            let op = Op::from_u32(slot.op.load(Ordering::Relaxed));
            self.sink.seq.store(seq, Ordering::Relaxed);
            let r = match op {
                Some(op) => self.call(op, slot),
                None => Err(IpcError::Refused(self.p.pid())),
            };
            if self.has_peer && op == Some(Op::Receive) && matches!(r, Ok(Answer::Now)) {
                // A Receive took a message from the engine's queue: may
                // the next one wait in the inbox?
                self.p.refresh_queue_state();
            }
            if matches!(r, Ok(Answer::Later)) {
                // The sink answers when the engine completes the call.
                continue;
            }
            // A call ended by the host ending this program's attachment
            // says so, rather than how the engine ended it.
            let r = match r {
                Err(_) if self.stop.load(Ordering::Acquire) => Err(IpcError::HostLost),
                r => r,
            };
            if op == Some(Op::Exit) {
                // Gone before its program hears so.
                self.end();
            }
            slot.set_result(r.as_ref().err().map_or(Ok(()), Err));
            publish(&slot.done, &slot.prog_parked, seq);
            if op == Some(Op::Exit) || self.stop.load(Ordering::Acquire) {
                break;
            }
        }
    }

    /// The process ends (by Exit, or its proxy ending): destroyed as any
    /// process is, so that all the host keeps for it goes now: its peer
    /// page and window files (`Peers::died`), its waiter, a window sent
    /// but not adopted. Whoever sets `ended` first (this, or the
    /// connection thread when the attachment ends) destroys it.
    fn end(&mut self) {
        lock(&self.pending).take();
        if !self.ended.swap(true, Ordering::SeqCst) {
            let _ = destroy_local(self.p.shared(), self.p.pid());
        }
    }

    /// The window's first `n` bytes, lent to the engine for a Send's
    /// segment, a Receive's buffer, a reply's or a move's data: by
    /// address, reached only by copies. The program may scribble on it
    /// meanwhile, which only garbles its own data.
    fn win(&self, n: usize, writable: bool) -> Loan<'_> {
        self.window.loan(n, writable)
    }

    fn call(&mut self, op: Op, s: &Slot) -> Result<Answer, IpcError> {
        let p = &self.p;
        let me = p.pid();
        match op {
            Op::Send if Pid(s.arg(0)).host() == me.host() && !Pid(s.arg(0)).is_group() => {
                self.may_ask_kernel_server(&s.msg(), me, Pid(s.arg(0)))?;
                p.send_direct(
                    &s.msg(),
                    Pid(s.arg(0)),
                    deadline(s.arg64(1)),
                    forwarder(s, me),
                )?;
                return Ok(Answer::Later);
            }
            // To another host (or a group): the proxy waits for the answer
            // itself, reading the socket as an embedded sender does, so
            // the reply does not wait for the host's timer thread.
            Op::Send => {
                self.may_ask_kernel_server(&s.msg(), me, Pid(s.arg(0)))?;
                let mut m = s.msg();
                let r = p.send_within_as(
                    &mut m,
                    Pid(s.arg(0)),
                    deadline(s.arg64(1)),
                    forwarder(s, me),
                )?;
                s.set_rmsg(&m);
                s.set_out(0, r.from.0);
                s.set_out(1, r.seg_bytes as u32);
            }
            Op::SendSegment => {
                self.may_ask_kernel_server(&s.msg(), me, Pid(s.arg(0)))?;
                let n = len_in(&self.window, s.arg(2), me)?;
                let append = usize::try_from(s.arg64(3)).unwrap_or(usize::MAX);
                let access = match s.arg(1) {
                    1 => SegAccess::READ,
                    2 => SegAccess::WRITE,
                    3 => SegAccess::READ_WRITE,
                    _ => return Err(IpcError::Refused(me)),
                };
                let seg = self.win(n, access != SegAccess::READ);
                let mut m = s.msg();
                // Movers of this uid may copy into the window itself
                // while the Send is outstanding (Op::MoveGrant).
                if let Some(e) = &self.entry {
                    lock(&e.win).segment = Some(n);
                }
                let r = p.send_loan_within(
                    &mut m,
                    Pid(s.arg(0)),
                    seg,
                    access,
                    append,
                    deadline(s.arg64(5)),
                );
                if let Some(e) = &self.entry {
                    lock(&e.win).segment = None;
                }
                let r = r?;
                s.set_rmsg(&m);
                s.set_out(0, r.from.0);
                s.set_out(1, r.seg_bytes as u32);
            }
            Op::Receive if s.arg(0) == 0 && s.arg(5) == 0 => match p.receive_direct()? {
                Some(r) => write_received(s, &r),
                None => return Ok(Answer::Later),
            },
            Op::Receive => {
                let mut m = Message::zero();
                let r = if s.arg(5) != 0 {
                    p.receive_specific(&mut m, Pid(s.arg(4)))?
                } else if s.arg(0) != 0 {
                    let n = len_in(&self.window, s.arg(1), me)?;
                    let upto = usize::try_from(s.arg64(2)).unwrap_or(usize::MAX);
                    Some(p.receive_loan_upto(&mut m, self.win(n, true), upto)?)
                } else {
                    Some(p.receive(&mut m)?)
                };
                s.set_out(4, u32::from(r.is_some()));
                if let Some(i) = r {
                    s.set_rmsg(&m);
                    s.set_out(0, i.from.0);
                    s.set_out(1, i.seg_bytes as u32);
                    s.set_out(2, i.forwarder.0);
                    s.set_out(3, i.principal);
                }
            }
            Op::Reply => p.reply(&s.msg(), Pid(s.arg(0)))?,
            Op::ReplySegment => {
                let n = len_in(&self.window, s.arg(2), me)?;
                p.reply_loan(&s.msg(), Pid(s.arg(0)), s.arg(1), self.win(n, false))?;
            }
            Op::Forward => {
                let (from, to) = (Pid(s.arg(0)), Pid(s.arg(1)));
                self.may_ask_kernel_server(&s.msg(), from, to)?;
                p.forward(&s.msg(), from, to)?;
            }
            Op::MoveTo => {
                let n = len_in(&self.window, s.arg(2), me)?;
                let k = p.move_to_loan(Pid(s.arg(0)), s.arg(1), self.win(n, false))?;
                s.set_out(0, k as u32);
            }
            Op::MoveFrom => {
                let n = len_in(&self.window, s.arg(2), me)?;
                let k = p.move_from_loan(Pid(s.arg(0)), s.arg(1), self.win(n, true))?;
                s.set_out(0, k as u32);
            }
            Op::SetPid => {
                let scope = super::scope_of(s.arg(2)).ok_or(IpcError::Refused(me))?;
                self.set_pid(s.arg(0), Pid(s.arg(1)), scope)?;
            }
            Op::GetPid => {
                let scope = super::scope_of(s.arg(1)).ok_or(IpcError::Refused(me))?;
                s.set_out(0, p.get_pid(s.arg(0), scope)?.0);
            }
            Op::AllocateGroup => s.set_out(0, p.allocate_group_id()?.0),
            Op::JoinGroup => p.join_group(Pid(s.arg(0)), Pid(s.arg(1)))?,
            Op::LeaveGroup => p.leave_group(Pid(s.arg(0)), Pid(s.arg(1)))?,
            Op::GetReply => {
                let mut m = Message::zero();
                let from = p.get_reply(&mut m);
                s.set_out(0, u32::from(from.is_some()));
                s.set_out(1, from.map_or(0, |f| f.0));
                s.set_rmsg(&m);
            }
            Op::HostStats => {
                let doc = p.host_stats(HostId(s.arg(0) as u16))?;
                if doc.len() > self.window.len() {
                    return Err(IpcError::SegmentTooLarge { max: doc.len() });
                }
                self.window.write_at(0, doc.as_bytes());
                s.set_out(0, doc.len() as u32);
            }
            Op::SelectHosts => {
                let room = self.window.len() / super::HOST_LOAD_BYTES;
                let max = (s.arg(0) as usize).min(room);
                let limit = Duration::from_micros(s.arg64(1).min(10_000_000));
                let idle = f64::from_bits(s.arg64(3));
                let idle = if idle.is_finite() { idle } else { 0.0 };
                let mut hosts = p.select_hosts(max, limit, idle)?;
                hosts.truncate(room);
                let mut c = [0u8; super::HOST_LOAD_BYTES];
                for (i, h) in hosts.iter().enumerate() {
                    super::host_load_to(h, &mut c);
                    self.window.write_at(i * super::HOST_LOAD_BYTES, &c);
                }
                s.set_out(0, hosts.len() as u32);
            }
            Op::GetTime => s.set_out64(0, p.get_time().as_micros() as u64),
            Op::ProcessExists => s.set_out(0, u32::from(p.process_exists(Pid(s.arg(0)))?)),
            Op::Destroy => {
                let target = Pid(s.arg(0));
                self.may_destroy(target)?;
                p.destroy(target)?;
            }
            Op::SetPrincipal => {
                let want = s.arg(0);
                self.may_run_as(want)?;
                p.set_principal(want);
            }
            Op::RestrictSenders => {
                let n = s.arg(0);
                if n == u32::MAX {
                    p.restrict_senders(None);
                } else {
                    let bytes = len_in(&self.window, n.saturating_mul(4), me)?;
                    let mut raw = vec![0u8; bytes];
                    self.window.read_at(0, &mut raw);
                    let list = raw
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    p.restrict_senders(Some(list));
                }
            }
            Op::SetSpin => {
                let d = Duration::from_micros(s.arg64(1).min(1_000_000));
                if s.arg(0) != 0 {
                    p.set_spin_auto(d);
                } else {
                    p.set_spin(d);
                }
            }
            Op::SetSocketReader => p.set_socket_reader(s.arg(0) != 0),
            Op::AdoptWindow => {
                let (w, fd) = lock(&self.pending).take().ok_or(IpcError::Refused(me))?;
                self.window = w;
                if let Some(e) = &self.entry {
                    let mut g = lock(&e.win);
                    g.fd = Arc::new(fd);
                    g.generation = g.generation.wrapping_add(1);
                }
            }
            Op::MoveGrant => {
                let target = Pid(s.arg(0));
                let (off, n, write) = (s.arg(1), s.arg(2) as usize, s.arg(3) == 1);
                // Only between programs of one uid with peer pages, and
                // only while the target's Send lends its window.
                let e = lock(&self.peers.map).get(&target).cloned();
                let e = match e {
                    Some(e) if self.has_peer && e.uid == self.uid => e,
                    _ => return Err(IpcError::Refused(target)),
                };
                let g = lock(&e.win);
                let Some(seg) = g.segment else {
                    return Err(IpcError::Refused(target));
                };
                let len = p
                    .shared()
                    .with_engine(|eng, now| eng.grant_move(now, me, target, off, n, write))?;
                if len != seg {
                    return Err(IpcError::Refused(target));
                }
                s.set_out(0, g.generation);
                self.peers.grants.fetch_add(1, Ordering::Relaxed);
            }
            Op::Exit => {}
        }
        Ok(Answer::Now)
    }
}
