//! A logical host's counters as JSON (what its kernel server answers to a
//! STATS request, so they are readable remotely too) and as Prometheus
//! text (the `--metrics ADDR` endpoint).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use vkernel_proto::auth::Reject;
use vkernel_proto::stats::{Histogram, PeerTraffic};
use vkernel_proto::wire::PacketType;
use vkernel_proto::{DropReason, Stats};

use crate::kernel::Shared;

/// Gauges read from the engine beside its counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Logical host id.
    pub host: u16,
    /// Live processes.
    pub processes: u64,
    /// Messages queued for receivers.
    pub queued: u64,
    /// Microseconds since the host started.
    pub uptime_us: u64,
}

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

fn type_name(t: PacketType) -> String {
    format!("{t:?}")
}

fn hist_json(h: &Histogram) -> String {
    let mut b = Vec::new();
    for (i, (&c, &s)) in h.counts.iter().zip(h.sums.iter()).enumerate() {
        if c > 0 {
            b.push(format!("[{},{c},{s}]", Histogram::upper(i)));
        }
    }
    format!(
        "{{\"count\":{},\"sum\":{},\"p50\":{},\"p99\":{},\"buckets\":[{}]}}",
        h.count(),
        h.sum(),
        h.quantile(0.5),
        h.quantile(0.99),
        b.join(",")
    )
}

fn peer_json(p: &PeerTraffic) -> String {
    format!(
        "{{\"tx_datagrams\":{},\"tx_bytes\":{},\"tx_messages\":{},\"rx_datagrams\":{},\"rx_bytes\":{},\"rx_messages\":{}}}",
        p.tx_datagrams, p.tx_bytes, p.tx_messages, p.rx_datagrams, p.rx_bytes, p.rx_messages
    )
}

/// The counters as one JSON object. Histogram buckets are
/// `[upper_bound_exclusive, count, sum]`.
pub fn to_json(s: &Stats, g: &Gauges) -> String {
    let by_type = |v: &[u64; 13]| {
        PacketType::ALL
            .iter()
            .map(|&t| format!("\"{}\":{}", type_name(t), v[t as usize - 1]))
            .collect::<Vec<_>>()
            .join(",")
    };
    let drops = DROP_REASONS
        .iter()
        .map(|(r, n)| format!("\"{n}\":{}", s.drops_of(*r)))
        .collect::<Vec<_>>()
        .join(",");
    let rejects = REJECTS
        .iter()
        .map(|(r, n)| format!("\"{n}\":{}", s.auth_rejects_of(*r)))
        .collect::<Vec<_>>()
        .join(",");
    let peers = s
        .peers
        .iter()
        .map(|(h, p)| format!("\"{h:04x}\":{}", peer_json(p)))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        concat!(
            "{{\"host\":\"{:04x}\",\"uptime_us\":{},\"processes\":{},\"queued_messages\":{},",
            "\"aliens_in_use\":{},\"datagrams_rx\":{{{}}},\"datagrams_tx\":{{{}}},",
            "\"bytes_rx\":{},\"bytes_tx\":{},\"decode_errors\":{},\"drops\":{{{}}},",
            "\"auth_rejects\":{{{}}},\"retransmits\":{},\"retransmits_deferred\":{},\"retransmits_needless\":{},\"bulk_retransmits\":{},\"bulk_cwnd_cuts\":{},\"bulk_write_behind\":{},",
            "\"duplicates\":{},\"saved_replies_resent\":{},\"timeouts\":{},",
            "\"reply_pending_tx\":{},\"nacks_tx\":{},",
            "\"local_exchanges\":{},\"remote_exchanges\":{},\"direct_sends\":{},\"bulk_moves\":{},\"bulk_bytes\":{},",
            "\"group_sends\":{},\"group_deliveries\":{},\"group_replies\":{},",
            "\"message_sizes\":{},\"segment_sizes\":{},",
            "\"local_latency_us\":{},\"remote_latency_us\":{},",
            "\"peers\":{{{}}},\"other_peers\":{}}}"
        ),
        g.host,
        g.uptime_us,
        g.processes,
        g.queued,
        s.aliens_in_use,
        by_type(&s.rx),
        by_type(&s.tx),
        s.rx_bytes,
        s.tx_bytes,
        s.malformed(),
        drops,
        rejects,
        s.retransmits,
        s.retransmits_deferred,
        s.retransmits_needless,
        s.bulk_retransmits,
        s.bulk_cwnd_cuts,
        s.bulk_write_behind,
        s.duplicates,
        s.saved_replies_resent,
        s.timeouts,
        s.tx_of(PacketType::ReplyPending),
        s.tx_of(PacketType::NAck),
        s.local_exchanges,
        s.remote_exchanges,
        s.direct_sends,
        s.bulk_moves,
        s.bulk_bytes,
        s.group_sends,
        s.group_deliveries,
        s.group_replies,
        hist_json(&s.message_sizes),
        hist_json(&s.segment_sizes),
        hist_json(&s.local_latency_us),
        hist_json(&s.remote_latency_us),
        peers,
        peer_json(&s.other_peers),
    )
}

