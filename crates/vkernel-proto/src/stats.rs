//! Counters kept by the engine. Cheap plain integers; the runtime copies them
//! out under its lock.

use std::collections::BTreeMap;

use crate::wire::{DecodeError, PacketType};

/// At most this many peer hosts get their own traffic counters (those
/// this host has sent a request or reply to); the rest are summed in
/// [`Stats::other_peers`].
pub const MAX_PEERS: usize = 1024;

/// A log2 histogram: bucket 0 counts zeros, bucket i ≥ 1 values in
/// [2^(i−1), 2^i). Each bucket also sums its values, so the distribution
/// can be read by count and by volume (bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Values per bucket.
    pub counts: [u64; 32],
    /// Sum of the values per bucket.
    pub sums: [u64; 32],
}

impl Histogram {
    /// Bucket index of `v`.
    pub fn bucket(v: u64) -> usize {
        (64 - v.leading_zeros() as usize).min(31)
    }

    /// Counts one value.
    pub fn record(&mut self, v: u64) {
        let b = Self::bucket(v);
        self.counts[b] += 1;
        self.sums[b] = self.sums[b].saturating_add(v);
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Sum of all values.
    pub fn sum(&self) -> u64 {
        self.sums.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Exclusive upper bound of bucket `i` (1 for bucket 0).
    pub fn upper(i: usize) -> u64 {
        1u64 << i.min(63)
    }

    /// An upper bound of the `q` quantile (0..=1): the top of the bucket
    /// holding it; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let want = ((n as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return if i == 0 { 0 } else { Self::upper(i) - 1 };
            }
        }
        Self::upper(31)
    }
}

/// Traffic exchanged with one peer logical host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerTraffic {
    /// Datagrams sent to it.
    pub tx_datagrams: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
    /// Datagrams received from it.
    pub rx_datagrams: u64,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Messages (RemoteSend, RemoteReply) sent to it.
    pub tx_messages: u64,
    /// Messages received from it.
    pub rx_messages: u64,
}

impl PeerTraffic {
    /// Adds every counter of `o` to these.
    pub fn merge_from(&mut self, o: &PeerTraffic) {
        self.tx_datagrams += o.tx_datagrams;
        self.tx_bytes += o.tx_bytes;
        self.rx_datagrams += o.rx_datagrams;
        self.rx_bytes += o.rx_bytes;
        self.tx_messages += o.tx_messages;
        self.rx_messages += o.rx_messages;
    }

    fn add(&mut self, tx: bool, bytes: usize, message: bool) {
        let (d, b, m) = if tx {
            (
                &mut self.tx_datagrams,
                &mut self.tx_bytes,
                &mut self.tx_messages,
            )
        } else {
            (
                &mut self.rx_datagrams,
                &mut self.rx_bytes,
                &mut self.rx_messages,
            )
        };
        *d += 1;
        *b += bytes as u64;
        *m += u64::from(message);
    }
}

/// Why a datagram that decoded was still dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Could not be decoded (see [`Stats::decode_errors`]).
    Malformed,
    /// Addressed to another logical host (normal after a fan-out).
    NotForUs,
    /// A late duplicate of an exchange already finished.
    Stale,
    /// No matching exchange, transfer or query.
    NoMatch,
    /// The alien pool (or the per-host share) was full.
    NoBuffers,
    /// Violated segment rights or bounds.
    SegmentViolation,
    /// Our own datagram came back (broadcast / fan-out to self).
    OwnEcho,
    /// Host id not allocated yet.
    NotReady,
    /// From a host the group policy does not trust.
    Untrusted,
    /// A reply to a group Send that came too late (sender moved on, or
    /// 1-reply mode already satisfied).
    LateReply,
    /// A reply whose segment data was sent ahead of it in chunks, and
    /// some never arrived: the request is retransmitted at once.
    ReplyDataMissing,
}

impl DropReason {
    /// All reasons, in counter order ([`Stats::drops`]).
    pub const ALL: [DropReason; 11] = [
        DropReason::Malformed,
        DropReason::NotForUs,
        DropReason::Stale,
        DropReason::NoMatch,
        DropReason::NoBuffers,
        DropReason::SegmentViolation,
        DropReason::OwnEcho,
        DropReason::NotReady,
        DropReason::Untrusted,
        DropReason::LateReply,
        DropReason::ReplyDataMissing,
    ];
}

