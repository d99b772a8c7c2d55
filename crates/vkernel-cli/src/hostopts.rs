//! Command-line options shared by every command that starts a logical host.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use vkernel::net::parse_duration;
use vkernel::{FaultConfig, GroupPolicy, HostId, KernelConfig, PeerSpec};

use crate::units::Size;

/// How to set up this command's logical host.
#[derive(Args, Clone, Debug)]
pub struct HostOpts {
    /// UDP address to bind (IPv4 or IPv6; port 0 picks one). Default:
    /// 127.0.0.1:0, which only this machine reaches, or 0.0.0.0:0 when a
    /// --peer is on another machine (so its answers can come back).
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// A peer logical host (repeatable) as HOST:PORT: an IP address, a
    /// broadcast address, or a DNS name standing for every address it
    /// resolves to (looked up again every --resolve-interval; a name that
    /// does not resolve yet is retried). Used to find hosts and names, and
    /// to announce our host id.
    #[arg(long = "peer", value_name = "HOST:PORT", value_parser = PeerSpec::parse)]
    pub peers: Vec<PeerSpec>,
    /// Fixed logical host id (1..=32767); default: allocate by announcement–complaint.
    #[arg(long, value_parser = parse_host_id)]
    pub host_id: Option<u16>,
    /// UDP payload size for bulk data (default: 65507 on loopback, 1472 otherwise).
    #[arg(long)]
    pub datagram_size: Option<usize>,
    /// Bulk-data flow-control window (a SIZE, e.g. 1MiB).
    #[arg(long, default_value = "1MiB", value_name = "SIZE", value_parser = Size::parse)]
    pub window: Size,
    /// Write-behind bound (a SIZE): a remote MoveTo up to this size returns
    /// once its data is sent (kept until acknowledged; the Reply to that
    /// sender waits for it); 0: every MoveTo waits for its acknowledgement.
    #[arg(long, default_value = "512KiB", value_name = "SIZE", value_parser = Size::parse)]
    pub write_behind: Size,
    /// How often peer names (--peer NAME:PORT) are looked up again.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub resolve_interval: Duration,
    /// Fail a remote operation when the peer host is silent this long.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub host_timeout: Duration,
    /// How a waiting process busy-polls before it blocks: `auto` spins at
    /// most 1 ms and only while spinning pays (learned per process from
    /// how long its waits take, how many threads spin, and whether it was
    /// preempted); `auto:DURATION` sets that cap; a DURATION always spins
    /// exactly that long (0 = always block).
    #[arg(long, default_value = "auto", value_name = "auto|DURATION", value_parser = Spin::parse)]
    pub spin: Spin,
    /// Inject faults into outgoing datagrams, e.g. `loss=0.05,dup=0.01,reorder=0.01,delay=0.1:5ms,seed=7`.
    #[arg(long, value_name = "SPEC", value_parser = FaultConfig::parse)]
    pub fault: Option<FaultConfig>,
    /// Send process-group messages by IP multicast (239.192.x.y) on this
    /// UDP port, the same on every host; default: unicast to known hosts.
    #[arg(long, value_name = "PORT")]
    pub multicast_port: Option<u16>,
    /// Accept group messages, replies and remote joins only from this
    /// logical host (repeatable); default: from any host.
    #[arg(long = "trust-host", value_name = "ID", value_parser = parse_host_id)]
    pub trust_hosts: Vec<u16>,
    /// Refuse JoinGroup requests from processes on other hosts.
    #[arg(long)]
    pub refuse_remote_joins: bool,
    /// A cluster key `ID:HEX64` (repeatable; two during a rotation): every
    /// datagram is then authenticated, and unauthenticated or forged ones
    /// are dropped and counted. Prefer --key-file (keys on the command
    /// line are visible to other users).
    #[arg(long = "key", value_name = "ID:HEX", value_parser = vkernel_proto::auth::Key::parse)]
    pub keys: Vec<vkernel_proto::auth::Key>,
    /// A file of cluster keys, one `ID:HEX64` per line (# comments allowed).
    #[arg(long, value_name = "PATH", value_parser = read_key_file)]
    pub key_file: Option<KeyFile>,
    /// With a key: how far another host's clock may be behind this one's.
    /// A datagram stamped (by its sender's clock) earlier than this host's
    /// start minus this is refused as stale, so datagrams captured before
    /// a restart cannot be replayed after it; one captured less than this
    /// before the restart still can, once. A peer whose clock is further
    /// behind is refused for that long after this host starts.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub max_clock_skew: Duration,
    /// Id of the key to send with (default: the last key given).
    #[arg(long, value_name = "ID")]
    pub send_key: Option<u8>,
    /// Also encrypt message and data, not only authenticate.
    #[arg(long)]
    pub encrypt: bool,
    /// The cipher of --encrypt: chacha20-poly1305 (the default) or
    /// aes-256-gcm (several times faster on CPUs with AES instructions).
    /// Every host of the cluster must use the same.
    #[arg(long, value_name = "NAME", requires = "encrypt", value_parser = vkernel::auth::Cipher::parse)]
    pub cipher: Option<vkernel::auth::Cipher>,
    /// Record every datagram and exchange phase in FILE (JSON lines) for
    /// `vkernel trace report`.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    /// Send everything from the host's one socket. By default small
    /// datagrams leave from a socket connected to their peer (faster),
    /// naming the main socket's port for answers: turn that off where a
    /// NAT or port mapping sits between hosts and would not map that port.
    #[arg(long)]
    pub no_side_sockets: bool,
    /// Send every bulk datagram with its own system call, not bursts of
    /// equal-sized ones as one UDP segmentation-offload (GSO) send. GSO
    /// is used by default where the kernel takes it, and turns itself
    /// off if it is refused.
    #[arg(long)]
    pub no_gso: bool,
    /// Attach to the machine host at PATH (see `vkernel host`) instead of
    /// starting a logical host of this program's own: its processes are
    /// then that host's. Without PATH: $VKERNEL_HOST, else the default
    /// socket (/run/vkernel/host.sock for root); `--attach auto` is the
    /// same. The socket options above are the machine host's business
    /// then; --spin still applies.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "auto")]
    pub attach: Option<std::path::PathBuf>,
    /// Read options from this TOML file (a section per command, plus
    /// [common]); flags given here win over it. Default: $VKERNEL_CONFIG,
    /// else /etc/vkernel/vkernel.toml if it exists. `vkernel check-config`
    /// checks a file and shows what each command would run with.
    #[arg(long = "config", id = "config", value_name = "FILE")]
    #[allow(dead_code)] // read before parsing, by config::apply
    pub config_file: Option<std::path::PathBuf>,
}

