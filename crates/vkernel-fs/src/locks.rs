//! Advisory byte-range locks held at the file server, so that programs on
//! different clients exclude each other (fcntl `F_SETLK`/`F_SETLKW`/
//! `F_GETLK`, and `flock`, which the mount sends as a whole-file lock).
//!
//! The table is plain data (no I/O): per file (device, inode), the locks
//! each owner holds. An owner is (client host, the client kernel's lock
//! owner), which for fcntl locks is the process and for flock the open
//! file. A new lock replaces the owner's locks over its range (POSIX), and
//! conflicts with another owner's overlapping lock unless both are read
//! locks. Waiters are requests the server has not answered yet: the
//! lock-waiting process holds them until [`Table::grantable`] says so.

use std::collections::HashMap;

/// A lock's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
}

/// Who holds a lock: (client host, the client's lock owner).
pub type Owner = (u16, u64);

/// A file: (device, inode).
pub type FileId = (u32, u64);

/// One held lock over `start..=end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Its holder.
    pub owner: Owner,
    /// Shared or exclusive.
    pub kind: Kind,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive).
    pub end: u64,
    /// The holding program's pid on its client (for `F_GETLK`).
    pub pid: u32,
}

/// A request waiting for a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// Its slot (the number the waiting process knows it by).
    pub slot: u32,
    /// The file.
    pub file: FileId,
    /// The lock it wants.
    pub want: Held,
}

/// Every file's locks and the requests waiting for one.
#[derive(Debug, Default)]
pub struct Table {
    files: HashMap<FileId, Vec<Held>>,
    waiting: Vec<Waiter>,
    next_slot: u32,
    /// A live process of each client host that asked for a lock (its
    /// liveness stands for the client's).
    clients: HashMap<u16, u32>,
}

fn overlaps(a: &Held, start: u64, end: u64) -> bool {
    a.start <= end && start <= a.end
}

impl Table {
    /// The lock of another owner that `want` conflicts with, if any.
    pub fn conflict(&self, file: FileId, want: &Held) -> Option<Held> {
        self.files.get(&file)?.iter().copied().find(|h| {
            h.owner != want.owner
                && overlaps(h, want.start, want.end)
                && (h.kind == Kind::Write || want.kind == Kind::Write)
        })
    }

    /// Sets `want` (replacing the owner's locks over its range), or with
    /// `kind` `None` removes the owner's locks over `start..=end`.
    /// Callers check [`Table::conflict`] first.
    pub fn set(
        &mut self,
        file: FileId,
        owner: Owner,
        kind: Option<Kind>,
        range: (u64, u64),
        pid: u32,
    ) {
        let (start, end) = range;
        let locks = self.files.entry(file).or_default();
        let mut kept = Vec::with_capacity(locks.len() + 1);
        for h in locks.drain(..) {
            if h.owner != owner || !overlaps(&h, start, end) {
                kept.push(h);
                continue;
            }
            // Keep the parts of the owner's lock outside the new range.
            if h.start < start {
                kept.push(Held {
                    end: start - 1,
                    ..h
                });
            }
            if h.end > end {
                kept.push(Held {
                    start: end + 1,
                    ..h
                });
            }
        }
        if let Some(kind) = kind {
            kept.push(Held {
                owner,
                kind,
                start,
                end,
                pid,
            });
        }
        if kept.is_empty() {
            self.files.remove(&file);
        } else {
            *locks = kept;
        }
    }

    /// Queues a request that must wait; returns its slot.
    pub fn wait(&mut self, file: FileId, want: Held) -> u32 {
        self.next_slot = self.next_slot.wrapping_add(1).max(1);
        let slot = self.next_slot;
        self.waiting.push(Waiter { slot, file, want });
        slot
    }

    /// Are requests waiting?
    pub fn has_waiters(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Takes the waiting requests that can be granted now, in the order
    /// they came, and sets their locks.
    pub fn grantable(&mut self) -> Vec<Waiter> {
        let mut granted = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            let w = self.waiting[i];
            if self.conflict(w.file, &w.want).is_none() {
                self.waiting.remove(i);
                self.set(
                    w.file,
                    w.want.owner,
                    Some(w.want.kind),
                    (w.want.start, w.want.end),
                    w.want.pid,
                );
                granted.push(w);
            } else {
                i += 1;
            }
        }
        granted
    }

    /// Takes the waiting requests of `owner` on `file` (it unlocked the
    /// whole file: its program closed the file or went away).
    pub fn cancel(&mut self, file: FileId, owner: Owner) -> Vec<Waiter> {
        let (gone, stay) = self
            .waiting
            .drain(..)
            .partition(|w| w.file == file && w.want.owner == owner);
        self.waiting = stay;
        gone
    }

