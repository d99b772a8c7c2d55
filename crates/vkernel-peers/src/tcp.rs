//! Raw TCP baseline: request/response round trips on one loopback
//! connection with TCP_NODELAY, the transport most peers (gRPC, ZeroMQ,
//! Erlang distribution) use.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

use crate::net::{check_deadline, check_loopback, is_retry, stamp, LOCALHOST_V4};
use crate::pingpong::{run_pingpong, timed_rounds, total_rounds};
use crate::{BenchError, Placement, Samples, Wait, RECV_TIMEOUT};

/// [`tcp_pingpong_at`] on 127.0.0.1.
pub fn tcp_pingpong(
    size: usize,
    iters: usize,
    warmup: usize,
    wait: Wait,
    placement: Placement,
) -> Result<Samples, BenchError> {
    tcp_pingpong_at(LOCALHOST_V4, size, iters, warmup, wait, placement)
}

/// Round-trip times of `size`-byte messages (size ≥ 1) over one TCP
/// connection with TCP_NODELAY on the loopback address `bind`: the client
/// thread writes `size` bytes, the echo-server thread reads exactly `size`
/// bytes and writes them back, and the client reads them all.
///
/// `warmup` unrecorded round trips come first. With [`Wait::Spin`] both
/// ends use non-blocking sockets and busy-poll. Each message must be read
/// or written within [`RECV_TIMEOUT`] or the run fails with
/// [`BenchError::Timeout`]; a closed connection is [`BenchError::Protocol`].
pub fn tcp_pingpong_at(
    bind: IpAddr,
    size: usize,
    iters: usize,
    warmup: usize,
    wait: Wait,
    placement: Placement,
) -> Result<Samples, BenchError> {
    check_loopback(bind)?;
    if size == 0 {
        return Err(BenchError::InvalidArgument(
            "TCP ping-pong size must be at least 1 byte".into(),
        ));
    }
    let total = total_rounds(iters, warmup)?;
    let (mut cli, mut srv) = connected_streams(bind)?;
    for s in [&cli, &srv] {
        s.set_nodelay(true).map_err(BenchError::io("TCP_NODELAY"))?;
        s.set_nonblocking(wait == Wait::Spin)
            .map_err(BenchError::io("set_nonblocking"))?;
        s.set_read_timeout(Some(RECV_TIMEOUT))
            .map_err(BenchError::io("set_read_timeout"))?;
        s.set_write_timeout(Some(RECV_TIMEOUT))
            .map_err(BenchError::io("set_write_timeout"))?;
    }

    let client = move || -> Result<Samples, BenchError> {
        let mut out = vec![0x5au8; size];
        let mut inb = vec![0u8; size];
        timed_rounds(total, warmup, |k| {
            stamp(&mut out, k);
            let t = Instant::now();
            write_all(&mut cli, &out)?;
            read_exact(&mut cli, &mut inb)?;
            let rtt = t.elapsed();
            if inb != out {
                return Err(BenchError::Protocol(format!(
                    "TCP echo {k} differs from the request"
                )));
            }
            Ok(rtt)
        })
    };
    let server = move || -> Result<(), BenchError> {
        let mut buf = vec![0u8; size];
        for _ in 0..total {
            read_exact(&mut srv, &mut buf)?;
            write_all(&mut srv, &buf)?;
        }
        Ok(())
    };
    run_pingpong(placement, client, server)
}

/// A connected (client, server) pair on `ip`: the client connects in this
/// thread, then the queued connection is accepted, both bounded in time.
fn connected_streams(ip: IpAddr) -> Result<(TcpStream, TcpStream), BenchError> {
    let l =
        TcpListener::bind(SocketAddr::new(ip, 0)).map_err(BenchError::io("bind TCP listener"))?;
    l.set_nonblocking(true)
        .map_err(BenchError::io("set_nonblocking"))?;
    let addr = l.local_addr().map_err(BenchError::io("local_addr"))?;
    let cli =
        TcpStream::connect_timeout(&addr, RECV_TIMEOUT).map_err(BenchError::io("TCP connect"))?;
    let cli_addr = cli.local_addr().map_err(BenchError::io("local_addr"))?;
    let start = Instant::now();
    loop {
        match l.accept() {
            // Only our own client may take the place of the server end.
            Ok((s, peer)) if peer == cli_addr => return Ok((cli, s)),
            Ok(_) => continue,
            Err(e) if is_retry(&e) => {
                check_deadline(start, "TCP accept")?;
                std::thread::yield_now();
            }
            Err(e) => return Err(BenchError::io("TCP accept")(e)),
        }
    }
}

/// Reads exactly `buf.len()` bytes within [`RECV_TIMEOUT`], busy-polling on
/// a non-blocking socket or blocking (with the socket's read timeout).
fn read_exact(s: &mut TcpStream, buf: &mut [u8]) -> Result<(), BenchError> {
    let start = Instant::now();
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(BenchError::Protocol(
                    "TCP peer closed the connection".into(),
                ))
            }
            Ok(n) => got += n,
            Err(e) if is_retry(&e) => {
                check_deadline(start, "TCP read")?;
                if e.kind() == ErrorKind::WouldBlock {
                    std::hint::spin_loop();
                }
            }
            Err(e) => return Err(BenchError::io("TCP read")(e)),
        }
    }
    Ok(())
}

/// Writes all of `buf` within [`RECV_TIMEOUT`].
fn write_all(s: &mut TcpStream, buf: &[u8]) -> Result<(), BenchError> {
    let start = Instant::now();
    let mut put = 0;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(0) => return Err(BenchError::Protocol("TCP write returned 0".into())),
            Ok(n) => put += n,
            Err(e) if is_retry(&e) => {
                check_deadline(start, "TCP write")?;
                std::hint::spin_loop();
            }
            Err(e) => return Err(BenchError::io("TCP write")(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net_test_lock;
    use crate::{assert_refuses_bad_counts, assert_round_trips, assert_sane};
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn pingpong_block_and_spin() {
        let _g = net_test_lock();
        assert_round_trips(tcp_pingpong, &[32]);
        let s = tcp_pingpong(
            32,
            200,
            20,
            Wait::Block,
            Placement::spread().expect("spread"),
        )
        .expect("pinned");
        assert_sane(&s, 200);
    }

    #[test]
    fn pingpong_large_and_v6() {
        let _g = net_test_lock();
        // Larger than a loopback segment and the default socket buffers.
        for wait in [Wait::Block, Wait::Spin] {
            let s = tcp_pingpong(1 << 20, 5, 1, wait, Placement::UNPINNED).expect("run");
            assert_sane(&s, 5);
        }
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        if TcpListener::bind(SocketAddr::new(v6, 0)).is_ok() {
            let s = tcp_pingpong_at(v6, 64, 50, 5, Wait::Block, Placement::UNPINNED).expect("v6");
            assert_sane(&s, 50);
        }
    }

    #[test]
    fn refuses_bad_arguments() {
        assert_refuses_bad_counts(tcp_pingpong, 0);
        assert!(matches!(
            tcp_pingpong_at(
                IpAddr::V4(Ipv4Addr::new(8, 8, 8, 8)),
                1,
                1,
                0,
                Wait::Block,
                Placement::UNPINNED
            ),
            Err(BenchError::NotLoopback(_))
        ));
    }
}
