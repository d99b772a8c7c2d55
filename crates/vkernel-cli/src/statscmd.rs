//! `vkernel stats`: a live view of logical hosts' counters, read by message
//! from their kernel servers (so remote hosts work the same as this one).

use std::time::{Duration, Instant};

use serde_json::Value;
use vkernel::{HostId, Kernel};

use crate::hostopts::{auth_hint, HostOpts};

/// Arguments of `vkernel stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    host: HostOpts,
    /// Logical host ids (hex) to read; default: every host that answers a
    /// query to the kernel-server group.
    #[arg(value_parser = parse_host)]
    hosts: Vec<HostId>,
    /// Print the JSON documents (one per line) instead of a table.
    #[arg(long)]
    json: bool,
    /// Refresh every this long, showing rates since the previous view.
    #[arg(long, value_parser = vkernel::net::parse_duration)]
    watch: Option<Duration>,
    /// Number of views with --watch.
    #[arg(long, default_value_t = 10)]
    count: usize,
}

fn parse_host(s: &str) -> Result<HostId, String> {
    u16::from_str_radix(s.trim_start_matches("0x"), 16)
        .ok()
        .map(HostId)
        .filter(|h| h.is_valid())
        .ok_or_else(|| format!("`{s}` is not a logical host id (hex, 1..7fff)"))
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn sum(v: &Value) -> u64 {
    v.as_object()
        .map_or(0, |o| o.values().filter_map(Value::as_u64).sum())
}

/// Runs `vkernel stats`.
pub fn run(a: StatsArgs) -> Result<(), String> {
    let k = Kernel::start(a.host.config()).map_err(|e| format!("cannot start host: {e}"))?;
    let p = k.create_process().map_err(|e| e.to_string())?;
    let hosts: Vec<HostId> = if a.hosts.is_empty() {
        let mut hs: Vec<HostId> = p
            .select_hosts(256, Duration::from_millis(300), f64::NEG_INFINITY)
            .map_err(|e| format!("no host answered: {e}{}", auth_hint(&k)))?
            .iter()
            .map(|h| h.kernel_server.host())
            .filter(|&h| h != k.host_id())
            .collect();
        hs.sort();
        if hs.is_empty() {
            hs.push(k.host_id());
        }
        hs
    } else {
        a.hosts.clone()
    };
    let views = if a.watch.is_some() { a.count.max(1) } else { 1 };
    let mut prev: Vec<Option<(Instant, Value)>> = vec![None; hosts.len()];
    for view in 0..views {
        if view > 0 {
            std::thread::sleep(a.watch.unwrap_or_default());
        }
        if !a.json {
            println!(
                "{:>6} {:>6} {:>7} {:>7} {:>12} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8} {:>10} {:>10}",
                "host", "procs", "aliens", "queued", "datagrams rx", "datagrams tx", "remote ex", "local ex",
                "retx", "dups", "drops", "rem p50 µs", "rem p99 µs"
            );
        }
        for (i, &h) in hosts.iter().enumerate() {
            let doc = match p.host_stats(h) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("host {h}: {e}");
                    continue;
                }
            };
            if a.json {
                println!("{doc}");
                continue;
            }
            let v: Value = serde_json::from_str(&doc).map_err(|e| format!("host {h}: {e}"))?;
            let now = Instant::now();
            let rate = |k: &str, cur: u64| -> String {
                match &prev[i] {
                    Some((t, pv)) => {
                        let dt = now.duration_since(*t).as_secs_f64().max(1e-9);
                        format!("{:.0}/s", cur.saturating_sub(n(pv, k)) as f64 / dt)
                    }
                    None => cur.to_string(),
                }
            };
            let rx = sum(&v["datagrams_rx"]);
            let tx = sum(&v["datagrams_tx"]);
            let rx_s = match &prev[i] {
                Some((t, pv)) => format!(
                    "{:.0}/s",
                    rx.saturating_sub(sum(&pv["datagrams_rx"])) as f64
                        / now.duration_since(*t).as_secs_f64().max(1e-9)
                ),
                None => rx.to_string(),
            };
            let tx_s = match &prev[i] {
                Some((t, pv)) => format!(
                    "{:.0}/s",
                    tx.saturating_sub(sum(&pv["datagrams_tx"])) as f64
                        / now.duration_since(*t).as_secs_f64().max(1e-9)
                ),
                None => tx.to_string(),
            };
            println!(
                "{:>6} {:>6} {:>7} {:>7} {:>12} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8} {:>10} {:>10}",
                v["host"].as_str().unwrap_or("?"),
                n(&v, "processes"),
                n(&v, "aliens_in_use"),
                n(&v, "queued_messages"),
                rx_s,
                tx_s,
                rate("remote_exchanges", n(&v, "remote_exchanges")),
                rate("local_exchanges", n(&v, "local_exchanges")),
                n(&v, "retransmits") + n(&v, "bulk_retransmits"),
                n(&v, "duplicates"),
                sum(&v["drops"]) + sum(&v["auth_rejects"]),
                n(&v["remote_latency_us"], "p50"),
                n(&v["remote_latency_us"], "p99"),
            );
            prev[i] = Some((now, v));
        }
    }
    Ok(())
}
