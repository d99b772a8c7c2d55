//! Hash maps keyed by small integers (pids, host ids, local ids).
//!
//! A seeded multiply-xor hash: much cheaper than SipHash on the per-message
//! path, and deterministic for a given engine seed, so iteration order (and
//! with it the engine's behaviour) is reproducible in the simulator, while a
//! runtime's random seed keeps keys unpredictable to remote senders.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// Hasher state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let x = self.0;
        x ^ (x >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }

    fn write_u16(&mut self, i: u16) {
        self.write_u64(i as u64);
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0 ^ i)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(23);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Builds [`IdHasher`]s from a per-engine seed.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdBuild(pub(crate) u64);

impl BuildHasher for IdBuild {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.0)
    }
}

/// A map with integer-like keys.
pub(crate) type IdMap<K, V> = HashMap<K, V, IdBuild>;

/// An empty map hashing with `seed`.
pub(crate) fn new_map<K, V>(seed: u64) -> IdMap<K, V> {
    HashMap::with_hasher(IdBuild(seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_sequential_keys_and_depends_on_seed() {
        let h = |seed: u64, k: u32| {
            let mut x = IdBuild(seed).build_hasher();
            x.write_u32(k);
            x.finish()
        };
        assert_ne!(h(1, 1), h(1, 2));
        assert_ne!(h(1, 1), h(2, 1));
        let mut m: IdMap<u32, u32> = new_map(7);
        for k in 0..1000 {
            m.insert(k, k * 2);
        }
        assert_eq!(m.get(&500), Some(&1000));
    }
}
