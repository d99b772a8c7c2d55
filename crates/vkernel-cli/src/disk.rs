//! `vkernel disk` (an IPdisk server) and `vkernel disk-cli` (its client).

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use vkernel::{Kernel, Pid, Scope};
use vkernel_disk::backing::{Backing, BackingSpec};
use vkernel_disk::client::Client;
use vkernel_disk::dvd::Dvd;
use vkernel_disk::nbd::{Export, Gateway, ListenAddr};
use vkernel_disk::server::{DiskServer, ServerConfig};

use crate::hostopts::{auth_hint, counter, exit_summary, logical_id, wait_exit, HostOpts};

/// Arguments of `vkernel disk`.
///
/// Runs a logical host with an IPdisk: an emulated SCSI disk (TEST UNIT
/// READY, INQUIRY with VPD 0x00/0x80/0x83/0xB0/0xB2, READ CAPACITY 10/16,
/// READ/WRITE 6/10/16 with FUA, SYNCHRONIZE CACHE, MODE SENSE, REQUEST
/// SENSE, REPORT LUNS, UNMAP, WRITE SAME(16)) served over V IPC and
/// registered under --name. The owner (whoever presents the owner key)
/// sees the whole device and defines derived virtual devices (DVDs):
/// windows of the device, read-only or read-write, open to chosen hosts,
/// pids or keys. Writes are durable after SYNCHRONIZE CACHE or FUA.
#[derive(clap::Args, Debug)]
pub struct DiskArgs {
    #[command(flatten)]
    host: HostOpts,
    /// Backing store: `ram:SIZE` (e.g. ram:64MiB), `file:PATH` (an
    /// existing file), `file:PATH:SIZE` (created or grown to SIZE), or
    /// `dev:PATH` (a block device).
    #[arg(long, value_name = "SPEC")]
    backing: BackingSpec,
    /// Service name the disk registers under (GetPid logical id).
    #[arg(long, default_value = vkernel::service::IPDISK)]
    name: String,
    /// Logical block size in bytes (power of two, 512..=65536).
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// Worker processes: commands executed at once.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// The owner key (hex or decimal). Default: a random key, printed at start.
    #[arg(long, value_parser = parse_key)]
    owner_key: Option<u64>,
    /// A DVD defined at start (repeatable):
    /// `base=LBA,len=BLOCKS,ro|rw,allow=host:H|pid:P|key:K|any[,allow=...]`.
    #[arg(long = "dvd", value_name = "SPEC")]
    dvds: Vec<Dvd>,
    /// Also serve the whole device as an NBD export (named after --name)
    /// on HOST:PORT or unix:PATH, from this logical host: the gateway's
    /// V IPC with the disk stays local (memory copies, no datagrams),
    /// which is the fast way to give local NBD clients the disk. A gateway
    /// on another host is `vkernel nbd`.
    #[arg(long, value_name = "ADDR")]
    nbd: Option<ListenAddr>,
    /// --nbd's memory budget: request data held (read, not yet answered)
    /// over all connections; at the limit the gateway stops reading
    /// requests until replies drain (a SIZE).
    #[arg(long, value_name = "SIZE", value_parser = crate::nbd::parse_memory, default_value = "256MiB")]
    nbd_memory: crate::units::Size,
    /// --nbd's connection limit; one more is closed at once (logged).
    #[arg(long, default_value_t = vkernel_disk::nbd::DEFAULT_MAX_CONNECTIONS)]
    nbd_max_connections: usize,
    /// --nbd's handshake timeout: a connection that has not finished
    /// negotiating after this long is closed.
    #[arg(long, value_parser = vkernel::net::parse_duration, default_value = "10s")]
    nbd_handshake_timeout: Duration,
    /// Exit after this long (default: run until interrupted).
    #[arg(long, value_parser = vkernel::net::parse_duration)]
    exit_after: Option<Duration>,
}

