//! `vkernel trace report FILE...`: the characterization of recorded traces
//! (analysis in `vkernel_bench::trace`).

use std::path::PathBuf;

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

/// Runs `vkernel trace`.
pub fn run(a: TraceArgs) -> Result<(), String> {
    match a.cmd {
        TraceCmd::Report(r) => vkernel_bench::trace::report_files(
            &r.files,
            r.json,
            r.out.as_deref(),
            r.chrome.as_deref(),
        )
        .map(|_| ()),
    }
}
