//! `vkernel bench`: the papers' tables on this machine, with the published
//! figures beside today's and raw UDP/TCP measured in the same run with the
//! same threads, placement and waiting strategy.
//!
//! Method: N timed iterations after a warm-up, medians and p99 (never
//! means), clock overhead subtracted from each sample, CPU per operation
//! from each side's thread CPU clock (the modern busywork counter) in a
//! second pass with blocking waits. Ratios are only meaningful within one run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vkernel::{FaultConfig, GroupMode, Kernel};
use vkernel_proto::Pid;

use crate::baseline;
use crate::chart;
use crate::paper::{self, fmt, Row};
use crate::stats::Summary;
use crate::vkbench::{self, Op, Placement};

/// Arguments of `vkernel bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Sections to run (1 penalty, 2 kernel ops, 3 page access,
    /// 4 sequential access, 5 program loading, 6 load, 7 peers, 8 process
    /// groups, 9 observability, 10 network disk, 11 file service, 12 security).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,3,4,5,6,7,8,9,10,11,12"
    )]
    pub sections: Vec<u8>,
    /// Small counts and sizes: finishes in well under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Timed iterations per measurement (default 5000; 500 with --quick).
    #[arg(short = 'n', long)]
    pub count: Option<usize>,
    /// Placement and waiting: spin (busy-poll, unpinned), spin-pinned
    /// (client CPU 0, server CPU 1), or block.
    #[arg(long, default_value = "spin")]
    pub placement: String,
    /// Faults for the bad-network transfer row (default: 5% loss).
    #[arg(long, value_name = "SPEC", value_parser = FaultConfig::parse)]
    pub fault: Option<FaultConfig>,
    /// Directory for bench.json and the SVG charts.
    #[arg(long, default_value = "vkernel-bench-out")]
    pub out: PathBuf,
    /// Also write the JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            sections: vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
            quick: false,
            count: None,
            placement: "spin".into(),
            fault: None,
            out: PathBuf::from("vkernel-bench-out"),
            json: None,
        }
    }
}

fn placement(name: &str) -> Result<Placement, String> {
    Ok(match name {
        "spin" => Placement {
            pinned: false,
            spin: true,
        },
        "spin-pinned" => Placement {
            pinned: true,
            spin: true,
        },
        "block" => Placement {
            pinned: false,
            spin: false,
        },
        _ => {
            return Err(format!(
                "unknown placement `{name}` (spin, spin-pinned, block)"
            ))
        }
    })
}

fn progress(s: &str) {
    eprintln!("vkernel bench: {s}");
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Ctx {
    pl: Placement,
    n: usize,
    warm: usize,
    quick: bool,
    ka: Kernel,
    kb: Kernel,
    server: Pid,
    /// One-way penalty fit (µs per byte, µs), from section 1 or measured on demand.
    fit: Option<(f64, f64)>,
}

impl Ctx {
    fn penalty(&mut self, bytes: usize) -> Result<f64, String> {
        if self.fit.is_none() {
            self.fit = Some(penalty_fit(self, &[76, 1100, 4172])?.0);
        }
        let (a, b) = self.fit.unwrap_or((0.0, 0.0));
        Ok(a * bytes as f64 + b)
    }

    fn timed(&self, local: bool, op: Op, n: usize) -> Result<vkbench::Timed, String> {
        let k = if local { &self.ka } else { &self.kb };
        vkbench::timed(k, self.server, op, n, (n / 10).max(20), self.pl)
    }
}

fn penalty_fit(c: &Ctx, sizes: &[usize]) -> Result<((f64, f64), Vec<Value>), String> {
    let mut pts = Vec::new();
    let mut rows = Vec::new();
    for &s in sizes {
        let r = baseline::udp_rtt(s, c.n, c.warm, c.pl)?;
        pts.push((s as f64, r.median_us / 2.0));
        rows.push(json!({"bytes": s, "rtt": r, "one_way_median_us": r.median_us / 2.0}));
    }
    let fit = vkernel_bench::linear_fit(&pts).ok_or("penalty fit needs two sizes")?;
    Ok((fit, rows))
}

fn section_penalty(c: &mut Ctx) -> Result<Value, String> {
    println!(
        "\n1. Network penalty (Table 4-1/3-1): raw UDP, memory to memory, one way = round trip / 2"
    );
    let sizes: &[usize] = if c.quick {
        &[64, 1024, 8192, 65000]
    } else {
        &[64, 128, 256, 512, 1024, 1472, 4096, 8192, 65000]
    };
    let (fit, rows) = penalty_fit(c, sizes)?;
    println!(
        "  {:>7} {:>12} {:>12} {:>12} {:>14}",
        "bytes", "one-way µs", "RTT p99 µs", "1985 ms", "1985/today"
    );
    for r in &rows {
        let b = r["bytes"].as_u64().unwrap_or(0) as usize;
        let ow = r["one_way_median_us"].as_f64().unwrap_or(0.0);
        let p99 = r["rtt"]["p99_us"].as_f64().unwrap_or(0.0);
        let old = paper::PENALTY_1985.iter().find(|p| p.0 == b).map(|p| p.1);
        let ratio = old.map_or("-".into(), |o| format!("{:.0}×", o * 1e3 / ow.max(1e-9)));
        println!(
            "  {b:>7} {ow:>12.2} {p99:>12.2} {:>12} {ratio:>14}",
            fmt(old)
        );
    }
    println!(
        "  fit: P(n) = {:.5}·n + {:.2} µs   (1983, 3 Mb/8 MHz: {:.1}·n + {:.0} µs)",
        fit.0,
        fit.1,
        paper::PENALTY_FIT_1983.0 * 1e3,
        paper::PENALTY_FIT_1983.1 * 1e3
    );
    c.fit = Some(fit);
    Ok(json!({"rows": rows, "fit_us_per_byte": fit.0, "fit_us": fit.1}))
}

fn table_header() {
    println!(
        "  {:<26} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>7}",
        "µs (ms for papers)",
        "local",
        "remote",
        "diff",
        "penalty",
        "client",
        "server",
        "rem p99",
        "r/l",
        "(r-l)/P"
    );
}

/// Measures one operation locally and remotely and prints a row like the
/// papers', with the published rows under it.
fn op_row(
    c: &mut Ctx,
    name: &str,
    op: Op,
    minus_null: Option<&Value>,
    penalty_bytes: usize,
    papers: &[(&str, Row)],
) -> Result<Value, String> {
    let n = c.n;
    let l = c.timed(true, op, n)?;
    let r = c.timed(false, op, n)?;
    let mut ls = l.samples.clone();
    let mut rs = r.samples.clone();
    let (ls, rs) = (Summary::of(&mut ls), Summary::of(&mut rs));
    // Move rows: the enclosing Send-Receive-Reply's time and CPU come off.
    let sub = |k: &str| minus_null.and_then(|v| v[k].as_f64()).unwrap_or(0.0);
    let (lm, rm) = (
        ls.median_us - sub("local_us"),
        rs.median_us - sub("remote_us"),
    );
    let (ccpu, scpu) = (
        us(r.client_cpu) - sub("client_cpu_us"),
        us(r.server_cpu) - sub("server_cpu_us"),
    );
    let pen = c.penalty(penalty_bytes)?;
    // A local Move row is a difference of two medians; when it is within
    // the noise of that subtraction (or below zero) a ratio means nothing.
    let rl = if lm > 0.05 {
        format!("{:.1}", rm / lm)
    } else {
        "-".into()
    };
    println!(
        "  {name:<26} {lm:>8.2} {rm:>8.2} {:>8.2} {pen:>8.2} {:>8.2} {:>8.2} {:>8.2} {rl:>6} {:>7.2}",
        rm - lm,
        ccpu,
        scpu,
        rs.p99_us,
        (rm - lm) / pen.max(1e-9)
    );
    for (who, p) in papers {
        let diff = match (p.local, p.remote) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        };
        let ratio = match (p.local, p.remote) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.1}", b / a),
            _ => "-".into(),
        };
        let per_pen = match (diff, p.penalty) {
            (Some(d), Some(pp)) if pp > 0.0 => format!("{:.2}", d / pp),
            _ => "-".into(),
        };
        println!(
            "    {who:<24} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {ratio:>6} {per_pen:>7}",
            fmt(p.local),
            fmt(p.remote),
            fmt(diff),
            fmt(p.penalty),
            fmt(p.client),
            fmt(p.server),
            ""
        );
    }
    Ok(json!({
        "op": name, "local": ls, "remote": rs, "local_us": lm, "remote_us": rm,
        "penalty_us": pen, "client_cpu_us": ccpu, "server_cpu_us": scpu,
        "local_client_cpu_us": us(l.client_cpu), "local_server_cpu_us": us(l.server_cpu),
    }))
}

