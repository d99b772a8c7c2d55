//! A FUSE file system on the V I/O client, so unmodified programs use the
//! server's files (`vkernel mount`).
//!
//! FUSE speaks of inode numbers; the V I/O protocol of paths and handles.
//! A node table maps each inode number the kernel holds to (parent, name);
//! a node's path is rebuilt by walking its parents, so a rename moves a
//! whole subtree by updating one entry. Open files and directories use
//! server handles, so they keep working after a rename or unlink of their
//! name. The kernel's own page cache, read-ahead and POSIX locks are used;
//! permissions are checked by the kernel from the attributes
//! (`default_permissions`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno as FErrno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use crate::client::{Client, ClientError, Fh};
use crate::vio::{self, Attr, Errno, SetAttr};

const ROOT: u64 = 1;

struct Node {
    parent: u64,
    name: Vec<u8>,
    lookups: u64,
}

/// Inode numbers ↔ (parent, name).
struct Nodes {
    map: HashMap<u64, Node>,
    by_name: HashMap<(u64, Vec<u8>), u64>,
    next: u64,
}

impl Nodes {
    fn new() -> Nodes {
        let mut map = HashMap::new();
        map.insert(
            ROOT,
            Node {
                parent: ROOT,
                name: Vec::new(),
                lookups: 1,
            },
        );
        Nodes {
            map,
            by_name: HashMap::new(),
            next: ROOT + 1,
        }
    }

    /// The server path of a node (`ENOENT` once its name was removed,
    /// `ESTALE` for a node the kernel should not hold).
    fn path(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut at = ino;
        let mut hops = 0;
        while at != ROOT {
            let n = self.map.get(&at).ok_or(Errno(libc::ESTALE as u32))?;
            if n.parent == 0 {
                return Err(Errno::ENOENT);
            }
            parts.push(&n.name);
            at = n.parent;
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

    /// The node for (parent, name), created if new; one more lookup.
    fn remember(&mut self, parent: u64, name: &[u8]) -> u64 {
        let key = (parent, name.to_vec());
        if let Some(&ino) = self.by_name.get(&key) {
            if let Some(n) = self.map.get_mut(&ino) {
                n.lookups += 1;
                return ino;
            }
        }
        let ino = self.next;
        self.next += 1;
        self.map.insert(
            ino,
            Node {
                parent,
                name: name.to_vec(),
                lookups: 1,
            },
        );
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
            if let Some(node) = self.map.remove(&ino) {
                let key = (node.parent, node.name);
                if self.by_name.get(&key) == Some(&ino) {
                    self.by_name.remove(&key);
                }
            }
        }
    }

    /// The name (parent, name) is gone: its node keeps living for open
    /// handles but has no path any more.
    fn detach(&mut self, parent: u64, name: &[u8]) {
        if let Some(ino) = self.by_name.remove(&(parent, name.to_vec())) {
            if let Some(n) = self.map.get_mut(&ino) {
                n.parent = 0;
            }
        }
    }

    fn rename(&mut self, parent: u64, name: &[u8], np: u64, nn: &[u8], exchange: bool) {
        let a = self.by_name.remove(&(parent, name.to_vec()));
        let b = self.by_name.remove(&(np, nn.to_vec()));
        if let Some(ino) = b {
            if let Some(n) = self.map.get_mut(&ino) {
                if exchange {
                    n.parent = parent;
                    n.name = name.to_vec();
                    self.by_name.insert((parent, name.to_vec()), ino);
                } else {
                    n.parent = 0;
                }
            }
        }
        if let Some(ino) = a {
            if let Some(n) = self.map.get_mut(&ino) {
                n.parent = np;
                n.name = nn.to_vec();
                self.by_name.insert((np, nn.to_vec()), ino);
            }
        }
    }
}

/// How the mount behaves.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// How long the kernel may cache attributes and names.
    pub ttl: Duration,
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
            threads: 4,
            fsname: "vkernel".into(),
            allow_other: false,
        }
    }
}

