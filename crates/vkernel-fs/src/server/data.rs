//! OPEN, CLOSE, READ, WRITE, truncation and FSYNC: a file's data, with
//! the server's read-ahead and write-behind.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vkernel::IpcError;

use super::{lock, path, Answer, Handle, Inode, Kind, ReadAhead, Req};
use crate::confine;
use crate::vio::{self, Errno, Owner, ATTR_LEN};
use crate::watch::Change;

impl Req<'_> {
    /// OPEN (and OPENREAD): a handle of the file at the path, with its
    /// attributes (and its first bytes).
    pub(super) fn open(
        &self,
        input: &[u8],
        prefetch: bool,
        path_len: u32,
        flags: u32,
        mode: u32,
        owner: Owner,
    ) -> Result<Answer, Errno> {
        let sh = self.sh;
        let root = &sh.root;
        let p = path(input, path_len)?;
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

    /// CLOSE: forgets the handle.
    pub(super) fn close_req(&self, handle: u32) -> Result<Answer, Errno> {
        self.close(handle)?;
        Ok(Answer::Words(vec![]))
    }

    /// CLOSEV: forgets the `count` handles listed in `input`.
    pub(super) fn closev(&self, input: &[u8], count: u32) -> Result<Answer, Errno> {
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

    /// TRUNCATE: sets the size of the file at the path.
    pub(super) fn truncate(&self, input: &[u8], path_len: u32, size: u64) -> Result<Answer, Errno> {
        self.truncate_path(path(input, path_len)?, size, false)?;
        Ok(Answer::Words(vec![]))
    }

    /// FTRUNCATE: sets the size of an open file.
    pub(super) fn ftruncate(&self, handle: u32, size: u64) -> Result<Answer, Errno> {
        let sh = self.sh;
        let h = sh.handle(handle, self.r.from, self.r.principal)?;
        let Kind::File { file, inode, .. } = &h.kind else {
            return Err(Errno::EISDIR);
        };
        let mut io = lock(&inode.io);
        sh.drop_ra(&mut io);
        file.set_len(size).map_err(|e| Errno::from_io(&e))?;
        Ok(Answer::Words(vec![]))
    }

    /// FSYNC: waits for the file's deferred write, then (unless `flush_only`)
    /// fsync(2) or fdatasync(2).
    pub(super) fn fsync(
        &self,
        handle: u32,
        datasync: bool,
        flush_only: bool,
    ) -> Result<Answer, Errno> {
        let sh = self.sh;
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

    /// Forgets a handle of the caller's; reports a deferred write error.
    pub(super) fn close(&self, handle: u32) -> Result<(), Errno> {
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

    pub(super) fn file(&self, handle: u32) -> Result<Arc<Handle>, Errno> {
        let h = self.sh.handle(handle, self.r.from, self.r.principal)?;
        match h.kind {
            Kind::File { .. } => Ok(h),
            Kind::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    pub(super) fn read(
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

    pub(super) fn read_ahead(&self, file: &std::fs::File, inode: &Inode, at: u64) {
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
    pub(super) fn write(
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

    /// Truncates the regular file at `path` (following links beneath the
    /// root), ordered with its deferred writes.
    pub(super) fn truncate_path(
        &self,
        path: &[u8],
        size: u64,
        nofollow: bool,
    ) -> Result<(), Errno> {
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
}

impl Req<'_> {
    /// Tells watchers that file `id`'s data and attributes changed.
    fn written(&self, id: (u32, u64)) {
        let c = [Change::Id(id, vio::INVAL_ATTR | vio::INVAL_DATA)];
        self.sh.watchers.notify(self.r.process, self.r.from, &c);
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