fn section_kernel_ops(c: &mut Ctx) -> Result<Value, String> {
    println!("\n2. Kernel operations (Tables 5-1/5-2, 3-5..3-8); Move rows exclude the enclosing exchange");
    table_header();
    let mut gt = vkbench::get_time(&c.ka, c.n, c.pl)?;
    let gt = Summary::of(&mut gt);
    println!(
        "  {:<26} {:>8.3}   (1983: {} ms)",
        "GetTime",
        gt.median_us,
        paper::GET_TIME_1983
    );
    let mut rows = vec![json!({"op": "GetTime", "local": gt})];
    let null = op_row(
        c,
        "Send-Receive-Reply",
        Op::Null,
        None,
        76,
        &[
            ("1983 8MHz/3Mb", paper::SRR_1983),
            ("1985 10MHz/10Mb", paper::SRR_1985),
        ],
    )?;
    let base = null.clone();
    // The same exchange as a user gets it from the README's commands,
    // beside the placement's row (same run).
    let mut d = vkbench::default_exchanges(c.n, c.warm)?;
    let d = Summary::of(&mut d);
    let placed = null["remote"]["median_us"].as_f64().unwrap_or(0.0);
    println!(
        "    {:<24} {:>8} {:>8.2}   p99 {:.2} µs; {:.2}× the row above ({})",
        "  defaults, unpinned",
        "",
        d.median_us,
        d.p99_us,
        d.median_us / placed.max(1e-9),
        vkbench::default_waiting()
    );
    rows.push(json!({"op": "Send-Receive-Reply, defaults", "remote": d, "waiting": vkbench::default_waiting()}));
    rows.push(null);
    rows.push(op_row(
        c,
        "MoveFrom 1 KiB",
        Op::MoveFrom(1024),
        Some(&base),
        1024 + 76,
        &[
            ("1983", paper::MOVE_FROM_1983),
            ("1985", paper::MOVE_FROM_1985),
        ],
    )?);
    rows.push(op_row(
        c,
        "MoveTo 1 KiB",
        Op::MoveTo(1024),
        Some(&base),
        1024 + 76,
        &[("1983", paper::MOVE_TO_1983), ("1985", paper::MOVE_TO_1985)],
    )?);
    println!("  message size (request and reply each carry it):");
    let sizes: &[usize] = if c.quick {
        &[32, 1024, 8192]
    } else {
        &[32, 128, 512, 1024, 4096, 8192]
    };
    for &s in sizes {
        let op = if s <= 32 { Op::Null } else { Op::Echo(s - 32) };
        rows.push(op_row(
            c,
            &format!("exchange {s} B"),
            op,
            None,
            s + 76,
            &[],
        )?);
    }
    Ok(json!({"rows": rows}))
}

fn section_pages(c: &mut Ctx) -> Result<Value, String> {
    println!("\n3. Page-level file access (Table 6-1, 3-9/3-10): two datagrams per page");
    table_header();
    let mut rows = Vec::new();
    for &n in &[512usize, 4096] {
        let papers: Vec<(&str, Row)> = if n == 512 {
            vec![("1985 10Mb", paper::PAGE_READ_1985)]
        } else {
            vec![]
        };
        rows.push(op_row(
            c,
            &format!("page read {n} B"),
            Op::PageRead(n),
            None,
            n + 152,
            &papers,
        )?);
        let papers: Vec<(&str, Row)> = if n == 512 {
            vec![("1985 10Mb", paper::PAGE_WRITE_1985)]
        } else {
            vec![]
        };
        rows.push(op_row(
            c,
            &format!("page write {n} B"),
            Op::PageWrite(n),
            None,
            n + 152,
            &papers,
        )?);
        let t = op_row(
            c,
            &format!("Thoth write {n} B"),
            Op::ThothWrite(n),
            None,
            n + 228,
            &[],
        )?;
        let w = rows
            .last()
            .and_then(|r| r["remote_us"].as_f64())
            .unwrap_or(0.0);
        let tr = t["remote_us"].as_f64().unwrap_or(0.0);
        println!(
            "    segment saving per remote page write: {:.2} µs ({:.0}%); 1985: {:.1} ms",
            tr - w,
            (tr - w) / tr.max(1e-9) * 100.0,
            paper::THOTH_WRITE_1985 - paper::PAGE_WRITE_1985.remote.unwrap_or(0.0)
        );
        rows.push(t);
    }
    Ok(json!({"rows": rows}))
}

