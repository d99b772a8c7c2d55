//! fallocate(2) and lseek(2)'s `SEEK_DATA`/`SEEK_HOLE` on the mount, done
//! by the server on the real file (FALLOCATE, LSEEK), so space is
//! reserved or freed there and the file's holes are seen through the
//! mount.

use fuser::{Errno as FErrno, FileHandle, INodeNo};

use super::{cerr, lock_or_recover, VioFs};

impl VioFs {
    /// fallocate(2) of an open file at the server.
    pub(super) fn allocate(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), FErrno> {
        let sfh = self.server_fh(ino, fh)?;
        // Its data changes at the server: what is held of it here is not
        // the file any more (the kernel drops its own pages of the range).
        {
            let mut n = self.nodes();
            n.contents.remove(ino.0);
            n.clear_attr(ino.0);
        }
        let open = lock_or_recover(&self.shared.open);
        let mut heads = lock_or_recover(&self.shared.heads);
        for h in open.get(&ino.0).into_iter().flatten() {
            heads.remove(h);
        }
        drop((heads, open));
        let a = self
            .server()
            .fallocate(sfh, mode as u32, offset, length)
            .map_err(cerr)?;
        if let Some(a) = a {
            self.nodes().set_attr(ino.0, &a);
        }
        Ok(())
    }

    /// The next data or hole of an open file, as the server's lseek(2)
    /// finds it. The kernel asks only for `SEEK_DATA` and `SEEK_HOLE`.
    pub(super) fn seek_data(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
    ) -> Result<i64, FErrno> {
        if offset < 0 || (whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE) {
            return Err(FErrno::from_i32(libc::EINVAL));
        }
        let sfh = self.server_fh(ino, fh)?;
        let at = self
            .server()
            .seek(sfh, offset as u64, whence)
            .map_err(cerr)?;
        i64::try_from(at).map_err(|_| FErrno::from_i32(libc::EOVERFLOW))
    }
}
