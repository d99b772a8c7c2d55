//! The suite: its sections as values ([`Section`]), the shared context they
//! run in, and [`run`], which runs the chosen ones and writes the report
//! and charts.
//!
//! Method: N timed iterations after a warm-up, medians and p99 (never
//! means), clock overhead subtracted from each sample, CPU per operation
//! from each side's thread CPU clock in a separate pass with blocking
//! waits and both threads on one CPU (median of batches). Ratios are only meaningful within one run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vkernel::{FaultConfig, Kernel};
use vkernel_proto::Pid;

use crate::out::Progress;
use crate::report::{Goal, Report, SectionReport};
use crate::vkbench::{self, Op};
use crate::{
    asyncrt, attach, clients, disk, files, kernel_ops, loading, metadata, overhead, peers, python,
    scale, Mode,
};

/// What [`run`] measures and where it writes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Sections to run, by number.
    pub sections: Vec<u8>,
    /// Small counts and sizes.
    pub quick: bool,
    /// Timed iterations per measurement (default 5000; 500 if quick).
    pub count: Option<usize>,
    /// Mode name: `spin`, `spin-pinned` or `block`.
    pub placement: String,
    /// Faults for the bad-network transfer row (default: 5% loss).
    pub fault: Option<FaultConfig>,
    /// Directory for bench.json and the SVG charts.
    pub out: PathBuf,
    /// Also write the JSON to this file.
    pub json: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sections: Section::ALL.iter().map(|s| s.number()).collect(),
            quick: false,
            count: None,
            placement: "spin".into(),
            fault: None,
            out: PathBuf::from("vkernel-bench-out"),
            json: None,
        }
    }
}

/// Draws a chart into the given file.
pub type Draw = Box<dyn FnOnce(&Path) -> Result<(), String>>;

/// A chart a section asks for, drawn after the report is written.
pub struct Chart {
    /// File name in the output directory.
    pub file: &'static str,
    /// Drawn by this function.
    pub draw: Draw,
}

/// What a section hands back: its figures, the goals it checked, charts.
pub struct Outcome {
    /// The figures.
    pub report: SectionReport,
    /// Goals checked (already printed).
    pub goals: Vec<Goal>,
    /// Charts to draw.
    pub charts: Vec<Chart>,
}

impl From<SectionReport> for Outcome {
    fn from(report: SectionReport) -> Outcome {
        Outcome {
            report,
            goals: Vec::new(),
            charts: Vec::new(),
        }
    }
}

/// One section of the suite. To add one: a variant here, its number and
/// title below, a `run` arm, a report struct in `report.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// 1: raw UDP, the papers' network penalty.
    Penalty,
    /// 2: Send-Receive-Reply, MoveTo/MoveFrom, message size.
    KernelOps,
    /// 3: page read/write.
    Pages,
    /// 4: sequential access with read-ahead.
    Sequential,
    /// 5: program loading by MoveTo.
    Loading,
    /// 6: concurrent exchanges.
    Load,
    /// 7: raw UDP, TCP, ZeroMQ, gRPC beside vkernel.
    Peers,
    /// 8: process groups.
    Groups,
    /// 9: metrics and tracing costs, trace characterization.
    Observability,
    /// 10: the IPdisk and its NBD gateway beside nbdkit.
    Disk,
    /// 11: the file server, FUSE mount, sshfs.
    Files,
    /// 12: authenticated datagrams.
    Security,
    /// 13: programs attached to one machine host.
    Attach,
    /// 14: vkernel from Python, beside Rust and pyzmq.
    Python,
    /// 15: async Rust: awaited exchanges beside blocking ones.
    Async,
    /// 16: metadata workloads on a local directory, the V mount, sshfs.
    Metadata,
    /// 17: many processes: creation, first Send, memory, pauses.
    Processes,
    /// 18: one server, many clients, beside raw UDP.
    Clients,
}

impl Section {
    /// Every section, in order.
    pub const ALL: [Section; 18] = [
        Section::Penalty,
        Section::KernelOps,
        Section::Pages,
        Section::Sequential,
        Section::Loading,
        Section::Load,
        Section::Peers,
        Section::Groups,
        Section::Observability,
        Section::Disk,
        Section::Files,
        Section::Security,
        Section::Attach,
        Section::Python,
        Section::Async,
        Section::Metadata,
        Section::Processes,
        Section::Clients,
    ];

    /// The section's number (1-based, as on the command line).
    pub fn number(self) -> u8 {
        Section::ALL.iter().position(|&s| s == self).unwrap_or(0) as u8 + 1
    }