fn section_sequential(c: &mut Ctx) -> Result<Value, String> {
    println!("\n4. Sequential access (Table 6-2): server read-ahead waits a disk latency after each reply");
    println!(
        "  {:>10} {:>14} {:>12} {:>14}",
        "latency ms", "ms per page", "% above min", "1983 ms/page"
    );
    let pages = if c.quick { 4 } else { 20 };
    let mut rows = Vec::new();
    for &d in &[0.1f64, 1.0, 10.0, 15.0, 20.0] {
        let op = Op::SeqRead {
            n: 512,
            delay_us: (d * 1e3) as u32,
        };
        let t = c.timed(false, op, pages)?;
        let mut s = t.samples.clone();
        let s = Summary::of(&mut s);
        let per = s.median_us / 1e3;
        let old = paper::SEQUENTIAL_1983
            .iter()
            .find(|p| p.0 == d)
            .map(|p| p.1);
        println!(
            "  {d:>10.1} {per:>14.3} {:>11.1}% {:>14}",
            (per - d) / d * 100.0,
            fmt(old)
        );
        rows.push(json!({"latency_ms": d, "per_page": s}));
    }
    Ok(json!({"rows": rows}))
}

fn section_loading(c: &mut Ctx, lossy: &FaultConfig) -> Result<Value, String> {
    println!(
        "\n5. Program loading (Table 6-3, 3-11/3-12): 64 KiB read by MoveTo in transfer units"
    );
    println!(
        "  {:<12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}   1985 local/remote/client/server ms",
        "unit", "local ms", "remote ms", "diff", "client", "server", "MB/s",
    );
    let reps = if c.quick { 5 } else { 30 };
    let mut rows = Vec::new();
    for &(kib, l0, r0, c0, s0) in &paper::LOADING_1985 {
        let op = Op::Load {
            total: 64 << 10,
            unit: kib << 10,
        };
        let l = c.timed(true, op, reps)?;
        let r = c.timed(false, op, reps)?;
        let (mut a, mut b) = (l.samples.clone(), r.samples.clone());
        let (ls, rs) = (Summary::of(&mut a), Summary::of(&mut b));
        let mbps = 65536.0 / rs.median_us.max(1e-9);
        println!(
            "  {:<12} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10.1}   {l0}/{r0}/{c0}/{s0}",
            format!("{kib} KiB"),
            ls.median_us / 1e3,
            rs.median_us / 1e3,
            (rs.median_us - ls.median_us) / 1e3,
            ms(r.client_cpu),
            ms(r.server_cpu),
            mbps
        );
        rows.push(
            json!({"unit_kib": kib, "local": ls, "remote": rs, "mbps": mbps,
            "client_cpu_ms": ms(r.client_cpu), "server_cpu_ms": ms(r.server_cpu)}),
        );
    }
    let big: &[usize] = if c.quick {
        &[1 << 20, 8 << 20]
    } else {
        &[1 << 20, 64 << 20]
    };
    let mut images = Vec::new();
    for &total in big {
        let blast = baseline::udp_blast(total, vkernel_proto::wire::MAX_DATAGRAM, c.pl, 3)?;
        for unit in [64 << 10, total] {
            let op = Op::Load { total, unit };
            let r = c.timed(false, op, if c.quick { 2 } else { 5 })?;
            let mut s = r.samples.clone();
            let s = Summary::of(&mut s);
            let mbps = total as f64 / s.median_us.max(1e-9);
            let how = if unit == total {
                "one MoveTo".to_string()
            } else {
                format!("{} KiB MoveTo", unit >> 10)
            };
            println!(
                "  image {:>3} MiB by {how:<12} {:8.1} MB/s; raw UDP blast {:8.1} MB/s (loss {:.1}%): {:.2}×",
                total >> 20,
                mbps,
                blast.mbps,
                blast.loss * 100.0,
                mbps / blast.mbps.max(1e-9)
            );
            images.push(json!({
                "bytes": total, "unit": unit, "mbps": mbps, "n": s.n,
                "raw_blast_mbps": blast.mbps, "raw_blast_loss": blast.loss,
            }));
        }
    }
    // The same 64 MiB-class transfer on a bad network.
    let (la, lb) = vkbench::host_pair(c.pl, lossy.clone())?;
    let (lpid, lh) = vkbench::start_server(&la, c.pl)?;
    let total = if c.quick { 8 << 20 } else { 64 << 20 };
    let to = vkbench::bulk(&lb, lpid, total, true, c.pl)?;
    let from = vkbench::bulk(&lb, lpid, total, false, c.pl)?;
    let mb = |b: usize, d: Duration| b as f64 / d.as_secs_f64().max(1e-9) / 1e6;
    println!(
        "  with faults ({}): {} MiB MoveTo {:.1} MB/s ({}), MoveFrom {:.1} MB/s ({})",
        crate::demo::describe(lossy),
        total >> 20,
        mb(to.bytes, to.elapsed),
        if to.intact { "intact" } else { "CORRUPT" },
        mb(from.bytes, from.elapsed),
        if from.intact { "intact" } else { "CORRUPT" }
    );
    let cl = lb.create_process().map_err(|e| e.to_string())?;
    vkbench::stop_server(&cl, lpid, lh);
    if !(to.intact && from.intact) {
        return Err("a transfer on the faulty network delivered wrong bytes".into());
    }
    Ok(json!({"rows": rows, "images": images,
        "faulty": {"faults": crate::demo::describe(lossy), "move_to_mbps": mb(to.bytes, to.elapsed),
                   "move_from_mbps": mb(from.bytes, from.elapsed), "intact": true}}))
}

