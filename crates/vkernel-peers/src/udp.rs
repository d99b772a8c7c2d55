//! Raw UDP baselines: the network penalty (ping-pong round trip) and a
//! memory-to-memory stream (blast), optionally windowed.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::net::{
    check_deadline, check_loopback, prepare_udp, recv_dgram, send_dgram, stamp, LOCALHOST_V4,
};
use crate::pingpong::{run_pingpong, timed_rounds, total_rounds};
use crate::placement::run_pair;
use crate::{
    set_socket_buffers, BenchError, Placement, Samples, SocketBuffers, Wait, DEFAULT_SOCKET_BUFFER,
    RECV_TIMEOUT,
};

/// Largest UDP payload over IPv4: 65 535 − 20 (IP) − 8 (UDP).
pub const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload over IPv6 without jumbograms: 65 535 − 8 (UDP).
pub const MAX_UDP_PAYLOAD_V6: usize = 65_527;

/// Bytes of blast header at the start of every data datagram: the payload's
/// offset in the transfer (u64, little-endian) and an ack-request serial
/// (u32, 0 = no ack wanted).
pub const BLAST_HEADER: usize = 12;

/// Length of an ack datagram: the serial it answers (u32) and the payload
/// bytes delivered so far (u64).
const ACK_LEN: usize = 12;

/// How long the sender waits for a window ack before resending the datagram
/// that asked for it.
const ACK_TIMEOUT: Duration = Duration::from_millis(500);

/// Resends of an ack-requesting datagram before the run is declared stalled.
const ACK_RETRIES: u32 = 3;

/// The receiver's polling slice: after the sender has finished, this much
/// silence ends the run (the rest was lost).
const QUIET: Duration = Duration::from_millis(50);

fn max_payload(ip: IpAddr) -> usize {
    if ip.is_ipv4() {
        MAX_UDP_PAYLOAD_V4
    } else {
        MAX_UDP_PAYLOAD_V6
    }
}

/// Two UDP sockets on `ip`, each connected to the other.
fn connected_pair(ip: IpAddr) -> Result<(UdpSocket, UdpSocket), BenchError> {
    check_loopback(ip)?;
    let bind =
        || UdpSocket::bind(SocketAddr::new(ip, 0)).map_err(BenchError::io("bind UDP socket"));
    let (a, b) = (bind()?, bind()?);
    let aa = a.local_addr().map_err(BenchError::io("local_addr"))?;
    let ba = b.local_addr().map_err(BenchError::io("local_addr"))?;
    a.connect(ba)
        .map_err(BenchError::io("connect UDP socket"))?;
    b.connect(aa)
        .map_err(BenchError::io("connect UDP socket"))?;
    Ok((a, b))
}

/// [`udp_pingpong_at`] on 127.0.0.1.
pub fn udp_pingpong(
    size: usize,
    iters: usize,
    warmup: usize,
    wait: Wait,
    placement: Placement,
) -> Result<Samples, BenchError> {
    udp_pingpong_at(LOCALHOST_V4, size, iters, warmup, wait, placement)
}