/// The FUSE file system: a [`Client`] and the node table.
pub struct VioFs {
    client: Arc<Client>,
    nodes: Mutex<Nodes>,
    ttl: Duration,
}

impl std::fmt::Debug for VioFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VioFs")
            .field("client", &self.client)
            .finish()
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
    /// A file system over `client`.
    pub fn new(client: Arc<Client>, ttl: Duration) -> VioFs {
        VioFs {
            client,
            nodes: Mutex::new(Nodes::new()),
            ttl,
        }
    }

    fn nodes(&self) -> MutexGuard<'_, Nodes> {
        match self.nodes.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn path(&self, ino: INodeNo) -> Result<Vec<u8>, FErrno> {
        self.nodes().path(ino.0).map_err(ferr)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<Vec<u8>, FErrno> {
        self.nodes().child(parent.0, name.as_bytes()).map_err(ferr)
    }

    fn entry(&self, parent: INodeNo, name: &OsStr, a: &Attr, reply: ReplyEntry) {
        let ino = self.nodes().remember(parent.0, name.as_bytes());
        reply.entry(&self.ttl, &file_attr(ino, a), Generation(0));
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

impl Filesystem for VioFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Bigger writes mean fewer exchanges; the kernel may cap them.
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let p = tryf!(reply, self.child(parent, name));
        let a = tryf!(reply, self.client.lstat(&p).map_err(cerr));
        self.entry(parent, name, &a, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(fh) = fh {
            if let Ok(a) = self.client.fstat(Fh(fh.0 as u32)) {
                return reply.attr(&self.ttl, &file_attr(ino.0, &a));
            }
        }
        let p = tryf!(reply, self.path(ino));
        let a = tryf!(reply, self.client.lstat(&p).map_err(cerr));
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
        if let (Some(sz), Some(fh)) = (size, fh) {
            // Through the handle: works for an open file whose name is gone.
            tryf!(
                reply,
                self.client.ftruncate(Fh(fh.0 as u32), sz).map_err(cerr)
            );
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
        if s.valid == 0 {
            if let Some(fh) = fh {
                let a = tryf!(reply, self.client.fstat(Fh(fh.0 as u32)).map_err(cerr));
                return reply.attr(&self.ttl, &file_attr(ino.0, &a));
            }
        }
        let p = tryf!(reply, self.path(ino));
        let a = tryf!(reply, self.client.setattr(&p, &s).map_err(cerr));
        reply.attr(&self.ttl, &file_attr(ino.0, &a));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let p = tryf!(reply, self.path(ino));
        let t = tryf!(reply, self.client.readlink(&p).map_err(cerr));
        reply.data(&t);
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Only regular files: the server refuses to create device nodes,
        // FIFOs and sockets.
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            return reply.error(FErrno::from_i32(libc::EPERM));
        }
        let p = tryf!(reply, self.child(parent, name));
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
        let (fh, a) = tryf!(
            reply,
            self.client
                .open(&p, flags, mode & !umask & 0o7777)
                .map_err(cerr)
        );
        tryf!(reply, self.client.close(fh).map_err(cerr));
        self.entry(parent, name, &a, reply);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let p = tryf!(reply, self.child(parent, name));
        let a = tryf!(
            reply,
            self.client.mkdir(&p, mode & !umask & 0o7777).map_err(cerr)
        );
        self.entry(parent, name, &a, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tryf!(reply, self.child(parent, name));
        tryf!(reply, self.client.unlink(&p).map_err(cerr));
        self.nodes().detach(parent.0, name.as_bytes());
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tryf!(reply, self.child(parent, name));
        tryf!(reply, self.client.rmdir(&p).map_err(cerr));
        self.nodes().detach(parent.0, name.as_bytes());
        reply.ok();
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let p = tryf!(reply, self.child(parent, link_name));
        let a = tryf!(
            reply,
            self.client
                .symlink(target.as_os_str().as_bytes(), &p)
                .map_err(cerr)
        );
        self.entry(parent, link_name, &a, reply);
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
        tryf!(reply, self.client.rename(&a, &b, f).map_err(cerr));
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
        self.entry(newparent, newname, &a, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let p = tryf!(reply, self.path(ino));
        let f = flags.0 & !(libc::O_CREAT | libc::O_EXCL);
        let (fh, _) = tryf!(reply, self.client.open(&p, f, 0).map_err(cerr));
        reply.opened(FileHandle(u64::from(fh.0)), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut buf = vec![0u8; size as usize];
        let n = tryf!(
            reply,
            self.client
                .read(Fh(fh.0 as u32), offset, &mut buf)
                .map_err(cerr)
        );
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let n = tryf!(
            reply,
            self.client
                .write(Fh(fh.0 as u32), offset, data)
                .map_err(cerr)
        );
        reply.written(n as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        tryf!(reply, self.client.flush(Fh(fh.0 as u32)).map_err(cerr));
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        tryf!(reply, self.client.close(Fh(fh.0 as u32)).map_err(cerr));
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        tryf!(
            reply,
            self.client.fsync(Fh(fh.0 as u32), datasync).map_err(cerr)
        );
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let p = tryf!(reply, self.path(ino));
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
        if offset == 0 && reply.add(ino, 1, FileType::Directory, ".") {
            return reply.ok();
        }
        if offset <= 1 {
            let parent = {
                let n = self.nodes();
                n.map.get(&ino.0).map_or(ROOT, |x| x.parent.max(ROOT))
            };
            if reply.add(INodeNo(parent), 2, FileType::Directory, "..") {
                return reply.ok();
            }
        }
        let mut at = u32::try_from(offset.max(2) - 2).unwrap_or(u32::MAX);
        loop {
            let c = tryf!(
                reply,
                self.client.readdir_at(Fh(fh.0 as u32), at).map_err(cerr)
            );
            for (i, e) in c.entries.iter().enumerate() {
                let next = 2 + u64::from(at) + i as u64 + 1;
                let name = OsStr::from_bytes(&e.name);
                if reply.add(INodeNo(e.ino), next, dt_kind(e.kind), name) {
                    return reply.ok();
                }
            }
            if c.done || c.next <= at {
                return reply.ok();
            }
            at = c.next;
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
        tryf!(reply, self.client.close(Fh(fh.0 as u32)).map_err(cerr));
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
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // The protocol carries no extended attributes: every file has none.
        reply.error(FErrno::from_i32(libc::ENODATA));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(FErrno::from_i32(libc::EOPNOTSUPP));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(FErrno::from_i32(libc::ENODATA));
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        // Not in the protocol; callers (posix_fallocate) fall back to writes.
        reply.error(FErrno::from_i32(libc::EOPNOTSUPP));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        // ENOSYS makes the kernel use its generic lseek from then on.
        reply.error(FErrno::from_i32(libc::ENOSYS));
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

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (default_permissions).
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let p = tryf!(reply, self.child(parent, name));
        let (fh, a) = tryf!(
            reply,
            self.client
                .open(&p, flags | libc::O_CREAT, mode & !umask & 0o7777)
                .map_err(cerr)
        );
        let ino = self.nodes().remember(parent.0, name.as_bytes());
        reply.created(
            &self.ttl,
            &file_attr(ino, &a),
            Generation(0),
            FileHandle(u64::from(fh.0)),
            FopenFlags::empty(),
        );
    }
}

/// Mounts `client`'s file server at `mountpoint` in the background; the
/// mount ends when the returned session is unmounted or dropped.
pub fn mount(
    client: Arc<Client>,
    mountpoint: &Path,
    opts: &FuseOptions,
) -> std::io::Result<fuser::BackgroundSession> {
    let fs = VioFs::new(client, opts.ttl);
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
    fuser::spawn_mount(fs, mountpoint, &cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_paths_follow_renames_and_unlinks() {
        let mut n = Nodes::new();
        let d = n.remember(ROOT, b"d");
        let f = n.remember(d, b"f");
        assert_eq!(n.path(f).unwrap(), b"d/f");
        let e = n.remember(ROOT, b"e");
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
