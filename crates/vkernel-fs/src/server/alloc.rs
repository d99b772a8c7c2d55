//! FALLOCATE and LSEEK: space and holes of an open file, done by the
//! server's own fallocate(2) and lseek(2) on the real file, so a sparse
//! file stays sparse and programs (cp, tar, qemu-img) see its holes.

use rustix::fs::{FallocateFlags, SeekFrom};

use super::{lock, Answer, Kind, Req};
use crate::confine;
use crate::vio::{self, Errno};

impl Req<'_> {
    /// FALLOCATE of `handle`'s file over the range in `input`; the
    /// attributes after it if the client lent room for them.
    pub(super) fn fallocate(&self, handle: u32, mode: u32, input: &[u8]) -> Result<Answer, Errno> {
        let range = input.get(..vio::FALLOC_RANGE_LEN).ok_or(Errno::EPROTO)?;
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&range[i..i + 8]);
            u64::from_be_bytes(b)
        };
        let (offset, len) = (word(0), word(8));
        let h = self.sh.handle(handle, self.r.from, self.r.principal)?;
        let Kind::File { file, inode, .. } = &h.kind else {
            return Err(Errno::EISDIR);
        };
        let mut flags = FallocateFlags::empty();
        for (bit, f) in [
            (vio::FALLOC_KEEP_SIZE, FallocateFlags::KEEP_SIZE),
            (vio::FALLOC_PUNCH_HOLE, FallocateFlags::PUNCH_HOLE),
            (vio::FALLOC_ZERO_RANGE, FallocateFlags::ZERO_RANGE),
        ] {
            if mode & bit != 0 {
                flags |= f;
            }
        }
        // After any write-behind of the file; read-ahead may be stale.
        let mut io = lock(&inode.io);
        self.sh.drop_ra(&mut io);
        rustix::fs::fallocate(file, flags, offset, len).map_err(Errno::from_rustix)?;
        let st = rustix::fs::fstat(file).map_err(Errno::from_rustix)?;
        drop(io);
        Ok(self.attr_answer(vec![], confine::attr_of(&st)))
    }

    /// LSEEK: the next data (`SEEK_DATA`) or hole (`SEEK_HOLE`) of
    /// `handle`'s file at or after `offset`.
    pub(super) fn lseek(&self, handle: u32, whence: u32, offset: u64) -> Result<Answer, Errno> {
        let h = self.sh.handle(handle, self.r.from, self.r.principal)?;
        let Kind::File { file, inode, .. } = &h.kind else {
            return Err(Errno::EISDIR);
        };
        let to = if whence == libc::SEEK_HOLE as u32 {
            SeekFrom::Hole(offset)
        } else {
            SeekFrom::Data(offset)
        };
        // After any write-behind of the file. The descriptor's position
        // is used by nothing else (reads and writes give offsets).
        let io = lock(&inode.io);
        let at = rustix::fs::seek(file, to).map_err(Errno::from_rustix)?;
        drop(io);
        Ok(Answer::Words(vec![(at >> 32) as u32, at as u32]))
    }
}
