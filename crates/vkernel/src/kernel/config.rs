//! How a logical host is set up ([`KernelConfig`]), the errors of
//! starting one ([`KernelError`]), and what `Kernel::start` derives from a
//! configuration and checks (authentication settings, datagram size).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use vkernel_proto::wire::MAX_DATAGRAM;
use vkernel_proto::{HostId, IpcError};

use crate::net::FaultConfig;

/// How a logical host is set up.
#[derive(Clone, Debug)]
pub struct KernelConfig {
    /// UDP address to bind (IPv4 or IPv6). Port 0 picks a free port.
    pub bind: SocketAddr,
    /// Static peer list and/or broadcast addresses, used to find hosts whose
    /// location is unknown, for remote GetPid and for host-id announcements.
    pub peers: Vec<SocketAddr>,
    /// Peers by name (`HOST:PORT`, see [`crate::PeerSpec`]): resolved as
    /// the host starts and again every `resolve_interval`, every address
    /// joining `peers`' role; addresses a name stops yielding are dropped.
    /// A name that does not resolve yet is a warning, not an error.
    pub named_peers: Vec<crate::PeerSpec>,
    /// How often `named_peers` are looked up again.
    pub resolve_interval: Duration,
    /// A fixed logical host id; `None` allocates one by announcement–complaint.
    pub host_id: Option<u16>,
    /// UDP payload size for bulk data; `None` picks 64 KiB on loopback and
    /// an Ethernet-MTU-sized datagram elsewhere.
    pub datagram_size: Option<usize>,
    /// Bulk-data flow-control window in bytes.
    pub window: usize,
    /// Write-behind bound in bytes: a remote MoveTo this small returns once
    /// its data is copied and sent, while the process's unacknowledged
    /// ones stay within it; its Reply to that sender waits for them (see
    /// `vkernel_proto::Config::write_behind`). 0: every MoveTo waits.
    pub write_behind: usize,
    /// A remote operation fails when the peer host is silent this long.
    pub host_timeout: Duration,
    /// The longest a waiting process busy-polls before it blocks (zero:
    /// always block).
    pub spin: Duration,
    /// Spin only as long as spinning pays, learned per process from its
    /// waits (hits vs misses, spinners vs CPUs, preemption), up to `spin`;
    /// `false` always spins all of `spin`. See `spin.rs`.
    pub adaptive_spin: bool,
    /// Default deadline of every Send of this host's processes: a Send not
    /// replied to within it fails with `IpcError::Deadline`. `None` waits
    /// as long as the server's host answers. Per process:
    /// `Process::set_send_deadline`; per call: `Process::send_within`.
    pub send_deadline: Option<Duration>,
    /// Fault injection on outgoing datagrams.
    pub faults: FaultConfig,
    /// Requested socket buffer size (receive and send).
    pub socket_buffer: usize,
    /// Preallocated alien descriptors (incoming remote requests).
    pub alien_pool: usize,
    /// Seed for host-id choice and sequence numbers (`None` = from the clock).
    pub seed: Option<u64>,
    /// Process groups over IP multicast on this UDP port (IPv4; every host
    /// of the cluster must use the same). `None`: unicast fan-out to the
    /// known hosts (loopback, static peer lists).
    pub multicast_port: Option<u16>,
    /// Who may take part in this host's process groups.
    pub group_policy: vkernel_proto::GroupPolicy,
    /// Cluster keys: with any, every datagram is authenticated (see
    /// `docs/SECURITY.md`); two are held during a key rotation.
    pub keys: Vec<vkernel_proto::auth::Key>,
    /// Id of the key to send with (default: the last of `keys`).
    pub send_key: Option<u8>,
    /// With keys: a datagram whose counter (its sender's wall clock, µs)
    /// is older than this host's start minus this is refused as stale, so
    /// nothing captured before a restart is accepted after it (see
    /// `docs/SECURITY.md`).
    pub max_clock_skew: Duration,
    /// Also encrypt message and data (with `cipher`).
    pub encrypt: bool,
    /// The AEAD when encrypting; the same on every host of a cluster.
    pub cipher: vkernel_proto::auth::Cipher,
    /// Record every datagram and exchange phase in this file (JSON lines;
    /// see `vkernel trace report`).
    pub trace: Option<std::path::PathBuf>,
    /// Keep the detailed metrics (histograms, per-peer traffic); the basic
    /// counters are always kept.
    pub metrics: bool,
    /// Send small datagrams from a socket connected to their peer (faster;
    /// every datagram names the main socket's port for answers). Not with
    /// fault injection, which sends from the main socket.
    pub side_sockets: bool,
    /// Send bursts of equal-sized bulk chunks as one UDP_SEGMENT send
    /// (segmentation offload), where the kernel takes it; off: one
    /// datagram per call (still batched by sendmmsg).
    pub gso: bool,
    /// A remote Send without a segment asks for its answers at the
    /// sending thread's own socket (one per thread and host), so the reply
    /// wakes the thread that waits for it (`waiter::answer_socket`). Needs
    /// `side_sockets`; not with fault injection, which sees every datagram
    /// at the main socket (a tracer records those of answer sockets too).
    pub answer_sockets: bool,
    /// Such a Send (see `answer_sockets`) runs on the sending thread
    /// outside the engine: no engine lock for the exchange, sequence
    /// numbers reserved in blocks (docs/PROTOCOL.md §8g). Not with a
    /// cluster key or exported spans; `VKERNEL_DIRECT_SENDS=off` in the
    /// environment turns it off.
    pub direct_sends: bool,
    /// Export a span per exchange through the global OpenTelemetry tracer
    /// provider (see `otel.rs`); feature `otel`.
    #[cfg(feature = "otel")]
    pub otel: bool,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            peers: Vec::new(),
            named_peers: Vec::new(),
            resolve_interval: Duration::from_secs(10),
            host_id: None,
            datagram_size: None,
            window: 1 << 20,
            write_behind: 512 << 10,
            host_timeout: Duration::from_secs(3),
            spin: crate::spin::AUTO_SPIN_CAP,
            adaptive_spin: true,
            send_deadline: None,
            faults: FaultConfig::default(),
            socket_buffer: 8 << 20,
            alien_pool: 1024,
            seed: None,
            multicast_port: None,
            group_policy: vkernel_proto::GroupPolicy::default(),
            keys: Vec::new(),
            send_key: None,
            max_clock_skew: Duration::from_secs(1),
            encrypt: false,
            cipher: vkernel_proto::auth::Cipher::default(),
            trace: None,
            metrics: true,
            side_sockets: true,
            gso: true,
            answer_sockets: true,
            direct_sends: true,
            #[cfg(feature = "otel")]
            otel: false,
        }
    }
}

