//! Reading the host's main socket (and the group socket): one datagram
//! at a time, a `recvmmsg` batch ([`RecvBatch`]), a chunk scattered into
//! the place it is for, a thread's answer socket; and the lone reader
//! that waits in the main socket itself, with the empty datagrams that
//! wake it.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{send_wake, std_addr, Net};

/// Socket calls go through rustix, which makes the system calls itself:
/// glibc's wrappers are thread cancellation points, which in a
/// multi-threaded process cost two atomic operations per call (on each
/// of a remote exchange's four calls and every empty poll of a spinning
/// wait), and nothing here uses cancellation.
/// (Empty datagrams from `wake_from`, wake-ups, are skipped and counted
/// in `wakes`.)
pub(super) fn recv_one(
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

/// Datagrams taken from the socket by one [`Net::recv_batch`] call.
pub struct RecvBatch {
    /// `RECV_BATCH` slots of `RECV_SLOT` bytes.
    pub(super) buf: Vec<u8>,
    /// (length, sender) of each datagram taken, in order.
    pub(super) got: Vec<(usize, SocketAddr)>,
    /// Where the kernel writes each sender: kept, so a call need not
    /// allocate and zero 4 KiB of them.
    pub(super) names: Vec<libc::sockaddr_storage>,
    /// Empty datagrams (wake-ups) the call took and dropped.
    pub(crate) wakes: usize,
}

/// Datagrams per [`Net::recv_batch`] call.
pub(crate) const RECV_BATCH: usize = 32;
/// Bytes per slot: more than any UDP payload, so nothing is truncated.
pub(super) const RECV_SLOT: usize = 1 << 16;

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

impl Net {
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
                    // (`as _`: the flags are a c_int in glibc, a c_uint
                    // in musl.)
                    (if wait {
                        libc::MSG_WAITFORONE
                    } else {
                        libc::MSG_DONTWAIT
                    }) as _,
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
    pub(super) fn is_wake(&self, len: usize, from: SocketAddr) -> bool {
        len == 0 && from == self.wake_to
    }

    /// Wake-ups another reader took while a lone reader waited (it had
    /// begun to read just before): sent on, since they were its.
    pub(super) fn pass_on_wakes(&self, n: usize) {
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
        data: vkernel_proto::RawBytesMut<'_>,
        rest: &mut [u8],
    ) -> Option<(usize, SocketAddr)> {
        use crate::batch::{as_io_slices_mut, iovec_mut};
        use vkernel_proto::RawBytesMut;
        let mut iovs = [
            iovec_mut(RawBytesMut::of(head)),
            iovec_mut(data),
            iovec_mut(RawBytesMut::of(rest)),
        ];
        let bufs = as_io_slices_mut(&mut iovs);
        let mut control = rustix::net::RecvAncillaryBuffer::default();
        loop {
            match rustix::net::recvmsg(
                &*self.sock,
                &mut *bufs,
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
}
