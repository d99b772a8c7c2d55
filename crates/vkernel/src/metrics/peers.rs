//! Which peer hosts get Prometheus series of their own, and when a peer
//! is gone.
//!
//! A peer is gone once its traffic has not moved for twice the alien
//! timeout (16 s by default), the silence after which the engine forgets
//! its senders too; its counters are then dropped everywhere, so the
//! engine's table (`MAX_PEERS` entries) is free for the peers that come
//! next. The first [`MAX_PEER_SERIES`] live peers keep series of their own
//! for as long as they live; the traffic of any other peer goes to
//! `peer="other"`, for its whole life and after it: that series never
//! goes down, and a peer's series never starts part-way through its life.

use std::collections::BTreeMap;

use vkernel_proto::stats::PeerTraffic;
use vkernel_proto::{Micros, Stats};

/// At most this many peer hosts have `peer="…"` series; the traffic of
/// the rest is summed under `peer="other"`.
pub const MAX_PEER_SERIES: usize = 64;

/// The per-peer series of one reading of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerSeries {
    /// Peers with series of their own, by host id.
    pub own: BTreeMap<u16, PeerTraffic>,
    /// Everything else (`peer="other"`): peers beyond the cap, peers the
    /// engine's table had no room for, and those of them since gone.
    pub other: PeerTraffic,
}

/// One peer, as last read.
#[derive(Debug)]
struct Seen {
    last: PeerTraffic,
    /// When its counters were last seen to move.
    moved_at: Micros,
    /// It has series of its own.
    own: bool,
}

/// What a host remembers of its peers between readings of its counters.
#[derive(Debug, Default)]
pub(crate) struct PeerBook {
    seen: BTreeMap<u16, Seen>,
    own: usize,
    /// What peers that were under `peer="other"` counted before they went.
    other_gone: PeerTraffic,
}

impl PeerBook {
    /// Reads the per-peer counters of `s` at `now`: peers silent for more
    /// than `horizon` µs are taken out of `s` and returned, for the caller
    /// to drop from wherever else they are counted.
    pub(crate) fn read(
        &mut self,
        s: &mut Stats,
        now: Micros,
        horizon: Micros,
    ) -> (PeerSeries, Vec<u16>) {
        let mut gone = Vec::new();
        for (&h, t) in &s.peers {
            match self.seen.get_mut(&h) {
                None => {
                    let own = self.own < MAX_PEER_SERIES;
                    self.own += usize::from(own);
                    let last = *t;
                    self.seen.insert(
                        h,
                        Seen {
                            last,
                            moved_at: now,
                            own,
                        },
                    );
                }
                Some(e) if e.last != *t => {
                    e.last = *t;
                    e.moved_at = now;
                }
                Some(e) if now.saturating_sub(e.moved_at) > horizon => gone.push(h),
                Some(_) => {}
            }
        }
        // Peers whose counters went some other way are gone as well.
        gone.extend(self.seen.keys().filter(|h| !s.peers.contains_key(h)));
        for h in &gone {
            s.forget_peer(*h);
            if let Some(e) = self.seen.remove(h) {
                if e.own {
                    self.own -= 1;
                } else {
                    self.other_gone.merge_from(&e.last);
                }
            }
        }
        let mut series = PeerSeries {
            own: BTreeMap::new(),
            other: s.other_peers,
        };
        series.other.merge_from(&self.other_gone);
        for (&h, e) in &self.seen {
            if e.own {
                series.own.insert(h, e.last);
            } else {
                series.other.merge_from(&e.last);
            }
        }
        (series, gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(n: u64) -> PeerTraffic {
        PeerTraffic {
            tx_datagrams: n,
            tx_messages: n,
            tx_bytes: 100 * n,
            ..PeerTraffic::default()
        }
    }

    #[test]
    fn a_silent_peer_goes_and_the_other_series_never_goes_down() {
        let mut b = PeerBook::default();
        let mut s = Stats::default();
        let n = MAX_PEER_SERIES as u16 + 3;
        for h in 1..=n {
            s.peers.insert(h, traffic(1));
        }
        let (p, gone) = b.read(&mut s.clone(), 0, 10);
        assert!(gone.is_empty());
        assert_eq!(p.own.len(), MAX_PEER_SERIES);
        assert_eq!(p.other.tx_messages, 3, "the last three by first sight");
        // Peer 1 (own) and the last (other) keep talking; the rest stop.
        s.peers.insert(1, traffic(5));
        s.peers.insert(n, traffic(5));
        let (_, gone) = b.read(&mut s.clone(), 5, 10);
        assert!(gone.is_empty(), "not yet");
        let mut now = s.clone();
        let (p, gone) = b.read(&mut now, 11, 10);
        assert_eq!(gone.len(), n as usize - 2);
        assert!(!gone.contains(&1) && !gone.contains(&n));
        assert_eq!(now.peers.len(), 2, "dropped from the counters read");
        assert_eq!(p.own.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(p.other.tx_messages, 5 + 2, "the gone stay in other");
        // A newcomer takes a free slot; the peer in other stays there.
        now.peers.insert(500, traffic(1));
        let (p, _) = b.read(&mut now, 12, 10);
        assert!(p.own.contains_key(&500) && !p.own.contains_key(&n));
        assert_eq!(p.other.tx_messages, 7);
    }
}