    /// The section with this number.
    pub fn from_number(n: u8) -> Option<Section> {
        Section::ALL.get(usize::from(n).checked_sub(1)?).copied()
    }

    /// The section's title as printed.
    pub fn title(self) -> &'static str {
        match self {
            Section::Penalty => "Network penalty",
            Section::KernelOps => "Kernel operations",
            Section::Pages => "Page-level file access",
            Section::Sequential => "Sequential access",
            Section::Loading => "Program loading",
            Section::Load => "Load",
            Section::Peers => "Peers",
            Section::Groups => "Process groups",
            Section::Observability => "Observability",
            Section::Disk => "Network disk",
            Section::Files => "File service",
            Section::Security => "Security",
            Section::Attach => "One machine host",
            Section::Python => "Python",
            Section::Async => "Async Rust",
            Section::Metadata => "File metadata",
            Section::Processes => "Many processes",
            Section::Clients => "Many clients",
        }
    }

    /// The section's share of a default run's time, for the progress
    /// bar's ETA (seconds in one run on 2 vCPUs; only the ratios matter).
    pub fn weight(self) -> u64 {
        match self {
            Section::Penalty | Section::Python | Section::Async => 1,
            Section::KernelOps | Section::Pages => 3,
            Section::Sequential => 7,
            Section::Loading | Section::Disk => 30,
            Section::Load => 16,
            Section::Peers => 6,
            Section::Metadata => 15,
            Section::Groups => 9,
            Section::Observability | Section::Files | Section::Attach => 5,
            Section::Security => 8,
            Section::Processes => 90,
            Section::Clients => 20,
        }
    }

    /// Prints the heading `N. Title (detail)`.
    pub fn heading(self, detail: &str) {
        let sep = if detail.starts_with([':', ',']) {
            ""
        } else {
            " "
        };
        crate::outln!("\n{}. {}{sep}{detail}", self.number(), self.title());
    }

    /// Runs the section in `c`.
    pub fn run(self, c: &mut Ctx) -> Result<Outcome, String> {
        Ok(match self {
            Section::Penalty => SectionReport::Penalty(kernel_ops::penalty(c)?).into(),
            Section::KernelOps => SectionReport::Ops(kernel_ops::kernel_ops(c)?).into(),
            Section::Pages => SectionReport::Ops(kernel_ops::pages(c)?).into(),
            Section::Sequential => SectionReport::Sequential(kernel_ops::sequential(c)?).into(),
            Section::Loading => loading::loading(c)?,
            Section::Load => SectionReport::Load(loading::load(c)?).into(),
            Section::Peers => peers::peers(c)?,
            Section::Groups => peers::groups(c)?,
            Section::Observability => {
                SectionReport::Observability(overhead::observability(c)?).into()
            }
            Section::Disk => SectionReport::Disk(disk::disk(c)?).into(),
            Section::Files => files::section(c)?,
            Section::Security => overhead::security(c)?,
            Section::Attach => attach::section(c)?,
            Section::Python => python::section(c)?,
            Section::Async => asyncrt::section(c)?,
            Section::Metadata => metadata::section(c)?,
            Section::Processes => scale::section(c)?,
            Section::Clients => clients::section(c)?,
        })
    }
}

pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What the sections share: the mode, counts, a host pair with an
/// exchange server, and the penalty fit once measured.
pub struct Ctx {
    pub(crate) pl: Mode,
    pub(crate) n: usize,
    pub(crate) warm: usize,
    pub(crate) quick: bool,
    pub(crate) ka: Kernel,
    pub(crate) kb: Kernel,
    pub(crate) server: Pid,
    pub(crate) out: PathBuf,
    pub(crate) lossy: FaultConfig,
    /// One-way penalty fit (µs per byte, µs), from section 1 or measured on demand.
    pub(crate) fit: Option<(f64, f64)>,
    /// Section 5's largest single-MoveTo image (bytes, MB/s), for section 12.
    pub(crate) big_move_mbps: Option<(usize, f64)>,
}

impl Ctx {
    /// The one-way network penalty of `bytes` in the run's mode.
    pub(crate) fn penalty(&mut self, bytes: usize) -> Result<f64, String> {
        if self.fit.is_none() {
            self.fit =
                Some(kernel_ops::penalty_fit(self.pl, self.n, self.warm, &[76, 1100, 4172])?.0);
        }
        let (a, b) = self.fit.unwrap_or((0.0, 0.0));
        Ok(a * bytes as f64 + b)
    }

