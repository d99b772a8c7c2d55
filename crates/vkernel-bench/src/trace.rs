//! `vkernel trace report FILE...`: the Solaris MC style characterization of
//! recorded traces (`--trace FILE` on any command that starts a host):
//! message sizes by count and bytes, the destination matrix, rates over
//! time, the request–response latency by phase, and the conservation check
//! (datagrams sent against datagrams received per host pair; gaps are
//! drops). Optionally SVG charts and a Chrome trace-event file (Perfetto,
//! chrome://tracing).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use serde::Serialize;
use vkernel::trace::{Datagram, Event, Exchange, Kind, Packet};

use crate::chart;

/// The events of trace files, in time order, and the count of lines that
/// did not parse.
fn load(files: &[PathBuf]) -> Result<(Vec<Event>, usize), String> {
    let mut evs = Vec::new();
    let mut bad = 0;
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        for line in text.lines() {
            match Event::parse(line) {
                Ok(e) => evs.push(e),
                Err(_) => bad += 1,
            }
        }
    }
    evs.sort_by_key(|e| e.t);
    Ok((evs, bad))
}

const SIZE_BINS: [(u64, u64, &str); 6] = [
    (0, 67, "< 68 B"),
    (68, 256, "68–256 B"),
    (257, 1024, "257 B–1 KiB"),
    (1025, 4096, "1–4 KiB"),
    (4097, 16384, "4–16 KiB"),
    (16385, u64::MAX, "> 16 KiB"),
];

/// The logical host of a pid.
fn host_of(pid: u32) -> u16 {
    ((pid >> 16) & 0x7fff) as u16
}

