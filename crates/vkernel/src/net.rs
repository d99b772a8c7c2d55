//! The datagram layer: one UDP socket per logical host, plus optional fault
//! injection (loss, duplication, reordering, delay) applied to every
//! outgoing datagram, so the real binary can run on a "bad network".

use std::collections::BinaryHeap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Fault rates (probabilities in `0.0..=1.0`) applied to outgoing datagrams.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Drop the datagram.
    pub loss: f64,
    /// Send it twice.
    pub duplicate: f64,
    /// Hold it back and send it after the next datagram.
    pub reorder: f64,
    /// Delay it by `delay` (uniform 0..=delay).
    pub delay_rate: f64,
    /// Upper bound of an injected delay.
    pub delay: Duration,
    /// RNG seed (0 = from the clock).
    pub seed: u64,
}

impl FaultConfig {
    /// True if any fault is enabled.
    pub fn active(&self) -> bool {
        self.loss > 0.0 || self.duplicate > 0.0 || self.reorder > 0.0 || self.delay_rate > 0.0
    }

    /// Parses `loss=0.05,dup=0.01,reorder=0.01,delay=0.1:5ms,seed=7`.
    pub fn parse(s: &str) -> Result<FaultConfig, String> {
        let mut f = FaultConfig::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("fault spec `{part}`: expected key=value"))?;
            let rate = |v: &str| -> Result<f64, String> {
                let r: f64 = v
                    .parse()
                    .map_err(|_| format!("fault `{k}`: `{v}` is not a number"))?;
                if !(0.0..=1.0).contains(&r) {
                    return Err(format!("fault `{k}`: rate {r} not in 0..=1"));
                }
                Ok(r)
            };
            match k {
                "loss" => f.loss = rate(v)?,
                "dup" | "duplicate" => f.duplicate = rate(v)?,
                "reorder" => f.reorder = rate(v)?,
                "delay" => {
                    let (r, d) = v.split_once(':').unwrap_or((v, "5ms"));
                    f.delay_rate = rate(r)?;
                    f.delay = parse_duration(d)?;
                }
                "seed" => {
                    f.seed = v
                        .parse()
                        .map_err(|_| format!("fault seed `{v}` is not an integer"))?
                }
                _ => {
                    return Err(format!(
                        "unknown fault `{k}` (known: loss, dup, reorder, delay, seed)"
                    ))
                }
            }
        }
        Ok(f)
    }
}

