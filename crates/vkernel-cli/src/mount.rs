//! `vkernel mount`: a FUSE mount of a V I/O file server.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use vkernel::service::FILESERVER;
use vkernel::{Kernel, Pid, Scope};
use vkernel_fs::client::{Client, Rediscover};
use vkernel_fs::fuse::{self, FuseOptions};

use crate::hostopts::{auth_hint, logical_id, HostOpts};

/// Arguments of `vkernel mount`: mounts a file server (`vkernel
/// fileserver`) at MOUNTPOINT with FUSE so unmodified programs use its
/// files; [`MOUNT_HELP`] explains SERVER and how the mount ends.
#[derive(clap::Args, Debug)]
#[command(after_help = MOUNT_HELP)]
pub struct MountArgs {
    /// The file server: ADDR, NAME@ADDR, NAME or 0xPID (see below).
    server: String,
    /// Where to mount (an existing directory).
    mountpoint: std::path::PathBuf,
    #[command(flatten)]
    host: HostOpts,
    /// FUSE worker threads (requests in flight to the server at once).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// How long attributes and names are cached when the server does not
    /// report other clients' changes (an older server, or --no-watch).
    #[arg(long, default_value = "1s", value_parser = vkernel::net::parse_duration)]
    ttl: Duration,
    /// How long attributes, names and absent names are cached when the
    /// server reports every change another client makes (the default).
    /// Changes made on the server's disk by programs other than the file
    /// server show up here after at most this long.
    #[arg(long, default_value = "10s", value_parser = vkernel::net::parse_duration)]
    cache_ttl: Duration,
    /// Do not ask the server to report other clients' changes (caches
    /// then live for --ttl).
    #[arg(long)]
    no_watch: bool,
    /// Keep directory listings and symbolic links out of the kernel's
    /// caches (by default the kernel keeps them while the server reports
    /// changes, which drop them).
    #[arg(long)]
    no_kernel_cache: bool,
    /// Wait for the server on every unlink and rmdir. By default, while
    /// the server reports changes, one the mount can decide from the
    /// listing it keeps is answered at once and sent to the server after,
    /// in order; an error then shows in the log and at the next fsync of
    /// the directory, and a crash of the mount loses removals not yet
    /// sent (as a crash loses data not yet fsynced).
    #[arg(long)]
    sync_removals: bool,
    /// Let other users access the mount.
    #[arg(long)]
    allow_other: bool,
    /// When the server (named, not a pid) goes away, look for it again
    /// by name this long, reopening the mount's open files, before
    /// failing operations with ENOTCONN; 0 = fail at once.
    #[arg(long, default_value = "30s", value_parser = vkernel::net::parse_duration)]
    rediscover: Duration,
    /// A request to the server not answered within this long fails
    /// (ENOTCONN) instead of blocking its caller; 0 = no deadline.
    #[arg(long, default_value = "60s", value_parser = vkernel::net::parse_duration)]
    deadline: Duration,
}

const MOUNT_HELP: &str = "\
SERVER is one of:
  ADDR         the server host's UDP address (e.g. 127.0.0.1:7200); the name
               \"fileserver\" is looked up there
  NAME@ADDR    a server registered as NAME on the host at ADDR
  NAME         looked up through --peer (or --multicast-port)
  0xPID        a server pid (its host must be reachable through --peer)

The mount stays until SIGINT (Ctrl-C) or SIGTERM, which unmount it cleanly
(lazily if it is busy), or until `fusermount3 -u MOUNTPOINT`. Needs /dev/fuse
and fusermount3 (Debian package fuse3). If the server becomes unreachable,
operations fail with ENOTCONN after --host-timeout instead of hanging.
A server that restarts (found again by name within --rediscover) is used
again: open files are reopened by path and idempotent operations re-sent; an
operation whose outcome is unknown (create, rename, unlink in flight) and a
file written since its last fsync fail with EIO.

Example:
  vkernel fileserver --root /srv/export --bind 127.0.0.1:7200 &
  vkernel mount 127.0.0.1:7200 /mnt/v";

/// The logical id a SERVER argument names (`None` for a pid).
pub(crate) fn service_logical_id(server: &str, default: &str) -> Option<u32> {
    if server.starts_with("0x") {
        return None;
    }
    let name = match server.rsplit_once('@') {
        Some((n, _)) => n,
        None if server.parse::<SocketAddr>().is_ok() => default,
        None => server,
    };
    Some(logical_id(name))
}

