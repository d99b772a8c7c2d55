//! A table indexed by a host's 16-bit local ids (its process table).
//!
//! Pages of [`PAGE`] slots, each made on its first entry and freed with
//! its last: the table grows and shrinks a page at a time and never
//! rehashes. (A hash map of processes doubled in place, which stopped the
//! host for 3 ms as it passed 57,000 processes.) Lookups are two
//! indexings, and iteration is in id order, so it is deterministic.

/// Slots per page.
const PAGE: usize = 256;
/// Pages: enough for every 16-bit id.
const PAGES: usize = (u16::MAX as usize + 1) / PAGE;

/// One page: its slots and how many are filled.
struct Page<V> {
    slots: [Option<V>; PAGE],
    used: usize,
}

/// Values indexed by `u16` ids (see the module's notes).
pub struct LocalTable<V> {
    pages: Vec<Option<Box<Page<V>>>>,
    len: usize,
}

impl<V> Default for LocalTable<V> {
    fn default() -> Self {
        LocalTable {
            pages: Vec::new(),
            len: 0,
        }
    }
}

impl<V> std::fmt::Debug for LocalTable<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTable")
            .field("len", &self.len)
            .field("pages", &self.pages.iter().flatten().count())
            .finish()
    }
}

/// The page and slot of `id`.
fn split(id: u16) -> (usize, usize) {
    (usize::from(id) / PAGE, usize::from(id) % PAGE)
}

impl<V> LocalTable<V> {
    /// An empty table (it allocates on its first entry).
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value at `id`.
    pub fn get(&self, id: u16) -> Option<&V> {
        let (p, s) = split(id);
        self.pages.get(p)?.as_ref()?.slots[s].as_ref()
    }

    /// The value at `id`, to change.
    pub fn get_mut(&mut self, id: u16) -> Option<&mut V> {
        let (p, s) = split(id);
        self.pages.get_mut(p)?.as_mut()?.slots[s].as_mut()
    }

    /// Whether there is a value at `id`.
    pub fn contains_key(&self, id: u16) -> bool {
        self.get(id).is_some()
    }

    /// Puts `v` at `id`; the value it replaces, if any.
    pub fn insert(&mut self, id: u16, v: V) -> Option<V> {
        let (p, s) = split(id);
        if self.pages.is_empty() {
            self.pages.resize_with(PAGES, || None);
        }
        let page = self.pages[p].get_or_insert_with(|| {
            Box::new(Page {
                slots: std::array::from_fn(|_| None),
                used: 0,
            })
        });
        let old = page.slots[s].replace(v);
        if old.is_none() {
            page.used += 1;
            self.len += 1;
        }
        old
    }

    /// Takes the value at `id` out; its page goes with its last value.
    pub fn remove(&mut self, id: u16) -> Option<V> {
        let (p, s) = split(id);
        let slot = self.pages.get_mut(p)?;
        let page = slot.as_mut()?;
        let v = page.slots[s].take()?;
        page.used -= 1;
        self.len -= 1;
        if page.used == 0 {
            *slot = None;
        }
        Some(v)
    }

    /// The entries, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &V)> {
        self.pages.iter().enumerate().flat_map(|(p, page)| {
            page.iter().flat_map(move |page| {
                page.slots.iter().enumerate().filter_map(move |(s, v)| {
                    // (p < PAGES and s < PAGE, so the id fits.)
                    let id = u16::try_from(p * PAGE + s).unwrap_or(u16::MAX);
                    v.as_ref().map(|v| (id, v))
                })
            })
        })
    }

    /// The values, in id order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn pages_come_and_go_with_their_entries() {
        let mut t = LocalTable::new();
        assert!(t.is_empty() && t.get(7).is_none());
        assert_eq!(t.insert(7, "a"), None);
        assert_eq!(t.insert(7, "b"), Some("a"));
        assert_eq!(t.insert(u16::MAX, "z"), None);
        assert_eq!(
            (t.len(), t.get(7), t.get(u16::MAX)),
            (2, Some(&"b"), Some(&"z"))
        );
        assert_eq!(format!("{t:?}"), "LocalTable { len: 2, pages: 2 }");
        *t.get_mut(7).unwrap() = "c";
        assert_eq!(t.iter().collect::<Vec<_>>(), [(7, &"c"), (u16::MAX, &"z")]);
        assert_eq!(t.remove(7), Some("c"));
        assert_eq!(t.remove(7), None);
        assert_eq!(format!("{t:?}"), "LocalTable { len: 1, pages: 1 }");
        assert!(!t.contains_key(7) && t.contains_key(u16::MAX));
    }

    /// Growing to every id moves no entry (a hash map moves them all
    /// each time it doubles, which is the pause this table avoids), and
    /// emptying it frees every page.
    #[test]
    fn growing_moves_nothing_and_emptying_frees_everything() {
        let mut t = LocalTable::new();
        t.insert(0, 0u64);
        let first: *const u64 = t.get(0).unwrap();
        for id in 1..=u16::MAX {
            t.insert(id, u64::from(id));
        }
        assert_eq!(t.len(), 1 << 16);
        assert!(std::ptr::eq(first, t.get(0).unwrap()));
        for id in 0..=u16::MAX {
            assert_eq!(t.remove(id), Some(u64::from(id)));
        }
        assert!(t.is_empty());
        assert_eq!(t.pages.iter().flatten().count(), 0);
    }

    proptest! {
        /// Any sequence of inserts and removes leaves the table as a
        /// BTreeMap would be, with no page left empty.
        #[test]
        fn behaves_as_an_ordered_map(ops in proptest::collection::vec((any::<bool>(), 0u16..2048, any::<u32>()), 0..400)) {
            let mut t = LocalTable::new();
            let mut m = BTreeMap::new();
            for (put, id, v) in ops {
                if put {
                    prop_assert_eq!(t.insert(id, v), m.insert(id, v));
                } else {
                    prop_assert_eq!(t.remove(id), m.remove(&id));
                }
                prop_assert_eq!(t.len(), m.len());
            }
            let all: Vec<(u16, u32)> = t.iter().map(|(k, v)| (k, *v)).collect();
            let want: Vec<(u16, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
            prop_assert_eq!(all, want);
            let pages = t.pages.iter().flatten().count();
            let want_pages = m.keys().map(|k| usize::from(*k) / PAGE).collect::<std::collections::BTreeSet<_>>().len();
            prop_assert_eq!(pages, want_pages);
        }
    }
}