fn parse_host_id(s: &str) -> Result<u16, String> {
    let v = if let Some(h) = s.strip_prefix("0x") {
        u16::from_str_radix(h, 16)
    } else {
        s.parse()
    }
    .map_err(|_| format!("`{s}` is not a host id"))?;
    if v == 0 || v > 0x7fff {
        return Err(format!("host id {v} must be in 1..=32767"));
    }
    Ok(v)
}

/// Keys read from a `--key-file`.
#[derive(Clone, Debug)]
pub struct KeyFile(pub Vec<vkernel_proto::auth::Key>);

fn read_key_file(path: &str) -> Result<KeyFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        keys.push(
            vkernel_proto::auth::Key::parse(line).map_err(|e| format!("{path}:{}: {e}", i + 1))?,
        );
    }
    if keys.is_empty() {
        return Err(format!("{path}: no keys"));
    }
    Ok(KeyFile(keys))
}

impl HostOpts {
    /// The kernel configuration these options describe.
    pub fn config(&self) -> KernelConfig {
        let mut keys = self.keys.clone();
        if let Some(f) = &self.key_file {
            keys.extend(f.0.iter().cloned());
        }
        KernelConfig {
            keys,
            trace: self.trace.clone(),
            send_key: self.send_key,
            max_clock_skew: self.max_clock_skew,
            encrypt: self.encrypt,
            cipher: self.cipher.unwrap_or_default(),
            bind: self
                .bind
                .unwrap_or_else(|| vkernel::default_bind(&self.peers)),
            peers: self.peers.iter().filter_map(PeerSpec::addr).collect(),
            named_peers: self
                .peers
                .iter()
                .filter(|p| p.addr().is_none())
                .cloned()
                .collect(),
            resolve_interval: self.resolve_interval,
            host_id: self.host_id,
            datagram_size: self.datagram_size,
            window: self.window.to_usize(),
            write_behind: self.write_behind.to_usize(),
            host_timeout: self.host_timeout,
            spin: self.spin.max,
            adaptive_spin: self.spin.adaptive,
            faults: self.fault.clone().unwrap_or_default(),
            multicast_port: self.multicast_port,
            group_policy: GroupPolicy {
                trusted_hosts: (!self.trust_hosts.is_empty())
                    .then(|| self.trust_hosts.iter().map(|&h| HostId(h)).collect()),
                refuse_remote_joins: self.refuse_remote_joins,
            },
            side_sockets: !self.no_side_sockets,
            gso: !self.no_gso,
            #[cfg(feature = "otel")]
            otel: crate::otel::enabled(),
            ..KernelConfig::default()
        }
    }
}

impl HostOpts {
    /// Starts the logical host these options describe, or attaches to the
    /// machine host (`--attach`).
    pub fn start(&self) -> Result<vkernel::Kernel, String> {
        self.start_with(self.config())
    }