fn section_load(c: &mut Ctx) -> Result<Value, String> {
    println!("\n6. Load: concurrent exchanges, blocking waits (spinning k threads on 2 CPUs would only measure the scheduler)");
    let dur = if c.quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };
    let block = Placement {
        pinned: false,
        spin: false,
    };
    let (ka, kb) = vkbench::host_pair(block, FaultConfig::default())?;
    let mut rows = Vec::new();
    println!(
        "  {:<26} {:>12} {:>18}",
        "configuration", "exchanges/s", "server CPU µs/exch"
    );
    // Up to 8 (full run): past the point where two CPUs saturate.
    let configs: &[(usize, bool)] = if c.quick {
        &[(1, false), (2, false), (4, false), (2, true), (4, true)]
    } else {
        &[
            (1, false),
            (2, false),
            (4, false),
            (8, false),
            (1, true),
            (2, true),
            (4, true),
            (8, true),
        ]
    };
    for &(k, shared) in configs {
        let servers: Vec<(Pid, std::thread::JoinHandle<()>)> = (0..if shared { 1 } else { k })
            .map(|_| vkbench::start_server(&ka, block))
            .collect::<Result<_, _>>()?;
        let probe = kb.create_process().map_err(|e| e.to_string())?;
        let cpu0: Duration = servers
            .iter()
            .map(|(s, _)| vkbench::server_cpu(&probe, *s))
            .sum::<Result<Duration, String>>()?;
        let deadline = Instant::now() + dur;
        let counts: Vec<usize> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..k)
                .map(|j| {
                    let target = servers[if shared { 0 } else { j }].0;
                    let p = kb.create_process();
                    sc.spawn(move || -> Result<usize, String> {
                        let p = p.map_err(|e| e.to_string())?;
                        let mut done = 0;
                        while Instant::now() < deadline {
                            let mut m = vkernel::Message::with_code(1);
                            p.send(&mut m, target).map_err(|e| e.to_string())?;
                            done += 1;
                        }
                        Ok(done)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("load client panicked".into()))
                })
                .collect::<Result<Vec<usize>, String>>()
        })?;
        let cpu1: Duration = servers
            .iter()
            .map(|(s, _)| vkbench::server_cpu(&probe, *s))
            .sum::<Result<Duration, String>>()?;
        let total: usize = counts.iter().sum();
        let rate = total as f64 / dur.as_secs_f64();
        let cpu = us(cpu1.saturating_sub(cpu0)) / total.max(1) as f64;
        let name = if shared {
            format!("1 server, {k} clients")
        } else {
            format!("{k} client/server pairs")
        };
        println!("  {name:<26} {rate:>12.0} {cpu:>18.2}");
        rows.push(json!({"config": name, "exchanges_per_s": rate, "server_cpu_us": cpu}));
        for (s, h) in servers {
            vkbench::stop_server(&probe, s, h);
        }
    }
    println!(
        "  (1985: a server saturated at ~{} exchanges/s)",
        paper::SERVER_LIMIT_1985
    );
    Ok(json!({"rows": rows, "seconds": dur.as_secs_f64()}))
}

/// Rounds in which section 7 alternates vkernel remote and raw UDP.
const PEER_ROUNDS: usize = 5;

fn section_peers(c: &mut Ctx) -> Result<(Value, Vec<chart::Series>), String> {
    println!("\n7. Peers, same run, same sizes, same placement: round trip µs (median / p99)");
    let sizes: &[usize] = if c.quick {
        &[32, 1024, 8192]
    } else {
        &[32, 256, 1024, 4096, 8192]
    };
    println!(
        "  {:>6} {:>15} {:>15} {:>15} {:>15} {:>15} {:>15}  {:>7} {:>7} {:>7} {:>7}",
        "bytes",
        "vkernel local",
        "vkernel remote",
        "raw UDP",
        "TCP NODELAY",
        "ZeroMQ",
        "gRPC",
        "vk/UDP",
        "vk/TCP",
        "vk/ZMQ",
        "vk/gRPC"
    );
    let names = [
        "vkernel local",
        "vkernel remote",
        "raw UDP",
        "TCP",
        "ZeroMQ",
        "gRPC",
    ];
    let mut series: Vec<chart::Series> =
        names.iter().map(|s| (s.to_string(), Vec::new())).collect();
    let mut rows = Vec::new();
    // gRPC calls cost tens of µs: fewer of them keep the section short.
    let grpc_n = (c.n / 4).max(100);
    for &s in sizes {
        let op = if s <= 32 { Op::Null } else { Op::Echo(s - 32) };
        let mut l = vkbench::exchanges(&c.ka, c.server, op, c.n, c.warm, c.pl)?;
        // The headline ratio's two sides alternate in rounds, so a slow
        // spell of the machine falls on both rather than on one.
        let (mut r, mut u) = (Vec::new(), Vec::new());
        for _ in 0..PEER_ROUNDS {
            // Each round warms up in full (a fresh client process and
            // thread, fresh sockets).
            let (n, w) = (c.n / PEER_ROUNDS, c.warm);
            r.extend(vkbench::exchanges(&c.kb, c.server, op, n, w, c.pl)?);
            u.extend(baseline::udp_samples(s, n, w, c.pl)?);
        }
        let (l, r, u) = (
            Summary::of(&mut l),
            Summary::of(&mut r),
            Summary::of(&mut u),
        );
        let t = baseline::tcp_rtt(s, c.n, c.warm, c.pl)?;
        // A peer that fails is reported and left out, not fatal.
        let peer = |r: Result<Summary, String>| {
            r.unwrap_or_else(|e| {
                println!("  {s} B: {e}");
                Summary::of(&mut [])
            })
        };
        let z = peer(baseline::zmq_rtt(s, c.n, c.warm, c.pl));
        let g = peer(baseline::grpc_rtt(s, grpc_n, c.warm / 4, c.pl));
        let ratio = |x: &Summary| {
            if x.n == 0 {
                f64::NAN
            } else {
                r.median_us / x.median_us.max(1e-9)
            }
        };
        let cell = |x: &Summary| format!("{:.2} / {:.1}", x.median_us, x.p99_us);
        println!(
            "  {s:>6} {:>15} {:>15} {:>15} {:>15} {:>15} {:>15}  {:>6.2}× {:>6.2}× {:>6.2}× {:>6.2}×",
            cell(&l), cell(&r), cell(&u), cell(&t), cell(&z), cell(&g),
            ratio(&u), ratio(&t), ratio(&z), ratio(&g)
        );
        for (i, v) in [&l, &r, &u, &t, &z, &g].iter().enumerate() {
            if v.n > 0 {
                series[i].1.push((s as f64, v.median_us));
            }
        }
        rows.push(json!({
            "bytes": s, "vkernel_local": l, "vkernel_remote": r, "udp": u, "tcp": t,
            "zeromq": z, "grpc": g,
            "ratios": {"vk_udp": ratio(&u), "vk_tcp": ratio(&t), "vk_zmq": ratio(&z), "vk_grpc": ratio(&g)},
        }));
    }
    println!("  (vkernel remote and raw UDP: {PEER_ROUNDS} alternating rounds, pooled; ZeroMQ: libzmq REQ/REP over TCP; gRPC: tonic unary over HTTP/2, which always waits in its reactor)");
    Ok((json!({"rows": rows}), series))
}