fn prom_hist(out: &mut String, name: &str, help: &str, h: &Histogram, labels: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cum = 0;
    for (i, &c) in h.counts.iter().enumerate() {
        cum += c;
        if c > 0 {
            let le = Histogram::upper(i).saturating_sub(1);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {cum}");
        }
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cum}");
    let _ = writeln!(
        out,
        "{name}_sum{{{}}} {}",
        labels.trim_end_matches(','),
        h.sum()
    );
    let _ = writeln!(
        out,
        "{name}_count{{{}}} {cum}",
        labels.trim_end_matches(',')
    );
}

/// The counters in the Prometheus text exposition format (version 0.0.4).
pub fn to_prometheus(s: &Stats, g: &Gauges) -> String {
    let mut o = String::new();
    let h = format!("host=\"{:04x}\"", g.host);
    let counter = |o: &mut String, name: &str, help: &str, rows: &[(String, u64)]| {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} counter");
        for (l, v) in rows {
            let sep = if l.is_empty() { "" } else { "," };
            let _ = writeln!(o, "{name}{{{h}{sep}{l}}} {v}");
        }
    };
    let types = |v: &[u64; 13]| -> Vec<(String, u64)> {
        PacketType::ALL
            .iter()
            .map(|&t| (format!("type=\"{}\"", type_name(t)), v[t as usize - 1]))
            .collect()
    };
    counter(
        &mut o,
        "vkernel_datagrams_received_total",
        "Datagrams received, by packet type.",
        &types(&s.rx),
    );
    counter(
        &mut o,
        "vkernel_datagrams_sent_total",
        "Datagrams sent, by packet type.",
        &types(&s.tx),
    );
    counter(
        &mut o,
        "vkernel_bytes_received_total",
        "Bytes received in datagrams.",
        &[(String::new(), s.rx_bytes)],
    );
    counter(
        &mut o,
        "vkernel_bytes_sent_total",
        "Bytes sent in datagrams.",
        &[(String::new(), s.tx_bytes)],
    );
    let drops: Vec<(String, u64)> = DROP_REASONS
        .iter()
        .map(|(r, n)| (format!("reason=\"{n}\""), s.drops_of(*r)))
        .collect();
    counter(
        &mut o,
        "vkernel_drops_total",
        "Datagrams dropped after decoding, by reason.",
        &drops,
    );
    let rej: Vec<(String, u64)> = REJECTS
        .iter()
        .map(|(r, n)| (format!("reason=\"{n}\""), s.auth_rejects_of(*r)))
        .collect();
    counter(
        &mut o,
        "vkernel_auth_rejects_total",
        "Datagrams rejected by authentication, by reason.",
        &rej,
    );
    for (name, help, v) in [
        (
            "vkernel_retransmits_total",
            "RemoteSend retransmissions.",
            s.retransmits,
        ),
        (
            "vkernel_retransmits_deferred_total",
            "RemoteSend retransmissions put off: the server's host was answering older Sends.",
            s.retransmits_deferred,
        ),
        (
            "vkernel_retransmits_needless_total",
            "RemoteSend retransmissions found needless: the reply answered the first copy.",
            s.retransmits_needless,
        ),
        (
            "vkernel_bulk_retransmits_total",
            "Bulk chunks retransmitted.",
            s.bulk_retransmits,
        ),
        (
            "vkernel_bulk_cwnd_cuts_total",
            "Bulk congestion-window cuts (a loss or a timeout seen by a mover).",
            s.bulk_cwnd_cuts,
        ),
        (
            "vkernel_bulk_write_behind_total",
            "Remote MoveTos answered before their acknowledgement (write-behind).",
            s.bulk_write_behind,
        ),
        (
            "vkernel_duplicates_total",
            "Duplicate requests filtered.",
            s.duplicates,
        ),
        (
            "vkernel_timeouts_total",
            "Operations that timed out.",
            s.timeouts,
        ),
        (
            "vkernel_send_deadlines_total",
            "Sends that failed at their deadline.",
            s.deadlines,
        ),
        (
            "vkernel_local_exchanges_total",
            "Local exchanges completed.",
            s.local_exchanges,
        ),
        (
            "vkernel_remote_exchanges_total",
            "Remote exchanges completed as sender.",
            s.remote_exchanges,
        ),
        (
            "vkernel_direct_sends_total",
            "Remote Sends run outside the engine (direct Sends of this host's processes and attached programs).",
            s.direct_sends,
        ),
        (
            "vkernel_bulk_moves_total",
            "MoveTo/MoveFrom operations completed.",
            s.bulk_moves,
        ),
        (
            "vkernel_bulk_bytes_total",
            "Bytes moved by MoveTo/MoveFrom.",
            s.bulk_bytes,
        ),
        (
            "vkernel_group_sends_total",
            "Group Sends started.",
            s.group_sends,
        ),
        (
            "vkernel_decode_errors_total",
            "Datagrams that failed to decode.",
            s.malformed(),
        ),
    ] {
        counter(&mut o, name, help, &[(String::new(), v)]);
    }
    let peer_rows = |f: fn(&PeerTraffic) -> u64| -> Vec<(String, u64)> {
        s.peers
            .iter()
            .map(|(p, t)| (format!("peer=\"{p:04x}\""), f(t)))
            .collect()
    };
    let tx_b = peer_rows(|t| t.tx_bytes);
    let rx_b = peer_rows(|t| t.rx_bytes);
    let tx_m = peer_rows(|t| t.tx_messages);
    let rx_m = peer_rows(|t| t.rx_messages);
    counter(
        &mut o,
        "vkernel_peer_bytes_sent_total",
        "Bytes sent to each peer host.",
        &tx_b,
    );
    counter(
        &mut o,
        "vkernel_peer_bytes_received_total",
        "Bytes received from each peer host.",
        &rx_b,
    );
    counter(
        &mut o,
        "vkernel_peer_messages_sent_total",
        "Messages sent to each peer host.",
        &tx_m,
    );
    counter(
        &mut o,
        "vkernel_peer_messages_received_total",
        "Messages received from each peer host.",
        &rx_m,
    );
    for (name, help, v) in [
        ("vkernel_processes", "Live processes.", g.processes),
        (
            "vkernel_aliens_in_use",
            "Alien descriptors in use.",
            s.aliens_in_use,
        ),
        (
            "vkernel_queued_messages",
            "Messages queued for receivers.",
            g.queued,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} gauge");
        let _ = writeln!(o, "{name}{{{h}}} {v}");
    }
    let l = format!("{h},");
    prom_hist(
        &mut o,
        "vkernel_message_size_bytes",
        "Sizes of messages sent and received.",
        &s.message_sizes,
        &l,
    );
    prom_hist(
        &mut o,
        "vkernel_segment_size_bytes",
        "Sizes of appended segment parts.",
        &s.segment_sizes,
        &l,
    );
    prom_hist(
        &mut o,
        "vkernel_local_exchange_latency_us",
        "Local Send-to-reply latency.",
        &s.local_latency_us,
        &l,
    );
    prom_hist(
        &mut o,
        "vkernel_remote_exchange_latency_us",
        "Remote Send-to-reply latency.",
        &s.remote_latency_us,
        &l,
    );
    o
}

