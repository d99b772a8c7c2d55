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

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use vkernel::service::{Handler, PoolConfig, Request as PoolRequest, WorkerPool};
use vkernel::{HostId, IpcError, Kernel, Message, Pid};

mod alloc;

use crate::confine::{self, Root};
use crate::locks::{self, Held};
use crate::vio::{self, Attr, Dirent, Errno, Owner, Request, SetAttr, ATTR_LEN, SETATTR_LEN};
use crate::watch::{self, Change, Watchers};

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
    /// client) run on the dispatcher: a hand-off to a worker costs a
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
            | Request::Closev { .. } => true,
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
/// whole, for [`Handler::runs_inline`] (two paths and a record).
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

    /// Tells watching clients what a successful request changed, before
    /// its client gets the reply.
    fn report(&self, req: &Request, input: &[u8], r: &Result<Answer, Errno>) {
        if self.sh.watchers.len() == 0 {
            return;
        }
        let seg = |a: usize, n: u32| input.get(a..a + n as usize).unwrap_or_default();
        let attr_id = || match r {
            Ok(Answer::Data(_, d)) => Attr::decode(d).ok().map(|a| (a.dev, a.ino)),
            _ => None,
        };
        let (entry, attr, data) = (vio::INVAL_ENTRY, vio::INVAL_ATTR, vio::INVAL_DATA);
        let mut changes = Vec::new();
        match *req {
            Request::Open {
                path_len, flags, ..
            } => {
                let p = seg(0, path_len);
                if flags & libc::O_CREAT as u32 != 0 {
                    changes.push(Change::Path(p, entry | attr | data));
                } else if flags & libc::O_TRUNC as u32 != 0 {
                    changes.push(Change::Path(p, attr | data));
                }
            }
            Request::Mkdir { path_len, .. }
            | Request::Mknod { path_len, .. }
            | Request::Rmdir { path_len }
            | Request::Unlink { path_len } => changes.push(Change::Path(seg(0, path_len), entry)),
            Request::Symlink {
                target_len,
                path_len,
                ..
            } => changes.push(Change::Path(seg(target_len as usize, path_len), entry)),
            Request::Rename {
                old_len,
                new_len,
                flags,
            } => {
                let (old, new) = (seg(0, old_len), seg(old_len as usize, new_len));
                let exchange = flags & vio::RENAME_EXCHANGE != 0;
                changes.push(Change::Rename(old, new, exchange));
            }
            Request::Link { old_len, new_len } => {
                changes.push(Change::Path(seg(old_len as usize, new_len), entry));
                if let Some(id) = attr_id() {
                    changes.push(Change::Id(id, attr));
                }
            }
            Request::Truncate { path_len, .. } => {
                changes.push(Change::Path(seg(0, path_len), attr | data));
            }
            Request::Setattr { path_len } => {
                changes.push(Change::Path(seg(SETATTR_LEN, path_len), attr | data));
            }
            Request::Setxattr { path_len, .. } | Request::Removexattr { path_len, .. } => {
                changes.push(Change::Path(seg(0, path_len), attr));
            }
            Request::Ftruncate { handle, .. }
            | Request::Fsetattr { handle }
            | Request::Fallocate { handle, .. } => {
                if let Ok(h) = self.sh.handle(handle, self.r.from, self.r.principal) {
                    if let Kind::File { id, .. } = h.kind {
                        changes.push(Change::Id(id, attr | data));
                    }
                }
            }
            _ => {}
        }
        self.sh
            .watchers
            .notify(self.r.process, self.r.from, &changes);
    }

    /// Gives the name `path`, just created, to whom the server's policy
    /// says (see [`Owners`]); `None` if it stays the server's.
    fn give(&self, path: &[u8], owner: Owner) -> Result<Option<Attr>, Errno> {
        if self.sh.cfg.owners == Owners::Server || !self.sh.root_user {
            return Ok(None);
        }
        let (uid, gid) = match self.r.principal {
            0 => (owner.uid, owner.gid),
            p => (p, p),
        };
        if (uid, gid) == (0, 0) {
            return Ok(None);
        }
        self.sh.root.give(path, uid, gid).map(Some)
    }

    /// An attribute answer, if the segment has room for it.
    fn attr_answer(&self, words: Vec<u32>, a: Attr) -> Answer {
        self.sh.watchers.saw(self.r.from, (a.dev, a.ino));
        if self.can_answer(ATTR_LEN) {
            Answer::Data(words, a.encode().to_vec())
        } else {
            Answer::Words(words)
        }
    }

    /// Adds the attributes of `path`'s directory (after the change) to an
    /// answer, after what it carries, when the client lent room for them;
    /// reply word `flag_word` (index into the words) + 1 says so.
    fn with_parent(&self, a: Answer, path: &[u8], flag_word: usize) -> Answer {
        let (mut words, mut data) = match a {
            Answer::Words(w) => (w, Vec::new()),
            Answer::Data(w, d) => (w, d),
            other => return other,
        };
        let parent = confine::split_last(path)
            .ok()
            .filter(|_| self.can_answer(data.len() + ATTR_LEN))
            .and_then(|(dir, _)| self.sh.root.stat(dir, false).ok());
        let Some((pa, _)) = parent else {
            return if data.is_empty() {
                Answer::Words(words)
            } else {
                Answer::Data(words, data)
            };
        };
        if words.len() <= flag_word {
            words.resize(flag_word + 1, 0);
        }
        words[flag_word] = 1;
        self.sh.watchers.saw(self.r.from, (pa.dev, pa.ino));
        data.extend_from_slice(&pa.encode());
        Answer::Data(words, data)
    }

    fn need_attr_room(&self) -> Result<(), Errno> {
        if self.can_answer(ATTR_LEN) {
            Ok(())
        } else {
            Err(Errno::EPROTO)
        }
    }

    /// Attributes by path, after any deferred write to the file finished.
    fn stat_path(&self, path: &[u8], follow: bool) -> Result<Attr, Errno> {
        let root = &self.sh.root;
        let (a, id) = root.stat(path, follow)?;
        match self.sh.existing_inode(id) {
            Some(ino) => {
                let _io = lock(&ino.io);
                Ok(root.stat(path, follow)?.0)
            }
            None => Ok(a),
        }
    }

    /// Truncates the regular file at `path` (following links beneath the
    /// root), ordered with its deferred writes.
    fn truncate_path(&self, path: &[u8], size: u64, nofollow: bool) -> Result<(), Errno> {
        let mut flags = libc::O_WRONLY as u32;
        if nofollow {
            flags |= libc::O_NOFOLLOW as u32;
        }
        let (fd, _) = self.sh.root.open_file(path, flags, 0)?;
        let file = std::fs::File::from(fd);
        let st = file.metadata().map_err(|e| Errno::from_io(&e))?;
        let id = {
            use std::os::unix::fs::MetadataExt;
            (st.dev(), st.ino())
        };
        let ino = self.sh.inode(id);
        let mut io = lock(&ino.io);
        self.sh.drop_ra(&mut io);
        file.set_len(size).map_err(|e| Errno::from_io(&e))
    }

    fn execute(&self, req: Request, input: &[u8]) -> Result<Answer, Errno> {
        let sh = self.sh;
        let root = &sh.root;
        let path = |n: u32| input.get(..n as usize).ok_or(Errno::EPROTO);
        let two = |a: u32, b: u32| -> Result<(&[u8], &[u8]), Errno> {
            let (a, b) = (a as usize, b as usize);
            Ok((
                input.get(..a).ok_or(Errno::EPROTO)?,
                input.get(a..a + b).ok_or(Errno::EPROTO)?,
            ))
        };
        match req {
            Request::Open {
                prefetch,
                path_len,
                flags,
                mode,
                owner,
            } => {
                let p = path(path_len)?;
                // Appends are done here (WRITE), so that a WRITE_AT of such
                // a handle can still write at its offset.
                let append = flags & libc::O_APPEND as u32 != 0;
                let (fd, created) = root.open_file(p, flags & !(libc::O_APPEND as u32), mode)?;
                if created {
                    self.give(p, owner)?;
                }
                let file = std::fs::File::from(fd);
                let st = rustix::fs::fstat(&file).map_err(Errno::from_rustix)?;
                let attr = confine::attr_of(&st);
                let inode = sh.inode(confine::file_id(&st));
                if flags & libc::O_TRUNC as u32 != 0 {
                    let mut io = lock(&inode.io);
                    sh.drop_ra(&mut io);
                }
                let readable = flags as i32 & libc::O_ACCMODE != libc::O_WRONLY;
                let room = self.seg_len().saturating_sub(ATTR_LEN).min(PREFETCH_MAX);
                let head = if prefetch && readable && self.can_answer(ATTR_LEN + room) {
                    let _io = lock(&inode.io);
                    read_head(&file, room)
                } else {
                    Vec::new()
                };
                let id = (attr.dev, attr.ino);
                let h = sh.add_handle(
                    self.r.from.host(),
                    self.r.principal,
                    Kind::File {
                        file,
                        inode,
                        id,
                        append,
                    },
                )?;
                if !prefetch {
                    // w4: the file was made by this open.
                    let a = self.attr_answer(vec![h, 0, 0, u32::from(created)], attr);
                    return Ok(if created {
                        self.with_parent(a, p, 2)
                    } else {
                        a
                    });
                }
                self.need_attr_room()?;
                self.sh.watchers.saw(self.r.from, id);
                sh.stats
                    .bytes_read
                    .fetch_add(head.len() as u64, Ordering::Relaxed);
                let mut out = attr.encode().to_vec();
                out.extend_from_slice(&head);
                Ok(Answer::Data(vec![h, head.len() as u32], out))
            }
            Request::Close { handle } => {
                self.close(handle)?;
                Ok(Answer::Words(vec![]))
            }
            Request::Closev { count } => {
                let list = input.get(..count as usize * 4).ok_or(Errno::EPROTO)?;
                let mut first = None;
                let mut closed = 0;
                for c in list.chunks_exact(4) {
                    match self.close(u32::from_be_bytes([c[0], c[1], c[2], c[3]])) {
                        Ok(()) => closed += 1,
                        Err(e) => {
                            first.get_or_insert(e);
                        }
                    }
                }
                match first {
                    None => Ok(Answer::Words(vec![closed])),
                    Some(e) => Ok(Answer::Fail(e, vec![closed])),
                }
            }
            Request::Stat { path_len, nofollow } => {
                self.need_attr_room()?;
                let a = self.stat_path(path(path_len)?, !nofollow)?;
                Ok(self.attr_answer(vec![], a))
            }
            Request::Fstat { handle } => {
                self.need_attr_room()?;
                let h = sh.handle(handle, self.r.from, self.r.principal)?;
                match &h.kind {
                    Kind::File { file, inode, .. } => {
                        let _io = lock(&inode.io);
                        let st = rustix::fs::fstat(file).map_err(Errno::from_rustix)?;
                        Ok(self.attr_answer(vec![], confine::attr_of(&st)))
                    }
                    Kind::Dir { .. } => Err(Errno::EBADF),
                }
            }
            Request::Opendir { path_len } => {
                let (dir, entries) = root.list_dir(path(path_len)?)?;
                let n = entries.len() as u32;
                let h = sh.add_handle(
                    self.r.from.host(),
                    self.r.principal,
                    Kind::Dir { entries, dir },
                )?;
                Ok(Answer::Words(vec![h, n]))
            }
            Request::Readdir { handle, index } | Request::Readdirplus { handle, index } => {
                let plus = matches!(req, Request::Readdirplus { .. });
                let h = sh.handle(handle, self.r.from, self.r.principal)?;
                let Kind::Dir { entries, dir } = &h.kind else {
                    return Err(Errno::ENOTDIR);
                };
                if !self.r.message.seg_access().write {
                    return Err(Errno::EPROTO);
                }
                let room = self.seg_len();
                let mut out = Vec::new();
                let mut i = index as usize;
                let extra = if plus { ATTR_LEN } else { 0 };
                while let Some(e) = entries.get(i) {
                    if out.len() + e.len() + extra > room {
                        break;
                    }
                    i += 1;
                    if plus {
                        // Gone since the listing was taken: zero attributes.
                        let a = confine::stat_entry(dir, &e.name).unwrap_or_default();
                        if a.ino != 0 {
                            self.sh.watchers.saw(self.r.from, (a.dev, a.ino));
                        }
                        e.encode_into(&mut out);
                        out.extend_from_slice(&a.encode());
                    } else {
                        e.encode_into(&mut out);
                    }
                }
                if i == index as usize && i < entries.len() {
                    return Err(Errno::ERANGE);
                }
                let done = u32::from(i >= entries.len());
                let count = (i - (index as usize).min(i)) as u32;
                Ok(Answer::Data(
                    vec![out.len() as u32, count, i as u32, done],
                    out,
                ))
            }
            Request::Mkdir {
                path_len,
                mode,
                owner,
            } => {
                let p = path(path_len)?;
                let a = root.mkdir(p, mode)?;
                let a = self.give(p, owner)?.unwrap_or(a);
                Ok(self.with_parent(self.attr_answer(vec![], a), p, 0))
            }
            Request::Mknod {
                path_len,
                mode,
                rdev,
                owner,
            } => {
                let device = matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK);
                if device && (!sh.cfg.devices || self.r.principal != 0) {
                    return Err(Errno(libc::EPERM as u32));
                }
                let p = path(path_len)?;
                // The wire's device number is Linux's 32-bit encoding,
                // which is also the low half of a dev_t.
                let a = root.mknod(p, mode, u64::from(rdev))?;
                let a = self.give(p, owner)?.unwrap_or(a);
                Ok(self.attr_answer(vec![], a))
            }
            Request::Rmdir { path_len } => {
                let p = path(path_len)?;
                root.rmdir(p)?;
                Ok(self.with_parent(Answer::Words(vec![]), p, 0))
            }
            Request::Unlink { path_len } => {
                let p = path(path_len)?;
                root.unlink(p)?;
                Ok(self.with_parent(Answer::Words(vec![]), p, 0))
            }
            Request::Rename {
                old_len,
                new_len,
                flags,
            } => {
                let (a, b) = two(old_len, new_len)?;
                root.rename(a, b, flags)?;
                Ok(Answer::Words(vec![]))
            }
            Request::Truncate { path_len, size } => {
                self.truncate_path(path(path_len)?, size, false)?;
                Ok(Answer::Words(vec![]))
            }
            Request::Ftruncate { handle, size } => {
                let h = sh.handle(handle, self.r.from, self.r.principal)?;
                let Kind::File { file, inode, .. } = &h.kind else {
                    return Err(Errno::EISDIR);
                };
                let mut io = lock(&inode.io);
                sh.drop_ra(&mut io);
                file.set_len(size).map_err(|e| Errno::from_io(&e))?;
                Ok(Answer::Words(vec![]))
            }
            Request::Fsync {
                handle,
                datasync,
                flush_only,
            } => {
                let h = sh.handle(handle, self.r.from, self.r.principal)?;
                let Kind::File { file, inode, .. } = &h.kind else {
                    return Ok(Answer::Words(vec![]));
                };
                let mut io = lock(&inode.io);
                if let Some(e) = io.error.take() {
                    return Err(e);
                }
                if !flush_only {
                    let r = if datasync {
                        file.sync_data()
                    } else {
                        file.sync_all()
                    };
                    r.map_err(|e| Errno::from_io(&e))?;
                    sh.stats.syncs.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Answer::Words(vec![]))
            }
            Request::Symlink {
                target_len,
                path_len,
                owner,
            } => {
                let (t, p) = two(target_len, path_len)?;
                let a = root.symlink(t, p)?;
                let a = self.give(p, owner)?.unwrap_or(a);
                Ok(self.attr_answer(vec![], a))
            }
            Request::Fsetattr { handle } => {
                let rec = input.get(..SETATTR_LEN).ok_or(Errno::EPROTO)?;
                let s = SetAttr::decode(rec).map_err(|_| Errno::EINVAL)?;
                let h = sh.handle(handle, self.r.from, self.r.principal)?;
                let Kind::File { file, inode, .. } = &h.kind else {
                    return Err(Errno::EBADF);
                };
                let mut io = lock(&inode.io);
                if s.valid & vio::SET_SIZE != 0 {
                    sh.drop_ra(&mut io);
                    file.set_len(s.size).map_err(|e| Errno::from_io(&e))?;
                }
                let a = if s.valid & !vio::SET_SIZE != 0 {
                    confine::setattr_fd(file, &s)?
                } else {
                    confine::attr_of(&rustix::fs::fstat(file).map_err(Errno::from_rustix)?)
                };
                Ok(self.attr_answer(vec![], a))
            }
            Request::Readlink { path_len } => {
                let t = root.readlink(path(path_len)?)?;
                if !self.can_answer(t.len()) {
                    // The client learns the size it needs.
                    return Ok(Answer::Fail(Errno::ERANGE, vec![t.len() as u32]));
                }
                Ok(Answer::Data(vec![t.len() as u32], t))
            }
            Request::Setattr { path_len } => {
                let rec = input.get(..SETATTR_LEN).ok_or(Errno::EPROTO)?;
                let s = SetAttr::decode(rec).map_err(|_| Errno::EINVAL)?;
                let p = input
                    .get(SETATTR_LEN..SETATTR_LEN + path_len as usize)
                    .ok_or(Errno::EPROTO)?;
                if s.valid & vio::SET_SIZE != 0 {
                    self.truncate_path(p, s.size, true)?;
                }
                let a = if s.valid & !vio::SET_SIZE != 0 {
                    root.setattr(p, &s)?
                } else {
                    self.stat_path(p, false)?
                };
                Ok(self.attr_answer(vec![], a))
            }
            Request::Link { old_len, new_len } => {
                let (a, b) = two(old_len, new_len)?;
                let at = root.link(a, b)?;
                Ok(self.attr_answer(vec![], at))
            }
            Request::Getxattr {
                path_len,
                name_len,
                size,
            } => {
                let (p, name) = two(path_len, name_len)?;
                self.xattr_allowed(name)?;
                let (n, v) = root.getxattr(p, name, size as usize)?;
                if size > 0 && !self.can_answer(v.len()) {
                    return Err(Errno::EPROTO);
                }
                Ok(Answer::Data(vec![n as u32], v))
            }
            Request::Listxattr { path_len, size } => {
                let (n, v) = root.listxattr(path(path_len)?, size as usize)?;
                if size > 0 && !self.can_answer(v.len()) {
                    return Err(Errno::EPROTO);
                }
                Ok(Answer::Data(vec![n as u32], v))
            }
            Request::Setxattr {
                path_len,
                name_len,
                value_len,
                flags,
            } => {
                let (p, name) = two(path_len, name_len)?;
                let at = (path_len + name_len) as usize;
                let value = input
                    .get(at..at + value_len as usize)
                    .ok_or(Errno::EPROTO)?;
                self.xattr_allowed(name)?;
                root.setxattr(p, name, value, flags)?;
                Ok(Answer::Words(vec![]))
            }
            Request::Removexattr { path_len, name_len } => {
                let (p, name) = two(path_len, name_len)?;
                self.xattr_allowed(name)?;
                root.removexattr(p, name)?;
                Ok(Answer::Words(vec![]))
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
            } => {
                let m = input.get(..members as usize * 4).ok_or(Errno::EPROTO)?;
                let renames = flags & vio::WATCH_RENAMES != 0;
                sh.watchers.add(Pid(callback), watch::members(m), renames)?;
                // A mount's first request: the file server's "connection".
                tracing::info!(
                    "file server: a client (callback {}) mounted; {} mounts watch",
                    Pid(callback),
                    sh.watchers.len()
                );
                Ok(Answer::Words(vec![]))
            }
            Request::Statfs => {
                if !self.can_answer(vio::STATFS_LEN) {
                    return Err(Errno::EPROTO);
                }
                let s = root.statfs()?;
                Ok(Answer::Data(vec![], s.encode().to_vec()))
            }
            // Handled before the input is gathered.
            Request::Read { .. } | Request::Write { .. } | Request::Lock { .. } => {
                Err(Errno::EPROTO)
            }
        }
    }

    /// Which extended attributes a client may reach: `user.*`; `trusted.*`
    /// and `security.*` only for principal 0 (a root mount); others (the
    /// `system.*` ACLs) are not supported.
    fn xattr_allowed(&self, name: &[u8]) -> Result<(), Errno> {
        if name.contains(&0) {
            return Err(Errno::EINVAL);
        }
        if name.starts_with(b"user.") {
            Ok(())
        } else if name.starts_with(b"trusted.") || name.starts_with(b"security.") {
            if self.r.principal == 0 {
                Ok(())
            } else {
                Err(Errno::EPERM)
            }
        } else {
            Err(Errno::EOPNOTSUPP)
        }
    }

    /// LOCK: sets, removes or tests a lock; a request that must wait is
    /// forwarded to the lock-waiting process, which answers it later.
    fn lock(&self, req: Request, buf: &mut Vec<u8>) -> Result<(), IpcError> {
        let Request::Lock {
            handle,
            flags,
            owner,
            pid,
        } = req
        else {
            return self.send(Err(Errno::EPROTO));
        };
        if let Err(e) = self.gather(buf, vio::LOCK_RANGE_LEN)? {
            return self.send(Err(e));
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i..i + 8]);
            u64::from_be_bytes(b)
        };
        let (start, end) = (word(0), word(8));
        if start > end {
            return self.send(Err(Errno::EINVAL));
        }
        let h = match self.sh.handle(handle, self.r.from, self.r.principal) {
            Ok(h) => h,
            Err(e) => return self.send(Err(e)),
        };
        let file = match &h.kind {
            Kind::File { id, .. } => *id,
            Kind::Dir { dir, .. } => match rustix::fs::fstat(dir) {
                Ok(st) => {
                    let a = confine::attr_of(&st);
                    (a.dev, a.ino)
                }
                Err(e) => return self.send(Err(Errno::from_rustix(e))),
            },
        };
        let kind = match flags & 3 {
            vio::LOCK_READ => Some(locks::Kind::Read),
            vio::LOCK_WRITE => Some(locks::Kind::Write),
            _ => None,
        };
        let owner = (self.r.from.host().0, owner);
        let want = Held {
            owner,
            kind: kind.unwrap_or(locks::Kind::Read),
            start,
            end,
            pid,
        };
        let mut st = lock(&self.sh.locks);
        st.table.client(owner.0, self.r.from.0);
        if flags & vio::LOCK_TEST != 0 {
            let c = kind.and_then(|_| st.table.conflict(file, &want));
            drop(st);
            return match c {
                None => self.send(Ok(Answer::Words(vec![0]))),
                Some(c) => {
                    let k = match c.kind {
                        locks::Kind::Read => vio::LOCK_READ,
                        locks::Kind::Write => vio::LOCK_WRITE,
                    };
                    let mut out = Vec::with_capacity(vio::LOCK_INFO_LEN);
                    out.extend_from_slice(&k.to_be_bytes());
                    out.extend_from_slice(&c.pid.to_be_bytes());
                    out.extend_from_slice(&c.start.to_be_bytes());
                    out.extend_from_slice(&c.end.to_be_bytes());
                    if !self.can_answer(out.len()) {
                        return self.send(Err(Errno::EPROTO));
                    }
                    self.send(Ok(Answer::Data(vec![k], out)))
                }
            };
        }
        if let (Some(_), Some(_)) = (kind, st.table.conflict(file, &want)) {
            if flags & vio::LOCK_WAIT == 0 {
                drop(st);
                return self.send(Err(Errno::EAGAIN));
            }
            let Some(&lockd) = self.sh.lockd.get() else {
                drop(st);
                return self.send(Err(Errno::ENOSYS));
            };
            let slot = st.table.wait(file, want);
            st.expect.insert(slot, self.r.from);
            drop(st);
            let mut m = self.r.message;
            m.0[1] = slot;
            // The client now awaits the lock-waiting process's reply.
            if let Err(e) = self.r.process.forward(&m, self.r.from, lockd) {
                let mut st = lock(&self.sh.locks);
                st.table.cancel(file, owner);
                st.expect.remove(&slot);
                drop(st);
                tracing::warn!("file server: forwarding a lock wait: {e}");
                return self.send(Err(Errno::EIO));
            }
            return Ok(());
        }
        st.table.set(file, owner, kind, (start, end), pid);
        let mut decided = Vec::new();
        if kind.is_none() && start == 0 && end >= i64::MAX as u64 {
            // The whole file unlocked (a close): its waits end too.
            decided.extend(
                st.table
                    .cancel(file, owner)
                    .iter()
                    .map(|w| (w.slot, Errno(libc::EINTR as u32))),
            );
        }
        if st.table.has_waiters() {
            decided.extend(st.table.grantable().iter().map(|w| (w.slot, Errno::OK)));
        }
        let wake = !decided.is_empty();
        st.decided.extend(decided);
        drop(st);
        if wake {
            if let Some(&lockd) = self.sh.lockd.get() {
                let mut m = Message::with_code(LOCKD_WAKE);
                let _ = self.r.process.send(&mut m, lockd);
            }
        }
        self.send(Ok(Answer::Words(vec![])))
    }

    /// Forgets a handle of the caller's; reports a deferred write error.
    fn close(&self, handle: u32) -> Result<(), Errno> {
        let sh = self.sh;
        let h = sh.handle(handle, self.r.from, self.r.principal)?;
        lock(&sh.handles).map.remove(&handle);
        if let Kind::File { inode, .. } = &h.kind {
            let mut io = lock(&inode.io);
            if let Some(e) = io.error.take() {
                return Err(e);
            }
        }
        Ok(())
    }

    fn file(&self, handle: u32) -> Result<Arc<Handle>, Errno> {
        let h = self.sh.handle(handle, self.r.from, self.r.principal)?;
        match h.kind {
            Kind::File { .. } => Ok(h),
            Kind::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    fn read(
        &self,
        file: &std::fs::File,
        inode: &Arc<Inode>,
        offset: u64,
        count: u32,
        buf: &mut Vec<u8>,
    ) -> Result<(), IpcError> {
        let sh = self.sh;
        if count as usize > self.seg_len() || (count > 0 && !self.r.message.seg_access().write) {
            return self.send(Err(Errno::EPROTO));
        }
        let want = count.min(vio::MAX_IO) as usize;
        buf.clear();
        buf.resize(want, 0);
        let (n, sequential) = {
            let mut io = lock(&inode.io);
            let sequential = offset == 0 || io.last_end == offset;
            let mut n = 0;
            if let Some(ra) = &io.ra {
                let fresh = stamp(file).is_some_and(|s| s == ra.stamp);
                if fresh && offset >= ra.off && offset < ra.off + ra.data.len() as u64 {
                    let at = (offset - ra.off) as usize;
                    n = (ra.data.len() - at).min(want);
                    buf[..n].copy_from_slice(&ra.data[at..at + n]);
                    sh.stats
                        .read_ahead_hits
                        .fetch_add(n as u64, Ordering::Relaxed);
                } else if !fresh {
                    sh.drop_ra(&mut io);
                }
            }
            while n < want {
                match file.read_at(&mut buf[n..], offset + n as u64) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        drop(io);
                        return self.send(Err(Errno::from_io(&e)));
                    }
                }
            }
            io.last_end = offset + n as u64;
            (n, sequential)
        };
        sh.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        let r = vio::reply(Errno::OK, &[n as u32]);
        self.reply_data(&r, &buf[..n])?;
        // Read ahead while the client digests this page.
        if sequential && n == want && n > 0 && sh.cfg.read_ahead > 0 {
            self.read_ahead(file, inode, offset + n as u64);
        }
        Ok(())
    }

    fn read_ahead(&self, file: &std::fs::File, inode: &Inode, at: u64) {
        let sh = self.sh;
        let win = sh.cfg.read_ahead;
        let mut io = lock(&inode.io);
        if let Some(ra) = &io.ra {
            // Still more than half a window ahead of the reader: enough.
            if at >= ra.off && ra.off + ra.data.len() as u64 >= at + (win / 2) as u64 {
                return;
            }
        }
        sh.drop_ra(&mut io);
        if sh.ra_bytes.load(Ordering::Acquire) + win > sh.cfg.read_ahead_budget {
            return;
        }
        let Some(st) = stamp(file) else { return };
        if at >= st.0 {
            return;
        }
        let mut data = vec![0u8; win.min((st.0 - at) as usize)];
        let mut n = 0;
        while n < data.len() {
            match file.read_at(&mut data[n..], at + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
        data.truncate(n);
        sh.ra_bytes.fetch_add(n, Ordering::AcqRel);
        io.ra = Some(ReadAhead {
            off: at,
            data,
            stamp: st,
        });
    }

    /// WRITE at `offset`, or at the end of the file (`None`: append).
    fn write(
        &self,
        file: &std::fs::File,
        inode: &Arc<Inode>,
        id: (u32, u64),
        offset: Option<u64>,
        count: u32,
        buf: &mut Vec<u8>,
    ) -> Result<(), IpcError> {
        let sh = self.sh;
        let n = count.min(vio::MAX_IO) as usize;
        if let Err(e) = self.gather(buf, n)? {
            return self.send(Err(e));
        }
        let mut io = lock(&inode.io);
        if let Some(e) = io.error.take() {
            drop(io);
            return self.send(Err(e));
        }
        // An append (no offset) goes at the end as it is under the file's
        // lock, which orders it after every earlier write here.
        let offset =
            match offset.map_or_else(|| rustix::fs::fstat(file).map(|st| st.st_size as u64), Ok) {
                Ok(at)
                    if at
                        .checked_add(n as u64)
                        .is_some_and(|end| end <= i64::MAX as u64) =>
                {
                    at
                }
                Ok(_) => {
                    drop(io);
                    return self.send(Err(Errno::EINVAL));
                }
                Err(e) => {
                    drop(io);
                    return self.send(Err(Errno::from_rustix(e)));
                }
            };
        sh.drop_ra(&mut io);
        let ok = vio::reply(Errno::OK, &[n as u32]);
        // Room for the attributes after the data: the client wants them
        // (so it need not ask), which needs the write done first.
        let with_attr = self.can_answer(n + ATTR_LEN);
        if with_attr {
            let r = file.write_all_at(buf, offset);
            let st = rustix::fs::fstat(file);
            drop(io);
            return match (r, st) {
                (Ok(()), Ok(st)) => {
                    sh.stats
                        .bytes_written
                        .fetch_add(n as u64, Ordering::Relaxed);
                    self.written(id);
                    let a = confine::attr_of(&st);
                    self.sh.watchers.saw(self.r.from, id);
                    self.r
                        .process
                        .reply_with_segment(&ok, self.r.from, n as u32, &a.encode())
                }
                (Err(e), _) => self.send(Err(Errno::from_io(&e))),
                (_, Err(e)) => self.send(Err(Errno::from_rustix(e))),
            };
        }
        if sh.cfg.write_behind {
            // Reply first; the file's lock keeps later requests behind the write.
            let r = self.r.process.reply(&ok, self.r.from);
            if let Err(e) = file.write_all_at(buf, offset) {
                sh.stats.deferred_errors.fetch_add(1, Ordering::Relaxed);
                io.error = Some(Errno::from_io(&e));
            } else {
                sh.stats
                    .bytes_written
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            // Still under the file's lock: a watcher that reads again
            // after being told reads the new data.
            self.written(id);
            r
        } else {
            let r = file.write_all_at(buf, offset);
            drop(io);
            match r {
                Ok(()) => {
                    sh.stats
                        .bytes_written
                        .fetch_add(n as u64, Ordering::Relaxed);
                    self.written(id);
                    self.r.process.reply(&ok, self.r.from)
                }
                Err(e) => self.send(Err(Errno::from_io(&e))),
            }
        }
    }
}

impl Req<'_> {
    /// Tells watchers that file `id`'s data and attributes changed.
    fn written(&self, id: (u32, u64)) {
        let c = [Change::Id(id, vio::INVAL_ATTR | vio::INVAL_DATA)];
        self.sh.watchers.notify(self.r.process, self.r.from, &c);
    }
}

/// The lock-waiting process: receives the LOCK requests workers forward
/// to it (each waiting for a lock) and answers each once a worker decided
/// it (granted, or cancelled) and woke it.
fn lock_waiter(p: &vkernel::Process, sh: &Shared) {
    let mut m = Message::zero();
    loop {
        let i = match p.receive(&mut m) {
            Ok(i) => i,
            Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
            Err(_) => continue,
        };
        match vio::code(&m) {
            vio::LOCK => {
                let slot = m.0[1];
                let mut st = lock(&sh.locks);
                if st.expect.get(&slot) != Some(&i.from) {
                    drop(st);
                    let _ = p.reply(&vio::reply(Errno::EPROTO, &[]), i.from);
                    continue;
                }
                st.arrived.insert(slot, i.from);
            }
            LOCKD_WAKE if i.from.host() == p.pid().host() => {
                let _ = p.reply(&vio::reply(Errno::OK, &[]), i.from);
            }
            _ => {
                let _ = p.reply(&vio::reply(Errno::EPROTO, &[]), i.from);
                continue;
            }
        }
        let ready: Vec<(Pid, Errno)> = {
            let mut st = lock(&sh.locks);
            let slots: Vec<u32> = st
                .decided
                .keys()
                .filter(|s| st.arrived.contains_key(s))
                .copied()
                .collect();
            slots
                .into_iter()
                .filter_map(|s| {
                    st.expect.remove(&s);
                    Some((st.arrived.remove(&s)?, st.decided.remove(&s)?))
                })
                .collect()
        };
        for (client, e) in ready {
            let _ = p.reply(&vio::reply(e, &[]), client);
        }
    }
}

/// How often the lock checker asks whether lock holders still exist.
const LOCK_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// The lock checker: every [`LOCK_CHECK`], asks whether each client that
/// holds or waits for locks still exists; a client found gone (no such
/// process, or its host unreachable at two checks in a row) loses its
/// locks and waits, so a crashed client never blocks the others for
/// good. Ends when the host shuts down.
fn lock_checker(p: &vkernel::Process, sh: &Shared) {
    let mut suspects: std::collections::HashSet<u16> = Default::default();
    loop {
        std::thread::sleep(LOCK_CHECK);
        if let Err(IpcError::Shutdown) | Err(IpcError::Destroyed) = p.process_exists(p.pid()) {
            return;
        }
        let clients = lock(&sh.locks).table.clients();
        for (host, pid) in clients {
            let gone = match p.process_exists(Pid(pid)) {
                Ok(true) => {
                    suspects.remove(&host);
                    false
                }
                Ok(false) => true,
                Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
                // Unreachable: gone at the second check in a row.
                Err(_) => !suspects.insert(host),
            };
            if !gone {
                continue;
            }
            suspects.remove(&host);
            tracing::warn!(
                "file server: lock holder host {host:04x} is gone; its locks are released"
            );
            let woke = {
                let mut st = lock(&sh.locks);
                let dropped = st.table.forget_host(host);
                let intr = Errno(libc::EINTR as u32);
                let mut decided: Vec<(u32, Errno)> =
                    dropped.iter().map(|w| (w.slot, intr)).collect();
                decided.extend(st.table.grantable().iter().map(|w| (w.slot, Errno::OK)));
                let any = !decided.is_empty();
                st.decided.extend(decided);
                any
            };
            if let (true, Some(&lockd)) = (woke, sh.lockd.get()) {
                let mut m = Message::with_code(LOCKD_WAKE);
                let _ = p.send(&mut m, lockd);
            }
        }
    }
}

/// Most bytes of a file an [`vio::OPENREAD`] answers with.
const PREFETCH_MAX: usize = 60 << 10;

/// Up to `n` bytes from the start of `file` (fewer at its end; none if
/// it cannot be read).
fn read_head(file: &std::fs::File, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    let mut at = 0;
    while at < n {
        match file.read_at(&mut buf[at..], at as u64) {
            Ok(0) => break,
            Ok(k) => at += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                at = 0;
                break;
            }
        }
    }
    buf.truncate(at);
    buf
}

/// (size, mtime seconds, mtime nanoseconds) of an open file.
fn stamp(file: &std::fs::File) -> Option<(u64, i64, u32)> {
    let st = rustix::fs::fstat(file).ok()?;
    let a = confine::attr_of(&st);
    Some((a.size, a.mtime, a.mtime_ns))
}
