//! `vkernel demo`: two logical hosts on this machine find each other,
//! exchange messages and move data, and print what they measured next to
//! raw UDP between the same threads in the same [`Mode`].

use std::time::{Duration, Instant};

use vkernel::{FaultConfig, Scope};

use crate::stats::Summary;
use crate::vkbench::{self, Op};
use crate::{baseline, Mode};

/// What the demonstration does.
#[derive(Clone, Debug)]
pub struct Demo {
    /// Timed exchanges per row.
    pub count: usize,
    /// Bytes for the MoveTo/MoveFrom rows.
    pub bulk: usize,
    /// Block instead of busy-polling while waiting.
    pub block: bool,
    /// Do not pin the client and server threads to CPUs 0 and 1.
    pub unpinned: bool,
    /// Faults for the bad-network transfer (default: 5% loss).
    pub fault: Option<FaultConfig>,
    /// The id the server registers under and the client looks up.
    pub server_name: u32,
}

fn row(name: &str, s: &Summary, note: &str) {
    crate::outln!(
        "  {name:<38} {:>9.2} {:>9.2} {:>9.2}   {note}",
        s.min_us,
        s.median_us,
        s.p99_us
    );
}

/// Runs the demonstration.
pub fn run(a: &Demo) -> Result<(), String> {
    let pl = Mode::new(!a.unpinned, !a.block);
    let n = a.count.max(100);
    let warm = (n / 10).max(100);
    crate::outln!("vkernel demo: two logical hosts on this machine, talking over loopback UDP");
    // Baselines first, while no vkernel thread exists to compete for CPUs.
    let raw = baseline::udp_rtt(32, n, warm, pl)?;
    let raw4k = baseline::udp_rtt(4096 + 76, n / 2, warm, pl)?;
    let blast = baseline::udp_blast(a.bulk, vkernel_proto::wire::MAX_DATAGRAM, pl, 3)?.mbps;
    let t = Instant::now();
    let (ka, kb) = vkbench::host_pair(pl, FaultConfig::default())?;
    crate::outln!(
        "  host {} on {} and host {} on {}: ids allocated by announcement–complaint in {:.0} ms",
        ka.host_id(),
        ka.local_addr(),
        kb.host_id(),
        kb.local_addr(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let (spid, sh) = vkbench::start_server(&ka, pl)?;
    let reg = ka.create_process().map_err(|e| e.to_string())?;
    reg.set_pid(a.server_name, spid, Scope::Any);
    let asker = kb.create_process().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let found = asker
        .get_pid(a.server_name, Scope::Remote)
        .map_err(|e| e.to_string())?;
    if found != spid {
        return Err(format!("GetPid found {found}, expected {spid}"));
    }
    crate::outln!(
        "  host {} found \"demo-server\" = pid {} by GetPid (remote scope) in {:.2} ms",
        kb.host_id(),
        found,
        t.elapsed().as_secs_f64() * 1e3
    );
    crate::outln!("  placement: {}", pl.describe());
    crate::outln!();
    crate::outln!(
        "  {:<38} {:>9} {:>9} {:>9}",
        "operation (µs)",
        "min",
        "median",
        "p99"
    );
    let gt = Summary::of(&mut vkbench::get_time(&ka, n, pl)?);
    row("GetTime (null kernel operation)", &gt, "");
    // Local: client and server on host A.
    let mut local = vkbench::exchanges(&ka, spid, Op::Null, n, warm, pl)?;
    let local = Summary::of(&mut local);
    row("local Send-Receive-Reply", &local, "");
    let mut remote = vkbench::exchanges(&kb, spid, Op::Null, n, warm, pl)?;
    let remote = Summary::of(&mut remote);
    row("remote Send-Receive-Reply", &remote, "");
    row("raw UDP round trip, 32 B (baseline)", &raw, "");
    let remote_op = |op| -> Result<Summary, String> {
        let mut v = vkbench::exchanges(&kb, spid, op, n / 2, warm, pl)?;
        Ok(Summary::of(&mut v))
    };
    let pr = remote_op(Op::PageRead(4096))?;
    row("remote 4 KiB page read (reply+segment)", &pr, "");
    let pw = remote_op(Op::PageWrite(4096))?;
    row("remote 4 KiB page write (send+segment)", &pw, "");
    row("raw UDP round trip, 4172 B (baseline)", &raw4k, "");
    crate::outln!();
    crate::outln!(
        "  remote / raw UDP round trip (median): {:.2}×   local exchange median: {:.2} µs",
        remote.median_us / raw.median_us.max(1e-9),
        local.median_us
    );
    let s = kb.stats();
    let exchanges = s.remote_exchanges.max(1);
    crate::outln!(
        "  datagrams per remote exchange: {:.2} (sent {} + received {} by the client host for {} exchanges)",
        (s.tx.iter().sum::<u64>() + s.rx.iter().sum::<u64>()) as f64 / exchanges as f64,
        s.tx.iter().sum::<u64>(),
        s.rx.iter().sum::<u64>(),
        exchanges
    );
    // Bulk.
    crate::outln!();
    let mb = |bytes: usize, d: Duration| bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6;
    let to = vkbench::bulk(&kb, spid, a.bulk, true, pl)?;
    let from = vkbench::bulk(&kb, spid, a.bulk, false, pl)?;
    for (what, r) in [("MoveTo:  ", &to), ("MoveFrom:", &from)] {
        crate::outln!(
            "  {} MiB {what} {:8.1} MB/s  ({}), {:.2}× raw UDP blast",
            a.bulk >> 20,
            mb(r.bytes, r.elapsed),
            if r.intact { "intact" } else { "CORRUPT" },
            mb(r.bytes, r.elapsed) / blast.max(1e-9)
        );
    }
    crate::outln!(
        "  raw UDP blast, {} B datagrams:  {:8.1} MB/s (baseline)",
        vkernel_proto::wire::MAX_DATAGRAM,
        blast
    );
    vkbench::stop_server(&asker, spid, sh);
    drop(reg);
    // The same transfer on a network losing 5% of datagrams.
    let lossy = a.fault.clone().unwrap_or(FaultConfig {
        loss: 0.05,
        seed: 5,
        ..FaultConfig::default()
    });
    let (la, lb) = vkbench::host_pair(pl, lossy.clone())?;
    let (lpid, lh) = vkbench::start_server(&la, pl)?;
    let lto = vkbench::bulk(&lb, lpid, a.bulk, true, pl)?;
    let lfrom = vkbench::bulk(&lb, lpid, a.bulk, false, pl)?;
    crate::outln!(
        "  with injected faults ({}): MoveTo {:.1} MB/s ({}), MoveFrom {:.1} MB/s ({}); {} chunks retransmitted",
        crate::describe_faults(&lossy),
        mb(lto.bytes, lto.elapsed),
        if lto.intact { "intact" } else { "CORRUPT" },
        mb(lfrom.bytes, lfrom.elapsed),
        if lfrom.intact { "intact" } else { "CORRUPT" },
        la.stats().bulk_retransmits + lb.stats().bulk_retransmits
    );
    let c = lb.create_process().map_err(|e| e.to_string())?;
    vkbench::stop_server(&c, lpid, lh);
    if !(to.intact && from.intact && lto.intact && lfrom.intact) {
        return Err("a bulk transfer was corrupted".into());
    }
    Ok(())
}