/// Reads a request head (up to its blank line, or until `buf` is full, the
/// peer stops sending, or the read timeout passes). A request can arrive in
/// several segments; answering after the first and closing with the rest
/// unread would reset the connection under the client's feet.
fn read_head(c: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match c.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    n
}

/// Serves `GET /metrics` (Prometheus text) and `GET /stats.json` on `addr`
/// until the host shuts down. Returns the bound address.
pub(crate) fn serve(shared: Arc<Shared>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let bound = l.local_addr()?;
    l.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("vk-metrics".into())
        .spawn(move || {
            while !shared.stopping() {
                match l.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.set_nonblocking(false);
                        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut buf = [0u8; 2048];
                        let n = read_head(&mut c, &mut buf);
                        let req = String::from_utf8_lossy(&buf[..n]);
                        let path = req.split_whitespace().nth(1).unwrap_or("/");
                        let (s, g) = shared.snapshot();
                        let (status, ctype, body) = match path {
                            "/metrics" => ("200 OK", "text/plain; version=0.0.4", to_prometheus(&s, &g)),
                            "/stats.json" => ("200 OK", "application/json", to_json(&s, &g)),
                            _ => ("404 Not Found", "text/plain", "try /metrics or /stats.json\n".into()),
                        };
                        let _ = write!(
                            c,
                            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                    }
                    // Sleep until a scrape connects (no polling interval
                    // for it to wait out); look at `stopping` now and then.
                    Err(_) => {
                        crate::sys::poll2(l.as_raw_fd(), None, Duration::from_millis(200));
                    }
                }
            }
        })?;
    Ok(bound)
}

