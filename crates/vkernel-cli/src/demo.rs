//! `vkernel demo`: arguments for the demonstration in `vkernel-bench`.

use vkernel::FaultConfig;

use crate::hostopts::logical_id;

/// Arguments of `vkernel demo` (also the default command).
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Timed exchanges per row.
    #[arg(short = 'n', long, default_value_t = 20_000)]
    pub count: usize,
    /// Bytes for the MoveTo/MoveFrom rows.
    #[arg(long, default_value_t = 64 << 20)]
    pub bulk: usize,
    /// Block after a short spin instead of busy-polling while waiting.
    #[arg(long)]
    pub block: bool,
    /// Do not pin the client and server threads to CPUs 0 and 1.
    #[arg(long)]
    pub unpinned: bool,
    /// Faults for the bad-network transfer (default: 5% loss).
    #[arg(long, value_name = "SPEC", value_parser = FaultConfig::parse)]
    pub fault: Option<FaultConfig>,
}

/// Runs the demonstration.
pub fn run(a: DemoArgs) -> Result<(), String> {
    vkernel_bench::demo::run(&vkernel_bench::demo::Demo {
        count: a.count,
        bulk: a.bulk,
        block: a.block,
        unpinned: a.unpinned,
        fault: a.fault,
        server_name: logical_id("demo-server"),
    })
}
