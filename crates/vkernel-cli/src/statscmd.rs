//! `vkernel stats`: a live view of logical hosts' counters, read by message
//! from their kernel servers (so remote hosts work the same as this one).

use std::time::Duration;

use vkernel::HostId;
use vkernel_bench::hoststats::HostView;

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

/// Runs `vkernel stats`.
pub fn run(a: StatsArgs) -> Result<(), String> {
    let k = a.host.start()?;
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
    let mut views_of: Vec<HostView> = hosts.iter().map(|_| HostView::default()).collect();
    for view in 0..views {
        if view > 0 {
            std::thread::sleep(a.watch.unwrap_or_default());
        }
        if !a.json {
            println!("{}", HostView::HEADER);
        }
        for (&h, hv) in hosts.iter().zip(&mut views_of) {
            match p.host_stats(h) {
                Ok(doc) if a.json => println!("{doc}"),
                Ok(doc) => println!("{}", hv.row(&doc).map_err(|e| format!("host {h}: {e}"))?),
                Err(e) => eprintln!("host {h}: {e}"),
            }
        }
    }
    Ok(())
}