/// Parses `5ms`, `200us`, `1s` or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "ms"), |i| (&s[..i], &s[i..]));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 5ms, 200us, 1s)"))?;
    let secs = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "us" | "µs" => n / 1e6,
        "ns" => n / 1e9,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (s, ms, us, ns)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{s}` is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The sender of a received datagram as a std address (UDP over IPv4 or
/// IPv6 only).
pub(crate) fn std_addr(a: Option<rustix::net::SocketAddrAny>) -> Option<SocketAddr> {
    SocketAddr::try_from(a?).ok()
}

/// Socket calls go through rustix, which makes the system calls itself:
/// glibc's wrappers are thread cancellation points, which in a
/// multi-threaded process cost two atomic operations per call (on each
/// of a remote exchange's four calls and every empty poll of a spinning
/// wait), and nothing here uses cancellation.
/// (Empty datagrams from `wake_from`, wake-ups, are skipped and counted
/// in `wakes`.)
fn recv_one(
    s: &UdpSocket,
    buf: &mut [u8],
    wake_from: Option<SocketAddr>,
    wakes: &mut usize,
) -> Option<(usize, SocketAddr)> {
    loop {
        match rustix::net::recvfrom(s, &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((n, _, a)) => {
                let from = std_addr(a)?;
                // A wake-up for a lone reader (`Net::wake_lone`).
                if n == 0 && Some(from) == wake_from {
                    *wakes += 1;
                    continue;
                }
                return Some((n, from));
            }
            Err(rustix::io::Errno::INTR) => continue,
            // WouldBlock, or an ICMP error surfaced on the socket: nothing to read.
            Err(_) => return None,
        }
    }
}

/// Sends the empty datagram that wakes a thread blocked reading `to`
/// (a thread's answer socket, or a host's main socket from itself).
pub(crate) fn send_wake(from: &UdpSocket, to: &SocketAddr) -> rustix::io::Result<usize> {
    rustix::net::sendto(from, &[], rustix::net::SendFlags::DONTWAIT, to)
}

/// Datagrams taken from the socket by one [`Net::recv_batch`] call.
pub struct RecvBatch {
    /// `RECV_BATCH` slots of `RECV_SLOT` bytes.
    buf: Vec<u8>,
    /// (length, sender) of each datagram taken, in order.
    got: Vec<(usize, SocketAddr)>,
    /// Where the kernel writes each sender: kept, so a call need not
    /// allocate and zero 4 KiB of them.
    names: Vec<libc::sockaddr_storage>,
    /// Empty datagrams (wake-ups) the call took and dropped.
    pub(crate) wakes: usize,
}

/// Datagrams per [`Net::recv_batch`] call.
pub(crate) const RECV_BATCH: usize = 32;
/// Bytes per slot: more than any UDP payload, so nothing is truncated.
const RECV_SLOT: usize = 1 << 16;

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch {
            buf: vec![0; RECV_BATCH * RECV_SLOT],
            got: Vec::with_capacity(RECV_BATCH),
            // SAFETY: sockaddr_storage is plain data; all zeroes is a
            // valid value.
            names: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            wakes: 0,
        }
    }
}

impl RecvBatch {
    /// The datagrams taken, in order, with their senders.
    pub fn datagrams(&self) -> impl Iterator<Item = (&[u8], SocketAddr)> {
        self.got
            .iter()
            .enumerate()
            .map(|(i, &(n, from))| (&self.buf[i * RECV_SLOT..i * RECV_SLOT + n], from))
    }

    /// How many were taken.
    pub fn len(&self) -> usize {
        self.got.len()
    }

    /// True if none was.
    pub fn is_empty(&self) -> bool {
        self.got.is_empty()
    }
}

struct Delayed {
    due: Instant,
    to: SocketAddr,
    data: Vec<u8>,
    /// The socket it leaves from (None: the main one).
    from: Option<Arc<UdpSocket>>,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        self.due == o.due
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.due.cmp(&self.due) // min-heap
    }
}

struct FaultState {
    cfg: FaultConfig,
    rng: SmallRng,
    held: Option<(SocketAddr, Vec<u8>, Option<Arc<UdpSocket>>)>,
    delayed: BinaryHeap<Delayed>,
}

/// Counters of the datagram layer.
#[derive(Debug, Default)]
pub struct NetCounters {
    /// Datagrams dropped by injected loss.
    pub injected_loss: AtomicU64,
    /// Datagrams duplicated by injection.
    pub injected_dup: AtomicU64,
    /// Datagrams reordered by injection.
    pub injected_reorder: AtomicU64,
    /// Datagrams delayed by injection.
    pub injected_delay: AtomicU64,
    /// send_to failures (e.g. buffer full, unreachable).
    pub send_errors: AtomicU64,
    /// Blocked processes woken by the socket that found nothing left to
    /// read (another thread took the datagram): the cost of a thundering
    /// herd, which exclusive wake-ups keep near zero.
    pub idle_wakes: AtomicU64,
    /// Bulk chunks whose data was received straight into the lent buffer.
    pub bulk_in_place: AtomicU64,
    /// Datagrams another reader took between the peek and the receive of
    /// an in-place chunk (handled as usual).
    pub bulk_in_place_missed: AtomicU64,
    /// Datagrams read from a thread's answer socket (answers to Sends
    /// that asked for them at their source; see `answer.rs`).
    pub answers: AtomicU64,
    /// Of those, datagrams read by a thread running due retransmission
    /// timers from the answer socket of another, blocked thread (its reply
    /// had come but it had not run yet): each one a retransmission saved.
    pub answers_for_others: AtomicU64,
    /// Datagrams read by the host's background thread (no process was
    /// reading the socket): each one that completes a process's wait is a
    /// hand-over to another thread.
    pub background_reads: AtomicU64,
    /// Completions handed to a process blocked in the kernel by another
    /// thread (an eventfd or answer-socket signal: one wake-up each).
    pub handoffs: AtomicU64,
    /// Remote Sends run by their own threads outside the engine
    /// (`KernelConfig::direct_sends`), counted as each ends (later, under
    /// contention, by a few: see `process/direct.rs`).
    pub direct_sends: AtomicU64,
    /// Times the background thread was kept off the socket because a
    /// process took a request with a deep queue behind it (it reads the
    /// socket itself once the queue is drained; `Shared::note_busy`).
    pub busy_holds: AtomicU64,
    /// Times a process sent the replies it held
    /// (`Process::set_reply_batching`): one `sendmmsg` call each, unless
    /// it held one or the fault injector is on.
    pub held_sends: AtomicU64,
    /// Replies those sent.
    pub held_datagrams: AtomicU64,
    /// Waits of a lone reader in the main socket itself (one system call
    /// where `poll` and a read take two; `Shared::enter_reader`).
    pub lone_waits: AtomicU64,
    /// Of those, ended by a wake-up (an empty datagram: a local
    /// hand-over, say) rather than a datagram to handle.
    pub lone_wakes: AtomicU64,
    /// Of those, ended by the receive timeout with nothing read (an idle
    /// server, or a wake-up lost: it then waits one timeout, ≤ 64 ms).
    pub lone_timeouts: AtomicU64,
}

/// One logical host's socket with its fault injector.
pub struct Net {
    /// Blocking mode (so a lone reader can wait in `recvmmsg` itself);
    /// every other call on it passes `MSG_DONTWAIT`.
    sock: std::sync::Arc<UdpSocket>,
    /// Where an empty datagram wakes a lone reader: the bound address,
    /// loopback for a wildcard.
    wake_to: SocketAddr,
    /// The receive timeout set on `sock`, ms (0: none yet).
    rcv_timeout_ms: AtomicU64,
    /// A lone reader waits in `sock` (`Net::recv_batch` with `wait`):
    /// nobody else reads it, and a wake-up another caller takes by
    /// accident is sent on. On its own cache line: every read of the
    /// socket looks at it, and the counters beside it are written often.
    lone: crate::vocab::CacheLine<std::sync::atomic::AtomicBool>,
    /// The group-message socket: bound to the multicast port, shared with
    /// the other logical hosts of this machine (SO_REUSEPORT).
    mcast: Option<UdpSocket>,
    /// Interface address for multicast joins and sends.
    mcast_if: std::net::Ipv4Addr,
    faults: Option<Mutex<FaultState>>,
    /// Per-peer connected sockets for small datagrams, if enabled.
    side: Option<SideSockets>,
    /// Counters.
    pub counters: NetCounters,
    rcvbuf: usize,
    /// Unique among the hosts this program ever ran (a socket's number
    /// may be reused once it is closed; this is not).
    serial: u64,
    /// Sends bursts of bulk chunks (segmentation offload, sendmmsg).
    batcher: crate::batch::Batcher,
}

/// Per-peer sockets, each connected to one peer, that the engine's
/// datagrams are sent from (all but bulk chunks sent gathered from a lent
/// buffer): a send on a connected UDP socket skips the route lookup an
/// unconnected `sendto` makes every time. They only send, with the main
/// socket's send buffer size. A datagram leaving one carries the main
/// socket's port (`Header::reply_port`, `wire::field::REPLY_PORT`), so the peer answers the main socket
/// and learns it as this host's location. (Connected sockets bound to the
/// main port itself would take the peer's datagrams away from it.)
struct SideSockets {
    /// Open-addressed by peer address. Entries are never removed, so a
    /// lookup takes no lock; `None` in an entry: send from the main socket
    /// (the address cannot be connected to: a broadcast address, say).
    slots: Box<[std::sync::OnceLock<SideEntry>]>,
    /// Serialises opening.
    open: Mutex<()>,
    /// The main socket's address (its port is named in every datagram).
    main: SocketAddr,
    /// The main socket's send buffer (bytes, as the kernel reports it).
    sndbuf: libc::c_int,
}

/// A peer's address and its side socket (`None`: use the main socket).
struct SideEntry {
    /// [`SideSockets::key`] of `at`.
    key: u64,
    at: SocketAddr,
    sock: Option<UdpSocket>,
}

/// Peers with a side socket at most; datagrams to others leave from the
/// main socket.
const SIDE_SOCKETS: usize = 64;

/// Slots looked at for one address (from where its hash points).
const SIDE_PROBES: usize = 8;

impl SideSockets {
    fn new(main: SocketAddr, sndbuf: libc::c_int) -> SideSockets {
        SideSockets {
            slots: (0..SIDE_SOCKETS)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            open: Mutex::new(()),
            main,
            sndbuf,
        }
    }

    /// `to` folded into a word: exact for IPv4 (address and port), a hash
    /// for IPv6 (an entry's full address is compared too). Where its probe
    /// sequence starts follows from it.
    fn key(to: &SocketAddr) -> u64 {
        let ip = match to.ip() {
            std::net::IpAddr::V4(a) => u64::from(u32::from(a)),
            std::net::IpAddr::V6(a) => {
                let o = a.octets();
                let (hi, lo) = o.split_at(8);
                let w = |b: &[u8]| b.iter().fold(0u64, |x, &y| x << 8 | u64::from(y));
                w(hi) ^ w(lo)
            }
        };
        ip ^ u64::from(to.port()) << 40
    }

    /// Where the probe sequence of the address with `key` starts.
    fn start(key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % SIDE_SOCKETS
    }

    /// The entry for `to` (whose [`SideSockets::key`] is `key`), if one
    /// was made (`Err`: none, and no free slot where one could be).
    fn find(&self, key: u64, to: &SocketAddr) -> Result<Option<&SideEntry>, ()> {
        let s = Self::start(key);
        for k in 0..SIDE_PROBES {
            let Some(e) = self.slots[(s + k) % SIDE_SOCKETS].get() else {
                return Ok(None);
            };
            // (The word first: one compare per slot looked at.)
            if e.key == key && e.at == *to {
                return Ok(Some(e));
            }
        }
        Err(())
    }

    /// The side socket for `to`, opened on first use; `None`: use the main
    /// socket.
    fn socket_for(&self, to: SocketAddr) -> Option<&UdpSocket> {
        if to.ip().is_multicast() {
            return None;
        }
        let key = Self::key(&to);
        // (A miss with the probe window full, as for every reply to a
        // host's many senders' answer sockets past the first few dozen,
        // costs a few comparisons and no lock.)
        if let Some(e) = self.find(key, &to).ok()? {
            return e.sock.as_ref();
        }
        let _g = match self.open.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(e) = self.find(key, &to).ok()? {
            return e.sock.as_ref();
        }
        let s = Self::start(key);
        let slot = (0..SIDE_PROBES)
            .map(|k| &self.slots[(s + k) % SIDE_SOCKETS])
            .find(|e| e.get().is_none())?;
        let sock = open_side(self.main, self.sndbuf, to).ok();
        slot.set(SideEntry { key, at: to, sock }).ok()?;
        slot.get()?.sock.as_ref()
    }
}

/// A socket on the main socket's address (any port), connected to `to`.
fn open_side(main: SocketAddr, sndbuf: libc::c_int, to: SocketAddr) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(main.ip(), 0))?;
    s.connect(to)?;
    s.set_nonblocking(true)?;
    let fd = s.as_raw_fd();
    // It only sends: a minimal receive buffer, and room for a burst as
    // large as the main socket's (the kernel reports twice what is set).
    let _ = crate::sys::setsockopt_int(fd, libc::SO_RCVBUF, 1);
    if crate::sys::setsockopt_int(fd, libc::SO_SNDBUFFORCE, sndbuf / 2).is_err() {
        let _ = crate::sys::setsockopt_int(fd, libc::SO_SNDBUF, sndbuf / 2);
    }
    Ok(s)
}

impl Net {
    /// Binds `addr` (blocking: see `sock`), sizes the socket buffers.
    pub fn bind(addr: SocketAddr, faults: FaultConfig, buffers: usize) -> io::Result<Net> {
        let sock = UdpSocket::bind(addr)?;
        let mut wake_to = sock.local_addr()?;
        if wake_to.ip().is_unspecified() {
            wake_to.set_ip(match wake_to {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let rcvbuf = crate::sys::set_socket_buffers(sock.as_raw_fd(), buffers);
        let _ = crate::sys::set_broadcast(sock.as_raw_fd());
        let faults = faults.active().then(|| {
            let seed = if faults.seed == 0 {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
                    ^ std::process::id() as u64
            } else {
                faults.seed
            };
            Mutex::new(FaultState {
                rng: SmallRng::seed_from_u64(seed),
                cfg: faults,
                held: None,
                delayed: BinaryHeap::new(),
            })
        });
        Ok(Net {
            sock: std::sync::Arc::new(sock),
            wake_to,
            rcv_timeout_ms: AtomicU64::new(0),
            lone: crate::vocab::CacheLine(std::sync::atomic::AtomicBool::new(false)),
            side: None,
            mcast: None,
            mcast_if: std::net::Ipv4Addr::UNSPECIFIED,
            faults,
            counters: NetCounters::default(),
            rcvbuf,
            serial: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            batcher: crate::batch::Batcher::new(true),
        })
    }

    /// Sends small datagrams to peers from sockets connected to them (see
    /// [`Net::send`]); the engine must name the main socket's port in each
    /// (`Config::reply_port`). Not with a fault injector, which sends from
    /// the main socket. True if enabled.
    pub fn use_side_sockets(&mut self) -> io::Result<bool> {
        if self.faults.is_some() {
            return Ok(false);
        }
        let sndbuf = crate::sys::getsockopt_int(self.sock.as_raw_fd(), libc::SO_SNDBUF)?;
        self.side = Some(SideSockets::new(self.sock.local_addr()?, sndbuf));
        Ok(true)
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Receive buffer size granted by the OS.
    pub fn rcvbuf(&self) -> usize {
        self.rcvbuf
    }

    /// Opens the group-message socket on `port` (IPv4 only): group sends
    /// to 239.192.x.y:`port` leave from this host's socket through its
    /// interface, and arrive at every host's multicast socket.
    pub fn bind_multicast(&mut self, port: u16) -> io::Result<()> {
        use socket2::{Domain, Protocol, SockRef, Socket, Type};
        let std::net::IpAddr::V4(ip) = self.sock.local_addr()?.ip() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "multicast groups need an IPv4 host address",
            ));
        };
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&SocketAddr::from(([0, 0, 0, 0], port)).into())?;
        let out = SockRef::from(&self.sock);
        if !ip.is_unspecified() {
            out.set_multicast_if_v4(&ip)?;
        }
        out.set_multicast_loop_v4(true)?;
        self.mcast_if = ip;
        self.mcast = Some(s.into());
        Ok(())
    }

    /// The multicast socket's descriptor, if one is open.
    pub fn mcast_fd(&self) -> Option<RawFd> {
        self.mcast.as_ref().map(|m| m.as_raw_fd())
    }

    /// Receives the IPv4 multicast group of `a` on this host's socket's
    /// interface (see [`Net::bind_multicast`]). Failures are counted.
    pub fn join_multicast(&self, a: SocketAddr) {
        let r = match (&self.mcast, a.ip()) {
            (Some(m), std::net::IpAddr::V4(g)) => m.join_multicast_v4(&g, &self.mcast_if),
            _ => Ok(()),
        };
        if r.is_err() {
            self.counters.send_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Stops receiving the multicast group of `a`.
    pub fn leave_multicast(&self, a: SocketAddr) {
        if let (Some(m), std::net::IpAddr::V4(g)) = (&self.mcast, a.ip()) {
            let _ = m.leave_multicast_v4(&g, &self.mcast_if);
        }
    }

    /// The socket, for registering it with an epoll set.
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// This host's serial number (see the field).
    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    /// The socket descriptor (for poll).
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Non-blocking receive. `Ok(None)` when nothing is queued. (Only
    /// from the group socket while a lone reader waits in the main one.)
    pub fn try_recv(&self, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        let mut wakes = 0;
        let r = if self.lone() {
            None
        } else {
            recv_one(&self.sock, buf, Some(self.wake_to), &mut wakes)
        };
        if wakes > 0 {
            self.pass_on_wakes(wakes);
        }
        r.or_else(|| recv_one(self.mcast.as_ref()?, buf, None, &mut 0))
    }

    /// Sends `data` to `to` from `sock` (a thread's answer socket), with
    /// the main socket's retry and error counting.
    pub(crate) fn send_from(&self, sock: &Arc<UdpSocket>, to: SocketAddr, data: &[u8]) {
        if self.faults.is_some() {
            self.inject(Some(sock), to, data.to_vec());
            return;
        }
        self.raw_send_from(Some(sock), to, data);
    }

    /// Takes the next datagram queued on `sock` (non-blocking), counted as
    /// an answer.
    pub(crate) fn recv_answer(
        &self,
        sock: &UdpSocket,
        buf: &mut [u8],
    ) -> Option<(usize, SocketAddr)> {
        let r = loop {
            match rustix::net::recvfrom(sock, &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
                // (Empty: a wake-up that came after its wait ended.)
                Ok((0, _, _)) => continue,
                Ok((n, _, a)) => break (n, std_addr(a)?),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return None,
            }
        };
        self.count_answer();
        Some(r)
    }

    /// Counts a datagram read from an answer socket.
    pub(crate) fn count_answer(&self) {
        self.counters.answers.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends `msgs` (a process's held replies) and empties it, handing
    /// the sent buffers to `recycle`: all from the main socket in
    /// `sendmmsg` calls, or one by one as [`Net::send`] does when the
    /// fault injector is on or there is only one.
    pub(crate) fn send_many(
        &self,
        msgs: &mut Vec<vkernel_proto::engine::Transmit>,
        recycle: &mut Vec<Vec<u8>>,
    ) {
        if msgs.is_empty() {
            return;
        }
        self.counters.held_sends.fetch_add(1, Ordering::Relaxed);
        self.counters
            .held_datagrams
            .fetch_add(msgs.len() as u64, Ordering::Relaxed);
        if self.faults.is_some() || msgs.len() < 2 {
            for t in msgs.drain(..) {
                if let Some(b) = self.send(t.to, t.data) {
                    recycle.push(b);
                }
            }
            return;
        }
        self.sendmmsg_from_main(msgs);
        for t in msgs.drain(..) {
            recycle.push(t.data);
        }
    }

    /// `sendmmsg` of `msgs` from the main socket; what a call refuses is
    /// sent one by one (with the usual retry and error count).
    fn sendmmsg_from_main(&self, msgs: &[vkernel_proto::engine::Transmit]) {
        let iovs: Vec<[std::io::IoSlice<'_>; 1]> = msgs
            .iter()
            .map(|t| [std::io::IoSlice::new(&t.data)])
            .collect();
        let (done, _) = crate::batch::sendmmsg(&self.sock, msgs.iter().map(|t| t.to), &iovs);
        for t in &msgs[done..] {
            self.raw_send(t.to, &t.data);
        }
    }

    fn raw_send(&self, to: SocketAddr, data: &[u8]) {
        self.raw_send_from(None, to, data);
    }

    /// Sends `data` from `from` (None: the main socket), no faults.
    fn raw_send_from(&self, from: Option<&Arc<UdpSocket>>, to: SocketAddr, data: &[u8]) {
        let sock: &UdpSocket = from.map_or(&self.sock, |s| s);
        self.retrying(|| rustix::net::sendto(sock, data, rustix::net::SendFlags::DONTWAIT, &to));
    }

    /// Copies the start of the next datagram on the main socket into
    /// `head` without taking it (`MSG_PEEK`): the length copied (at most
    /// `head.len()`) and the sender. `None` if nothing is queued.
    pub fn peek(&self, head: &mut [u8]) -> Option<(usize, SocketAddr)> {
        loop {
            let f = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
            match rustix::net::recvfrom(&*self.sock, &mut *head, f) {
                Ok((n, _, a)) => return Some((n, std_addr(a)?)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Takes up to 32 queued datagrams from the main socket in one
    /// `recvmmsg` call (none if nothing is queued): for streams of small
    /// bulk chunks, where two calls per datagram (peek, then receive in
    /// place) cost more than the copy they save. Empty datagrams
    /// (wake-ups, [`Net::wake_lone`]) are dropped and counted in
    /// `b.wakes`.
    ///
    /// `wait`: the caller is the lone reader ([`Net::set_lone`]) and
    /// blocks until a datagram comes or the receive timeout
    /// ([`Net::set_recv_timeout`]) passes.
    pub fn recv_batch(&self, b: &mut RecvBatch, wait: bool) -> usize {
        b.got.clear();
        b.wakes = 0;
        let RecvBatch {
            buf,
            got,
            names,
            wakes,
        } = b;
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; RECV_BATCH];
        for (v, slot) in iov.iter_mut().zip(buf.chunks_exact_mut(RECV_SLOT)) {
            v.iov_base = slot.as_mut_ptr().cast();
            v.iov_len = slot.len();
        }
        // SAFETY: mmsghdr is plain data (pointers, lengths, flags); all
        // zeroes is a valid value, filled in below.
        let mut hdrs: [libc::mmsghdr; RECV_BATCH] = unsafe { std::mem::zeroed() };
        for ((h, v), name) in hdrs.iter_mut().zip(iov.iter_mut()).zip(names.iter_mut()) {
            h.msg_hdr.msg_name = (name as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            h.msg_hdr.msg_iov = v;
            h.msg_hdr.msg_iovlen = 1;
        }
        let n = loop {
            // SAFETY: `hdrs` holds RECV_BATCH headers, each naming one
            // live `names` entry and one live `iov` entry, which points
            // into `buf` (RECV_SLOT bytes each); all outlive the call,
            // and nothing else touches them meanwhile. No timeout
            // argument (the socket's own applies to a waiting call).
            let r = unsafe {
                libc::recvmmsg(
                    self.sock.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    RECV_BATCH as libc::c_uint,
                    if wait {
                        libc::MSG_WAITFORONE
                    } else {
                        libc::MSG_DONTWAIT
                    },
                    std::ptr::null_mut(),
                )
            };
            if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break r;
        };
        for (i, (h, name)) in hdrs
            .iter()
            .zip(names.iter())
            .take(n.max(0) as usize)
            .enumerate()
        {
            // SAFETY: the kernel wrote a socket address of `msg_namelen`
            // bytes (at most the storage's size) into `name`.
            let addr = unsafe { socket2::SockAddr::new(*name, h.msg_hdr.msg_namelen) };
            // A sender that is not an IP address cannot be one of ours;
            // keep the slot (its data follows in order) but mark it.
            let from = addr
                .as_socket()
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            if self.is_wake(h.msg_len as usize, from) {
                *wakes += 1;
                continue;
            }
            if got.len() < i {
                // Close the gap a dropped wake-up left: slots stay in order.
                let (dst, src) = (got.len() * RECV_SLOT, i * RECV_SLOT);
                buf.copy_within(src..src + h.msg_len as usize, dst);
            }
            got.push((h.msg_len as usize, from));
        }
        if *wakes > 0 && !wait {
            self.pass_on_wakes(*wakes);
        }
        got.len()
    }

    /// Marks whether a lone reader waits in the main socket (it waits
    /// with [`Net::recv_batch`]'s `wait`, woken by [`Net::wake_lone`]).
    pub(crate) fn set_lone(&self, on: bool) {
        self.lone.store(on, Ordering::SeqCst);
    }

    /// A lone reader waits in the main socket: nobody else may read it.
    pub(crate) fn lone(&self) -> bool {
        self.lone.load(Ordering::SeqCst)
    }

    /// Wakes the lone reader: an empty datagram to the main socket (not
    /// through the fault injector).
    pub(crate) fn wake_lone(&self) {
        let _ = send_wake(&self.sock, &self.wake_to);
    }

    /// Wakes a thread blocked in a socket of this machine on the main
    /// socket's address, at `port` (an answer socket, an attached
    /// program's own socket): an empty datagram, which those skip (not
    /// through the fault injector).
    pub(crate) fn wake_answer(&self, port: u16) {
        let _ = send_wake(&self.sock, &SocketAddr::new(self.wake_to.ip(), port));
    }

    /// A datagram of `len` bytes from `from` is a wake-up: empty, and
    /// sent by this socket to itself (an empty one from elsewhere is
    /// malformed, and counted as such).
    fn is_wake(&self, len: usize, from: SocketAddr) -> bool {
        len == 0 && from == self.wake_to
    }

    /// Wake-ups another reader took while a lone reader waited (it had
    /// begun to read just before): sent on, since they were its.
    fn pass_on_wakes(&self, n: usize) {
        if self.lone() {
            for _ in 0..n {
                self.wake_lone();
            }
        }
    }

    /// Sets how long a waiting [`Net::recv_batch`] blocks: a power of two
    /// milliseconds, at most half of `d` (a system call only when that
    /// changes). Half, because a socket's timeout ends on the kernel's
    /// tick, up to two ticks late (asked 4 ms, it sleeps 8 at 250 Hz), and
    /// the wait is for the host's next timer. False if `d` is under 8 ms:
    /// then wait otherwise (`ppoll`, to the microsecond).
    pub(crate) fn set_recv_timeout(&self, d: Duration) -> bool {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(128);
        if ms < 8 {
            return false;
        }
        let step = 1 << (ms / 2).ilog2();
        if self.rcv_timeout_ms.load(Ordering::Relaxed) == step {
            return true;
        }
        let ok = self
            .sock
            .set_read_timeout(Some(Duration::from_millis(step)))
            .is_ok();
        if ok {
            self.rcv_timeout_ms.store(step, Ordering::Relaxed);
        }
        ok
    }

    /// The main socket and where an empty datagram wakes its lone reader
    /// (what the reader's thread notes as the socket it waits in).
    pub(crate) fn lone_wait(&self) -> (std::sync::Arc<UdpSocket>, SocketAddr) {
        (self.sock.clone(), self.wake_to)
    }

    /// Takes the next datagram on the main socket, scattered over `head`,
    /// then `data`, then `rest`: its whole length and its sender. `None`
    /// if nothing is queued (nothing is written then).
    pub fn recv_parts(
        &self,
        head: &mut [u8],
        data: &mut [u8],
        rest: &mut [u8],
    ) -> Option<(usize, SocketAddr)> {
        let mut bufs = [
            io::IoSliceMut::new(head),
            io::IoSliceMut::new(data),
            io::IoSliceMut::new(rest),
        ];
        let mut control = rustix::net::RecvAncillaryBuffer::default();
        loop {
            match rustix::net::recvmsg(
                &*self.sock,
                &mut bufs,
                &mut control,
                rustix::net::RecvFlags::DONTWAIT,
            ) {
                // An empty one of ours is a wake-up (`Net::wake_lone`).
                Ok(m)
                    if m.bytes == 0
                        && std_addr(m.address.clone()).is_some_and(|a| self.is_wake(0, a)) =>
                {
                    self.pass_on_wakes(1)
                }
                Ok(m) if !m.flags.contains(rustix::net::ReturnFlags::TRUNC) => {
                    return Some((m.bytes, std_addr(m.address)?));
                }
                // Longer than all three: nothing usable (cannot happen
                // with `rest` a maximum datagram long).
                Ok(_) => return None,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return None,
            }
        }
    }

    /// True if group messages arrive on a second socket too.
    pub fn has_multicast_socket(&self) -> bool {
        self.mcast.is_some()
    }

    /// Sends one datagram made of a header and data kept elsewhere (a bulk
    /// chunk still in its lent buffer), with no copy in user space. Not
    /// through the fault injector: the caller sends this way only when
    /// none is configured.
    pub fn send_gathered(&self, to: SocketAddr, head: &[u8], data: &[u8]) {
        let bufs = [io::IoSlice::new(head), io::IoSlice::new(data)];
        self.retrying(|| {
            rustix::net::sendmsg_addr(
                &*self.sock,
                &to,
                &bufs,
                &mut Default::default(),
                rustix::net::SendFlags::DONTWAIT,
            )
        });
    }

    /// Sends a burst of bulk chunks, in order, in few system calls (see
    /// `batch.rs`). Not through the fault injector, as
    /// [`Net::send_gathered`].
    /// Injected loss (the one fault [`Net::gathers`] allows) applies to
    /// each chunk.
    pub fn send_batch(&self, batch: &[vkernel_proto::engine::Gathered<'_>]) {
        let single =
            |g: &vkernel_proto::engine::Gathered<'_>| self.send_gathered(g.to, g.head, g.data);
        let Some(f) = &self.faults else {
            return self.batcher.send(&self.sock, batch, single);
        };
        let kept: Vec<_> = {
            let mut st = match f.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let loss = st.cfg.loss;
            batch
                .iter()
                .filter(|_| {
                    let lost = st.rng.gen_bool(loss);
                    if lost {
                        self.counters.injected_loss.fetch_add(1, Ordering::Relaxed);
                    }
                    !lost
                })
                .copied()
                .collect()
        };
        self.batcher.send(&self.sock, &kept, single);
    }

    /// True if bulk chunks may be sent gathered ([`Net::send_batch`]):
    /// no fault is injected, or only loss. Duplication, reordering and
    /// delay need whole datagrams ([`Net::send`]).
    pub fn gathers(&self) -> bool {
        self.faults.as_ref().is_none_or(|f| {
            let st = match f.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let c = &st.cfg;
            c.duplicate == 0.0 && c.reorder == 0.0 && c.delay_rate == 0.0
        })
    }

    /// Turns UDP segmentation offload for bulk bursts on or off (on by
    /// default; it turns itself off if the kernel refuses it).
    pub fn set_gso(&mut self, on: bool) {
        self.batcher = crate::batch::Batcher::new(on);
    }

    /// (segmented sends, datagrams sent in them, sendmmsg calls).
    pub fn batch_counts(&self) -> (u64, u64, u64) {
        let b = &self.batcher;
        (
            b.gso_sends.load(Ordering::Relaxed),
            b.gso_datagrams.load(Ordering::Relaxed),
            b.mmsg_calls.load(Ordering::Relaxed),
        )
    }

    /// Runs a send, retrying an interrupted one, and once after a yield
    /// when the socket buffer is momentarily full; counts failures.
    fn retrying(&self, mut send: impl FnMut() -> rustix::io::Result<usize>) {
        loop {
            match send() {
                Ok(_) => return,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    std::thread::yield_now();
                    if send().is_err() {
                        self.counters.send_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                }
                Err(_) => {
                    self.counters.send_errors.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
    }

    /// Sends a datagram, through the fault injector if one is configured.
    /// Returns the buffer unless the injector kept it (to reuse).
    pub fn send(&self, to: SocketAddr, data: Vec<u8>) -> Option<Vec<u8>> {
        if self.faults.is_none() {
            // A datagram naming the main socket's port for answers may
            // leave from the peer's side socket.
            if let Some(side) = &self.side {
                let port = data.get(vkernel_proto::wire::field::REPLY_PORT);
                if port == Some(&side.main.port().to_be_bytes()[..]) {
                    if let Some(s) = side.socket_for(to) {
                        self.retrying(|| {
                            rustix::net::send(s, &data, rustix::net::SendFlags::empty())
                        });
                        return Some(data);
                    }
                }
            }
            self.raw_send(to, &data);
            return Some(data);
        }
        self.inject(None, to, data)
    }

    /// The fault injector: every datagram of this host passes here when
    /// one is configured, whichever socket it leaves from (`from`: None
    /// for the main one), so that faults apply to every path alike.
    /// Returns the buffer unless it was kept.
    fn inject(
        &self,
        from: Option<&Arc<UdpSocket>>,
        to: SocketAddr,
        data: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let Some(f) = &self.faults else {
            self.raw_send_from(from, to, &data);
            return Some(data);
        };
        let mut st = match f.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let c = &self.counters;
        let st = &mut *st;
        if st.rng.gen_bool(st.cfg.loss) {
            c.injected_loss.fetch_add(1, Ordering::Relaxed);
            return Some(data);
        }
        let copies = if st.rng.gen_bool(st.cfg.duplicate) {
            c.injected_dup.fetch_add(1, Ordering::Relaxed);
            2
        } else {
            1
        };
        if st.rng.gen_bool(st.cfg.delay_rate) {
            c.injected_delay.fetch_add(1, Ordering::Relaxed);
            let max = st.cfg.delay.as_micros() as u64;
            let d = Duration::from_micros(st.rng.gen_range(0..=max));
            for _ in 0..copies {
                st.delayed.push(Delayed {
                    due: Instant::now() + d,
                    to,
                    data: data.clone(),
                    from: from.cloned(),
                });
            }
            return Some(data);
        }
        if st.held.is_none() && st.rng.gen_bool(st.cfg.reorder) {
            c.injected_reorder.fetch_add(1, Ordering::Relaxed);
            st.held = Some((to, data, from.cloned()));
            return None;
        }
        let held = st.held.take();
        for _ in 0..copies {
            self.raw_send_from(from, to, &data);
        }
        if let Some((hto, hdata, hfrom)) = held {
            self.raw_send_from(hfrom.as_ref(), hto, &hdata);
        }
        Some(data)
    }

    /// Sends delayed and held datagrams that are due; returns when the next
    /// one falls due.
    pub fn flush_due(&self) -> Option<Instant> {
        let f = self.faults.as_ref()?;
        let mut st = match f.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let now = Instant::now();
        let mut out = Vec::new();
        // A held (reordered) datagram waits at most one flush interval.
        if let Some(h) = st.held.take() {
            out.push(h);
        }
        while st.delayed.peek().is_some_and(|d| d.due <= now) {
            if let Some(d) = st.delayed.pop() {
                out.push((d.to, d.data, d.from));
            }
        }
        let next = st.delayed.peek().map(|d| d.due);
        drop(st);
        for (to, d, from) in out {
            self.raw_send_from(from.as_ref(), to, &d);
        }
        next.or(Some(now + Duration::from_millis(1)))
    }

    /// True if fault injection is on.
    pub fn has_faults(&self) -> bool {
        self.faults.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_fault_specs() {
        let f = FaultConfig::parse("loss=0.05,dup=0.01,reorder=0.02,delay=0.1:2ms,seed=9").unwrap();
        assert_eq!(f.loss, 0.05);
        assert_eq!(f.duplicate, 0.01);
        assert_eq!(f.reorder, 0.02);
        assert_eq!(f.delay_rate, 0.1);
        assert_eq!(f.delay, Duration::from_millis(2));
        assert_eq!(f.seed, 9);
        assert!(f.active());
        assert!(FaultConfig::parse("loss=2").is_err());
        assert!(FaultConfig::parse("bogus=0.1").is_err());
        assert!(FaultConfig::parse("loss").is_err());
        assert!(!FaultConfig::parse("").unwrap().active());
        assert_eq!(parse_duration("200us").unwrap(), Duration::from_micros(200));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert!(parse_duration("5 parsecs").is_err());
    }

    /// A loopback host socket with side sockets, and its address.
    fn side_net() -> (Net, SocketAddr) {
        let mut net = Net::bind(
            "127.0.0.1:0".parse().unwrap(),
            FaultConfig::default(),
            1 << 20,
        )
        .unwrap();
        assert!(net.use_side_sockets().unwrap());
        let main = net.local_addr().unwrap();
        (net, main)
    }

    /// A datagram naming `port` for answers (`REPLY_PORT`), `n` bytes of
    /// `fill` after the head.
    fn naming_port(port: u16, fill: u8, n: usize) -> Vec<u8> {
        let mut d = vec![0x56, vkernel_proto::wire::VERSION, 3, 0, 0, 0];
        d.extend_from_slice(&port.to_be_bytes());
        d.extend(std::iter::repeat_n(fill, n));
        d
    }

    #[test]
    fn datagrams_naming_the_main_port_leave_from_a_side_socket() {
        let (net, main) = side_net();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let to = peer.local_addr().unwrap();
        let dgram = |port: u16| naming_port(port, 9, 80);
        let mut b = [0u8; 256];
        let mut sources = Vec::new();
        for _ in 0..2 {
            net.send(to, dgram(main.port()));
            let (n, from) = peer.recv_from(&mut b).unwrap();
            assert_eq!(b[..n], dgram(main.port())[..], "sent as it was");
            assert_ne!(from, main, "left from a side socket");
            assert_eq!(from.ip(), main.ip());
            sources.push(from);
        }
        assert_eq!(sources[0], sources[1], "one side socket per peer");
        let side = net
            .side
            .as_ref()
            .and_then(|t| t.find(SideSockets::key(&to), &to).ok().flatten())
            .and_then(|e| e.sock.as_ref());
        let snd = |fd| crate::sys::getsockopt_int(fd, libc::SO_SNDBUF).unwrap();
        assert_eq!(
            snd(side.expect("side socket").as_raw_fd()),
            snd(net.sock.as_raw_fd()),
            "the main socket's send buffer"
        );
        // One that does not name the main port leaves from the main socket.
        net.send(to, dgram(0));
        let (_, from) = peer.recv_from(&mut b).unwrap();
        assert_eq!(from, main);
        assert_eq!(net.counters.send_errors.load(Ordering::Relaxed), 0);
    }

    /// Two IPv6 peers whose addresses fold to one key are told apart:
    /// the entry made for one is not the other's.
    #[test]
    fn side_entries_with_one_key_are_told_apart_by_address() {
        let t = SideSockets::new("127.0.0.1:1".parse().unwrap(), 1 << 16);
        let a: SocketAddr = "[::1]:7000".parse().unwrap();
        let b: SocketAddr = "[0:0:0:1::]:7000".parse().unwrap();
        let key = SideSockets::key(&a);
        assert_eq!(key, SideSockets::key(&b), "a colliding pair");
        let slot = &t.slots[SideSockets::start(key)];
        assert!(slot
            .set(SideEntry {
                key,
                at: a,
                sock: None
            })
            .is_ok());
        assert!(matches!(t.find(key, &a), Ok(Some(e)) if e.at == a));
        assert!(matches!(t.find(key, &b), Ok(None)), "b has no entry");
        let v4: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let v4b: SocketAddr = "127.0.0.2:7000".parse().unwrap();
        assert_ne!(SideSockets::key(&v4), SideSockets::key(&v4b));
    }

    /// More peers than side sockets (a host's many senders' answer
    /// sockets): every datagram still arrives whole, those past the table
    /// from the main socket, and the table stays bounded.
    #[test]
    fn peers_past_the_side_socket_table_are_sent_to_from_the_main_socket() {
        let (net, main) = side_net();
        let d = naming_port(main.port(), 5, 40);
        let peers: Vec<UdpSocket> = (0..3 * SIDE_SOCKETS)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let mut sources = std::collections::HashSet::new();
        let mut from_main = 0;
        let mut b = [0u8; 256];
        for round in 0..2 {
            for p in &peers {
                p.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                net.send(p.local_addr().unwrap(), d.clone());
                let (n, from) = p.recv_from(&mut b).unwrap();
                assert_eq!(b[..n], d[..]);
                if from == main {
                    from_main += 1;
                } else if round == 0 {
                    assert!(sources.insert(from), "one side socket per peer");
                } else {
                    assert!(sources.contains(&from), "the same side socket again");
                }
            }
        }
        assert!(!sources.is_empty() && sources.len() <= SIDE_SOCKETS);
        assert_eq!(from_main, 2 * (peers.len() - sources.len()));
        assert_eq!(net.counters.send_errors.load(Ordering::Relaxed), 0);
    }

    /// What `poll` returns once a datagram has arrived (2 s at most).
    fn arrived<T>(mut poll: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            if let Some(r) = poll() {
                return r;
            }
            assert!(Instant::now() < deadline, "datagram never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Exercises `recv_batch`'s recvmmsg: 40 datagrams of sizes up to
    /// the largest UDP payload from two senders arrive whole, in order,
    /// with their senders, 32 at most per call.
    #[test]
    fn queued_datagrams_are_taken_in_batches() {
        let net = Net::bind(
            "127.0.0.1:0".parse().unwrap(),
            FaultConfig::default(),
            1 << 22,
        )
        .unwrap();
        let to = net.local_addr().unwrap();
        let txs = [
            UdpSocket::bind("127.0.0.1:0").unwrap(),
            UdpSocket::bind("127.0.0.1:0").unwrap(),
        ];
        let size = |k: usize| match k {
            7 => 65_507,
            9 => 0,
            _ => 1 + k * 37,
        };
        for k in 0..40 {
            txs[k % 2].send_to(&vec![k as u8; size(k)], to).unwrap();
            if k == 20 {
                // A wake-up amid the batch (the socket's own empty datagram).
                net.wake_lone();
            }
        }
        let mut b = RecvBatch::default();
        let mut got = Vec::new();
        let mut wakes = 0;
        let deadline = Instant::now() + Duration::from_secs(2);
        while got.len() < 40 && Instant::now() < deadline {
            let n = net.recv_batch(&mut b, false);
            assert!(n <= RECV_BATCH);
            assert_eq!(n, b.len());
            wakes += b.wakes;
            got.extend(b.datagrams().map(|(d, from)| (d.to_vec(), from)));
            if n == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // The wake-up is dropped and counted, and the ones after it in its
        // batch keep their order; an empty datagram from elsewhere (9) is
        // not a wake-up.
        assert_eq!(wakes, 1);
        assert_eq!(got.len(), 40);
        for (k, (d, from)) in got.iter().enumerate() {
            assert_eq!(d.len(), size(k), "datagram {k}");
            assert!(d.iter().all(|&x| x == k as u8), "datagram {k}");
            assert_eq!(*from, txs[k % 2].local_addr().unwrap(), "datagram {k}");
        }
        assert_eq!(net.recv_batch(&mut b, false), 0);
        assert!(b.is_empty());
    }

    #[test]
    fn a_datagram_is_peeked_then_received_scattered() {
        let net = Net::bind("127.0.0.1:0".parse().unwrap(), FaultConfig::default(), 0).unwrap();
        let to = net.local_addr().unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(&[1, 2, 3, 4, 5, 6, 7, 8, 9], to).unwrap();
        let mut head = [0u8; 4];
        let (k, from) = arrived(|| net.peek(&mut head));
        assert_eq!((k, head), (4, [1, 2, 3, 4]));
        assert_eq!(from, tx.local_addr().unwrap());
        let (mut h, mut d, mut r) = ([0u8; 2], [0u8; 3], [0u8; 10]);
        let (n, from) = net.recv_parts(&mut h, &mut d, &mut r).unwrap();
        assert_eq!((n, from), (9, tx.local_addr().unwrap()));
        assert_eq!((h, d), ([1, 2], [3, 4, 5]));
        assert_eq!(r[..4], [6, 7, 8, 9]);
        // Taken: nothing left to peek at or receive.
        assert!(net.peek(&mut head).is_none());
        assert!(net.recv_parts(&mut h, &mut d, &mut r).is_none());
    }

    #[test]
    fn datagrams_cross_ipv6_both_ways_with_their_senders() {
        let Ok(net) = Net::bind("[::1]:0".parse().unwrap(), FaultConfig::default(), 0) else {
            eprintln!("no IPv6 loopback here; skipped");
            return;
        };
        let to = net.local_addr().unwrap();
        let peer = UdpSocket::bind("[::1]:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        peer.send_to(b"hello", to).unwrap();
        let mut b = [0u8; 64];
        let (n, from) = arrived(|| net.try_recv(&mut b));
        assert_eq!((&b[..n], from), (&b"hello"[..], peer.local_addr().unwrap()));
        assert!(net.send(from, b"world".to_vec()).is_some());
        let (n, from) = peer.recv_from(&mut b).unwrap();
        assert_eq!((&b[..n], from), (&b"world"[..], to));
        net.send_gathered(peer.local_addr().unwrap(), b"head", b"+data");
        let (n, _) = peer.recv_from(&mut b).unwrap();
        assert_eq!(&b[..n], b"head+data");
    }

    #[test]
    fn injected_loss_drops_about_the_rate() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let f = FaultConfig {
            loss: 0.5,
            seed: 42,
            ..Default::default()
        };
        let net = Net::bind("127.0.0.1:0".parse().unwrap(), f, 1 << 20).unwrap();
        let to = rx.local_addr().unwrap();
        for _ in 0..400 {
            net.send(to, vec![1, 2, 3]);
        }
        let lost = net.counters.injected_loss.load(Ordering::Relaxed);
        assert!((120..280).contains(&lost), "lost {lost}");
        std::thread::sleep(Duration::from_millis(50));
        let mut n = 0;
        let mut b = [0u8; 16];
        while rx.recv_from(&mut b).is_ok() {
            n += 1;
        }
        assert_eq!(n as u64, 400 - lost);
    }

    #[test]
    fn delay_and_reorder_deliver_everything_eventually() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let f = FaultConfig {
            reorder: 0.3,
            delay_rate: 0.3,
            delay: Duration::from_millis(3),
            seed: 7,
            ..Default::default()
        };
        let net = Net::bind("127.0.0.1:0".parse().unwrap(), f, 1 << 20).unwrap();
        let to = rx.local_addr().unwrap();
        for i in 0..50u8 {
            net.send(to, vec![i]);
        }
        let deadline = Instant::now() + Duration::from_millis(100);
        while Instant::now() < deadline {
            net.flush_due();
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut got = Vec::new();
        let mut b = [0u8; 4];
        rx.set_nonblocking(true).unwrap();
        while let Ok((_, _)) = rx.recv_from(&mut b) {
            got.push(b[0]);
        }
        got.sort();
        assert_eq!(got, (0..50).collect::<Vec<u8>>());
        assert!(net.counters.injected_reorder.load(Ordering::Relaxed) > 0);
    }
}
