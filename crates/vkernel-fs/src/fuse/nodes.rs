//! The node table: inode numbers ↔ the server's files (device, inode)
//! and the names they are known by, and what is cached of each.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::contents::{self, Contents};
use super::listing::Listings;
use super::ROOT;
use crate::vio::{self, Attr, Errno};

/// First inode number made up for a file whose server inode number is
/// taken (by a file of another file system beneath the root) or unusable.
pub(super) const SYNTHETIC: u64 = 1 << 63;

/// A file the kernel holds.
pub(super) struct Node {
    /// The names it is known by, as (parent, name): several for a file
    /// with hard links, one for a directory, none once all are gone (it
    /// lives on for open handles).
    pub(super) names: Vec<(u64, Vec<u8>)>,
    /// Its identity on the server: (device, inode).
    pub(super) id: (u32, u64),
    pub(super) lookups: u64,
    /// Its attributes as last answered, and when (served to GETATTR
    /// while younger than the mount's TTL; dropped by any change made
    /// here and by the server's invalidations).
    pub(super) attr: Option<(Attr, Instant)>,
    /// Reads were answered for it since its data last changed: the
    /// kernel may hold its pages, so an open need not fetch its start.
    pub(super) pages: bool,
    /// Extended attributes it does not have (security.capability, asked
    /// before each write; the ACL and security names `ls -l` asks),
    /// until one is set here or the server reports a change to it.
    pub(super) no_xattrs: Vec<Vec<u8>>,
}

/// Most absent extended-attribute names kept per node.
const MAX_NO_XATTRS: usize = 4;

impl Node {
    /// Is `name` known absent from this node's extended attributes?
    pub(super) fn lacks_xattr(&self, name: &[u8]) -> bool {
        self.no_xattrs.iter().any(|n| n == name)
    }

    /// `name` was found absent (or the node was just made).
    pub(super) fn lacks(&mut self, name: &[u8]) {
        if !self.lacks_xattr(name) && self.no_xattrs.len() < MAX_NO_XATTRS {
            self.no_xattrs.push(name.to_vec());
        }
    }
}

/// Inode numbers ↔ files and their names. A file's inode number is its
/// server inode number (unless taken), so every name of a file — hard
/// links included — is one inode here, and `st_ino` and directory
/// entries agree with the server.
pub(super) struct Nodes {
    pub(super) map: HashMap<u64, Node>,
    pub(super) by_name: HashMap<(u64, Vec<u8>), u64>,
    pub(super) by_id: HashMap<(u32, u64), u64>,
    pub(super) next_synthetic: u64,
    /// Names found absent, and when (only while the server reports
    /// changes): the kernel looks a name up twice before an exclusive
    /// create, and the second is answered here.
    pub(super) absent: HashMap<(u64, Vec<u8>), Instant>,
    /// Complete directory listings (only while the server reports changes).
    pub(super) listings: Listings,
    /// Whole small files (only used while the server reports changes).
    pub(super) contents: Contents,
    /// Changes the server reported so far: a listing or file fetched
    /// while one arrived may miss it, and is not kept.
    pub(super) reported: u64,
}

/// Most absent names remembered.
pub(super) const MAX_ABSENT: usize = 1 << 16;

/// What is left of a cache lifetime `ttl` for what was known at `at`:
/// how long the kernel may keep an answer the mount gives from its cache.
pub(super) fn left(ttl: Duration, at: Instant) -> Duration {
    ttl.saturating_sub(at.elapsed())
}

impl Nodes {
    pub(super) fn new() -> Nodes {
        let mut map = HashMap::new();
        map.insert(
            ROOT,
            Node {
                names: Vec::new(),
                id: (0, 0),
                lookups: 1,
                attr: None,
                pages: false,
                no_xattrs: Vec::new(),
            },
        );
        Nodes {
            map,
            by_name: HashMap::new(),
            by_id: HashMap::new(),
            next_synthetic: SYNTHETIC,
            absent: HashMap::new(),
            listings: Listings::default(),
            contents: Contents::new(contents::BUDGET),
            reported: 0,
        }
    }

    /// Learns the root's server identity (its attributes came back).
    pub(super) fn set_root(&mut self, a: &Attr) {
        let id = (a.dev, a.ino);
        if let Some(r) = self.map.get_mut(&ROOT) {
            if r.id != id {
                let old = std::mem::replace(&mut r.id, id);
                self.by_id.remove(&old);
                self.by_id.insert(id, ROOT);
            }
        }
    }