/// Round-trip times of `size`-byte UDP datagrams between a client thread
/// and an echo-server thread of this process, each with its own socket
/// bound to `bind` (a loopback address, IPv4 or IPv6).
///
/// Runs `warmup` unrecorded round trips, then `iters` recorded ones; each
/// sample is the time from just before the client's send to just after its
/// receive of the echo. The papers' one-way network penalty is half of it
/// (see [`Summary::one_way`](crate::Summary::one_way)). The echo's length
/// and contents are checked outside the timed span.
///
/// `size` may be 0 up to [`MAX_UDP_PAYLOAD_V4`] (IPv4) or
/// [`MAX_UDP_PAYLOAD_V6`] (IPv6). Every receive waits at most
/// [`RECV_TIMEOUT`]; a lost datagram ends the run with
/// [`BenchError::Timeout`].
pub fn udp_pingpong_at(
    bind: IpAddr,
    size: usize,
    iters: usize,
    warmup: usize,
    wait: Wait,
    placement: Placement,
) -> Result<Samples, BenchError> {
    check_loopback(bind)?;
    let max = max_payload(bind);
    if size > max {
        return Err(BenchError::InvalidArgument(format!(
            "UDP ping-pong size {size} exceeds the {max}-byte datagram limit"
        )));
    }
    let total = total_rounds(iters, warmup)?;
    let (cli, srv) = connected_pair(bind)?;
    prepare_udp(&cli, wait, RECV_TIMEOUT)?;
    prepare_udp(&srv, wait, RECV_TIMEOUT)?;

    let client = || -> Result<Samples, BenchError> {
        let mut out = vec![0x5au8; size];
        // One spare byte so an oversized echo shows up as a wrong length.
        let mut inb = vec![0u8; size + 1];
        timed_rounds(total, warmup, |k| {
            stamp(&mut out, k);
            let t = Instant::now();
            send_dgram(&cli, &out)?;
            let n = recv_dgram(&cli, &mut inb, wait, RECV_TIMEOUT)?
                .ok_or(BenchError::timeout("UDP ping-pong client awaiting echo"))?;
            let rtt = t.elapsed();
            if n != size || inb[..n] != out[..] {
                return Err(BenchError::Protocol(format!(
                    "UDP echo {k}: {n} bytes, expected {size} identical bytes"
                )));
            }
            Ok(rtt)
        })
    };
    let server = || -> Result<(), BenchError> {
        let mut buf = vec![0u8; max + 1];
        for _ in 0..total {
            let n = recv_dgram(&srv, &mut buf, wait, RECV_TIMEOUT)?
                .ok_or(BenchError::timeout("UDP echo server awaiting ping"))?;
            send_dgram(&srv, &buf[..n])?;
        }
        Ok(())
    };
    run_pingpong(placement, client, server)
}

/// Parameters of a [`udp_blast_with`] run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlastConfig {
    /// Loopback address both sockets bind to.
    pub bind: IpAddr,
    /// Payload bytes to move from the source buffer to the destination.
    pub total_bytes: usize,
    /// Size of each UDP datagram (its UDP payload), including the
    /// [`BLAST_HEADER`]-byte header; at most [`MAX_UDP_PAYLOAD_V4`] (IPv4)
    /// or [`MAX_UDP_PAYLOAD_V6`] (IPv6).
    pub datagram_size: usize,
    /// `None`: pure blast, no acks, losses are counted. `Some(w)`: the
    /// sender never has more than `w` payload bytes unacknowledged; the
    /// datagram that fills a window (and the last one) asks the receiver
    /// for a tiny ack, and the sender waits for it before sending more
    /// (resending that datagram up to 3 times, 500 ms apart, if the ack is
    /// missing). `w` must hold at least one datagram's payload, and should
    /// fit in the receiver's granted buffer, or the run will see losses
    /// and resend waits.
    pub window: Option<usize>,
    /// How both threads wait.
    pub wait: Wait,
    /// Sender = client CPU, receiver = server CPU.
    pub placement: Placement,
    /// SO_RCVBUF / SO_SNDBUF asked for on both sockets.
    pub socket_buffer: usize,
    /// Limit on the whole run; exceeding it is [`BenchError::Timeout`].
    pub timeout: Duration,
}

