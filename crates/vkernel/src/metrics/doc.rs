//! The statistics document: `/stats.json`, a kernel server's answer to
//! STATS, what `vkernel stats` reads. One serde type, written and read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vkernel_proto::auth::Reject;
use vkernel_proto::stats::{Histogram, PeerTraffic};
use vkernel_proto::wire::PacketType;
use vkernel_proto::{DropReason, Stats};

use super::Snapshot;

const DROP_REASONS: [(DropReason, &str); 11] = [
    (DropReason::Malformed, "malformed"),
    (DropReason::NotForUs, "not_for_us"),
    (DropReason::Stale, "stale"),
    (DropReason::NoMatch, "no_match"),
    (DropReason::NoBuffers, "no_buffers"),
    (DropReason::SegmentViolation, "segment_violation"),
    (DropReason::OwnEcho, "own_echo"),
    (DropReason::NotReady, "not_ready"),
    (DropReason::Untrusted, "untrusted"),
    (DropReason::LateReply, "late_reply"),
    (DropReason::ReplyDataMissing, "reply_data_missing"),
];

const REJECTS: [(Reject, &str); 6] = [
    (Reject::Truncated, "truncated"),
    (Reject::NoKey, "no_key"),
    (Reject::UnknownKey, "unknown_key"),
    (Reject::BadTag, "bad_tag"),
    (Reject::Replay, "replay"),
    (Reject::Stale, "stale"),
];

/// Drop reasons with their label and key names, in counter order.
pub(super) fn drop_reasons(s: &Stats) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    DROP_REASONS.iter().map(|(r, n)| (*n, s.drops_of(*r)))
}

/// Authentication rejects with their label and key names.
pub(super) fn rejects(s: &Stats) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    REJECTS.iter().map(|(r, n)| (*n, s.auth_rejects_of(*r)))
}

/// A packet type's name in both formats.
pub(super) fn type_name(t: PacketType) -> String {
    format!("{t:?}")
}

/// A log2 histogram: its totals, two quantiles (upper bounds), and the
/// buckets that counted anything as `[upper_bound_exclusive, count, sum]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HistogramDoc {
    /// Values counted.
    pub count: u64,
    /// Their sum.
    pub sum: u64,
    /// Upper bound of the median.
    pub p50: u64,
    /// Upper bound of the 99th percentile.
    pub p99: u64,
    /// `[upper_bound_exclusive, count, sum]` of each bucket that counted.
    pub buckets: Vec<[u64; 3]>,
}

impl From<&Histogram> for HistogramDoc {
    fn from(h: &Histogram) -> Self {
        let buckets = (h.counts.iter().zip(&h.sums).enumerate())
            .filter(|(_, (&c, _))| c > 0)
            .map(|(i, (&c, &s))| [Histogram::upper(i), c, s])
            .collect();
        HistogramDoc {
            count: h.count(),
            sum: h.sum(),
            p50: h.quantile(0.5),
            p99: h.quantile(0.99),
            buckets,
        }
    }
}

/// Traffic with one peer host (or with all of `other_peers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeerDoc {
    /// Datagrams sent to it.
    pub tx_datagrams: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
    /// Messages sent to it.
    pub tx_messages: u64,
    /// Datagrams received from it.
    pub rx_datagrams: u64,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Messages received from it.
    pub rx_messages: u64,
}

impl From<&PeerTraffic> for PeerDoc {
    fn from(p: &PeerTraffic) -> Self {
        PeerDoc {
            tx_datagrams: p.tx_datagrams,
            tx_bytes: p.tx_bytes,
            tx_messages: p.tx_messages,
            rx_datagrams: p.rx_datagrams,
            rx_bytes: p.rx_bytes,
            rx_messages: p.rx_messages,
        }
    }
}

/// Every counter and gauge of a host. Fields missing from a document (an
/// older host's) read as zero. Latencies are in µs, sizes in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatsDoc {
    /// Logical host id, 4 hex digits.
    pub host: String,
    /// Microseconds since the host started.
    pub uptime_us: u64,
    /// Live processes.
    pub processes: u64,
    /// Messages queued for receivers.
    pub queued_messages: u64,
    /// Alien descriptors in use.
    pub aliens_in_use: u64,
    /// Datagrams received, by packet type.
    pub datagrams_rx: BTreeMap<String, u64>,
    /// Datagrams sent, by packet type.
    pub datagrams_tx: BTreeMap<String, u64>,
    /// Bytes received in datagrams.
    pub bytes_rx: u64,
    /// Bytes sent in datagrams.
    pub bytes_tx: u64,
    /// Datagrams that failed to decode.
    pub decode_errors: u64,
    /// Datagrams dropped after decoding, by reason.
    pub drops: BTreeMap<String, u64>,
    /// Datagrams rejected by authentication, by reason.
    pub auth_rejects: BTreeMap<String, u64>,
    /// RemoteSend retransmissions.
    pub retransmits: u64,
    /// Retransmissions put off: the server's host was answering older Sends.
    pub retransmits_deferred: u64,
    /// Retransmissions found needless: the reply answered the first copy.
    pub retransmits_needless: u64,
    /// Bulk chunks retransmitted.
    pub bulk_retransmits: u64,
    /// Bulk chunks received already held (needless retransmissions).
    pub bulk_duplicates: u64,
    /// Bulk congestion-window cuts.
    pub bulk_cwnd_cuts: u64,
    /// Remote MoveTos answered before their acknowledgement.
    pub bulk_write_behind: u64,
    /// Duplicate requests filtered.
    pub duplicates: u64,
    /// Saved replies re-sent for duplicates.
    pub saved_replies_resent: u64,
    /// Operations that timed out.
    pub timeouts: u64,
    /// Sends that failed at their deadline.
    pub deadlines: u64,
    /// replyPending datagrams sent.
    pub reply_pending_tx: u64,
    /// nAck datagrams sent.
    pub nacks_tx: u64,
    /// Local exchanges completed.
    pub local_exchanges: u64,
    /// Remote exchanges completed as sender.
    pub remote_exchanges: u64,
    /// Remote Sends run outside the engine.
    pub direct_sends: u64,
    /// MoveTo/MoveFrom operations completed.
    pub bulk_moves: u64,
    /// Bytes moved by MoveTo/MoveFrom.
    pub bulk_bytes: u64,
    /// Group Sends started.
    pub group_sends: u64,
    /// Group messages handed to local members.
    pub group_deliveries: u64,
    /// Replies to group Sends received.
    pub group_replies: u64,
    /// Sizes of messages sent and received, bytes.
    pub message_sizes: HistogramDoc,
    /// Sizes of appended segment parts, bytes.
    pub segment_sizes: HistogramDoc,
    /// Local Send-to-reply latency, µs.
    pub local_latency_us: HistogramDoc,
    /// Remote Send-to-reply latency, µs.
    pub remote_latency_us: HistogramDoc,
    /// Traffic per live peer host (by id, 4 hex digits).
    pub peers: BTreeMap<String, PeerDoc>,
    /// Traffic of peers beyond the per-peer table's bound.
    pub other_peers: PeerDoc,
}

