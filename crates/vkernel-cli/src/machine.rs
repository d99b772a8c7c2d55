//! `vkernel host`: the machine's logical host, which other programs attach
//! to (`--attach` on every command, `Kernel::attach` in a program).

use std::time::Duration;

use crate::hostopts::{exit_summary, wait_exit, HostOpts};

/// The long help of `vkernel host`.
pub const LONG_ABOUT: &str = "\
Runs this machine's logical host and lets programs attach to it through a
Unix socket: their processes become this host's processes (one pid space,
one set of names and groups, one kernel server, this host's UDP socket for
remote traffic), and calls between them go through shared memory.

Who may attach is set by the socket's permissions (--socket-mode); each
program's principal is its uid (from the socket's peer credentials). A
program that exits or is killed loses its processes at once; if this host
stops, attached programs' calls fail with \"the machine host ... has gone\"
and they may attach again to its successor.

Examples:
  vkernel host                               # socket at $VKERNEL_HOST or the default
  vkernel host --socket /tmp/vk.sock --socket-mode 666
  vkernel echo --attach /tmp/vk.sock         # a service attached to it
  vkernel ping --attach /tmp/vk.sock -n 1000 # and a client";

/// Arguments of `vkernel host`.
#[derive(clap::Args, Debug)]
#[command(long_about = LONG_ABOUT)]
pub struct HostArgs {
    #[command(flatten)]
    host: HostOpts,
    /// The attach socket (default: $VKERNEL_HOST, else
    /// /run/vkernel/host.sock for root, $XDG_RUNTIME_DIR/vkernel/host.sock
    /// or /tmp/vkernel-UID/host.sock for others).
    #[arg(long, value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
    /// Permission bits of the socket, in octal: who may attach (600: this
    /// user only; 660: also the socket's group; 666: anyone).
    #[arg(long, default_value = "600", value_parser = parse_mode)]
    socket_mode: u32,
    /// Serve Prometheus metrics (`/metrics`) and JSON (`/stats.json`) over
    /// HTTP on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Exit after this long (default: run until interrupted).
    #[arg(long, value_parser = vkernel::net::parse_duration)]
    exit_after: Option<Duration>,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    // 0o660 is how a TOML file writes an octal number.
    let digits = s.strip_prefix("0o").unwrap_or(s);
    let m = u32::from_str_radix(digits, 8).map_err(|_| format!("`{s}` is not an octal mode"))?;
    if m > 0o777 {
        return Err(format!("mode {s} has bits beyond 777"));
    }
    Ok(m)
}

/// Runs `vkernel host`.
pub fn run(a: HostArgs) -> Result<(), String> {
    // Caught from the start: a stop during start-up is clean too.
    let stop = crate::stop::Stop::install();
    if a.host.attach.is_some() {
        return Err("vkernel host runs the machine host; it cannot --attach to another".into());
    }
    let k = a.host.start()?;
    if let Some(m) = a.metrics {
        let bound = k
            .serve_metrics(m)
            .map_err(|e| format!("cannot serve metrics on {m}: {e}"))?;
        eprintln!("vkernel host: metrics on http://{bound}/metrics");
    }
    let path = a
        .socket
        .clone()
        .unwrap_or_else(vkernel::attach::default_path);
    let srv = k
        .serve_attach(&path, a.socket_mode)
        .map_err(|e| format!("cannot serve attachments at {}: {e}", path.display()))?;
    let status = format!(
        "host {} listening on {}; programs attach at {} (mode {:o})",
        k.host_id(),
        k.local_addr(),
        path.display(),
        a.socket_mode
    );
    println!("vkernel host: {status}");
    let start = wait_exit(&stop, a.exit_after, &status);
    exit_summary(format_args!(
        "vkernel host: exiting after {:.1} s; {} programs attached, {} processes",
        start.elapsed().as_secs_f64(),
        srv.attached(),
        k.stats_json()
            .split("\"processes\":")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .unwrap_or("?")
    ));
    Ok(())
}
