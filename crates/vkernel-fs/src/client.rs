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
//!
//! The requests are grouped by concern in submodules (`files`, `names`,
//! `attrs`, `dirs`, `alloc`, `watching`); `connection` holds the exchange
//! itself, rediscovery of a restarted server and the handle table.

mod alloc;
mod attrs;
mod connection;
mod dirs;
mod files;
mod names;
mod watching;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use vkernel::service::ClientPool;
use vkernel::{IpcError, Kernel, Message, Pid, Segment};

use crate::vio::{self, Attr, Dirent, Errno, Request};

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
    /// The server does not know REMOVEV.
    no_removev: std::sync::atomic::AtomicBool,
}

/// Lock waits a client has in flight at once (more queue behind them).
const LOCK_WAITERS: usize = 8;

/// Most bytes [`Client::write_attr`] writes with attributes answered.
pub const WRITE_ATTR_MAX: usize = 128 << 10;

/// Most bytes [`Client::open_read`] asks for with the open.
pub const OPEN_READ_MAX: usize = 60 << 10;

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
            no_removev: Default::default(),
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

    /// A path's length for a request word (`ENAMETOOLONG`, as the server
    /// would answer, over [`vio::MAX_REQUEST_PATH`]).
    fn len32(b: &[u8]) -> Result<u32, ClientError> {
        Self::len_upto(b, vio::MAX_REQUEST_PATH)
    }

    fn len_upto(b: &[u8], most: usize) -> Result<u32, ClientError> {
        if b.len() > most {
            return Err(ClientError::Server(Errno::ENAMETOOLONG));
        }
        Ok(b.len() as u32)
    }
}
