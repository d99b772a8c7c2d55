//! The `vkernel` command.
#![warn(clippy::undocumented_unsafe_blocks)]

mod bench;
mod config;
mod demo;
mod disk;
mod echo;
mod fileserver;
mod gen;
mod hostopts;
mod locate;
mod machine;
mod mount;
mod nbd;
mod notify;
#[cfg(feature = "otel")]
mod otel;
mod ping;
mod statscmd;
mod stop;
mod team;
mod tracecmd;
mod units;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// The long help's closing note (also the man page's).
const FILES: &str = "\
Configuration: commands that start a logical host read options from a TOML
file (--config FILE, else $VKERNEL_CONFIG, else /etc/vkernel/vkernel.toml if
it exists); flags win over it. `vkernel check-config` explains a file.

Service managers: under systemd (Type=notify, $NOTIFY_SOCKET) a service
command reports READY=1 once it serves (name registered, socket listening,
file system mounted) and STOPPING=1 when it begins to stop.";

/// vkernel: the distributed V kernel's message passing, for Linux.
///
/// Processes named by 32-bit pids exchange 32-byte messages by synchronous
/// Send/Receive/Reply and move bulk data with MoveTo/MoveFrom, with the same
/// calls on one logical host or across hosts (UDP). Run with no command for
/// the measurement suite (`vkernel bench` with its defaults): the V papers'
/// tables on this machine, the published figures beside today's, and the
/// peers a user would pick instead measured in the same run.
#[derive(Parser, Debug)]
#[command(name = "vkernel", version, about, long_about, after_long_help = FILES)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two logical hosts on this machine exchange messages and move data,
    /// next to raw UDP with the same placement (a one-screen demonstration).
    Demo(demo::DemoArgs),
    /// The papers' measurement tables on this machine, published figures
    /// beside today's, peers in the same run, JSON and SVG charts (the
    /// default command).
    Bench(bench::BenchArgs),
    /// One client program of `vkernel bench` section 18 (internal).
    #[command(hide = true)]
    BenchClient(bench::ClientArgs),
    /// Run this machine's logical host, which other programs attach to
    /// (`--attach`): their processes share its pid space and sockets.
    // (A variant's doc comment would replace the command's long help.)
    #[command(long_about = machine::LONG_ABOUT)]
    Host(machine::HostArgs),
    /// Run a logical host with an echo server registered under a name.
    Echo(echo::EchoArgs),
    /// Find an echo server by name (via --peer) and time N exchanges.
    Ping(ping::PingArgs),
    /// Find the servers of a service by a query to its process group.
    Locate(locate::LocateArgs),
    /// List the logical hosts that answer a query to every kernel server,
    /// least loaded first (host selection).
    Hosts(locate::HostsArgs),
    /// Live counters of logical hosts, read from their kernel servers
    /// (table, or --json).
    Stats(statscmd::StatsArgs),
    /// Characterize recorded message traces (--trace FILE): sizes,
    /// destinations, rates, latency by phase, conservation; Chrome export.
    Trace(tracecmd::TraceArgs),
    /// Run an IPdisk: a SCSI disk (ram, file or device backing) served over
    /// V IPC, with derived virtual devices (DVDs) for its clients.
    Disk(disk::DiskArgs),
    /// Talk to an IPdisk as a virtual SCSI adapter: inquiry, capacity,
    /// read, write, flush, and DVD management for the owner.
    DiskCli(disk::DiskCliArgs),
    /// Serve an IPdisk (or one of its DVDs) as an NBD export for qemu,
    /// libnbd, fio and the kernel's nbd-client.
    Nbd(nbd::NbdArgs),
    /// Serve a directory tree over the V I/O protocol (file server with a
    /// worker pool, confined to --root).
    Fileserver(fileserver::FileServerArgs),
    /// Mount a file server with FUSE so unmodified programs use its files
    /// (unmounts on SIGINT/SIGTERM).
    Mount(mount::MountArgs),
    /// Run a team server (and a pipe server): programs loaded from a file
    /// server run here, with stdio over V pipes.
    Teamserver(team::TeamServerArgs),
    /// Run a program stored on a file server on a team server's host
    /// (--on HOST, or --on any for the least loaded), with this terminal's
    /// stdin, stdout and stderr; exits with the program's exit code.
    Run(team::RunArgs),
    /// Check a configuration file (TOML) and show what each command in it
    /// would run with.
    #[command(long_about = config::CHECK_ABOUT)]
    CheckConfig(config::CheckArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell).
    Completions(gen::CompletionsArgs),
    /// Write the manual pages (roff), generated from this command line.
    Man(gen::ManArgs),
}

/// Services log their connections and errors (info); one-shot commands
/// and the bench only what went wrong (warn). RUST_LOG overrides both.
fn default_log_level() -> &'static str {
    const SERVICES: [&str; 7] = [
        "host",
        "disk",
        "nbd",
        "fileserver",
        "mount",
        "teamserver",
        "echo",
    ];
    let sub = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    match sub {
        Some(s) if SERVICES.contains(&s.as_str()) => "info",
        _ => "warn",
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log_level())),
        )
        .with_writer(std::io::stderr)
        // (No colour codes in pipes, files and the journal.)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let root = units::explain(Cli::command());
    // Settings from the configuration file become flags before the real
    // parse, behind the command line's own (see config.rs).
    let argv = match config::apply(&root, std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vkernel: {e}");
            std::process::exit(2);
        }
    };
    let cli = match root
        .clone()
        .try_get_matches_from(argv)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // OpenTelemetry export, flushed before any exit below.
    #[cfg(feature = "otel")]
    let otel = std::cell::RefCell::new(otel::init());
    let flush = || {
        #[cfg(feature = "otel")]
        otel.borrow_mut().take();
    };
    let r = match cli.cmd {
        Some(Cmd::Host(a)) => machine::run(a),
        Some(Cmd::Echo(a)) => echo::run(a),
        Some(Cmd::Ping(a)) => ping::run(a),
        Some(Cmd::Locate(a)) => locate::run(a),
        Some(Cmd::Hosts(a)) => locate::run_hosts(a),
        Some(Cmd::Stats(a)) => statscmd::run(a),
        Some(Cmd::Trace(a)) => tracecmd::run(a),
        Some(Cmd::Disk(a)) => disk::run(a),
        Some(Cmd::DiskCli(a)) => disk::run_cli(a),
        Some(Cmd::Nbd(a)) => nbd::run(a),
        Some(Cmd::Fileserver(a)) => fileserver::run(a),
        Some(Cmd::Mount(a)) => mount::run(a),
        Some(Cmd::Teamserver(a)) => team::serve(a),
        Some(Cmd::Run(a)) => match team::run(a) {
            Ok(code) => {
                flush();
                std::process::exit(code)
            }
            Err(e) => Err(e),
        },
        Some(Cmd::CheckConfig(a)) => config::check(a, &root),
        Some(Cmd::Completions(a)) => gen::completions(a, root),
        Some(Cmd::Man(a)) => gen::man(a, root),
        Some(Cmd::Demo(a)) => demo::run(a),
        Some(Cmd::Bench(a)) => bench::run(Some(a)),
        Some(Cmd::BenchClient(a)) => bench::client(a),
        None => bench::run(None),
    };
    flush();
    if let Err(e) = r {
        eprintln!("vkernel: {e}");
        std::process::exit(1);
    }
}
