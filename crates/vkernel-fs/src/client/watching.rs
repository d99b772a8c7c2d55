//! WATCH: the callback process that receives the server's invalidations.

use vkernel::{IpcError, Kernel, Message, Pid, Process, Segment};

use super::{lock, Client, ClientError};
use crate::vio::{self, Errno, Request};

/// How long an UNWATCH waits for its answer.
const UNWATCH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);

impl Client {
    /// Asks the server to tell this client of changes other clients make
    /// (WATCH): `sink` is called with each [`vio::Invalidation`] and its
    /// path, on a callback process this starts on `kernel`, before the
    /// server is answered (see `callback_loop`). `Ok(false)` from a server that does not know
    /// WATCH (then nothing is reported). The callback process ends with
    /// the kernel.
    pub fn watch<F>(&self, kernel: &Kernel, sink: F) -> Result<bool, ClientError>
    where
        F: Fn(vio::Invalidation, &[u8]) + Send + 'static,
    {
        let (cb, _t) = kernel.spawn("vio-callback", move |p| callback_loop(&p, &sink))?;
        let p = self.pool.take();
        let r = self.send_watch(&p, self.server(), cb);
        if r.is_err() {
            let _ = p.destroy(cb);
        }
        self.pool.give(p);
        match r {
            Ok(()) => {
                *lock(&self.callback) = Some(cb);
                Ok(true)
            }
            Err(ClientError::Server(Errno::ENOSYS)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Asks the server to tell this client nothing more (UNWATCH), as
    /// a mount does when it unmounts, so the server's later changes do not
    /// wait on a callback process that is gone. `Ok(false)` if this client
    /// does not watch, or its server does not know UNWATCH; a server that
    /// does not answer within 1 s is an error.
    pub fn unwatch(&self) -> Result<bool, ClientError> {
        let Some(cb) = *lock(&self.callback) else {
            return Ok(false);
        };
        let p = self.pool.take();
        let mut m = Request::Unwatch { callback: cb.0 }.encode();
        // An unmount waits at most this long for a server that is gone.
        let r = p.send_within(&mut m, self.server(), Some(UNWATCH_DEADLINE));
        self.pool.give(p);
        r?;
        match vio::status(&m) {
            Errno::OK => {
                *lock(&self.callback) = None;
                Ok(true)
            }
            Errno::ENOSYS => Ok(false),
            e => Err(ClientError::Server(e)),
        }
    }

    pub(super) fn send_watch(&self, p: &Process, server: Pid, cb: Pid) -> Result<(), ClientError> {
        let members: Vec<u8> = self
            .members
            .iter()
            .flat_map(|m| m.0.to_be_bytes())
            .collect();
        let mut m = Request::Watch {
            callback: cb.0,
            members: self.members.len() as u32,
            flags: vio::WATCH_RENAMES,
        }
        .encode();
        p.send_with_segment(&mut m, server, Segment::Read(&members))?;
        match vio::status(&m) {
            Errno::OK => Ok(()),
            e => Err(ClientError::Server(e)),
        }
    }
}

/// A callback process: hands each INVALIDATE to `sink`, then answers it,
/// so what the sink forgets is forgotten before the server acknowledges
/// the change. The sink must not wait on anything that may wait on the
/// server (the mount's sink only takes its own caches' locks, and leaves
/// the kernel's caches to another thread).
fn callback_loop<F: Fn(vio::Invalidation, &[u8])>(p: &Process, sink: &F) {
    let mut m = Message::zero();
    // Room for a rename's two paths.
    let mut path = vec![0u8; 2 * vio::MAX_REQUEST_PATH + 1];
    loop {
        let i = match p.receive_with_segment(&mut m, &mut path) {
            Ok(i) => i,
            Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
            Err(_) => continue,
        };
        let status = match vio::Invalidation::decode(&m) {
            Ok(inv) => {
                let n = (inv.path_len as usize).min(path.len());
                let have = i.seg_bytes.min(n);
                // Long paths do not all come appended: the rest by MoveFrom.
                let whole =
                    have == n || p.move_from(i.from, have as u32, &mut path[have..n]).is_ok();
                if whole {
                    sink(inv, &path[..n]);
                    Errno::OK
                } else {
                    Errno::EIO
                }
            }
            Err(_) => Errno::EPROTO,
        };
        let _ = p.reply(&vio::reply(status, &[]), i.from);
    }
}