    /// [`HostOpts::start`] with a configuration the command adjusted.
    pub fn start_with(&self, cfg: KernelConfig) -> Result<vkernel::Kernel, String> {
        match self.attach_path() {
            None => vkernel::Kernel::start(cfg).map_err(|e| format!("cannot start host: {e}")),
            Some(path) => {
                vkernel::Kernel::attach_with(&path, &cfg).map_err(|e| format!("cannot attach: {e}"))
            }
        }
    }

    /// The `--peer`s as given, for messages.
    pub fn peer_list(&self) -> String {
        let v: Vec<String> = self.peers.iter().map(ToString::to_string).collect();
        v.join(", ")
    }

    /// Why no host among the `--peer`s answered a lookup by `k`: none has
    /// the name, or (bound to loopback) none could answer at all.
    pub fn no_answer(&self, k: &vkernel::Kernel, what: &str, name: &str) -> String {
        if let Some(why) = vkernel::unreachable_from(k.local_addr(), &self.peers) {
            return format!("no answer from [{}]: {why}", self.peer_list());
        }
        format!(
            "no host among [{}] has {what} registered as \"{name}\"{}",
            self.peer_list(),
            auth_hint(k)
        )
    }

    /// The machine host's socket, with `--attach`.
    pub fn attach_path(&self) -> Option<std::path::PathBuf> {
        let p = self.attach.as_ref()?;
        Some(if p.as_os_str() == "auto" {
            vkernel::attach::default_path()
        } else {
            p.clone()
        })
    }
}

/// Service names map to logical ids and groups as the library maps them.
pub use vkernel::service::{group as service_group, id as logical_id};

/// What to add to a "nobody answered" error when datagrams this host
/// received failed authentication: how many, and the likely cause (keys
/// that differ, or one side without a key). Empty when none failed.
pub fn auth_hint(k: &vkernel::Kernel) -> String {
    use vkernel_proto::auth::Reject;
    let st = k.stats();
    let bad: u64 = [
        Reject::Truncated,
        Reject::NoKey,
        Reject::UnknownKey,
        Reject::BadTag,
    ]
    .into_iter()
    .map(|r| st.auth_rejects_of(r))
    .sum();
    let refused = st.auth_refused_by_peer;
    let stale = st.auth_rejects_of(Reject::Stale);
    let mut out = String::new();
    if stale > 0 {
        out += &format!(
            "; {stale} authentic datagram{} received here bore counters from before this host started (replayed, or the sender's clock is behind by more than --max-clock-skew)",
            if stale == 1 { "" } else { "s" }
        );
    }
    if refused > 0 {
        out += &format!(
            "; peers said {refused} time{} that datagrams from here failed authentication",
            if refused == 1 { "" } else { "s" }
        );
    }
    if bad > 0 {
        out += &format!(
            "; {bad} datagram{} received here failed authentication",
            if bad == 1 { "" } else { "s" }
        );
    }
    if !out.is_empty() {
        out += " (the hosts use different cluster keys, or one has none: check --key/--key-file on both sides)";
    }
    out
}

/// The `--spin` setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spin {
    /// Spin only while it pays (up to `max`), or always `max`.
    pub adaptive: bool,
    /// The longest spin.
    pub max: Duration,
}

impl Spin {
    fn parse(s: &str) -> Result<Spin, String> {
        let s = s.trim();
        if s == "auto" {
            return Ok(Spin {
                adaptive: true,
                max: vkernel::AUTO_SPIN_CAP,
            });
        }
        if let Some(cap) = s.strip_prefix("auto:") {
            return Ok(Spin {
                adaptive: true,
                max: parse_duration(cap)?,
            });
        }
        parse_duration(s)
            .map(|max| Spin {
                adaptive: false,
                max,
            })
            .map_err(|e| format!("{e} (or `auto`, `auto:DURATION`)"))
    }
}

impl std::fmt::Display for Spin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.adaptive {
            write!(f, "adaptive spin up to {:?} then block", self.max)
        } else if self.max.is_zero() {
            write!(f, "block")
        } else {
            write!(f, "spin {:?} then block", self.max)
        }
    }
}

/// Flushes the start-up lines out, tells the service manager the command
/// is ready (`status`: what it serves), then waits until `exit_after` has
/// passed (forever without it) or a stop signal (`stop`, installed when
/// the command started). Returns when the wait
/// began.
pub fn wait_exit(stop: &crate::stop::Stop, exit_after: Option<Duration>, status: &str) -> Instant {
    let _ = std::io::stdout().flush();
    crate::notify::ready(status);
    let start = Instant::now();
    stop.wait(start, exit_after, || None);
    start
}

/// Prints a service's exit summary. Its reader may have gone by then (a
/// script that read the banner and closed the pipe), which is no reason
/// to fail the exit: the write error is dropped.
pub fn exit_summary(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// The value of a statistics counter.
pub fn counter(x: &AtomicU64) -> u64 {
    x.load(Ordering::Relaxed)
}