/// Finds the server's pid from SERVER.
fn locate(k: &Kernel, host: &mut HostOpts, server: &str) -> Result<Pid, String> {
    locate_service(k, host, server, FILESERVER, "a file server")
}

/// Finds a service's pid from ADDR (its `default` name looked up there),
/// NAME@ADDR, NAME (through the peers) or 0xPID; `what` names it in
/// errors.
pub(crate) fn locate_service(
    k: &Kernel,
    host: &mut HostOpts,
    server: &str,
    default: &str,
    what: &str,
) -> Result<Pid, String> {
    if let Some(h) = server.strip_prefix("0x") {
        return u32::from_str_radix(h, 16)
            .map(Pid)
            .map_err(|_| format!("`{server}` is not a hex pid"));
    }
    let (name, addr) = match server.rsplit_once('@') {
        Some((n, a)) => (n, Some(a)),
        None => match server.parse::<SocketAddr>() {
            Ok(_) => (default, Some(server)),
            Err(_) => (server, None),
        },
    };
    if let Some(a) = addr {
        let a: SocketAddr = a
            .parse()
            .map_err(|_| format!("`{a}` is not an address like 127.0.0.1:7200"))?;
        k.add_peer(a);
        host.peers.push(a.into());
    }
    let p = k.create_process().map_err(|e| e.to_string())?;
    // A server that is just starting (or a busy host) may miss the first
    // query: ask again for a few seconds before giving up.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let pid = loop {
        let pid = p
            .get_pid(logical_id(name), Scope::Any)
            .map_err(|e| format!("GetPid(\"{name}\"): {e}{}", auth_hint(k)))?;
        if !pid.is_none() || std::time::Instant::now() >= give_up {
            break pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    if pid.is_none() {
        return Err(host.no_answer(k, what, name));
    }
    Ok(pid)
}

/// Runs `vkernel mount`.
pub fn run(mut a: MountArgs) -> Result<(), String> {
    if !a.mountpoint.is_dir() {
        return Err(format!("{}: not a directory", a.mountpoint.display()));
    }
    let mut cfg = a.host.config();
    cfg.send_deadline = (!a.deadline.is_zero()).then_some(a.deadline);
    let k = a.host.start_with(cfg)?;
    let server = locate(&k, &mut a.host, &a.server)?;
    let mut client = Client::connect(&k, server, a.threads.max(1) + 2)
        .map_err(|e| format!("file server {server}: {e}"))?;
    if let Some(logical_id) = service_logical_id(&a.server, FILESERVER) {
        if !a.rediscover.is_zero() {
            client.set_rediscover(Rediscover {
                logical_id,
                budget: a.rediscover,
            });
        }
    }
    let opts = FuseOptions {
        ttl: a.ttl,
        cache_ttl: a.cache_ttl,
        watch: !a.no_watch,
        threads: a.threads.max(1),
        fsname: format!("vkernel:{}", a.server),
        allow_other: a.allow_other,
        kernel_cache: !a.no_kernel_cache,
        async_removals: !a.sync_removals,
    };
    let stop = fuse::Termination::install().map_err(|e| format!("signal handlers: {e}"))?;
    let session = fuse::mount(&k, Arc::new(client), &a.mountpoint, &opts)
        .map_err(|e| format!("mounting at {}: {e}", a.mountpoint.display()))?;
    println!(
        "vkernel mount: {} (pid {server}) mounted at {}; Ctrl-C or SIGTERM unmounts",
        a.server,
        a.mountpoint.display()
    );
    let _ = std::io::stdout().flush();
    crate::notify::ready(&format!(
        "{} (pid {server}) mounted at {}",
        a.server,
        a.mountpoint.display()
    ));
    let why = stop.wait(&session);
    crate::notify::stopping(&format!("{why}; unmounting"));
    eprintln!(
        "vkernel mount: {why}; unmounting {}",
        a.mountpoint.display()
    );
    fuse::unmount(session, &a.mountpoint).map_err(|e| format!("unmount: {e}"))?;
    tracing::info!("unmounted {}", a.mountpoint.display());
    drop(k);
    Ok(())
}
