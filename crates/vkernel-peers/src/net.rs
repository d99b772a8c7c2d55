//! Socket helpers shared by the UDP and TCP baselines.

use std::io::{self, ErrorKind};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{BenchError, Wait};

/// Longest any single receive (or blocked send) waits before the run is
/// declared stalled.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(2);

/// 127.0.0.1, where the peers run unless told otherwise.
pub(crate) const LOCALHOST_V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Socket buffer size the blast asks for on each socket: 8 MiB.
pub const DEFAULT_SOCKET_BUFFER: usize = 8 << 20;

/// What a socket was granted when large buffers were asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketBuffers {
    /// Bytes asked for (for each of SO_RCVBUF and SO_SNDBUF).
    pub requested: usize,
    /// SO_RCVBUF as read back (Linux reports double the usable size).
    pub rcvbuf: usize,
    /// SO_SNDBUF as read back.
    pub sndbuf: usize,
    /// SO_RCVBUFFORCE succeeded (needs CAP_NET_ADMIN); otherwise SO_RCVBUF
    /// was used and the grant is capped by net.core.rmem_max.
    pub rcvbuf_forced: bool,
    /// SO_SNDBUFFORCE succeeded; otherwise capped by net.core.wmem_max.
    pub sndbuf_forced: bool,
}

fn setsockopt_int(fd: RawFd, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size; the
    // kernel only reads it. An invalid fd or option yields an error return,
    // not undefined behaviour.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt_int(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live locals; `len` holds the size of `v`,
    // so the kernel writes at most that many bytes into it.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks for `bytes` of receive and send buffer on `sock`: SO_RCVBUFFORCE /
/// SO_SNDBUFFORCE first (works as root), falling back to SO_RCVBUF /
/// SO_SNDBUF. Returns what was granted, read back from the socket.
pub fn set_socket_buffers(sock: &impl AsRawFd, bytes: usize) -> Result<SocketBuffers, BenchError> {
    let fd = sock.as_raw_fd();
    // The kernel doubles the value; keep the doubled value representable.
    let v = libc::c_int::try_from(bytes.min(i32::MAX as usize / 2)).unwrap_or(i32::MAX / 2);
    let set = |force, plain, ctx| -> Result<bool, BenchError> {
        if setsockopt_int(fd, force, v).is_ok() {
            return Ok(true);
        }
        setsockopt_int(fd, plain, v).map_err(BenchError::io(ctx))?;
        Ok(false)
    };
    let rcvbuf_forced = set(
        libc::SO_RCVBUFFORCE,
        libc::SO_RCVBUF,
        "setsockopt SO_RCVBUF",
    )?;
    let sndbuf_forced = set(
        libc::SO_SNDBUFFORCE,
        libc::SO_SNDBUF,
        "setsockopt SO_SNDBUF",
    )?;
    let get = |opt, ctx| -> Result<usize, BenchError> {
        let g = getsockopt_int(fd, opt).map_err(BenchError::io(ctx))?;
        Ok(usize::try_from(g).unwrap_or(0))
    };
    Ok(SocketBuffers {
        requested: bytes,
        rcvbuf: get(libc::SO_RCVBUF, "getsockopt SO_RCVBUF")?,
        sndbuf: get(libc::SO_SNDBUF, "getsockopt SO_SNDBUF")?,
        rcvbuf_forced,
        sndbuf_forced,
    })
}

/// Refuses anything but a loopback address.
pub(crate) fn check_loopback(ip: IpAddr) -> Result<(), BenchError> {
    if ip.is_loopback() {
        Ok(())
    } else {
        Err(BenchError::NotLoopback(ip))
    }
}

/// True for the errors that mean "nothing yet, try again".
pub(crate) fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// [`BenchError::Timeout`] for `what` once [`RECV_TIMEOUT`] has passed
/// since `start`: the bound on every retry loop of a send, read or accept.
pub(crate) fn check_deadline(start: Instant, what: &'static str) -> Result<(), BenchError> {
    if start.elapsed() >= RECV_TIMEOUT {
        Err(BenchError::timeout(what))
    } else {
        Ok(())
    }
}

/// Writes the iteration number into the first (up to 8) bytes, so a stale
/// or misdirected echo is detected.
pub(crate) fn stamp(buf: &mut [u8], k: usize) {
    let b = (k as u64).to_le_bytes();
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&b[..n]);
}

