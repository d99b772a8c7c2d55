//! Open files: OPEN, CLOSE, READ, WRITE, sizes, FSYNC and LOCK, and the
//! whole-file helpers built on them.

use std::sync::atomic::Ordering;

use vkernel::{Message, Segment};

use super::{
    lock, Client, ClientError, Fh, LockInfo, LockRequest, ProgramImage, ProgramKind, HEADER_BYTES,
    OPEN_READ_MAX, WRITE_ATTR_MAX,
};
use crate::vio::{self, Attr, Errno, Owner, Request, ATTR_LEN};

impl Client {
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

    /// One READ of `buf.len()` bytes at `offset` (at most a request's
    /// size); the bytes read, fewer at end of file.
    fn read_once(&self, fh: Fh, offset: u64, buf: &mut [u8]) -> Result<usize, ClientError> {
        let n = buf.len();
        let mut m = Request::Read {
            handle: fh.0,
            offset,
            count: n as u32,
        }
        .encode();
        self.exchange(&mut m, Some(Segment::Write(buf)))?;
        let got = vio::reply_words(&m)[0] as usize;
        if got > n {
            return Err(ClientError::Malformed(format!(
                "READ answered {got} bytes for {n}"
            )));
        }
        Ok(got)
    }

    /// Reads into `buf` at `offset`; returns the bytes read (fewer only at
    /// end of file). Large reads are split into requests of the client's
    /// maximum size.
    pub fn read(&self, fh: Fh, offset: u64, buf: &mut [u8]) -> Result<usize, ClientError> {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_request);
            let got = self.read_once(fh, offset + done as u64, &mut buf[done..done + n])?;
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
                let r = self.read_once(fh, done as u64, &mut image[done..done + n])?;
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
