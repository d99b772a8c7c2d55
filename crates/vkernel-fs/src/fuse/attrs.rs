//! Attributes (GETATTR, SETATTR, cached until something changes them)
//! and extended attributes.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{Errno as FErrno, FileHandle, INodeNo, ReplyAttr, ReplyEmpty, TimeOrNow};

use super::convert::{file_attr, set_time};
use super::nodes::left;
use super::{cerr, VioFs, ROOT};
use crate::client::ClientError;
use crate::vio::{self, Errno, SetAttr};

impl VioFs {
    pub(super) fn do_getattr(&self, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // The kernel drops its copy more often than it must (atime after
        // every read); ours lasts until something changes the file.
        if let Some((a, at)) = self.nodes().cached_attr_at(ino.0, self.ttl) {
            return reply.attr(&left(self.ttl, at), &file_attr(ino.0, &a));
        }
        if let Some(fh) = fh.and_then(|f| self.known_fh(f)) {
            if let Ok(a) = self.server().fstat(fh) {
                self.nodes().set_attr(ino.0, &a);
                self.dir_attr_fetched(ino.0, &a);
                return reply.attr(&self.ttl, &file_attr(ino.0, &a));
            }
        }
        let by_path = self
            .path(ino)
            .and_then(|p| self.server().lstat(&p).map_err(cerr));
        let a = match by_path {
            Ok(a) => a,
            // Its names are gone, but it may be open here.
            Err(e) => match self.any_handle(ino.0) {
                Some(fh) => tryf!(reply, self.server().fstat(fh).map_err(cerr)),
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
        self.dir_attr_fetched(ino.0, &a);
        reply.attr(&self.ttl, &file_attr(ino.0, &a));
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_setattr(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        let mut s = SetAttr::default();
        let fh = match fh {
            Some(f) => Some(tryf!(reply, self.server_fh(ino, f))),
            None => None,
        };
        if let (Some(sz), Some(fh)) = (size, fh) {
            // Through the handle: works for an open file whose name is gone.
            tryf!(reply, self.server().ftruncate(fh, sz).map_err(cerr));
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
            Some(fh) if s.valid == 0 => tryf!(reply, self.server().fstat(fh).map_err(cerr)),
            Some(fh) => tryf!(reply, self.server().fsetattr(fh, &s).map_err(cerr)),
            None => {
                let p = tryf!(reply, self.path(ino));
                tryf!(reply, self.server().setattr(&p, &s).map_err(cerr))
            }
        };
        self.nodes().set_attr(ino.0, &a);
        reply.attr(&self.ttl, &file_attr(ino.0, &a));
    }

    pub(super) fn do_getxattr(
        &self,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // The kernel asks for security.capability before every write, and
        // `ls -l` for ACLs and security labels of every file; once a file
        // is known to lack one, that is answered here (until one is set
        // here or the server reports a change to the file).
        let key = name.as_bytes();
        if (self.nodes().map.get(&ino.0)).is_some_and(|n| n.lacks_xattr(key)) {
            return reply.error(FErrno::from_i32(libc::ENODATA));
        }
        let p = tryf!(reply, self.path(ino));
        let epoch = self.nodes().reported;
        match self.server().getxattr(&p, key, size as usize) {
            Ok((n, _)) if size == 0 => reply.size(n as u32),
            Ok((_, v)) => reply.data(&v),
            Err(ClientError::Server(e)) if e == Errno(libc::ENODATA as u32) => {
                let mut n = self.nodes();
                // Not kept if a report came meanwhile (it may be of this).
                if n.reported == epoch {
                    if let Some(node) = n.map.get_mut(&ino.0) {
                        node.lacks(key);
                    }
                }
                drop(n);
                reply.error(FErrno::from_i32(libc::ENODATA))
            }
            Err(e) => reply.error(cerr(e)),
        }
    }

    pub(super) fn do_listxattr(&self, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        let p = tryf!(reply, self.path(ino));
        match self.server().listxattr(&p, size as usize) {
            Ok((n, _)) if size == 0 => reply.size(n as u32),
            Ok((_, v)) => reply.data(&v),
            Err(e) => reply.error(cerr(e)),
        }
    }

    pub(super) fn do_setxattr(
        &self,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
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
            self.server()
                .setxattr(&p, name.as_bytes(), value, f)
                .map_err(cerr)
        );
        reply.ok();
    }

    pub(super) fn do_removexattr(&self, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tryf!(reply, self.path(ino));
        {
            let mut n = self.nodes();
            n.clear_attr(ino.0);
            n.clear_xattrs(ino.0);
        }
        tryf!(
            reply,
            self.server().removexattr(&p, name.as_bytes()).map_err(cerr)
        );
        reply.ok();
    }
}
