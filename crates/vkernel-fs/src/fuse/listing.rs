//! Directory listings the mount keeps while the server reports changes:
//! a directory listed once (or made here, empty) answers later listings,
//! and lookups of names it does not hold, without an exchange.
//!
//! A listing is complete when stored. It follows this mount's own changes
//! (a name made, removed, renamed here), and is dropped when the server
//! reports a change to a name in the directory, or when it is older than
//! the cache lifetime (changes made on the server's disk by other
//! programs are not reported).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One entry: the name, the file's server inode number, its `DT_*` type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: u8,
}

struct Listing {
    names: HashMap<Vec<u8>, (u64, u8)>,
    at: Instant,
}

/// The listings, by the directory's FUSE inode number.
#[derive(Default)]
pub(super) struct Listings {
    map: HashMap<u64, Listing>,
    /// Counts this mount's changes to names (in any directory), so that a
    /// listing fetched from the server while one happened is not kept:
    /// it may predate the change.
    changes: u64,
}

/// Most directories whose listings are kept.
const MAX_LISTINGS: usize = 1 << 14;

impl Listings {
    /// The count of this mount's name changes so far: give it to
    /// [`Listings::set_since`] with a listing fetched after reading it.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Stores `dir`'s listing fetched from the server, unless this mount
    /// changed a name since `changes` (the listing may miss it).
    pub fn set_since(&mut self, dir: u64, entries: impl IntoIterator<Item = Entry>, changes: u64) {
        if self.changes == changes {
            self.set(dir, entries);
        }
    }

    /// Stores `dir`'s complete listing, as of now.
    pub fn set(&mut self, dir: u64, entries: impl IntoIterator<Item = Entry>) {
        if self.map.len() >= MAX_LISTINGS {
            self.map.clear();
        }
        let names = entries
            .into_iter()
            .map(|e| (e.name, (e.ino, e.kind)))
            .collect();
        self.map.insert(
            dir,
            Listing {
                names,
                at: Instant::now(),
            },
        );
    }

    /// `dir`'s entries, sorted by name, if its listing is younger than
    /// `ttl`.
    pub fn entries(&self, dir: u64, ttl: Duration) -> Option<Vec<Entry>> {
        let l = self.map.get(&dir).filter(|l| l.at.elapsed() < ttl)?;
        let mut v: Vec<Entry> = l
            .names
            .iter()
            .map(|(n, &(ino, kind))| Entry {
                name: n.clone(),
                ino,
                kind,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Some(v)
    }

    /// When `dir`'s listing was taken, if it is kept (an answer to the
    /// kernel from it lives only what is left of the cache lifetime).
    pub fn taken(&self, dir: u64) -> Option<Instant> {
        self.map.get(&dir).map(|l| l.at)
    }

    /// Is `name` known not to exist in `dir` (a listing younger than `ttl`
    /// without it)?
    pub fn absent(&self, dir: u64, name: &[u8], ttl: Duration) -> bool {
        self.map
            .get(&dir)
            .is_some_and(|l| l.at.elapsed() < ttl && !l.names.contains_key(name))
    }

    /// The `DT_*` type of `name` in `dir`, if a listing younger than
    /// `ttl` holds it.
    pub fn kind(&self, dir: u64, name: &[u8], ttl: Duration) -> Option<u8> {
        let l = self.map.get(&dir).filter(|l| l.at.elapsed() < ttl)?;
        l.names.get(name).map(|&(_, kind)| kind)
    }

    /// Is `dir` known empty (a listing younger than `ttl` without names)?
    pub fn is_empty(&self, dir: u64, ttl: Duration) -> bool {
        self.map
            .get(&dir)
            .is_some_and(|l| l.at.elapsed() < ttl && l.names.is_empty())
    }

    /// A name was made in `dir` here.
    pub fn add(&mut self, dir: u64, name: &[u8], ino: u64, kind: u8) {
        self.changes += 1;
        if let Some(l) = self.map.get_mut(&dir) {
            l.names.insert(name.to_vec(), (ino, kind));
        }
    }

    /// A name was removed from `dir` here; returns what it was.
    pub fn remove(&mut self, dir: u64, name: &[u8]) -> Option<(u64, u8)> {
        self.changes += 1;
        self.map.get_mut(&dir)?.names.remove(name)
    }

    /// Forgets `dir`'s listing: something in it changed.
    pub fn drop_dir(&mut self, dir: u64) {
        self.changes += 1;
        self.map.remove(&dir);
    }

    /// Forgets `dir`'s listing, nothing having changed (the kernel
    /// forgot the directory).
    pub fn forget_dir(&mut self, dir: u64) {
        self.map.remove(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(name: &str, ino: u64) -> Entry {
        Entry {
            name: name.as_bytes().to_vec(),
            ino,
            kind: 8,
        }
    }

    #[test]
    fn a_listing_follows_changes_and_ages_out() {
        let mut l = Listings::default();
        let ttl = Duration::from_secs(10);
        assert!(!l.absent(5, b"x", ttl), "no listing: nothing is known");
        l.set(5, vec![e("b", 2), e("a", 1)]);
        assert_eq!(l.entries(5, ttl).unwrap(), vec![e("a", 1), e("b", 2)]);
        assert!(l.absent(5, b"x", ttl));
        assert!(!l.absent(5, b"a", ttl));
        l.add(5, b"x", 3, 8);
        assert!(!l.absent(5, b"x", ttl));
        assert_eq!(l.remove(5, b"a"), Some((1, 8)));
        assert!(l.absent(5, b"a", ttl));
        // Adding to a directory without a listing does not make one.
        l.add(6, b"y", 4, 8);
        assert!(l.entries(6, ttl).is_none());
        assert!(
            l.entries(5, Duration::ZERO).is_none(),
            "older than the lifetime"
        );
        assert!(!l.absent(5, b"q", Duration::ZERO));
        l.drop_dir(5);
        assert!(l.entries(5, ttl).is_none());
    }

    #[test]
    fn a_listing_fetched_across_a_change_here_is_not_kept() {
        let mut l = Listings::default();
        let ttl = Duration::from_secs(10);
        let before = l.changes();
        // A name made here while the server's listing was on its way.
        l.add(5, b"new", 9, 8);
        l.set_since(5, vec![e("old", 1)], before);
        assert!(l.entries(5, ttl).is_none(), "it would miss \"new\"");
        let now = l.changes();
        l.set_since(5, vec![e("old", 1), e("new", 9)], now);
        assert_eq!(l.entries(5, ttl).unwrap().len(), 2);
    }
}
