//! A burst of bulk chunks in few system calls. A run of chunks of one size
//! to one address (the last may be shorter) leaves as one UDP_SEGMENT
//! send: the kernel cuts it into datagrams (segmentation offload, GSO), so
//! the per-datagram cost of the send path is paid once per 64 KiB. The
//! rest leave by `sendmmsg`. Headers and data stay where they are
//! (gathered), as in a single send. If the kernel refuses segmentation
//! offload once, it is not tried again on that socket.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use vkernel_proto::engine::Gathered;
use vkernel_proto::{RawBytes, RawBytesMut};

/// Largest payload of one segmented send: the IPv4 total length (65,535)
/// less the IP and UDP headers.
const GSO_MAX_BYTES: usize = 65_507;
/// Most segments in one send (the kernel's UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;
/// Messages per `sendmmsg` call.
const MMSG_MAX: usize = 64;

/// How bursts leave one socket, and what happened.
#[derive(Debug)]
pub(crate) struct Batcher {
    /// Segmentation offload is wanted and has not been refused.
    gso: AtomicBool,
    /// Segmented sends made.
    pub(crate) gso_sends: AtomicU64,
    /// Datagrams that left in segmented sends.
    pub(crate) gso_datagrams: AtomicU64,
    /// `sendmmsg` calls made.
    pub(crate) mmsg_calls: AtomicU64,
}

/// An iovec for bytes given by address: lent memory, perhaps a window
/// another program may write, over which no `&[u8]` is made.
pub(crate) fn iovec(b: RawBytes<'_>) -> libc::iovec {
    libc::iovec {
        iov_base: b.as_ptr().cast_mut().cast(),
        iov_len: b.len(),
    }
}

/// `iovs` as the `IoSlice`s (or arrays of them) the socket calls take.
/// Every iovec in `iovs` must address memory readable for `'a`.
pub(crate) fn as_io_slices<'a, T: IoVecs>(iovs: &'a [T]) -> &'a [T::Slices<'a>] {
    // SAFETY: std guarantees `IoSlice` is ABI-compatible with `iovec` on
    // Unix, so `T` and `T::Slices` have one layout; each iovec addresses
    // memory lent for the call (`iovec`'s callers), which outlives the
    // borrow of `iovs`, and only the kernel reads through it.
    unsafe { std::slice::from_raw_parts(iovs.as_ptr().cast(), iovs.len()) }
}

/// A writable iovec for bytes given by address (see [`iovec`]).
pub(crate) fn iovec_mut(mut b: RawBytesMut<'_>) -> libc::iovec {
    libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: b.len(),
    }
}

/// `iovs` as the `IoSliceMut`s a receive takes. Every iovec in `iovs` must
/// address memory writable for `'a`.
pub(crate) fn as_io_slices_mut<'a>(iovs: &'a mut [libc::iovec]) -> &'a mut [IoSliceMut<'a>] {
    // SAFETY: std guarantees `IoSliceMut` is ABI-compatible with `iovec` on
    // Unix; each iovec addresses memory writable for `'a` (the callers'
    // own buffers, or a range lent to the engine whose lock the caller
    // holds), written only by the kernel.
    unsafe { std::slice::from_raw_parts_mut(iovs.as_mut_ptr().cast(), iovs.len()) }
}

/// An iovec, or an array of them, and its `IoSlice` twin.
pub(crate) trait IoVecs {
    /// The same layout as `IoSlice`s.
    type Slices<'a>;
}

impl IoVecs for libc::iovec {
    type Slices<'a> = IoSlice<'a>;
}

impl<const N: usize> IoVecs for [libc::iovec; N] {
    type Slices<'a> = [IoSlice<'a>; N];
}

/// The length of one chunk's datagram.
fn len(g: &Gathered<'_>) -> usize {
    g.head.len() + g.data.len()
}