/// Per-host protocol counters.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Datagrams received, by packet type (index = type − 1).
    pub rx: [u64; 13],
    /// Datagrams transmitted, by packet type.
    pub tx: [u64; 13],
    /// Bytes received and sent in datagrams.
    pub rx_bytes: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Decode failures: truncated, magic, version, type, length, oversized.
    pub decode_errors: [u64; 6],
    /// Drops after decoding, by [`DropReason`] (index order of the enum).
    pub drops: [u64; 11],
    /// RemoteSend retransmissions.
    pub retransmits: u64,
    /// RemoteSend retransmissions put off by a timeout because the server's
    /// host was answering older Sends (queued behind them, not lost).
    pub retransmits_deferred: u64,
    /// RemoteSend retransmissions found needless: their exchange's reply
    /// answered its first copy (so the server had it all along).
    pub retransmits_needless: u64,
    /// Notices from peers that datagrams from here failed authentication
    /// there (unauthenticated hints, only counted).
    pub auth_refused_by_peer: u64,
    /// Bulk-data chunks retransmitted.
    pub bulk_retransmits: u64,
    /// Bulk-data chunks received that were already held: each is a
    /// retransmission that proved needless (or a copy the path made).
    pub bulk_duplicates: u64,
    /// Bulk congestion-window cuts (a loss, or a timeout, seen by a mover).
    pub bulk_cwnd_cuts: u64,
    /// Remote MoveTos answered write-behind (before their acknowledgement).
    pub bulk_write_behind: u64,
    /// Duplicate requests filtered (answered with replyPending or a saved reply).
    pub duplicates: u64,
    /// Saved replies re-sent for non-idempotent duplicates.
    pub saved_replies_resent: u64,
    /// Saved replies dropped because too many were kept (bounded memory).
    pub saved_replies_evicted: u64,
    /// Exchanges, transfers and queries that timed out.
    pub timeouts: u64,
    /// Sends that failed at their deadline (`IpcError::Deadline`).
    pub deadlines: u64,
    /// Local exchanges completed.
    pub local_exchanges: u64,
    /// Remote exchanges completed (as sender).
    pub remote_exchanges: u64,
    /// Remote Sends that ran outside the engine: direct Sends of this
    /// host's processes and of the programs attached to it.
    pub direct_sends: u64,
    /// Aliens currently in use.
    pub aliens_in_use: u64,
    /// Bytes moved by MoveTo/MoveFrom.
    pub bulk_bytes: u64,
    /// Group Sends started by local processes.
    pub group_sends: u64,
    /// Group messages handed to local members (one per member).
    pub group_deliveries: u64,
    /// Members that missed a group message because every copy was in use.
    pub group_copies_exhausted: u64,
    /// Replies to group Sends received (first and later).
    pub group_replies: u64,
    /// Sizes of the messages (RemoteSend and RemoteReply datagrams, bytes)
    /// sent and received.
    pub message_sizes: Histogram,
    /// Sizes of the segment parts appended to messages (bytes; only
    /// messages that carry one).
    pub segment_sizes: Histogram,
    /// Per peer host (by id): datagrams, bytes and messages each way.
    pub peers: BTreeMap<u16, PeerTraffic>,
    /// Traffic of peers beyond [`MAX_PEERS`].
    pub other_peers: PeerTraffic,
    /// Send-to-reply latency of local exchanges, µs.
    pub local_latency_us: Histogram,
    /// Send-to-reply latency of remote exchanges, µs (from the first
    /// transmission).
    pub remote_latency_us: Histogram,
    /// MoveTo/MoveFrom operations completed (see also `bulk_bytes`).
    pub bulk_moves: u64,
    /// Datagrams rejected by authentication, by
    /// [`Reject`](crate::auth::Reject) (truncated, no key, unknown key, bad
    /// tag, replay, stale). They never reach the protocol.
    pub auth_rejects: [u64; 6],
}

impl Stats {
    pub(crate) fn rx_type(&mut self, t: PacketType, bytes: usize) {
        self.rx[t as usize - 1] += 1;
        self.rx_bytes += bytes as u64;
    }

