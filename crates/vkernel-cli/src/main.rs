//! The `vkernel` command.

mod baseline;
mod bench;
mod demo;
mod echo;
mod hostopts;
mod ping;
mod stats;
mod vkbench;

use clap::{Parser, Subcommand};

/// vkernel: the distributed V kernel's message passing, for Linux.
///
/// Processes named by 32-bit pids exchange 32-byte messages by synchronous
/// Send/Receive/Reply and move bulk data with MoveTo/MoveFrom, with the same
/// calls on one logical host or across hosts (UDP). Run with no command for
/// a demonstration: two logical hosts on this machine exchange messages and
/// print what they measured.
#[derive(Parser, Debug)]
#[command(name = "vkernel", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two logical hosts on this machine exchange messages and move data,
    /// next to raw UDP with the same placement (the default command).
    Demo(demo::DemoArgs),
    /// vkernel against raw UDP, same threads, placement and waiting
    /// (exchange latency, GetTime, 64 MiB MoveTo/MoveFrom, 5% loss).
    Bench(bench::BenchArgs),
    /// Run a logical host with an echo server registered under a name.
    Echo(echo::EchoArgs),
    /// Find an echo server by name (via --peer) and time N exchanges.
    Ping(ping::PingArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Some(Cmd::Echo(a)) => echo::run(a),
        Some(Cmd::Ping(a)) => ping::run(a),
        Some(Cmd::Demo(a)) => demo::run(a),
        Some(Cmd::Bench(a)) => bench::run(a),
        None => demo::run(demo::default_args()),
    };
    if let Err(e) = r {
        eprintln!("vkernel: {e}");
        std::process::exit(1);
    }
}