/// How many chunks from the start of `batch` one segmented send can carry
/// (0 or 1: none worth it).
fn gso_run(batch: &[Gathered<'_>]) -> usize {
    let Some(first) = batch.first() else { return 0 };
    let size = len(first);
    if size == 0 || 2 * size > GSO_MAX_BYTES {
        return 0;
    }
    let max = GSO_MAX_SEGMENTS.min(GSO_MAX_BYTES / size);
    let mut n = 1;
    while n < batch.len() && n < max && batch[n].to == first.to {
        let l = len(&batch[n]);
        if l == size {
            n += 1;
        } else {
            // A shorter datagram may end the run.
            if l > 0 && l < size {
                n += 1;
            }
            break;
        }
    }
    n
}

/// The control message asking for segments of `size` bytes
/// (`SOL_UDP`/`UDP_SEGMENT`, a u16), laid out as `CMSG_SPACE(2)` bytes.
fn gso_control(size: u16) -> Vec<u8> {
    let word = std::mem::size_of::<usize>();
    let align = |x: usize| x.div_ceil(word) * word;
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let mut b = vec![0u8; align(hdr) + align(2)];
    // struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; }
    b[..word].copy_from_slice(&(align(hdr) + 2).to_ne_bytes());
    b[word..word + 4].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
    b[word + 4..word + 8].copy_from_slice(&libc::UDP_SEGMENT.to_ne_bytes());
    b[align(hdr)..align(hdr) + 2].copy_from_slice(&size.to_ne_bytes());
    b
}

impl Batcher {
    /// A batcher that tries segmentation offload if `gso`.
    pub(crate) fn new(gso: bool) -> Batcher {
        Batcher {
            gso: AtomicBool::new(gso),
            gso_sends: AtomicU64::new(0),
            gso_datagrams: AtomicU64::new(0),
            mmsg_calls: AtomicU64::new(0),
        }
    }

    /// Whether segmented sends are (still) used.
    pub(crate) fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Sends `batch` in order. `single` sends one chunk the plain way
    /// (with its own retrying and error counting); it takes what the
    /// batched calls could not.
    pub(crate) fn send(
        &self,
        sock: &UdpSocket,
        batch: &[Gathered<'_>],
        single: impl Fn(&Gathered<'_>),
    ) {
        let mut i = 0;
        while i < batch.len() {
            let n = if self.gso() { gso_run(&batch[i..]) } else { 0 };
            if n >= 2 {
                match self.send_segmented(sock, &batch[i..i + n]) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::yield_now();
                        batch[i..i + n].iter().for_each(&single);
                    }
                    Err(e) => {
                        // EIO, EINVAL, ENOPROTOOPT…: no offload here.
                        tracing::debug!(
                            "UDP segmentation offload refused ({e}); sending datagrams one by one"
                        );
                        self.gso.store(false, Ordering::Relaxed);
                        batch[i..i + n].iter().for_each(&single);
                    }
                }
                i += n;
                continue;
            }
            // Singletons up to the next segmentable run, by sendmmsg.
            let mut j = i + 1;
            while j < batch.len() && j - i < MMSG_MAX && !(self.gso() && gso_run(&batch[j..]) >= 2)
            {
                j += 1;
            }
            if j - i == 1 {
                single(&batch[i]);
            } else {
                let done = self.send_many(sock, &batch[i..j]);
                batch[i + done..j].iter().for_each(&single);
            }
            i = j;
        }
    }

    /// One segmented send of `run` (same address; all one size but the
    /// last).
    fn send_segmented(&self, sock: &UdpSocket, run: &[Gathered<'_>]) -> io::Result<()> {
        let size = len(&run[0]);
        let iovs: Vec<libc::iovec> = run
            .iter()
            .flat_map(|g| [iovec(RawBytes::of(g.head)), iovec(g.data)])
            .collect();
        let bufs = as_io_slices(&iovs);
        let control = gso_control(size as u16);
        let addr = socket2::SockAddr::from(run[0].to);
        let msg = socket2::MsgHdr::new()
            .with_addr(&addr)
            .with_buffers(bufs)
            .with_control(&control);
        let s = socket2::SockRef::from(sock);
        loop {
            match s.sendmsg(&msg, libc::MSG_DONTWAIT) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
                Ok(_) => break,
            }
        }
        self.gso_sends.fetch_add(1, Ordering::Relaxed);
        self.gso_datagrams
            .fetch_add(run.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// `sendmmsg` of `msgs`; returns how many were sent (the caller sends
    /// the rest one by one).
    fn send_many(&self, sock: &UdpSocket, msgs: &[Gathered<'_>]) -> usize {
        let iovs: Vec<[libc::iovec; 2]> = msgs
            .iter()
            .map(|g| [iovec(RawBytes::of(g.head)), iovec(g.data)])
            .collect();
        let (done, calls) = sendmmsg(sock, msgs.iter().map(|g| g.to), as_io_slices(&iovs));
        self.mmsg_calls.fetch_add(calls, Ordering::Relaxed);
        done
    }
}

/// `sendmmsg` from `sock` of one datagram per element of `iovs` (its
/// parts gathered) to the matching address of `to`, in as many calls as
/// it takes: how many were sent (up to the first refusal) and the calls.
pub(crate) fn sendmmsg<const N: usize>(
    sock: &UdpSocket,
    to: impl Iterator<Item = std::net::SocketAddr>,
    iovs: &[[IoSlice<'_>; N]],
) -> (usize, u64) {
    use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags, SocketAddrAny};
    let addrs: Vec<SocketAddrAny> = to.map(SocketAddrAny::from).collect();
    let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = iovs
        .iter()
        .map(|_| SendAncillaryBuffer::default())
        .collect();
    let mut hdrs: Vec<MMsgHdr<'_>> = addrs
        .iter()
        .zip(iovs)
        .zip(controls.iter_mut())
        .map(|((a, iov), c)| MMsgHdr::new_with_addr(a, iov, c))
        .collect();
    let (mut done, mut calls) = (0, 0);
    while done < hdrs.len() {
        match rustix::net::sendmmsg(sock, &mut hdrs[done..], SendFlags::DONTWAIT) {
            Ok(0) => break,
            Ok(k) => done += k,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
        calls += 1;
    }
    (done, calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};
    use vkernel_proto::Slice;

    fn gathered<'a>(to: SocketAddr, head: &'a [u8], data: &'a Slice<'a>) -> Gathered<'a> {
        Gathered::new(to, head, data, 0..data.0.len()).unwrap()
    }

    fn joined(g: &Gathered<'_>) -> Vec<u8> {
        let mut v = g.head.to_vec();
        assert!(g.copy_data(&mut v));
        v
    }

    /// Receives datagrams on `rx` until `n` arrived or a second passed.
    fn receive(rx: &UdpSocket, n: usize) -> Vec<Vec<u8>> {
        rx.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let end = Instant::now() + Duration::from_secs(1);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65_536];
        while got.len() < n && Instant::now() < end {
            if let Ok((k, _)) = rx.recv_from(&mut buf) {
                got.push(buf[..k].to_vec());
            }
        }
        got
    }

    #[test]
    fn runs_of_one_size_to_one_address_are_found() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let (h, d, short) = ([0u8; 4], [0u8; 1000], [0u8; 10]);
        let (d, short) = (Slice(&d), Slice(&short));
        let run = [
            gathered(a, &h, &d),
            gathered(a, &h, &d),
            gathered(a, &h, &short),
            gathered(a, &h, &d),
        ];
        assert_eq!(gso_run(&run), 3, "ends with the shorter one");
        let mixed = [gathered(a, &h, &d), gathered(b, &h, &d)];
        assert_eq!(gso_run(&mixed), 1);
        let big = [0u8; 40_000];
        let big = Slice(&big);
        assert_eq!(gso_run(&[gathered(a, &h, &big), gathered(a, &h, &big)]), 0);
        let many: Vec<_> = (0..100).map(|_| gathered(a, &h, &d)).collect();
        assert_eq!(gso_run(&many), 64);
        let c = gso_control(1472);
        assert_eq!(c.len(), 24);
        assert_eq!(&c[16..18], &1472u16.to_ne_bytes());
    }

    /// Exercises both batched paths over loopback: each datagram arrives
    /// whole and in order, header and data joined, with or without
    /// segmentation offload.
    #[test]
    fn bursts_arrive_as_the_datagrams_they_stand_for() {
        for gso in [true, false] {
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let to = rx.local_addr().unwrap();
            let heads: Vec<[u8; 8]> = (0..30u8).map(|k| [k; 8]).collect();
            let data: Vec<Vec<u8>> = (0..30usize)
                .map(|k| {
                    // 20 of one size, a short one, then larger ones.
                    let n = match k {
                        0..=19 => 1200,
                        20 => 7,
                        _ => 3000 + k,
                    };
                    vec![k as u8 ^ 0x5a; n]
                })
                .collect();
            let lent: Vec<Slice<'_>> = data.iter().map(|d| Slice(d)).collect();
            let batch: Vec<_> = (0..30).map(|k| gathered(to, &heads[k], &lent[k])).collect();
            let b = Batcher::new(gso);
            let singles = AtomicU64::new(0);
            b.send(&tx, &batch, |g| {
                singles.fetch_add(1, Ordering::Relaxed);
                let _ = tx.send_to(&joined(g), g.to);
            });
            let got = receive(&rx, 30);
            assert_eq!(got.len(), 30, "gso {gso}");
            for (k, d) in got.iter().enumerate() {
                assert_eq!(d[..8], heads[k], "datagram {k} in order (gso {gso})");
                assert_eq!(d[8..], data[k][..], "datagram {k} whole (gso {gso})");
            }
            if gso {
                // Loopback has taken UDP_SEGMENT since Linux 4.18.
                assert!(b.gso(), "segmentation offload refused on loopback");
                assert_eq!(b.gso_sends.load(Ordering::Relaxed), 1);
                assert_eq!(b.gso_datagrams.load(Ordering::Relaxed), 21);
            }
            assert!(b.mmsg_calls.load(Ordering::Relaxed) >= 1, "gso {gso}");
            assert!(singles.load(Ordering::Relaxed) <= 1, "gso {gso}");
        }
    }
}