    pub(crate) fn tx_type(&mut self, t: PacketType, bytes: usize) {
        self.tx[t as usize - 1] += 1;
        self.tx_bytes += bytes as u64;
    }

    /// Counts one datagram to (`tx`) or from a peer host, by its header.
    pub(crate) fn datagram(
        &mut self,
        tx: bool,
        peer: u16,
        ptype: PacketType,
        bytes: usize,
        data: usize,
    ) {
        let message = matches!(ptype, PacketType::RemoteSend | PacketType::RemoteReply);
        if message {
            self.message_sizes.record(bytes as u64);
            if data > 0 {
                self.segment_sizes.record(data as u64);
            }
        }
        let n = self.peers.len();
        match self.peers.get_mut(&peer) {
            Some(p) => p.add(tx, bytes, message),
            // A peer gets its own counters only once this host sends it a
            // request or a reply (an exchange with it): datagrams alone,
            // with any source host id they like, cannot grow the table.
            None if tx && message && n < MAX_PEERS => {
                let mut p = PeerTraffic::default();
                p.add(tx, bytes, message);
                self.peers.insert(peer, p);
            }
            None => self.other_peers.add(tx, bytes, message),
        }
    }

    /// Counts a datagram sent (`tx`) or received by an exchange run
    /// outside the engine (`direct.rs`), as the engine counts its own: by
    /// type, and with `detailed` (`Config::metrics`) per peer and size.
    pub fn count_datagram(
        &mut self,
        tx: bool,
        peer: u16,
        ptype: PacketType,
        bytes: usize,
        detailed: bool,
    ) {
        if tx {
            self.tx_type(ptype, bytes);
        } else {
            self.rx_type(ptype, bytes);
        }
        if detailed {
            self.datagram(tx, peer, ptype, bytes, 0);
        }
    }

    /// Adds every counter of `o` to these (gauges too: `aliens_in_use`).
    pub fn merge_from(&mut self, o: &Stats) {
        fn sum<const N: usize>(a: &mut [u64; N], b: &[u64; N]) {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        }
        sum(&mut self.rx, &o.rx);
        sum(&mut self.tx, &o.tx);
        sum(&mut self.decode_errors, &o.decode_errors);
        sum(&mut self.drops, &o.drops);
        sum(&mut self.auth_rejects, &o.auth_rejects);
        for (x, y) in [
            (&mut self.rx_bytes, o.rx_bytes),
            (&mut self.tx_bytes, o.tx_bytes),
            (&mut self.retransmits, o.retransmits),
            (&mut self.retransmits_deferred, o.retransmits_deferred),
            (&mut self.retransmits_needless, o.retransmits_needless),
            (&mut self.auth_refused_by_peer, o.auth_refused_by_peer),
            (&mut self.bulk_retransmits, o.bulk_retransmits),
            (&mut self.bulk_duplicates, o.bulk_duplicates),
            (&mut self.bulk_cwnd_cuts, o.bulk_cwnd_cuts),
            (&mut self.bulk_write_behind, o.bulk_write_behind),
            (&mut self.duplicates, o.duplicates),
            (&mut self.saved_replies_resent, o.saved_replies_resent),
            (&mut self.saved_replies_evicted, o.saved_replies_evicted),
            (&mut self.timeouts, o.timeouts),
            (&mut self.deadlines, o.deadlines),
            (&mut self.local_exchanges, o.local_exchanges),
            (&mut self.remote_exchanges, o.remote_exchanges),
            (&mut self.direct_sends, o.direct_sends),
            (&mut self.aliens_in_use, o.aliens_in_use),
            (&mut self.bulk_bytes, o.bulk_bytes),
            (&mut self.group_sends, o.group_sends),
            (&mut self.group_deliveries, o.group_deliveries),
            (&mut self.group_copies_exhausted, o.group_copies_exhausted),
            (&mut self.group_replies, o.group_replies),
            (&mut self.bulk_moves, o.bulk_moves),
        ] {
            *x += y;
        }
        for (h, oh) in [
            (&mut self.message_sizes, &o.message_sizes),
            (&mut self.segment_sizes, &o.segment_sizes),
            (&mut self.local_latency_us, &o.local_latency_us),
            (&mut self.remote_latency_us, &o.remote_latency_us),
        ] {
            sum(&mut h.counts, &oh.counts);
            sum(&mut h.sums, &oh.sums);
        }
        for (peer, t) in &o.peers {
            let n = self.peers.len();
            match self.peers.get_mut(peer) {
                Some(p) => p.merge_from(t),
                None if n < MAX_PEERS => {
                    self.peers.insert(*peer, *t);
                }
                None => self.other_peers.merge_from(t),
            }
        }
        self.other_peers.merge_from(&o.other_peers);
    }

