//! The file server: V I/O requests executed against one exported tree.
//!
//! The server runs in a [`vkernel::service::WorkerPool`]: one registered
//! pid, the *dispatcher*, receives every request and Forwards it to an
//! idle *worker* process, so many clients are served at once behind one
//! name (GetPid finds the dispatcher; a forwarded request keeps its
//! sender, so the worker replies, moves data and reads the appended
//! segment exactly as if the client had sent to it). Requests that arrive
//! while every worker is busy wait in the dispatcher's queue.
//!
//! Per file (device, inode) the server keeps a small I/O state under a
//! mutex, which orders every data operation on the file:
//! - **write-behind**: a WRITE is gathered (appended part, then MoveFrom in
//!   transfer units), the reply goes out, and only then is the data written
//!   to the file — still under the file's lock, so any later request on the
//!   file sees it. A failed deferred write is remembered and reported by the
//!   file's next WRITE, FSYNC or CLOSE (like NFS and Linux writeback).
//! - **read-ahead**: after answering a sequential READ the worker reads the
//!   next window into the file's buffer while the client digests the page;
//!   the next READ is served from memory. Writes and truncates drop the
//!   buffer; a size or mtime change made behind the server's back too.
//! - **fsync** waits for the deferred write and calls fsync(2)/fdatasync(2).
//!
//! Bad requests are answered with an errno-like status and never panic.
//!
//! This file holds the server's configuration, state, startup and the
//! request's way in (`Req::execute` dispatches); the handlers are grouped
//! by concern: `data` (open files, READ, WRITE), `names`, `attrs`, `dirs`,
//! `alloc`, `locking` (LOCK and its processes) and `watching`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use vkernel::service::{Handler, PoolConfig, Request as PoolRequest, WorkerPool};
use vkernel::{HostId, IpcError, Kernel, Message, Pid};

mod alloc;
mod attrs;
mod data;
mod dirs;
mod locking;
mod names;
mod watching;

use crate::confine::Root;
use crate::locks;
use crate::vio::{self, Dirent, Errno, Request, ATTR_LEN};
use crate::watch::Watchers;
use locking::{lock_checker, lock_waiter};

/// Internal: a worker tells the dispatcher it is idle.
const IDLE: u32 = 0x56_00ff;
/// Internal: a worker tells the lock-waiting process that waiting
/// requests were decided.
const LOCKD_WAKE: u32 = 0x56_00fe;

/// Locks, and the LOCK requests the lock-waiting process holds.
#[derive(Default)]
struct LockState {
    table: locks::Table,
    /// Waiting slot → the client whose request was forwarded for it.
    expect: HashMap<u32, Pid>,
    /// Slots whose forwarded request the lock-waiting process received.
    arrived: HashMap<u32, Pid>,
    /// Slots decided (granted: OK; cancelled: EINTR), not yet answered.
    decided: HashMap<u32, Errno>,
}

/// Errors starting a file server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A process could not be created.
    #[error("creating a server process: {0}")]
    Ipc(#[from] IpcError),
    /// The root could not be opened (or the kernel cannot confine paths).
    #[error("export root: {0}")]
    Root(#[from] std::io::Error),
}

/// What a principal may do with the exported tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Nothing: every request is refused with EACCES.
    None,
    /// Read only: requests that would modify the tree get EROFS.
    ReadOnly,
    /// Read and write.
    ReadWrite,
}

impl std::str::FromStr for Access {
    type Err = String;
    fn from_str(s: &str) -> Result<Access, String> {
        match s {
            "none" => Ok(Access::None),
            "ro" => Ok(Access::ReadOnly),
            "rw" => Ok(Access::ReadWrite),
            _ => Err(format!("`{s}`: access is none, ro or rw")),
        }
    }
}

/// The server's map from principals (the sender's principal as the kernel
/// carries it, authenticated when a cluster key is set) to access.
#[derive(Clone, Debug)]
pub struct AccessPolicy {
    /// Access of principals not listed.
    pub default: Access,
    /// Per-principal access.
    pub principals: HashMap<u32, Access>,
}

impl Default for AccessPolicy {
    fn default() -> Self {
        AccessPolicy {
            default: Access::ReadWrite,
            principals: HashMap::new(),
        }
    }
}

