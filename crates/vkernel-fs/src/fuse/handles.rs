//! Open handles: server handles per inode, handles answered by the mount
//! itself for files it holds whole, what an open kept of a file, and
//! the closer thread that closes server handles in batches.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{Errno as FErrno, FileHandle, INodeNo};

use super::{cerr, lock_or_recover, VioFs};
use crate::client::{Client, Fh};
use crate::vio;

/// First file handle answered by the mount itself, for a file it holds
/// whole (server handles are 32-bit, local directory handles higher).
pub(super) const LOCAL_FILE: u64 = 1 << 62;

/// What an open file kept from its OPENREAD: the start of the file.
pub(super) struct Head {
    pub(super) data: Arc<Vec<u8>>,
    /// `data` reaches the end of the file (as it was at the open).
    pub(super) to_eof: bool,
}

/// A file opened for reading from its kept whole data, without the server.
pub(super) struct LocalFile {
    pub(super) ino: u64,
    pub(super) data: Arc<Vec<u8>>,
    /// A server handle, opened once something needs one (a read after the
    /// file changed, a lock, fsync, an unlink of its last name).
    pub(super) server: Option<Fh>,
}

impl VioFs {
    pub(super) fn opened(&self, ino: u64, fh: Fh) {
        lock_or_recover(&self.shared.open)
            .entry(ino)
            .or_default()
            .push(fh.0);
    }

    pub(super) fn closed(&self, ino: u64, fh: Fh) {
        let mut open = lock_or_recover(&self.shared.open);
        if let Some(v) = open.get_mut(&ino) {
            v.retain(|&h| h != fh.0);
            if v.is_empty() {
                open.remove(&ino);
            }
        }
    }

    /// Closes a server handle: by the closer thread, or at once.
    pub(super) fn close_later(&self, fh: Fh) {
        let queued = lock_or_recover(&self.closer)
            .as_ref()
            .is_some_and(|tx| tx.send(fh.0).is_ok());
        if !queued {
            if let Err(e) = self.client.close(fh) {
                tracing::debug!("vkernel mount: close: {e}");
            }
        }
    }

    /// A handle of the file open here, if any.
    pub(super) fn any_handle(&self, ino: u64) -> Option<Fh> {
        lock_or_recover(&self.shared.open)
            .get(&ino)
            .and_then(|v| v.first())
            .map(|&h| Fh(h))
    }

    /// The server handle behind a FUSE file handle, if it has one now.
    pub(super) fn known_fh(&self, fh: FileHandle) -> Option<Fh> {
        if fh.0 < LOCAL_FILE {
            return Some(Fh(fh.0 as u32));
        }
        lock_or_recover(&self.local_files)
            .get(&fh.0)
            .and_then(|l| l.server)
    }

    /// The server handle behind a FUSE file handle: itself, or for a file
    /// opened here without the server, one opened now by the file's name.
    pub(super) fn server_fh(&self, ino: INodeNo, fh: FileHandle) -> Result<Fh, FErrno> {
        if let Some(s) = self.known_fh(fh) {
            return Ok(s);
        }
        let p = self.path(ino)?;
        let (s, _) = self.server().open(&p, libc::O_RDONLY, 0).map_err(cerr)?;
        let mut files = lock_or_recover(&self.local_files);
        let (got, spare) = match files.get_mut(&fh.0) {
            Some(l) => match l.server {
                // Another thread opened one meanwhile.
                Some(have) => (Ok(have), Some(s)),
                None => {
                    l.server = Some(s);
                    (Ok(s), None)
                }
            },
            None => (Err(FErrno::from_i32(libc::EBADF)), Some(s)),
        };
        drop(files);
        match spare {
            Some(s) => self.close_later(s),
            None => self.opened(ino.0, s),
        }
        got
    }

    /// Gives every handle of `ino` opened here without the server a
    /// server handle: its last name may be about to go, and the file is
    /// then reached only through one (fstat after unlink).
    pub(super) fn materialize(&self, ino: u64) {
        let local: Vec<u64> = lock_or_recover(&self.local_files)
            .iter()
            .filter(|(_, l)| l.ino == ino && l.server.is_none())
            .map(|(&fh, _)| fh)
            .collect();
        for fh in local {
            if let Err(e) = self.server_fh(INodeNo(ino), FileHandle(fh)) {
                tracing::debug!("vkernel mount: opening a held file at the server: {e:?}");
            }
        }
    }

    /// Materializes the file a name in `parent` stands for, if any.
    pub(super) fn materialize_named(&self, parent: INodeNo, name: &OsStr) {
        let named = self.nodes().named(parent.0, name.as_bytes());
        if let Some(ino) = named {
            self.materialize(ino);
        }
    }
}

/// The closer thread: waits for a handle, gathers those that follow
/// within a moment, and closes them in one exchange; ends (after closing
/// what it has) when the mount's sender goes.
pub(super) fn close_in_batches(client: &Client, rx: &std::sync::mpsc::Receiver<u32>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![Fh(first)];
        let until = Instant::now() + CLOSE_GATHER;
        while batch.len() < vio::MAX_CLOSEV as usize {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(fh) => batch.push(Fh(fh)),
                Err(_) => break,
            }
        }
        if let Err(e) = client.close_many(&batch) {
            tracing::debug!("vkernel mount: closing {} handles: {e}", batch.len());
        }
    }
}

/// How long the closer gathers handles before closing them.
pub(super) const CLOSE_GATHER: Duration = Duration::from_millis(2);
