//! Directory listings: OPENDIR, READDIR and READDIRPLUS.

use std::sync::atomic::Ordering;

use super::{Client, ClientError, DirChunk, DirChunkPlus, Fh, READDIR_BYTES};
use crate::vio::{self, Attr, Dirent, Errno, Request, ATTR_LEN};

impl Client {
    /// Opens a directory listing (a snapshot); returns the handle and the
    /// number of entries.
    pub fn opendir(&self, path: impl AsRef<[u8]>) -> Result<(Fh, u32), ClientError> {
        let p = path.as_ref();
        let req = Request::Opendir {
            path_len: Self::len32(p)?,
        };
        let (m, _) = self.call(req, p, 0)?;
        let [fh, count, ..] = vio::reply_words(&m);
        Ok((self.track(fh, p, 0, true), count))
    }

    /// Entries of an open listing from `index` on (as many as fit one reply).
    pub fn readdir_at(&self, fh: Fh, index: u32) -> Result<DirChunk, ClientError> {
        let req = Request::Readdir {
            handle: fh.0,
            index,
        };
        let (m, out) = self.call(req, &[], READDIR_BYTES)?;
        let [bytes, _, next, done, _] = vio::reply_words(&m);
        let n = (bytes as usize).min(out.len());
        let entries =
            Dirent::decode_all(&out[..n]).map_err(|e| ClientError::Malformed(e.to_string()))?;
        Ok(DirChunk {
            entries,
            next,
            done: done != 0,
        })
    }

    /// [`Client::readdir_at`] with each entry's attributes (READDIRPLUS;
    /// an entry removed since the listing was taken has attributes of
    /// inode 0). The entries are those from `index` on, in order.
    /// `Ok(None)` from a server that does not know the request.
    pub fn readdirplus_at(&self, fh: Fh, index: u32) -> Result<Option<DirChunkPlus>, ClientError> {
        if self.no_readdirplus.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let req = Request::Readdirplus {
            handle: fh.0,
            index,
        };
        let (m, out) = match self.call(req, &[], READDIR_BYTES) {
            Err(ClientError::Server(Errno::ENOSYS)) => {
                self.no_readdirplus.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            r => r?,
        };
        let [bytes, _, next, done, _] = vio::reply_words(&m);
        let mut b = &out[..(bytes as usize).min(out.len())];
        let bad = |e: vio::DecodeError| ClientError::Malformed(e.to_string());
        let mut entries = Vec::new();
        while !b.is_empty() {
            let n = usize::from(*b.get(9).unwrap_or(&0));
            let (head, rest) = b.split_at(b.len().min(vio::DIRENT_HEAD + n));
            let mut e = Dirent::decode_all(head).map_err(bad)?;
            let a = Attr::decode(rest).map_err(bad)?;
            b = &rest[ATTR_LEN.min(rest.len())..];
            if let Some(e) = e.pop() {
                entries.push((e, a));
            }
        }
        Ok(Some(DirChunkPlus {
            entries,
            next,
            done: done != 0,
        }))
    }

    /// Every entry of the directory at `path` (without `.` and `..`).
    pub fn readdir(&self, path: impl AsRef<[u8]>) -> Result<Vec<Dirent>, ClientError> {
        let (fh, _) = self.opendir(path)?;
        let mut out = Vec::new();
        let mut at = 0;
        let r = loop {
            match self.readdir_at(fh, at) {
                Ok(c) => {
                    out.extend(c.entries);
                    if c.done || c.next <= at {
                        break Ok(());
                    }
                    at = c.next;
                }
                Err(e) => break Err(e),
            }
        };
        let closed = self.close(fh);
        r?;
        closed?;
        Ok(out)
    }
}
