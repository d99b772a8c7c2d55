//! A FUSE file system on the V I/O client, so unmodified programs use the
//! server's files (`vkernel mount`).
//!
//! FUSE speaks of inode numbers; the V I/O protocol of paths and handles.
//! A node table maps each inode number the kernel holds to the server's
//! file (device, inode) and the names it is known by, (parent, name); a
//! node's path is rebuilt by walking its parents, so a rename moves a
//! whole subtree by updating one entry. Inode numbers are the server's, so
//! hard links are one inode, as programs expect. Open files and directories use
//! server handles, so they keep working after a rename or unlink of their
//! name. The kernel's own page cache, read-ahead and POSIX locks are used;
//! permissions are checked by the kernel from the attributes
//! (`default_permissions`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno as FErrno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

mod alloc;
mod contents;
mod listing;
mod renamed;

use crate::client::{Client, ClientError, Fh, LockRequest, OPEN_READ_MAX};
use crate::vio::{self, Attr, Errno, Invalidation, Owner, SetAttr};
use contents::Contents;
use listing::{Entry, Listings};

const ROOT: u64 = 1;

/// A listing as a directory handle served here was opened with.
type Snapshot = Arc<Vec<(Entry, Attr)>>;

/// First directory handle of a listing served by the mount itself
/// (server handles are 32-bit).
const LOCAL_DIR: u64 = 1 << 63;

/// First file handle answered by the mount itself, for a file it holds
/// whole (server handles are 32-bit, local directory handles higher).
const LOCAL_FILE: u64 = 1 << 62;

/// First inode number made up for a file whose server inode number is
/// taken (by a file of another file system beneath the root) or unusable.
const SYNTHETIC: u64 = 1 << 63;

/// A file the kernel holds.
struct Node {
    /// The names it is known by, as (parent, name): several for a file
    /// with hard links, one for a directory, none once all are gone (it
    /// lives on for open handles).
    names: Vec<(u64, Vec<u8>)>,
    /// Its identity on the server: (device, inode).
    id: (u32, u64),
    lookups: u64,
    /// Its attributes as last answered, and when (served to GETATTR
    /// while younger than the mount's TTL; dropped by any change made
    /// here and by the server's invalidations).
    attr: Option<(Attr, Instant)>,
    /// Reads were answered for it since its data last changed: the
    /// kernel may hold its pages, so an open need not fetch its start.
    pages: bool,
    /// It has no security.capability attribute (asked before each write),
    /// as of its current attributes.
    no_caps: bool,
}

/// Inode numbers ↔ files and their names. A file's inode number is its
/// server inode number (unless taken), so every name of a file — hard
/// links included — is one inode here, and `st_ino` and directory
/// entries agree with the server.
struct Nodes {
    map: HashMap<u64, Node>,
    by_name: HashMap<(u64, Vec<u8>), u64>,
    by_id: HashMap<(u32, u64), u64>,
    next_synthetic: u64,
    /// Names found absent, and when (only while the server reports
    /// changes): the kernel looks a name up twice before an exclusive
    /// create, and the second is answered here.
    absent: HashMap<(u64, Vec<u8>), Instant>,
    /// Complete directory listings (only while the server reports changes).
    listings: Listings,
    /// Whole small files (only used while the server reports changes).
    contents: Contents,
    /// Changes the server reported so far: a listing or file fetched
    /// while one arrived may miss it, and is not kept.
    reported: u64,
}

/// Most absent names remembered.
const MAX_ABSENT: usize = 1 << 16;

impl Nodes {
    fn new() -> Nodes {
        let mut map = HashMap::new();
        map.insert(
            ROOT,
            Node {
                names: Vec::new(),
                id: (0, 0),
                lookups: 1,
                attr: None,
                pages: false,
                no_caps: false,
            },
        );
        Nodes {
            map,
            by_name: HashMap::new(),
            by_id: HashMap::new(),
            next_synthetic: SYNTHETIC,
            absent: HashMap::new(),
            listings: Listings::default(),
            contents: Contents::new(contents::BUDGET),
            reported: 0,
        }
    }

    /// Learns the root's server identity (its attributes came back).
    fn set_root(&mut self, a: &Attr) {
        let id = (a.dev, a.ino);
        if let Some(r) = self.map.get_mut(&ROOT) {
            if r.id != id {
                let old = std::mem::replace(&mut r.id, id);
                self.by_id.remove(&old);
                self.by_id.insert(id, ROOT);
            }
        }
    }

