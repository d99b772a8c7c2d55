//! Namespace changes answered before the server has them, as CephFS's
//! asynchronous unlink: an unlink or rmdir the mount can decide from the
//! listing it keeps is answered at once, and one thread sends them to
//! the server in the order they were answered.
//!
//! Every other request to the server first waits until the changes
//! answered before it have been sent ([`Deferred::settle`]), so nothing
//! this mount asks sees the namespace as it was. A change the server
//! refuses is logged, its directory's listing is dropped (the name shows
//! again) and the next fsync of that directory returns the error.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use fuser::INodeNo;

use super::invalidate::Drop;
use super::state::Shared;
use super::{lock_or_recover, VioFs};
use crate::client::{Client, ClientError};
use crate::vio::{self, Errno};

/// What is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Removal {
    Unlink,
    Rmdir,
}

/// One change answered to the kernel, not yet sent.
#[derive(Clone, Debug)]
pub(super) struct Change {
    pub(super) removal: Removal,
    /// The directory's FUSE inode number and the name in it.
    pub(super) parent: u64,
    pub(super) name: Vec<u8>,
    /// Its path at the server when answered.
    pub(super) path: Vec<u8>,
}

#[derive(Default)]
struct Queue {
    changes: VecDeque<Change>,
    /// The first error the server gave for a change in a directory, until
    /// an fsync of it reports it.
    failed: HashMap<u64, Errno>,
    /// No more changes come: the sender ends once the queue is empty.
    closing: bool,
}

/// The queue of changes and its counts.
#[derive(Default)]
pub(super) struct Deferred {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Changes answered so far, and sent so far (so a waiter waits only
    /// for those answered before it).
    answered: AtomicU64,
    sent: AtomicU64,
}

impl Deferred {
    /// Queues a change already answered to the kernel.
    pub(super) fn push(&self, c: Change) {
        let mut q = lock_or_recover(&self.q);
        q.changes.push_back(c);
        self.answered.fetch_add(1, Ordering::SeqCst);
        drop(q);
        self.cv.notify_all();
    }

