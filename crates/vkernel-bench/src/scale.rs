//! Section 17: many processes. Creating a process and the first Send to
//! a freshly created, blocked process, as the process table grows from 10
//! to 100,000 processes; memory per idle process; the longest single
//! creation and destruction (pauses) while the table grows and shrinks
//! (issue 24, "Processes").
//!
//! A logical host names at most 65,534 processes (a pid's local part is
//! 16 bits, as in V), so 100,000 processes are two logical hosts of this
//! program, 50,000 each.

use std::time::{Duration, Instant};

use serde::Serialize;
use vkernel::{Kernel, KernelConfig, Message, Process};

use crate::chart::{self, Series};
use crate::report::{Goal, SectionReport};
use crate::section::{Chart, Ctx, Outcome, Section};
use crate::stats::{sample, Summary};

/// Processes one logical host holds here, at most.
const PER_HOST: usize = 50_000;

/// One table size's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Processes in existence (on this program's hosts) when measured.
    pub processes: usize,
    /// Logical hosts holding them.
    pub hosts: usize,
    /// Creating one process (the last ≤ 1,000 creations to this size), µs.
    pub create: Summary,
    /// Send to a process created just now and blocked in Receive, until
    /// its Reply, µs.
    pub first_send: Summary,
    /// Resident memory added per process, bytes (all growth so far).
    pub bytes_per_process: f64,
    /// File descriptors this program holds.
    pub fds: usize,
}

/// Section 17's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Processes {
    /// One row per table size, growing.
    pub rows: Vec<Row>,
    /// The longest single creation while growing to the largest size, µs.
    pub longest_create_us: f64,
    /// Destroying every process: the longest single destruction, µs.
    pub longest_destroy_us: f64,
    /// Destroying every process: the median destruction, µs.
    pub median_destroy_us: f64,
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Times `samples` first Sends from `client` to a process created on `k`
/// by a thread that then blocks in Receive for it.
fn first_sends(k: &Kernel, client: &Process, samples: usize) -> Result<Summary, String> {
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        let p = k.create_process().map_err(|e| e.to_string())?;
        let to = p.pid();
        let server = std::thread::spawn(move || {
            let mut m = Message::zero();
            let i = p.receive(&mut m).map_err(|e| e.to_string())?;
            p.reply(&m, i.from).map_err(|e| e.to_string())
        });
        // Long enough for the thread to start and block.
        std::thread::sleep(Duration::from_millis(3));
        let mut m = Message::zero();
        let t = Instant::now();
        client.send(&mut m, to).map_err(|e| e.to_string())?;
        v.push(sample(t));
        server
            .join()
            .map_err(|_| "receiver thread panicked".to_string())??;
    }
    Ok(Summary::of(&mut v))
}

