//! Engine configuration. Times are in microseconds.

use crate::pid::HostId;
use crate::wire::{FIXED_BYTES, MAX_DATAGRAM};
use std::net::SocketAddr;

/// Time in microseconds since an arbitrary epoch chosen by the runtime.
pub type Micros = u64;

/// Largest segment part that can travel appended to a Send or Reply (room
/// is always left for the authentication trailer).
pub const MAX_APPEND: usize = MAX_DATAGRAM - FIXED_BYTES - crate::auth::TRAILER_BYTES;

/// Tunables of one logical host's protocol engine.
#[derive(Clone, Debug)]
pub struct Config {
    /// Fixed logical host id, or `None` to allocate one by announcement–complaint.
    pub host_id: Option<HostId>,
    /// Where to send queries when the location of a host is unknown: a static
    /// peer list and/or a broadcast address.
    pub discovery: Vec<SocketAddr>,
    /// UDP payload size used for bulk-data chunks (MoveTo/MoveFrom).
    pub datagram_size: usize,
    /// Bulk-data bytes in flight before an acknowledgement (flow-control window).
    pub window: usize,
    /// Write-behind: a remote MoveTo of at most this many bytes, while the
    /// mover's unacknowledged write-behind MoveTos to the same process stay
    /// within it too, returns once its data is copied and sent; the kernel
    /// keeps the copy until it is acknowledged and holds the mover's Reply
    /// (or Forward) to that process until then. 0: every remote MoveTo
    /// waits for its acknowledgement.
    pub write_behind: usize,
    /// Alien descriptors (buffers for incoming remote requests), preallocated bound.
    pub alien_pool: usize,
    /// At most this many aliens held for one remote host.
    pub alien_per_host: usize,
    /// Retransmission timeout before any RTT sample.
    pub initial_rto: Micros,
    /// Floor of the adaptive retransmission timeout.
    pub min_rto: Micros,
    /// Ceiling of the adaptive retransmission timeout (after backoff).
    pub max_rto: Micros,
    /// The floor under a RemoteSend's timeout that a peer at a loopback
    /// address starts with (`Rtt::primed`): it shares this machine's
    /// CPUs, so a scheduler's or a virtual machine's stall of several ms
    /// is normal for it and a copy sent sooner is needless. 20 ms, the
    /// highest floor a needless copy raises (`rtt::HELD_MAX`), and it
    /// fades like that floor (halving over 10 s, and at each copy that
    /// proves needed). 0: none.
    pub local_send_floor: Micros,
    /// A Send/MoveTo/MoveFrom fails when the peer host is silent this long.
    pub host_timeout: Micros,
    /// An alien not heard from for this long is freed (saved replies too).
    pub alien_timeout: Micros,
    /// A remote GetPid gives up (returns the null pid) after this long.
    pub getpid_timeout: Micros,
    /// Announcement–complaint: how long to wait for a complaint.
    pub alloc_timeout: Micros,
    /// Entries in the logical host → address cache (LRU).
    pub location_cache: usize,
    /// Seed for host id choice and sequence numbers.
    pub seed: u64,
    /// Who may take part in this host's process groups.
    pub group_policy: GroupPolicy,
    /// Send group messages to an IP multicast group on this UDP port
    /// (group id → 239.192.x.y, see [`multicast_addr`]); `None`: unicast
    /// fan-out to every known host (loopback, routed peer lists).
    pub multicast_port: Option<u16>,
    /// Group deliveries (copies of group messages for local members) held
    /// at once; past it a member misses the message (counted).
    pub group_copies: usize,
    /// Keep the detailed metrics (size and latency histograms, per-peer
    /// traffic); the basic counters are always kept.
    pub metrics: bool,
    /// Authenticate (and optionally encrypt) every datagram with a cluster
    /// key; `None` accepts unauthenticated datagrams only.
    pub auth: Option<crate::auth::AuthConfig>,
    /// The port of the host's main socket, named in every datagram
    /// (`Header::reply_port`) so that the runtime may send it from another
    /// socket; 0: not named (answers go to the source port).
    pub reply_port: u16,
}

/// Membership control for process groups. Without it anyone could join a
/// group and send bogus replies (the hole the thesis names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupPolicy {
    /// If set, group messages and replies to group sends are accepted only
    /// from these logical hosts, and so are remote JoinGroup requests.
    /// (Host ids are only as trustworthy as the packets: with a cluster key
    /// configured they are authenticated.)
    pub trusted_hosts: Option<Vec<HostId>>,
    /// Refuse every JoinGroup requested by a process on another host.
    pub refuse_remote_joins: bool,
}

impl GroupPolicy {
    /// True if group traffic from `host` is accepted.
    pub fn trusts(&self, host: HostId) -> bool {
        self.trusted_hosts
            .as_ref()
            .is_none_or(|t| t.contains(&host))
    }
}

/// The IP multicast address a group id maps to: 239.192.0.0/16 indexed by
/// the low 16 bits of the id (the thesis's static table of addresses).
pub fn multicast_addr(group: crate::pid::Pid, port: u16) -> SocketAddr {
    let g = group.0 as u16;
    SocketAddr::from(([239, 192, (g >> 8) as u8, g as u8], port))
}

impl Default for Config {
    fn default() -> Config {
        Config {
            host_id: None,
            discovery: Vec::new(),
            datagram_size: MAX_DATAGRAM,
            window: 1 << 20,
            write_behind: 512 << 10,
            alien_pool: 256,
            alien_per_host: 128,
            initial_rto: 100_000,
            min_rto: 2_000,
            max_rto: 1_000_000,
            local_send_floor: crate::rtt::HELD_MAX,
            host_timeout: 3_000_000,
            alien_timeout: 8_000_000,
            getpid_timeout: 500_000,
            alloc_timeout: 500_000,
            location_cache: 1024,
            seed: 0x5eed,
            group_policy: GroupPolicy::default(),
            multicast_port: None,
            group_copies: 1024,
            auth: None,
            metrics: true,
            reply_port: 0,
        }
    }
}

impl Config {
    /// Data bytes per bulk chunk.
    pub fn chunk_bytes(&self) -> usize {
        self.datagram_size.clamp(FIXED_BYTES + 64, MAX_DATAGRAM)
            - FIXED_BYTES
            - crate::auth::TRAILER_BYTES
    }
}
