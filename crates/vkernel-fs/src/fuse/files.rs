//! Open files: OPEN (from held contents, or with the file's start),
//! reads, writes, flushes, closes, fsync, and CREATE.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use fuser::{
    Errno as FErrno, FileHandle, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    ReplyCreate, ReplyData, ReplyEmpty, ReplyOpen, ReplyWrite, Request, WriteFlags,
};

use super::convert::{dt_of_mode, file_attr, same_data};
use super::handles::{Head, LocalFile, LOCAL_FILE};
use super::namespace::owner;
use super::{cerr, lock_or_recover, VioFs};
use crate::client::{Fh, OPEN_READ_MAX};
use crate::vio;

impl VioFs {
    pub(super) fn do_open(&self, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
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
            let flags = FopenFlags::FOPEN_KEEP_CACHE | self.no_flush(fh, f);
            return reply.opened(FileHandle(fh), flags);
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
                self.server().open_read(&p, f, OPEN_READ_MAX).map_err(cerr)
            )
        } else {
            let (fh, a) = tryf!(reply, self.server().open(&p, f, 0).map_err(cerr));
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
        let flags = flags | self.no_flush(u64::from(fh.0), f);
        reply.opened(FileHandle(u64::from(fh.0)), flags);
    }

    pub(super) fn do_read(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
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
        let n = tryf!(
            reply,
            self.server().read(sfh, offset, &mut buf).map_err(cerr)
        );
        reply.data(&buf[..n]);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_write(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
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
            self.server()
                .write_flagged(sfh, offset, data, vio::WRITE_AT)
        } else if flags.0 & libc::O_APPEND != 0 {
            self.server().append_attr(sfh, offset, data)
        } else {
            self.server().write_attr(sfh, offset, data)
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

    pub(super) fn do_flush(
        &self,
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
        tryf!(reply, self.server().flush(Fh(fh)).map_err(cerr));
        lock_or_recover(&self.written).remove(&fh);
        reply.ok();
    }

    /// A read-only open needs no FLUSH at close: nothing was written
    /// through it, and the fcntl locks set through it are dropped at its
    /// release instead (`noflush`). So `fh` is remembered and the kernel
    /// told `FOPEN_NOFLUSH`.
    fn no_flush(&self, fh: u64, flags: i32) -> FopenFlags {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return FopenFlags::empty();
        }
        lock_or_recover(&self.noflush).insert(fh, Vec::new());
        FopenFlags::FOPEN_NOFLUSH
    }

    pub(super) fn do_release(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: Option<LockOwner>,
        reply: ReplyEmpty,
    ) {
        let lockers = lock_or_recover(&self.noflush).remove(&fh.0);
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
        // The last close of an open file drops its flock lock, and those
        // fcntl locks set through it that no FLUSH dropped.
        for o in lock_owner
            .into_iter()
            .chain(lockers.into_iter().flatten().map(LockOwner))
        {
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

    pub(super) fn do_fsync(&self, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let fh = tryf!(reply, self.server_fh(ino, fh));
        tryf!(reply, self.server().fsync(fh, datasync).map_err(cerr));
        lock_or_recover(&self.written).remove(&fh.0);
        reply.ok();
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_create(
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
            self.server()
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
                node.lacks(b"security.capability");
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
pub(super) fn append_open() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO
}
