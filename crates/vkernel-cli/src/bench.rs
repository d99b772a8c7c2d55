//! `vkernel bench`: vkernel against raw UDP on this machine, in one run,
//! with the same threads, placement and waiting strategy on both sides.
//! Rounds alternate between the two so drift in the machine hits both.

use std::time::Duration;

use vkernel::FaultConfig;

use crate::baseline;
use crate::stats::Summary;
use crate::vkbench::{self, Op, Placement};

/// Arguments of `vkernel bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Exchanges per round.
    #[arg(short = 'n', long, default_value_t = 20_000)]
    count: usize,
    /// Alternating rounds (vkernel, raw, vkernel, raw, ...).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Bytes per bulk transfer.
    #[arg(long, default_value_t = 64 << 20)]
    bulk: usize,
    /// Placements to run: any of spin, spin-pinned, block (comma-separated).
    #[arg(long, default_value = "spin,spin-pinned,block", value_delimiter = ',')]
    placements: Vec<String>,
    /// Faults for the bad-network transfers (default: 5% loss).
    #[arg(long, value_name = "SPEC", value_parser = FaultConfig::parse)]
    fault: Option<FaultConfig>,
    /// Write every figure as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
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

fn line(name: &str, s: &Summary) {
    println!(
        "  {name:<40} {:>9.2} {:>9.2} {:>9.2}",
        s.min_us, s.median_us, s.p99_us
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the benchmark.
pub fn run(a: BenchArgs) -> Result<(), String> {
    let n = a.count.max(100);
    let warm = (n / 10).max(100);
    let rounds = a.rounds.max(1);
    let mut report = Vec::new();
    for name in &a.placements {
        let pl = placement(name)?;
        progress(&format!("placement {name}: {}", pl.describe()));
        let (ka, kb) = vkbench::host_pair(pl, FaultConfig::default())?;
        let (spid, sh) = vkbench::start_server(&ka, pl)?;
        let (mut local, mut remote, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        let mut raw_meds = Vec::new();
        for r in 0..rounds {
            progress(&format!("  round {}/{rounds}: exchanges", r + 1));
            local.extend(vkbench::exchanges(&ka, spid, Op::Null, n, warm, pl)?);
            remote.extend(vkbench::exchanges(&kb, spid, Op::Null, n, warm, pl)?);
            let rs = baseline::udp_rtt(32, n, warm, pl)?;
            raw_meds.push(rs.median_us);
            raw.push(rs);
        }
        let gt = Summary::of(&mut vkbench::get_time(&ka, n, pl)?);
        let local = Summary::of(&mut local);
        let remote = Summary::of(&mut remote);
        let raw_median = median(&mut raw_meds);
        let raw_p99 = median(&mut raw.iter().map(|s| s.p99_us).collect::<Vec<_>>());
        println!();
        println!("placement: {}", pl.describe());
        println!(
            "  {:<40} {:>9} {:>9} {:>9}",
            "operation (µs)", "min", "median", "p99"
        );
        line("GetTime", &gt);
        line("local Send-Receive-Reply (32 B)", &local);
        line("remote Send-Receive-Reply (32 B)", &remote);
        println!(
            "  {:<40} {:>9} {:>9.2} {:>9.2}",
            "raw UDP round trip (32 B), per-round med", "", raw_median, raw_p99
        );
        println!(
            "  remote / raw UDP: median {:.2}×, p99 {:.2}×",
            remote.median_us / raw_median.max(1e-9),
            remote.p99_us / raw_p99.max(1e-9)
        );
        // Bulk (the same kernels), alternating with the raw blast.
        let mb = |b: usize, d: Duration| b as f64 / d.as_secs_f64().max(1e-9) / 1e6;
        let (mut to, mut from, mut blast) = (Vec::new(), Vec::new(), Vec::new());
        let mut intact = true;
        for r in 0..rounds {
            progress(&format!(
                "  round {}/{rounds}: {} MiB transfers",
                r + 1,
                a.bulk >> 20
            ));
            let t = vkbench::bulk(&kb, spid, a.bulk, true, pl)?;
            let f = vkbench::bulk(&kb, spid, a.bulk, false, pl)?;
            intact &= t.intact && f.intact;
            to.push(mb(t.bytes, t.elapsed));
            from.push(mb(f.bytes, f.elapsed));
            blast.push(baseline::udp_blast(
                a.bulk,
                vkernel_proto::wire::MAX_DATAGRAM,
                pl,
            )?);
        }
        let c = kb.create_process().map_err(|e| e.to_string())?;
        vkbench::stop_server(&c, spid, sh);
        drop(c);
        drop((ka, kb));
        let (to_m, from_m, blast_m) = (median(&mut to), median(&mut from), median(&mut blast));
        println!(
            "  {} MiB MoveTo {:.0} MB/s ({:.2}× blast), MoveFrom {:.0} MB/s ({:.2}× blast), raw UDP blast {:.0} MB/s; {}",
            a.bulk >> 20,
            to_m,
            to_m / blast_m.max(1e-9),
            from_m,
            from_m / blast_m.max(1e-9),
            blast_m,
            if intact { "data intact" } else { "DATA CORRUPT" }
        );
        let lossy = a.fault.clone().unwrap_or(FaultConfig {
            loss: 0.05,
            seed: 5,
            ..FaultConfig::default()
        });
        progress(&format!(
            "  transfers with faults: {}",
            crate::demo::describe(&lossy)
        ));
        let (la, lb) = vkbench::host_pair(pl, lossy.clone())?;
        let (lpid, lh) = vkbench::start_server(&la, pl)?;
        let lt = vkbench::bulk(&lb, lpid, a.bulk, true, pl)?;
        let lf = vkbench::bulk(&lb, lpid, a.bulk, false, pl)?;
        println!(
            "  with faults ({}): MoveTo {:.0} MB/s ({}), MoveFrom {:.0} MB/s ({})",
            crate::demo::describe(&lossy),
            mb(lt.bytes, lt.elapsed),
            if lt.intact { "intact" } else { "CORRUPT" },
            mb(lf.bytes, lf.elapsed),
            if lf.intact { "intact" } else { "CORRUPT" },
        );
        let c = lb.create_process().map_err(|e| e.to_string())?;
        vkbench::stop_server(&c, lpid, lh);
        report.push(serde_json::json!({
            "placement": name,
            "description": pl.describe(),
            "get_time": gt,
            "local_null": local,
            "remote_null": remote,
            "raw_udp_rtt_median_us": raw_median,
            "raw_udp_rtt_p99_us": raw_p99,
            "remote_over_raw_median": remote.median_us / raw_median.max(1e-9),
            "bulk_bytes": a.bulk,
            "move_to_mbps": to, "move_from_mbps": from, "raw_blast_mbps": blast,
            "intact": intact,
            "faults": crate::demo::describe(&lossy),
            "lossy_move_to_mbps": mb(lt.bytes, lt.elapsed),
            "lossy_move_from_mbps": mb(lf.bytes, lf.elapsed),
            "lossy_intact": lt.intact && lf.intact,
        }));
        if !(intact && lt.intact && lf.intact) {
            return Err("a bulk transfer delivered wrong bytes".into());
        }
    }
    if let Some(path) = a.json {
        let j = serde_json::json!({ "count": n, "rounds": rounds, "results": report });
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&j).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        progress(&format!("wrote {}", path.display()));
    }
    Ok(())
}