    /// The server path of a node by any of its names (`ENOENT` once all
    /// its names were removed, `ESTALE` for a node the kernel should not
    /// hold).
    fn path(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut at = ino;
        let mut hops = 0;
        while at != ROOT {
            let n = self.map.get(&at).ok_or(Errno(libc::ESTALE as u32))?;
            let (parent, name) = n.names.first().ok_or(Errno::ENOENT)?;
            parts.push(name);
            at = *parent;
            hops += 1;
            if hops > vio::MAX_PATH {
                return Err(Errno::ELOOP);
            }
        }
        parts.reverse();
        let p = parts.join(&b'/');
        if p.len() > vio::MAX_PATH {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(p)
    }

    fn child(&self, parent: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if name.len() > vio::MAX_NAME {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut p = self.path(parent)?;
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        Ok(p)
    }

    /// The inode number of the server's file `id`. A node of that id
    /// whose names are all gone stands for a file the server has since
    /// deleted and whose number it reused (a file open here keeps its
    /// number, and gets no new names): the new file gets another number,
    /// as the kernel may still hold the old one.
    fn ino_of(&mut self, id: (u32, u64)) -> u64 {
        if let Some(&ino) = self.by_id.get(&id) {
            if self.map.get(&ino).is_none_or(|n| !n.names.is_empty()) {
                return ino;
            }
            let n = self.next_synthetic;
            self.next_synthetic += 1;
            self.by_id.insert(id, n);
            return n;
        }
        let taken = |n: u64| n <= ROOT || n >= SYNTHETIC || self.map.contains_key(&n);
        let ino = if taken(id.1) {
            let n = self.next_synthetic;
            self.next_synthetic += 1;
            n
        } else {
            id.1
        };
        self.by_id.insert(id, ino);
        ino
    }

    /// The node for the file with attributes `a` at (parent, name), made
    /// if new; one more lookup.
    fn remember(&mut self, parent: u64, name: &[u8], a: &Attr) -> u64 {
        let id = (a.dev, a.ino);
        let key = (parent, name.to_vec());
        self.absent.remove(&key);
        if let Some(&old) = self.by_name.get(&key) {
            match self.map.get_mut(&old) {
                Some(n) if n.id == id => {
                    n.lookups += 1;
                    return old;
                }
                // The name now means another file (replaced on the server).
                _ => self.detach(parent, name),
            }
        }
        let ino = self.ino_of(id);
        let node = self.map.entry(ino).or_insert(Node {
            names: Vec::new(),
            id,
            lookups: 0,
            attr: None,
            pages: false,
            no_caps: false,
        });
        // A directory has one name: found by another, it was moved (a
        // change this table missed), and its old name would build a
        // wrong path.
        let stale = if a.mode & libc::S_IFMT == libc::S_IFDIR {
            std::mem::take(&mut node.names)
        } else {
            Vec::new()
        };
        if !node.names.contains(&key) {
            node.names.push(key.clone());
        }
        node.lookups += 1;
        for old in stale.into_iter().filter(|k| *k != key) {
            if self.by_name.get(&old) == Some(&ino) {
                self.by_name.remove(&old);
            }
        }
        self.by_name.insert(key, ino);
        ino
    }

    fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let gone = match self.map.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0
            }
            None => false,
        };
        if gone {
            self.listings.drop_dir(ino);
            self.contents.remove(ino);
            if let Some(node) = self.map.remove(&ino) {
                for key in node.names {
                    if self.by_name.get(&key) == Some(&ino) {
                        self.by_name.remove(&key);
                    }
                }
                if self.by_id.get(&node.id) == Some(&ino) {
                    self.by_id.remove(&node.id);
                }
            }
        }
    }

    /// The name (parent, name) is gone; its file may live on by other
    /// names, or with none for open handles.
    fn detach(&mut self, parent: u64, name: &[u8]) {
        let key = (parent, name.to_vec());
        if let Some(ino) = self.by_name.remove(&key) {
            if let Some(n) = self.map.get_mut(&ino) {
                n.names.retain(|k| *k != key);
            }
        }
    }

    fn rename(&mut self, parent: u64, name: &[u8], np: u64, nn: &[u8], exchange: bool) {
        let (from, to) = ((parent, name.to_vec()), (np, nn.to_vec()));
        let a = self.by_name.remove(&from);
        let b = self.by_name.remove(&to);
        let mut rename_name = |ino: u64, old: &(u64, Vec<u8>), new: Option<&(u64, Vec<u8>)>| {
            if let Some(n) = self.map.get_mut(&ino) {
                n.names.retain(|k| k != old);
                if let Some(new) = new {
                    if !n.names.contains(new) {
                        n.names.push(new.clone());
                    }
                }
            }
        };
        if let Some(ino) = b {
            rename_name(ino, &to, exchange.then_some(&from));
        }
        if let Some(ino) = a {
            rename_name(ino, &from, Some(&to));
        }
        if let (Some(ino), true) = (b, exchange) {
            self.by_name.insert(from.clone(), ino);
        }
        if let Some(ino) = a {
            self.by_name.insert(to, ino);
        }
    }

    /// The node's attributes if answered less than `ttl` ago.
    fn cached_attr(&self, ino: u64, ttl: Duration) -> Option<Attr> {
        let (a, at) = self.map.get(&ino)?.attr.as_ref()?;
        (at.elapsed() < ttl).then_some(*a)
    }

    /// Remembers the node's attributes, as answered just now.
    fn set_attr(&mut self, ino: u64, a: &Attr) {
        if let Some(n) = self.map.get_mut(&ino) {
            n.attr = Some((*a, Instant::now()));
            // An empty file is known whole.
            if a.size == 0
                && a.mode & libc::S_IFMT == libc::S_IFREG
                && self.contents.get(ino, a).is_none()
            {
                self.contents.set(ino, Arc::new(Vec::new()), *a);
            }
        }
    }

    /// The whole of the file, if kept and its attributes (fresh within
    /// `ttl`) show it unchanged.
    fn content(&self, ino: u64, ttl: Duration) -> Option<Arc<Vec<u8>>> {
        let a = self.cached_attr(ino, ttl)?;
        self.contents.get(ino, &a)
    }

    /// Forgets the node's attributes (something changed them).
    fn clear_attr(&mut self, ino: u64) {
        if let Some(n) = self.map.get_mut(&ino) {
            n.attr = None;
        }
    }

    /// Forgets what is known of the node's extended attributes.
    fn clear_xattrs(&mut self, ino: u64) {
        if let Some(n) = self.map.get_mut(&ino) {
            n.no_caps = false;
        }
    }

    /// Remembers that `name` does not exist in `parent`.
    fn set_absent(&mut self, parent: u64, name: &[u8]) {
        if self.absent.len() >= MAX_ABSENT {
            self.absent.clear();
        }
        self.absent.insert((parent, name.to_vec()), Instant::now());
    }

    /// Was `name` found absent in `parent` less than `ttl` ago?
    fn is_absent(&self, parent: u64, name: &[u8], ttl: Duration) -> bool {
        self.absent
            .get(&(parent, name.to_vec()))
            .is_some_and(|t| t.elapsed() < ttl)
    }

    /// The node a (parent, name) stands for, if known.
    fn named(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.by_name.get(&(parent, name.to_vec())).copied()
    }

    /// The known (parent, last name, node) of a server path, walking the
    /// names this table knows; `None` if a directory on the way is not
    /// known here (then the kernel holds nothing beneath it either).
    fn resolve(&self, path: &[u8]) -> Option<(u64, Vec<u8>, Option<u64>)> {
        let mut parts = path.split(|&b| b == b'/').filter(|p| !p.is_empty());
        let mut last = parts.next()?;
        let mut at = ROOT;
        for next in parts {
            at = self.named(at, last)?;
            last = next;
        }
        Some((at, last.to_vec(), self.named(at, last)))
    }

    /// The parent of a directory (the root for the root, or if unknown).
    fn parent_of(&self, ino: u64) -> u64 {
        self.map
            .get(&ino)
            .and_then(|n| n.names.first())
            .map_or(ROOT, |(p, _)| *p)
    }

    /// The inode number for a directory entry of `dir`: the server's,
    /// unless that file is known here by another (made-up) number.
    fn entry_ino(&self, dir: u64, server_ino: u64) -> u64 {
        let dev = self.map.get(&dir).map_or(0, |n| n.id.0);
        self.by_id
            .get(&(dev, server_ino))
            .copied()
            .unwrap_or(server_ino)
    }
}

/// How the mount behaves.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// How long the kernel may cache attributes and names when the server
    /// does not tell of changes (an older server, or `watch` off).
    pub ttl: Duration,
    /// How long attributes, names and the absence of names are cached
    /// when the server tells this mount of every change another client
    /// makes ([`vio::WATCH`]). Changes made on the server's disk by other
    /// programs than the file server show up after at most this long.
    pub cache_ttl: Duration,
    /// Ask the server to report other clients' changes, so caches can
    /// live for `cache_ttl`.
    pub watch: bool,
    /// Threads serving FUSE requests (and requests in flight to the server).
    pub threads: usize,
    /// Name shown in /proc/mounts.
    pub fsname: String,
    /// Let other users use the mount (needs `user_allow_other` for non-root).
    pub allow_other: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            ttl: Duration::from_secs(1),
            cache_ttl: Duration::from_secs(10),
            watch: true,
            threads: 4,
            fsname: "vkernel".into(),
            allow_other: false,
        }
    }
}

/// What the FUSE file system shares with the thread that applies the
/// server's invalidations.
struct Shared {
    nodes: Mutex<Nodes>,
    /// Open file handles per inode: attributes of a file whose names are
    /// all gone are still reached through one (fstat after unlink).
    open: Mutex<HashMap<u64, Vec<u32>>>,
    /// The start of files opened for reading, per handle (dropped when
    /// the server reports the file's data changed).
    heads: Mutex<HashMap<u32, Head>>,
    /// Tells the kernel to drop cached names, attributes and pages (set
    /// once the session exists).
    notifier: OnceLock<fuser::Notifier>,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            nodes: Mutex::new(Nodes::new()),
            open: Mutex::new(HashMap::new()),
            heads: Mutex::new(HashMap::new()),
            notifier: OnceLock::new(),
        }
    }

    fn nodes(&self) -> MutexGuard<'_, Nodes> {
        lock_or_recover(&self.nodes)
    }
}

/// What an open file kept from its OPENREAD: the start of the file.
struct Head {
    data: Arc<Vec<u8>>,
    /// `data` reaches the end of the file (as it was at the open).
    to_eof: bool,
}

/// A file opened for reading from its kept whole data, without the server.
struct LocalFile {
    ino: u64,
    data: Arc<Vec<u8>>,
    /// A server handle, opened once something needs one (a read after the
    /// file changed, a lock, fsync, an unlink of its last name).
    server: Option<Fh>,
}

/// The FUSE file system: a [`Client`] and the node table.
pub struct VioFs {
    client: Arc<Client>,
    shared: Arc<Shared>,
    /// Handles to close, to the closer thread (which closes them in
    /// batches: the kernel does not wait for a release, nor should the
    /// server have one exchange per close); `None` once unmounted.
    closer: Mutex<Option<std::sync::mpsc::Sender<u32>>>,
    closer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// (inode, lock owner) that set locks through this mount: their close
    /// must unlock at the server.
    lockers: Mutex<std::collections::HashSet<(u64, u64)>>,
    /// File handles written since their last flush or fsync.
    written: Mutex<std::collections::HashSet<u32>>,
    /// Listings served here: directory handles (from [`LOCAL_DIR`] up)
    /// and the entries each was opened with (with attributes for
    /// readdirplus).
    local_dirs: Mutex<HashMap<u64, Snapshot>>,
    next_local_dir: std::sync::atomic::AtomicU64,
    /// Directory handles whose listing ended, and the offset after it.
    listed: Mutex<HashMap<u32, u64>>,
    /// Files opened here without the server (handles from [`LOCAL_FILE`]).
    local_files: Mutex<HashMap<u64, LocalFile>>,
    next_local_file: std::sync::atomic::AtomicU64,
    ttl: Duration,
    /// The server reports other clients' changes.
    watched: bool,
}

impl std::fmt::Debug for VioFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VioFs")
            .field("client", &self.client)
            .finish()
    }
}

fn lock_or_recover<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn ferr(e: Errno) -> FErrno {
    FErrno::from_i32(e.as_i32())
}

fn cerr(e: ClientError) -> FErrno {
    if let ClientError::Ipc(_) | ClientError::Malformed(_) = e {
        tracing::warn!("vkernel mount: {e}");
    }
    ferr(e.errno())
}