impl AccessPolicy {
    /// The access of `principal`.
    pub fn of(&self, principal: u32) -> Access {
        self.principals
            .get(&principal)
            .copied()
            .unwrap_or(self.default)
    }
}

/// Who owns what clients create (docs/VIO.md, "Ownership").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Owners {
    /// The caller, as far as the server may: a request of principal 0 (a
    /// root mount, trusted to name its callers) creates as the user and
    /// group it carries; any other principal's as that principal (user
    /// and group). Only a server running as root can change owners; any
    /// other keeps everything its own.
    #[default]
    Caller,
    /// The server's own user, whoever asks (as before owners travelled).
    Server,
}

impl std::str::FromStr for Owners {
    type Err = String;
    fn from_str(s: &str) -> Result<Owners, String> {
        match s {
            "caller" => Ok(Owners::Caller),
            "server" => Ok(Owners::Server),
            _ => Err(format!("`{s}`: owners are caller or server")),
        }
    }
}

/// How a file server is set up.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Who may read and write (default: everyone may do everything).
    pub access: AccessPolicy,
    /// Logical id to register the dispatcher under (GetPid), if any.
    pub logical_id: Option<u32>,
    /// Worker processes (requests executed at once).
    pub workers: usize,
    /// Largest single MoveTo/MoveFrom of a READ or WRITE; answers up to
    /// this size come with the reply (sent ahead of it when larger than a
    /// datagram and the request is idempotent; docs/PROTOCOL.md §3a).
    pub transfer_unit: usize,
    /// Read-ahead window per file in bytes (0 = off).
    pub read_ahead: usize,
    /// Read-ahead memory for all files together.
    pub read_ahead_budget: usize,
    /// Reply to a WRITE before writing the data to the file.
    pub write_behind: bool,
    /// Open handles per client host.
    pub max_handles: usize,
    /// Requests queued at the dispatcher while every worker is busy;
    /// beyond this the dispatcher answers `EAGAIN`.
    pub queue: usize,
    /// Who owns created files.
    pub owners: Owners,
    /// Device nodes may be made (by principal 0 only).
    pub devices: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            access: AccessPolicy::default(),
            logical_id: None,
            workers: 8,
            transfer_unit: 1 << 20,
            read_ahead: 256 << 10,
            read_ahead_budget: 64 << 20,
            write_behind: true,
            max_handles: 4096,
            queue: 1024,
            owners: Owners::Caller,
            devices: true,
        }
    }
}

/// Counters of a file server.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Requests executed (any status).
    pub requests: AtomicU64,
    /// Requests answered with an error status.
    pub errors: AtomicU64,
    /// Bytes read for clients.
    pub bytes_read: AtomicU64,
    /// Bytes written for clients.
    pub bytes_written: AtomicU64,
    /// READ bytes served from the read-ahead buffer.
    pub read_ahead_hits: AtomicU64,
    /// fsync/fdatasync calls.
    pub syncs: AtomicU64,
    /// Deferred writes that failed (reported later to the client).
    pub deferred_errors: AtomicU64,
}

/// Cache-invalidation figures of a file server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Clients watching for changes now.
    pub watchers: usize,
    /// INVALIDATE messages sent.
    pub sent: u64,
    /// Watchers dropped because their callback could not be reached.
    pub dropped: u64,
}

/// Per-file I/O state, shared by every handle on the file.
#[derive(Default)]
struct Inode {
    io: Mutex<InodeIo>,
}

#[derive(Default)]
struct InodeIo {
    /// Read-ahead buffer: data at `off`, valid while the file's (size,
    /// mtime) is still `stamp`.
    ra: Option<ReadAhead>,
    /// A deferred write failed: reported by the next WRITE/FSYNC/CLOSE.
    error: Option<Errno>,
    /// End of the last READ (sequential detection).
    last_end: u64,
}

struct ReadAhead {
    off: u64,
    data: Vec<u8>,
    stamp: (u64, i64, u32),
}

enum Kind {
    File {
        file: std::fs::File,
        inode: Arc<Inode>,
        /// (device, inode) as clients see it in [`Attr`].
        id: (u32, u64),
        /// Opened with `O_APPEND` (the descriptor is not: the server
        /// appends itself).
        append: bool,
    },
    Dir {
        entries: Vec<Dirent>,
        /// The directory, for READDIRPLUS's attributes.
        dir: std::os::fd::OwnedFd,
    },
}

