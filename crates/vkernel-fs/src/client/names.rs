//! The namespace: MKDIR, MKNOD, RMDIR, UNLINK, RENAME, SYMLINK, LINK and
//! READLINK.

use vkernel::Message;

use super::{Client, ClientError};
use crate::vio::{self, Attr, Owner, Request, ATTR_LEN};

impl Client {
    /// Makes a directory.
    pub fn mkdir(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<Attr, ClientError> {
        self.mkdir_as(path, mode, Owner::default())
    }

    /// [`Client::mkdir`] on behalf of `owner`.
    pub fn mkdir_as(
        &self,
        path: impl AsRef<[u8]>,
        mode: u32,
        owner: Owner,
    ) -> Result<Attr, ClientError> {
        self.mkdir_in(path, mode, owner).map(|(a, _)| a)
    }

    /// [`Client::mkdir_as`], also answering the attributes of the
    /// directory it was made in, after the change (`None` from a server
    /// that does not send them).
    pub fn mkdir_in(
        &self,
        path: impl AsRef<[u8]>,
        mode: u32,
        owner: Owner,
    ) -> Result<(Attr, Option<Attr>), ClientError> {
        let p = path.as_ref();
        let req = Request::Mkdir {
            path_len: Self::len32(p)?,
            mode,
            owner,
        };
        let (m, out) = self.call(req, p, 2 * ATTR_LEN)?;
        let parent = Self::parent_attr(&m, 0, &out[ATTR_LEN..]);
        Ok((Self::attr_of(&out)?, parent))
    }

    /// The directory attributes a server appended (reply word `word` + 1
    /// is 1), from `out`.
    pub(super) fn parent_attr(m: &Message, word: usize, out: &[u8]) -> Option<Attr> {
        (vio::reply_words(m)[word] == 1)
            .then(|| Attr::decode(out).ok())
            .flatten()
    }

    /// Makes a FIFO, socket or device node (or an empty regular file):
    /// `mode` has the file type and permission bits, `rdev` the device
    /// number of a device node.
    pub fn mknod(
        &self,
        path: impl AsRef<[u8]>,
        mode: u32,
        rdev: u32,
        owner: Owner,
    ) -> Result<Attr, ClientError> {
        let p = path.as_ref();
        let req = Request::Mknod {
            path_len: Self::len32(p)?,
            mode,
            rdev,
            owner,
        };
        let (_, out) = self.call(req, p, ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: impl AsRef<[u8]>) -> Result<(), ClientError> {
        self.rmdir_in(path).map(|_| ())
    }

    /// [`Client::rmdir`], answering the attributes of the directory it
    /// was in, after the change (`None` from a server that does not).
    pub fn rmdir_in(&self, path: impl AsRef<[u8]>) -> Result<Option<Attr>, ClientError> {
        let p = path.as_ref();
        let req = Request::Rmdir {
            path_len: Self::len32(p)?,
        };
        let (m, out) = self.call(req, p, ATTR_LEN)?;
        Ok(Self::parent_attr(&m, 0, &out))
    }

    /// Removes names in order: each `(kind, path)` is an unlink
    /// ([`vio::REMOVE_UNLINK`]) or rmdir ([`vio::REMOVE_RMDIR`]). Sent in
    /// batches (REMOVEV; one UNLINK or RMDIR each with a server that does
    /// not know it, or for a path too long to share one). Returns how many
    /// were done, and the error of the next, which ended the run (the rest
    /// are not tried).
    pub fn remove_many(&self, items: &[(u32, &[u8])]) -> (usize, Option<ClientError>) {
        let one = |kind: u32, p: &[u8]| match kind {
            vio::REMOVE_RMDIR => self.rmdir_in(p).map(|_| ()),
            _ => self.unlink_in(p).map(|_| ()),
        };
        let mut done = 0;
        while done < items.len() {
            // A batch: as many as fit, at least one.
            let mut seg = Vec::new();
            let mut n = 0;
            for &(kind, p) in &items[done..] {
                let more = 8 + p.len();
                if n == vio::MAX_REMOVEV as usize
                    || seg.len() + more > vio::MAX_REMOVEV_BYTES as usize
                {
                    break;
                }
                seg.extend_from_slice(&kind.to_be_bytes());
                seg.extend_from_slice(&(p.len() as u32).to_be_bytes());
                seg.extend_from_slice(p);
                n += 1;
            }
            if n <= 1 || self.no_removev.load(std::sync::atomic::Ordering::Relaxed) {
                let (kind, p) = items[done];
                if let Err(e) = one(kind, p) {
                    return (done, Some(e));
                }
                done += 1;
                continue;
            }
            let mut m = Request::Removev {
                count: n as u32,
                len: seg.len() as u32,
            }
            .encode();
            match self.exchange(&mut m, Some(vkernel::Segment::Read(&seg))) {
                Ok(_) => done += n,
                Err(ClientError::Server(vio::Errno::ENOSYS)) if vio::reply_words(&m)[0] == 0 => {
                    // An older server: one at a time from now on.
                    self.no_removev
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e @ ClientError::Server(_)) => {
                    let did = (vio::reply_words(&m)[0] as usize).min(n);
                    return (done + did, Some(e));
                }
                Err(e) => return (done, Some(e)),
            }
        }
        (done, None)
    }

    /// Removes a name.
    pub fn unlink(&self, path: impl AsRef<[u8]>) -> Result<(), ClientError> {
        self.unlink_in(path).map(|_| ())
    }

    /// [`Client::unlink`], answering the attributes of the directory the
    /// name was in, after the change (`None` from a server that does not).
    pub fn unlink_in(&self, path: impl AsRef<[u8]>) -> Result<Option<Attr>, ClientError> {
        let p = path.as_ref();
        let req = Request::Unlink {
            path_len: Self::len32(p)?,
        };
        let (m, out) = self.call(req, p, ATTR_LEN)?;
        Ok(Self::parent_attr(&m, 0, &out))
    }

    /// Renames `old` to `new` (`flags`: [`vio::RENAME_NOREPLACE`],
    /// [`vio::RENAME_EXCHANGE`]).
    pub fn rename(
        &self,
        old: impl AsRef<[u8]>,
        new: impl AsRef<[u8]>,
        flags: u32,
    ) -> Result<(), ClientError> {
        let (a, b) = (old.as_ref(), new.as_ref());
        let req = Request::Rename {
            old_len: Self::len32(a)?,
            new_len: Self::len32(b)?,
            flags,
        };
        self.call(req, &[a, b].concat(), 0).map(|_| ())
    }

    /// Makes a symbolic link at `path` holding `target`.
    pub fn symlink(
        &self,
        target: impl AsRef<[u8]>,
        path: impl AsRef<[u8]>,
    ) -> Result<Attr, ClientError> {
        self.symlink_as(target, path, Owner::default())
    }

    /// [`Client::symlink`] on behalf of `owner`.
    pub fn symlink_as(
        &self,
        target: impl AsRef<[u8]>,
        path: impl AsRef<[u8]>,
        owner: Owner,
    ) -> Result<Attr, ClientError> {
        let (t, p) = (target.as_ref(), path.as_ref());
        let req = Request::Symlink {
            target_len: Self::len_upto(t, vio::MAX_PATH)?,
            path_len: Self::len32(p)?,
            owner,
        };
        let (_, out) = self.call(req, &[t, p].concat(), ATTR_LEN)?;
        Self::attr_of(&out)
    }

    /// The target of the symbolic link at `path`.
    pub fn readlink(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>, ClientError> {
        let p = path.as_ref();
        let req = Request::Readlink {
            path_len: Self::len32(p)?,
        };
        let (m, mut out) = self.call(req, p, vio::MAX_PATH)?;
        let n = vio::reply_words(&m)[0] as usize;
        if n > out.len() {
            return Err(ClientError::Malformed(format!("link target of {n} bytes")));
        }
        out.truncate(n);
        Ok(out)
    }

    /// Makes a hard link `new` to `old`.
    pub fn link(&self, old: impl AsRef<[u8]>, new: impl AsRef<[u8]>) -> Result<Attr, ClientError> {
        let (a, b) = (old.as_ref(), new.as_ref());
        let req = Request::Link {
            old_len: Self::len32(a)?,
            new_len: Self::len32(b)?,
        };
        let (_, out) = self.call(req, &[a, b].concat(), ATTR_LEN)?;
        Self::attr_of(&out)
    }
}
