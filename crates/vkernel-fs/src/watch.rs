//! Cache invalidation at the server: which clients watch the tree, which
//! files each may hold attributes of, and the [`vio::INVALIDATE`]
//! messages a change sends them.
//!
//! A client that sent [`vio::WATCH`] names its *callback process* and the
//! processes it sends requests from (its *members*). When a request from
//! any other process changes the tree, the worker executing it Sends an
//! INVALIDATE to every other watcher's callback process before it replies
//! (so once a change is acknowledged, every other watching client has been
//! told). Changes by name (create, unlink, rename, setattr by path) go to
//! every other watcher; changes by handle (write, ftruncate, fsetattr) only
//! to watchers that were answered the file's attributes since they were
//! last told, which keeps a stream of writes from costing one message
//! each. A watcher whose callback process cannot be reached is dropped.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use vkernel::{Pid, Process, Segment};

use crate::vio::{self, Errno, Invalidation};

/// Most watching clients per server.
pub const MAX_WATCHERS: usize = 1024;
/// Most files a watcher is remembered to hold attributes of; beyond it
/// the set is cleared and the watcher is told of every change by handle
/// to a file it holds (it may hold any).
const MAX_INTEREST: usize = 1 << 20;
/// How long a callback Send may take before its client is dropped.
const CALLBACK_DEADLINE: Duration = Duration::from_secs(2);

/// One change to report.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Change<'a> {
    /// By name: `flags` ([`vio::INVAL_ENTRY`], [`vio::INVAL_ATTR`],
    /// [`vio::INVAL_DATA`]) about the file at `path`.
    Path(&'a [u8], u32),
    /// By identity (device, inode): `flags` about that file.
    Id((u32, u64), u32),
    /// A rename from the first path to the second (exchanged if the flag
    /// says so): one [`vio::INVAL_RENAME`] to watchers that asked for it,
    /// an [`vio::INVAL_ENTRY`] per name to the others.
    Rename(&'a [u8], &'a [u8], bool),
}

struct Watcher {
    callback: Pid,
    members: Vec<Pid>,
    /// Files whose attributes it was answered since last told.
    interest: HashSet<(u32, u64)>,
    /// The interest set overflowed: tell it of every change.
    all: bool,
    /// It asked for renames as one message ([`vio::WATCH_RENAMES`]).
    renames: bool,
}

/// The watching clients of one server.
#[derive(Default)]
pub(crate) struct Watchers {
    list: Mutex<Vec<Watcher>>,
    count: AtomicUsize,
    /// INVALIDATE messages sent.
    pub(crate) sent: AtomicU64,
    /// Watchers dropped because their callback could not be reached.
    pub(crate) dropped: AtomicU64,
}

