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