fn hex4(h: u16) -> String {
    format!("{h:04x}")
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

fn median_p99(v: &mut [u64]) -> (u64, u64) {
    if v.is_empty() {
        return (0, 0);
    }
    v.sort_unstable();
    let pick = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    (pick(0.5), pick(0.99))
}

/// The characterization of a set of traces.
#[derive(Clone, Debug, Serialize)]
pub struct TraceReport {
    /// Events read.
    pub events: usize,
    /// Lines that were not events.
    pub unparsed_lines: usize,
    /// First to last event.
    pub span_us: u64,
    /// Messages (RemoteSend, RemoteReply) sent.
    pub messages: u64,
    /// Their bytes.
    pub message_bytes: u64,
    /// Messages by size bin.
    pub sizes: Vec<SizeBin>,
    /// Messages by source and destination host.
    pub matrix: Vec<MatrixCell>,
    /// Messages sent per 100 ms.
    pub rates_per_100ms: Vec<u64>,
    /// Exchange latency by phase.
    pub phases_us: Vec<PhaseLatency>,
    /// Datagrams sent against received, per traced host pair.
    pub conservation: Vec<Conservation>,
}

/// One message size bin.
#[derive(Clone, Debug, Serialize)]
pub struct SizeBin {
    /// Bin label.
    pub bin: String,
    /// Messages.
    pub count: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Messages from one host to another.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixCell {
    /// Source host.
    pub from: String,
    /// Destination host.
    pub to: String,
    /// Messages.
    pub messages: u64,
}

/// Latency of one phase of an exchange.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseLatency {
    /// Phase name.
    pub phase: String,
    /// Median µs.
    pub median: u64,
    /// p99 µs.
    pub p99: u64,
    /// Exchanges matched.
    pub n: usize,
}

/// Datagrams from one host to another, sent and received.
#[derive(Clone, Debug, Serialize)]
pub struct Conservation {
    /// Sender host.
    pub from: String,
    /// Receiver host.
    pub to: String,
    /// Sent.
    pub sent: u64,
    /// Received.
    pub received: u64,
    /// Sent − received.
    pub dropped: u64,
}

/// A Chrome trace-event record.
#[derive(Serialize)]
struct ChromeEvent {
    name: String,
    ph: &'static str,
    ts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    pid: String,
    tid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<ChromeArgs>,
}

#[derive(Serialize)]
struct ChromeArgs {
    dst: String,
    seq: u32,
    len: u64,
}

#[derive(Serialize)]
struct ChromeTrace {
    #[serde(rename = "traceEvents")]
    trace_events: Vec<ChromeEvent>,
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
}

fn span(name: &str, ts: u64, dur: u64, pid: u32) -> ChromeEvent {
    ChromeEvent {
        name: name.into(),
        ph: "X",
        ts,
        dur: Some(dur),
        s: None,
        pid: hex4(host_of(pid)),
        tid: format!("{pid:08x}"),
        args: None,
    }
}

/// Request–response latency by phase: each sender's send → complete, and
/// the receiver's deliver → reply, matched in order per (sender, receiver);
/// the Chrome spans of the same.
fn phases(evs: &[Event]) -> ([Vec<u64>; 4], Vec<ChromeEvent>) {
    let mut open_send: HashMap<u32, u64> = HashMap::new();
    let mut delivered: HashMap<(u32, u32), VecDeque<u64>> = HashMap::new();
    let mut handling: HashMap<(u32, u32), VecDeque<(u64, u64)>> = HashMap::new();
    let [mut total, mut request, mut handler, mut response] = [(); 4].map(|_| Vec::new());
    let mut spans = Vec::new();
    for e in evs {
        match e.kind {
            Kind::Send(x) => {
                open_send.insert(x.src, e.t);
            }
            Kind::Deliver(x) => delivered.entry((x.src, x.dst)).or_default().push_back(e.t),
            Kind::Reply(x) => {
                if let Some(d) = delivered
                    .get_mut(&(x.src, x.dst))
                    .and_then(|q| q.pop_front())
                {
                    handling
                        .entry((x.src, x.dst))
                        .or_default()
                        .push_back((d, e.t));
                    spans.push(span("handle", d, e.t.saturating_sub(d), x.dst));
                }
            }
            Kind::Complete(Exchange { src, dst, err }) => {
                let Some(ts) = open_send.remove(&src) else {
                    continue;
                };
                let dur = e.t.saturating_sub(ts);
                spans.push(span(
                    if err { "send (failed)" } else { "send" },
                    ts,
                    dur,
                    src,
                ));
                if err {
                    continue;
                }
                total.push(dur);
                if let Some((d, r)) = handling.get_mut(&(src, dst)).and_then(|q| q.pop_front()) {
                    if d >= ts && r <= e.t {
                        request.push(d - ts);
                        handler.push(r - d);
                        response.push(e.t - r);
                    }
                }
            }
            Kind::Tx(_) | Kind::Rx(_) => {}
        }
    }
    ([total, request, handler, response], spans)
}

/// Characterizes trace `files`: prints the report (as JSON if `json`),
/// writes charts to `out` and a Chrome trace to `chrome` if given, and
/// returns the report.
pub fn report_files(
    files: &[PathBuf],
    json: bool,
    out: Option<&Path>,
    chrome: Option<&Path>,
) -> Result<TraceReport, String> {
    let (evs, bad) = load(files)?;
    let (Some(first), Some(last)) = (evs.first(), evs.last()) else {
        return Err("no trace events in the given files".into());
    };
    let t0 = first.t;
    let span_us = last.t - t0;
    let datagrams = |want_tx: bool| {
        evs.iter().filter_map(move |e| match e.kind {
            Kind::Tx(d) if want_tx => Some((e, d)),
            Kind::Rx(d) if !want_tx => Some((e, d)),
            _ => None,
        })
    };
    let tx: Vec<(&Event, Datagram)> = datagrams(true).collect();

    // 1. Sizes of messages sent, by count and by bytes.
    let msgs: Vec<(&Event, Datagram)> = tx
        .iter()
        .copied()
        .filter(|(_, d)| matches!(d.packet, Packet::RemoteSend | Packet::RemoteReply))
        .collect();
    let total_n = msgs.len() as u64;
    let total_b: u64 = msgs.iter().map(|(_, d)| d.len).sum();
    let sizes: Vec<SizeBin> = SIZE_BINS
        .iter()
        .map(|&(lo, hi, name)| {
            let inb = msgs.iter().filter(|(_, d)| d.len >= lo && d.len <= hi);
            SizeBin {
                bin: name.into(),
                count: inb.clone().count() as u64,
                bytes: inb.map(|(_, d)| d.len).sum(),
            }
        })
        .collect();

    // 2. Destination matrix: messages from host to host.
    let mut matrix: BTreeMap<(u16, u16), u64> = BTreeMap::new();
    for (_, d) in &msgs {
        *matrix.entry((host_of(d.src), host_of(d.dst))).or_default() += 1;
    }

    // 3. Rates over time (messages sent per 100 ms).
    let bin = 100_000u64;
    let nbins = (span_us / bin + 1) as usize;
    let mut rates = vec![0u64; nbins.min(100_000)];
    for (e, _) in &msgs {
        if let Some(r) = rates.get_mut(((e.t - t0) / bin) as usize) {
            *r += 1;
        }
    }

    // 4. Latency by phase.
    let (mut lat, spans) = phases(&evs);
    let names = [
        "whole exchange (Send → return)",
        "request (Send → Deliver)",
        "handler (Deliver → Reply)",
        "response (Reply → return)",
    ];
    let phases_us: Vec<PhaseLatency> = names
        .iter()
        .zip(lat.iter_mut())
        .map(|(name, v)| {
            let (median, p99) = median_p99(v);
            PhaseLatency {
                phase: name.to_string(),
                median,
                p99,
                n: v.len(),
            }
        })
        .collect();

    // 5. Conservation: datagrams sent by host A to host B against those B
    //    received from A (only pairs whose both ends are in the traces).
    let traced: std::collections::BTreeSet<u16> = evs.iter().map(|e| e.host).collect();
    let mut sent: BTreeMap<(u16, u16), u64> = BTreeMap::new();
    let mut got: BTreeMap<(u16, u16), u64> = BTreeMap::new();
    for (e, d) in &tx {
        // Before its host id is allocated a host traces as 0000.
        if d.dst >> 16 != 0 && e.host != 0 {
            *sent.entry((e.host, host_of(d.dst))).or_default() += 1;
        }
    }
    for (e, d) in datagrams(false) {
        *got.entry((host_of(d.src), e.host)).or_default() += 1;
    }
    let conservation: Vec<Conservation> = sent
        .iter()
        .filter(|((_, to), _)| traced.contains(to))
        .map(|(&(from, to), &n)| {
            let r = got.get(&(from, to)).copied().unwrap_or(0);
            Conservation {
                from: hex4(from),
                to: hex4(to),
                sent: n,
                received: r,
                dropped: n.saturating_sub(r),
            }
        })
        .collect();

    let report = TraceReport {
        events: evs.len(),
        unparsed_lines: bad,
        span_us,
        messages: total_n,
        message_bytes: total_b,
        sizes,
        matrix: matrix
            .iter()
            .map(|(&(f, t), &n)| MatrixCell {
                from: hex4(f),
                to: hex4(t),
                messages: n,
            })
            .collect(),
        rates_per_100ms: rates,
        phases_us,
        conservation,
    };
    if json {
        crate::outln!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
    } else {
        print_report(&report);
    }
    if let Some(dir) = out {
        charts(&report, dir)?;
    }
    if let Some(path) = chrome {
        let mut events = spans;
        for (e, d) in &tx {
            events.push(ChromeEvent {
                name: format!("{:?}", d.packet),
                ph: "i",
                ts: e.t,
                dur: None,
                s: Some("t"),
                pid: hex4(e.host),
                tid: format!("{:08x}", d.src),
                args: Some(ChromeArgs {
                    dst: format!("{:08x}", d.dst),
                    seq: d.seq,
                    len: d.len,
                }),
            });
        }
        let doc = ChromeTrace {
            trace_events: events,
            display_time_unit: "ns",
        };
        let text = serde_json::to_string(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        crate::outln!("chrome trace: {}", path.display());
    }
    Ok(report)
}

/// rates.svg (a line over time) and sizes.svg (bars per size bin).
fn charts(r: &TraceReport, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let rates = vec![(
        "messages per 100 ms".to_string(),
        r.rates_per_100ms
            .iter()
            .enumerate()
            .map(|(i, &n)| (i as f64 * 0.1, n as f64))
            .collect(),
    )];
    chart::lines(
        &dir.join("rates.svg"),
        "Message rate",
        "time (s)",
        "messages / 100 ms",
        &rates,
        false,
    )?;
    let share = |f: fn(&SizeBin) -> u64, total: u64| -> Vec<(String, f64)> {
        r.sizes
            .iter()
            .map(|s| (s.bin.clone(), pct(f(s), total)))
            .collect()
    };
    chart::bars(
        &dir.join("sizes.svg"),
        "Message sizes (sent RemoteSend/RemoteReply datagrams)",
        "size bin",
        "%",
        &[
            ("% of messages".to_string(), share(|s| s.count, r.messages)),
            (
                "% of bytes".to_string(),
                share(|s| s.bytes, r.message_bytes),
            ),
        ],
    )?;
    crate::outln!(
        "charts: {}/rates.svg, {}/sizes.svg",
        dir.display(),
        dir.display()
    );
    Ok(())
}

fn print_report(r: &TraceReport) {
    crate::outln!(
        "trace: {} events over {:.2} s; {} messages, {} bytes",
        r.events,
        r.span_us as f64 / 1e6,
        r.messages,
        r.message_bytes
    );
    crate::outln!("\nmessage sizes (sent)          count       %        bytes       %");
    for s in &r.sizes {
        crate::outln!(
            "  {:<22} {:>10} {:>6.1}% {:>12} {:>6.1}%",
            s.bin,
            s.count,
            pct(s.count, r.messages),
            s.bytes,
            pct(s.bytes, r.message_bytes)
        );
    }
    crate::outln!("  (Solaris MC: 80% of messages were 68–256 B)");
    crate::outln!("\ndestination matrix (messages)");
    for m in &r.matrix {
        crate::outln!("  {} → {}  {:>10}", m.from, m.to, m.messages);
    }
    let rates = &r.rates_per_100ms;
    let peak = rates.iter().copied().max().unwrap_or(0);
    let mean = rates.iter().sum::<u64>() as f64 / rates.len().max(1) as f64;
    crate::outln!(
        "\nrate: mean {:.0} messages/s, peak {} messages/s (100 ms bins)",
        mean * 10.0,
        peak * 10
    );
    crate::outln!("\nrequest–response latency by phase (µs)      median      p99        n");
    for p in &r.phases_us {
        crate::outln!("  {:<38} {:>10} {:>8} {:>8}", p.phase, p.median, p.p99, p.n);
    }
    if let (Some(whole), Some(hand)) = (r.phases_us.first(), r.phases_us.get(2)) {
        if hand.median > 0 {
            crate::outln!(
                "  whole / handler: {:.1}×   (Solaris MC: a request cost 6.4× its handler)",
                whole.median as f64 / hand.median as f64
            );
        }
    }
    crate::outln!("\nconservation (datagrams sent vs received, per host pair)");
    if r.conservation.is_empty() {
        crate::outln!("  (needs the traces of both ends of a pair)");
    }
    for c in &r.conservation {
        let flag = if c.dropped > 0 {
            format!("  <- {} dropped", c.dropped)
        } else {
            String::new()
        };
        crate::outln!(
            "  {} → {}: sent {:>8} received {:>8}{flag}",
            c.from,
            c.to,
            c.sent,
            c.received
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vkernel::trace::Datagram;

    #[test]
    fn report_of_a_two_host_exchange() {
        let (a, b) = (0x0001_0001u32, 0x0002_0001u32);
        let dg = |src, dst, len| Datagram {
            packet: Packet::RemoteSend,
            src,
            dst,
            seq: 1,
            len,
        };
        let x = Exchange {
            src: a,
            dst: b,
            err: false,
        };
        let evs = [
            (10, 1, Kind::Send(x)),
            (11, 1, Kind::Tx(dg(a, b, 100))),
            (14, 2, Kind::Rx(dg(a, b, 100))),
            (15, 2, Kind::Deliver(x)),
            (17, 2, Kind::Reply(x)),
            (18, 2, Kind::Tx(dg(b, a, 5000))),
            (21, 1, Kind::Rx(dg(b, a, 5000))),
            (22, 1, Kind::Complete(x)),
        ];
        let dir = std::env::temp_dir().join(format!("vkbench-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.jsonl");
        let mut text: String = evs
            .iter()
            .map(|&(t, host, kind)| serde_json::to_string(&Event { t, host, kind }).unwrap() + "\n")
            .collect();
        text.push_str("not json\n");
        std::fs::write(&f, text).unwrap();
        let r = report_files(&[f], true, Some(&dir), None).unwrap();
        assert_eq!((r.events, r.unparsed_lines, r.messages), (8, 1, 2));
        assert_eq!(r.message_bytes, 5100);
        assert_eq!(r.phases_us[0].median, 12);
        assert_eq!(r.phases_us[2].median, 2);
        assert_eq!(r.conservation.len(), 2);
        assert!(r.conservation.iter().all(|c| c.dropped == 0));
        assert!(dir.join("sizes.svg").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