impl Watchers {
    fn list(&self) -> MutexGuard<'_, Vec<Watcher>> {
        match self.list.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// How many clients watch.
    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Would a change by `from` be reported to nobody (no other client
    /// watches)?
    pub(crate) fn quiet_for(&self, from: Pid) -> bool {
        match self.len() {
            0 => true,
            1 => self
                .list()
                .first()
                .is_some_and(|w| w.members.contains(&from)),
            _ => false,
        }
    }

    /// Registers (or re-registers) the client whose callback process is
    /// `callback` and which sends from `members`; `renames`: it takes
    /// [`Change::Rename`] as one message.
    pub(crate) fn add(&self, callback: Pid, members: Vec<Pid>, renames: bool) -> Result<(), Errno> {
        if callback.is_none() || members.contains(&callback) {
            return Err(Errno::EINVAL);
        }
        let mut l = self.list();
        l.retain(|w| w.callback != callback && !w.members.iter().any(|m| members.contains(m)));
        if l.len() >= MAX_WATCHERS {
            return Err(Errno::ENOSPC);
        }
        l.push(Watcher {
            callback,
            members,
            interest: HashSet::new(),
            all: false,
            renames,
        });
        self.count.store(l.len(), Ordering::Release);
        Ok(())
    }

    /// Forgets the client whose callback is `callback`, if `from` is one
    /// of its members (no other process may end a client's watch); true
    /// if it watched.
    pub(crate) fn remove(&self, callback: Pid, from: Pid) -> bool {
        let mut l = self.list();
        let before = l.len();
        l.retain(|w| w.callback != callback || !w.members.contains(&from));
        self.count.store(l.len(), Ordering::Release);
        l.len() < before
    }

    /// The server answered `from` the attributes of file `id`: its
    /// client may cache them from now on.
    pub(crate) fn saw(&self, from: Pid, id: (u32, u64)) {
        if self.len() == 0 {
            return;
        }
        let mut l = self.list();
        if let Some(w) = l.iter_mut().find(|w| w.members.contains(&from)) {
            if w.interest.len() >= MAX_INTEREST {
                w.interest.clear();
                w.all = true;
            }
            w.interest.insert(id);
        }
    }

    /// Tells every watcher except `from`'s client of `changes`, with
    /// Sends from `p` (the worker executing `from`'s request).
    pub(crate) fn notify(&self, p: &Process, from: Pid, changes: &[Change<'_>]) {
        if self.len() == 0 || changes.is_empty() {
            return;
        }
        let mut todo: Vec<(Pid, Vec<Change<'_>>)> = Vec::new();
        {
            let mut l = self.list();
            for w in l.iter_mut().filter(|w| !w.members.contains(&from)) {
                let mut mine: Vec<Change<'_>> = Vec::new();
                for &c in changes {
                    match c {
                        Change::Path(..) => mine.push(c),
                        Change::Id(id, _) if w.interest.remove(&id) || w.all => mine.push(c),
                        Change::Id(..) => {}
                        Change::Rename(..) if w.renames => mine.push(c),
                        Change::Rename(old, new, _) => {
                            mine.push(Change::Path(old, vio::INVAL_ENTRY));
                            mine.push(Change::Path(new, vio::INVAL_ENTRY));
                        }
                    }
                }
                if !mine.is_empty() {
                    todo.push((w.callback, mine));
                }
            }
        }
        for (callback, mine) in todo {
            for c in mine {
                if let Err(e) = send(p, callback, c) {
                    tracing::warn!("file server: client callback {callback} unreachable ({e}); it no longer gets invalidations");
                    self.drop_watcher(callback);
                    break;
                }
                self.sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn drop_watcher(&self, callback: Pid) {
        let mut l = self.list();
        let before = l.len();
        l.retain(|w| w.callback != callback);
        if l.len() < before {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.count.store(l.len(), Ordering::Release);
    }
}

fn send(p: &Process, to: Pid, c: Change<'_>) -> Result<(), vkernel::IpcError> {
    let joined;
    let (inv, path) = match c {
        Change::Rename(old, new, exchange) => {
            joined = [old, new].join(&0u8);
            let x = if exchange { vio::INVAL_EXCHANGE } else { 0 };
            (
                Invalidation {
                    flags: vio::INVAL_ENTRY | vio::INVAL_RENAME | x,
                    id: (0, 0),
                    path_len: joined.len() as u32,
                },
                &joined[..],
            )
        }
        Change::Path(path, flags) => (
            Invalidation {
                flags,
                id: (0, 0),
                path_len: path.len() as u32,
            },
            path,
        ),
        Change::Id(id, flags) => (
            Invalidation {
                flags,
                id,
                path_len: 0,
            },
            &[][..],
        ),
    };
    let mut m = inv.encode();
    if path.is_empty() {
        p.send_within(&mut m, to, Some(CALLBACK_DEADLINE))?;
    } else {
        p.send_with_segment_within(
            &mut m,
            to,
            Segment::Read(path),
            usize::MAX,
            Some(CALLBACK_DEADLINE),
        )?;
    }
    // The callback's status is informational: it got the message.
    let _ = vio::status(&m);
    Ok(())
}

/// Decodes the member pids of a WATCH request's segment.
pub(crate) fn members(input: &[u8]) -> Vec<Pid> {
    input
        .chunks_exact(4)
        .map(|c| Pid(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_replaces_and_refuses_nonsense() {
        let w = Watchers::default();
        assert_eq!(w.add(Pid(0), vec![Pid(5)], false), Err(Errno::EINVAL));
        assert_eq!(w.add(Pid(5), vec![Pid(5)], false), Err(Errno::EINVAL));
        w.add(Pid(9), vec![Pid(1), Pid(2)], true).unwrap();
        // The same client again (a restart of its callback): one entry.
        w.add(Pid(10), vec![Pid(2), Pid(3)], true).unwrap();
        assert_eq!(w.len(), 1);
        w.add(Pid(11), vec![Pid(4)], false).unwrap();
        assert_eq!(w.len(), 2);
        w.saw(Pid(4), (1, 7));
        assert!(w.list()[1].interest.contains(&(1, 7)));
        // A process of no watcher: nothing remembered.
        w.saw(Pid(99), (1, 8));
        assert!(w.list().iter().all(|x| !x.interest.contains(&(1, 8))));
        // Only a member of the client ends its watch, and only once.
        assert!(!w.remove(Pid(11), Pid(3)));
        assert!(w.remove(Pid(11), Pid(4)));
        assert!(!w.remove(Pid(11), Pid(4)));
        assert_eq!(w.len(), 1);
        assert_eq!(
            members(&[0, 0, 0, 7, 0, 1, 0, 2]),
            vec![Pid(7), Pid(0x10002)]
        );
    }
}