/// Parses a key or number: `0x`-prefixed hex or decimal.
pub fn parse_key(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("`{s}` is not a number (hex with 0x, or decimal)"))
}

fn random_key() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        b = (t ^ (u64::from(std::process::id()) << 40)).to_be_bytes();
    }
    u64::from_be_bytes(b) | 1
}

/// Runs `vkernel disk`.
pub fn run(a: DiskArgs) -> Result<(), String> {
    // Caught from the start: a stop during start-up is clean too.
    let stop = crate::stop::Stop::install();
    let store = Backing::open(&a.backing).map_err(|e| e.to_string())?;
    let k = a.host.start()?;
    let key = a.owner_key.unwrap_or_else(random_key);
    let lid = logical_id(&a.name);
    let srv = DiskServer::start(
        &k,
        store,
        ServerConfig {
            logical_id: Some(lid),
            workers: a.workers.max(1),
            block_size: a.block_size,
            owner_key: Some(key),
            serial: format!("VK{:010X}", lid),
            ..ServerConfig::default()
        },
    )
    .map_err(|e| e.to_string())?;
    for d in a.dvds {
        let id = srv
            .define_dvd(d.clone())
            .map_err(|e| format!("--dvd {d}: {e}"))?;
        println!("vkernel disk: DVD {id}: {}", Dvd { id, ..d });
    }
    let mut status = format!(
        "host {} listening on {}; \"{}\" (logical id {:#x}) = pid {}; {} blocks of {} bytes on {}",
        k.host_id(),
        k.local_addr(),
        a.name,
        lid,
        srv.pid(),
        srv.blocks(),
        srv.block_size(),
        srv.backing(),
    );
    // The key goes to stdout (the journal), never into STATUS=, which
    // every user may read.
    println!("vkernel disk: {status}; owner key {key:#018x}");
    let mut gw = match &a.nbd {
        Some(addr) => {
            let c = Client::open(&k, srv.pid(), 0, key, 32)
                .map_err(|e| format!("--nbd: cannot open the disk: {e}"))?;
            let export = Export {
                name: a.name.clone(),
                description: format!("vkernel IPdisk {} (pid {})", a.name, srv.pid()),
                dev: Arc::new(c),
            };
            let lim =
                crate::nbd::limits(a.nbd_memory, a.nbd_max_connections, a.nbd_handshake_timeout);
            let gw = Gateway::start_with(addr, vec![export], lim)
                .map_err(|e| format!("--nbd: cannot listen on {addr}: {e}"))?;
            println!("vkernel disk: NBD export \"{}\" on {}", a.name, gw.addr());
            status += &format!("; NBD export on {}", gw.addr());
            Some(gw)
        }
        None => None,
    };
    let start = wait_exit(&stop, a.exit_after, &status);
    if let Some(g) = gw.as_mut() {
        g.stop();
    }
    let s = srv.stats();
    exit_summary(format_args!(
        "vkernel disk: exiting after {:.1} s; {} commands ({} CHECK CONDITION, {} refused), {} bytes read, {} written, {} syncs",
        start.elapsed().as_secs_f64(),
        counter(&s.commands),
        counter(&s.check_conditions),
        counter(&s.refused),
        counter(&s.bytes_read),
        counter(&s.bytes_written),
        counter(&s.syncs)
    ));
    Ok(())
}

/// The logical id of a disk named by service name (`NAME[:DVD]`); `None`
/// for a disk given by pid.
pub fn named_logical_id(target: &str) -> Option<u32> {
    let who = target.rsplit_once(':').map_or(target, |(w, _)| w);
    (!who.starts_with("0x")).then(|| logical_id(who))
}

