//! The Rust client of the V I/O protocol.
//!
//! A [`Client`] owns a pool of V processes; each call borrows one for its
//! exchange, so as many requests run at once as threads call the client
//! (up to the pool's depth). Paths are relative to the server's exported
//! root (`""` is the root itself) and travel in the segment lent with the
//! Send; answers come back appended to the reply. Data buffers are lent
//! directly: a READ's buffer is write-granted (the page comes back
//! appended to the reply, or by MoveTo when large), a WRITE's data is
//! read-granted (the first part rides with the request, the rest is
//! pulled by MoveFrom).
//!
//! A server that is gone, or a host that stops answering, ends a call with
//! [`ClientError::Ipc`] after the kernel's host timeout — never a hang.

mod alloc;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vkernel::service::ClientPool;
use vkernel::{IpcError, Kernel, Message, Pid, Process, Scope, Segment};

use crate::vio::{
    self, Attr, Dirent, Errno, Owner, Request, SetAttr, StatFs, ATTR_LEN, SETATTR_LEN,
};

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error status.
    #[error("{0}")]
    Server(Errno),
    /// The exchange failed (server gone, host timeout, ...).
    #[error("file server unreachable: {0}")]
    Ipc(#[from] IpcError),
    /// An answer could not be decoded.
    #[error("malformed answer from the file server: {0}")]
    Malformed(String),
}

impl ClientError {
    /// The errno a POSIX caller should see: the server's status, or
    /// `ENOTCONN` when the server could not be reached, `EIO` for a
    /// garbled answer.
    pub fn errno(&self) -> Errno {
        match self {
            ClientError::Server(e) => *e,
            ClientError::Ipc(_) => Errno::ENOTCONN,
            ClientError::Malformed(_) => Errno::EIO,
        }
    }
}

/// A handle on an open file or directory at the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fh(pub u32);

/// One chunk of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirChunk {
    /// The entries.
    pub entries: Vec<Dirent>,
    /// Index of the entry after the last one returned.
    pub next: u32,
    /// True if the listing is complete.
    pub done: bool,
}

/// An advisory lock to set, remove or test ([`Client::lock`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRequest {
    /// [`vio::LOCK_UNLOCK`], [`vio::LOCK_READ`] or [`vio::LOCK_WRITE`].
    pub kind: u32,
    /// Who holds it (fcntl: the process; flock: the open file), as the
    /// client's kernel names it.
    pub owner: u64,
    /// The locking program's pid (reported to `F_GETLK` elsewhere).
    pub pid: u32,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive; `i64::MAX` and beyond: to the end of file).
    pub end: u64,
}

/// A lock that conflicts with one asked about ([`Client::test_lock`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// [`vio::LOCK_READ`] or [`vio::LOCK_WRITE`].
    pub kind: u32,
    /// Its holder's pid on its client.
    pub pid: u32,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive).
    pub end: u64,
}

/// One chunk of a directory listing with attributes (READDIRPLUS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirChunkPlus {
    /// The entries from the index asked for on, in order, each with its
    /// attributes (inode 0: removed since the listing was taken).
    pub entries: Vec<(Dirent, Attr)>,
    /// Index of the entry after the last one returned.
    pub next: u32,
    /// True if the listing is complete.
    pub done: bool,
}

/// Largest READ/WRITE request a client sends by default (bigger calls are
/// split; each request then moves its data in the server's transfer units).
pub const DEFAULT_MAX_REQUEST: usize = 4 << 20;
/// Bytes of directory entries asked for per READDIR (fits one reply).
const READDIR_BYTES: usize = 32 << 10;

/// Bytes of the header read that starts a program load (one page).
pub const HEADER_BYTES: usize = 4096;

/// What kind of program a loaded image is, from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramKind {
    /// An ELF executable (`\x7fELF`).
    Elf,
    /// An interpreter script (`#!`).
    Script,
}

impl ProgramKind {
    /// The kind named by a header, or `None` if it is not a program.
    pub fn of(header: &[u8]) -> Option<ProgramKind> {
        if header.starts_with(b"\x7fELF") {
            Some(ProgramKind::Elf)
        } else if header.starts_with(b"#!") {
            Some(ProgramKind::Script)
        } else {
            None
        }
    }
}

/// A program image read from a file server by [`Client::load_program`].
#[derive(Debug, Clone)]
pub struct ProgramImage {
    /// ELF or script.
    pub kind: ProgramKind,
    /// The whole file.
    pub image: Vec<u8>,
}

/// How a client finds its file server again after the server restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rediscover {
    /// The file service's logical id, looked up with GetPid (any scope).
    pub logical_id: u32,
    /// Give up (the call fails with `ENOTCONN`) after looking this long.
    pub budget: Duration,
}

/// A handle as the client gave it out, with what reopening it needs.
struct Opened {
    /// The handle at the current server.
    server_fh: u32,
    path: Vec<u8>,
    /// Open flags without `O_CREAT`, `O_TRUNC` and `O_EXCL`.
    flags: i32,
    dir: bool,
    /// Written since its last fsync: write-behind data may have died
    /// with the server.
    dirty: bool,
    /// Could not be reopened, or lost unsynced writes: fails with EIO.
    broken: bool,
}

/// Handles given out while rediscovery is on: the client's own numbers,
/// stable across server restarts.
#[derive(Default)]
struct Handles {
    next: u32,
    open: HashMap<u32, Opened>,
}

/// Rediscovery state (see [`Client::set_rediscover`]).
struct Reopen {
    find: Rediscover,
    handles: Mutex<Handles>,
    /// Serializes the search: one thread looks, the others then retry.
    lock: Mutex<()>,
    /// The last search found nothing: look once, not for the whole
    /// budget, until the server is found again.
    gave_up: std::sync::atomic::AtomicBool,
}

/// A connection to a file server, usable from many threads at once.
pub struct Client {
    server: AtomicU32,
    max_request: usize,
    pool: ClientPool,
    /// Processes for LOCK requests that wait.
    waits: ClientPool,
    reopen: Option<Reopen>,
    /// The pool's pids (a WATCH names them as this client's).
    members: Vec<Pid>,
    /// The callback process a WATCH named, to name again to a restarted
    /// server.
    callback: Mutex<Option<Pid>>,
    /// The server does not know OPENREAD / READDIRPLUS (older server).
    no_openread: std::sync::atomic::AtomicBool,
    no_readdirplus: std::sync::atomic::AtomicBool,
    no_closev: std::sync::atomic::AtomicBool,
}

/// Lock waits a client has in flight at once (more queue behind them).
const LOCK_WAITERS: usize = 8;

