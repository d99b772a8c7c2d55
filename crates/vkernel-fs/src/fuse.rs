//! A FUSE file system on the V I/O client, so unmodified programs use the
//! server's files (`vkernel mount`).
//!
//! FUSE speaks of inode numbers; the V I/O protocol of paths and handles.
//! A node table maps each inode number the kernel holds to the server's
//! file (device, inode) and the names it is known by, (parent, name); a
//! node's path is rebuilt by walking its parents, so a rename moves a
//! whole subtree by updating one entry. Inode numbers are the server's, so
//! hard links are one inode, as programs expect. Open files and directories use
//! server handles, so they keep working after a rename or unlink of their
//! name. The kernel's own page cache, read-ahead and POSIX locks are used;
//! permissions are checked by the kernel from the attributes
//! (`default_permissions`).
//!
//! The module by concern: `adapter` answers the kernel's requests
//! (`impl fuser::Filesystem`), handing each to a method of the concern
//! it belongs to: `namespace` (lookups and names made, removed,
//! renamed), `files` (open files: reads, writes, closes), `attrs`
//! (attributes and extended attributes), `dirs` (directory handles and
//! listings), `locking` (POSIX and flock locks), `alloc` (fallocate,
//! SEEK_DATA/SEEK_HOLE). The state they drive: `state` (the file system
//! and what it shares with the invalidation thread), `nodes` (the node
//! table), `handles` (open handles and what they hold), `listing` and
//! `contents` (kept listings and whole files), `invalidate` and
//! `renamed` (the server's reports of changes, applied here and told to
//! the kernel). `mount` mounts and unmounts; `termination` waits for a
//! signal; `convert` turns V I/O's attributes into FUSE's.

use std::sync::{Mutex, MutexGuard};

use fuser::Errno as FErrno;

use crate::client::ClientError;
use crate::vio::Errno;

/// Answers a FUSE request with the error of a failed step, or gives the
/// step's value.
macro_rules! tryf {
    ($reply:ident, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(e),
        }
    };
}

mod adapter;
mod alloc;
mod attrs;
mod contents;
mod convert;
mod deferred;
mod dirs;
mod files;
mod handles;
mod invalidate;
mod listing;
mod locking;
mod mount;
mod namespace;
mod nodes;
mod renamed;
mod state;
mod termination;

pub use mount::{mount, unmount, FuseOptions};
pub use state::VioFs;
pub use termination::Termination;

const ROOT: u64 = 1;

fn lock_or_recover<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn ferr(e: Errno) -> FErrno {
    FErrno::from_i32(e.as_i32())
}

fn cerr(e: ClientError) -> FErrno {
    if let ClientError::Ipc(_) | ClientError::Malformed(_) = e {
        tracing::warn!("vkernel mount: {e}");
    }
    ferr(e.errno())
}
