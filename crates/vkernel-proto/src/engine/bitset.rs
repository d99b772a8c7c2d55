//! A fixed-size bit set for bulk-transfer chunk tracking.

/// Bits `0..n`, all clear initially.
#[derive(Clone, Debug, Default)]
pub(crate) struct BitSet {
    words: Vec<u64>,
    n: usize,
    ones: usize,
}

impl BitSet {
    pub(crate) fn new(n: usize) -> BitSet {
        BitSet {
            words: vec![0; n.div_ceil(64)],
            n,
            ones: 0,
        }
    }

    pub(crate) fn get(&self, i: usize) -> bool {
        i < self.n && self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Sets bit `i`; returns true if it was clear.
    pub(crate) fn set(&mut self, i: usize) -> bool {
        if i >= self.n || self.get(i) {
            return false;
        }
        self.words[i / 64] |= 1 << (i % 64);
        self.ones += 1;
        true
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Makes the set `n` bits long, the new bits clear (never shrinks).
    pub(crate) fn grow(&mut self, n: usize) {
        if n > self.n {
            self.words.resize(n.div_ceil(64), 0);
            self.n = n;
        }
    }

    pub(crate) fn ones(&self) -> usize {
        self.ones
    }

    pub(crate) fn full(&self) -> bool {
        self.ones == self.n
    }

    /// First clear bit at or after `from` (or `len()`).
    pub(crate) fn first_clear_from(&self, from: usize) -> usize {
        let mut i = from;
        while i < self.n {
            let w = self.words[i / 64] >> (i % 64);
            if w == u64::MAX >> (i % 64) {
                i = (i / 64 + 1) * 64;
                continue;
            }
            if !self.get(i) {
                return i;
            }
            i += 1;
        }
        self.n
    }

    /// Bits `[from, to)` packed LSB-first into bytes.
    pub(crate) fn pack(&self, from: usize, to: usize) -> Vec<u8> {
        let to = to.min(self.n);
        let mut out = vec![0u8; to.saturating_sub(from).div_ceil(8)];
        for i in from..to {
            if self.get(i) {
                out[(i - from) / 8] |= 1 << ((i - from) % 8);
            }
        }
        out
    }
}

/// Reads bit `i` of a packed LSB-first byte map; out-of-range bits are clear.
pub(crate) fn packed_get(map: &[u8], i: usize) -> bool {
    map.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_pack() {
        let mut b = BitSet::new(130);
        assert!(b.set(0));
        assert!(!b.set(0));
        assert!(b.set(64));
        assert!(b.set(129));
        assert!(!b.set(130));
        assert_eq!(b.ones(), 3);
        assert_eq!(b.first_clear_from(0), 1);
        let p = b.pack(64, 130);
        assert!(packed_get(&p, 0));
        assert!(!packed_get(&p, 1));
        assert!(packed_get(&p, 65));
        for i in 0..130 {
            b.set(i);
        }
        assert!(b.full());
        assert_eq!(b.first_clear_from(0), 130);
        b.grow(200);
        assert!(!b.full());
        assert_eq!((b.len(), b.ones()), (200, 130));
        assert_eq!(b.first_clear_from(0), 130);
        assert!(b.set(199) && b.get(129) && !b.get(150));
        b.grow(10);
        assert_eq!(b.len(), 200, "never shrinks");
    }
}