struct Handle {
    host: HostId,
    /// The principal that opened it: only it may use the handle.
    principal: u32,
    kind: Kind,
}

struct Handles {
    map: HashMap<u32, Arc<Handle>>,
    next: u32,
}

struct Shared {
    root: Root,
    cfg: ServerConfig,
    handles: Mutex<Handles>,
    inodes: Mutex<HashMap<(u64, u64), Weak<Inode>>>,
    ra_bytes: AtomicUsize,
    stats: ServerStats,
    /// The server runs as root, so it can give files to their creators.
    root_user: bool,
    watchers: Watchers,
    locks: Mutex<LockState>,
    /// The lock-waiting process: holds LOCK requests that must wait.
    lockd: std::sync::OnceLock<Pid>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Shared {
    fn inode(&self, id: (u64, u64)) -> Arc<Inode> {
        let mut map = lock(&self.inodes);
        if let Some(i) = map.get(&id).and_then(Weak::upgrade) {
            return i;
        }
        if map.len() > 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let i = Arc::new(Inode::default());
        map.insert(id, Arc::downgrade(&i));
        i
    }

    fn existing_inode(&self, id: (u64, u64)) -> Option<Arc<Inode>> {
        lock(&self.inodes).get(&id).and_then(Weak::upgrade)
    }

    fn add_handle(&self, host: HostId, principal: u32, kind: Kind) -> Result<u32, Errno> {
        let mut h = lock(&self.handles);
        let mine = h.map.values().filter(|x| x.host == host).count();
        if mine >= self.cfg.max_handles {
            return Err(Errno::EMFILE);
        }
        let mut id = h.next;
        while id == 0 || h.map.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        h.next = id.wrapping_add(1);
        h.map.insert(
            id,
            Arc::new(Handle {
                host,
                principal,
                kind,
            }),
        );
        Ok(id)
    }

    /// The handle if it exists and belongs to the caller's host and
    /// principal.
    fn handle(&self, id: u32, from: Pid, principal: u32) -> Result<Arc<Handle>, Errno> {
        match lock(&self.handles).map.get(&id) {
            Some(h) if h.host == from.host() && h.principal == principal => Ok(h.clone()),
            _ => Err(Errno::EBADF),
        }
    }

    fn drop_ra(&self, io: &mut InodeIo) {
        if let Some(ra) = io.ra.take() {
            self.ra_bytes.fetch_sub(ra.data.len(), Ordering::AcqRel);
        }
    }
}

/// A running file server. Dropping it does not stop it; its processes end
/// when their logical host shuts down.
pub struct FileServer {
    pool: WorkerPool,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FileServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileServer")
            .field("pid", &self.pool.pid())
            .field("root", &self.shared.root.path())
            .finish()
    }
}

impl FileServer {
    /// Starts a file server on `kernel` exporting the directory `root`.
    pub fn start(
        kernel: &Kernel,
        root: &std::path::Path,
        cfg: ServerConfig,
    ) -> Result<FileServer, ServerError> {
        let root = Root::open(root)?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos());
        let shared = Arc::new(Shared {
            root,
            cfg: cfg.clone(),
            handles: Mutex::new(Handles {
                map: HashMap::new(),
                next: seed | 1,
            }),
            inodes: Mutex::new(HashMap::new()),
            ra_bytes: AtomicUsize::new(0),
            stats: ServerStats::default(),
            root_user: rustix::process::geteuid().is_root(),
            watchers: Watchers::default(),
            locks: Mutex::new(LockState::default()),
            lockd: std::sync::OnceLock::new(),
        });
        let sh = shared.clone();
        let (lockd, _) = kernel.spawn("vio-lockd", move |p| lock_waiter(&p, &sh))?;
        let _ = shared.lockd.set(lockd);
        let sh = shared.clone();
        kernel.spawn("vio-lockcheck", move |p| lock_checker(&p, &sh))?;
        let pool = WorkerPool::start(
            kernel,
            PoolConfig {
                name: "vio".into(),
                workers: cfg.workers,
                queue: cfg.queue,
                idle_code: IDLE,
                inline_upto: INLINE_UPTO,
                logical_id: cfg.logical_id,
                worker_spin: Some(std::time::Duration::ZERO),
            },
            shared.clone(),
        )?;
        Ok(FileServer { pool, shared })
    }

    /// The pid clients send to (the dispatcher).
    pub fn pid(&self) -> Pid {
        self.pool.pid()
    }

    /// The exported directory.
    pub fn root(&self) -> &std::path::Path {
        self.shared.root.path()
    }

    /// Counters.
    pub fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }

    /// Cache-invalidation figures.
    pub fn watch_stats(&self) -> WatchStats {
        let w = &self.shared.watchers;
        WatchStats {
            watchers: w.len(),
            sent: w.sent.load(Ordering::Relaxed),
            dropped: w.dropped.load(Ordering::Relaxed),
        }
    }

    /// Open handles (all clients).
    pub fn open_handles(&self) -> usize {
        lock(&self.shared.handles).map.len()
    }

    /// Waits for the server's threads (they end when the host shuts down).
    pub fn join(self) {
        self.pool.join();
    }
}