    pub(crate) fn timed(&self, local: bool, op: Op, n: usize) -> Result<vkbench::Timed, String> {
        let k = if local { &self.ka } else { &self.kb };
        vkbench::timed(k, self.server, op, n, (n / 10).max(20), self.pl)
    }
}

/// Runs the chosen sections, prints their tables, writes `bench.json` and
/// the charts to `o.out`, and returns the report.
pub fn run(o: &Options) -> Result<Report, String> {
    let pl = Mode::parse(&o.placement)?;
    let n = o.count.unwrap_or(if o.quick { 500 } else { 5000 }).max(20);
    let sections = o
        .sections
        .iter()
        .map(|&s| Section::from_number(s).ok_or(format!("unknown section {s} (1..=12)")))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    crate::outln!("vkernel bench — the V papers' measurements on this machine");
    crate::outln!(
        "method: {n} timed iterations after {} warm-up, medians and p99, clock overhead ({} ns) subtracted; {}; vkernel and raw baselines use the same threads and waiting",
        (n / 10).max(20),
        crate::stats::clock_overhead().as_nanos(),
        pl.describe()
    );
    crate::outln!(
        "client/server columns: CPU µs per operation from each thread's CPU clock, in a separate pass with blocking waits, both threads on CPU 0 (median of {} batches)",
        vkbench::CPU_BATCHES
    );
    crate::outln!("papers' figures are ms on 1983/1985 hardware; today's are µs unless marked");
    let (ka, kb) = vkbench::host_pair(pl, FaultConfig::default())?;
    let (server, sh) = vkbench::start_server(&ka, pl)?;
    let mut c = Ctx {
        pl,
        n,
        warm: (n / 10).max(20),
        quick: o.quick,
        ka,
        kb,
        server,
        out: o.out.clone(),
        lossy: o.fault.clone().unwrap_or(FaultConfig {
            loss: 0.05,
            seed: 5,
            ..FaultConfig::default()
        }),
        fit: None,
        big_move_mbps: None,
    };
    let mut out = BTreeMap::new();
    let mut goals = Vec::new();
    let mut charts = Vec::new();
    let mut progress = Progress::new("vkernel bench", sections.iter().map(|s| s.weight()).sum());
    for s in sections {
        let _step = progress.step(
            &format!("section {} ({})", s.number(), s.title()),
            s.weight(),
        );
        let r = s.run(&mut c)?;
        out.insert(format!("section{}", s.number()), r.report);
        goals.extend(r.goals);
        charts.extend(r.charts);
    }
    progress.finish();
    let probe = c.kb.create_process().map_err(|e| e.to_string())?;
    vkbench::stop_server(&probe, c.server, sh);
    if !goals.is_empty() {
        let met = goals.iter().filter(|g| g.met).count();
        crate::outln!("\ngoals: {met} of {} met", goals.len());
        for g in goals.iter().filter(|g| !g.met) {
            crate::outln!("  ✗ {} {} (measured {:.3})", g.what, g.target, g.measured);
        }
    }
    let report = Report {
        placement: o.placement.clone(),
        description: pl.describe(),
        count: n,
        quick: o.quick,
        seconds: started.elapsed().as_secs_f64(),
        goals,
        sections: out,
    };
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    let jpath = o.out.join("bench.json");
    std::fs::write(&jpath, &text).map_err(|e| format!("{}: {e}", jpath.display()))?;
    if let Some(p) = &o.json {
        std::fs::write(p, &text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let mut files = vec![jpath.display().to_string()];
    for ch in charts {
        let p = o.out.join(ch.file);
        (ch.draw)(&p)?;
        files.push(p.display().to_string());
    }
    crate::outln!(
        "\nwrote {} in {:.0} s",
        files.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_numbered_in_order() {
        for (i, s) in Section::ALL.iter().enumerate() {
            assert_eq!(usize::from(s.number()), i + 1);
            assert_eq!(Section::from_number(s.number()), Some(*s));
        }
        assert_eq!(Section::from_number(0), None);
        let n = Section::ALL.len() as u8;
        assert_eq!(Section::from_number(n + 1), None);
        assert_eq!(Options::default().sections.len(), Section::ALL.len());
    }

    #[test]
    fn modes_parse() {
        assert_eq!(Mode::parse("spin"), Ok(Mode::SPIN));
        assert_eq!(Mode::parse("block"), Ok(Mode::BLOCK));
        assert!(Mode::parse("spin-pinned").is_ok_and(|m| m.spins() && m.cpus.client_cpu == Some(0)));
        assert!(Mode::parse("fast").is_err());
        assert!(!Mode::SPIN.blocking().spins());
    }
}