fn section_groups(c: &mut Ctx) -> Result<Value, String> {
    println!("\n8. Process groups (thesis ch. 6): group Send beside one-to-one Send, same run");
    let g = vkernel::Pid::well_known_group(0x4242);
    let admin = c.kb.create_process().map_err(|e| e.to_string())?;
    admin.join_group(g, c.server).map_err(|e| e.to_string())?;
    let n = c.n.min(2000);
    let (mut one, _) = vkbench::group_sends(&c.kb, g, GroupMode::One, 1, n, c.warm, c.pl)?;
    let (mut direct, _) =
        vkbench::group_sends(&c.kb, c.server, GroupMode::One, 1, n, c.warm, c.pl)?;
    admin.leave_group(g, c.server).map_err(|e| e.to_string())?;
    let (one, direct) = (Summary::of(&mut one), Summary::of(&mut direct));
    println!(
        "  1-reply group Send, 1 remote member: {:.2} µs (p99 {:.1}); one-to-one Send to it: {:.2} µs (p99 {:.1}); group/one-to-one {:.2}×   (1985: both ≈ 2.2 ms)",
        one.median_us,
        one.p99_us,
        direct.median_us,
        direct.p99_us,
        one.median_us / direct.median_us.max(1e-9)
    );
    // Multi-reply gathering: members on two remote hosts, blocking waits
    // (eight spinning members would only measure the scheduler).
    let block = Placement {
        pinned: false,
        spin: false,
    };
    let kc = Kernel::start(vkernel::KernelConfig {
        peers: vec![c.ka.local_addr(), c.kb.local_addr()],
        spin: Duration::ZERO,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    c.kb.add_peer(kc.local_addr());
    c.ka.add_peer(kc.local_addr());
    let g = vkernel::Pid::well_known_group(0x4243);
    let mut servers = Vec::new();
    let mut rows = Vec::new();
    println!(
        "  {:>8} {:>16} {:>16} {:>20}",
        "members", "first reply µs", "all replies µs", "per extra reply µs"
    );
    let iters = if c.quick { 100 } else { 500 };
    let mut base = None;
    for want in [1usize, 2, 4, 8] {
        while servers.len() < want {
            let k = if servers.len() % 2 == 0 { &c.ka } else { &kc };
            let (pid, h) = vkbench::start_server(k, block)?;
            admin.join_group(g, pid).map_err(|e| e.to_string())?;
            servers.push((pid, h));
        }
        let (mut f, mut a) =
            vkbench::group_sends(&c.kb, g, GroupMode::Many, want, iters, iters / 10, c.pl)?;
        let (f, a) = (Summary::of(&mut f), Summary::of(&mut a));
        let b = *base.get_or_insert(a.median_us);
        let per = if want > 1 {
            (a.median_us - b) / (want - 1) as f64
        } else {
            0.0
        };
        println!(
            "  {want:>8} {:>9.2} / {:>4.0} {:>9.2} / {:>4.0} {:>20}",
            f.median_us,
            f.p99_us,
            a.median_us,
            a.p99_us,
            if want > 1 {
                format!("{per:.2}")
            } else {
                "-".into()
            }
        );
        rows.push(json!({"members": want, "first": f, "all": a, "per_extra_reply_us": per}));
    }
    println!("  (1985, 10 Mb Ethernet: ~200 µs per additional reply)");
    for (pid, h) in servers {
        vkbench::stop_server(&admin, pid, h);
    }
    Ok(json!({
        "one_reply": one, "one_to_one": direct,
        "ratio": one.median_us / direct.median_us.max(1e-9),
        "multi_reply": rows,
    }))
}

fn section_observability(c: &mut Ctx, out: &std::path::Path) -> Result<Value, String> {
    println!(
        "\n9. Observability: the cost of metrics and tracing, and a traced characterization run"
    );
    let dir = out.join("trace");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files = [dir.join("host-a.jsonl"), dir.join("host-b.jsonl")];
    let mk = |metrics: bool, trace: bool| {
        vkbench::host_pair_with(c.pl, FaultConfig::default(), |i, k| {
            k.metrics = metrics;
            k.trace = trace.then(|| files[i].clone());
        })
    };
    let setups = [
        ("metrics off", mk(false, false)?),
        ("metrics on", mk(true, false)?),
        ("metrics + tracing", mk(true, true)?),
    ];
    let servers: Vec<_> = setups
        .iter()
        .map(|(_, (ka, _))| vkbench::start_server(ka, c.pl))
        .collect::<Result<_, _>>()?;
    // Alternate the three in rounds so drift hits them alike.
    let rounds = 4;
    let per = (c.n / rounds).max(50);
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); 3];
    for _ in 0..rounds {
        for (i, (_, (_, kb))) in setups.iter().enumerate() {
            samples[i].extend(vkbench::exchanges(
                kb,
                servers[i].0,
                Op::Null,
                per,
                c.warm / 4,
                c.pl,
            )?);
        }
    }
    let sums: Vec<Summary> = samples.iter_mut().map(|s| Summary::of(s)).collect();
    println!("  remote Send-Receive-Reply µs     median      p99   vs metrics off");
    let mut rows = Vec::new();
    for (i, (name, _)) in setups.iter().enumerate() {
        let r = sums[i].median_us / sums[0].median_us.max(1e-9);
        println!(
            "  {name:<30} {:>8.2} {:>8.1} {:>10.3}×",
            sums[i].median_us, sums[i].p99_us, r
        );
        rows.push(json!({"setup": name, "latency": sums[i], "ratio_vs_off": r}));
    }
    // A traced remote exchange writes 8 events: the datagram leaving and
    // arriving on each side (4) and the Send, Deliver, Reply and Complete
    // phases (4).
    let probe_ns = (sums[2].median_us - sums[1].median_us) * 1e3 / 8.0;
    println!(
        "  cost of one trace probe: ≈{probe_ns:.0} ns (latency added per exchange / 8 events)"
    );
    // A traced mixed workload on the traced pair: page reads and writes,
    // small exchanges, 64 KiB moves.
    let (ka, kb) = &setups[2].1;
    let sp = servers[2].0;
    let k = if c.quick { 100 } else { 500 };
    for (op, n) in [
        (Op::Null, k),
        (Op::PageRead(4096), k),
        (Op::PageWrite(512), k),
        (Op::Echo(200), k),
        (Op::MoveFrom(60_000), k / 10),
    ] {
        vkbench::exchanges(kb, sp, op, n, 0, c.pl)?;
        vkbench::exchanges(ka, sp, op, n / 4, 0, c.pl)?;
    }
    for ((_, (_, kb)), (pid, h)) in setups.iter().zip(servers) {
        // Each server is stopped from its own pair (the pairs do not know
        // each other).
        let probe = kb.create_process().map_err(|e| e.to_string())?;
        vkbench::stop_server(&probe, pid, h);
    }
    drop(setups);
    println!(
        "\n  characterization of the traced run (vkernel trace report {}/*.jsonl):",
        dir.display()
    );
    let report =
        crate::tracecmd::report_files(&files, false, Some(&dir), Some(&dir.join("chrome.json")))?;
    Ok(json!({"overhead": rows, "probe_ns": probe_ns, "characterization": report}))
}

