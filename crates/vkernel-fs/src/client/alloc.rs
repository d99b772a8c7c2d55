//! [`Client::fallocate`] and [`Client::seek`]: space and holes of an open
//! file, done by the server on the real file.

use super::{Client, ClientError, Fh};
use crate::vio::{self, Attr, Request, ATTR_LEN};

impl Client {
    /// fallocate(2) of the open file `fh` over `len` bytes at `offset`;
    /// `mode` is Linux's (`FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_PUNCH_HOLE`,
    /// `FALLOC_FL_ZERO_RANGE`, the same bits as [`vio::FALLOCATE`]'s).
    /// Returns the file's attributes after it (`None` from a server that
    /// does not answer them).
    pub fn fallocate(
        &self,
        fh: Fh,
        mode: u32,
        offset: u64,
        len: u64,
    ) -> Result<Option<Attr>, ClientError> {
        let mut range = [0u8; vio::FALLOC_RANGE_LEN];
        range[..8].copy_from_slice(&offset.to_be_bytes());
        range[8..].copy_from_slice(&len.to_be_bytes());
        let req = Request::Fallocate { handle: fh.0, mode };
        let (_, out) = self.call(req, &range, ATTR_LEN)?;
        Ok(Attr::decode(&out).ok().filter(|a| a.ino != 0))
    }

    /// The offset of the next data (`whence` = `SEEK_DATA`) or hole
    /// (`SEEK_HOLE`) of the open file `fh` at or after `offset`, as the
    /// server's lseek(2) finds it (`ENXIO`: none).
    pub fn seek(&self, fh: Fh, offset: u64, whence: i32) -> Result<u64, ClientError> {
        let req = Request::Lseek {
            handle: fh.0,
            whence: whence as u32,
            offset,
        };
        let (m, _) = self.call(req, &[], 0)?;
        let w = vio::reply_words(&m);
        Ok((u64::from(w[0]) << 32) | u64::from(w[1]))
    }
}