    /// Drops the counters of peer host `peer` (gone: see the runtime's
    /// metrics), so that its entry is free for another peer.
    pub fn forget_peer(&mut self, peer: u16) {
        self.peers.remove(&peer);
    }

    pub(crate) fn decode_error(&mut self, e: DecodeError) {
        let i = match e {
            DecodeError::Truncated => 0,
            DecodeError::BadMagic => 1,
            DecodeError::BadVersion => 2,
            DecodeError::BadType => 3,
            DecodeError::BadLength => 4,
            DecodeError::Oversized => 5,
        };
        self.decode_errors[i] += 1;
        self.drops[DropReason::Malformed as usize] += 1;
    }

    pub(crate) fn drop(&mut self, r: DropReason) {
        self.drops[r as usize] += 1;
    }

    /// Count received of one packet type.
    pub fn rx_of(&self, t: PacketType) -> u64 {
        self.rx[t as usize - 1]
    }

    /// Count sent of one packet type.
    pub fn tx_of(&self, t: PacketType) -> u64 {
        self.tx[t as usize - 1]
    }

    /// Drops for one reason.
    pub fn drops_of(&self, r: DropReason) -> u64 {
        self.drops[r as usize]
    }

    /// Datagrams rejected by authentication for one reason.
    pub fn auth_rejects_of(&self, r: crate::auth::Reject) -> u64 {
        self.auth_rejects[r as usize]
    }

    /// All decode failures.
    pub fn malformed(&self) -> u64 {
        self.decode_errors.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stats with every kind of counter set, distinct values.
    fn busy() -> Stats {
        let mut s = Stats::default();
        s.count_datagram(true, 7, PacketType::RemoteSend, 76, true);
        s.count_datagram(false, 7, PacketType::RemoteReply, 80, true);
        s.count_datagram(false, 9, PacketType::NAck, 76, false);
        s.decode_errors[2] = 3;
        s.drops[4] = 5;
        s.auth_rejects[1] = 6;
        s.retransmits = 7;
        s.remote_exchanges = 8;
        s.group_replies = 9;
        s.bulk_moves = 10;
        s.remote_latency_us.record(40);
        s.local_latency_us.record(3);
        s.segment_sizes.record(1000);
        s.other_peers.rx_bytes = 11;
        s
    }

    #[test]
    fn drop_reasons_are_listed_in_counter_order() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }

    #[test]
    fn merging_adds_every_counter() {
        let b = busy();
        let mut m = Stats::default();
        m.merge_from(&b);
        assert_eq!(format!("{m:?}"), format!("{b:?}"), "into nothing: a copy");
        m.merge_from(&b);
        assert_eq!(m.tx_of(PacketType::RemoteSend), 2);
        assert_eq!(m.rx_of(PacketType::NAck), 2);
        assert_eq!((m.rx_bytes, m.tx_bytes), (2 * 156, 2 * 76));
        assert_eq!(
            (m.decode_errors[2], m.drops[4], m.auth_rejects[1]),
            (6, 10, 12)
        );
        assert_eq!((m.retransmits, m.remote_exchanges), (14, 16));
        assert_eq!((m.group_replies, m.bulk_moves), (18, 20));
        assert_eq!(m.remote_latency_us.count(), 2);
        assert_eq!(m.remote_latency_us.sum(), 80);
        assert_eq!(m.local_latency_us.count(), 2);
        assert_eq!(m.segment_sizes.sum(), 2000);
        assert_eq!(m.message_sizes.count(), 4, "one sent, one received, twice");
        let p = m.peers[&7];
        assert_eq!((p.tx_messages, p.rx_messages, p.rx_bytes), (2, 2, 160));
        assert!(!m.peers.contains_key(&9), "not detailed");
        assert_eq!(m.other_peers.rx_bytes, 22);
    }
}
