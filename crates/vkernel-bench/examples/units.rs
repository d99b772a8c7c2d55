//! Section 5's image load for a profiler: `total` bytes moved by MoveTo in
//! units of `unit` bytes, a number of times, then MB/s (median) and the
//! mover host's bulk counters.
//!
//! `cargo run --release -p vkernel-bench --example units -- TOTAL_KIB UNIT_KIB N [block] [nowb] [wb=KIB] [dg=BYTES] [win=KIB] [shared]`
//! (`block`: blocking waits, else busy-polling; `nowb`: write-behind off;
//! `wb=KIB`: the write-behind bound; `dg=BYTES`: the hosts' datagram
//! size; `win=KIB`: the bulk window; `shared`: the server moves from a shared buffer, without a copy)

use vkernel::FaultConfig;
use vkernel_bench::vkbench::{self, Op};
use vkernel_bench::Mode;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: units TOTAL_KIB UNIT_KIB N [block] [nowb] [wb=KIB] [dg=BYTES] [win=KIB] [shared]";
    let num = |i: usize| -> Result<usize, String> {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| usage.to_string())
    };
    let (total, unit, n) = (num(0)? << 10, num(1)? << 10, num(2)?.clamp(1, 1000));
    let pl = if args.iter().any(|a| a == "block") {
        Mode::BLOCK
    } else {
        Mode::SPIN
    };
    let nowb = args.iter().any(|a| a == "nowb");
    let bound: Option<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("wb=").and_then(|v| v.parse::<usize>().ok()));
    let (a, b) = vkbench::host_pair_with(pl, FaultConfig::default(), |_, k| {
        if nowb {
            k.write_behind = 0;
        }
        if let Some(d) = args
            .iter()
            .find_map(|a| a.strip_prefix("dg=").and_then(|v| v.parse::<usize>().ok()))
        {
            k.datagram_size = Some(d);
        }
        if let Some(kib) = bound {
            k.write_behind = kib << 10;
        }
        if let Some(kib) = args
            .iter()
            .find_map(|a| a.strip_prefix("win=").and_then(|v| v.parse::<usize>().ok()))
        {
            k.window = kib << 10;
        }
    })?;
    let (pid, h) = vkbench::start_server(&a, pl)?;
    let s0 = a.stats();
    let op = if args.iter().any(|a| a == "shared") {
        Op::LoadShared { total, unit }
    } else {
        Op::Load { total, unit }
    };
    let r = vkbench::timed(&b, pid, op, n, 1, pl)?;
    let s1 = a.stats();
    let d1 = b.stats();
    println!(
        "drops: mover host {:?}, receiving host {:?}",
        s1.drops, d1.drops
    );
    println!(
        "datagrams: mover sent {:?}, receiving host got {:?}",
        s1.tx, d1.rx
    );
    let mut s: Vec<f64> = r.samples.iter().map(|d| d.as_secs_f64()).collect();
    s.sort_by(f64::total_cmp);
    let med = s[s.len() / 2];
    println!(
        "{} KiB in {} KiB units, {n} times: median {:.1} MB/s; write-behind moves {}, bulk retransmits {}, window cuts {}",
        total >> 10,
        unit >> 10,
        total as f64 / med / 1e6,
        s1.bulk_write_behind - s0.bulk_write_behind,
        s1.bulk_retransmits - s0.bulk_retransmits,
        s1.bulk_cwnd_cuts - s0.bulk_cwnd_cuts
    );
    let cl = b.create_process().map_err(|e| e.to_string())?;
    vkbench::stop_server(&cl, pid, h);
    Ok(())
}
