//! `vkernel fileserver`: a logical host serving one directory tree over the
//! V I/O protocol (docs/VIO.md), registered under a name for GetPid.

use std::time::Duration;

use vkernel_fs::server::{Access, AccessPolicy, FileServer, Owners, ServerConfig};

use crate::hostopts::{counter, exit_summary, logical_id, wait_exit, HostOpts};
use crate::units::Size;

/// Arguments of `vkernel fileserver`.
///
/// Serves the directory --root to V I/O clients (`vkernel mount`, the Rust
/// client in vkernel-fs): open/create, read, write, stat, readdir, mkdir,
/// rmdir, unlink, rename, truncate, fsync, symlink/readlink, link, mknod
/// (FIFOs, sockets, device nodes), chmod, chown, utimens, statfs. No path, `..` or symbolic link can reach outside
/// the root (openat2 RESOLVE_BENEATH). Requests are spread over a pool of
/// worker processes behind one registered name; the server reads ahead for
/// sequential readers and writes behind (fsync makes data durable).
#[derive(clap::Args, Debug)]
pub struct FileServerArgs {
    #[command(flatten)]
    host: HostOpts,
    /// The directory to export.
    #[arg(long, value_name = "DIR")]
    root: std::path::PathBuf,
    /// Service name the server registers under (GetPid logical id).
    #[arg(long, default_value = vkernel::service::FILESERVER)]
    name: String,
    /// Worker processes (requests executed at once).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Largest MoveTo/MoveFrom of a read or write (a SIZE, e.g. 64KiB);
    /// a read answer up to this size comes with the reply (sent ahead of
    /// it when larger than a datagram).
    #[arg(long, default_value = "1MiB", value_name = "SIZE", value_parser = Size::parse)]
    transfer_unit: Size,
    /// Read-ahead window per file (a SIZE; 0 = off).
    #[arg(long, default_value = "256KiB", value_name = "SIZE", value_parser = Size::parse)]
    read_ahead: Size,
    /// Write each WRITE to the file before replying (no write-behind).
    #[arg(long)]
    no_write_behind: bool,
    /// Give a principal access: `N=ro` or `N=rw` (or `N=none`);
    /// repeatable. Principals are authenticated only with a cluster key.
    #[arg(long, value_name = "N=ACCESS", value_parser = grant)]
    allow: Vec<(u32, Access)>,
    /// Access of principals not named by --allow: none, ro or rw.
    #[arg(long, default_value = "rw", value_name = "ACCESS")]
    default_access: Access,
    /// Who owns what clients create: `caller` (a server running as root
    /// gives it to the calling program's user and group when the request
    /// comes from principal 0, a root mount; to principal N's user and
    /// group N otherwise) or `server` (the server's own user, always).
    #[arg(long, default_value = "caller", value_name = "caller|server")]
    owners: Owners,
    /// Refuse to make device nodes (otherwise principal 0 may).
    #[arg(long)]
    no_devices: bool,
    /// Exit after this long (default: run until interrupted).
    #[arg(long, value_parser = vkernel::net::parse_duration)]
    exit_after: Option<Duration>,
}

fn grant(s: &str) -> Result<(u32, Access), String> {
    let (n, a) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected N=ro, N=rw or N=none"))?;
    let n: u32 = n
        .parse()
        .map_err(|_| format!("`{n}` is not a principal number"))?;
    Ok((n, a.parse()?))
}

/// Runs `vkernel fileserver`.
pub fn run(a: FileServerArgs) -> Result<(), String> {
    // Caught from the start: a stop during start-up is clean too.
    let stop = crate::stop::Stop::install();
    if !a.root.is_dir() {
        return Err(format!("--root {}: not a directory", a.root.display()));
    }
    let k = a.host.start()?;
    let lid = logical_id(&a.name);
    let access = AccessPolicy {
        default: a.default_access,
        principals: a.allow.iter().copied().collect(),
    };
    if (!a.allow.is_empty() || a.default_access != Access::ReadWrite)
        && a.host.config().keys.is_empty()
    {
        eprintln!("vkernel fileserver: warning: no cluster key, so the principals the access policy names are not authenticated");
    }
    let cfg = ServerConfig {
        access,
        logical_id: Some(lid),
        workers: a.workers.max(1),
        transfer_unit: a.transfer_unit.to_usize().clamp(1024, 16 << 20),
        read_ahead: a.read_ahead.to_usize().min(64 << 20),
        write_behind: !a.no_write_behind,
        owners: a.owners,
        devices: !a.no_devices,
        ..ServerConfig::default()
    };
    let srv = FileServer::start(&k, &a.root, cfg).map_err(|e| e.to_string())?;
    let status = format!(
        "host {} listening on {}; \"{}\" (logical id {:#x}) = pid {}; exporting {}",
        k.host_id(),
        k.local_addr(),
        a.name,
        lid,
        srv.pid(),
        a.root.display()
    );
    println!("vkernel fileserver: {status}");
    let start = wait_exit(&stop, a.exit_after, &status);
    let s = srv.stats();
    exit_summary(format_args!(
        "vkernel fileserver: exiting after {:.1} s; {} requests ({} errors), {} bytes read ({} from read-ahead), {} written, {} syncs",
        start.elapsed().as_secs_f64(),
        counter(&s.requests),
        counter(&s.errors),
        counter(&s.bytes_read),
        counter(&s.read_ahead_hits),
        counter(&s.bytes_written),
        counter(&s.syncs)
    ));
    Ok(())
}
