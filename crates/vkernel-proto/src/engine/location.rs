//! The location cache: where each logical host was last heard from.
//!
//! Learned from every datagram that passes the engine's checks and used
//! to address the next one; a bounded table that drops the host used
//! least recently. A miss makes the engine fan a request out to the
//! discovery addresses; the answer teaches the location.

use std::net::SocketAddr;

use super::idmap::{new_map, IdMap};
use crate::pid::HostId;

/// Host → address, least recently used evicted. See the module docs.
pub(super) struct Locations {
    map: IdMap<HostId, (SocketAddr, u64)>,
    /// Use counter: an entry's stamp is the count at its last use.
    clock: u64,
    cap: usize,
}

impl Locations {
    /// A cache of at most `cap` hosts (at least one).
    pub(super) fn new(cap: usize, seed: u64) -> Locations {
        Locations {
            map: new_map(seed),
            clock: 0,
            cap: cap.max(1),
        }
    }

    /// The address of `host`, marked as used.
    #[inline]
    pub(super) fn lookup(&mut self, host: HostId) -> Option<SocketAddr> {
        self.clock += 1;
        let e = self.map.get_mut(&host)?;
        e.1 = self.clock;
        Some(e.0)
    }

    /// The address of `host`, without marking it.
    #[inline]
    pub(super) fn get(&self, host: HostId) -> Option<SocketAddr> {
        self.map.get(&host).map(|e| e.0)
    }

    /// Every known address (in the table's order).
    pub(super) fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.map.values().map(|e| e.0)
    }

    /// Records that `host` is at `addr`.
    #[inline]
    pub(super) fn learn(&mut self, host: HostId, addr: SocketAddr) {
        self.clock += 1;
        let clock = self.clock;
        if let Some(e) = self.map.get_mut(&host) {
            *e = (addr, clock);
            return;
        }
        if self.map.len() >= self.cap {
            if let Some((&victim, _)) = self.map.iter().min_by_key(|(_, v)| v.1) {
                self.map.remove(&victim);
            }
        }
        self.map.insert(host, (addr, clock));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_least_recently_used_host_goes() {
        let mut c = Locations::new(2, 1);
        c.learn(HostId(1), a(1));
        c.learn(HostId(2), a(2));
        assert_eq!(c.lookup(HostId(1)), Some(a(1)));
        c.learn(HostId(3), a(3));
        assert_eq!(c.get(HostId(2)), None, "least recently used");
        assert_eq!(c.get(HostId(1)), Some(a(1)));
        c.learn(HostId(1), a(9));
        assert_eq!(c.get(HostId(1)), Some(a(9)), "moved");
        assert_eq!(c.lookup(HostId(4)), None);
    }
}
