//! Directories: handles of listings served by the mount itself or by
//! the server, and READDIR/READDIRPLUS over either.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{
    Errno as FErrno, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyOpen,
};

use super::convert::{dt_kind, file_attr};
use super::listing::Entry;
use super::nodes::left;
use super::{cerr, lock_or_recover, VioFs};
use crate::client::{ClientError, Fh};
use crate::vio::Attr;

/// A listing as a directory handle served here was opened with, and
/// when it was known (its entries live in the kernel only what is left of
/// the cache lifetime).
pub(super) type Snapshot = Arc<(Instant, Vec<(Entry, Attr)>)>;

/// A listing served without a handle: (cookie, entry, attributes), in
/// cookie order.
pub(super) type ByCookie = Arc<Vec<(u64, Entry, Attr)>>;

/// The last listing served without a handle, kept for the READDIR calls
/// that follow (a large directory takes many): valid while no name
/// changed here (`Listings::changes`), no report came, and its
/// attributes are within their lifetime.
pub(super) struct LastListing {
    dir: u64,
    changes: u64,
    reported: u64,
    at: Instant,
    entries: ByCookie,
}

/// First directory handle of a listing served by the mount itself
/// (server handles are 32-bit).
pub(super) const LOCAL_DIR: u64 = 1 << 63;

/// Where a listing served without a handle resumes after `name`: a hash
/// of the name, and entries go out in that order, so an offset keeps
/// its place while other names come and go. Above 2 (`.` is 1, `..` 2)
/// and below 2^63 (the kernel's offsets are signed).
pub(super) fn cookie(name: &[u8]) -> u64 {
    use std::hash::Hasher;
    // SipHash with fixed keys: the same name, the same place, for the
    // mount's life (the kernel caches offsets no longer than that).
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(name);
    (h.finish() >> 1).max(3)
}

impl VioFs {
    /// The entries a listing served here was opened with.
    pub(super) fn local_dir(&self, fh: FileHandle) -> Option<Snapshot> {
        if fh.0 < LOCAL_DIR {
            return None;
        }
        lock_or_recover(&self.local_dirs).get(&fh.0).cloned()
    }

    /// The directory's kept listing, if it is fresh and every entry's
    /// attributes are too (readdirplus hands them to the kernel), and
    /// when the oldest of them was known.
    pub(super) fn kept_listing(&self, dir: INodeNo) -> Option<(Instant, Vec<(Entry, Attr)>)> {
        let n = self.nodes();
        let entries = n.listings.entries(dir.0, self.ttl)?;
        let mut oldest = n.listings.taken(dir.0)?;
        let v = entries
            .into_iter()
            .map(|e| {
                let ino = n.named(dir.0, &e.name)?;
                let (a, at) = n.cached_attr_at(ino, self.ttl)?;
                oldest = oldest.min(at);
                Some((e, a))
            })
            .collect::<Option<_>>()?;
        Some((oldest, v))
    }

