//! Attributes: STAT, FSTAT, SETATTR, the extended attributes and STATFS.

use super::{Client, ClientError, Fh};
use crate::vio::{self, Attr, Request, SetAttr, StatFs, ATTR_LEN, SETATTR_LEN};

impl Client {
    /// Attributes of `path`, following a final symbolic link.
    pub fn stat(&self, path: impl AsRef<[u8]>) -> Result<Attr, ClientError> {
        self.stat_inner(path.as_ref(), false)
    }

    /// Attributes of `path` itself (a final symbolic link is not followed).
    pub fn lstat(&self, path: impl AsRef<[u8]>) -> Result<Attr, ClientError> {
        self.stat_inner(path.as_ref(), true)
    }

    fn stat_inner(&self, p: &[u8], nofollow: bool) -> Result<Attr, ClientError> {
        let req = Request::Stat {
            path_len: Self::len32(p)?,
            nofollow,
        };
        let (_, out) = self.call(req, p, ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Attributes of an open file.
    pub fn fstat(&self, fh: Fh) -> Result<Attr, ClientError> {
        let (_, out) = self.call(Request::Fstat { handle: fh.0 }, &[], ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Changes attributes of `path` (a final symbolic link is not followed).
    pub fn setattr(&self, path: impl AsRef<[u8]>, s: &SetAttr) -> Result<Attr, ClientError> {
        let p = path.as_ref();
        let req = Request::Setattr {
            path_len: Self::len32(p)?,
        };
        let mut input = Vec::with_capacity(SETATTR_LEN + p.len());
        input.extend_from_slice(&s.encode());
        input.extend_from_slice(p);
        let (_, out) = self.call(req, &input, ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Changes attributes of an open file by its handle (works after its
    /// names are gone): mode, owner, times and size as `s` asks.
    pub fn fsetattr(&self, fh: Fh, s: &SetAttr) -> Result<Attr, ClientError> {
        let (_, out) = self.call(Request::Fsetattr { handle: fh.0 }, &s.encode(), ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Sets the permission bits of `path`.
    pub fn chmod(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<Attr, ClientError> {
        let s = SetAttr {
            valid: vio::SET_MODE,
            mode,
            ..SetAttr::default()
        };
        self.setattr(path, &s)
    }

    /// Statistics of the server's file system.
    pub fn statfs(&self) -> Result<StatFs, ClientError> {
        let (_, out) = self.call(Request::Statfs, &[], vio::STATFS_LEN)?;
        StatFs::decode(&out).map_err(|e| ClientError::Malformed(e.to_string()))
    }

    /// The value of the extended attribute `name` of `path` (not
    /// following a final symbolic link): with `room` 0 only its length.
    pub fn getxattr(
        &self,
        path: impl AsRef<[u8]>,
        name: &[u8],
        room: usize,
    ) -> Result<(usize, Vec<u8>), ClientError> {
        let p = path.as_ref();
        let room = room.min(vio::MAX_XATTR_VALUE as usize);
        let req = Request::Getxattr {
            path_len: Self::len32(p)?,
            name_len: name.len() as u32,
            size: room as u32,
        };
        let (m, mut out) = self.call(req, &[p, name].concat(), room)?;
        let n = vio::reply_words(&m)[0] as usize;
        out.truncate(if room == 0 { 0 } else { n.min(room) });
        Ok((n, out))
    }

    /// The names of `path`'s extended attributes, each NUL-terminated
    /// (`room` 0: only the length).
    pub fn listxattr(
        &self,
        path: impl AsRef<[u8]>,
        room: usize,
    ) -> Result<(usize, Vec<u8>), ClientError> {
        let p = path.as_ref();
        let room = room.min(vio::MAX_XATTR_VALUE as usize);
        let req = Request::Listxattr {
            path_len: Self::len32(p)?,
            size: room as u32,
        };
        let (m, mut out) = self.call(req, p, room)?;
        let n = vio::reply_words(&m)[0] as usize;
        out.truncate(if room == 0 { 0 } else { n.min(room) });
        Ok((n, out))
    }

    /// Sets the extended attribute `name` of `path` (`flags`:
    /// [`vio::XATTR_CREATE`], [`vio::XATTR_REPLACE`]).
    pub fn setxattr(
        &self,
        path: impl AsRef<[u8]>,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<(), ClientError> {
        let p = path.as_ref();
        let req = Request::Setxattr {
            path_len: Self::len32(p)?,
            name_len: name.len() as u32,
            value_len: value.len() as u32,
            flags,
        };
        self.call(req, &[p, name, value].concat(), 0).map(|_| ())
    }

    /// Removes the extended attribute `name` of `path`.
    pub fn removexattr(&self, path: impl AsRef<[u8]>, name: &[u8]) -> Result<(), ClientError> {
        let p = path.as_ref();
        let req = Request::Removexattr {
            path_len: Self::len32(p)?,
            name_len: name.len() as u32,
        };
        self.call(req, &[p, name].concat(), 0).map(|_| ())
    }
}