impl Handler for Shared {
    type Scratch = Vec<u8>;

    fn handle(&self, r: PoolRequest<'_>, scratch: &mut Vec<u8>) -> Result<(), IpcError> {
        let req = Req { r, sh: self };
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let res = req.handle(scratch);
        if let Err(e) = &res {
            if !matches!(e, IpcError::Shutdown | IpcError::Destroyed) {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if scratch.capacity() > (32 << 20) {
            *scratch = Vec::new();
        }
        res
    }

    fn failed(&self) -> Message {
        vio::reply(Errno::EIO, &[])
    }

    fn busy(&self) -> Message {
        vio::reply(Errno::EAGAIN, &[])
    }

    /// Requests that take a few system calls on the exported tree (no
    /// data moved, no fsync, no wait for a lock, no Send to a watching
    /// client) and LOCK run on the dispatcher: a hand-off to a worker costs a
    /// thread wake-up, often more than the request itself.
    fn runs_inline(&self, r: &PoolRequest<'_>) -> bool {
        let Ok(req) = Request::decode(&r.message) else {
            return true; // answered at once with its error
        };
        let quiet = || self.watchers.quiet_for(r.from);
        match req {
            Request::Stat { .. }
            | Request::Fstat { .. }
            | Request::Readlink { .. }
            | Request::Statfs
            | Request::Getxattr { .. }
            | Request::Listxattr { .. }
            | Request::Opendir { .. }
            | Request::Readdir { .. }
            | Request::Readdirplus { .. }
            | Request::Close { .. }
            | Request::Closev { .. }
            // A lock is a table change under a mutex; a wait for one is
            // forwarded to the lock-waiting process at once.
            | Request::Lock { .. } => true,
            Request::Open { flags, .. } => {
                flags & (libc::O_CREAT | libc::O_TRUNC) as u32 == 0 || quiet()
            }
            Request::Mkdir { .. }
            | Request::Mknod { .. }
            | Request::Symlink { .. }
            | Request::Unlink { .. }
            | Request::Rmdir { .. }
            | Request::Rename { .. }
            | Request::Link { .. } => quiet(),
            _ => false,
        }
    }
}

/// Requests whose segment is at most this long come to the dispatcher
/// whole, for [`Handler::runs_inline`] (two paths and a record). Longer
/// paths (up to [`vio::MAX_REQUEST_PATH`]) are rare: `gather` pulls them
/// by MoveFrom.
const INLINE_UPTO: usize = 2 * vio::MAX_PATH + 256;

/// What a handler answers: a status with reply words, and bytes for the
/// client's segment.
enum Answer {
    Words(Vec<u32>),
    Data(Vec<u32>, Vec<u8>),
    /// An error status that still carries reply words (READLINK's ERANGE
    /// tells the length needed).
    Fail(Errno, Vec<u32>),
}

/// One request being executed, with the server's state.
struct Req<'a> {
    r: PoolRequest<'a>,
    sh: &'a Shared,
}

impl Req<'_> {
    fn seg_len(&self) -> usize {
        self.r.message.seg_len() as usize
    }