/// Runs an external client tool; its wall time in seconds, or why not.
fn timed_tool(cmd: &mut std::process::Command) -> Result<(f64, String), String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let t = Instant::now();
    let o = cmd
        .output()
        .map_err(|e| format!("{name} not available ({e})"))?;
    if !o.status.success() {
        return Err(format!(
            "{name} failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        ));
    }
    Ok((
        t.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    ))
}

/// 4 KiB random-read IOPS of fio's nbd engine against `uri`.
fn fio_iops(uri: &str, secs: u32, rw: &str) -> Result<f64, String> {
    let (_, out) = timed_tool(std::process::Command::new("fio").args([
        "--name=vk",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        &format!("--rw={rw}"),
        "--bs=4k",
        "--iodepth=32",
        "--time_based",
        &format!("--runtime={secs}"),
        "--size=16M",
        "--verify_state_save=0",
        "--output-format=json",
    ]))?;
    // fio may print notes before the JSON document.
    let doc = out.find('{').map_or("", |i| &out[i..]);
    let j: Value = serde_json::from_str(doc).map_err(|e| format!("fio output: {e}"))?;
    let job = &j["jobs"][0];
    let side = if rw.contains("read") { "read" } else { "write" };
    job[side]["iops"]
        .as_f64()
        .ok_or_else(|| "fio reported no IOPS".to_string())
}

/// Rounds of the sequential nbdcopy rows (each run moves the whole disk:
/// tens of milliseconds).
const SEQ_ROUNDS: usize = 5;

fn section_disk(c: &mut Ctx) -> Result<Value, String> {
    use std::process::{Command, Stdio};
    use vkernel_disk::backing::{Backing, BackingSpec};
    println!("\n10. Network disk (VISA/IPdisk): the NBD gateway beside nbdkit's memory plugin, same client tools");
    let size: usize = if c.quick { 16 << 20 } else { 64 << 20 };
    let secs = if c.quick { 1 } else { 3 };
    // Disk hosts block while waiting: dozens of spinning V processes
    // would starve each other on two CPUs.
    let kc = |peers: Vec<std::net::SocketAddr>| vkernel::KernelConfig {
        peers,
        spin: Duration::ZERO,
        ..Default::default()
    };
    let a = Kernel::start(kc(vec![])).map_err(|e| e.to_string())?;
    let b = Kernel::start(kc(vec![a.local_addr()])).map_err(|e| e.to_string())?;
    a.add_peer(b.local_addr());
    let store = Backing::open(&BackingSpec::Ram(size as u64)).map_err(|e| e.to_string())?;
    let srv = vkernel_disk::server::DiskServer::start(
        &a,
        store,
        vkernel_disk::server::ServerConfig {
            owner_key: Some(7),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let client = std::sync::Arc::new(
        vkernel_disk::client::Client::open(&b, srv.pid(), 0, 7, 32).map_err(|e| e.to_string())?,
    );
    // The native client against the raw UDP blast.
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let mut back = vec![0u8; size];
    // Median of three passes each way, like the blast it is compared with
    // (one pass would also time the first touch of every page).
    let (mut ws, mut rs) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let t = Instant::now();
        client.write(0, &data, false).map_err(|e| e.to_string())?;
        ws.push(size as f64 / t.elapsed().as_secs_f64() / 1e6);
        back.fill(0);
        let t = Instant::now();
        client.read(0, &mut back).map_err(|e| e.to_string())?;
        rs.push(size as f64 / t.elapsed().as_secs_f64() / 1e6);
        if back != data {
            return Err("IPdisk read back different data".into());
        }
    }
    ws.sort_by(f64::total_cmp);
    rs.sort_by(f64::total_cmp);
    let (w, r) = (ws[1], rs[1]);
    let blast = baseline::udp_blast(size, vkernel_proto::wire::MAX_DATAGRAM, c.pl, 3)?;
    println!(
        "  native client, {} MiB (median of 3): write {w:.0} MB/s, read {r:.0} MB/s; raw UDP blast {:.0} MB/s (write {:.2}×, read {:.2}×)",
        size >> 20,
        blast.mbps,
        w / blast.mbps.max(1e-9),
        r / blast.mbps.max(1e-9)
    );
    // A gateway on a loopback port serving `dev`, and its URI.
    let gateway = |dev: std::sync::Arc<vkernel_disk::client::Client>| {
        let g = vkernel_disk::nbd::Gateway::start(
            &vkernel_disk::nbd::ListenAddr::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            vec![vkernel_disk::nbd::Export {
                name: "ipdisk".into(),
                description: "bench".into(),
                dev,
            }],
        )
        .map_err(|e| e.to_string())?;
        let uri = match g.addr() {
            vkernel_disk::nbd::ListenAddr::Tcp(a) => format!("nbd://{a}"),
            vkernel_disk::nbd::ListenAddr::Unix(p) => {
                format!("nbd+unix:///?socket={}", p.display())
            }
        };
        Ok::<_, String>((g, uri))
    };
    let (_gw, gw_uri) = gateway(client.clone())?;
    // The same gateway inside the disk's own logical host (`vkernel disk
    // --nbd`): its V IPC with the disk is local.
    let (_gw1, gw1_uri) = gateway(std::sync::Arc::new(
        vkernel_disk::client::Client::open(&a, srv.pid(), 0, 7, 32).map_err(|e| e.to_string())?,
    ))?;
    // The same two-host gateway as a user gets it from the README's
    // commands: `KernelConfig::default()` waiting (adaptive spin) on both.
    let da = Kernel::start(vkernel::KernelConfig::default()).map_err(|e| e.to_string())?;
    let db = Kernel::start(vkernel::KernelConfig {
        peers: vec![da.local_addr()],
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    da.add_peer(db.local_addr());
    let dsrv = vkernel_disk::server::DiskServer::start(
        &da,
        Backing::open(&BackingSpec::Ram(size as u64)).map_err(|e| e.to_string())?,
        vkernel_disk::server::ServerConfig {
            owner_key: Some(7),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let (_gwd, gwd_uri) = gateway(std::sync::Arc::new(
        vkernel_disk::client::Client::open(&db, dsrv.pid(), 0, 7, 32).map_err(|e| e.to_string())?,
    ))?;
    // nbdkit's memory plugin on a free port, stopped with the section.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let nbdkit = Command::new("nbdkit")
        .args([
            "-f",
            "--exit-with-parent",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "memory",
        ])
        .arg(format!("{size}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut rows = Vec::new();
    let kit_uri = format!("nbd://127.0.0.1:{port}");
    let mut nbdkit = match nbdkit {
        Ok(ch) => Some(ch),
        Err(e) => {
            println!("  nbdkit not available ({e}): the gateway is measured alone");
            None
        }
    };
    std::thread::sleep(Duration::from_millis(300));
    let dir = std::env::temp_dir().join(format!("vkbench-disk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let img = dir.join("src.img");
    std::fs::write(&img, &data).map_err(|e| e.to_string())?;
    println!(
        "  {:<34} {:>15} {:>15} {:>15} {:>15} {:>7} {:>7} {:>7}",
        "client tool",
        "gateway 2 hosts",
        "gateway 1 host",
        "2 hosts default",
        "nbdkit memory",
        "ratio",
        "ratio",
        "ratio"
    );
    let targets: Vec<(&str, String)> = [
        ("gateway", gw_uri.clone()),
        ("gateway1", gw1_uri),
        ("gateway-defaults", gwd_uri),
    ]
    .into_iter()
    .chain(nbdkit.as_ref().map(|_| ("nbdkit", kit_uri.clone())))
    .collect();
    // The targets take turns, `rounds` times, and each row is the median
    // of its target's runs: a slow spell of the machine then falls on all
    // of them rather than on whichever ran during it.
    let mut measure = |label: &str,
                       rounds: usize,
                       f: &dyn Fn(&str) -> Result<f64, String>,
                       unit: &str| {
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
        let mut failed = vec![false; targets.len()];
        for _ in 0..rounds.max(1) {
            for (k, (_, u)) in targets.iter().enumerate() {
                if failed[k] {
                    continue;
                }
                match f(u) {
                    Ok(v) => runs[k].push(v),
                    Err(e) => {
                        println!("  {label}: {e}");
                        failed[k] = true;
                    }
                }
            }
        }
        let vals: Vec<Option<f64>> = runs
            .into_iter()
            .zip(&failed)
            .map(|(mut v, &bad)| {
                if bad || v.is_empty() {
                    return None;
                }
                v.sort_by(f64::total_cmp);
                Some(v[v.len() / 2])
            })
            .collect();
        let g = vals.first().copied().flatten();
        let g1 = vals.get(1).copied().flatten();
        let gd = vals.get(2).copied().flatten();
        let k = vals.get(3).copied().flatten();
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} {unit}"));
        let ratio = |g: Option<f64>| match (g, k) {
            (Some(g), Some(k)) if k > 0.0 => format!("{:.2}×", g / k),
            _ => "-".into(),
        };
        println!(
            "  {label:<34} {:>15} {:>15} {:>15} {:>15} {:>7} {:>7} {:>7}",
            fmt(g),
            fmt(g1),
            fmt(gd),
            fmt(k),
            ratio(g),
            ratio(g1),
            ratio(gd)
        );
        rows.push(json!({"test": label, "gateway": g, "gateway_same_host": g1, "gateway_defaults": gd, "nbdkit": k, "unit": unit}));
    };
    let mb = size as f64 / 1e6;
    let img_s = img.to_string_lossy().into_owned();
    measure(
        "nbdcopy write (sequential)",
        SEQ_ROUNDS,
        &|u: &str| {
            timed_tool(Command::new("nbdcopy").args([img_s.as_str(), u])).map(|(t, _)| mb / t)
        },
        "MB/s",
    );
    measure(
        "nbdcopy read (sequential)",
        SEQ_ROUNDS,
        &|u: &str| timed_tool(Command::new("nbdcopy").args([u, "null:"])).map(|(t, _)| mb / t),
        "MB/s",
    );
    measure(
        "fio 4 KiB random read, depth 32",
        1,
        &|u: &str| fio_iops(u, secs, "randread"),
        "IOPS",
    );
    measure(
        "fio 4 KiB random write, depth 32",
        1,
        &|u: &str| fio_iops(u, secs, "randwrite"),
        "IOPS",
    );
    if let Some(ch) = nbdkit.as_mut() {
        let _ = ch.kill();
        let _ = ch.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("  (sequential rows: the targets take turns, five rounds, median of each; \"2 hosts\": disk and gateway on two logical hosts of this process, the V hop over UDP; \"1 host\": the gateway in the disk's logical host, as `vkernel disk --nbd`; both with blocking waits; \"2 hosts default\": as \"2 hosts\" with the waiting a user gets without flags, {}; ratios against nbdkit)", vkbench::default_waiting());
    Ok(json!({
        "native": {"write_mbps": w, "read_mbps": r, "raw_blast_mbps": blast.mbps, "bytes": size},
        "tools": rows,
    }))
}

fn section_security(c: &mut Ctx) -> Result<Value, String> {
    println!(
        "\n12. Security: the cost of authenticated datagrams (same placement, alternating rounds)"
    );
    let key = vkernel_proto::auth::Key {
        id: 1,
        secret: [0x42; 32],
    };
    let mk = |keyed: bool, encrypt: bool| {
        vkbench::host_pair_with(c.pl, FaultConfig::default(), |_, k| {
            if keyed {
                k.keys = vec![key.clone()];
            }
            k.encrypt = encrypt;
        })
    };
    let setups = [
        ("no key", mk(false, false)?),
        ("MAC (BLAKE3)", mk(true, false)?),
        ("AEAD (ChaCha20-Poly1305)", mk(true, true)?),
    ];
    let servers: Vec<_> = setups
        .iter()
        .map(|(_, (ka, _))| vkbench::start_server(ka, c.pl))
        .collect::<Result<_, _>>()?;
    let rounds = 4;
    let per = (c.n / rounds).max(50);
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); 3];
    let mut mbps: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let bulk = if c.quick { 8 << 20 } else { 64 << 20 };
    for _ in 0..rounds {
        for (i, (_, (_, kb))) in setups.iter().enumerate() {
            samples[i].extend(vkbench::exchanges(
                kb,
                servers[i].0,
                Op::Null,
                per,
                c.warm / 4,
                c.pl,
            )?);
            let r = vkbench::bulk(kb, servers[i].0, bulk, true, c.pl)?;
            if !r.intact {
                return Err(format!("{}: MoveTo data differ", setups[i].0));
            }
            mbps[i].push(bulk as f64 / r.elapsed.as_secs_f64().max(1e-9) / 1e6);
        }
    }
    let sums: Vec<Summary> = samples.iter_mut().map(|s| Summary::of(s)).collect();
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let mb: Vec<f64> = mbps.iter_mut().map(med).collect();
    println!(
        "  {:<26} {:>10} {:>8} {:>10} {:>14} {:>10}",
        "setup",
        "median µs",
        "p99 µs",
        "vs no key",
        format!("{} MiB MoveTo", bulk >> 20),
        "vs no key"
    );
    let mut rows = Vec::new();
    for (i, (name, _)) in setups.iter().enumerate() {
        let r = sums[i].median_us / sums[0].median_us.max(1e-9);
        let rb = mb[i] / mb[0].max(1e-9);
        println!(
            "  {name:<26} {:>10.2} {:>8.1} {:>9.3}× {:>9.0} MB/s {:>9.2}×",
            sums[i].median_us, sums[i].p99_us, r, mb[i], rb
        );
        rows.push(json!({"setup": name, "latency": sums[i], "ratio_vs_off": r, "moveto_mbps": mb[i], "moveto_ratio": rb}));
    }
    println!("  (target: exchanges with a MAC at most 1.10× the unauthenticated ones)");
    for ((_, (_, kb)), (pid, h)) in setups.iter().zip(servers) {
        let probe = kb.create_process().map_err(|e| e.to_string())?;
        vkbench::stop_server(&probe, pid, h);
    }
    Ok(json!({"rows": rows, "bulk_bytes": bulk}))
}

/// Runs the benchmark.
pub fn run(a: BenchArgs) -> Result<(), String> {
    let pl = placement(&a.placement)?;
    let n = a.count.unwrap_or(if a.quick { 500 } else { 5000 }).max(20);
    for s in &a.sections {
        if !(1..=12).contains(s) {
            return Err(format!("unknown section {s} (1..=12)"));
        }
    }
    let started = Instant::now();
    println!("vkernel bench — the V papers' measurements on this machine");
    println!(
        "method: {n} timed iterations after {} warm-up, medians and p99, clock overhead ({} ns) subtracted; {}; vkernel and raw baselines use the same threads and waiting",
        (n / 10).max(20),
        crate::stats::clock_overhead().as_nanos(),
        pl.describe()
    );
    println!(
        "client/server columns: CPU µs per operation from each thread's CPU clock, in a second pass with blocking waits on both sides"
    );
    println!("papers' figures are ms on 1983/1985 hardware; today's are µs unless marked");
    let (ka, kb) = vkbench::host_pair(pl, FaultConfig::default())?;
    let (server, sh) = vkbench::start_server(&ka, pl)?;
    let mut c = Ctx {
        pl,
        n,
        warm: (n / 10).max(20),
        quick: a.quick,
        ka,
        kb,
        server,
        fit: None,
    };
    let lossy = a.fault.clone().unwrap_or(FaultConfig {
        loss: 0.05,
        seed: 5,
        ..FaultConfig::default()
    });
    let mut out = serde_json::Map::new();
    let mut peer_series = Vec::new();
    let mut load_series = Vec::new();
    for s in &a.sections {
        progress(&format!(
            "section {s} ({:.0} s so far)",
            started.elapsed().as_secs_f64()
        ));
        let v = match s {
            1 => section_penalty(&mut c)?,
            2 => section_kernel_ops(&mut c)?,
            3 => section_pages(&mut c)?,
            4 => section_sequential(&mut c)?,
            5 => {
                let v = section_loading(&mut c, &lossy)?;
                if let Some(rows) = v["rows"].as_array() {
                    load_series = rows
                        .iter()
                        .map(|r| {
                            (
                                r["unit_kib"].as_f64().unwrap_or(0.0),
                                r["mbps"].as_f64().unwrap_or(0.0),
                            )
                        })
                        .collect();
                }
                v
            }
            6 => section_load(&mut c)?,
            8 => section_groups(&mut c)?,
            9 => section_observability(&mut c, &a.out)?,
            10 => section_disk(&mut c)?,
            12 => section_security(&mut c)?,
            11 => {
                let per_byte = (c.penalty(4172)? - c.penalty(76)?) / 4096.0;
                crate::fsbench::section(c.quick, c.n.min(2000), per_byte)?
            }
            _ => {
                let (v, series) = section_peers(&mut c)?;
                peer_series = series;
                v
            }
        };
        out.insert(format!("section{s}"), v);
    }
    let probe = c.kb.create_process().map_err(|e| e.to_string())?;
    vkbench::stop_server(&probe, c.server, sh);
    let doc = json!({
        "placement": a.placement, "description": pl.describe(), "count": n, "quick": a.quick,
        "seconds": started.elapsed().as_secs_f64(), "sections": out,
    });
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    let jpath = a.out.join("bench.json");
    std::fs::write(&jpath, &text).map_err(|e| format!("{}: {e}", jpath.display()))?;
    if let Some(p) = &a.json {
        std::fs::write(p, &text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let mut files = vec![jpath.display().to_string()];
    if !peer_series.is_empty() {
        let p = a.out.join("latency.svg");
        chart::lines(
            &p,
            "Round trip vs message size (median)",
            "bytes",
            "µs",
            &peer_series,
            true,
        )?;
        files.push(p.display().to_string());
    }
    if !load_series.is_empty() {
        let p = a.out.join("loading.svg");
        chart::lines(
            &p,
            "Program loading, 64 KiB by MoveTo: throughput vs transfer unit",
            "transfer unit (KiB)",
            "MB/s",
            &[("vkernel remote".to_string(), load_series)],
            true,
        )?;
        files.push(p.display().to_string());
    }
    println!(
        "\nwrote {} in {:.0} s",
        files.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
