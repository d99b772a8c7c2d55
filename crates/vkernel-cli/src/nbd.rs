//! `vkernel nbd`: an NBD gateway in front of an IPdisk (or one of its DVDs).

use std::sync::Arc;
use std::time::Duration;

use vkernel_disk::client::Rediscover;
use vkernel_disk::nbd::{Export, Gateway, Limits, ListenAddr};

use crate::disk::{connect, parse_key};
use crate::hostopts::{counter, exit_summary, wait_exit, HostOpts};
use crate::units::Size;

/// Arguments of `vkernel nbd`.
///
/// Starts a logical host, finds the disk (by name or pid, through --peer),
/// opens it (the whole device with the owner key, or `NAME:DVD`), and
/// serves it as an NBD export to qemu, libnbd (nbdinfo, nbdcopy), fio's
/// nbd engine or the kernel's nbd-client: fixed newstyle handshake, OPT_GO
/// / INFO / LIST / ABORT / EXPORT_NAME, READ, WRITE, FLUSH, FUA, TRIM,
/// WRITE_ZEROES, several connections (multi-conn). Block size constraints
/// (minimum = the disk's block, preferred 4096, maximum payload 32 MiB)
/// are advertised. Example: `qemu-img info nbd://127.0.0.1:10809`.
#[derive(clap::Args, Debug)]
pub struct NbdArgs {
    #[command(flatten)]
    host: HostOpts,
    /// The disk: a service name or 0x-hex pid, optionally `:DVD`.
    #[arg(long, default_value = vkernel::service::IPDISK)]
    disk: String,
    /// Key to present: the owner key (whole device) or a DVD key.
    #[arg(long = "disk-key", value_parser = parse_key, default_value = "0")]
    disk_key: u64,
    /// Where to listen: HOST:PORT (TCP) or unix:PATH.
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: ListenAddr,
    /// Export name (the empty name also selects it).
    #[arg(long, default_value = "ipdisk")]
    export: String,
    /// IPdisk commands in flight at most, over all connections.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Memory budget: request data held (read, not yet answered) over
    /// all connections; at the limit the gateway stops reading requests
    /// until replies drain (a SIZE, e.g. 64MiB, 1GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_memory, default_value = "256MiB")]
    memory: Size,
    /// Connections open at once; one more is closed at once (logged).
    #[arg(long, default_value_t = vkernel_disk::nbd::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// A connection that has not finished negotiating after this long is
    /// closed.
    #[arg(long, value_parser = vkernel::net::parse_duration, default_value = "10s")]
    handshake_timeout: Duration,
    /// When the disk (named, not a pid) goes away, look for it again by
    /// name this long (reopening the view, re-sending the command) before
    /// failing the command with EIO; 0 = fail at once.
    #[arg(long, value_parser = vkernel::net::parse_duration, default_value = "30s")]
    rediscover: Duration,
    /// A command to the disk not answered within this long fails (EIO to
    /// the NBD client) instead of holding the request; 0 = no deadline.
    #[arg(long, value_parser = vkernel::net::parse_duration, default_value = "60s")]
    deadline: Duration,
    /// Exit after this long (default: run until interrupted).
    #[arg(long, value_parser = vkernel::net::parse_duration)]
    exit_after: Option<Duration>,
}

/// Parses a memory budget: a size above zero (`256MiB`, `1G`).
pub fn parse_memory(s: &str) -> Result<Size, String> {
    match Size::parse(s)? {
        Size(0) => Err(format!("memory `{s}`: give a size above zero")),
        n => Ok(n),
    }
}

/// The gateway's limits from the command line.
pub fn limits(memory: Size, max_connections: usize, handshake: Duration) -> Limits {
    Limits {
        memory: memory.to_usize(),
        max_connections: max_connections.max(1),
        handshake_timeout: handshake,
        ..Limits::default()
    }
}

/// Runs `vkernel nbd`.
pub fn run(a: NbdArgs) -> Result<(), String> {
    // Caught from the start: a stop during start-up is clean too.
    let stop = crate::stop::Stop::install();
    let mut cfg = a.host.config();
    cfg.send_deadline = (!a.deadline.is_zero()).then_some(a.deadline);
    let k = a.host.start_with(cfg)?;
    let mut c = connect(&k, &a.disk, a.disk_key, a.depth.max(1))?;
    if let Some(logical_id) = crate::disk::named_logical_id(&a.disk) {
        if !a.rediscover.is_zero() {
            c.set_rediscover(Rediscover {
                logical_id,
                budget: a.rediscover,
            });
        }
    }
    let g = c.geometry();
    let export = Export {
        name: a.export.clone(),
        description: format!("vkernel IPdisk {} via pid {}", a.disk, c.server()),
        dev: Arc::new(c),
    };
    let lim = limits(a.memory, a.max_connections, a.handshake_timeout);
    let mut gw = Gateway::start_with(&a.listen, vec![export], lim)
        .map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
    let status = format!(
        "export \"{}\" ({} blocks of {} bytes{}) of {} on {}",
        a.export,
        g.blocks,
        g.block_size,
        if g.read_only { ", read-only" } else { "" },
        a.disk,
        gw.addr()
    );
    println!("vkernel nbd: {status}");
    let start = wait_exit(&stop, a.exit_after, &status);
    let s = gw.stats();
    exit_summary(format_args!(
        "vkernel nbd: exiting after {:.1} s; {} connections, {} closed on errors, {} refused over the limit, {} handshake timeouts; memory peak {} bytes, {} waits for memory",
        start.elapsed().as_secs_f64(),
        counter(&s.connections),
        counter(&s.errors),
        counter(&s.refused),
        counter(&s.handshake_timeouts),
        counter(&s.memory_peak),
        counter(&s.memory_waits)
    ));
    gw.stop();
    Ok(())
}
