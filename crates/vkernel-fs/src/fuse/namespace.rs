//! Names: lookups, and names made, removed and renamed here, kept in
//! the node table, the kept listings and the cached attributes.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use fuser::{Errno as FErrno, Generation, INodeNo, RenameFlags, ReplyEmpty, ReplyEntry, Request};

use super::convert::{dt_of_mode, file_attr};
use super::deferred::Removal;
use super::nodes::left;
use super::{cerr, ferr, lock_or_recover, VioFs};
use crate::client::ClientError;
use crate::vio::{self, Attr, Errno, Owner};

impl VioFs {
    pub(super) fn child(&self, parent: INodeNo, name: &OsStr) -> Result<Vec<u8>, FErrno> {
        self.nodes().child(parent.0, name.as_bytes()).map_err(ferr)
    }

    /// Answers a lookup or a creation with the file's attributes. A
    /// creation (`made`: with the directory's attributes after it, if the
    /// server answered them) also changed the directory. Returns the
    /// file's inode number.
    pub(super) fn entry(
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
                // A directory made here is known empty. Before the reply:
                // once the kernel has it, names made in it may come.
                if self.watched && a.mode & libc::S_IFMT == libc::S_IFDIR {
                    n.listings.set(ino, Vec::new());
                }
            }
            ino
        };
        reply.entry(&self.ttl, &file_attr(ino, a), Generation(0));
        ino
    }

    /// A name in `parent` was made, removed or renamed here: the
    /// directory's attributes (mtime, link count) and the named file's
    /// (link count, ctime) changed.
    pub(super) fn changed_name(&self, parent: INodeNo, name: &OsStr) {
        self.changed_name_in(parent, name, None);
    }

    /// [`VioFs::changed_name`], with the directory's attributes after the
    /// change when the server answered them.
    pub(super) fn changed_name_in(&self, parent: INodeNo, name: &OsStr, dir: Option<Attr>) {
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
    pub(super) fn made_in(&self, parent: INodeNo, dir: Option<Attr>) {
        let mut n = self.nodes();
        match dir {
            Some(a) => n.set_attr(parent.0, &a),
            None => n.clear_attr(parent.0),
        }
    }

    pub(super) fn do_lookup(&self, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if name.len() > vio::MAX_NAME {
            return reply.error(ferr(Errno::ENAMETOOLONG));
        }
        if self.watched {
            let mut n = self.nodes();
            let key = name.as_bytes();
            // Answers from what is kept here live only what is left of
            // its lifetime in the kernel too (a change on the server's
            // disk shows after at most the cache lifetime, not twice it).
            let listed = n.listings.absent(parent.0, key, self.ttl);
            let since = n
                .absent_since(parent.0, key, self.ttl)
                .max(listed.then(|| n.listings.taken(parent.0)).flatten());
            if let Some(since) = since {
                drop(n);
                return reply_absent(&left(self.ttl, since), reply);
            }
            // Known here with fresh attributes (the kernel dropped its
            // entry, nothing changed it since).
            let known = n
                .named(parent.0, key)
                .and_then(|ino| Some((ino, n.cached_attr_at(ino, self.ttl)?)));
            if let Some((ino, (a, at))) = known {
                n.remember(parent.0, key, &a);
                drop(n);
                let ttl = left(self.ttl, at);
                return reply.entry(&ttl, &file_attr(ino, &a), Generation(0));
            }
        }
        let p = tryf!(reply, self.child(parent, name));
        let epoch = self.nodes().reported;
        match self.server().lstat(&p) {
            Ok(a) => {
                let ino = self.entry(parent, name, &a, None, reply);
                self.dir_attr_fetched(ino, &a);
            }
            // Absent until the server reports that a client made it; not
            // kept if a report came meanwhile (it may be of this name).
            Err(ClientError::Server(Errno::ENOENT)) if self.watched => {
                let mut n = self.nodes();
                if n.reported == epoch {
                    n.set_absent(parent.0, name.as_bytes());
                }
                drop(n);
                reply_absent(&self.ttl, reply)
            }
            Err(e) => reply.error(cerr(e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_mknod(
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
            self.server()
                .mknod(&p, mode, rdev, owner(req))
                .map_err(cerr)
        );
        self.entry(parent, name, &a, Some(None), reply);
    }

    pub(super) fn do_mkdir(
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
            self.server()
                .mkdir_in(&p, mode & !umask & 0o7777, owner(req))
                .map_err(cerr)
        );
        self.entry(parent, name, &a, Some(dir), reply);
    }

    pub(super) fn do_unlink(&self, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // A path queued must be the one the server will have when it is
        // sent: no rename here moves it meanwhile.
        let paths = lock_or_recover(&self.paths);
        let p = tryf!(reply, self.child(parent, name));
        self.materialize_named(parent, name);
        if self.defer(Removal::Unlink, parent, name, &p) {
            return reply.ok();
        }
        drop(paths);
        let dir = tryf!(reply, self.server().unlink_in(&p).map_err(cerr));
        self.changed_name_in(parent, name, dir);
        self.nodes().listings.remove(parent.0, name.as_bytes());
        self.nodes().detach(parent.0, name.as_bytes());
        reply.ok();
    }

    pub(super) fn do_rmdir(&self, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let paths = lock_or_recover(&self.paths);
        let p = tryf!(reply, self.child(parent, name));
        if self.defer(Removal::Rmdir, parent, name, &p) {
            return reply.ok();
        }
        drop(paths);
        let dir = tryf!(reply, self.server().rmdir_in(&p).map_err(cerr));
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

    pub(super) fn do_symlink(
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
            self.server()
                .symlink_as(target.as_os_str().as_bytes(), &p, owner(req))
                .map_err(cerr)
        );
        self.entry(parent, link_name, &a, Some(None), reply);
    }

    pub(super) fn do_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        // Held until the node table has the new paths (removals queued
        // meanwhile would carry the old ones).
        let _paths = lock_or_recover(&self.paths);
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
        tryf!(reply, self.server().rename(&a, &b, f).map_err(cerr));
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

    pub(super) fn do_link(
        &self,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let old = tryf!(reply, self.path(ino));
        let new = tryf!(reply, self.child(newparent, newname));
        let a = tryf!(reply, self.server().link(&old, &new).map_err(cerr));
        self.entry(newparent, newname, &a, Some(None), reply);
    }
}

/// A lookup's answer that the name does not exist, cached by the kernel
/// for `ttl` (an entry with inode 0).
pub(super) fn reply_absent(ttl: &Duration, reply: ReplyEntry) {
    reply.entry(ttl, &file_attr(0, &Attr::default()), Generation(0));
}

/// The calling program's ids, for whoever the server lets own what it
/// creates.
pub(super) fn owner(req: &Request) -> Owner {
    Owner {
        uid: req.uid(),
        gid: req.gid(),
    }
}