    /// Lists the directory at the server (with attributes) and keeps the
    /// listing; `None` from a server without READDIRPLUS.
    pub(super) fn fetch_listing(
        &self,
        dir: INodeNo,
        path: &[u8],
    ) -> Result<Option<Vec<(Entry, Attr)>>, ClientError> {
        let (epoch, changes) = {
            let n = self.nodes();
            (n.reported, n.listings.changes())
        };
        let (fh, _) = self.server().opendir(path)?;
        let mut out = Vec::new();
        let mut at = 0;
        let r =
            loop {
                match self.server().readdirplus_at(fh, at) {
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
            n.listings
                .set_since(dir.0, out.iter().map(|(e, _)| e.clone()), changes);
        }
        Ok(Some(out))
    }

    /// The directory handle's listing ended before `offset`: nothing
    /// more to ask the server.
    pub(super) fn listed_past(&self, fh: FileHandle, offset: u64) -> bool {
        fh.0 < LOCAL_DIR
            && lock_or_recover(&self.listed)
                .get(&(fh.0 as u32))
                .is_some_and(|&end| offset >= end)
    }

    pub(super) fn listed_to(&self, fh: FileHandle, end: u64) {
        lock_or_recover(&self.listed).insert(fh.0 as u32, end);
    }

    /// Is `fh` a listing without a handle (the kernel no longer opens
    /// directories)?
    fn by_inode(&self, fh: FileHandle) -> bool {
        fh.0 == 0
            && self
                .no_dir_handles
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The listing of a directory the kernel reads without a handle:
    /// kept, or fetched now; in [`cookie`] order, and when it was known.
    fn listing_by_inode(&self, dir: INodeNo) -> Result<(Instant, ByCookie), FErrno> {
        let (changes, reported) = self.listing_epoch();
        if let Some(l) = lock_or_recover(&self.last_listing).as_ref().filter(|l| {
            l.dir == dir.0
                && l.changes == changes
                && l.reported == reported
                && !left(self.ttl, l.at).is_zero()
        }) {
            return Ok((l.at, l.entries.clone()));
        }
        let (at, snap) = match self.kept_listing(dir) {
            Some(s) => s,
            None => {
                let p = self.path(dir)?;
                let at = Instant::now();
                // A server that lost READDIRPLUS (replaced by an older
                // one) cannot serve listings by inode.
                let l = self
                    .fetch_listing(dir, &p)
                    .map_err(cerr)?
                    .ok_or(FErrno::from_i32(libc::EIO))?;
                (at, l)
            }
        };
        let entries = self.keep_by_cookie(dir, at, snap, (changes, reported));
        Ok((at, entries))
    }

    /// Forgets every listing of `dir` this mount keeps, nothing having
    /// changed here: the next is fetched from the server.
    pub(super) fn forget_listing(&self, dir: u64) {
        self.nodes().listings.forget_dir(dir);
        let mut last = lock_or_recover(&self.last_listing);
        if last.as_ref().is_some_and(|l| l.dir == dir) {
            *last = None;
        }
    }

    /// What a listing served by inode is valid for: this mount's name
    /// changes and the server's reports so far.
    fn listing_epoch(&self) -> (u64, u64) {
        let n = self.nodes();
        (n.listings.changes(), n.reported)
    }

    /// `snap` in cookie order, kept as the last listing served by inode
    /// (valid while the epoch, read before `snap` was taken, holds).
    fn keep_by_cookie(
        &self,
        dir: INodeNo,
        at: Instant,
        snap: Vec<(Entry, Attr)>,
        (changes, reported): (u64, u64),
    ) -> ByCookie {
        let mut v: Vec<_> = snap
            .into_iter()
            .map(|(e, a)| (cookie(&e.name), e, a))
            .collect();
        v.sort_unstable_by_key(|x| x.0);
        let entries = Arc::new(v);
        *lock_or_recover(&self.last_listing) = Some(LastListing {
            dir: dir.0,
            changes,
            reported,
            at,
            entries: entries.clone(),
        });
        entries
    }

    pub(super) fn do_opendir(&self, ino: INodeNo, reply: ReplyOpen) {
        let p = tryf!(reply, self.path(ino));
        if self.watched {
            let epoch = self.listing_epoch();
            let snap = match self.kept_listing(ino) {
                Some(s) => Some(s),
                None => {
                    let at = Instant::now();
                    let l = tryf!(reply, self.fetch_listing(ino, &p).map_err(cerr));
                    l.map(|l| (at, l))
                }
            };
            if self.kernel_cache {
                if let Some((at, snap)) = snap {
                    // The server lists with attributes, so any directory
                    // can be served by inode: the kernel need not open
                    // them, and then keeps their listings (FOPEN_CACHE_DIR)
                    // until a change here or a report from the server
                    // drops them. This listing serves the READDIRs next.
                    self.keep_by_cookie(ino, at, snap, epoch);
                    self.no_dir_handles
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    return reply.error(FErrno::from_i32(libc::ENOSYS));
                }
            }
            if let Some(snap) = snap {
                let fh = self
                    .next_local_dir
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lock_or_recover(&self.local_dirs).insert(fh, Arc::new(snap));
                return reply.opened(FileHandle(fh), FopenFlags::empty());
            }
        }
        let (fh, _) = tryf!(reply, self.server().opendir(&p).map_err(cerr));
        reply.opened(FileHandle(u64::from(fh.0)), FopenFlags::empty());
    }

    pub(super) fn do_readdir(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Offsets: 0 ".", 1 "..", then the server's entry i at 2 + i; each
        // entry carries the offset of the one after it. Without a handle,
        // an entry's offset is its cookie.
        let by_inode = self.by_inode(fh);
        if !by_inode && self.listed_past(fh, offset) {
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
        if by_inode {
            let (_, v) = tryf!(reply, self.listing_by_inode(ino));
            let n = self.nodes();
            for (c, e, _) in v.iter().filter(|x| x.0 > offset.max(2)) {
                let e_ino = n.entry_ino(ino.0, e.ino);
                if reply.add(
                    INodeNo(e_ino),
                    *c,
                    dt_kind(e.kind),
                    OsStr::from_bytes(&e.name),
                ) {
                    break;
                }
            }
            drop(n);
            return reply.ok();
        }
        if let Some(snap) = self.local_dir(fh) {
            let n = self.nodes();
            for (i, (e, _)) in snap.1.iter().enumerate().skip(offset.max(2) as usize - 2) {
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
                self.server().readdir_at(Fh(fh.0 as u32), at).map_err(cerr)
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

    pub(super) fn do_readdirplus(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        // Offsets as in `readdir`. Every entry but `.` and `..` counts as
        // a lookup of its file.
        let by_inode = self.by_inode(fh);
        if !by_inode && self.listed_past(fh, offset) {
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
        if by_inode {
            let epoch = self.nodes().reported;
            let (at, v) = tryf!(reply, self.listing_by_inode(ino));
            let mut n = self.nodes();
            // As a listing served with a handle: what is left of the
            // lifetime of what it was made from; nothing if the server
            // reported a change meanwhile (it may be to these).
            let fresh = n.reported == epoch;
            let ttl = if fresh {
                left(self.ttl, at)
            } else {
                Duration::ZERO
            };
            for (c, e, a) in v.iter().filter(|x| x.0 > offset.max(2)) {
                let e_ino = n.remember(ino.0, &e.name, a);
                if fresh {
                    n.set_attr_at(e_ino, a, at);
                }
                let (name, fa) = (OsStr::from_bytes(&e.name), file_attr(e_ino, a));
                if reply.add(INodeNo(e_ino), *c, name, &ttl, &fa, Generation(0)) {
                    n.forget(e_ino, 1);
                    break;
                }
            }
            drop(n);
            return reply.ok();
        }
        if let Some(snap) = self.local_dir(fh) {
            let (at, entries) = &*snap;
            let ttl = left(self.ttl, *at);
            let mut n = self.nodes();
            for (i, (e, a)) in entries.iter().enumerate().skip(offset.max(2) as usize - 2) {
                let e_ino = n.remember(ino.0, &e.name, a);
                n.set_attr_at(e_ino, a, *at);
                let name = OsStr::from_bytes(&e.name);
                let fa = file_attr(e_ino, a);
                let off = 2 + i as u64 + 1;
                if reply.add(INodeNo(e_ino), off, name, &ttl, &fa, Generation(0)) {
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
                self.server()
                    .readdirplus_at(Fh(fh.0 as u32), at)
                    .map_err(cerr)
            );
            let (entries, next, done) = match chunk {
                Some(c) => (c.entries, c.next, c.done),
                // An older server: a lookup per name.
                None => {
                    let c = tryf!(
                        reply,
                        self.server().readdir_at(Fh(fh.0 as u32), at).map_err(cerr)
                    );
                    let mut with = Vec::new();
                    for e in c.entries {
                        let p = tryf!(reply, self.child(ino, OsStr::from_bytes(&e.name)));
                        let a = self.server().lstat(&p).unwrap_or_default();
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

    pub(super) fn do_releasedir(&self, fh: FileHandle, reply: ReplyEmpty) {
        if lock_or_recover(&self.local_dirs).remove(&fh.0).is_some() {
            return reply.ok();
        }
        lock_or_recover(&self.listed).remove(&(fh.0 as u32));
        self.close_later(Fh(fh.0 as u32));
        reply.ok();
    }
}