/// Do two answers' attributes show the same file contents?
fn same_data(a: &Attr, b: &Attr) -> bool {
    (a.dev, a.ino, a.size, a.mtime, a.mtime_ns) == (b.dev, b.ino, b.size, b.mtime, b.mtime_ns)
}

fn time(sec: i64, ns: u32) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, ns)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(u64::from(ns))
    }
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn dt_of_mode(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFSOCK => libc::DT_SOCK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        _ => libc::DT_REG,
    }
}

fn dt_kind(dt: u8) -> FileType {
    match dt {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn file_attr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime, a.atime_ns),
        mtime: time(a.mtime, a.mtime_ns),
        ctime: time(a.ctime, a.ctime_ns),
        crtime: time(a.ctime, a.ctime_ns),
        kind: kind_of(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize.max(512),
        flags: 0,
    }
}

/// Asks in `valid` for a time that a FUSE setattr sets: the bit `now` for
/// the current time, or the bit `given` with the time put in `at`.
fn set_time(
    valid: &mut u32,
    t: Option<TimeOrNow>,
    (now, given): (u32, u32),
    at: (&mut i64, &mut u32),
) {
    match t {
        Some(TimeOrNow::Now) => *valid |= now,
        Some(TimeOrNow::SpecificTime(t)) => {
            *valid |= given;
            (*at.0, *at.1) = split_time(t);
        }
        None => {}
    }
}

fn split_time(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let mut s = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            let mut ns = d.subsec_nanos();
            if ns > 0 {
                s -= 1;
                ns = 1_000_000_000 - ns;
            }
            (s, ns)
        }
    }
}

impl VioFs {
    /// A file system over `client` whose caches live for `ttl`; `watched`
    /// says the server reports other clients' changes (then names that
    /// do not exist are cached too).
    pub fn new(client: Arc<Client>, ttl: Duration, watched: bool) -> VioFs {
        Self::with_shared(client, ttl, watched, Arc::new(Shared::new()))
    }

    fn with_shared(
        client: Arc<Client>,
        ttl: Duration,
        watched: bool,
        shared: Arc<Shared>,
    ) -> VioFs {
        let (tx, rx) = std::sync::mpsc::channel();
        let c = client.clone();
        let t = std::thread::Builder::new()
            .name("vkernel-close".into())
            .spawn(move || close_in_batches(&c, &rx))
            .ok();
        VioFs {
            closer: Mutex::new(t.is_some().then_some(tx)),
            closer_thread: Mutex::new(t),
            client,
            shared,
            written: Mutex::new(std::collections::HashSet::new()),
            lockers: Mutex::new(std::collections::HashSet::new()),
            listed: Mutex::new(HashMap::new()),
            local_dirs: Mutex::new(HashMap::new()),
            next_local_dir: std::sync::atomic::AtomicU64::new(LOCAL_DIR),
            local_files: Mutex::new(HashMap::new()),
            next_local_file: std::sync::atomic::AtomicU64::new(LOCAL_FILE),
            ttl,
            watched,
        }
    }

    fn nodes(&self) -> MutexGuard<'_, Nodes> {
        self.shared.nodes()
    }

    fn path(&self, ino: INodeNo) -> Result<Vec<u8>, FErrno> {
        self.nodes().path(ino.0).map_err(ferr)
    }

    fn opened(&self, ino: u64, fh: Fh) {
        lock_or_recover(&self.shared.open)
            .entry(ino)
            .or_default()
            .push(fh.0);
    }

    fn closed(&self, ino: u64, fh: Fh) {
        let mut open = lock_or_recover(&self.shared.open);
        if let Some(v) = open.get_mut(&ino) {
            v.retain(|&h| h != fh.0);
            if v.is_empty() {
                open.remove(&ino);
            }
        }
    }

    /// Drops `owner`'s locks on the file (whole range, which also ends
    /// its waits there), if it set any through this mount.
    fn unlock_all(&self, ino: INodeNo, fh: Fh, owner: LockOwner) {
        if !lock_or_recover(&self.lockers).remove(&(ino.0, owner.0)) {
            return;
        }
        let l = LockRequest {
            kind: vio::LOCK_UNLOCK,
            owner: owner.0,
            pid: 0,
            start: 0,
            end: u64::MAX,
        };
        if let Err(e) = self.client.lock(fh, &l, false) {
            tracing::debug!("vkernel mount: unlocking at close: {e}");
        }
    }

    /// Closes a server handle: by the closer thread, or at once.
    fn close_later(&self, fh: Fh) {
        let queued = lock_or_recover(&self.closer)
            .as_ref()
            .is_some_and(|tx| tx.send(fh.0).is_ok());
        if !queued {
            if let Err(e) = self.client.close(fh) {
                tracing::debug!("vkernel mount: close: {e}");
            }
        }
    }

    /// A handle of the file open here, if any.
    fn any_handle(&self, ino: u64) -> Option<Fh> {
        lock_or_recover(&self.shared.open)
            .get(&ino)
            .and_then(|v| v.first())
            .map(|&h| Fh(h))
    }

    /// The server handle behind a FUSE file handle, if it has one now.
    fn known_fh(&self, fh: FileHandle) -> Option<Fh> {
        if fh.0 < LOCAL_FILE {
            return Some(Fh(fh.0 as u32));
        }
        lock_or_recover(&self.local_files)
            .get(&fh.0)
            .and_then(|l| l.server)
    }

    /// The server handle behind a FUSE file handle: itself, or for a file
    /// opened here without the server, one opened now by the file's name.
    fn server_fh(&self, ino: INodeNo, fh: FileHandle) -> Result<Fh, FErrno> {
        if let Some(s) = self.known_fh(fh) {
            return Ok(s);
        }
        let p = self.path(ino)?;
        let (s, _) = self.client.open(&p, libc::O_RDONLY, 0).map_err(cerr)?;
        let mut files = lock_or_recover(&self.local_files);
        let (got, spare) = match files.get_mut(&fh.0) {
            Some(l) => match l.server {
                // Another thread opened one meanwhile.
                Some(have) => (Ok(have), Some(s)),
                None => {
                    l.server = Some(s);
                    (Ok(s), None)
                }
            },
            None => (Err(FErrno::from_i32(libc::EBADF)), Some(s)),
        };
        drop(files);
        match spare {
            Some(s) => self.close_later(s),
            None => self.opened(ino.0, s),
        }
        got
    }

    /// Gives every handle of `ino` opened here without the server a
    /// server handle: its last name may be about to go, and the file is
    /// then reached only through one (fstat after unlink).
    fn materialize(&self, ino: u64) {
        let local: Vec<u64> = lock_or_recover(&self.local_files)
            .iter()
            .filter(|(_, l)| l.ino == ino && l.server.is_none())
            .map(|(&fh, _)| fh)
            .collect();
        for fh in local {
            if let Err(e) = self.server_fh(INodeNo(ino), FileHandle(fh)) {
                tracing::debug!("vkernel mount: opening a held file at the server: {e:?}");
            }
        }
    }

    /// Materializes the file a name in `parent` stands for, if any.
    fn materialize_named(&self, parent: INodeNo, name: &OsStr) {
        let named = self.nodes().named(parent.0, name.as_bytes());
        if let Some(ino) = named {
            self.materialize(ino);
        }
    }

    /// The entries a listing served here was opened with.
    fn local_dir(&self, fh: FileHandle) -> Option<Snapshot> {
        if fh.0 < LOCAL_DIR {
            return None;
        }
        lock_or_recover(&self.local_dirs).get(&fh.0).cloned()
    }

    /// The directory's kept listing, if it is fresh and every entry's
    /// attributes are too (readdirplus hands them to the kernel).
    fn kept_listing(&self, dir: INodeNo) -> Option<Vec<(Entry, Attr)>> {
        let n = self.nodes();
        let entries = n.listings.entries(dir.0, self.ttl)?;
        entries
            .into_iter()
            .map(|e| {
                let ino = n.named(dir.0, &e.name)?;
                let a = n.cached_attr(ino, self.ttl)?;
                Some((e, a))
            })
            .collect()
    }

    /// Lists the directory at the server (with attributes) and keeps the
    /// listing; `None` from a server without READDIRPLUS.
    fn fetch_listing(
        &self,
        dir: INodeNo,
        path: &[u8],
    ) -> Result<Option<Vec<(Entry, Attr)>>, ClientError> {
        let epoch = self.nodes().reported;
        let (fh, _) = self.client.opendir(path)?;
        let mut out = Vec::new();
        let mut at = 0;
        let r =
            loop {
                match self.client.readdirplus_at(fh, at) {
                    Ok(Some(c)) => {
                        out.extend(c.entries.into_iter().filter(|(_, a)| a.ino != 0).map(
                            |(e, a)| {
                                (
                                    Entry {
                                        name: e.name,
                                        ino: e.ino,
                                        kind: e.kind,
                                    },
                                    a,
                                )
                            },
                        ));
                        if c.done || c.next <= at {
                            break Ok(true);
                        }
                        at = c.next;
                    }
                    Ok(None) => break Ok(false),
                    Err(e) => break Err(e),
                }
            };
        self.close_later(fh);
        if !r? {
            return Ok(None);
        }
        let mut n = self.nodes();
        if n.reported == epoch {
            n.listings.set(dir.0, out.iter().map(|(e, _)| e.clone()));
        }
        Ok(Some(out))
    }

    /// The directory handle's listing ended before `offset`: nothing
    /// more to ask the server.
    fn listed_past(&self, fh: FileHandle, offset: u64) -> bool {
        fh.0 < LOCAL_DIR
            && lock_or_recover(&self.listed)
                .get(&(fh.0 as u32))
                .is_some_and(|&end| offset >= end)
    }

    fn listed_to(&self, fh: FileHandle, end: u64) {
        lock_or_recover(&self.listed).insert(fh.0 as u32, end);
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<Vec<u8>, FErrno> {
        self.nodes().child(parent.0, name.as_bytes()).map_err(ferr)
    }

    /// Answers a lookup or a creation with the file's attributes. A
    /// creation (`made`: with the directory's attributes after it, if the
    /// server answered them) also changed the directory. Returns the
    /// file's inode number.
    fn entry(
        &self,
        parent: INodeNo,
        name: &OsStr,
        a: &Attr,
        made: Option<Option<Attr>>,
        reply: ReplyEntry,
    ) -> u64 {
        let ino = {
            let mut n = self.nodes();
            let ino = n.remember(parent.0, name.as_bytes(), a);
            n.set_attr(ino, a);
            if let Some(dir) = made {
                match dir {
                    Some(d) => n.set_attr(parent.0, &d),
                    None => n.clear_attr(parent.0),
                }
                n.listings
                    .add(parent.0, name.as_bytes(), a.ino, dt_of_mode(a.mode));
            }
            ino
        };
        reply.entry(&self.ttl, &file_attr(ino, a), Generation(0));
        ino
    }

    /// A name in `parent` was made, removed or renamed here: the
    /// directory's attributes (mtime, link count) and the named file's
    /// (link count, ctime) changed.
    fn changed_name(&self, parent: INodeNo, name: &OsStr) {
        self.changed_name_in(parent, name, None);
    }

    /// [`VioFs::changed_name`], with the directory's attributes after the
    /// change when the server answered them.
    fn changed_name_in(&self, parent: INodeNo, name: &OsStr, dir: Option<Attr>) {
        let mut n = self.nodes();
        match dir {
            Some(a) => n.set_attr(parent.0, &a),
            None => n.clear_attr(parent.0),
        }
        if let Some(ino) = n.named(parent.0, name.as_bytes()) {
            n.clear_attr(ino);
        }
    }

    /// A name made here in `parent`: the directory's attributes after the
    /// change, if answered, else forgotten.
    fn made_in(&self, parent: INodeNo, dir: Option<Attr>) {
        let mut n = self.nodes();
        match dir {
            Some(a) => n.set_attr(parent.0, &a),
            None => n.clear_attr(parent.0),
        }
    }
}

