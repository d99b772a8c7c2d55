//! STAT, FSTAT, SETATTR, FSETATTR, the extended attributes and STATFS:
//! attributes of names and open files.

use super::{lock, path, two, Answer, Kind, Req};
use crate::confine;
use crate::vio::{self, Attr, Errno, SetAttr, ATTR_LEN, SETATTR_LEN};

impl Req<'_> {
    /// STAT: the attributes of the name at the path.
    pub(super) fn stat(
        &self,
        input: &[u8],
        path_len: u32,
        nofollow: bool,
    ) -> Result<Answer, Errno> {
        self.need_attr_room()?;
        let a = self.stat_path(path(input, path_len)?, !nofollow)?;
        Ok(self.attr_answer(vec![], a))
    }

    /// FSTAT: the attributes of an open file.
    pub(super) fn fstat(&self, handle: u32) -> Result<Answer, Errno> {
        let sh = self.sh;
        self.need_attr_room()?;
        let h = sh.handle(handle, self.r.from, self.r.principal)?;
        match &h.kind {
            Kind::File { file, inode, .. } => {
                let _io = lock(&inode.io);
                let st = rustix::fs::fstat(file).map_err(Errno::from_rustix)?;
                Ok(self.attr_answer(vec![], confine::attr_of(&st)))
            }
            Kind::Dir { .. } => Err(Errno::EBADF),
        }
    }

    /// FSETATTR: changes the attributes of an open file.
    pub(super) fn fsetattr(&self, input: &[u8], handle: u32) -> Result<Answer, Errno> {
        let sh = self.sh;
        let rec = input.get(..SETATTR_LEN).ok_or(Errno::EPROTO)?;
        let s = SetAttr::decode(rec).map_err(|_| Errno::EINVAL)?;
        let h = sh.handle(handle, self.r.from, self.r.principal)?;
        let Kind::File { file, inode, .. } = &h.kind else {
            return Err(Errno::EBADF);
        };
        let mut io = lock(&inode.io);
        if s.valid & vio::SET_SIZE != 0 {
            sh.drop_ra(&mut io);
            file.set_len(s.size).map_err(|e| Errno::from_io(&e))?;
        }
        let a = if s.valid & !vio::SET_SIZE != 0 {
            confine::setattr_fd(file, &s)?
        } else {
            confine::attr_of(&rustix::fs::fstat(file).map_err(Errno::from_rustix)?)
        };
        Ok(self.attr_answer(vec![], a))
    }

    /// SETATTR: changes the attributes of the name at the path.
    pub(super) fn setattr(&self, input: &[u8], path_len: u32) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let rec = input.get(..SETATTR_LEN).ok_or(Errno::EPROTO)?;
        let s = SetAttr::decode(rec).map_err(|_| Errno::EINVAL)?;
        let p = input
            .get(SETATTR_LEN..SETATTR_LEN + path_len as usize)
            .ok_or(Errno::EPROTO)?;
        if s.valid & vio::SET_SIZE != 0 {
            self.truncate_path(p, s.size, true)?;
        }
        let a = if s.valid & !vio::SET_SIZE != 0 {
            root.setattr(p, &s)?
        } else {
            self.stat_path(p, false)?
        };
        Ok(self.attr_answer(vec![], a))
    }

    /// GETXATTR: an extended attribute's value (its size when `size` is 0).
    pub(super) fn getxattr(
        &self,
        input: &[u8],
        path_len: u32,
        name_len: u32,
        size: u32,
    ) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let (p, name) = two(input, path_len, name_len)?;
        self.xattr_allowed(name)?;
        let (n, v) = root.getxattr(p, name, size as usize)?;
        if size > 0 && !self.can_answer(v.len()) {
            return Err(Errno::EPROTO);
        }
        Ok(Answer::Data(vec![n as u32], v))
    }

    /// LISTXATTR: the names of the extended attributes (their size when `size`
    /// is 0).
    pub(super) fn listxattr(
        &self,
        input: &[u8],
        path_len: u32,
        size: u32,
    ) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let (n, v) = root.listxattr(path(input, path_len)?, size as usize)?;
        if size > 0 && !self.can_answer(v.len()) {
            return Err(Errno::EPROTO);
        }
        Ok(Answer::Data(vec![n as u32], v))
    }

    /// SETXATTR: sets an extended attribute.
    pub(super) fn setxattr(
        &self,
        input: &[u8],
        path_len: u32,
        name_len: u32,
        value_len: u32,
        flags: u32,
    ) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let (p, name) = two(input, path_len, name_len)?;
        let at = (path_len + name_len) as usize;
        let value = input
            .get(at..at + value_len as usize)
            .ok_or(Errno::EPROTO)?;
        self.xattr_allowed(name)?;
        root.setxattr(p, name, value, flags)?;
        Ok(Answer::Words(vec![]))
    }

    /// REMOVEXATTR: removes an extended attribute.
    pub(super) fn removexattr(
        &self,
        input: &[u8],
        path_len: u32,
        name_len: u32,
    ) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let (p, name) = two(input, path_len, name_len)?;
        self.xattr_allowed(name)?;
        root.removexattr(p, name)?;
        Ok(Answer::Words(vec![]))
    }

    /// STATFS: the exported file system's figures.
    pub(super) fn statfs(&self) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        if !self.can_answer(vio::STATFS_LEN) {
            return Err(Errno::EPROTO);
        }
        let s = root.statfs()?;
        Ok(Answer::Data(vec![], s.encode().to_vec()))
    }

    /// An attribute answer, if the segment has room for it.
    pub(super) fn attr_answer(&self, words: Vec<u32>, a: Attr) -> Answer {
        self.sh.watchers.saw(self.r.from, (a.dev, a.ino));
        if self.can_answer(ATTR_LEN) {
            Answer::Data(words, a.encode().to_vec())
        } else {
            Answer::Words(words)
        }
    }

    pub(super) fn need_attr_room(&self) -> Result<(), Errno> {
        if self.can_answer(ATTR_LEN) {
            Ok(())
        } else {
            Err(Errno::EPROTO)
        }
    }

    /// Attributes by path, after any deferred write to the file finished.
    fn stat_path(&self, path: &[u8], follow: bool) -> Result<Attr, Errno> {
        let root = &self.sh.root;
        let (a, id) = root.stat(path, follow)?;
        match self.sh.existing_inode(id) {
            Some(ino) => {
                let _io = lock(&ino.io);
                Ok(root.stat(path, follow)?.0)
            }
            None => Ok(a),
        }
    }

    /// Which extended attributes a client may reach: `user.*`; `trusted.*`
    /// and `security.*` only for principal 0 (a root mount); others (the
    /// `system.*` ACLs) are not supported.
    fn xattr_allowed(&self, name: &[u8]) -> Result<(), Errno> {
        if name.contains(&0) {
            return Err(Errno::EINVAL);
        }
        if name.starts_with(b"user.") {
            Ok(())
        } else if name.starts_with(b"trusted.") || name.starts_with(b"security.") {
            if self.r.principal == 0 {
                Ok(())
            } else {
                Err(Errno::EPERM)
            }
        } else {
            Err(Errno::EOPNOTSUPP)
        }
    }
}