    /// Waits until every change answered before this call was sent.
    pub(super) fn settle(&self) {
        let target = self.answered.load(Ordering::SeqCst);
        if self.sent.load(Ordering::SeqCst) >= target {
            return;
        }
        let mut q = lock_or_recover(&self.q);
        while self.sent.load(Ordering::SeqCst) < target {
            q = match self.cv.wait(q) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }

    /// Waits for what was answered before, then takes the error the
    /// server gave for a change in `dir` since the last call, if any.
    pub(super) fn take_error(&self, dir: u64) -> Option<Errno> {
        self.settle();
        lock_or_recover(&self.q).failed.remove(&dir)
    }

    /// No more changes come; the sender sends what is queued and ends.
    pub(super) fn close(&self) {
        lock_or_recover(&self.q).closing = true;
        self.cv.notify_all();
    }

    /// The changes at the queue's head (left there until sent), at most
    /// `most`, waiting for one; `None` once closing and empty.
    fn next(&self, most: usize) -> Option<Vec<Change>> {
        let mut q = lock_or_recover(&self.q);
        loop {
            if !q.changes.is_empty() {
                return Some(q.changes.iter().take(most).cloned().collect());
            }
            if q.closing {
                return None;
            }
            q = match self.cv.wait(q) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }

    /// The change at the queue's head, if any, without waiting.
    fn next_now(&self) -> Option<Change> {
        lock_or_recover(&self.q).changes.front().cloned()
    }

    /// The `n` changes at the head were sent and done: one wake-up for
    /// the batch, not one per change.
    fn sent_ok(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut q = lock_or_recover(&self.q);
        let n = n.min(q.changes.len());
        q.changes.drain(..n);
        self.sent.fetch_add(n as u64, Ordering::SeqCst);
        drop(q);
        self.cv.notify_all();
    }

    /// The head change was sent: `failed` is the server's error, if any.
    fn done(&self, parent: u64, failed: Option<Errno>) {
        let mut q = lock_or_recover(&self.q);
        q.changes.pop_front();
        if let Some(e) = failed {
            q.failed.entry(parent).or_insert(e);
        }
        self.sent.fetch_add(1, Ordering::SeqCst);
        drop(q);
        self.cv.notify_all();
    }
}

/// Most removals the sender takes at once (one REMOVEV).
const BATCH: usize = vio::MAX_REMOVEV as usize;

/// The sender: sends what is queued in order, in batches (whatever came
/// while the last batch was out), and ends when the queue closes and
/// empties. The directory attributes made up at the answer stand (they
/// live no longer than attributes fetched then would have).
pub(super) fn send_in_order(client: &Client, shared: &Shared, d: &Arc<Deferred>) {
    while let Some(batch) = d.next(BATCH) {
        let items: Vec<(u32, &[u8])> = batch
            .iter()
            .map(|c| {
                let kind = match c.removal {
                    Removal::Unlink => vio::REMOVE_UNLINK,
                    Removal::Rmdir => vio::REMOVE_RMDIR,
                };
                (kind, &c.path[..])
            })
            .collect();
        let (did, err) = client.remove_many(&items);
        d.sent_ok(did);
        let (Some(e), Some(c)) = (err, batch.get(did)) else {
            continue;
        };
        let path = String::from_utf8_lossy(&c.path);
        if let ClientError::Server(Errno::ENOENT) = e {
            // Gone already (another client removed it first), or moved
            // there by another client's rename: what this mount made of
            // the directory is dropped, so the truth shows either way.
            tracing::info!(
                "{:?} of {path} sent after its answer: not there any more",
                c.removal
            );
            refused(shared, c.parent, &c.name);
            d.done(c.parent, None);
            continue;
        }
        tracing::warn!(
            "{:?} of {path}, answered before it was sent, failed: {e}; \
             the name shows again, and the next fsync of its directory fails",
            c.removal
        );
        refused(shared, c.parent, &c.name);
        d.done(c.parent, Some(e.errno()));
        if !matches!(e, ClientError::Server(_)) {
            // The server is gone (the client already looked for it
            // again): the rest fail too, without waiting each.
            fail_all(shared, d, e.errno());
        }
    }
}

/// Fails every queued change with `errno`, unsent.
fn fail_all(shared: &Shared, d: &Deferred, errno: Errno) {
    let mut n = 0usize;
    while let Some(c) = d.next_now() {
        refused(shared, c.parent, &c.name);
        d.done(c.parent, Some(errno));
        n += 1;
    }
    if n > 0 {
        tracing::warn!("{n} more removals answered before they were sent failed unsent: {errno}");
    }
}

/// The server refused it: the mount forgets what it made of the change,
/// and the kernel forgets the name's absence.
fn refused(shared: &Shared, parent: u64, name: &[u8]) {
    {
        let mut n = shared.nodes();
        n.clear_attr(parent);
        n.listings.drop_dir(parent);
        n.absent.remove(&(parent, name.to_vec()));
    }
    shared.drop_later(vec![Drop::Entry(parent, name.to_vec()), Drop::Data(parent)]);
}

impl VioFs {
    /// Answers an unlink or rmdir of `name` in `parent` (at `path`) at
    /// once and queues it for the server, if the kept listings decide it:
    /// the name is listed with the right type and, for rmdir, the
    /// directory is listed empty. The mount's caches change as they would
    /// after the server's answer. `false`: it must wait for the server.
    pub(super) fn defer(
        &self,
        removal: Removal,
        parent: INodeNo,
        name: &OsStr,
        path: &[u8],
    ) -> bool {
        let Some(d) = &self.deferred else {
            return false;
        };
        let key = name.as_bytes();
        let mut n = self.nodes();
        let Some(kind) = n.listings.kind(parent.0, key, self.ttl) else {
            return false;
        };
        let child = n.named(parent.0, key);
        match removal {
            Removal::Unlink if kind == libc::DT_DIR || kind == libc::DT_UNKNOWN => return false,
            Removal::Unlink => {}
            Removal::Rmdir => {
                let empty =
                    kind == libc::DT_DIR && child.is_some_and(|c| n.listings.is_empty(c, self.ttl));
                if !empty {
                    return false;
                }
            }
        }
        n.listings.remove(parent.0, key);
        if let Some(c) = child {
            if removal == Removal::Rmdir {
                n.listings.drop_dir(c);
            }
            n.clear_attr(c);
        }
        n.touched(parent.0, removal == Removal::Rmdir);
        n.detach(parent.0, key);
        d.push(Change {
            removal,
            parent: parent.0,
            name: key.to_vec(),
            path: path.to_vec(),
        });
        true
    }
}