/// Finds a disk (`NAME_OR_PID[:DVD]`) and opens it from `k`.
pub fn connect(k: &Kernel, target: &str, key: u64, depth: usize) -> Result<Client, String> {
    let (who, dvd) = match target.rsplit_once(':') {
        Some((w, d)) => (
            w,
            d.parse::<u32>()
                .map_err(|_| format!("`{d}` in `{target}` is not a DVD number"))?,
        ),
        None => (target, 0),
    };
    let p = k.create_process().map_err(|e| e.to_string())?;
    let server = match who.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16)
            .map(Pid)
            .map_err(|_| format!("`{who}` is not a hex pid"))?,
        None => {
            let pid = p
                .get_pid(logical_id(who), Scope::Any)
                .map_err(|e| format!("GetPid(\"{who}\"): {e}{}", auth_hint(k)))?;
            if pid.is_none() {
                return Err(format!(
                    "no host found a process registered as \"{who}\" (give --peer ADDR of the disk's host){}",
                    auth_hint(k)
                ));
            }
            pid
        }
    };
    drop(p);
    Client::open(k, server, dvd, key, depth)
        .map_err(|e| format!("opening {target}: {e}{}", auth_hint(k)))
}

/// Arguments of `vkernel disk-cli`.
///
/// Talks to an IPdisk as a virtual SCSI adapter: finds it by name (or
/// pid) through --peer, opens the whole device (with the owner key) or
/// one DVD (`--disk NAME:DVD`, with a DVD key if its policy wants one),
/// and runs one operation.
#[derive(clap::Args, Debug)]
pub struct DiskCliArgs {
    #[command(flatten)]
    host: HostOpts,
    /// The disk: a service name or a 0x-hex pid, optionally `:DVD` (default 0 = whole device).
    #[arg(long, default_value = vkernel::service::IPDISK)]
    disk: String,
    /// Key to present: the owner key for DVD 0 and management, or a DVD key.
    #[arg(long = "disk-key", value_parser = parse_key, default_value = "0")]
    disk_key: u64,
    /// Commands in flight at most (processes in the client's pool).
    #[arg(long, default_value_t = 8)]
    depth: usize,
    #[command(subcommand)]
    op: DiskOp,
}