/// A lookup's answer that the name does not exist, cached by the kernel
/// for `ttl` (an entry with inode 0).
fn reply_absent(ttl: &Duration, reply: ReplyEntry) {
    reply.entry(ttl, &file_attr(0, &Attr::default()), Generation(0));
}

/// A FUSE lock request (type `F_RDLCK`/`F_WRLCK`/`F_UNLCK`) as V I/O's.
fn lock_request(owner: LockOwner, start: u64, end: u64, typ: i32, pid: u32) -> LockRequest {
    let kind = match typ {
        libc::F_RDLCK => vio::LOCK_READ,
        libc::F_WRLCK => vio::LOCK_WRITE,
        _ => vio::LOCK_UNLOCK,
    };
    LockRequest {
        kind,
        owner: owner.0,
        pid,
        start,
        end,
    }
}

/// The calling program's ids, for whoever the server lets own what it
/// creates.
fn owner(req: &Request) -> Owner {
    Owner {
        uid: req.uid(),
        gid: req.gid(),
    }
}

macro_rules! tryf {
    ($reply:ident, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(e),
        }
    };
}

/// The closer thread: waits for a handle, gathers those that follow
/// within a moment, and closes them in one exchange; ends (after closing
/// what it has) when the mount's sender goes.
fn close_in_batches(client: &Client, rx: &std::sync::mpsc::Receiver<u32>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![Fh(first)];
        let until = Instant::now() + CLOSE_GATHER;
        while batch.len() < vio::MAX_CLOSEV as usize {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(fh) => batch.push(Fh(fh)),
                Err(_) => break,
            }
        }
        if let Err(e) = client.close_many(&batch) {
            tracing::debug!("vkernel mount: closing {} handles: {e}", batch.len());
        }
    }
}

/// How long the closer gathers handles before closing them.
const CLOSE_GATHER: Duration = Duration::from_millis(2);