impl BlastConfig {
    /// A pure blast on 127.0.0.1, blocking waits, unpinned,
    /// [`DEFAULT_SOCKET_BUFFER`] buffers and a 60 s limit.
    pub fn new(total_bytes: usize, datagram_size: usize) -> BlastConfig {
        BlastConfig {
            bind: LOCALHOST_V4,
            total_bytes,
            datagram_size,
            window: None,
            wait: Wait::Block,
            placement: Placement::UNPINNED,
            socket_buffer: DEFAULT_SOCKET_BUFFER,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Outcome of a [`udp_blast_with`] run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// The configuration that was run.
    pub config: BlastConfig,
    /// Payload bytes per datagram (`datagram_size − BLAST_HEADER`).
    pub payload_per_datagram: usize,
    /// Distinct payload bytes that reached the destination buffer.
    pub bytes_delivered: usize,
    /// From the sender's first send to the receiver's copy of the last
    /// datagram that arrived.
    pub elapsed_ns: u64,
    /// From the sender's first send to the sender finishing (its last send,
    /// or with a window, the last ack).
    pub sender_elapsed_ns: u64,
    /// `bytes_delivered / elapsed` (0 if nothing arrived).
    pub bytes_per_sec: f64,
    /// Data datagrams the transfer consists of.
    pub datagrams_expected: u64,
    /// Data datagrams sent, including resends.
    pub datagrams_sent: u64,
    /// Data datagrams received, including duplicates.
    pub datagrams_received: u64,
    /// Expected datagrams that never arrived.
    pub datagrams_lost: u64,
    /// `datagrams_lost / datagrams_expected`.
    pub loss: f64,
    /// Ack-requesting datagrams sent again because the ack was late.
    pub resends: u64,
    /// Acks received by the sender.
    pub acks: u64,
    /// Buffers granted to the receiver's socket.
    pub receiver_buffers: SocketBuffers,
    /// Buffers granted to the sender's socket.
    pub sender_buffers: SocketBuffers,
    /// Every delivered byte matched the source (checked after timing).
    pub verified: bool,
}

/// A pure blast (no window) of `total_bytes` in `datagram_size`-byte
/// datagrams on 127.0.0.1 with the given waiting and placement, or a
/// windowed one if `window` is set. See [`udp_blast_with`].
pub fn udp_blast(
    total_bytes: usize,
    datagram_size: usize,
    wait: Wait,
    window: Option<usize>,
    placement: Placement,
) -> Result<Throughput, BenchError> {
    udp_blast_with(&BlastConfig {
        wait,
        window,
        placement,
        ..BlastConfig::new(total_bytes, datagram_size)
    })
}

/// Byte `i` of the source buffer: varies within and across datagrams so a
/// payload copied to the wrong place is caught.
fn pattern(i: usize) -> u8 {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ i as u8
}

struct SenderStats {
    t0: Instant,
    finished: Instant,
    sent: u64,
    resends: u64,
    acks: u64,
}

struct ReceiverStats {
    seen: Vec<bool>,
    received: u64,
    delivered: usize,
    last_rx: Option<Instant>,
}

/// Streams `cfg.total_bytes` from a source buffer in the sender thread to a
/// destination buffer in the receiver thread, one UDP datagram at a time:
/// the sender copies each payload from the source behind a
/// [`BLAST_HEADER`]-byte header, the receiver copies it to its offset in
/// the destination (memory to memory). Both sockets get large buffers
/// (SO_RCVBUFFORCE first, then SO_RCVBUF); the grants are reported.
///
/// With a window (see [`BlastConfig::window`]) this is the fair comparator
/// for a windowed protocol; without one, datagrams the receiver cannot keep
/// up with are lost and counted. The run ends when every datagram has
/// arrived, or once the sender has finished and the receiver has seen
/// 50 ms of silence. A receiver that hears nothing for [`RECV_TIMEOUT`]
/// while the sender is still going, a missing ack after the resends, or a
/// run longer than `cfg.timeout` is an error.
pub fn udp_blast_with(cfg: &BlastConfig) -> Result<Throughput, BenchError> {
    check_loopback(cfg.bind)?;
    let max = max_payload(cfg.bind);
    if cfg.datagram_size <= BLAST_HEADER || cfg.datagram_size > max {
        return Err(BenchError::InvalidArgument(format!(
            "datagram size {} must be in {}..={max}",
            cfg.datagram_size,
            BLAST_HEADER + 1
        )));
    }
    if cfg.total_bytes == 0 {
        return Err(BenchError::InvalidArgument(
            "total_bytes must be > 0".into(),
        ));
    }
    let payload = cfg.datagram_size - BLAST_HEADER;
    if let Some(w) = cfg.window {
        if w < payload {
            return Err(BenchError::InvalidArgument(format!(
                "window {w} is smaller than one datagram's payload ({payload})"
            )));
        }
    }
    let total = cfg.total_bytes;
    let count = total.div_ceil(payload);
    let offset_of = |k: usize| k * payload;
    let len_of = |k: usize| payload.min(total - offset_of(k));

    let (tx, rx) = connected_pair(cfg.bind)?;
    let sender_buffers = set_socket_buffers(&tx, cfg.socket_buffer)?;
    let receiver_buffers = set_socket_buffers(&rx, cfg.socket_buffer)?;
    prepare_udp(&tx, cfg.wait, ACK_TIMEOUT)?;
    prepare_udp(&rx, cfg.wait, QUIET)?;

    // Both buffers are written here, before timing, so no page faults
    // land inside the measurement.
    let src: Vec<u8> = (0..total).map(pattern).collect();
    let mut dest = vec![0xeeu8; total];
    let done = AtomicBool::new(false);
    let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);
    let wait = cfg.wait;

    let sender = || -> Result<SenderStats, BenchError> {
        // Moved in: a Receiver is Send but not Sync.
        let ready_rx = ready_rx;
        let r = (|| {
            ready_rx
                .recv_timeout(RECV_TIMEOUT)
                .map_err(|_| BenchError::timeout("blast sender awaiting receiver"))?;
            let mut out = vec![0u8; cfg.datagram_size];
            let mut ackbuf = [0u8; ACK_LEN + 1];
            let mut st = SenderStats {
                t0: Instant::now(),
                finished: Instant::now(),
                sent: 0,
                resends: 0,
                acks: 0,
            };
            let mut inflight = 0usize;
            let mut serial = 0u32;
            for k in 0..count {
                let (off, len) = (offset_of(k), len_of(k));
                let want_ack = cfg
                    .window
                    .is_some_and(|w| k + 1 == count || inflight + len + len_of(k + 1) > w);
                let tag = if want_ack {
                    serial = serial.wrapping_add(1).max(1);
                    serial
                } else {
                    0
                };
                out[..8].copy_from_slice(&(off as u64).to_le_bytes());
                out[8..BLAST_HEADER].copy_from_slice(&tag.to_le_bytes());
                out[BLAST_HEADER..BLAST_HEADER + len].copy_from_slice(&src[off..off + len]);
                let dgram = &out[..BLAST_HEADER + len];
                send_dgram(&tx, dgram)?;
                st.sent += 1;
                inflight += len;
                if want_ack {
                    let resent = await_ack(&tx, &mut ackbuf, wait, serial, dgram)?;
                    st.sent += resent;
                    st.resends += resent;
                    st.acks += 1;
                    inflight = 0;
                }
                if st.t0.elapsed() > cfg.timeout {
                    return Err(BenchError::Timeout {
                        what: "blast run",
                        after: cfg.timeout,
                    });
                }
            }
            st.finished = Instant::now();
            Ok(st)
        })();
        // Finished or failed, the receiver may stop at the next silence.
        done.store(true, Ordering::Release);
        r
    };

    let dest_ref = &mut dest;
    let receiver = || -> Result<ReceiverStats, BenchError> {
        let mut st = ReceiverStats {
            seen: vec![false; count],
            received: 0,
            delivered: 0,
            last_rx: None,
        };
        let mut unique = 0usize;
        let mut buf = vec![0u8; cfg.datagram_size + 1];
        // Bounded in count: every pass either takes a datagram (at most
        // one per send, resends included) or waits out a QUIET slice.
        let max_passes = count as u128 * u128::from(ACK_RETRIES + 1)
            + cfg.timeout.as_millis() / QUIET.as_millis()
            + RECV_TIMEOUT.as_millis() / QUIET.as_millis()
            + 2;
        // If the sender is gone it will notice on its own.
        let _ = ready_tx.send(());
        let start = Instant::now();
        let mut last_activity = start;
        let mut passes = 0u128;
        while unique < count {
            passes += 1;
            if passes > max_passes || start.elapsed() > cfg.timeout + RECV_TIMEOUT {
                return Err(BenchError::Timeout {
                    what: "blast receiver (run limit)",
                    after: cfg.timeout,
                });
            }
            let Some(n) = recv_dgram(&rx, &mut buf, wait, QUIET)? else {
                if done.load(Ordering::Acquire) {
                    break;
                }
                check_deadline(last_activity, "blast receiver awaiting data")?;
                continue;
            };
            let now = Instant::now();
            last_activity = now;
            if n < BLAST_HEADER {
                return Err(BenchError::Protocol(format!("{n}-byte blast datagram")));
            }
            let mut off8 = [0u8; 8];
            off8.copy_from_slice(&buf[..8]);
            let mut tag4 = [0u8; 4];
            tag4.copy_from_slice(&buf[8..BLAST_HEADER]);
            let off = usize::try_from(u64::from_le_bytes(off8)).unwrap_or(usize::MAX);
            let k = off / payload;
            if off % payload != 0 || k >= count || n - BLAST_HEADER != len_of(k) {
                return Err(BenchError::Protocol(format!(
                    "blast datagram of {n} bytes at offset {off} does not fit the transfer"
                )));
            }
            st.received += 1;
            if !st.seen[k] {
                let len = n - BLAST_HEADER;
                dest_ref[off..off + len].copy_from_slice(&buf[BLAST_HEADER..n]);
                st.seen[k] = true;
                unique += 1;
                st.delivered += len;
                st.last_rx = Some(Instant::now());
            }
            let tag = u32::from_le_bytes(tag4);
            if tag != 0 {
                let mut ack = [0u8; ACK_LEN];
                ack[..4].copy_from_slice(&tag.to_le_bytes());
                ack[4..].copy_from_slice(&(st.delivered as u64).to_le_bytes());
                send_dgram(&rx, &ack)?;
            }
        }
        Ok(st)
    };

    let (s, r) = run_pair(cfg.placement, sender, receiver);
    let r = r?;
    let s = s?;

    let verified = r.seen.iter().enumerate().all(|(k, &seen)| {
        let (off, len) = (offset_of(k), len_of(k));
        !seen || dest[off..off + len] == src[off..off + len]
    });
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let elapsed = r
        .last_rx
        .map_or(Duration::ZERO, |t| t.saturating_duration_since(s.t0));
    let lost = count - r.seen.iter().filter(|&&x| x).count();
    Ok(Throughput {
        config: *cfg,
        payload_per_datagram: payload,
        bytes_delivered: r.delivered,
        elapsed_ns: ns(elapsed),
        sender_elapsed_ns: ns(s.finished.saturating_duration_since(s.t0)),
        bytes_per_sec: if elapsed.is_zero() {
            0.0
        } else {
            r.delivered as f64 / elapsed.as_secs_f64()
        },
        datagrams_expected: count as u64,
        datagrams_sent: s.sent,
        datagrams_received: r.received,
        datagrams_lost: lost as u64,
        loss: lost as f64 / count as f64,
        resends: s.resends,
        acks: s.acks,
        receiver_buffers,
        sender_buffers,
        verified,
    })
}

/// Waits for the ack with `serial`, resending `dgram` (the datagram that
/// asked for it) after each [`ACK_TIMEOUT`] of silence, at most
/// [`ACK_RETRIES`] times. Returns the number of resends.
fn await_ack(
    tx: &UdpSocket,
    buf: &mut [u8],
    wait: Wait,
    serial: u32,
    dgram: &[u8],
) -> Result<u64, BenchError> {
    for attempt in 0..=ACK_RETRIES {
        let start = Instant::now();
        // Stale acks (answers to earlier resends) are skipped, within the
        // same time slice.
        while start.elapsed() < ACK_TIMEOUT {
            let Some(n) = recv_dgram(tx, buf, wait, ACK_TIMEOUT)? else {
                break;
            };
            let mut tag4 = [0u8; 4];
            if n == ACK_LEN {
                tag4.copy_from_slice(&buf[..4]);
                if u32::from_le_bytes(tag4) == serial {
                    return Ok(u64::from(attempt));
                }
            }
        }
        if attempt < ACK_RETRIES {
            send_dgram(tx, dgram)?;
        }
    }
    Err(BenchError::Timeout {
        what: "blast sender awaiting window ack",
        after: ACK_TIMEOUT * (ACK_RETRIES + 1),
    })
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
        assert_round_trips(udp_pingpong, &[32]);
        let pinned = Placement::spread().expect("spread");
        let s = udp_pingpong(32, 200, 20, Wait::Spin, pinned).expect("pinned run");
        assert_sane(&s, 200);
    }

