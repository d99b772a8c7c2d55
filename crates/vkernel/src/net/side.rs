//! Side sockets: one per peer, connected to it, that small datagrams
//! leave from (a connected send skips the route lookup of every
//! unconnected `sendto`); see [`SideSockets`].

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Mutex;

/// Per-peer sockets, each connected to one peer, that the engine's
/// datagrams are sent from (all but bulk chunks sent gathered from a lent
/// buffer): a send on a connected UDP socket skips the route lookup an
/// unconnected `sendto` makes every time. They only send, with the main
/// socket's send buffer size. A datagram leaving one carries the main
/// socket's port (`Header::reply_port`, `wire::field::REPLY_PORT`), so the peer answers the main socket
/// and learns it as this host's location. (Connected sockets bound to the
/// main port itself would take the peer's datagrams away from it.)
pub(super) struct SideSockets {
    /// Open-addressed by peer address. Entries are never removed, so a
    /// lookup takes no lock; `None` in an entry: send from the main socket
    /// (the address cannot be connected to: a broadcast address, say).
    pub(super) slots: Box<[std::sync::OnceLock<SideEntry>]>,
    /// Serialises opening.
    pub(super) open: Mutex<()>,
    /// The main socket's address (its port is named in every datagram).
    pub(super) main: SocketAddr,
    /// The main socket's send buffer (bytes, as the kernel reports it).
    pub(super) sndbuf: libc::c_int,
}

/// A peer's address and its side socket (`None`: use the main socket).
pub(super) struct SideEntry {
    /// [`SideSockets::key`] of `at`.
    pub(super) key: u64,
    pub(super) at: SocketAddr,
    pub(super) sock: Option<UdpSocket>,
}

/// Peers with a side socket at most; datagrams to others leave from the
/// main socket.
pub(super) const SIDE_SOCKETS: usize = 64;

/// Slots looked at for one address (from where its hash points).
const SIDE_PROBES: usize = 8;

impl SideSockets {
    pub(super) fn new(main: SocketAddr, sndbuf: libc::c_int) -> SideSockets {
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
    pub(super) fn key(to: &SocketAddr) -> u64 {
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
    pub(super) fn start(key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % SIDE_SOCKETS
    }

    /// The entry for `to` (whose [`SideSockets::key`] is `key`), if one
    /// was made (`Err`: none, and no free slot where one could be).
    pub(super) fn find(&self, key: u64, to: &SocketAddr) -> Result<Option<&SideEntry>, ()> {
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
    pub(super) fn socket_for(&self, to: SocketAddr) -> Option<&UdpSocket> {
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