    /// Gathers the request's `n` input bytes from the read-granted
    /// segment: the appended part, then MoveFrom in transfer units.
    /// `Ok(Err(EPROTO))` if the segment does not grant them.
    fn gather(&self, buf: &mut Vec<u8>, n: usize) -> Result<Result<(), Errno>, IpcError> {
        buf.clear();
        if n == 0 {
            return Ok(Ok(()));
        }
        if !self.r.message.seg_access().read || self.seg_len() < n {
            return Ok(Err(Errno::EPROTO));
        }
        buf.resize(n, 0);
        let have = self.r.appended.len().min(n);
        buf[..have].copy_from_slice(&self.r.appended[..have]);
        let unit = self.sh.cfg.transfer_unit.max(1024);
        let mut at = have;
        while at < n {
            let k = unit.min(n - at);
            self.r
                .process
                .move_from(self.r.from, at as u32, &mut buf[at..at + k])?;
            at += k;
        }
        Ok(Ok(()))
    }

    /// Room for `n` output bytes in the write-granted segment?
    fn can_answer(&self, n: usize) -> bool {
        self.r.message.seg_access().write && self.seg_len() >= n
    }

    /// Sends `data` into the client's segment at 0 and the reply: with the
    /// reply up to one transfer unit (sent ahead of it when larger than a
    /// datagram and the request is idempotent), else MoveTo in transfer
    /// units first.
    fn reply_data(&self, r: &Message, data: &[u8]) -> Result<(), IpcError> {
        let unit = self.sh.cfg.transfer_unit.max(1024);
        if data.is_empty() {
            self.r.process.reply(r, self.r.from)
        } else if data.len() <= unit.max(ATTR_LEN) {
            self.r.process.reply_with_segment(r, self.r.from, 0, data)
        } else {
            let mut at = 0;
            while at < data.len() {
                let k = unit.min(data.len() - at);
                self.r
                    .process
                    .move_to(self.r.from, at as u32, &data[at..at + k])?;
                at += k;
            }
            self.r.process.reply(r, self.r.from)
        }
    }

    fn send(&self, r: Result<Answer, Errno>) -> Result<(), IpcError> {
        match r {
            Ok(Answer::Words(w)) => self
                .r
                .process
                .reply(&vio::reply(Errno::OK, &w), self.r.from),
            Ok(Answer::Data(w, d)) => self.reply_data(&vio::reply(Errno::OK, &w), &d),
            Ok(Answer::Fail(e, w)) => {
                self.sh.stats.errors.fetch_add(1, Ordering::Relaxed);
                self.r.process.reply(&vio::reply(e, &w), self.r.from)
            }
            Err(e) => {
                self.sh.stats.errors.fetch_add(1, Ordering::Relaxed);
                self.r.process.reply(&vio::reply(e, &[]), self.r.from)
            }
        }
    }

    fn handle(&self, scratch: &mut Vec<u8>) -> Result<(), IpcError> {
        let req = match Request::decode(&self.r.message) {
            Ok(r) => r,
            Err(e) => return self.send(Err(e)),
        };
        match self.sh.cfg.access.of(self.r.principal) {
            Access::ReadWrite => {}
            Access::ReadOnly if !req.modifies() => {}
            Access::ReadOnly => return self.send(Err(Errno::EROFS)),
            Access::None => return self.send(Err(Errno::EACCES)),
        }
        match req {
            Request::Read {
                handle,
                offset,
                count,
            }
            | Request::Write {
                handle,
                offset,
                count,
                ..
            } => {
                let h = match self.file(handle) {
                    Ok(h) => h,
                    Err(e) => return self.send(Err(e)),
                };
                let Kind::File {
                    file,
                    inode,
                    id,
                    append,
                } = &h.kind
                else {
                    return self.send(Err(Errno::EISDIR));
                };
                return match req {
                    Request::Write { flags, .. } => {
                        // An O_APPEND handle's plain writes are appends.
                        let at_end = flags & vio::WRITE_APPEND != 0
                            || (*append && flags & vio::WRITE_AT == 0);
                        let at = (!at_end).then_some(offset);
                        self.write(file, inode, *id, at, count, scratch)
                    }
                    _ => self.read(file, inode, offset, count, scratch),
                };
            }
            Request::Lock { .. } => return self.lock(req, scratch),
            _ => {}
        }
        let n = req.seg_input_len();
        if let Err(e) = self.gather(scratch, n)? {
            return self.send(Err(e));
        }
        let r = self.execute(req, scratch);
        if r.is_ok() && req.modifies() {
            self.report(&req, scratch, &r);
        }
        self.send(r)
    }

