//! `vkernel bench`: arguments for the suite in `vkernel-bench`.

use std::path::PathBuf;

use vkernel::FaultConfig;

/// Arguments of `vkernel bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Sections to run (1 penalty, 2 kernel ops, 3 page access,
    /// 4 sequential access, 5 program loading, 6 load, 7 peers, 8 process
    /// groups, 9 observability, 10 network disk, 11 file service, 12 security,
    /// 13 one machine host: attached programs, 14 Python beside Rust and
    /// pyzmq: needs a Python with `pip install ./python`, else skipped,
    /// 15 async Rust beside the blocking API, 16 file metadata workloads:
    /// git, tar, stat, sqlite, rm on a local directory, the V mount and
    /// sshfs, 17 many processes: creation, first Send, memory, 10 to
    /// 100,000 processes, 18 many clients: one server, k = 1 … 256
    /// clients, beside a raw UDP echo server).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18"
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

/// Runs the suite with `a`, or with its defaults if `None`.
pub fn run(a: Option<BenchArgs>) -> Result<(), String> {
    let o = match a {
        None => vkernel_bench::Options::default(),
        Some(a) => vkernel_bench::Options {
            sections: a.sections,
            quick: a.quick,
            count: a.count,
            placement: a.placement,
            fault: a.fault,
            out: a.out,
            json: a.json,
        },
    };
    vkernel_bench::run(&o).map(|_| ())
}

/// Arguments of the hidden `vkernel bench-client`: one client program of
/// the bench's section 18 (started by the bench, not by users).
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// The raw UDP echo server, or the vkernel server's host.
    #[arg(long)]
    pub server: std::net::SocketAddr,
    /// The vkernel echo server's pid (without: raw UDP).
    #[arg(long)]
    pub pid: Option<u32>,
    /// This program's logical host id (vkernel only).
    #[arg(long, default_value_t = 20_000)]
    pub host_id: u16,
    /// Busy-poll instead of blocking.
    #[arg(long)]
    pub spin: bool,
    /// Start at this Unix time in ms.
    #[arg(long, default_value_t = 0)]
    pub start_at_ms: u64,
    /// Run this many ms.
    #[arg(long, default_value_t = 500)]
    pub ms: u64,
}

/// Runs one client program.
pub fn client(a: ClientArgs) -> Result<(), String> {
    vkernel_bench::programs::client_main(&vkernel_bench::programs::ClientArgs {
        server: a.server,
        pid: a.pid,
        host_id: a.host_id,
        spin: a.spin,
        start_at_ms: a.start_at_ms,
        ms: a.ms.min(60_000),
    })
}