/// Sets up a socket's waiting: non-blocking for [`Wait::Spin`], blocking
/// with `timeout` on receives and sends for [`Wait::Block`].
pub(crate) fn prepare_udp(s: &UdpSocket, wait: Wait, timeout: Duration) -> Result<(), BenchError> {
    s.set_nonblocking(wait == Wait::Spin)
        .map_err(BenchError::io("set_nonblocking"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(BenchError::io("set_read_timeout"))?;
    s.set_write_timeout(Some(RECV_TIMEOUT))
        .map_err(BenchError::io("set_write_timeout"))
}

/// Receives one datagram on a connected socket, waiting per `wait` for at
/// most about `timeout` (for [`Wait::Block`] the socket's read timeout,
/// set by [`prepare_udp`], must equal `timeout`). `Ok(None)` on timeout.
pub(crate) fn recv_dgram(
    s: &UdpSocket,
    buf: &mut [u8],
    wait: Wait,
    timeout: Duration,
) -> Result<Option<usize>, BenchError> {
    let start = Instant::now();
    loop {
        match s.recv(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if is_retry(&e) => {
                if start.elapsed() >= timeout {
                    return Ok(None);
                }
                if wait == Wait::Spin {
                    std::hint::spin_loop();
                }
            }
            Err(e) => return Err(BenchError::io("recv")(e)),
        }
    }
}

/// Sends one datagram on a connected socket, retrying (spinning) while the
/// send buffer is full, for at most [`RECV_TIMEOUT`].
pub(crate) fn send_dgram(s: &UdpSocket, buf: &[u8]) -> Result<(), BenchError> {
    let start = Instant::now();
    loop {
        match s.send(buf) {
            Ok(n) if n == buf.len() => return Ok(()),
            Ok(n) => {
                return Err(BenchError::Protocol(format!(
                    "short datagram send: {n} of {} bytes",
                    buf.len()
                )))
            }
            Err(e) if is_retry(&e) || e.raw_os_error() == Some(libc::ENOBUFS) => {
                check_deadline(start, "send (buffer full)")?;
                std::hint::spin_loop();
            }
            Err(e) => return Err(BenchError::io("send")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_granted_and_read_back() {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let before = getsockopt_int(s.as_raw_fd(), libc::SO_RCVBUF).expect("get");
        let g = set_socket_buffers(&s, 4 << 20).expect("set");
        assert_eq!(g.requested, 4 << 20);
        assert!(g.rcvbuf > 0 && g.sndbuf > 0);
        if g.rcvbuf_forced {
            // Linux doubles the requested value for bookkeeping overhead.
            assert!(g.rcvbuf >= 4 << 20, "{g:?}");
        } else {
            assert!(g.rcvbuf >= usize::try_from(before).unwrap_or(0).min(4 << 20) / 2);
        }
        // Errors from the raw calls surface as io::Error, not UB.
        assert!(setsockopt_int(-1, libc::SO_RCVBUF, 1).is_err());
        assert!(getsockopt_int(-1, libc::SO_RCVBUF).is_err());
    }

    #[test]
    fn loopback_only() {
        assert!(check_loopback("127.0.0.1".parse().expect("ip")).is_ok());
        assert!(check_loopback("::1".parse().expect("ip")).is_ok());
        assert!(matches!(
            check_loopback("10.0.0.1".parse().expect("ip")),
            Err(BenchError::NotLoopback(_))
        ));
    }

    #[test]
    fn recv_times_out_both_ways() {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        s.connect(s.local_addr().expect("addr")).expect("connect");
        let mut buf = [0u8; 16];
        for wait in [Wait::Block, Wait::Spin] {
            let t = Duration::from_millis(20);
            prepare_udp(&s, wait, t).expect("prepare");
            let start = Instant::now();
            assert!(recv_dgram(&s, &mut buf, wait, t).expect("recv").is_none());
            assert!(start.elapsed() >= t);
            send_dgram(&s, b"hi").expect("send");
            assert_eq!(recv_dgram(&s, &mut buf, wait, t).expect("recv"), Some(2));
        }
    }
}
