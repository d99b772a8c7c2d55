//! Whole small files the mount holds while the server reports changes: a
//! file read whole by an open (OPENREAD) or written here from empty, so a
//! later open for reading is answered without an exchange and its reads
//! from memory.
//!
//! A kept file is tied to the attributes it was kept with (size, mtime):
//! it is used only while the mount's fresh attributes for the file still
//! show the same data, and is dropped when the server reports the file's
//! data changed. The total is bounded; the oldest go first.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::vio::Attr;

struct Kept {
    data: Arc<Vec<u8>>,
    attr: Attr,
    /// Which push to `order` stands for this entry.
    seq: u64,
}

/// The kept files, by FUSE inode number.
pub(super) struct Contents {
    map: HashMap<u64, Kept>,
    /// Inodes in the order kept, with the `seq` they were kept under
    /// (an entry whose `seq` no longer matches was replaced since).
    order: VecDeque<(u64, u64)>,
    bytes: usize,
    budget: usize,
    seq: u64,
}

/// Bytes of whole files kept at most, by default.
pub(super) const BUDGET: usize = 64 << 20;

impl Contents {
    /// Keeps at most `budget` bytes.
    pub fn new(budget: usize) -> Contents {
        Contents {
            map: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            budget,
            seq: 0,
        }
    }

    /// Keeps `data` as the whole of `ino`, whose attributes are `attr`.
    pub fn set(&mut self, ino: u64, data: Arc<Vec<u8>>, attr: Attr) {
        self.remove(ino);
        if data.len() > self.budget || data.len() as u64 != attr.size {
            return;
        }
        self.seq += 1;
        self.bytes += data.len();
        self.order.push_back((ino, self.seq));
        self.map.insert(
            ino,
            Kept {
                data,
                attr,
                seq: self.seq,
            },
        );
        while self.bytes > self.budget {
            let Some((old, seq)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old).is_some_and(|k| k.seq == seq) {
                self.remove(old);
            }
        }
        // Replaced entries leave stale places behind; drop them now and then.
        if self.order.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.order
                .retain(|(i, s)| map.get(i).is_some_and(|k| k.seq == *s));
        }
    }

    /// Forgets `ino`'s data, returning it and the attributes it was kept with.
    pub fn take(&mut self, ino: u64) -> Option<(Arc<Vec<u8>>, Attr)> {
        let k = self.map.remove(&ino)?;
        self.bytes -= k.data.len();
        Some((k.data, k.attr))
    }

    /// Forgets `ino`'s data.
    pub fn remove(&mut self, ino: u64) {
        self.take(ino);
    }

    /// `ino`'s data, if kept and `current` (the file's fresh attributes)
    /// shows the same data it was kept with.
    pub fn get(&self, ino: u64, current: &Attr) -> Option<Arc<Vec<u8>>> {
        let k = self.map.get(&ino)?;
        (super::convert::same_data(&k.attr, current) && current.size == k.data.len() as u64)
            .then(|| k.data.clone())
    }

    /// Is `data` still what is kept for `ino` (not dropped or replaced)?
    pub fn holds(&self, ino: u64, data: &Arc<Vec<u8>>) -> bool {
        self.map
            .get(&ino)
            .is_some_and(|k| Arc::ptr_eq(&k.data, data))
    }

    /// Bytes kept now.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(size: u64, mtime: i64) -> Attr {
        Attr {
            dev: 1,
            ino: 9,
            mode: libc::S_IFREG | 0o644,
            size,
            mtime,
            ..Attr::default()
        }
    }

    #[test]
    fn kept_data_is_used_only_while_the_attributes_show_it() {
        let mut c = Contents::new(1 << 20);
        let d = Arc::new(b"hello".to_vec());
        c.set(2, d.clone(), attr(5, 10));
        assert_eq!(c.get(2, &attr(5, 10)).as_deref(), Some(&b"hello".to_vec()));
        assert!(c.holds(2, &d));
        // Changed since (mtime, or size): not used.
        assert!(c.get(2, &attr(5, 11)).is_none());
        assert!(c.get(2, &attr(6, 10)).is_none());
        // Data that does not match its attributes' size is not kept.
        c.set(3, Arc::new(b"abc".to_vec()), attr(4, 10));
        assert!(c.get(3, &attr(4, 10)).is_none());
        assert_eq!(c.take(2).map(|(d, _)| d.len()), Some(5));
        assert!(!c.holds(2, &d));
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn the_oldest_go_when_the_budget_is_spent() {
        let mut c = Contents::new(100);
        for ino in 0..10u64 {
            c.set(ino, Arc::new(vec![0; 30]), attr(30, 1));
        }
        assert!(c.bytes() <= 100);
        assert!(c.get(9, &attr(30, 1)).is_some());
        assert!(c.get(0, &attr(30, 1)).is_none());
        // Replacing one file many times keeps the bookkeeping bounded.
        for i in 0..10_000 {
            c.set(5, Arc::new(vec![0; 30]), attr(30, i));
        }
        assert!(c.order.len() <= 2 * c.map.len() + 1024 + 1);
        assert!(c.get(5, &attr(30, 9_999)).is_some());
        // Bigger than the budget: not kept at all.
        c.set(11, Arc::new(vec![0; 101]), attr(101, 1));
        assert!(c.get(11, &attr(101, 1)).is_none());
        assert!(c.bytes() <= 100);
    }
}