pub(crate) fn section(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Processes.heading(
        "(create, first Send to a new blocked process, memory, pauses; table of 10 … 100,000)",
    );
    let sizes: &[usize] = if c.quick {
        &[10, 1_000, 10_000]
    } else {
        &[10, 1_000, 10_000, 50_000, 100_000]
    };
    let samples = if c.quick { 11 } else { 31 };
    // The receiver is blocked by definition: blocking waits on both sides
    // whatever the run's placement.
    let cfg = KernelConfig {
        spin: Duration::ZERO,
        adaptive_spin: false,
        ..KernelConfig::default()
    };
    crate::outln!(
        "  threads unpinned, blocking waits (whatever --placement says); processes held idle (no \
         thread each); first Send from a process on this thread to a new process whose thread \
         blocks in Receive; {samples} first Sends per size"
    );
    let mut hosts = vec![Kernel::start(cfg.clone()).map_err(|e| e.to_string())?];
    let client = hosts[0].create_process().map_err(|e| e.to_string())?;
    // Memory earlier sections freed would otherwise be reused without
    // growing the resident set, and the figure per process would be low.
    // (glibc only; musl's allocator has no malloc_trim.)
    // SAFETY: malloc_trim only returns free heap memory to the system.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    let rss0 = rss_bytes();
    // (Sized up front: its own growth would be timed as a creation.)
    let mut held: Vec<Process> = Vec::with_capacity(sizes.iter().copied().max().unwrap_or(0));
    let mut longest = Duration::ZERO;
    let mut rows = Vec::new();
    crate::outln!(
        "  {:>9} {:>5} {:>12} {:>10} {:>14} {:>10} {:>11} {:>6}",
        "processes",
        "hosts",
        "create µs",
        "p99",
        "first Send µs",
        "p99",
        "B/process",
        "fds"
    );
    for &n in sizes {
        let mut creates = Vec::new();
        while held.len() < n {
            if held.len() >= PER_HOST * hosts.len() {
                let k = Kernel::start(cfg.clone()).map_err(|e| e.to_string())?;
                hosts.push(k);
            }
            let k = &hosts[held.len() / PER_HOST];
            let t = Instant::now();
            let p = k.create_process().map_err(|e| e.to_string())?;
            let d = sample(t);
            longest = longest.max(d);
            if n - held.len() <= 1_000 {
                creates.push(d);
            }
            held.push(p);
        }
        let create = Summary::of(&mut creates);
        let first_send = first_sends(&hosts[0], &client, samples)?;
        let per = rss_bytes().saturating_sub(rss0) as f64 / held.len().max(1) as f64;
        let row = Row {
            processes: held.len(),
            hosts: hosts.len(),
            create,
            first_send,
            bytes_per_process: per,
            fds: open_fds(),
        };
        crate::outln!(
            "  {:>9} {:>5} {:>12.2} {:>10.2} {:>14.1} {:>10.1} {:>11.0} {:>6}",
            row.processes,
            row.hosts,
            row.create.median_us,
            row.create.p99_us,
            row.first_send.median_us,
            row.first_send.p99_us,
            row.bytes_per_process,
            row.fds
        );
        rows.push(row);
    }
    let mut destroys = Vec::with_capacity(held.len());
    while let Some(p) = held.pop() {
        let t = Instant::now();
        drop(p);
        destroys.push(sample(t));
    }
    let d = Summary::of(&mut destroys);
    crate::outln!(
        "  growing: longest single creation {:.0} µs; shrinking to none: destruction median {:.2} µs, \
         longest {:.0} µs",
        longest.as_secs_f64() * 1e6,
        d.median_us,
        d.max_us
    );
    let mut goals = Vec::new();
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let what = format!("{} vs {} processes", last.processes, first.processes);
        goals.push(Goal::at_most(
            &format!("create at {what}"),
            last.create.median_us / first.create.median_us.max(1e-3),
            2.0,
            "×",
        ));
        goals.push(Goal::at_most(
            &format!("first Send at {what}"),
            last.first_send.median_us / first.first_send.median_us.max(1e-3),
            2.0,
            "×",
        ));
        goals.push(Goal::at_most(
            &format!("memory per idle process at {} processes", last.processes),
            last.bytes_per_process,
            2048.0,
            "B",
        ));
    }
    let series: Vec<Series> = vec![
        (
            "create (median)".into(),
            rows.iter()
                .map(|r| (r.processes as f64, r.create.median_us))
                .collect(),
        ),
        (
            "first Send (median)".into(),
            rows.iter()
                .map(|r| (r.processes as f64, r.first_send.median_us))
                .collect(),
        ),
        (
            "bytes per process / 10".into(),
            rows.iter()
                .skip(1)
                .map(|r| (r.processes as f64, r.bytes_per_process / 10.0))
                .collect(),
        ),
    ];
    // Log scales: a point that is not positive (resident memory can
    // shrink when earlier sections' memory is returned) is left out.
    let series: Vec<Series> = series
        .into_iter()
        .map(|(name, pts)| (name, pts.into_iter().filter(|p| p.1 > 0.0).collect()))
        .collect();
    let charts = vec![Chart {
        file: "processes.svg",
        draw: Box::new(move |p| {
            chart::lines(
                p,
                "Cost per process vs processes (log scales; flat is the goal)",
                "processes",
                "µs (bytes / 10)",
                &series,
                true,
            )
        }),
    }];
    Ok(Outcome {
        report: SectionReport::Processes(Processes {
            rows,
            longest_create_us: longest.as_secs_f64() * 1e6,
            longest_destroy_us: d.max_us,
            median_destroy_us: d.median_us,
        }),
        goals,
        charts,
    })
}
