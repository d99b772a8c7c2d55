//! The kernel-facing adapter: `impl fuser::Filesystem`, answering the
//! kernel's requests. All but the simplest are handed on: request `x` to
//! `VioFs::do_x`, in the module of its concern (`namespace`, `files`,
//! `attrs`, `dirs`, `locking`), which gets the request's used arguments
//! and its reply.

use std::ffi::OsStr;
use std::path::Path;
use std::time::SystemTime;

use fuser::{
    Errno as FErrno, FileHandle, Filesystem, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use super::{cerr, lock_or_recover, VioFs};

/// How long a file system's counts (STATFS) are answered from the last.
const STATFS_TTL: std::time::Duration = std::time::Duration::from_secs(1);

impl Filesystem for VioFs {
    fn destroy(&mut self) {
        // Send the removals answered early, and close what is queued,
        // before the session ends.
        self.finish_deferred();
        // The server stops Sending this mount invalidations: once its
        // process is gone, each would wait out the callback deadline.
        if self.watched {
            if let Err(e) = self.client.unwatch() {
                tracing::debug!("UNWATCH at unmount: {e}");
            }
        }
        lock_or_recover(&self.closer).take();
        lock_or_recover(&self.shared.drops).take();
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
        if self.kernel_cache {
            // Directories need no OPENDIR (the first is answered ENOSYS)
            // and their listings stay in the kernel; links are cached.
            // A symbolic link's target never changes in place; a listing
            // changed elsewhere is dropped by the server's report.
            let _ = config.add_capabilities(
                InitFlags::FUSE_NO_OPENDIR_SUPPORT | InitFlags::FUSE_CACHE_SYMLINKS,
            );
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.do_lookup(parent, name, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.do_getattr(ino, fh, reply);
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
        self.do_setattr(ino, mode, uid, gid, size, atime, mtime, fh, reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let p = tryf!(reply, self.path(ino));
        let t = tryf!(reply, self.server().readlink(&p).map_err(cerr));
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
        self.do_mknod(req, parent, name, mode, umask, rdev, reply);
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
        self.do_mkdir(req, parent, name, mode, umask, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.do_unlink(parent, name, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.do_rmdir(parent, name, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.do_symlink(req, parent, link_name, target, reply);
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
        self.do_rename(parent, name, newparent, newname, flags, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.do_link(ino, newparent, newname, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.do_open(ino, flags, reply);
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
        self.do_read(ino, fh, offset, size, reply);
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
        self.do_write(ino, fh, offset, data, write_flags, flags, reply);
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.do_flush(ino, fh, lock_owner, reply);
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
        self.do_release(ino, fh, lock_owner, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.do_fsync(ino, fh, datasync, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.do_opendir(ino, reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.do_readdir(ino, fh, offset, reply);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.do_readdirplus(ino, fh, offset, reply);
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.do_releasedir(fh, reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Removals in it answered early are at the server once this
        // returns; one the server refused fails it.
        match self.deferred.as_ref().and_then(|d| d.take_error(ino.0)) {
            Some(e) => reply.error(super::ferr(e)),
            None => reply.ok(),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Kept a moment: programs ask it often (rm -rf once per
        // directory), and the counts are a snapshot anyway.
        let kept = lock_or_recover(&self.statfs)
            .filter(|(at, _)| at.elapsed() < STATFS_TTL)
            .map(|(_, s)| s);
        let s = match kept {
            Some(s) => s,
            None => {
                let s = tryf!(reply, self.server().statfs().map_err(cerr));
                *lock_or_recover(&self.statfs) = Some((std::time::Instant::now(), s));
                s
            }
        };
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
        self.do_getxattr(ino, name, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        self.do_listxattr(ino, size, reply);
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
        self.do_setxattr(ino, name, value, flags, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.do_removexattr(ino, name, reply);
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
        self.do_getlk(ino, fh, lock_owner, start, end, typ, pid, reply);
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
        self.do_setlk(ino, fh, lock_owner, start, end, typ, pid, sleep, reply);
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
        self.do_create(req, parent, name, mode, umask, flags, reply);
    }
}
