//! `vkernel trace report FILE...`: the Solaris MC style characterization of
//! recorded traces (`--trace FILE` on any command that starts a host):
//! message sizes by count and bytes, the destination matrix, rates over
//! time, the request–response latency by phase, and the conservation check
//! (datagrams sent against datagrams received per host pair; gaps are
//! drops). Optionally SVG charts and a Chrome trace-event file (Perfetto,
//! chrome://tracing).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::chart;

/// Arguments of `vkernel trace`.
#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    #[command(subcommand)]
    cmd: TraceCmd,
}

#[derive(clap::Subcommand, Debug)]
enum TraceCmd {
    /// Characterize one or more trace files (one per logical host is best:
    /// the conservation check needs both ends).
    Report(ReportArgs),
}

#[derive(clap::Args, Debug)]
struct ReportArgs {
    /// Trace files written with --trace.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write charts (sizes.svg, rates.svg) to this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also export the exchanges as Chrome trace-event JSON (opens in
    /// Perfetto / chrome://tracing).
    #[arg(long, value_name = "FILE")]
    chrome: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// One parsed trace line.
#[derive(Clone, Debug)]
struct Ev {
    t: u64,
    host: String,
    ev: String,
    ty: String,
    src: u32,
    dst: u32,
    seq: u32,
    len: u64,
    err: bool,
}

fn hex(v: &Value) -> u32 {
    v.as_str()
        .and_then(|s| u32::from_str_radix(s, 16).ok())
        .unwrap_or(0)
}

fn load(files: &[PathBuf]) -> Result<(Vec<Ev>, usize), String> {
    let mut evs = Vec::new();
    let mut bad = 0;
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                bad += 1;
                continue;
            };
            evs.push(Ev {
                t: v["t"].as_u64().unwrap_or(0),
                host: v["h"].as_str().unwrap_or("?").to_string(),
                ev: v["ev"].as_str().unwrap_or("").to_string(),
                ty: v["type"].as_str().unwrap_or("").to_string(),
                src: hex(&v["src"]),
                dst: hex(&v["dst"]),
                seq: v["seq"].as_u64().unwrap_or(0) as u32,
                len: v["len"].as_u64().unwrap_or(0),
                err: v["err"].as_bool().unwrap_or(false),
            });
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

fn host_of(pid: u32) -> String {
    format!("{:04x}", (pid >> 16) & 0x7fff)
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

/// Runs `vkernel trace`.
pub fn run(a: TraceArgs) -> Result<(), String> {
    match a.cmd {
        TraceCmd::Report(r) => report(r),
    }
}

fn report(a: ReportArgs) -> Result<(), String> {
    report_files(&a.files, a.json, a.out.as_deref(), a.chrome.as_deref()).map(|_| ())
}

/// Characterizes trace `files`: prints the report (as JSON if `json`),
/// writes charts to `out` and a Chrome trace to `chrome` if given, and
/// returns the report document.
pub fn report_files(
    files: &[PathBuf],
    json: bool,
    out: Option<&std::path::Path>,
    chrome: Option<&std::path::Path>,
) -> Result<Value, String> {
    let (evs, bad) = load(files)?;
    if evs.is_empty() {
        return Err("no trace events in the given files".into());
    }
    let t0 = evs[0].t;
    let span_us = evs.last().map_or(0, |e| e.t) - t0;
    let is_msg = |e: &Ev| e.ty == "RemoteSend" || e.ty == "RemoteReply";
    let tx: Vec<&Ev> = evs.iter().filter(|e| e.ev == "tx").collect();
    let rx: Vec<&Ev> = evs.iter().filter(|e| e.ev == "rx").collect();

    // 1. Sizes of messages sent, by count and by bytes.
    let msgs: Vec<&&Ev> = tx.iter().filter(|e| is_msg(e)).collect();
    let total_n = msgs.len() as u64;
    let total_b: u64 = msgs.iter().map(|e| e.len).sum();
    let sizes: Vec<(String, u64, u64)> = SIZE_BINS
        .iter()
        .map(|&(lo, hi, name)| {
            let inb: Vec<_> = msgs.iter().filter(|e| e.len >= lo && e.len <= hi).collect();
            (
                name.to_string(),
                inb.len() as u64,
                inb.iter().map(|e| e.len).sum(),
            )
        })
        .collect();

    // 2. Destination matrix: messages from host to host.
    let mut matrix: BTreeMap<(String, String), u64> = BTreeMap::new();
    for e in &msgs {
        *matrix.entry((host_of(e.src), host_of(e.dst))).or_default() += 1;
    }

    // 3. Rates over time (messages sent per 100 ms).
    let bin = 100_000u64;
    let nbins = (span_us / bin + 1) as usize;
    let mut rates = vec![0u64; nbins.min(100_000)];
    for e in &msgs {
        let i = ((e.t - t0) / bin) as usize;
        if let Some(r) = rates.get_mut(i) {
            *r += 1;
        }
    }

    // 4. Latency by phase: match each sender's send → complete, and the
    //    receiver's deliver → reply, in order per (sender, receiver).
    let mut open_send: HashMap<u32, (u64, u32)> = HashMap::new();
    let mut delivered: HashMap<(u32, u32), VecDeque<u64>> = HashMap::new();
    let mut handling: HashMap<(u32, u32), VecDeque<(u64, u64)>> = HashMap::new();
    let (mut total, mut request, mut handler, mut response) = (vec![], vec![], vec![], vec![]);
    let mut spans: Vec<Value> = Vec::new();
    for e in &evs {
        match e.ev.as_str() {
            "send" => {
                open_send.insert(e.src, (e.t, e.dst));
            }
            "deliver" => delivered.entry((e.src, e.dst)).or_default().push_back(e.t),
            "reply" => {
                if let Some(d) = delivered
                    .get_mut(&(e.src, e.dst))
                    .and_then(|q| q.pop_front())
                {
                    handling
                        .entry((e.src, e.dst))
                        .or_default()
                        .push_back((d, e.t));
                    spans.push(json!({"name": "handle", "ph": "X", "ts": d, "dur": e.t - d,
                        "pid": host_of(e.dst), "tid": format!("{:08x}", e.dst)}));
                }
            }
            "complete" => {
                if let Some((ts, _)) = open_send.remove(&e.src) {
                    let dur = e.t.saturating_sub(ts);
                    spans.push(json!({"name": if e.err {"send (failed)"} else {"send"}, "ph": "X",
                        "ts": ts, "dur": dur, "pid": host_of(e.src), "tid": format!("{:08x}", e.src)}));
                    if e.err {
                        continue;
                    }
                    total.push(dur);
                    if let Some((d, r)) = handling
                        .get_mut(&(e.src, e.dst))
                        .and_then(|q| q.pop_front())
                    {
                        if d >= ts && r <= e.t {
                            request.push(d - ts);
                            handler.push(r - d);
                            response.push(e.t - r);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let phases = [
        (
            "whole exchange (Send → return)",
            median_p99(&mut total),
            total.len(),
        ),
        (
            "request (Send → Deliver)",
            median_p99(&mut request),
            request.len(),
        ),
        (
            "handler (Deliver → Reply)",
            median_p99(&mut handler),
            handler.len(),
        ),
        (
            "response (Reply → return)",
            median_p99(&mut response),
            response.len(),
        ),
    ];

    // 5. Conservation: datagrams sent by host A to host B against those B
    //    received from A (only pairs whose both ends are in the traces).
    let traced: std::collections::BTreeSet<&str> = evs.iter().map(|e| e.host.as_str()).collect();
    let mut sent: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut got: BTreeMap<(String, String), u64> = BTreeMap::new();
    for e in &tx {
        // Before its host id is allocated a host traces as 0000.
        if e.dst >> 16 != 0 && e.host != "0000" {
            *sent.entry((e.host.clone(), host_of(e.dst))).or_default() += 1;
        }
    }
    for e in &rx {
        *got.entry((host_of(e.src), e.host.clone())).or_default() += 1;
    }
    let mut conservation = Vec::new();
    for ((from, to), &n) in &sent {
        if !traced.contains(to.as_str()) {
            continue;
        }
        let r = got.get(&(from.clone(), to.clone())).copied().unwrap_or(0);
        conservation.push((from.clone(), to.clone(), n, r));
    }

    let doc = json!({
        "events": evs.len(), "unparsed_lines": bad, "span_us": span_us,
        "messages": total_n, "message_bytes": total_b,
        "sizes": sizes.iter().map(|(n, c, b)| json!({"bin": n, "count": c, "bytes": b})).collect::<Vec<_>>(),
        "matrix": matrix.iter().map(|((f, t), n)| json!({"from": f, "to": t, "messages": n})).collect::<Vec<_>>(),
        "rates_per_100ms": rates,
        "phases_us": phases.iter().map(|(n, (m, p), c)| json!({"phase": n, "median": m, "p99": p, "n": c})).collect::<Vec<_>>(),
        "conservation": conservation.iter().map(|(f, t, s, r)| json!({"from": f, "to": t, "sent": s, "received": r, "dropped": s.saturating_sub(*r)})).collect::<Vec<_>>(),
    });
    if json {
        println!("{doc}");
    } else {
        print_report(
            &doc,
            &sizes,
            total_n,
            total_b,
            &phases,
            &conservation,
            &rates,
        );
    }
    if let Some(dir) = out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let series = vec![(
            "messages per 100 ms".to_string(),
            rates
                .iter()
                .enumerate()
                .map(|(i, &r)| (i as f64 * 0.1, r as f64))
                .collect(),
        )];
        chart::lines(
            &dir.join("rates.svg"),
            "Message rate",
            "time (s)",
            "messages / 100 ms",
            &series,
            false,
        )?;
        let size_series = vec![
            (
                "% of messages".to_string(),
                sizes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (i as f64, pct(s.1, total_n)))
                    .collect(),
            ),
            (
                "% of bytes".to_string(),
                sizes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (i as f64, pct(s.2, total_b)))
                    .collect(),
            ),
        ];
        chart::lines(
            &dir.join("sizes.svg"),
            "Message sizes (bins: <68, 68-256, -1K, -4K, -16K, >16K)",
            "size bin",
            "%",
            &size_series,
            false,
        )?;
        println!(
            "charts: {}/rates.svg, {}/sizes.svg",
            dir.display(),
            dir.display()
        );
    }
    if let Some(path) = chrome {
        let mut events = spans;
        for e in &tx {
            events.push(json!({"name": e.ty, "ph": "i", "s": "t", "ts": e.t,
                "pid": e.host, "tid": format!("{:08x}", e.src),
                "args": {"dst": format!("{:08x}", e.dst), "seq": e.seq, "len": e.len}}));
        }
        let out = json!({"traceEvents": events, "displayTimeUnit": "ns"});
        std::fs::write(path, out.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("chrome trace: {}", path.display());
    }
    Ok(doc)
}

type Phases<'a> = [(&'a str, (u64, u64), usize); 4];

fn print_report(
    doc: &Value,
    sizes: &[(String, u64, u64)],
    total_n: u64,
    total_b: u64,
    phases: &Phases<'_>,
    conservation: &[(String, String, u64, u64)],
    rates: &[u64],
) {
    println!(
        "trace: {} events over {:.2} s; {} messages, {} bytes",
        doc["events"],
        doc["span_us"].as_u64().unwrap_or(0) as f64 / 1e6,
        total_n,
        total_b
    );
    println!("\nmessage sizes (sent)          count       %        bytes       %");
    for (n, c, b) in sizes {
        println!(
            "  {n:<22} {c:>10} {:>6.1}% {b:>12} {:>6.1}%",
            pct(*c, total_n),
            pct(*b, total_b)
        );
    }
    println!("  (Solaris MC: 80% of messages were 68–256 B)");
    println!("\ndestination matrix (messages)");
    if let Some(m) = doc["matrix"].as_array() {
        for r in m {
            println!(
                "  {} → {}  {:>10}",
                r["from"].as_str().unwrap_or("?"),
                r["to"].as_str().unwrap_or("?"),
                r["messages"]
            );
        }
    }
    let peak = rates.iter().copied().max().unwrap_or(0);
    let mean = if rates.is_empty() {
        0.0
    } else {
        rates.iter().sum::<u64>() as f64 / rates.len() as f64
    };
    println!(
        "\nrate: mean {:.0} messages/s, peak {} messages/s (100 ms bins)",
        mean * 10.0,
        peak * 10
    );
    println!("\nrequest–response latency by phase (µs)      median      p99        n");
    for (n, (m, p), c) in phases {
        println!("  {n:<38} {m:>10} {p:>8} {c:>8}");
    }
    let (whole, hand) = (phases[0].1 .0, phases[2].1 .0);
    if hand > 0 {
        println!(
            "  whole / handler: {:.1}×   (Solaris MC: a request cost 6.4× its handler)",
            whole as f64 / hand as f64
        );
    }
    println!("\nconservation (datagrams sent vs received, per host pair)");
    if conservation.is_empty() {
        println!("  (needs the traces of both ends of a pair)");
    }
    for (f, t, s, r) in conservation {
        let flag = if s > r {
            format!("  <- {} dropped", s - r)
        } else {
            String::new()
        };
        println!("  {f} → {t}: sent {s:>8} received {r:>8}{flag}");
    }
}