impl From<&Snapshot> for StatsDoc {
    fn from(snap: &Snapshot) -> Self {
        let (s, g) = (&snap.stats, &snap.gauges);
        let by_type = |v: &[u64; 13]| {
            PacketType::ALL
                .iter()
                .map(|&t| (type_name(t), v[t as usize - 1]))
                .collect()
        };
        let named = |it: &mut dyn Iterator<Item = (&'static str, u64)>| {
            it.map(|(n, v)| (n.to_string(), v)).collect()
        };
        StatsDoc {
            host: format!("{:04x}", g.host),
            uptime_us: g.uptime_us,
            processes: g.processes,
            queued_messages: g.queued,
            aliens_in_use: s.aliens_in_use,
            datagrams_rx: by_type(&s.rx),
            datagrams_tx: by_type(&s.tx),
            bytes_rx: s.rx_bytes,
            bytes_tx: s.tx_bytes,
            decode_errors: s.malformed(),
            drops: named(&mut drop_reasons(s)),
            auth_rejects: named(&mut rejects(s)),
            retransmits: s.retransmits,
            retransmits_deferred: s.retransmits_deferred,
            retransmits_needless: s.retransmits_needless,
            bulk_retransmits: s.bulk_retransmits,
            bulk_duplicates: s.bulk_duplicates,
            bulk_cwnd_cuts: s.bulk_cwnd_cuts,
            bulk_write_behind: s.bulk_write_behind,
            duplicates: s.duplicates,
            saved_replies_resent: s.saved_replies_resent,
            timeouts: s.timeouts,
            deadlines: s.deadlines,
            reply_pending_tx: s.tx_of(PacketType::ReplyPending),
            nacks_tx: s.tx_of(PacketType::NAck),
            local_exchanges: s.local_exchanges,
            remote_exchanges: s.remote_exchanges,
            direct_sends: s.direct_sends,
            bulk_moves: s.bulk_moves,
            bulk_bytes: s.bulk_bytes,
            group_sends: s.group_sends,
            group_deliveries: s.group_deliveries,
            group_replies: s.group_replies,
            message_sizes: (&s.message_sizes).into(),
            segment_sizes: (&s.segment_sizes).into(),
            local_latency_us: (&s.local_latency_us).into(),
            remote_latency_us: (&s.remote_latency_us).into(),
            peers: (s.peers.iter())
                .map(|(h, p)| (format!("{h:04x}"), p.into()))
                .collect(),
            other_peers: (&s.other_peers).into(),
        }
    }
}

impl StatsDoc {
    /// The document as JSON text.
    pub fn to_json(&self) -> String {
        // Plain structs and string-keyed maps: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The scalar counters as a [`Stats`] (histograms, per-type and
    /// per-peer counts are only in the document).
    pub fn scalars(&self) -> Stats {
        Stats {
            aliens_in_use: self.aliens_in_use,
            rx_bytes: self.bytes_rx,
            tx_bytes: self.bytes_tx,
            retransmits: self.retransmits,
            retransmits_deferred: self.retransmits_deferred,
            retransmits_needless: self.retransmits_needless,
            bulk_retransmits: self.bulk_retransmits,
            bulk_duplicates: self.bulk_duplicates,
            bulk_cwnd_cuts: self.bulk_cwnd_cuts,
            bulk_write_behind: self.bulk_write_behind,
            duplicates: self.duplicates,
            saved_replies_resent: self.saved_replies_resent,
            timeouts: self.timeouts,
            deadlines: self.deadlines,
            local_exchanges: self.local_exchanges,
            remote_exchanges: self.remote_exchanges,
            direct_sends: self.direct_sends,
            bulk_moves: self.bulk_moves,
            bulk_bytes: self.bulk_bytes,
            group_sends: self.group_sends,
            group_deliveries: self.group_deliveries,
            group_replies: self.group_replies,
            ..Stats::default()
        }
    }
}

/// The scalar counters of a statistics document, as a [`Stats`] (what an
/// attached program's `Kernel::stats` returns); zeros if it is not one.
pub(crate) fn stats_from_json(doc: &str) -> Stats {
    serde_json::from_str::<StatsDoc>(doc)
        .unwrap_or_default()
        .scalars()
}