impl Filesystem for VioFs {
    fn destroy(&mut self) {
        // Close what is queued before the session ends.
        lock_or_recover(&self.closer).take();
        if let Some(t) = lock_or_recover(&self.closer_thread).take() {
            let _ = t.join();
        }
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Bigger writes mean fewer exchanges; the kernel may cap them.
        let _ = config.set_max_write(1 << 20);
        // Listings with attributes (one exchange per chunk instead of a
        // lookup per name), lookups in one directory at once, and pages
        // dropped by the kernel itself when fresh attributes show the
        // file changed.
        let _ = config.add_capabilities(
            InitFlags::FUSE_DO_READDIRPLUS
                | InitFlags::FUSE_READDIRPLUS_AUTO
                | InitFlags::FUSE_PARALLEL_DIROPS
                | InitFlags::FUSE_AUTO_INVAL_DATA
                // fcntl and flock locks go to the server, so programs on
                // different clients exclude each other.
                | InitFlags::FUSE_POSIX_LOCKS
                | InitFlags::FUSE_FLOCK_LOCKS
                // O_APPEND handles are uncached (direct I/O): still mappable.
                | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if name.len() > vio::MAX_NAME {
            return reply.error(ferr(Errno::ENAMETOOLONG));
        }
        if self.watched {
            let mut n = self.nodes();
            let key = name.as_bytes();
            if n.is_absent(parent.0, key, self.ttl) || n.listings.absent(parent.0, key, self.ttl) {
                drop(n);
                return reply_absent(&self.ttl, reply);
            }
            // Known here with fresh attributes (the kernel dropped its
            // entry, nothing changed it since).
            let known = n
                .named(parent.0, key)
                .and_then(|ino| Some((ino, n.cached_attr(ino, self.ttl)?)));
            if let Some((ino, a)) = known {
                n.remember(parent.0, key, &a);
                drop(n);
                return reply.entry(&self.ttl, &file_attr(ino, &a), Generation(0));
            }
        }
        let p = tryf!(reply, self.child(parent, name));
        match self.client.lstat(&p) {
            Ok(a) => {
                self.entry(parent, name, &a, None, reply);
            }
            // Absent until the server reports that a client made it.
            Err(ClientError::Server(Errno::ENOENT)) if self.watched => {
                self.nodes().set_absent(parent.0, name.as_bytes());
                reply_absent(&self.ttl, reply)
            }
            Err(e) => reply.error(cerr(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // The kernel drops its copy more often than it must (atime after
        // every read); ours lasts until something changes the file.
        if let Some(a) = self.nodes().cached_attr(ino.0, self.ttl) {
            return reply.attr(&self.ttl, &file_attr(ino.0, &a));
        }
        if let Some(fh) = fh.and_then(|f| self.known_fh(f)) {
            if let Ok(a) = self.client.fstat(fh) {
                self.nodes().set_attr(ino.0, &a);
                return reply.attr(&self.ttl, &file_attr(ino.0, &a));
            }
        }
        let by_path = self
            .path(ino)
            .and_then(|p| self.client.lstat(&p).map_err(cerr));
        let a = match by_path {
            Ok(a) => a,
            // Its names are gone, but it may be open here.
            Err(e) => match self.any_handle(ino.0) {
                Some(fh) => tryf!(reply, self.client.fstat(fh).map_err(cerr)),
                None => return reply.error(e),
            },
        };
        {
            let mut n = self.nodes();
            if ino.0 == ROOT {
                n.set_root(&a);
            }
            n.set_attr(ino.0, &a);
        }
        reply.attr(&self.ttl, &file_attr(ino.0, &a));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = SetAttr::default();
        let fh = match fh {
            Some(f) => Some(tryf!(reply, self.server_fh(ino, f))),
            None => None,
        };
        if let (Some(sz), Some(fh)) = (size, fh) {
            // Through the handle: works for an open file whose name is gone.
            tryf!(reply, self.client.ftruncate(fh, sz).map_err(cerr));
        } else if let Some(sz) = size {
            s.valid |= vio::SET_SIZE;
            s.size = sz;
        }
        if let Some(m) = mode {
            s.valid |= vio::SET_MODE;
            s.mode = m & 0o7777;
        }
        if let Some(u) = uid {
            s.valid |= vio::SET_UID;
            s.uid = u;
        }
        if let Some(g) = gid {
            s.valid |= vio::SET_GID;
            s.gid = g;
        }
        set_time(
            &mut s.valid,
            atime,
            (vio::SET_ATIME_NOW, vio::SET_ATIME),
            (&mut s.atime, &mut s.atime_ns),
        );
        set_time(
            &mut s.valid,
            mtime,
            (vio::SET_MTIME_NOW, vio::SET_MTIME),
            (&mut s.mtime, &mut s.mtime_ns),
        );
        // Through a handle when there is one (fchmod, futimens, and any
        // change to a file whose names are gone), else by name.
        let handle = fh.or_else(|| {
            self.path(ino)
                .is_err()
                .then(|| self.any_handle(ino.0))
                .flatten()
        });
        let a = match handle {
            Some(fh) if s.valid == 0 => tryf!(reply, self.client.fstat(fh).map_err(cerr)),
            Some(fh) => tryf!(reply, self.client.fsetattr(fh, &s).map_err(cerr)),
            None => {
                let p = tryf!(reply, self.path(ino));
                tryf!(reply, self.client.setattr(&p, &s).map_err(cerr))
            }
        };
        self.nodes().set_attr(ino.0, &a);
        reply.attr(&self.ttl, &file_attr(ino.0, &a));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let p = tryf!(reply, self.path(ino));
        let t = tryf!(reply, self.client.readlink(&p).map_err(cerr));
        reply.data(&t);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // FIFOs, sockets and device nodes are names on the server; the
        // kernel here opens them locally, as on any network file system.
        let p = tryf!(reply, self.child(parent, name));
        let mode = (mode & libc::S_IFMT) | (mode & !umask & 0o7777);
        let a = tryf!(
            reply,
            self.client.mknod(&p, mode, rdev, owner(req)).map_err(cerr)
        );
        self.entry(parent, name, &a, Some(None), reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let p = tryf!(reply, self.child(parent, name));
        let (a, dir) = tryf!(
            reply,
            self.client
                .mkdir_in(&p, mode & !umask & 0o7777, owner(req))
                .map_err(cerr)
        );
        let ino = self.entry(parent, name, &a, Some(dir), reply);
        if self.watched {
            // Made here, so known empty.
            self.nodes().listings.set(ino, Vec::new());
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tryf!(reply, self.child(parent, name));
        self.materialize_named(parent, name);
        let dir = tryf!(reply, self.client.unlink_in(&p).map_err(cerr));
        self.changed_name_in(parent, name, dir);
        self.nodes().listings.remove(parent.0, name.as_bytes());
        self.nodes().detach(parent.0, name.as_bytes());
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tryf!(reply, self.child(parent, name));
        let dir = tryf!(reply, self.client.rmdir_in(&p).map_err(cerr));
        self.changed_name_in(parent, name, dir);
        {
            let mut n = self.nodes();
            n.listings.remove(parent.0, name.as_bytes());
            if let Some(child) = n.named(parent.0, name.as_bytes()) {
                n.listings.drop_dir(child);
            }
        }
        self.nodes().detach(parent.0, name.as_bytes());
        reply.ok();
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let p = tryf!(reply, self.child(parent, link_name));
        let a = tryf!(
            reply,
            self.client
                .symlink_as(target.as_os_str().as_bytes(), &p, owner(req))
                .map_err(cerr)
        );
        self.entry(parent, link_name, &a, Some(None), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let a = tryf!(reply, self.child(parent, name));
        let b = tryf!(reply, self.child(newparent, newname));
        let mut f = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            f |= vio::RENAME_NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            f |= vio::RENAME_EXCHANGE;
        }
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(FErrno::from_i32(libc::EINVAL));
        }
        self.materialize_named(newparent, newname);
        tryf!(reply, self.client.rename(&a, &b, f).map_err(cerr));
        self.changed_name(parent, name);
        self.changed_name(newparent, newname);
        {
            let mut n = self.nodes();
            let moved = n.listings.remove(parent.0, name.as_bytes());
            match moved {
                Some((ino, kind)) if f & vio::RENAME_EXCHANGE == 0 => {
                    n.listings.add(newparent.0, newname.as_bytes(), ino, kind);
                }
                _ => {
                    n.listings.drop_dir(parent.0);
                    n.listings.drop_dir(newparent.0);
                }
            }
        }
        self.nodes().rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            f & vio::RENAME_EXCHANGE != 0,
        );
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let old = tryf!(reply, self.path(ino));
        let new = tryf!(reply, self.child(newparent, newname));
        let a = tryf!(reply, self.client.link(&old, &new).map_err(cerr));
        self.entry(newparent, newname, &a, Some(None), reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let f = flags.0 & !(libc::O_CREAT | libc::O_EXCL);
        let want_head = f & libc::O_ACCMODE == libc::O_RDONLY && f & libc::O_TRUNC == 0;
        // A file held whole, unchanged as far as the server has told:
        // opened here (the server reports any change before it is made).
        let held = if self.watched && want_head {
            self.nodes().content(ino.0, self.ttl)
        } else {
            None
        };
        if let Some(data) = held {
            let fh = self
                .next_local_file
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let l = LocalFile {
                ino: ino.0,
                data,
                server: None,
            };
            lock_or_recover(&self.local_files).insert(fh, l);
            // Unchanged since its attributes were answered: pages the
            // kernel holds are good.
            return reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
        }
        let p = tryf!(reply, self.path(ino));
        let epoch = self.nodes().reported;
        let (before, pages) = self
            .nodes()
            .map
            .get(&ino.0)
            .map_or((None, false), |n| (n.attr.map(|(a, _)| a), n.pages));
        // A small file the kernel holds no pages of comes with the open:
        // its reads are then answered here.
        let small = before.is_none_or(|a| a.size <= OPEN_READ_MAX as u64);
        let (fh, a, head) = if want_head && small && !pages {
            tryf!(
                reply,
                self.client.open_read(&p, f, OPEN_READ_MAX).map_err(cerr)
            )
        } else {
            let (fh, a) = tryf!(reply, self.client.open(&p, f, 0).map_err(cerr));
            (fh, a, None)
        };
        // Pages the kernel holds stay good if the file has not changed
        // since its attributes were answered here.
        let keep = before.is_some_and(|b| same_data(&b, &a));
        {
            let mut n = self.nodes();
            n.set_attr(ino.0, &a);
            if let Some(node) = n.map.get_mut(&ino.0) {
                node.pages &= keep;
            }
        }
        if let Some(data) = head {
            let to_eof = data.len() < OPEN_READ_MAX;
            let data = Arc::new(data);
            // The whole file, and nothing reported changed meanwhile: kept
            // for later opens.
            let mut n = self.nodes();
            if to_eof && self.watched && n.reported == epoch {
                n.contents.set(ino.0, data.clone(), a);
            }
            drop(n);
            lock_or_recover(&self.shared.heads).insert(fh.0, Head { data, to_eof });
        }
        self.opened(ino.0, fh);
        let flags = if f & libc::O_APPEND != 0 {
            append_open()
        } else if keep {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(u64::from(fh.0)), flags);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (at, end) = (offset as usize, offset as usize + size as usize);
        let local = if fh.0 >= LOCAL_FILE {
            let Some(data) = lock_or_recover(&self.local_files)
                .get(&fh.0)
                .map(|l| l.data.clone())
            else {
                return reply.error(FErrno::from_i32(libc::EBADF));
            };
            Some(data)
        } else {
            None
        };
        {
            let mut n = self.nodes();
            if let Some(node) = n.map.get_mut(&ino.0) {
                node.pages = true;
            }
            // Still the file's data (not reported changed since the open).
            if let Some(d) = local.filter(|d| n.contents.holds(ino.0, d)) {
                drop(n);
                let at = at.min(d.len());
                return reply.data(&d[at..end.min(d.len())]);
            }
        }
        let sfh = tryf!(reply, self.server_fh(ino, fh));
        if let Some(h) = lock_or_recover(&self.shared.heads).get(&sfh.0) {
            let (at, end) = (offset as usize, offset as usize + size as usize);
            if end <= h.data.len() || h.to_eof {
                let at = at.min(h.data.len());
                return reply.data(&h.data[at..end.min(h.data.len())]);
            }
        }
        let mut buf = vec![0u8; size as usize];
        let n = tryf!(reply, self.client.read(sfh, offset, &mut buf).map_err(cerr));
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let sfh = tryf!(reply, self.server_fh(ino, fh));
        // A file held whole and written at its end stays held whole.
        let (prior, epoch) = {
            let mut n = self.nodes();
            let fresh = n.cached_attr(ino.0, self.ttl);
            let prior = n.contents.take(ino.0).filter(|(d, was)| {
                self.watched
                    && fresh.is_some_and(|f| same_data(was, &f))
                    && offset == d.len() as u64
                    && d.len() + data.len() <= OPEN_READ_MAX
            });
            n.clear_attr(ino.0);
            (prior.map(|(d, _)| d), n.reported)
        };
        // The kernel's offset of an append is its size, maybe stale: the
        // server appends. A page written back (a mapping) goes where it is.
        let cached = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        // (The kernel may write back through an O_APPEND handle without
        // saying so in `flags`.)
        let w = if cached {
            self.client.write_flagged(sfh, offset, data, vio::WRITE_AT)
        } else if flags.0 & libc::O_APPEND != 0 {
            self.client.append_attr(sfh, offset, data)
        } else {
            self.client.write_attr(sfh, offset, data)
        };
        let (written, a) = tryf!(reply, w.map_err(cerr));
        match a {
            // Written before the answer, so no deferred error can follow;
            // and the kernel asks for the attributes next (its copy is
            // stale after a write).
            Some(a) => {
                let mut n = self.nodes();
                n.set_attr(ino.0, &a);
                let grown = (prior.as_ref()).map_or(0, |d| d.len()) + data.len();
                if let Some(d) = prior.filter(|_| n.reported == epoch && a.size == grown as u64) {
                    let mut d = Arc::unwrap_or_clone(d);
                    d.extend_from_slice(data);
                    n.contents.set(ino.0, Arc::new(d), a);
                }
            }
            None => {
                lock_or_recover(&self.written).insert(sfh.0);
            }
        }
        reply.written(written as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close drops the closing program's fcntl locks on the file
        // (the kernel leaves that to the file system). A handle without a
        // server handle set none.
        let Some(fh) = self.known_fh(fh) else {
            return reply.ok();
        };
        self.unlock_all(ino, fh, lock_owner);
        // Only a handle written since its last flush can have deferred
        // writes (and their errors) to wait for.
        let fh = fh.0;
        if !lock_or_recover(&self.written).contains(&fh) {
            return reply.ok();
        }
        tryf!(reply, self.client.flush(Fh(fh)).map_err(cerr));
        lock_or_recover(&self.written).remove(&fh);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let fh = if fh.0 >= LOCAL_FILE {
            match lock_or_recover(&self.local_files).remove(&fh.0) {
                Some(LocalFile {
                    server: Some(s), ..
                }) => s,
                // Never reached the server: nothing to close there.
                _ => return reply.ok(),
            }
        } else {
            Fh(fh.0 as u32)
        };
        // The last close of an open file drops its flock lock.
        if let Some(o) = lock_owner {
            self.unlock_all(ino, fh, o);
        }
        self.closed(ino.0, fh);
        lock_or_recover(&self.shared.heads).remove(&fh.0);
        lock_or_recover(&self.written).remove(&fh.0);
        // The kernel ignores what a release answers; any deferred write
        // error was reported by the flush before it.
        self.close_later(fh);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let fh = tryf!(reply, self.server_fh(ino, fh));
        tryf!(reply, self.client.fsync(fh, datasync).map_err(cerr));
        lock_or_recover(&self.written).remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let p = tryf!(reply, self.path(ino));
        if self.watched {
            let snap = match self.kept_listing(ino) {
                Some(s) => Some(s),
                None => tryf!(reply, self.fetch_listing(ino, &p).map_err(cerr)),
            };
            if let Some(snap) = snap {
                let fh = self
                    .next_local_dir
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lock_or_recover(&self.local_dirs).insert(fh, Arc::new(snap));
                return reply.opened(FileHandle(fh), FopenFlags::empty());
            }
        }
        let (fh, _) = tryf!(reply, self.client.opendir(&p).map_err(cerr));
        reply.opened(FileHandle(u64::from(fh.0)), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Offsets: 0 ".", 1 "..", then the server's entry i at 2 + i; each
        // entry carries the offset of the one after it.
        if self.listed_past(fh, offset) {
            return reply.ok();
        }
        if offset == 0 && reply.add(ino, 1, FileType::Directory, ".") {
            return reply.ok();
        }
        if offset <= 1 {
            let parent = self.nodes().parent_of(ino.0);
            if reply.add(INodeNo(parent), 2, FileType::Directory, "..") {
                return reply.ok();
            }
        }
        if let Some(snap) = self.local_dir(fh) {
            let n = self.nodes();
            for (i, (e, _)) in snap.iter().enumerate().skip(offset.max(2) as usize - 2) {
                let e_ino = n.entry_ino(ino.0, e.ino);
                let name = OsStr::from_bytes(&e.name);
                if reply.add(INodeNo(e_ino), 2 + i as u64 + 1, dt_kind(e.kind), name) {
                    break;
                }
            }
            drop(n);
            return reply.ok();
        }
        let mut at = u32::try_from(offset.max(2) - 2).unwrap_or(u32::MAX);
        loop {
            let c = tryf!(
                reply,
                self.client.readdir_at(Fh(fh.0 as u32), at).map_err(cerr)
            );
            let inos: Vec<u64> = {
                let n = self.nodes();
                c.entries
                    .iter()
                    .map(|e| n.entry_ino(ino.0, e.ino))
                    .collect()
            };
            for (i, (e, &e_ino)) in c.entries.iter().zip(&inos).enumerate() {
                let next = 2 + u64::from(at) + i as u64 + 1;
                let name = OsStr::from_bytes(&e.name);
                if reply.add(INodeNo(e_ino), next, dt_kind(e.kind), name) {
                    return reply.ok();
                }
            }
            if c.done || c.next <= at {
                self.listed_to(fh, 2 + u64::from(c.next.max(at)));
                return reply.ok();
            }
            at = c.next;
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        // Offsets as in `readdir`. Every entry but `.` and `..` counts as
        // a lookup of its file.
        if self.listed_past(fh, offset) {
            return reply.ok();
        }
        let zero = Duration::ZERO;
        let dot = |i: u64| file_attr(i, &Attr::default());
        if offset == 0 && reply.add(ino, 1, ".", &zero, &dot(ino.0), Generation(0)) {
            return reply.ok();
        }
        if offset <= 1 {
            let parent = self.nodes().parent_of(ino.0);
            if reply.add(INodeNo(parent), 2, "..", &zero, &dot(parent), Generation(0)) {
                return reply.ok();
            }
        }
        if let Some(snap) = self.local_dir(fh) {
            let mut n = self.nodes();
            for (i, (e, a)) in snap.iter().enumerate().skip(offset.max(2) as usize - 2) {
                let e_ino = n.remember(ino.0, &e.name, a);
                n.set_attr(e_ino, a);
                let name = OsStr::from_bytes(&e.name);
                let fa = file_attr(e_ino, a);
                let off = 2 + i as u64 + 1;
                if reply.add(INodeNo(e_ino), off, name, &self.ttl, &fa, Generation(0)) {
                    n.forget(e_ino, 1);
                    break;
                }
            }
            drop(n);
            return reply.ok();
        }
        let mut at = u32::try_from(offset.max(2) - 2).unwrap_or(u32::MAX);
        loop {
            let chunk = tryf!(
                reply,
                self.client
                    .readdirplus_at(Fh(fh.0 as u32), at)
                    .map_err(cerr)
            );
            let (entries, next, done) = match chunk {
                Some(c) => (c.entries, c.next, c.done),
                // An older server: a lookup per name.
                None => {
                    let c = tryf!(
                        reply,
                        self.client.readdir_at(Fh(fh.0 as u32), at).map_err(cerr)
                    );
                    let mut with = Vec::new();
                    for e in c.entries {
                        let p = tryf!(reply, self.child(ino, OsStr::from_bytes(&e.name)));
                        let a = self.client.lstat(&p).unwrap_or_default();
                        with.push((e, a));
                    }
                    (with, c.next, c.done)
                }
            };
            let mut n = self.nodes();
            for (i, (e, a)) in entries.iter().enumerate() {
                if a.ino == 0 {
                    continue; // removed since the listing was taken
                }
                let off = 2 + u64::from(at) + i as u64 + 1;
                let e_ino = n.remember(ino.0, &e.name, a);
                n.set_attr(e_ino, a);
                let name = OsStr::from_bytes(&e.name);
                let fa = file_attr(e_ino, a);
                if reply.add(INodeNo(e_ino), off, name, &self.ttl, &fa, Generation(0)) {
                    // Did not fit: the kernel never saw it.
                    n.forget(e_ino, 1);
                    return reply.ok();
                }
            }
            drop(n);
            if done || next <= at {
                self.listed_to(fh, 2 + u64::from(next.max(at)));
                return reply.ok();
            }
            at = next;
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        if lock_or_recover(&self.local_dirs).remove(&fh.0).is_some() {
            return reply.ok();
        }
        lock_or_recover(&self.listed).remove(&(fh.0 as u32));
        self.close_later(Fh(fh.0 as u32));
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = tryf!(reply, self.client.statfs().map_err(cerr));
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        );
    }

    fn getxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // The kernel asks for security.capability before every write;
        // once a file is known to have none, that is answered here (until
        // its attributes change).
        let caps = name.as_bytes() == b"security.capability";
        if caps && self.nodes().map.get(&ino.0).is_some_and(|n| n.no_caps) {
            return reply.error(FErrno::from_i32(libc::ENODATA));
        }
        let p = tryf!(reply, self.path(ino));
        match self.client.getxattr(&p, name.as_bytes(), size as usize) {
            Ok((n, _)) if size == 0 => reply.size(n as u32),
            Ok((_, v)) => reply.data(&v),
            Err(ClientError::Server(e)) if caps && e == Errno(libc::ENODATA as u32) => {
                if let Some(n) = self.nodes().map.get_mut(&ino.0) {
                    n.no_caps = true;
                }
                reply.error(FErrno::from_i32(libc::ENODATA))
            }
            Err(e) => reply.error(cerr(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        let p = tryf!(reply, self.path(ino));
        match self.client.listxattr(&p, size as usize) {
            Ok((n, _)) if size == 0 => reply.size(n as u32),
            Ok((_, v)) => reply.data(&v),
            Err(e) => reply.error(cerr(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let p = tryf!(reply, self.path(ino));
        let mut f = 0;
        if flags & libc::XATTR_CREATE != 0 {
            f |= vio::XATTR_CREATE;
        }
        if flags & libc::XATTR_REPLACE != 0 {
            f |= vio::XATTR_REPLACE;
        }
        {
            let mut n = self.nodes();
            n.clear_attr(ino.0);
            n.clear_xattrs(ino.0);
        }
        tryf!(
            reply,
            self.client
                .setxattr(&p, name.as_bytes(), value, f)
                .map_err(cerr)
        );
        reply.ok();
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tryf!(reply, self.path(ino));
        {
            let mut n = self.nodes();
            n.clear_attr(ino.0);
            n.clear_xattrs(ino.0);
        }
        tryf!(
            reply,
            self.client.removexattr(&p, name.as_bytes()).map_err(cerr)
        );
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        tryf!(reply, self.allocate(ino, fh, offset, length, mode));
        reply.ok();
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.seek_data(ino, fh, offset, whence) {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // ENOSYS makes the kernel (and cp) fall back to read and write.
        reply.error(FErrno::from_i32(libc::ENOSYS));
    }

    /// No ioctl is served (shells probe terminals with TCGETS on every
    /// file they redirect to): ENOTTY, as for a plain file, and no log.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(FErrno::from_i32(libc::ENOTTY));
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: fuser::ReplyLock,
    ) {
        let l = lock_request(lock_owner, start, end, typ, pid);
        let fh = tryf!(reply, self.server_fh(ino, fh));
        match self.client.test_lock(fh, &l) {
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, pid),
            Ok(Some(c)) => {
                let t = if c.kind == vio::LOCK_WRITE {
                    libc::F_WRLCK
                } else {
                    libc::F_RDLCK
                };
                reply.locked(c.start, c.end, t, c.pid)
            }
            Err(e) => reply.error(cerr(e)),
        }
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let l = lock_request(lock_owner, start, end, typ, pid);
        let fh = tryf!(reply, self.server_fh(ino, fh));
        if l.kind != vio::LOCK_UNLOCK {
            // Before asking: a close while the request waits must unlock.
            lock_or_recover(&self.lockers).insert((ino.0, lock_owner.0));
        }
        match self.client.lock(fh, &l, false) {
            Ok(()) => reply.ok(),
            // Held elsewhere: wait on a thread of its own, so waiting
            // programs never take the mount's threads (the holder may
            // need one to unlock).
            Err(ClientError::Server(Errno::EAGAIN)) if sleep => {
                let client = self.client.clone();
                let spawned = std::thread::Builder::new()
                    .name("vkernel-lockwait".into())
                    .spawn(move || match client.lock(fh, &l, true) {
                        Ok(()) => reply.ok(),
                        Err(e) => reply.error(cerr(e)),
                    });
                if let Err(e) = spawned {
                    tracing::warn!("vkernel mount: a thread to wait for a lock: {e}");
                }
            }
            Err(e) => reply.error(cerr(e)),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (default_permissions).
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let p = tryf!(reply, self.child(parent, name));
        let (fh, a, dir, made) = tryf!(
            reply,
            self.client
                .create_in(
                    &p,
                    flags | libc::O_CREAT,
                    mode & !umask & 0o7777,
                    owner(req)
                )
                .map_err(cerr)
        );
        let ino = {
            let mut n = self.nodes();
            let ino = n.remember(parent.0, name.as_bytes(), &a);
            n.set_attr(ino, &a);
            n.listings
                .add(parent.0, name.as_bytes(), a.ino, dt_of_mode(a.mode));
            // Made just now: no extended attributes yet (the kernel asks
            // for security.capability before its first write).
            if let Some(node) = n.map.get_mut(&ino).filter(|_| made) {
                node.no_caps = true;
            }
            ino
        };
        self.made_in(parent, dir);
        self.opened(ino, fh);
        let fopen = if flags & libc::O_APPEND != 0 {
            append_open()
        } else {
            FopenFlags::empty()
        };
        reply.created(
            &self.ttl,
            &file_attr(ino, &a),
            Generation(0),
            FileHandle(u64::from(fh.0)),
            fopen,
        );
    }
}

/// How an `O_APPEND` handle is opened: without the page cache, so that
/// each write(2) reaches the mount whole (through the cache, the kernel
/// splits a write at a page it does not hold) and is appended at the
/// server as one piece.
fn append_open() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO
}

/// What the kernel is told to drop.
enum Drop {
    Entry(u64, Vec<u8>),
    Attr(u64),
    Data(u64),
}

/// Applies one of the server's invalidations to the mount's own caches,
/// on the callback process before it answers (so a change is forgotten
/// here before the server acknowledges it to the client that made it).
/// Returns what the kernel must drop: that waits for
/// [`tell_kernel`] on another thread, so the server's worker never waits
/// on this kernel.
fn forget_changed(shared: &Shared, inv: &Invalidation, path: &[u8]) -> Vec<Drop> {
    let data = inv.flags & vio::INVAL_DATA != 0;
    let mut drops = Vec::new();
    {
        let mut n = shared.nodes();
        n.reported += 1;
        let target = if inv.flags & vio::INVAL_RENAME != 0 {
            let exchange = inv.flags & vio::INVAL_EXCHANGE != 0;
            renamed::apply(&mut n, path, exchange, &mut drops);
            None
        } else if inv.path_len > 0 {
            match n.resolve(path) {
                Some((parent, name, child)) => {
                    if inv.flags & vio::INVAL_ENTRY != 0 {
                        n.clear_attr(parent);
                        drops.push(Drop::Attr(parent));
                        drops.push(Drop::Entry(parent, name.clone()));
                        // The name may mean another file now.
                        n.detach(parent, &name);
                        n.absent.remove(&(parent, name.clone()));
                        n.listings.drop_dir(parent);
                    }
                    child
                }
                None => None,
            }
        } else {
            n.by_id.get(&inv.id).copied()
        };
        if let Some(ino) = target {
            n.clear_attr(ino);
            n.clear_xattrs(ino);
            if data {
                if let Some(node) = n.map.get_mut(&ino) {
                    node.pages = false;
                }
                n.contents.remove(ino);
            }
            drops.push(if data {
                Drop::Data(ino)
            } else {
                Drop::Attr(ino)
            });
        }
        if data {
            if let Some(ino) = target {
                let open = lock_or_recover(&shared.open);
                let mut heads = lock_or_recover(&shared.heads);
                for fh in open.get(&ino).into_iter().flatten() {
                    heads.remove(fh);
                }
            }
        }
    }
    drops
}

/// Tells the kernel to drop what an invalidation made stale.
fn tell_kernel(shared: &Shared, drops: Vec<Drop>) {
    let Some(k) = shared.notifier.get() else {
        return;
    };
    for d in drops {
        // ENOENT: the kernel does not hold it; nothing to drop.
        let _ = match d {
            Drop::Entry(parent, name) => k.inval_entry(INodeNo(parent), OsStr::from_bytes(&name)),
            Drop::Attr(ino) => k.inval_inode(INodeNo(ino), -1, 0),
            Drop::Data(ino) => k.inval_inode(INodeNo(ino), 0, 0),
        };
    }
}

/// Mounts `client`'s file server at `mountpoint` in the background; the
/// mount ends when the returned session is unmounted or dropped. With
/// `opts.watch`, the server is asked (through a callback process on
/// `kernel`) to report other clients' changes, and caches then live for
/// `opts.cache_ttl`; a server that cannot leaves them at `opts.ttl`.
pub fn mount(
    kernel: &vkernel::Kernel,
    client: Arc<Client>,
    mountpoint: &Path,
    opts: &FuseOptions,
) -> std::io::Result<fuser::BackgroundSession> {
    let shared = Arc::new(Shared::new());
    let watched = if opts.watch {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Drop>>();
        let sh = shared.clone();
        let sink = move |inv: Invalidation, path: &[u8]| {
            let _ = tx.send(forget_changed(&sh, &inv, path));
        };
        match client.watch(kernel, sink) {
            Ok(true) => {
                let sh = shared.clone();
                std::thread::Builder::new()
                    .name("vkernel-invalidate".into())
                    .spawn(move || {
                        // Ends when the callback process (and its sender) goes.
                        while let Ok(drops) = rx.recv() {
                            tell_kernel(&sh, drops);
                        }
                    })?;
                true
            }
            Ok(false) => {
                tracing::info!(
                    "the file server does not report changes; caching for {:?}",
                    opts.ttl
                );
                false
            }
            Err(e) => {
                tracing::warn!(
                    "asking the file server to report changes: {e}; caching for {:?}",
                    opts.ttl
                );
                false
            }
        }
    } else {
        false
    };
    let ttl = if watched { opts.cache_ttl } else { opts.ttl };
    let fs = VioFs::with_shared(client, ttl, watched, shared.clone());
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName(opts.fsname.clone()),
        fuser::MountOption::Subtype("vkernel".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if opts.allow_other {
        cfg.acl = fuser::SessionACL::All;
    }
    cfg.n_threads = Some(opts.threads.max(1));
    let session = fuser::spawn_mount(fs, mountpoint, &cfg)?;
    let _ = shared.notifier.set(session.notifier());
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(dev: u32, ino: u64) -> Attr {
        Attr {
            dev,
            ino,
            ..Attr::default()
        }
    }

    #[test]
    fn node_paths_follow_renames_and_unlinks() {
        let mut n = Nodes::new();
        let d = n.remember(ROOT, b"d", &attr(1, 10));
        let f = n.remember(d, b"f", &attr(1, 11));
        assert_eq!((d, f), (10, 11), "the server's inode numbers");
        assert_eq!(n.path(f).unwrap(), b"d/f");
        let e = n.remember(ROOT, b"e", &attr(1, 12));
        n.rename(ROOT, b"d", e, b"x", false);
        assert_eq!(n.path(f).unwrap(), b"e/x/f");
        n.detach(d, b"f");
        assert_eq!(n.path(f).unwrap_err(), Errno::ENOENT);
        n.forget(f, 1);
        assert!(n.path(f).is_err());
        assert_eq!(n.child(ROOT, b"z").unwrap(), b"z");
        assert_eq!(split_time(time(-5, 250)), (-5, 250));
        assert_eq!(split_time(time(7, 9)), (7, 9));
    }

    #[test]
    fn hard_links_are_one_inode_reachable_by_any_remaining_name() {
        let mut n = Nodes::new();
        let a = n.remember(ROOT, b"a", &attr(1, 20));
        let b = n.remember(ROOT, b"b", &attr(1, 20));
        assert_eq!(a, b);
        n.detach(ROOT, b"a");
        assert_eq!(n.path(a).unwrap(), b"b");
        // The name now means another file: it gets that file's inode.
        let c = n.remember(ROOT, b"b", &attr(1, 21));
        assert_ne!(c, a);
        assert_eq!(n.path(a).unwrap_err(), Errno::ENOENT);
        // A reused server number while the old file's node lives on
        // without names: another inode.
        let old = n.remember(ROOT, b"gone", &attr(1, 40));
        n.detach(ROOT, b"gone");
        let reused = n.remember(ROOT, b"new", &attr(1, 40));
        assert_ne!(reused, old);
        assert_eq!(n.remember(ROOT, b"new", &attr(1, 40)), reused);
        // Exchange swaps the names.
        let d = n.remember(ROOT, b"d", &attr(1, 22));
        n.rename(ROOT, b"b", ROOT, b"d", true);
        assert_eq!(
            (n.path(c).unwrap(), n.path(d).unwrap()),
            (b"d".to_vec(), b"b".to_vec())
        );
    }

    #[test]
    fn a_directory_found_by_another_name_has_moved() {
        let mut n = Nodes::new();
        let dir = |ino| Attr {
            mode: libc::S_IFDIR | 0o755,
            ..attr(1, ino)
        };
        let d = n.remember(ROOT, b"old", &dir(50));
        let f = n.remember(d, b"f", &attr(1, 51));
        assert_eq!(n.remember(ROOT, b"new", &dir(50)), d);
        assert_eq!(n.path(f).unwrap(), b"new/f");
        assert_eq!(n.named(ROOT, b"old"), None);
        // A file's second name is a hard link: both stay.
        n.remember(ROOT, b"link", &attr(1, 51));
        assert_eq!(n.path(f).unwrap(), b"new/f");
        assert_eq!(n.named(ROOT, b"link"), Some(f));
    }

    #[test]
    fn a_taken_or_unusable_server_number_gets_a_made_up_one() {
        let mut n = Nodes::new();
        let x = n.remember(ROOT, b"x", &attr(1, 30));
        // Another file system beneath the root with the same number.
        let y = n.remember(ROOT, b"y", &attr(2, 30));
        let one = n.remember(ROOT, b"one", &attr(3, ROOT));
        assert_eq!(x, 30);
        assert!(y >= SYNTHETIC && one >= SYNTHETIC && y != one);
        assert_eq!(n.entry_ino(ROOT, 30), 30);
        // Forgotten, the number is free again.
        n.forget(x, 1);
        n.forget(y, 1);
        assert_eq!(n.remember(ROOT, b"y", &attr(2, 30)), 30);
    }
}

/// Waits for SIGINT or SIGTERM (installed before the mount, so a signal
/// during mounting is not lost) or for the session to end on its own.
#[derive(Debug)]
pub struct Termination {
    flag: Arc<std::sync::atomic::AtomicUsize>,
}

impl Termination {
    /// Installs handlers for SIGINT and SIGTERM that record the signal
    /// instead of killing the process.
    pub fn install() -> std::io::Result<Termination> {
        let flag = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register_usize(sig, flag.clone(), sig as usize)?;
        }
        Ok(Termination { flag })
    }

    /// Blocks until a signal arrives or `session` ends; says which.
    pub fn wait(&self, session: &fuser::BackgroundSession) -> String {
        loop {
            match self.flag.load(std::sync::atomic::Ordering::Acquire) {
                0 => {}
                s if s == signal_hook::consts::SIGINT as usize => return "SIGINT".into(),
                _ => return "SIGTERM".into(),
            }
            if session.guard.is_finished() {
                return "the file system was unmounted".into();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Unmounts and waits for the session; if the mount is busy, detaches it
/// lazily (`fusermount3 -u -z`) so the process can still exit cleanly.
pub fn unmount(session: fuser::BackgroundSession, mountpoint: &Path) -> std::io::Result<()> {
    if session.guard.is_finished() {
        return session.join();
    }
    match session.umount_and_join() {
        Ok(()) => Ok(()),
        Err(e) => {
            tracing::warn!("unmount of {}: {e}; detaching lazily", mountpoint.display());
            let st = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(mountpoint)
                .status()?;
            if st.success() {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}