/// Most bytes [`Client::write_attr`] writes with attributes answered.
pub const WRITE_ATTR_MAX: usize = 128 << 10;

/// Most bytes [`Client::open_read`] asks for with the open.
pub const OPEN_READ_MAX: usize = 60 << 10;

/// A callback process: hands each INVALIDATE to `sink`, then answers it,
/// so what the sink forgets is forgotten before the server acknowledges
/// the change. The sink must not wait on anything that may wait on the
/// server (the mount's sink only takes its own caches' locks, and leaves
/// the kernel's caches to another thread).
fn callback_loop<F: Fn(vio::Invalidation, &[u8])>(p: &Process, sink: &F) {
    let mut m = Message::zero();
    // Room for a rename's two paths.
    let mut path = vec![0u8; 2 * vio::MAX_PATH + 1];
    loop {
        let i = match p.receive_with_segment(&mut m, &mut path) {
            Ok(i) => i,
            Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
            Err(_) => continue,
        };
        let status = match vio::Invalidation::decode(&m) {
            Ok(inv) => {
                let n = (inv.path_len as usize).min(i.seg_bytes).min(path.len());
                sink(inv, &path[..n]);
                Errno::OK
            }
            Err(_) => Errno::EPROTO,
        };
        let _ = p.reply(&vio::reply(status, &[]), i.from);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server())
            .finish()
    }
}

impl Client {
    /// A client of the file server `server` with `depth` processes created
    /// on `kernel` (requests in flight at once). Checks the server answers
    /// (a STATFS).
    pub fn connect(kernel: &Kernel, server: Pid, depth: usize) -> Result<Client, ClientError> {
        Self::connect_as(kernel, server, depth, 0)
    }

    /// Like [`Client::connect`], with every request sent as `principal`
    /// (the server's access policy decides by it).
    pub fn connect_as(
        kernel: &Kernel,
        server: Pid,
        depth: usize,
        principal: u32,
    ) -> Result<Client, ClientError> {
        let pool = ClientPool::new(kernel, depth, principal)?;
        pool.set_spin(Duration::ZERO);
        let waits = ClientPool::new(kernel, LOCK_WAITERS, principal)?;
        waits.set_spin(Duration::ZERO);
        let c = Client {
            server: AtomicU32::new(server.0),
            max_request: DEFAULT_MAX_REQUEST,
            members: pool.pids(),
            pool,
            waits,
            reopen: None,
            callback: Mutex::new(None),
            no_openread: Default::default(),
            no_readdirplus: Default::default(),
            no_closev: Default::default(),
        };
        c.statfs()?;
        Ok(c)
    }

    /// Sets the largest READ/WRITE request (bytes, at least 4 KiB).
    pub fn set_max_request(&mut self, bytes: usize) {
        self.max_request = bytes.clamp(4096, vio::MAX_IO as usize);
    }

    /// The server's pid (the one found last, after a restart).
    pub fn server(&self) -> Pid {
        Pid(self.server.load(Ordering::Acquire))
    }

    /// Finds the server again by name when it goes away (its pid no
    /// longer exists or its host stops answering): open handles are
    /// reopened by path, and the request is re-sent if it is idempotent
    /// (reads, stats, listings, and writes at an offset); any other
    /// request in flight fails with `EIO`, its outcome unknown. A file
    /// written since its last fsync may have lost write-behind data with
    /// the server: its handle fails with `EIO` from then on. Handles are
    /// the client's own numbers from this call on; call it before any
    /// open.
    pub fn set_rediscover(&mut self, find: Rediscover) {
        self.reopen = Some(Reopen {
            find,
            handles: Mutex::new(Handles {
                next: 1,
                open: HashMap::new(),
            }),
            lock: Mutex::new(()),
            gave_up: std::sync::atomic::AtomicBool::new(false),
        });
    }

    /// Records a handle the server gave for `path`; returns the client's.
    fn track(&self, server_fh: u32, path: &[u8], flags: i32, dir: bool) -> Fh {
        let Some(r) = &self.reopen else {
            return Fh(server_fh);
        };
        let mut h = lock(&r.handles);
        let mut id = h.next;
        while id == 0 || h.open.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        h.next = id.wrapping_add(1);
        h.open.insert(
            id,
            Opened {
                server_fh,
                path: path.to_vec(),
                flags: flags & !(libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL),
                dir,
                dirty: false,
                broken: false,
            },
        );
        Fh(id)
    }

    /// One exchange: `m` is the request and becomes the reply; the status
    /// is checked. With rediscovery on, handles are translated and a
    /// server that went away is looked for again.
    fn exchange(
        &self,
        m: &mut Message,
        mut seg: Option<Segment<'_>>,
    ) -> Result<usize, ClientError> {
        let Some(r) = &self.reopen else {
            return self.exchange_once(m, seg, self.server());
        };
        let request = *m;
        let code = vio::code(&request);
        let handle = vio::request_handle(&request);
        let retry = Request::decode(&request).is_ok_and(|q| safe_to_resend(&q));
        loop {
            let server = self.server();
            *m = request;
            if let Some(fh) = handle {
                let h = lock(&r.handles);
                match h.open.get(&fh) {
                    Some(o) if o.broken && code != vio::CLOSE => {
                        return Err(ClientError::Server(Errno::EIO))
                    }
                    Some(o) => vio::set_request_handle(m, o.server_fh),
                    None => return Err(ClientError::Server(Errno::EBADF)),
                }
            }
            let res = self.exchange_once(m, seg.as_mut().map(reborrow), server);
            match res {
                Err(ClientError::Ipc(e)) if gone(&e, server) => {
                    self.rediscover(server, e)?;
                    if !retry {
                        tracing::warn!(
                            "file server restarted with a request in flight (code {code:#x}); its outcome is unknown: EIO"
                        );
                        return Err(ClientError::Server(Errno::EIO));
                    }
                }
                res => {
                    if let (true, Some(fh)) = (res.is_ok() || code == vio::CLOSE, handle) {
                        let mut h = lock(&r.handles);
                        match code {
                            vio::CLOSE => {
                                h.open.remove(&fh);
                            }
                            vio::WRITE | vio::FTRUNCATE => {
                                if let Some(o) = h.open.get_mut(&fh) {
                                    o.dirty = true;
                                }
                            }
                            vio::FSYNC => {
                                if let Some(o) = h.open.get_mut(&fh) {
                                    o.dirty = false;
                                }
                            }
                            _ => {}
                        }
                    }
                    return res;
                }
            }
        }
    }