/// One disk-cli operation.
#[derive(clap::Subcommand, Debug)]
pub enum DiskOp {
    /// Standard INQUIRY data and the unit serial number.
    Inquiry,
    /// READ CAPACITY(16): blocks and block size.
    Capacity,
    /// Read bytes (block-aligned) to a file, or a hex dump to stdout.
    Read {
        /// Byte offset (a SIZE, e.g. 1MiB).
        #[arg(long, default_value = "0", value_name = "SIZE", value_parser = parse_sz)]
        offset: u64,
        /// Bytes to read (a SIZE).
        #[arg(long, default_value = "512B", value_name = "SIZE", value_parser = parse_sz)]
        length: u64,
        /// Write the data to this file instead of a hex dump.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Write bytes (block-aligned) from a file or a repeated byte.
    Write {
        /// Byte offset (a SIZE, e.g. 1MiB).
        #[arg(long, default_value = "0", value_name = "SIZE", value_parser = parse_sz)]
        offset: u64,
        /// Data to write (its length must be a multiple of the block size).
        #[arg(long, conflicts_with = "pattern")]
        input: Option<std::path::PathBuf>,
        /// Or: this byte repeated --length times.
        #[arg(long, value_parser = parse_key)]
        pattern: Option<u64>,
        /// Bytes for --pattern (a SIZE).
        #[arg(long, default_value = "512B", value_name = "SIZE", value_parser = parse_sz)]
        length: u64,
        /// Force unit access: durable when the command completes.
        #[arg(long)]
        fua: bool,
    },
    /// SYNCHRONIZE CACHE: every completed write becomes durable.
    Flush,
    /// Owner: list the DVDs.
    DvdList,
    /// Owner: define a DVD (`id=0` or no id: a new one) or change one (`id=N`).
    DvdSet {
        /// `[id=N,]base=LBA,len=BLOCKS,ro|rw,allow=host:H|pid:P|key:K|any[,allow=...]`
        spec: Dvd,
    },
    /// Owner: revoke a DVD (its clients' next commands fail).
    DvdRevoke {
        /// The DVD id.
        id: u32,
    },
}

fn parse_sz(s: &str) -> Result<u64, String> {
    crate::units::Size::parse(s).map(|n| n.0)
}

/// Runs `vkernel disk-cli`.
pub fn run_cli(a: DiskCliArgs) -> Result<(), String> {
    let k = a.host.start()?;
    let c = connect(&k, &a.disk, a.disk_key, a.depth.max(1))?;
    let e = |e: vkernel_disk::client::ClientError| e.to_string();
    match a.op {
        DiskOp::Inquiry => {
            let (v, p, r) = c.inquiry().map_err(e)?;
            let serial = c.serial().map_err(e)?;
            println!("vendor {v:?} product {p:?} revision {r:?} serial {serial:?}");
        }
        DiskOp::Capacity => {
            let (n, bs) = c.capacity().map_err(e)?;
            let g = c.geometry();
            println!(
                "{n} blocks of {bs} bytes ({} bytes){}{}",
                n * u64::from(bs),
                if g.read_only { ", read-only" } else { "" },
                if g.owner { ", owner" } else { "" }
            );
        }
        DiskOp::Read {
            offset,
            length,
            out,
        } => {
            let n = usize::try_from(length).map_err(|_| "length too large".to_string())?;
            let mut buf = vec![0u8; n];
            c.read(offset, &mut buf).map_err(e)?;
            match out {
                Some(p) => std::fs::write(&p, &buf).map_err(|e| format!("{}: {e}", p.display()))?,
                None => hexdump(offset, &buf),
            }
        }
        DiskOp::Write {
            offset,
            input,
            pattern,
            length,
            fua,
        } => {
            let data = match (input, pattern) {
                (Some(p), _) => std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?,
                (None, Some(b)) => vec![b as u8; length as usize],
                (None, None) => return Err("give --input FILE or --pattern BYTE".into()),
            };
            c.write(offset, &data, fua).map_err(e)?;
            println!("wrote {} bytes at {offset}", data.len());
        }
        DiskOp::Flush => {
            c.flush().map_err(e)?;
            println!("flushed");
        }
        DiskOp::DvdList => {
            for d in c.list_dvds().map_err(e)? {
                println!("{d}");
            }
        }
        DiskOp::DvdSet { spec } => {
            // The owner's view is the whole device: a range past its end
            // is named here, not left to the server's bare refusal.
            let g = c.geometry();
            let device = g.blocks;
            if g.owner
                && spec
                    .base
                    .checked_add(spec.blocks)
                    .is_none_or(|end| end > device)
            {
                return Err(format!(
                    "dvd-set: {}",
                    vkernel_disk::dvd::DvdError::Range {
                        base: spec.base,
                        blocks: spec.blocks,
                        device
                    }
                ));
            }
            let id = c.set_dvd(&spec).map_err(|x| match x {
                vkernel_disk::client::ClientError::Refused(
                    vkernel_disk::msg::Response::Malformed,
                ) => format!(
                    "dvd-set: the disk refused `{spec}` (a range outside the device's {device} blocks, or a malformed DVD)"
                ),
                x => x.to_string(),
            })?;
            println!("DVD {id} set");
        }
        DiskOp::DvdRevoke { id } => {
            c.revoke_dvd(id).map_err(e)?;
            println!("DVD {id} revoked");
        }
    }
    Ok(())
}

fn hexdump(base: u64, b: &[u8]) {
    for (i, row) in b.chunks(16).enumerate() {
        let hex: Vec<String> = row.iter().map(|x| format!("{x:02x}")).collect();
        let txt: String = row
            .iter()
            .map(|&x| if x.is_ascii_graphic() { x as char } else { '.' })
            .collect();
        println!(
            "{:010x}  {:<47}  {txt}",
            base + 16 * i as u64,
            hex.join(" ")
        );
    }
}
