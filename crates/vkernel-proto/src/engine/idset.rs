//! A set of local process ids (`u16`) that never allocates after it is
//! made: a two-level bitmap, 8 KiB and 128 bytes. Inserting and removing
//! are a few instructions each, and iterating visits only the words that
//! hold members, in ascending order (the engine stays deterministic). It
//! replaces a `BTreeSet`, whose cost per Send grew with the number of
//! senders.

/// Local ids, `0..=u16::MAX`.
#[derive(Clone, Debug)]
pub(crate) struct IdSet {
    /// Bit `i % 64` of word `i / 64` is set if `i` is a member.
    words: Box<[u64; WORDS]>,
    /// Bit `w % 64` of `summary[w / 64]` is set if `words[w]` is nonzero.
    summary: [u64; WORDS / 64],
}

const WORDS: usize = (u16::MAX as usize + 1) / 64;

impl Default for IdSet {
    fn default() -> Self {
        IdSet {
            words: Box::new([0; WORDS]),
            summary: [0; WORDS / 64],
        }
    }
}

impl IdSet {
    /// Adds `id`; true if it was not a member.
    pub(crate) fn insert(&mut self, id: u16) -> bool {
        let (w, bit) = (id as usize / 64, 1u64 << (id % 64));
        if self.words[w] & bit != 0 {
            return false;
        }
        self.words[w] |= bit;
        self.summary[w / 64] |= 1 << (w % 64);
        true
    }

    /// Takes `id` out; true if it was a member.
    pub(crate) fn remove(&mut self, id: &u16) -> bool {
        let (w, bit) = (*id as usize / 64, 1u64 << (id % 64));
        if self.words[w] & bit == 0 {
            return false;
        }
        self.words[w] &= !bit;
        if self.words[w] == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
        true
    }

    /// Whether `id` is a member.
    #[cfg(test)]
    pub(crate) fn contains(&self, id: u16) -> bool {
        self.words[id as usize / 64] & (1 << (id % 64)) != 0
    }

    /// How many members.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.iter().count()
    }

    /// The members, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        ones(&self.summary).flat_map(move |w| {
            ones(std::slice::from_ref(&self.words[w])).map(move |b| (w * 64 + b) as u16)
        })
    }

    /// Keeps only the members for which `keep` is true (in place, in
    /// ascending order).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&u16) -> bool) {
        for s in 0..self.summary.len() {
            let mut used = self.summary[s];
            while used != 0 {
                let w = s * 64 + used.trailing_zeros() as usize;
                used &= used - 1;
                let mut left = self.words[w];
                let mut bits = left;
                while bits != 0 {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    if !keep(&((w * 64) as u16 + b as u16)) {
                        left &= !(1 << b);
                    }
                }
                self.words[w] = left;
                if left == 0 {
                    self.summary[s] &= !(1 << (w % 64));
                }
            }
        }
    }
}

/// The indices of the set bits of `words` (bit `i % 64` of word `i / 64`),
/// ascending.
fn ones(words: &[u64]) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(|(i, &w)| {
        let mut w = w;
        std::iter::from_fn(move || {
            if w == 0 {
                return None;
            }
            let b = w.trailing_zeros() as usize;
            w &= w - 1;
            Some(i * 64 + b)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::IdSet;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_first_and_last_ids_are_members_like_any_other() {
        let mut s = IdSet::default();
        assert!(s.insert(0));
        assert!(s.insert(u16::MAX));
        assert!(!s.insert(0));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, u16::MAX]);
        assert!(s.remove(&u16::MAX));
        assert!(!s.remove(&u16::MAX));
        assert!(!s.contains(u16::MAX));
        assert_eq!(s.len(), 1);
    }

    proptest! {
        /// Any mix of inserts, removes and retains leaves the same members,
        /// in the same order, as a `BTreeSet` given the same operations.
        #[test]
        fn behaves_as_a_btreeset(ops in proptest::collection::vec((0u8..3, any::<u16>()), 0..400)) {
            let mut s = IdSet::default();
            let mut b = BTreeSet::new();
            for (op, id) in ops {
                // Ids close together too, so words fill and empty.
                let id = if id % 2 == 0 { id % 200 } else { id };
                match op {
                    0 => prop_assert_eq!(s.insert(id), b.insert(id)),
                    1 => prop_assert_eq!(s.remove(&id), b.remove(&id)),
                    _ => {
                        s.retain(|x| x % 3 != id % 3);
                        b.retain(|x| x % 3 != id % 3);
                    }
                }
                prop_assert_eq!(s.len(), b.len());
            }
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), b.iter().copied().collect::<Vec<_>>());
        }
    }
}