    /// Executes a request whose input was gathered: hands it to the
    /// handler of its kind (in the submodules, by concern).
    fn execute(&self, req: Request, input: &[u8]) -> Result<Answer, Errno> {
        match req {
            Request::Open {
                prefetch,
                path_len,
                flags,
                mode,
                owner,
            } => self.open(input, prefetch, path_len, flags, mode, owner),
            Request::Close { handle } => self.close_req(handle),
            Request::Closev { count } => self.closev(input, count),
            Request::Removev { count, .. } => self.removev(input, count),
            Request::Stat { path_len, nofollow } => self.stat(input, path_len, nofollow),
            Request::Fstat { handle } => self.fstat(handle),
            Request::Opendir { path_len } => self.opendir(input, path_len),
            Request::Readdir { handle, index } => self.readdir(handle, index, false),
            Request::Readdirplus { handle, index } => self.readdir(handle, index, true),
            Request::Mkdir {
                path_len,
                mode,
                owner,
            } => self.mkdir(input, path_len, mode, owner),
            Request::Mknod {
                path_len,
                mode,
                rdev,
                owner,
            } => self.mknod(input, path_len, mode, rdev, owner),
            Request::Rmdir { path_len } => self.rmdir(input, path_len),
            Request::Unlink { path_len } => self.unlink(input, path_len),
            Request::Rename {
                old_len,
                new_len,
                flags,
            } => self.rename(input, old_len, new_len, flags),
            Request::Truncate { path_len, size } => self.truncate(input, path_len, size),
            Request::Ftruncate { handle, size } => self.ftruncate(handle, size),
            Request::Fsync {
                handle,
                datasync,
                flush_only,
            } => self.fsync(handle, datasync, flush_only),
            Request::Symlink {
                target_len,
                path_len,
                owner,
            } => self.symlink(input, target_len, path_len, owner),
            Request::Fsetattr { handle } => self.fsetattr(input, handle),
            Request::Readlink { path_len } => self.readlink(input, path_len),
            Request::Setattr { path_len } => self.setattr(input, path_len),
            Request::Link { old_len, new_len } => self.link(input, old_len, new_len),
            Request::Getxattr {
                path_len,
                name_len,
                size,
            } => self.getxattr(input, path_len, name_len, size),
            Request::Listxattr { path_len, size } => self.listxattr(input, path_len, size),
            Request::Setxattr {
                path_len,
                name_len,
                value_len,
                flags,
            } => self.setxattr(input, path_len, name_len, value_len, flags),
            Request::Removexattr { path_len, name_len } => {
                self.removexattr(input, path_len, name_len)
            }
            Request::Fallocate { handle, mode } => self.fallocate(handle, mode, input),
            Request::Lseek {
                handle,
                whence,
                offset,
            } => self.lseek(handle, whence, offset),
            Request::Watch {
                callback,
                members,
                flags,
            } => self.watch(input, callback, members, flags),
            Request::Unwatch { callback } => self.unwatch(callback),
            Request::Statfs => self.statfs(),
            // Handled before the input is gathered.
            Request::Read { .. } | Request::Write { .. } | Request::Lock { .. } => {
                Err(Errno::EPROTO)
            }
        }
    }
}

/// The path at the start of a request's input, `n` bytes long.
fn path(input: &[u8], n: u32) -> Result<&[u8], Errno> {
    input.get(..n as usize).ok_or(Errno::EPROTO)
}

/// The two names at the start of a request's input, `a` and `b` bytes
/// long.
fn two(input: &[u8], a: u32, b: u32) -> Result<(&[u8], &[u8]), Errno> {
    let (a, b) = (a as usize, b as usize);
    Ok((
        input.get(..a).ok_or(Errno::EPROTO)?,
        input.get(a..a + b).ok_or(Errno::EPROTO)?,
    ))
}
