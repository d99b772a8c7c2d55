//! The counters in the Prometheus text format (0.0.4), through
//! `prometheus-client`: latencies in seconds, counters ending in
//! `_total`, and a fixed set of series, every histogram bucket included,
//! from the first scrape on (only the per-peer ones come and go, with
//! their peers: see `peers.rs`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::RangeInclusive;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use vkernel_proto::stats::{Histogram, PeerTraffic};
use vkernel_proto::wire::PacketType;

use super::doc::{drop_reasons, rejects, type_name};
use super::Snapshot;

/// The `Content-Type` of [`Snapshot::to_prometheus`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The engine's log2 buckets whose tops bound the latency histograms'
/// buckets: 2^i − 1 µs (recorded values are whole µs), 1 µs to 16.8 s.
const LATENCY_BUCKETS: RangeInclusive<usize> = 1..=24;

/// The same for sizes: 63 bytes to 65,535 (above any datagram).
const SIZE_BUCKETS: RangeInclusive<usize> = 6..=16;

/// Counters of one family, one sample per value of one label.
#[derive(Debug)]
struct Family {
    label: &'static str,
    rows: Vec<(String, u64)>,
}

impl EncodeMetric for Family {
    fn encode(&self, mut e: MetricEncoder) -> fmt::Result {
        for (value, n) in &self.rows {
            let labels = [(self.label, value.as_str())];
            ConstCounter::new(*n).encode(e.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// Exemplars of a histogram (it has none).
type Exemplars = HashMap<usize, Exemplar<Vec<(String, String)>, f64>>;

/// A histogram read from an engine [`Histogram`], in fixed buckets.
#[derive(Debug)]
struct Fixed {
    sum: f64,
    count: u64,
    /// (upper bound, count in this bucket alone): the encoder sums them.
    buckets: Vec<(f64, u64)>,
}

impl Fixed {
    /// `h`'s buckets merged into those whose tops are in `bounds`, values
    /// divided by `scale`.
    fn new(h: &Histogram, bounds: RangeInclusive<usize>, scale: f64) -> Fixed {
        let mut next = 0;
        let buckets = bounds
            .map(|i| {
                let n = h.counts.get(next..=i).map_or(0, |c| c.iter().sum());
                next = i + 1;
                ((Histogram::upper(i) - 1) as f64 / scale, n)
            })
            .collect();
        Fixed {
            sum: h.sum() as f64 / scale,
            count: h.count(),
            buckets,
        }
    }
}

impl EncodeMetric for Fixed {
    fn encode(&self, mut e: MetricEncoder) -> fmt::Result {
        e.encode_histogram(self.sum, self.count, &self.buckets, None::<&Exemplars>)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl Snapshot {
    /// The counters in the Prometheus text format (version 0.0.4).
    pub fn to_prometheus(&self) -> String {
        let (s, g) = (&self.stats, &self.gauges);
        let host = (Cow::Borrowed("host"), Cow::Owned(format!("{:04x}", g.host)));
        let mut r = Registry::with_prefix_and_labels("vkernel", std::iter::once(host));
        let family = |label, rows: Vec<(String, u64)>| Family { label, rows };
        let types = |v: &[u64; 13]| {
            let rows = PacketType::ALL
                .iter()
                .map(|&t| (type_name(t), v[t as usize - 1]));
            family("type", rows.collect())
        };
        let named = |it: &mut dyn Iterator<Item = (&'static str, u64)>| {
            family("reason", it.map(|(n, v)| (n.to_string(), v)).collect())
        };
        r.register(
            "datagrams_received",
            "Datagrams received, by packet type",
            types(&s.rx),
        );
        r.register(
            "datagrams_sent",
            "Datagrams sent, by packet type",
            types(&s.tx),
        );
        for (name, help, v) in [
            ("bytes_received", "Bytes received in datagrams", s.rx_bytes),
            ("bytes_sent", "Bytes sent in datagrams", s.tx_bytes),
        ] {
            r.register(name, help, ConstCounter::new(v));
        }
        r.register(
            "drops",
            "Datagrams dropped after decoding, by reason",
            named(&mut drop_reasons(s)),
        );
        r.register(
            "auth_rejects",
            "Datagrams rejected by authentication, by reason",
            named(&mut rejects(s)),
        );
        for (name, help, v) in [
            ("retransmits", "RemoteSend retransmissions", s.retransmits),
            (
                "retransmits_deferred",
                "RemoteSend retransmissions put off: the server's host was answering older Sends",
                s.retransmits_deferred,
            ),
            (
                "retransmits_needless",
                "RemoteSend retransmissions found needless: the reply answered the first copy",
                s.retransmits_needless,
            ),
            ("bulk_retransmits", "Bulk chunks retransmitted", s.bulk_retransmits),
            (
                "bulk_duplicates",
                "Bulk chunks received already held (needless retransmissions)",
                s.bulk_duplicates,
            ),
            (
                "bulk_cwnd_cuts",
                "Bulk congestion-window cuts (a loss or a timeout seen by a mover)",
                s.bulk_cwnd_cuts,
            ),
            (
                "bulk_write_behind",
                "Remote MoveTos answered before their acknowledgement (write-behind)",
                s.bulk_write_behind,
            ),
            ("duplicates", "Duplicate requests filtered", s.duplicates),
            ("timeouts", "Operations that timed out", s.timeouts),
            ("send_deadlines", "Sends that failed at their deadline", s.deadlines),
            ("local_exchanges", "Local exchanges completed", s.local_exchanges),
            (
                "remote_exchanges",
                "Remote exchanges completed as sender",
                s.remote_exchanges,
            ),
            (
                "direct_sends",
                "Remote Sends run outside the engine (direct Sends of this host's processes and attached programs)",
                s.direct_sends,
            ),
            ("bulk_moves", "MoveTo/MoveFrom operations completed", s.bulk_moves),
            ("bulk_bytes", "Bytes moved by MoveTo/MoveFrom", s.bulk_bytes),
            ("group_sends", "Group Sends started", s.group_sends),
            ("decode_errors", "Datagrams that failed to decode", s.malformed()),
        ] {
            r.register(name, help, ConstCounter::new(v));
        }
        let peers = |f: fn(&PeerTraffic) -> u64| {
            let mut rows: Vec<(String, u64)> = (self.peers.own.iter())
                .map(|(p, t)| (format!("{p:04x}"), f(t)))
                .collect();
            rows.push(("other".into(), f(&self.peers.other)));
            family("peer", rows)
        };
        for (name, help, f) in [
            (
                "peer_bytes_sent",
                "Bytes sent to each peer host",
                (|t| t.tx_bytes) as fn(&PeerTraffic) -> u64,
            ),
            (
                "peer_bytes_received",
                "Bytes received from each peer host",
                |t| t.rx_bytes,
            ),
            (
                "peer_messages_sent",
                "Messages sent to each peer host",
                |t| t.tx_messages,
            ),
            (
                "peer_messages_received",
                "Messages received from each peer host",
                |t| t.rx_messages,
            ),
        ] {
            r.register(name, help, peers(f));
        }
        for (name, help, v) in [
            ("processes", "Live processes", g.processes),
            ("aliens_in_use", "Alien descriptors in use", s.aliens_in_use),
            ("queued_messages", "Messages queued for receivers", g.queued),
        ] {
            r.register(name, help, ConstGauge::new(v));
        }
        for (name, help, unit, h, bounds, scale) in [
            (
                "message_size",
                "Sizes of messages sent and received",
                Unit::Bytes,
                &s.message_sizes,
                SIZE_BUCKETS,
                1.0,
            ),
            (
                "segment_size",
                "Sizes of appended segment parts",
                Unit::Bytes,
                &s.segment_sizes,
                SIZE_BUCKETS,
                1.0,
            ),
            (
                "local_exchange_latency",
                "Local Send-to-reply latency",
                Unit::Seconds,
                &s.local_latency_us,
                LATENCY_BUCKETS,
                1e6,
            ),
            (
                "remote_exchange_latency",
                "Remote Send-to-reply latency (from the first transmission)",
                Unit::Seconds,
                &s.remote_latency_us,
                LATENCY_BUCKETS,
                1e6,
            ),
        ] {
            r.register_with_unit(name, help, unit, Fixed::new(h, bounds, scale));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &r);
        out
    }
}
