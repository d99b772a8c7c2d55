//! The datagram layer: one UDP socket per logical host, plus optional fault
//! injection (loss, duplication, reordering, delay) applied to every
//! outgoing datagram, so the real binary can run on a "bad network".
//!
//! By concern: `faults` (the fault injector and its configuration),
//! `side` (the per-peer side sockets small datagrams leave from), `recv`
//! (reading: single datagrams, `recvmmsg` batches, in-place chunks, the
//! lone reader's wait and wake-ups); this file is [`Net`] itself and its
//! sending paths.

mod faults;
mod recv;
mod side;
#[cfg(test)]
mod tests;

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::Rng;
use vkernel_proto::RawBytes;

pub(crate) use faults::FaultState;
pub use faults::{parse_duration, FaultConfig};
pub use recv::RecvBatch;
pub(crate) use recv::RECV_BATCH;
use side::SideSockets;

/// The sender of a received datagram as a std address (UDP over IPv4 or
/// IPv6 only).
pub(crate) fn std_addr(a: Option<rustix::net::SocketAddrAny>) -> Option<SocketAddr> {
    SocketAddr::try_from(a?).ok()
}

/// Sends the empty datagram that wakes a thread blocked reading `to`
/// (a thread's answer socket, or a host's main socket from itself).
pub(crate) fn send_wake(from: &UdpSocket, to: &SocketAddr) -> rustix::io::Result<usize> {
    rustix::net::sendto(from, &[], rustix::net::SendFlags::DONTWAIT, to)
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
        let faults = FaultState::for_config(faults);
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

    /// Sends `data` to `to` from `sock` (a thread's answer socket), with
    /// the main socket's retry and error counting.
    pub(crate) fn send_from(&self, sock: &Arc<UdpSocket>, to: SocketAddr, data: &[u8]) {
        if self.faults.is_some() {
            self.inject(Some(sock), to, data.to_vec());
            return;
        }
        self.raw_send_from(Some(sock), to, data);
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
    pub(super) fn raw_send_from(&self, from: Option<&Arc<UdpSocket>>, to: SocketAddr, data: &[u8]) {
        let sock: &UdpSocket = from.map_or(&self.sock, |s| s);
        self.retrying(|| rustix::net::sendto(sock, data, rustix::net::SendFlags::DONTWAIT, &to));
    }

    /// True if group messages arrive on a second socket too.
    pub fn has_multicast_socket(&self) -> bool {
        self.mcast.is_some()
    }

    /// Sends one datagram made of a header and data kept elsewhere (a bulk
    /// chunk still in its lent buffer), with no copy in user space. Not
    /// through the fault injector: the caller sends this way only when
    /// none is configured.
    pub fn send_gathered(&self, to: SocketAddr, head: &[u8], data: RawBytes<'_>) {
        use crate::batch::{as_io_slices, iovec};
        let iovs = [iovec(RawBytes::of(head)), iovec(data)];
        let bufs = as_io_slices(&iovs);
        self.retrying(|| {
            rustix::net::sendmsg_addr(
                &*self.sock,
                &to,
                bufs,
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
}