    /// Drops every lock and waiter of `host`'s owners (that client went
    /// away); returns the waiters dropped.
    pub fn forget_host(&mut self, host: u16) -> Vec<Waiter> {
        self.clients.remove(&host);
        self.files.retain(|_, l| {
            l.retain(|h| h.owner.0 != host);
            !l.is_empty()
        });
        let (gone, stay) = self.waiting.drain(..).partition(|w| w.want.owner.0 == host);
        self.waiting = stay;
        gone
    }

    /// Remembers `pid` as a process of the client on `host`.
    pub fn client(&mut self, host: u16, pid: u32) {
        self.clients.insert(host, pid);
    }

    /// The clients that hold or wait for locks, each as (host, a pid of
    /// it); a client without either is forgotten.
    pub fn clients(&mut self) -> Vec<(u16, u32)> {
        let mut live: std::collections::HashSet<u16> =
            self.files.values().flatten().map(|h| h.owner.0).collect();
        live.extend(self.waiting.iter().map(|w| w.want.owner.0));
        self.clients.retain(|h, _| live.contains(h));
        self.clients.iter().map(|(&h, &p)| (h, p)).collect()
    }

    /// The locks held on `file`.
    pub fn held(&self, file: FileId) -> &[Held] {
        self.files.get(&file).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: FileId = (1, 2);
    const A: Owner = (1, 10);
    const B: Owner = (2, 10);

    fn want(owner: Owner, kind: Kind, start: u64, end: u64) -> Held {
        Held {
            owner,
            kind,
            start,
            end,
            pid: 7,
        }
    }

    #[test]
    fn read_locks_share_and_write_locks_exclude() {
        let mut t = Table::default();
        t.set(F, A, Some(Kind::Read), (0, 99), 7);
        assert_eq!(t.conflict(F, &want(B, Kind::Read, 50, 60)), None);
        assert!(t.conflict(F, &want(B, Kind::Write, 99, 200)).is_some());
        assert_eq!(t.conflict(F, &want(B, Kind::Write, 100, 200)), None);
        // The owner's own locks never conflict with it.
        assert_eq!(t.conflict(F, &want(A, Kind::Write, 0, 10)), None);
        assert_eq!(t.conflict((1, 3), &want(B, Kind::Write, 0, 10)), None);
    }

    #[test]
    fn a_new_lock_replaces_and_splits_the_owners_own() {
        let mut t = Table::default();
        t.set(F, A, Some(Kind::Write), (0, 99), 7);
        t.set(F, A, Some(Kind::Read), (10, 19), 7);
        let mut h: Vec<_> = t.held(F).iter().map(|h| (h.start, h.end, h.kind)).collect();
        h.sort_by_key(|x| x.0);
        assert_eq!(
            h,
            vec![
                (0, 9, Kind::Write),
                (10, 19, Kind::Read),
                (20, 99, Kind::Write)
            ]
        );
        t.set(F, A, None, (0, u64::MAX), 7);
        assert!(t.held(F).is_empty());
    }

    #[test]
    fn waiters_are_granted_in_order_once_the_conflict_goes() {
        let mut t = Table::default();
        t.set(F, A, Some(Kind::Write), (0, u64::MAX), 7);
        let w1 = t.wait(F, want(B, Kind::Write, 0, 0));
        let w2 = t.wait(F, want((3, 1), Kind::Read, 0, 9));
        let w3 = t.wait(F, want((3, 2), Kind::Read, 5, 5));
        assert!(t.grantable().is_empty());
        t.set(F, A, None, (0, u64::MAX), 7);
        // B's write (byte 0) first; the read of 0..=9 then conflicts with
        // it, the read of byte 5 does not.
        let g: Vec<u32> = t.grantable().iter().map(|w| w.slot).collect();
        assert_eq!(g, vec![w1, w3]);
        t.set(F, B, None, (0, u64::MAX), 7);
        let g: Vec<u32> = t.grantable().iter().map(|w| w.slot).collect();
        assert_eq!(g, vec![w2]);
        assert!(!t.has_waiters());
    }

    #[test]
    fn cancel_and_forget_host_drop_waiters_and_locks() {
        let mut t = Table::default();
        t.set(F, A, Some(Kind::Write), (0, u64::MAX), 7);
        t.wait(F, want(B, Kind::Write, 0, 0));
        assert_eq!(t.cancel(F, B).len(), 1);
        assert!(!t.has_waiters());
        t.wait(F, want(B, Kind::Write, 0, 0));
        assert_eq!(t.forget_host(1).len(), 0);
        assert!(t.held(F).is_empty());
        assert_eq!(t.grantable().len(), 1);
        assert_eq!(t.forget_host(2).len(), 0);
        assert!(t.held(F).is_empty());
    }
}