impl KernelConfig {
    /// Checks the configuration of a host about to start at `me`: the
    /// fixed host id, the datagram size (defaulted for `me`), the keys.
    /// The datagram size and the engine's authentication settings.
    pub(super) fn check(
        &self,
        me: SocketAddr,
        seed: u64,
    ) -> Result<(usize, Option<vkernel_proto::auth::AuthConfig>), KernelError> {
        if let Some(h) = self.host_id {
            if !HostId(h).is_valid() {
                return Err(KernelError::Config(format!(
                    "host id {h:#x} must be in 1..=0x7fff"
                )));
            }
        }
        let datagram_size = self
            .datagram_size
            .unwrap_or_else(|| default_datagram(me.ip()));
        if !(256..=MAX_DATAGRAM).contains(&datagram_size) {
            return Err(KernelError::Config(format!(
                "datagram size {datagram_size} must be in 256..={MAX_DATAGRAM}"
            )));
        }
        let auth = auth_config(self, seed)?;
        Ok((datagram_size, auth))
    }

    /// The waiting strategy of every process of the host.
    pub(super) fn spin_policy(&self) -> crate::spin::SpinPolicy {
        if self.adaptive_spin {
            crate::spin::SpinPolicy::adaptive(self.spin)
        } else {
            crate::spin::SpinPolicy::fixed(self.spin)
        }
    }
}

/// Errors starting a logical host.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The socket could not be set up.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// Another host holds our fixed logical host id.
    #[error("logical host id {0} is already in use by another host")]
    HostIdConflict(HostId),
    /// The host id could not be allocated in time.
    #[error("logical host id allocation did not finish")]
    AllocationTimeout,
    /// A bad configuration value.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The kernel server could not be created.
    #[error("kernel server: {0}")]
    Ipc(#[from] IpcError),
}

/// The engine's authentication settings from the host configuration; warns
/// (once per process) when datagrams will not be authenticated.
fn auth_config(
    cfg: &KernelConfig,
    seed: u64,
) -> Result<Option<vkernel_proto::auth::AuthConfig>, KernelError> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if cfg.keys.is_empty() {
        if cfg.encrypt {
            return Err(KernelError::Config("--encrypt needs a cluster key".into()));
        }
        if !cfg.bind.ip().is_loopback() && !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "no cluster key: interkernel datagrams are not authenticated (anyone who can reach {} can speak for any host)",
                cfg.bind
            );
        }
        return Ok(None);
    }
    let send_key = match cfg.send_key {
        Some(id) => id,
        None => cfg.keys.last().map_or(0, |k| k.id),
    };
    if !cfg.keys.iter().any(|k| k.id == send_key) {
        return Err(KernelError::Config(format!(
            "send key {send_key} is not among the configured keys"
        )));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    Ok(Some(vkernel_proto::auth::AuthConfig {
        keys: cfg.keys.clone(),
        send_key,
        encrypt: cfg.encrypt,
        cipher: cfg.cipher,
        // Above any counter this host id used before a restart, and the
        // base of the floor below which counters are refused.
        counter_start: now,
        max_skew: cfg.max_clock_skew.as_micros().min(u128::from(u64::MAX)) as u64,
        salt: (seed ^ (seed >> 32)) as u32 ^ now as u32,
    }))
}

/// The bulk datagram size when none is configured: 64 KiB on loopback,
/// an Ethernet-MTU-sized datagram elsewhere.
fn default_datagram(ip: IpAddr) -> usize {
    if ip.is_loopback() {
        MAX_DATAGRAM
    } else if ip.is_ipv4() {
        1472
    } else {
        1452
    }
}