    #[test]
    fn pingpong_sizes() {
        let _g = net_test_lock();
        for size in [0, 1, 7, 8, 1024, MAX_UDP_PAYLOAD_V4] {
            let s = udp_pingpong(size, 20, 2, Wait::Block, Placement::UNPINNED).expect("run");
            assert_sane(&s, 20);
        }
        let s = udp_pingpong(8, 0, 3, Wait::Block, Placement::UNPINNED).expect("run");
        assert!(s.is_empty());
    }

    #[test]
    fn pingpong_ipv6_if_available() {
        let _g = net_test_lock();
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        if UdpSocket::bind(SocketAddr::new(v6, 0)).is_err() {
            eprintln!("::1 unavailable here; skipping IPv6 run");
            return;
        }
        let s = udp_pingpong_at(v6, 32, 200, 10, Wait::Block, Placement::UNPINNED).expect("run");
        assert_sane(&s, 200);
        let s = udp_pingpong_at(
            v6,
            MAX_UDP_PAYLOAD_V6,
            5,
            1,
            Wait::Block,
            Placement::UNPINNED,
        )
        .expect("max v6 datagram");
        assert_sane(&s, 5);
    }

    #[test]
    fn refuses_bad_arguments() {
        let lan = IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1));
        assert!(matches!(
            udp_pingpong_at(lan, 32, 1, 0, Wait::Block, Placement::UNPINNED),
            Err(BenchError::NotLoopback(_))
        ));
        assert_refuses_bad_counts(udp_pingpong, MAX_UDP_PAYLOAD_V4 + 1);
        let bad =
            |c: BlastConfig| matches!(udp_blast_with(&c), Err(BenchError::InvalidArgument(_)));
        assert!(bad(BlastConfig::new(1000, 65_536)));
        assert!(bad(BlastConfig::new(1000, BLAST_HEADER)));
        assert!(bad(BlastConfig::new(0, 1000)));
        assert!(bad(BlastConfig {
            window: Some(100),
            ..BlastConfig::new(10_000, 1000)
        }));
        assert!(matches!(
            udp_blast_with(&BlastConfig {
                bind: lan,
                ..BlastConfig::new(1000, 100)
            }),
            Err(BenchError::NotLoopback(_))
        ));
    }

    #[test]
    fn windowed_blast_delivers_everything() {
        let _g = net_test_lock();
        for wait in [Wait::Block, Wait::Spin] {
            let total = 4 << 20;
            let t = udp_blast(total, 8192, wait, Some(64 << 10), Placement::UNPINNED).expect("run");
            assert_eq!(t.bytes_delivered, total, "{t:?}");
            assert_eq!(t.datagrams_lost, 0);
            assert_eq!(t.loss, 0.0);
            assert!(t.verified);
            assert_eq!(t.payload_per_datagram, 8192 - BLAST_HEADER);
            assert_eq!(
                t.datagrams_expected,
                total.div_ceil(8192 - BLAST_HEADER) as u64
            );
            assert_eq!(t.datagrams_sent, t.datagrams_expected + t.resends);
            assert!(t.datagrams_received >= t.datagrams_expected);
            // One ack per window of payload, rounded up to whole datagrams.
            assert!(t.acks >= (total / (64 << 10)) as u64, "{t:?}");
            assert!(t.elapsed_ns > 0 && t.bytes_per_sec > 0.0);
            assert!(t.receiver_buffers.rcvbuf > 0 && t.sender_buffers.sndbuf > 0);
        }
    }

    #[test]
    fn windowed_blast_odd_sizes() {
        let _g = net_test_lock();
        // Neither the total nor the window is a multiple of the payload.
        let t = udp_blast_with(&BlastConfig {
            window: Some(10_000),
            wait: Wait::Spin,
            placement: Placement::spread().expect("spread"),
            ..BlastConfig::new(1_000_003, 1000)
        })
        .expect("run");
        assert_eq!(t.bytes_delivered, 1_000_003);
        assert!(t.verified && t.datagrams_lost == 0);
        // A window holding exactly one payload is stop-and-wait.
        let t = udp_blast(50_000, 1012, Wait::Block, Some(1000), Placement::UNPINNED).expect("run");
        assert_eq!(t.bytes_delivered, 50_000);
        assert_eq!(t.acks, t.datagrams_expected);
        // A single short datagram.
        let t = udp_blast(5, 100, Wait::Block, Some(88), Placement::UNPINNED).expect("run");
        assert_eq!((t.bytes_delivered, t.acks, t.datagrams_expected), (5, 1, 1));
        assert!(t.verified);
    }

    #[test]
    fn pure_blast_accounts_for_every_datagram() {
        let _g = net_test_lock();
        for wait in [Wait::Block, Wait::Spin] {
            let total = 8 << 20;
            let t =
                udp_blast(total, MAX_UDP_PAYLOAD_V4, wait, None, Placement::UNPINNED).expect("run");
            assert!(t.verified, "{t:?}");
            assert_eq!(t.acks, 0);
            assert_eq!(t.resends, 0);
            assert_eq!(t.datagrams_sent, t.datagrams_expected);
            assert_eq!(
                t.datagrams_received + t.datagrams_lost,
                t.datagrams_expected
            );
            assert!(t.bytes_delivered <= total && t.bytes_delivered > 0);
            assert!((0.0..1.0).contains(&t.loss));
            let j = serde_json::to_string(&t).expect("json");
            assert!(
                j.contains("\"window\":null") && j.contains("\"wait\":"),
                "{j}"
            );
        }
    }
}
