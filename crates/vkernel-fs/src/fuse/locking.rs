//! POSIX (fcntl) and flock locks, held at the server so programs on
//! different clients exclude each other.

use fuser::{FileHandle, INodeNo, LockOwner, ReplyEmpty};

use super::{cerr, lock_or_recover, VioFs};
use crate::client::{ClientError, Fh, LockRequest};
use crate::vio::{self, Errno};

/// A FUSE lock request (type `F_RDLCK`/`F_WRLCK`/`F_UNLCK`) as V I/O's.
pub(super) fn lock_request(
    owner: LockOwner,
    start: u64,
    end: u64,
    typ: i32,
    pid: u32,
) -> LockRequest {
    let kind = match typ {
        libc::F_RDLCK => vio::LOCK_READ,
        libc::F_WRLCK => vio::LOCK_WRITE,
        _ => vio::LOCK_UNLOCK,
    };
    LockRequest {
        kind,
        owner: owner.0,
        pid,
        start,
        end,
    }
}

impl VioFs {
    /// Drops `owner`'s locks on the file (whole range, which also ends
    /// its waits there), if it set any through this mount.
    pub(super) fn unlock_all(&self, ino: INodeNo, fh: Fh, owner: LockOwner) {
        if !lock_or_recover(&self.lockers).remove(&(ino.0, owner.0)) {
            return;
        }
        let l = LockRequest {
            kind: vio::LOCK_UNLOCK,
            owner: owner.0,
            pid: 0,
            start: 0,
            end: u64::MAX,
        };
        if let Err(e) = self.server().lock(fh, &l, false) {
            tracing::debug!("vkernel mount: unlocking at close: {e}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_getlk(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: fuser::ReplyLock,
    ) {
        let l = lock_request(lock_owner, start, end, typ, pid);
        let fh = tryf!(reply, self.server_fh(ino, fh));
        match self.server().test_lock(fh, &l) {
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, pid),
            Ok(Some(c)) => {
                let t = if c.kind == vio::LOCK_WRITE {
                    libc::F_WRLCK
                } else {
                    libc::F_RDLCK
                };
                reply.locked(c.start, c.end, t, c.pid)
            }
            Err(e) => reply.error(cerr(e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_setlk(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let l = lock_request(lock_owner, start, end, typ, pid);
        if l.kind != vio::LOCK_UNLOCK {
            // Set through a handle closed without FLUSH: its release
            // unlocks instead.
            if let Some(owners) = lock_or_recover(&self.noflush).get_mut(&fh.0) {
                if !owners.contains(&lock_owner.0) {
                    owners.push(lock_owner.0);
                }
            }
        }
        let fh = tryf!(reply, self.server_fh(ino, fh));
        if l.kind != vio::LOCK_UNLOCK {
            // Before asking: a close while the request waits must unlock.
            lock_or_recover(&self.lockers).insert((ino.0, lock_owner.0));
        }
        match self.server().lock(fh, &l, false) {
            Ok(()) => reply.ok(),
            // Held elsewhere: wait on a thread of its own, so waiting
            // programs never take the mount's threads (the holder may
            // need one to unlock).
            Err(ClientError::Server(Errno::EAGAIN)) if sleep => {
                let client = self.client.clone();
                let spawned = std::thread::Builder::new()
                    .name("vkernel-lockwait".into())
                    .spawn(move || match client.lock(fh, &l, true) {
                        Ok(()) => reply.ok(),
                        Err(e) => reply.error(cerr(e)),
                    });
                if let Err(e) = spawned {
                    tracing::warn!("vkernel mount: a thread to wait for a lock: {e}");
                }
            }
            Err(e) => reply.error(cerr(e)),
        }
    }
}
