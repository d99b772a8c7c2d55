//! Raw UDP baselines, run between two threads of this process with the same
//! placement and waiting strategy as the vkernel measurements beside them.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::stats::Summary;
use crate::vkbench::Placement;

const RECV_TIMEOUT: Duration = Duration::from_secs(2);

fn socket() -> Result<UdpSocket, String> {
    let s = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    vkernel::sys::set_socket_buffers(s.as_raw_fd(), 8 << 20);
    Ok(s)
}

/// Receives one datagram, busy-polling or blocking per the placement.
/// `Ok(None)` after the bounded timeout.
fn recv(s: &UdpSocket, buf: &mut [u8], spin: bool) -> Result<Option<(usize, SocketAddr)>, String> {
    if !spin {
        return match s.recv_from(buf) {
            Ok(r) => Ok(Some(r)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(e.to_string()),
        };
    }
    let t = Instant::now();
    loop {
        match s.recv_from(buf) {
            Ok(r) => return Ok(Some(r)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if t.elapsed() > RECV_TIMEOUT {
                    return Ok(None);
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn prepare(s: &UdpSocket, spin: bool) -> Result<(), String> {
    s.set_nonblocking(spin).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(RECV_TIMEOUT))
        .map_err(|e| e.to_string())
}

/// Round-trip time of `size`-byte UDP datagrams between two threads.
pub fn udp_rtt(size: usize, iters: usize, warmup: usize, pl: Placement) -> Result<Summary, String> {
    let srv = socket()?;
    let cli = socket()?;
    let saddr = srv.local_addr().map_err(|e| e.to_string())?;
    let total = iters + warmup;
    let server = thread::spawn(move || -> Result<(), String> {
        pl.pin(1);
        prepare(&srv, pl.spin)?;
        let mut buf = vec![0u8; 65_536];
        for _ in 0..total {
            let Some((n, from)) = recv(&srv, &mut buf, pl.spin)? else {
                return Err("raw UDP echo: timed out".into());
            };
            srv.send_to(&buf[..n], from).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let client = thread::spawn(move || -> Result<Vec<Duration>, String> {
        pl.pin(0);
        prepare(&cli, pl.spin)?;
        let out = vec![0x5au8; size];
        let mut buf = vec![0u8; 65_536];
        let mut samples = Vec::with_capacity(iters);
        for k in 0..total {
            let t = Instant::now();
            cli.send_to(&out, saddr).map_err(|e| e.to_string())?;
            match recv(&cli, &mut buf, pl.spin)? {
                Some((n, _)) if n == size => {}
                Some(_) => return Err("raw UDP: short echo".into()),
                None => return Err("raw UDP ping: timed out".into()),
            }
            if k >= warmup {
                samples.push(crate::stats::sample(t));
            }
        }
        Ok(samples)
    });
    let mut samples = client.join().map_err(|_| "client panicked")??;
    server.join().map_err(|_| "server panicked")??;
    Ok(Summary::of(&mut samples))
}

/// Throughput (MB/s) of streaming `total` bytes in `dgram`-byte UDP
/// datagrams from one thread to another, which copies each payload to its
/// place in a destination buffer (memory to memory). Only bytes that
/// arrived count.
pub fn udp_blast(total: usize, dgram: usize, pl: Placement) -> Result<f64, String> {
    let rx = socket()?;
    let tx = socket()?;
    let raddr = rx.local_addr().map_err(|e| e.to_string())?;
    let payload = dgram - 8;
    let count = total.div_ceil(payload);
    let go = Arc::new(Barrier::new(2));
    let go2 = go.clone();
    let receiver = thread::spawn(move || -> Result<(usize, Duration), String> {
        pl.pin(1);
        prepare(&rx, pl.spin)?;
        rx.set_read_timeout(Some(Duration::from_millis(300)))
            .map_err(|e| e.to_string())?;
        let mut dest = vec![0u8; total];
        let mut buf = vec![0u8; 65_536];
        let mut got = 0usize;
        go2.wait();
        let start = Instant::now();
        let mut last = start;
        for _ in 0..count {
            let Some((n, _)) = recv(&rx, &mut buf, pl.spin)? else {
                break;
            };
            if n < 8 {
                continue;
            }
            let off = u64::from_be_bytes(buf[..8].try_into().unwrap_or([0; 8])) as usize;
            let len = (n - 8).min(total.saturating_sub(off));
            dest[off..off + len].copy_from_slice(&buf[8..8 + len]);
            got += len;
            last = Instant::now();
        }
        std::hint::black_box(&dest);
        Ok((got, last - start))
    });
    pl.run_as(0, || -> Result<(), String> {
        let mut out = vec![0xa5u8; dgram];
        go.wait();
        for k in 0..count {
            let off = k * payload;
            out[..8].copy_from_slice(&(off as u64).to_be_bytes());
            let len = payload.min(total - off);
            loop {
                match tx.send_to(&out[..8 + len], raddr) {
                    Ok(_) => break,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        Ok(())
    })?;
    let (got, elapsed) = receiver.join().map_err(|_| "receiver panicked")??;
    Ok(got as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6)
}

/// Round-trip time of `size`-byte messages over TCP (NODELAY) on loopback
/// between two threads, with the same placement and waiting.
pub fn tcp_rtt(size: usize, iters: usize, warmup: usize, pl: Placement) -> Result<Summary, String> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let total = iters + warmup;
    // Reads exactly buf.len() bytes, busy-polling or blocking.
    fn fill(s: &mut TcpStream, buf: &mut [u8]) -> Result<(), String> {
        let mut got = 0;
        let t = Instant::now();
        while got < buf.len() {
            match s.read(&mut buf[got..]) {
                Ok(0) => return Err("tcp: peer closed".into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if t.elapsed() > RECV_TIMEOUT {
                        return Err("tcp: timed out".into());
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }
    fn send_all(s: &mut TcpStream, mut b: &[u8]) -> Result<(), String> {
        while !b.is_empty() {
            match s.write(b) {
                Ok(n) => b = &b[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }
    let server = thread::spawn(move || -> Result<(), String> {
        pl.pin(1);
        let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_nonblocking(pl.spin).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(RECV_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; size];
        for _ in 0..total {
            fill(&mut s, &mut buf)?;
            send_all(&mut s, &buf)?;
        }
        Ok(())
    });
    let client = thread::spawn(move || -> Result<Vec<Duration>, String> {
        pl.pin(0);
        let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let out = vec![0x5au8; size];
        let mut buf = vec![0u8; size];
        s.set_read_timeout(Some(RECV_TIMEOUT))
            .map_err(|e| e.to_string())?;
        s.set_nonblocking(pl.spin).map_err(|e| e.to_string())?;
        let mut samples = Vec::with_capacity(iters);
        for k in 0..total {
            let t = Instant::now();
            send_all(&mut s, &out)?;
            fill(&mut s, &mut buf)?;
            if k >= warmup {
                samples.push(crate::stats::sample(t));
            }
        }
        Ok(samples)
    });
    let mut samples = client.join().map_err(|_| "tcp client panicked")??;
    server.join().map_err(|_| "tcp server panicked")??;
    Ok(Summary::of(&mut samples))
}