    fn exchange_once(
        &self,
        m: &mut Message,
        seg: Option<Segment<'_>>,
        server: Pid,
    ) -> Result<usize, ClientError> {
        // A lock wait lasts as long as the lock is held elsewhere: no
        // deadline (the server's host keeps answering that it is pending).
        let waits = vio::code(m) == vio::LOCK && m.0[2] & vio::LOCK_WAIT != 0;
        // Waits borrow from a pool of their own, so that programs waiting
        // for locks never starve the others of processes.
        let pool = if waits { &self.waits } else { &self.pool };
        let p = pool.take();
        let r = match seg {
            Some(s) if waits => p.send_with_segment_within(m, server, s, usize::MAX, None),
            Some(s) => p.send_with_segment(m, server, s),
            None => p.send(m, server),
        };
        pool.give(p);
        let r = r?;
        match vio::status(m) {
            Errno::OK => Ok(r.seg_bytes),
            e => Err(ClientError::Server(e)),
        }
    }

    /// Looks for the server until it answers again or the budget is
    /// spent, then reopens every tracked handle. Returns at once if
    /// another thread already found it.
    fn rediscover(&self, old: Pid, cause: IpcError) -> Result<(), ClientError> {
        let Some(r) = &self.reopen else {
            return Err(cause.into());
        };
        let _one = lock(&r.lock);
        if self.server() != old {
            return Ok(());
        }
        tracing::warn!("file server {old} is gone ({cause}); looking for it again");
        let t0 = Instant::now();
        let mut pause = Duration::from_millis(20);
        let budget = if r.gave_up.load(Ordering::Relaxed) {
            Duration::ZERO
        } else {
            r.find.budget
        };
        let p = self.pool.take();
        let found = loop {
            match p.get_pid(r.find.logical_id, Scope::Any) {
                Ok(pid) if !pid.is_none() && pid != old => break Some(pid),
                _ if t0.elapsed() < budget => {
                    std::thread::sleep(pause.min(budget.saturating_sub(t0.elapsed())));
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                _ => break None,
            }
        };
        let Some(pid) = found else {
            self.pool.give(p);
            if !r.gave_up.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "file server not found again within {budget:?}; calls fail with ENOTCONN (each looks once more)"
                );
            }
            return Err(cause.into());
        };
        r.gave_up.store(false, Ordering::Relaxed);
        // Reopen what was open, by path, at the new server.
        let mut h = lock(&r.handles);
        let (mut reopened, mut broken) = (0, 0);
        for o in h.open.values_mut() {
            if o.broken {
                continue;
            }
            let len = o.path.len() as u32;
            let req = if o.dir {
                Request::Opendir { path_len: len }
            } else {
                Request::Open {
                    prefetch: false,
                    path_len: len,
                    flags: o.flags as u32,
                    mode: 0,
                    owner: Owner::default(),
                }
            };
            let mut m = req.encode();
            let mut out = vec![0u8; ATTR_LEN];
            let mut seg = [o.path.as_slice(), &out].concat();
            let sent = p.send_with_segment(&mut m, pid, Segment::ReadWrite(&mut seg));
            out.clear();
            match sent {
                Ok(_) if vio::status(&m) == Errno::OK && !o.dirty => {
                    o.server_fh = vio::reply_words(&m)[0];
                    reopened += 1;
                }
                _ => {
                    tracing::warn!(
                        "after the file server's restart, {:?} {}: EIO from now on",
                        String::from_utf8_lossy(&o.path),
                        if o.dirty {
                            "had writes since its last fsync that may be lost"
                        } else {
                            "could not be reopened"
                        }
                    );
                    o.broken = true;
                    broken += 1;
                }
            }
        }
        drop(h);
        let cb = *lock(&self.callback);
        if let Some(cb) = cb {
            // The new server knows nothing of this client's caches.
            if let Err(e) = self.send_watch(&p, pid, cb) {
                tracing::warn!("the restarted file server refused WATCH ({e}); cached names and attributes may be stale for up to the mount's TTL");
            }
        }
        self.pool.give(p);
        self.server.store(pid.0, Ordering::Release);
        tracing::warn!(
            "file server found again as {pid} after {:.0} ms; {reopened} handles reopened, {broken} failed",
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// A request whose segment holds `input` and receives `out_len` bytes
    /// back (read+write when both). Returns the reply and the output.
    fn call(
        &self,
        req: Request,
        input: &[u8],
        out_len: usize,
    ) -> Result<(Message, Vec<u8>), ClientError> {
        let mut m = req.encode();
        let mut buf = vec![0u8; input.len().max(out_len)];
        buf[..input.len()].copy_from_slice(input);
        let seg = match (input.is_empty(), out_len == 0) {
            (true, true) => None,
            (false, true) => Some(Segment::Read(&buf[..])),
            (true, false) => Some(Segment::Write(&mut buf[..])),
            (false, false) => Some(Segment::ReadWrite(&mut buf[..])),
        };
        self.exchange(&mut m, seg)?;
        Ok((m, buf))
    }

    fn attr_of(out: &[u8]) -> Result<Attr, ClientError> {
        Attr::decode(out).map_err(|e| ClientError::Malformed(e.to_string()))
    }

    fn len32(b: &[u8]) -> Result<u32, ClientError> {
        if b.len() > vio::MAX_PATH {
            return Err(ClientError::Server(Errno::ENAMETOOLONG));
        }
        Ok(b.len() as u32)
    }

    /// Opens (with `O_CREAT` in `flags`, creates) the file at `path`;
    /// `flags` are Linux open flags. Returns the handle and the file's
    /// attributes.
    pub fn open(
        &self,
        path: impl AsRef<[u8]>,
        flags: i32,
        mode: u32,
    ) -> Result<(Fh, Attr), ClientError> {
        self.open_as(path, flags, mode, Owner::default())
    }

    /// [`Client::open`] on behalf of `owner` (who owns a created file, as
    /// the server's policy allows: docs/VIO.md, "Ownership").
    pub fn open_as(
        &self,
        path: impl AsRef<[u8]>,
        flags: i32,
        mode: u32,
        owner: Owner,
    ) -> Result<(Fh, Attr), ClientError> {
        self.create_in(path, flags, mode, owner)
            .map(|(fh, a, _, _)| (fh, a))
    }

    /// [`Client::open_as`], also answering, when it created the file, the
    /// attributes of the directory it was made in (`None` otherwise, or
    /// from a server that does not send them), and whether it made the
    /// file (false from a server that does not say).
    pub fn create_in(
        &self,
        path: impl AsRef<[u8]>,
        flags: i32,
        mode: u32,
        owner: Owner,
    ) -> Result<(Fh, Attr, Option<Attr>, bool), ClientError> {
        let p = path.as_ref();
        let req = Request::Open {
            prefetch: false,
            path_len: Self::len32(p)?,
            flags: flags as u32,
            mode,
            owner,
        };
        let (m, out) = self.call(req, p, 2 * ATTR_LEN)?;
        let attr = Self::attr_of(&out)?;
        let parent = Self::parent_attr(&m, 2, &out[ATTR_LEN..]);
        let made = vio::reply_words(&m)[3] == 1;
        Ok((
            self.track(vio::reply_words(&m)[0], p, flags, false),
            attr,
            parent,
            made,
        ))
    }

    /// Creates (or truncates) `path` for writing with `mode`.
    pub fn create(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<(Fh, Attr), ClientError> {
        self.open(path, libc::O_CREAT | libc::O_TRUNC | libc::O_RDWR, mode)
    }

    /// Forgets a handle; reports a deferred write error, if any.
    pub fn close(&self, fh: Fh) -> Result<(), ClientError> {
        self.call(Request::Close { handle: fh.0 }, &[], 0)
            .map(|_| ())
    }

    /// The value of the extended attribute `name` of `path` (not
    /// following a final symbolic link): with `room` 0 only its length.
    pub fn getxattr(
        &self,
        path: impl AsRef<[u8]>,
        name: &[u8],
        room: usize,
    ) -> Result<(usize, Vec<u8>), ClientError> {
        let p = path.as_ref();
        let room = room.min(vio::MAX_XATTR_VALUE as usize);
        let req = Request::Getxattr {
            path_len: Self::len32(p)?,
            name_len: name.len() as u32,
            size: room as u32,
        };
        let (m, mut out) = self.call(req, &[p, name].concat(), room)?;
        let n = vio::reply_words(&m)[0] as usize;
        out.truncate(if room == 0 { 0 } else { n.min(room) });
        Ok((n, out))
    }

    /// The names of `path`'s extended attributes, each NUL-terminated
    /// (`room` 0: only the length).
    pub fn listxattr(
        &self,
        path: impl AsRef<[u8]>,
        room: usize,
    ) -> Result<(usize, Vec<u8>), ClientError> {
        let p = path.as_ref();
        let room = room.min(vio::MAX_XATTR_VALUE as usize);
        let req = Request::Listxattr {
            path_len: Self::len32(p)?,
            size: room as u32,
        };
        let (m, mut out) = self.call(req, p, room)?;
        let n = vio::reply_words(&m)[0] as usize;
        out.truncate(if room == 0 { 0 } else { n.min(room) });
        Ok((n, out))
    }

    /// Sets the extended attribute `name` of `path` (`flags`:
    /// [`vio::XATTR_CREATE`], [`vio::XATTR_REPLACE`]).
    pub fn setxattr(
        &self,
        path: impl AsRef<[u8]>,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<(), ClientError> {
        let p = path.as_ref();
        let req = Request::Setxattr {
            path_len: Self::len32(p)?,
            name_len: name.len() as u32,
            value_len: value.len() as u32,
            flags,
        };
        self.call(req, &[p, name, value].concat(), 0).map(|_| ())
    }

    /// Removes the extended attribute `name` of `path`.
    pub fn removexattr(&self, path: impl AsRef<[u8]>, name: &[u8]) -> Result<(), ClientError> {
        let p = path.as_ref();
        let req = Request::Removexattr {
            path_len: Self::len32(p)?,
            name_len: name.len() as u32,
        };
        self.call(req, &[p, name].concat(), 0).map(|_| ())
    }

    /// Sets or removes an advisory lock on the file open as `fh`; with
    /// `wait`, blocks while another owner's lock conflicts (no deadline),
    /// else a conflict is `EAGAIN`. A wait ends with `EINTR` if the same
    /// owner unlocks the whole file meanwhile (its program closed it).
    pub fn lock(&self, fh: Fh, l: &LockRequest, wait: bool) -> Result<(), ClientError> {
        let flags = (l.kind & 3) | if wait { vio::LOCK_WAIT } else { 0 };
        self.lock_call(fh, l, flags).map(|_| ())
    }

    /// The lock of another owner that would stop `l` (`F_GETLK`), if any.
    pub fn test_lock(&self, fh: Fh, l: &LockRequest) -> Result<Option<LockInfo>, ClientError> {
        let (m, out) = self.lock_call(fh, l, (l.kind & 3) | vio::LOCK_TEST)?;
        if vio::reply_words(&m)[0] == 0 {
            return Ok(None);
        }
        let u32_at = |i: usize| u32::from_be_bytes([out[i], out[i + 1], out[i + 2], out[i + 3]]);
        let u64_at = |i: usize| (u64::from(u32_at(i)) << 32) | u64::from(u32_at(i + 4));
        Ok(Some(LockInfo {
            kind: u32_at(0),
            pid: u32_at(4),
            start: u64_at(8),
            end: u64_at(16),
        }))
    }

    fn lock_call(
        &self,
        fh: Fh,
        l: &LockRequest,
        flags: u32,
    ) -> Result<(Message, Vec<u8>), ClientError> {
        let req = Request::Lock {
            handle: fh.0,
            flags,
            owner: l.owner,
            pid: l.pid,
        };
        let mut range = [0u8; vio::LOCK_RANGE_LEN];
        range[..8].copy_from_slice(&l.start.to_be_bytes());
        range[8..].copy_from_slice(&l.end.to_be_bytes());
        self.call(req, &range, vio::LOCK_INFO_LEN)
    }

    /// Closes several handles, [`vio::MAX_CLOSEV`] per exchange (CLOSEV;
    /// one CLOSE each with a server that does not know it, or when the
    /// exchange fails). Every handle is forgotten; the first error is
    /// returned.
    pub fn close_many(&self, fhs: &[Fh]) -> Result<(), ClientError> {
        let mut first = Ok(());
        for chunk in fhs.chunks(vio::MAX_CLOSEV as usize) {
            let ids: Vec<u32> = match &self.reopen {
                None => chunk.iter().map(|f| f.0).collect(),
                Some(r) => {
                    let mut h = lock(&r.handles);
                    chunk
                        .iter()
                        .filter_map(|f| h.open.remove(&f.0))
                        .filter(|o| !o.broken)
                        .map(|o| o.server_fh)
                        .collect()
                }
            };
            if ids.is_empty() || self.no_closev.load(Ordering::Relaxed) {
                for &id in &ids {
                    let r = self.exchange_once(
                        &mut Request::Close { handle: id }.encode(),
                        None,
                        self.server(),
                    );
                    if let (Err(e), Ok(())) = (r, &first) {
                        first = Err(e);
                    }
                }
                continue;
            }
            let list: Vec<u8> = ids.iter().flat_map(|i| i.to_be_bytes()).collect();
            let mut m = Request::Closev {
                count: ids.len() as u32,
            }
            .encode();
            let r = self.exchange_once(&mut m, Some(Segment::Read(&list)), self.server());
            match r {
                Err(ClientError::Server(Errno::ENOSYS)) => {
                    self.no_closev.store(true, Ordering::Relaxed);
                    for &id in &ids {
                        let _ = self.exchange_once(
                            &mut Request::Close { handle: id }.encode(),
                            None,
                            self.server(),
                        );
                    }
                }
                Err(e) if first.is_ok() => first = Err(e),
                _ => {}
            }
        }
        first
    }

    /// Reads into `buf` at `offset`; returns the bytes read (fewer only at
    /// end of file). Large reads are split into requests of the client's
    /// maximum size.
    pub fn read(&self, fh: Fh, offset: u64, buf: &mut [u8]) -> Result<usize, ClientError> {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_request);
            let chunk = &mut buf[done..done + n];
            let mut m = Request::Read {
                handle: fh.0,
                offset: offset + done as u64,
                count: n as u32,
            }
            .encode();
            self.exchange(&mut m, Some(Segment::Write(chunk)))?;
            let got = vio::reply_words(&m)[0] as usize;
            if got > n {
                return Err(ClientError::Malformed(format!(
                    "READ answered {got} bytes for {n}"
                )));
            }
            done += got;
            if got < n {
                break;
            }
        }
        Ok(done)
    }

    /// Writes all of `data` at `offset` (split into requests of the
    /// client's maximum size). With write-behind at the server, an error
    /// writing to the disk may surface only at the next write, fsync or
    /// close.
    pub fn write(&self, fh: Fh, offset: u64, data: &[u8]) -> Result<usize, ClientError> {
        let mut done = 0;
        while done < data.len() {
            let n = (data.len() - done).min(self.max_request);
            let mut m = Request::Write {
                handle: fh.0,
                offset: offset + done as u64,
                count: n as u32,
                flags: 0,
            }
            .encode();
            self.exchange(&mut m, Some(Segment::Read(&data[done..done + n])))?;
            let took = vio::reply_words(&m)[0] as usize;
            if took == 0 || took > n {
                return Err(ClientError::Malformed(format!(
                    "WRITE accepted {took} bytes of {n}"
                )));
            }
            done += took;
        }
        Ok(done)
    }

    /// Writes `data` (one request, at most [`WRITE_ATTR_MAX`] bytes) at
    /// `offset` and gets the file's attributes after the write with the
    /// answer. Returns the bytes written and the attributes (`None` from a
    /// server that does not answer them).
    pub fn write_attr(
        &self,
        fh: Fh,
        offset: u64,
        data: &[u8],
    ) -> Result<(usize, Option<Attr>), ClientError> {
        if data.len() > WRITE_ATTR_MAX {
            return self.write(fh, offset, data).map(|n| (n, None));
        }
        self.write_with_attr(fh, offset, data, 0)
    }

    /// Appends `data` at the end of the file as one request (at most
    /// [`vio::MAX_IO`] bytes; the server finds the end under its lock of
    /// the file, so appends from several clients never mix), and gets the
    /// file's attributes after it. A server older than [`vio::WRITE_APPEND`]
    /// ignores the flag and writes at `offset`, which Linux's pwrite(2)
    /// also puts at the end for a handle opened with `O_APPEND`.
    pub fn append_attr(
        &self,
        fh: Fh,
        offset: u64,
        data: &[u8],
    ) -> Result<(usize, Option<Attr>), ClientError> {
        if data.len() > vio::MAX_IO as usize {
            return Err(ClientError::Server(Errno::EINVAL));
        }
        self.write_with_attr(fh, offset, data, vio::WRITE_APPEND)
    }

    /// Writes `data` at `offset` as one request (at most [`vio::MAX_IO`]
    /// bytes) with `flags` ([`vio::WRITE_AT`]: at the offset even on a
    /// handle opened with `O_APPEND`), and gets the file's attributes.
    pub fn write_flagged(
        &self,
        fh: Fh,
        offset: u64,
        data: &[u8],
        flags: u32,
    ) -> Result<(usize, Option<Attr>), ClientError> {
        if data.len() > vio::MAX_IO as usize {
            return Err(ClientError::Server(Errno::EINVAL));
        }
        self.write_with_attr(fh, offset, data, flags)
    }

    fn write_with_attr(
        &self,
        fh: Fh,
        offset: u64,
        data: &[u8],
        flags: u32,
    ) -> Result<(usize, Option<Attr>), ClientError> {
        let mut m = Request::Write {
            handle: fh.0,
            offset,
            count: data.len() as u32,
            flags,
        }
        .encode();
        let mut buf = Vec::with_capacity(data.len() + ATTR_LEN);
        buf.extend_from_slice(data);
        buf.resize(data.len() + ATTR_LEN, 0);
        self.exchange(&mut m, Some(Segment::ReadWrite(&mut buf)))?;
        let took = vio::reply_words(&m)[0] as usize;
        if took == 0 || took > data.len() {
            return Err(ClientError::Malformed(format!(
                "WRITE accepted {took} bytes of {}",
                data.len()
            )));
        }
        // An older server leaves the room as it was: all zero.
        let attr = Attr::decode(&buf[data.len()..]).ok().filter(|a| a.ino != 0);
        Ok((took, attr))
    }

    /// Attributes of `path`, following a final symbolic link.
    pub fn stat(&self, path: impl AsRef<[u8]>) -> Result<Attr, ClientError> {
        self.stat_inner(path.as_ref(), false)
    }

    /// Attributes of `path` itself (a final symbolic link is not followed).
    pub fn lstat(&self, path: impl AsRef<[u8]>) -> Result<Attr, ClientError> {
        self.stat_inner(path.as_ref(), true)
    }

    fn stat_inner(&self, p: &[u8], nofollow: bool) -> Result<Attr, ClientError> {
        let req = Request::Stat {
            path_len: Self::len32(p)?,
            nofollow,
        };
        let (_, out) = self.call(req, p, ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Attributes of an open file.
    pub fn fstat(&self, fh: Fh) -> Result<Attr, ClientError> {
        let (_, out) = self.call(Request::Fstat { handle: fh.0 }, &[], ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Opens a directory listing (a snapshot); returns the handle and the
    /// number of entries.
    pub fn opendir(&self, path: impl AsRef<[u8]>) -> Result<(Fh, u32), ClientError> {
        let p = path.as_ref();
        let req = Request::Opendir {
            path_len: Self::len32(p)?,
        };
        let (m, _) = self.call(req, p, 0)?;
        let [fh, count, ..] = vio::reply_words(&m);
        Ok((self.track(fh, p, 0, true), count))
    }

    /// Entries of an open listing from `index` on (as many as fit one reply).
    pub fn readdir_at(&self, fh: Fh, index: u32) -> Result<DirChunk, ClientError> {
        let req = Request::Readdir {
            handle: fh.0,
            index,
        };
        let (m, out) = self.call(req, &[], READDIR_BYTES)?;
        let [bytes, _, next, done, _] = vio::reply_words(&m);
        let n = (bytes as usize).min(out.len());
        let entries =
            Dirent::decode_all(&out[..n]).map_err(|e| ClientError::Malformed(e.to_string()))?;
        Ok(DirChunk {
            entries,
            next,
            done: done != 0,
        })
    }

    /// [`Client::readdir_at`] with each entry's attributes (READDIRPLUS;
    /// an entry removed since the listing was taken has attributes of
    /// inode 0). The entries are those from `index` on, in order.
    /// `Ok(None)` from a server that does not know the request.
    pub fn readdirplus_at(&self, fh: Fh, index: u32) -> Result<Option<DirChunkPlus>, ClientError> {
        if self.no_readdirplus.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let req = Request::Readdirplus {
            handle: fh.0,
            index,
        };
        let (m, out) = match self.call(req, &[], READDIR_BYTES) {
            Err(ClientError::Server(Errno::ENOSYS)) => {
                self.no_readdirplus.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            r => r?,
        };
        let [bytes, _, next, done, _] = vio::reply_words(&m);
        let mut b = &out[..(bytes as usize).min(out.len())];
        let bad = |e: vio::DecodeError| ClientError::Malformed(e.to_string());
        let mut entries = Vec::new();
        while !b.is_empty() {
            let n = usize::from(*b.get(9).unwrap_or(&0));
            let (head, rest) = b.split_at(b.len().min(vio::DIRENT_HEAD + n));
            let mut e = Dirent::decode_all(head).map_err(bad)?;
            let a = Attr::decode(rest).map_err(bad)?;
            b = &rest[ATTR_LEN.min(rest.len())..];
            if let Some(e) = e.pop() {
                entries.push((e, a));
            }
        }
        Ok(Some(DirChunkPlus {
            entries,
            next,
            done: done != 0,
        }))
    }

    /// Opens the file at `path` (not creating it) and reads up to `max`
    /// bytes from its start in the same exchange (OPENREAD; at most
    /// [`OPEN_READ_MAX`]). Returns the handle, the attributes and the data
    /// (shorter than asked only at the end of the file; `None` from a
    /// server that does not know OPENREAD).
    pub fn open_read(
        &self,
        path: impl AsRef<[u8]>,
        flags: i32,
        max: usize,
    ) -> Result<(Fh, Attr, Option<Vec<u8>>), ClientError> {
        let p = path.as_ref();
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL);
        if self.no_openread.load(Ordering::Relaxed) {
            let (fh, a) = self.open(p, flags, 0)?;
            return Ok((fh, a, None));
        }
        let req = Request::Open {
            prefetch: true,
            path_len: Self::len32(p)?,
            flags: flags as u32,
            mode: 0,
            owner: Owner::default(),
        };
        let room = ATTR_LEN + max.min(OPEN_READ_MAX);
        let (m, out) = match self.call(req, p, room) {
            Err(ClientError::Server(Errno::ENOSYS)) => {
                self.no_openread.store(true, Ordering::Relaxed);
                let (fh, a) = self.open(p, flags, 0)?;
                return Ok((fh, a, None));
            }
            r => r?,
        };
        let [h, n, ..] = vio::reply_words(&m);
        let attr = Self::attr_of(&out)?;
        let data = out
            .get(ATTR_LEN..ATTR_LEN + n as usize)
            .ok_or_else(|| ClientError::Malformed(format!("OPENREAD: {n} bytes of data")))?
            .to_vec();
        Ok((self.track(h, p, flags, false), attr, Some(data)))
    }

    /// Asks the server to tell this client of changes other clients make
    /// (WATCH): `sink` is called with each [`vio::Invalidation`] and its
    /// path, on a callback process this starts on `kernel`, before the
    /// server is answered (see `callback_loop`). `Ok(false)` from a server that does not know
    /// WATCH (then nothing is reported). The callback process ends with
    /// the kernel.
    pub fn watch<F>(&self, kernel: &Kernel, sink: F) -> Result<bool, ClientError>
    where
        F: Fn(vio::Invalidation, &[u8]) + Send + 'static,
    {
        let (cb, _t) = kernel.spawn("vio-callback", move |p| callback_loop(&p, &sink))?;
        let p = self.pool.take();
        let r = self.send_watch(&p, self.server(), cb);
        if r.is_err() {
            let _ = p.destroy(cb);
        }
        self.pool.give(p);
        match r {
            Ok(()) => {
                *lock(&self.callback) = Some(cb);
                Ok(true)
            }
            Err(ClientError::Server(Errno::ENOSYS)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn send_watch(&self, p: &Process, server: Pid, cb: Pid) -> Result<(), ClientError> {
        let members: Vec<u8> = self
            .members
            .iter()
            .flat_map(|m| m.0.to_be_bytes())
            .collect();
        let mut m = Request::Watch {
            callback: cb.0,
            members: self.members.len() as u32,
            flags: vio::WATCH_RENAMES,
        }
        .encode();
        p.send_with_segment(&mut m, server, Segment::Read(&members))?;
        match vio::status(&m) {
            Errno::OK => Ok(()),
            e => Err(ClientError::Server(e)),
        }
    }

    /// Every entry of the directory at `path` (without `.` and `..`).
    pub fn readdir(&self, path: impl AsRef<[u8]>) -> Result<Vec<Dirent>, ClientError> {
        let (fh, _) = self.opendir(path)?;
        let mut out = Vec::new();
        let mut at = 0;
        let r = loop {
            match self.readdir_at(fh, at) {
                Ok(c) => {
                    out.extend(c.entries);
                    if c.done || c.next <= at {
                        break Ok(());
                    }
                    at = c.next;
                }
                Err(e) => break Err(e),
            }
        };
        let closed = self.close(fh);
        r?;
        closed?;
        Ok(out)
    }

    /// Makes a directory.
    pub fn mkdir(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<Attr, ClientError> {
        self.mkdir_as(path, mode, Owner::default())
    }

    /// [`Client::mkdir`] on behalf of `owner`.
    pub fn mkdir_as(
        &self,
        path: impl AsRef<[u8]>,
        mode: u32,
        owner: Owner,
    ) -> Result<Attr, ClientError> {
        self.mkdir_in(path, mode, owner).map(|(a, _)| a)
    }

    /// [`Client::mkdir_as`], also answering the attributes of the
    /// directory it was made in, after the change (`None` from a server
    /// that does not send them).
    pub fn mkdir_in(
        &self,
        path: impl AsRef<[u8]>,
        mode: u32,
        owner: Owner,
    ) -> Result<(Attr, Option<Attr>), ClientError> {
        let p = path.as_ref();
        let req = Request::Mkdir {
            path_len: Self::len32(p)?,
            mode,
            owner,
        };
        let (m, out) = self.call(req, p, 2 * ATTR_LEN)?;
        let parent = Self::parent_attr(&m, 0, &out[ATTR_LEN..]);
        Ok((Self::attr_of(&out)?, parent))
    }

    /// The directory attributes a server appended (reply word `word` + 1
    /// is 1), from `out`.
    fn parent_attr(m: &Message, word: usize, out: &[u8]) -> Option<Attr> {
        (vio::reply_words(m)[word] == 1)
            .then(|| Attr::decode(out).ok())
            .flatten()
    }

    /// Makes a FIFO, socket or device node (or an empty regular file):
    /// `mode` has the file type and permission bits, `rdev` the device
    /// number of a device node.
    pub fn mknod(
        &self,
        path: impl AsRef<[u8]>,
        mode: u32,
        rdev: u32,
        owner: Owner,
    ) -> Result<Attr, ClientError> {
        let p = path.as_ref();
        let req = Request::Mknod {
            path_len: Self::len32(p)?,
            mode,
            rdev,
            owner,
        };
        let (_, out) = self.call(req, p, ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: impl AsRef<[u8]>) -> Result<(), ClientError> {
        self.rmdir_in(path).map(|_| ())
    }

    /// [`Client::rmdir`], answering the attributes of the directory it
    /// was in, after the change (`None` from a server that does not).
    pub fn rmdir_in(&self, path: impl AsRef<[u8]>) -> Result<Option<Attr>, ClientError> {
        let p = path.as_ref();
        let req = Request::Rmdir {
            path_len: Self::len32(p)?,
        };
        let (m, out) = self.call(req, p, ATTR_LEN)?;
        Ok(Self::parent_attr(&m, 0, &out))
    }

    /// Removes a name.
    pub fn unlink(&self, path: impl AsRef<[u8]>) -> Result<(), ClientError> {
        self.unlink_in(path).map(|_| ())
    }

    /// [`Client::unlink`], answering the attributes of the directory the
    /// name was in, after the change (`None` from a server that does not).
    pub fn unlink_in(&self, path: impl AsRef<[u8]>) -> Result<Option<Attr>, ClientError> {
        let p = path.as_ref();
        let req = Request::Unlink {
            path_len: Self::len32(p)?,
        };
        let (m, out) = self.call(req, p, ATTR_LEN)?;
        Ok(Self::parent_attr(&m, 0, &out))
    }

    /// Renames `old` to `new` (`flags`: [`vio::RENAME_NOREPLACE`],
    /// [`vio::RENAME_EXCHANGE`]).
    pub fn rename(
        &self,
        old: impl AsRef<[u8]>,
        new: impl AsRef<[u8]>,
        flags: u32,
    ) -> Result<(), ClientError> {
        let (a, b) = (old.as_ref(), new.as_ref());
        let req = Request::Rename {
            old_len: Self::len32(a)?,
            new_len: Self::len32(b)?,
            flags,
        };
        self.call(req, &[a, b].concat(), 0).map(|_| ())
    }

    /// Sets the size of the file at `path`.
    pub fn truncate(&self, path: impl AsRef<[u8]>, size: u64) -> Result<(), ClientError> {
        let p = path.as_ref();
        let req = Request::Truncate {
            path_len: Self::len32(p)?,
            size,
        };
        self.call(req, p, 0).map(|_| ())
    }

    /// Sets the size of an open file.
    pub fn ftruncate(&self, fh: Fh, size: u64) -> Result<(), ClientError> {
        self.call(Request::Ftruncate { handle: fh.0, size }, &[], 0)
            .map(|_| ())
    }

    /// Makes an open file durable (its data only with `datasync`).
    pub fn fsync(&self, fh: Fh, datasync: bool) -> Result<(), ClientError> {
        let req = Request::Fsync {
            handle: fh.0,
            datasync,
            flush_only: false,
        };
        self.call(req, &[], 0).map(|_| ())
    }

    /// Waits for the server's deferred writes to the file and reports
    /// their errors, without forcing the data to disk (close-time flush).
    pub fn flush(&self, fh: Fh) -> Result<(), ClientError> {
        // A handle never written has no deferred writes to wait for: no
        // exchange (a close of a read-only file then costs nothing, and
        // does not wait for a server that went away).
        if let Some(r) = &self.reopen {
            if lock(&r.handles)
                .open
                .get(&fh.0)
                .is_some_and(|o| !o.dirty && !o.broken)
            {
                return Ok(());
            }
        }
        let req = Request::Fsync {
            handle: fh.0,
            datasync: false,
            flush_only: true,
        };
        self.call(req, &[], 0).map(|_| ())
    }

    /// Makes a symbolic link at `path` holding `target`.
    pub fn symlink(
        &self,
        target: impl AsRef<[u8]>,
        path: impl AsRef<[u8]>,
    ) -> Result<Attr, ClientError> {
        self.symlink_as(target, path, Owner::default())
    }

    /// [`Client::symlink`] on behalf of `owner`.
    pub fn symlink_as(
        &self,
        target: impl AsRef<[u8]>,
        path: impl AsRef<[u8]>,
        owner: Owner,
    ) -> Result<Attr, ClientError> {
        let (t, p) = (target.as_ref(), path.as_ref());
        let req = Request::Symlink {
            target_len: Self::len32(t)?,
            path_len: Self::len32(p)?,
            owner,
        };
        let (_, out) = self.call(req, &[t, p].concat(), ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// The target of the symbolic link at `path`.
    pub fn readlink(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>, ClientError> {
        let p = path.as_ref();
        let req = Request::Readlink {
            path_len: Self::len32(p)?,
        };
        let (m, mut out) = self.call(req, p, vio::MAX_PATH)?;
        let n = vio::reply_words(&m)[0] as usize;
        if n > out.len() {
            return Err(ClientError::Malformed(format!("link target of {n} bytes")));
        }
        out.truncate(n);
        Ok(out)
    }

    /// Changes attributes of `path` (a final symbolic link is not followed).
    pub fn setattr(&self, path: impl AsRef<[u8]>, s: &SetAttr) -> Result<Attr, ClientError> {
        let p = path.as_ref();
        let req = Request::Setattr {
            path_len: Self::len32(p)?,
        };
        let mut input = Vec::with_capacity(SETATTR_LEN + p.len());
        input.extend_from_slice(&s.encode());
        input.extend_from_slice(p);
        let (_, out) = self.call(req, &input, ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Changes attributes of an open file by its handle (works after its
    /// names are gone): mode, owner, times and size as `s` asks.
    pub fn fsetattr(&self, fh: Fh, s: &SetAttr) -> Result<Attr, ClientError> {
        let (_, out) = self.call(Request::Fsetattr { handle: fh.0 }, &s.encode(), ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Sets the permission bits of `path`.
    pub fn chmod(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<Attr, ClientError> {
        let s = SetAttr {
            valid: vio::SET_MODE,
            mode,
            ..SetAttr::default()
        };
        self.setattr(path, &s)
    }

    /// Makes a hard link `new` to `old`.
    pub fn link(&self, old: impl AsRef<[u8]>, new: impl AsRef<[u8]>) -> Result<Attr, ClientError> {
        let (a, b) = (old.as_ref(), new.as_ref());
        let req = Request::Link {
            old_len: Self::len32(a)?,
            new_len: Self::len32(b)?,
        };
        let (_, out) = self.call(req, &[a, b].concat(), ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Statistics of the server's file system.
    pub fn statfs(&self) -> Result<StatFs, ClientError> {
        let (_, out) = self.call(Request::Statfs, &[], vio::STATFS_LEN)?;
        StatFs::decode(&out).map_err(|e| ClientError::Malformed(e.to_string()))
    }

    /// Reads a whole file.
    pub fn read_file(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>, ClientError> {
        let (fh, a) = self.open(path, libc::O_RDONLY, 0)?;
        let mut buf = vec![0u8; a.size as usize];
        let r = self.read(fh, 0, &mut buf);
        let c = self.close(fh);
        let n = r?;
        c?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Loads a program image the way V's team server does: a header read
    /// (one page, 2 datagrams) that checks the file is a program (ELF or
    /// `#!` script, regular, executable) and learns its size, then the rest
    /// of the image in requests of up to `vio::MAX_IO` bytes, each of which
    /// the server moves with MoveTo in its transfer unit. Images larger
    /// than `max_size` are refused with `EFBIG`.
    pub fn load_program(
        &self,
        path: impl AsRef<[u8]>,
        max_size: u64,
    ) -> Result<ProgramImage, ClientError> {
        let (fh, a) = self.open(path, libc::O_RDONLY, 0)?;
        let r = self.load_open_program(fh, &a, max_size);
        let c = self.close(fh);
        let img = r?;
        c?;
        Ok(img)
    }

    fn load_open_program(
        &self,
        fh: Fh,
        a: &Attr,
        max_size: u64,
    ) -> Result<ProgramImage, ClientError> {
        if a.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(ClientError::Server(Errno::EACCES));
        }
        if a.mode & 0o111 == 0 {
            return Err(ClientError::Server(Errno::EACCES));
        }
        if a.size > max_size || a.size > usize::MAX as u64 {
            return Err(ClientError::Server(Errno::EFBIG));
        }
        let size = a.size as usize;
        let mut image = vec![0u8; size];
        let head = size.min(HEADER_BYTES);
        let got = self.read(fh, 0, &mut image[..head])?;
        let kind = ProgramKind::of(&image[..got]).ok_or(ClientError::Server(Errno::ENOEXEC))?;
        let mut done = got;
        if got == head && size > head {
            let req = self.max_request.max(vio::MAX_IO as usize);
            while done < size {
                let n = (size - done).min(req);
                let mut m = Request::Read {
                    handle: fh.0,
                    offset: done as u64,
                    count: n as u32,
                }
                .encode();
                self.exchange(&mut m, Some(Segment::Write(&mut image[done..done + n])))?;
                let r = vio::reply_words(&m)[0] as usize;
                if r > n {
                    return Err(ClientError::Malformed(format!(
                        "READ answered {r} bytes for {n}"
                    )));
                }
                done += r;
                if r < n {
                    break;
                }
            }
        }
        image.truncate(done);
        Ok(ProgramImage { kind, image })
    }

    /// Creates or replaces a file with `data` (mode 0644); with `sync`
    /// the data is durable when this returns.
    pub fn write_file(
        &self,
        path: impl AsRef<[u8]>,
        data: &[u8],
        sync: bool,
    ) -> Result<(), ClientError> {
        let (fh, _) = self.create(path, 0o644)?;
        let mut r = self.write(fh, 0, data).map(|_| ());
        if r.is_ok() && sync {
            r = self.fsync(fh, false);
        }
        let c = self.close(fh);
        r?;
        c
    }
}

/// Does this failure of an exchange with `server` mean it went away?
fn gone(e: &IpcError, server: Pid) -> bool {
    matches!(e, IpcError::NoSuchProcess(p) if *p == server) || matches!(e, IpcError::Timeout(_))
}

/// A shorter-lived view of a segment, for a re-send.
fn reborrow<'b>(s: &'b mut Segment<'_>) -> Segment<'b> {
    match s {
        Segment::Read(b) => Segment::Read(b),
        Segment::Write(b) => Segment::Write(b),
        Segment::ReadWrite(b) => Segment::ReadWrite(b),
    }
}

/// May `q` be sent again to a restarted server when its first sending's
/// outcome is unknown? Yes if doing it twice leaves the same result as
/// once: reads and lookups, a WRITE at an offset (same bytes, same place;
/// not an append, which would add them twice), setting
/// absolute attributes or sizes, and opening (the old server's handle died
/// with it) unless the open must create the file (`O_EXCL`). Not mkdir,
/// unlink, rename, link or symlink: the second would fail where the first
/// succeeded.
fn safe_to_resend(q: &Request) -> bool {
    match q {
        Request::Open { flags, .. } => *flags as i32 & libc::O_EXCL == 0,
        Request::Write { flags, .. } => flags & vio::WRITE_APPEND == 0,
        Request::Opendir { .. }
        | Request::Setattr { .. }
        | Request::Truncate { .. }
        | Request::Ftruncate { .. } => true,
        q => q.idempotent(),
    }
}