    /// The server path of a node by any of its names (`ENOENT` once all
    /// its names were removed, `ESTALE` for a node the kernel should not
    /// hold).
    pub(super) fn path(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut at = ino;
        let mut hops = 0;
        while at != ROOT {
            let n = self.map.get(&at).ok_or(Errno(libc::ESTALE as u32))?;
            let (parent, name) = n.names.first().ok_or(Errno::ENOENT)?;
            parts.push(name);
            at = *parent;
            hops += 1;
            // Each name and its '/' take two bytes at least.
            if hops > vio::MAX_REQUEST_PATH / 2 {
                return Err(Errno::ELOOP);
            }
        }
        parts.reverse();
        let p = parts.join(&b'/');
        // Deeper than PATH_MAX is fine: programs reach it with relative
        // paths, and the server walks it in steps.
        if p.len() > vio::MAX_REQUEST_PATH {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(p)
    }

    pub(super) fn child(&self, parent: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if name.len() > vio::MAX_NAME {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut p = self.path(parent)?;
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        Ok(p)
    }

    /// The inode number of the server's file `id`. A node of that id
    /// whose names are all gone stands for a file the server has since
    /// deleted and whose number it reused (a file open here keeps its
    /// number, and gets no new names): the new file gets another number,
    /// as the kernel may still hold the old one.
    pub(super) fn ino_of(&mut self, id: (u32, u64)) -> u64 {
        if let Some(&ino) = self.by_id.get(&id) {
            if self.map.get(&ino).is_none_or(|n| !n.names.is_empty()) {
                return ino;
            }
            let n = self.next_synthetic;
            self.next_synthetic += 1;
            self.by_id.insert(id, n);
            return n;
        }
        let taken = |n: u64| n <= ROOT || n >= SYNTHETIC || self.map.contains_key(&n);
        let ino = if taken(id.1) {
            let n = self.next_synthetic;
            self.next_synthetic += 1;
            n
        } else {
            id.1
        };
        self.by_id.insert(id, ino);
        ino
    }

    /// The node for the file with attributes `a` at (parent, name), made
    /// if new; one more lookup.
    pub(super) fn remember(&mut self, parent: u64, name: &[u8], a: &Attr) -> u64 {
        let id = (a.dev, a.ino);
        let key = (parent, name.to_vec());
        self.absent.remove(&key);
        if let Some(&old) = self.by_name.get(&key) {
            match self.map.get_mut(&old) {
                Some(n) if n.id == id => {
                    n.lookups += 1;
                    return old;
                }
                // The name now means another file (replaced on the server).
                _ => self.detach(parent, name),
            }
        }
        let ino = self.ino_of(id);
        let node = self.map.entry(ino).or_insert(Node {
            names: Vec::new(),
            id,
            lookups: 0,
            attr: None,
            pages: false,
            no_xattrs: Vec::new(),
        });
        // A directory has one name: found by another, it was moved (a
        // change this table missed), and its old name would build a
        // wrong path.
        let stale = if a.mode & libc::S_IFMT == libc::S_IFDIR {
            std::mem::take(&mut node.names)
        } else {
            Vec::new()
        };
        if !node.names.contains(&key) {
            node.names.push(key.clone());
        }
        node.lookups += 1;
        for old in stale.into_iter().filter(|k| *k != key) {
            if self.by_name.get(&old) == Some(&ino) {
                self.by_name.remove(&old);
            }
        }
        self.by_name.insert(key, ino);
        ino
    }

    pub(super) fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let gone = match self.map.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0
            }
            None => false,
        };
        if gone {
            self.listings.forget_dir(ino);
            self.contents.remove(ino);
            if let Some(node) = self.map.remove(&ino) {
                for key in node.names {
                    if self.by_name.get(&key) == Some(&ino) {
                        self.by_name.remove(&key);
                    }
                }
                if self.by_id.get(&node.id) == Some(&ino) {
                    self.by_id.remove(&node.id);
                }
            }
        }
    }

    /// The name (parent, name) is gone; its file may live on by other
    /// names, or with none for open handles.
    pub(super) fn detach(&mut self, parent: u64, name: &[u8]) {
        let key = (parent, name.to_vec());
        if let Some(ino) = self.by_name.remove(&key) {
            if let Some(n) = self.map.get_mut(&ino) {
                n.names.retain(|k| *k != key);
            }
        }
    }

    pub(super) fn rename(&mut self, parent: u64, name: &[u8], np: u64, nn: &[u8], exchange: bool) {
        let (from, to) = ((parent, name.to_vec()), (np, nn.to_vec()));
        let a = self.by_name.remove(&from);
        let b = self.by_name.remove(&to);
        let mut rename_name = |ino: u64, old: &(u64, Vec<u8>), new: Option<&(u64, Vec<u8>)>| {
            if let Some(n) = self.map.get_mut(&ino) {
                n.names.retain(|k| k != old);
                if let Some(new) = new {
                    if !n.names.contains(new) {
                        n.names.push(new.clone());
                    }
                }
            }
        };
        if let Some(ino) = b {
            rename_name(ino, &to, exchange.then_some(&from));
        }
        if let Some(ino) = a {
            rename_name(ino, &from, Some(&to));
        }
        if let (Some(ino), true) = (b, exchange) {
            self.by_name.insert(from.clone(), ino);
        }
        if let Some(ino) = a {
            self.by_name.insert(to, ino);
        }
    }

    /// The node's attributes if answered less than `ttl` ago.
    pub(super) fn cached_attr(&self, ino: u64, ttl: Duration) -> Option<Attr> {
        self.cached_attr_at(ino, ttl).map(|(a, _)| a)
    }

    /// [`Self::cached_attr`], and when they were answered (an answer to
    /// the kernel from them lives only what is left of `ttl`).
    pub(super) fn cached_attr_at(&self, ino: u64, ttl: Duration) -> Option<(Attr, Instant)> {
        let (a, at) = self.map.get(&ino)?.attr.as_ref()?;
        (at.elapsed() < ttl).then_some((*a, *at))
    }

    /// Remembers the node's attributes, as answered just now.
    pub(super) fn set_attr(&mut self, ino: u64, a: &Attr) {
        self.set_attr_at(ino, a, Instant::now());
    }

    /// Remembers the node's attributes as answered at `at` (an older
    /// answer, passed on from a kept listing, neither replaces a newer
    /// one nor becomes younger).
    pub(super) fn set_attr_at(&mut self, ino: u64, a: &Attr, at: Instant) {
        if let Some(n) = self.map.get_mut(&ino) {
            if n.attr.as_ref().is_some_and(|&(_, t)| t > at) {
                return;
            }
            n.attr = Some((*a, at));
            // An empty file is known whole.
            if a.size == 0
                && a.mode & libc::S_IFMT == libc::S_IFREG
                && self.contents.get(ino, a).is_none()
            {
                self.contents.set(ino, Arc::new(Vec::new()), *a);
            }
        }
    }

    /// A name in directory `ino` was removed here before the server was
    /// told: its kept attributes get the change's times (and one link
    /// fewer for a subdirectory), living no longer than they would have.
    pub(super) fn touched(&mut self, ino: u64, lost_subdir: bool) {
        let Some((a, _)) = self.map.get_mut(&ino).and_then(|n| n.attr.as_mut()) else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let (s, ns) = (now.as_secs() as i64, now.subsec_nanos());
        (a.mtime, a.mtime_ns, a.ctime, a.ctime_ns) = (s, ns, s, ns);
        if lost_subdir {
            a.nlink = a.nlink.saturating_sub(1);
        }
    }

    /// The whole of the file, if kept and its attributes (fresh within
    /// `ttl`) show it unchanged.
    pub(super) fn content(&self, ino: u64, ttl: Duration) -> Option<Arc<Vec<u8>>> {
        let a = self.cached_attr(ino, ttl)?;
        self.contents.get(ino, &a)
    }

    /// Forgets the node's attributes (something changed them).
    pub(super) fn clear_attr(&mut self, ino: u64) {
        if let Some(n) = self.map.get_mut(&ino) {
            n.attr = None;
        }
    }

    /// Forgets what is known of the node's extended attributes.
    pub(super) fn clear_xattrs(&mut self, ino: u64) {
        if let Some(n) = self.map.get_mut(&ino) {
            n.no_xattrs.clear();
        }
    }

    /// Remembers that `name` does not exist in `parent`.
    pub(super) fn set_absent(&mut self, parent: u64, name: &[u8]) {
        if self.absent.len() >= MAX_ABSENT {
            self.absent.clear();
        }
        self.absent.insert((parent, name.to_vec()), Instant::now());
    }

    /// When `name` was found absent in `parent`, if less than `ttl` ago.
    pub(super) fn absent_since(&self, parent: u64, name: &[u8], ttl: Duration) -> Option<Instant> {
        self.absent
            .get(&(parent, name.to_vec()))
            .copied()
            .filter(|t| t.elapsed() < ttl)
    }

    /// The node a (parent, name) stands for, if known.
    pub(super) fn named(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.by_name.get(&(parent, name.to_vec())).copied()
    }

    /// The known (parent, last name, node) of a server path, walking the
    /// names this table knows; `None` if a directory on the way is not
    /// known here (then the kernel holds nothing beneath it either).
    pub(super) fn resolve(&self, path: &[u8]) -> Option<(u64, Vec<u8>, Option<u64>)> {
        let mut parts = path.split(|&b| b == b'/').filter(|p| !p.is_empty());
        let mut last = parts.next()?;
        let mut at = ROOT;
        for next in parts {
            at = self.named(at, last)?;
            last = next;
        }
        Some((at, last.to_vec(), self.named(at, last)))
    }

    /// The parent of a directory (the root for the root, or if unknown).
    pub(super) fn parent_of(&self, ino: u64) -> u64 {
        self.map
            .get(&ino)
            .and_then(|n| n.names.first())
            .map_or(ROOT, |(p, _)| *p)
    }

    /// The inode number for a directory entry of `dir`: the server's,
    /// unless that file is known here by another (made-up) number.
    pub(super) fn entry_ino(&self, dir: u64, server_ino: u64) -> u64 {
        let dev = self.map.get(&dir).map_or(0, |n| n.id.0);
        self.by_id
            .get(&(dev, server_ino))
            .copied()
            .unwrap_or(server_ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::convert::{split_time, time};

    fn attr(dev: u32, ino: u64) -> Attr {
        Attr {
            dev,
            ino,
            ..Attr::default()
        }
    }

    #[test]
    fn node_paths_follow_renames_and_unlinks() {
        let mut n = Nodes::new();
        let d = n.remember(ROOT, b"d", &attr(1, 10));
        let f = n.remember(d, b"f", &attr(1, 11));
        assert_eq!((d, f), (10, 11), "the server's inode numbers");
        assert_eq!(n.path(f).unwrap(), b"d/f");
        let e = n.remember(ROOT, b"e", &attr(1, 12));
        n.rename(ROOT, b"d", e, b"x", false);
        assert_eq!(n.path(f).unwrap(), b"e/x/f");
        n.detach(d, b"f");
        assert_eq!(n.path(f).unwrap_err(), Errno::ENOENT);
        n.forget(f, 1);
        assert!(n.path(f).is_err());
        assert_eq!(n.child(ROOT, b"z").unwrap(), b"z");
        assert_eq!(split_time(time(-5, 250)), (-5, 250));
        assert_eq!(split_time(time(7, 9)), (7, 9));
    }

    #[test]
    fn hard_links_are_one_inode_reachable_by_any_remaining_name() {
        let mut n = Nodes::new();
        let a = n.remember(ROOT, b"a", &attr(1, 20));
        let b = n.remember(ROOT, b"b", &attr(1, 20));
        assert_eq!(a, b);
        n.detach(ROOT, b"a");
        assert_eq!(n.path(a).unwrap(), b"b");
        // The name now means another file: it gets that file's inode.
        let c = n.remember(ROOT, b"b", &attr(1, 21));
        assert_ne!(c, a);
        assert_eq!(n.path(a).unwrap_err(), Errno::ENOENT);
        // A reused server number while the old file's node lives on
        // without names: another inode.
        let old = n.remember(ROOT, b"gone", &attr(1, 40));
        n.detach(ROOT, b"gone");
        let reused = n.remember(ROOT, b"new", &attr(1, 40));
        assert_ne!(reused, old);
        assert_eq!(n.remember(ROOT, b"new", &attr(1, 40)), reused);
        // Exchange swaps the names.
        let d = n.remember(ROOT, b"d", &attr(1, 22));
        n.rename(ROOT, b"b", ROOT, b"d", true);
        assert_eq!(
            (n.path(c).unwrap(), n.path(d).unwrap()),
            (b"d".to_vec(), b"b".to_vec())
        );
    }

    #[test]
    fn a_directory_found_by_another_name_has_moved() {
        let mut n = Nodes::new();
        let dir = |ino| Attr {
            mode: libc::S_IFDIR | 0o755,
            ..attr(1, ino)
        };
        let d = n.remember(ROOT, b"old", &dir(50));
        let f = n.remember(d, b"f", &attr(1, 51));
        assert_eq!(n.remember(ROOT, b"new", &dir(50)), d);
        assert_eq!(n.path(f).unwrap(), b"new/f");
        assert_eq!(n.named(ROOT, b"old"), None);
        // A file's second name is a hard link: both stay.
        n.remember(ROOT, b"link", &attr(1, 51));
        assert_eq!(n.path(f).unwrap(), b"new/f");
        assert_eq!(n.named(ROOT, b"link"), Some(f));
    }

    #[test]
    fn a_taken_or_unusable_server_number_gets_a_made_up_one() {
        let mut n = Nodes::new();
        let x = n.remember(ROOT, b"x", &attr(1, 30));
        // Another file system beneath the root with the same number.
        let y = n.remember(ROOT, b"y", &attr(2, 30));
        let one = n.remember(ROOT, b"one", &attr(3, ROOT));
        assert_eq!(x, 30);
        assert!(y >= SYNTHETIC && one >= SYNTHETIC && y != one);
        assert_eq!(n.entry_ino(ROOT, 30), 30);
        // Forgotten, the number is free again.
        n.forget(x, 1);
        n.forget(y, 1);
        assert_eq!(n.remember(ROOT, b"y", &attr(2, 30)), 30);
    }
}