/// The scalar counters of a [`to_json`] document, as a [`Stats`] (what an
/// attached program's `Kernel::stats` returns; histograms, per-type and
/// per-peer counts are only in the document itself).
pub(crate) fn stats_from_json(doc: &str) -> Stats {
    let v: serde_json::Value = serde_json::from_str(doc).unwrap_or_default();
    let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Stats {
        aliens_in_use: n("aliens_in_use"),
        rx_bytes: n("bytes_rx"),
        tx_bytes: n("bytes_tx"),
        retransmits: n("retransmits"),
        retransmits_deferred: n("retransmits_deferred"),
        retransmits_needless: n("retransmits_needless"),
        bulk_retransmits: n("bulk_retransmits"),
        bulk_cwnd_cuts: n("bulk_cwnd_cuts"),
        bulk_write_behind: n("bulk_write_behind"),
        duplicates: n("duplicates"),
        saved_replies_resent: n("saved_replies_resent"),
        timeouts: n("timeouts"),
        local_exchanges: n("local_exchanges"),
        remote_exchanges: n("remote_exchanges"),
        direct_sends: n("direct_sends"),
        bulk_moves: n("bulk_moves"),
        bulk_bytes: n("bulk_bytes"),
        group_sends: n("group_sends"),
        group_deliveries: n("group_deliveries"),
        group_replies: n("group_replies"),
        ..Stats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::read_head;

    /// Hands out its bytes a few at a time, like a request split over
    /// several TCP segments.
    struct Trickle<'a>(&'a [u8], usize);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let k = self.1.min(self.0.len()).min(buf.len());
            buf[..k].copy_from_slice(&self.0[..k]);
            self.0 = &self.0[k..];
            Ok(k)
        }
    }

    #[test]
    fn a_request_head_split_over_reads_is_read_whole() {
        let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut buf = [0u8; 2048];
        let n = read_head(&mut Trickle(req, 4), &mut buf);
        assert_eq!(&buf[..n], &req[..]);
        // A peer that stops early: what came is returned.
        let n = read_head(&mut Trickle(b"GET /met", 3), &mut buf);
        assert_eq!(&buf[..n], b"GET /met");
        // A head longer than the buffer stops at the buffer's end.
        let long = vec![b'a'; 5000];
        let n = read_head(&mut Trickle(&long, 1000), &mut buf);
        assert_eq!(n, 2048);
    }
}
