//! The datagram layer's tests: fault specs, side sockets, batches,
//! scattered receives, IPv6, injected faults.

use std::time::{Duration, Instant};

use super::side::{SideEntry, SideSockets, SIDE_SOCKETS};
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
    assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
    assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
    assert_eq!(parse_duration("5µs").unwrap(), Duration::from_micros(5));
    assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    // A bare number could mean anything: refused, with the fix in the error.
    let e = parse_duration("5").unwrap_err();
    assert!(e.contains("needs a unit") && e.contains("5ms"), "{e}");
    assert!(parse_duration("").is_err());
    assert!(parse_duration("-1s").is_err());
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
    let (n, from) = net
        .recv_parts(&mut h, vkernel_proto::RawBytesMut::of(&mut d), &mut r)
        .unwrap();
    assert_eq!((n, from), (9, tx.local_addr().unwrap()));
    assert_eq!((h, d), ([1, 2], [3, 4, 5]));
    assert_eq!(r[..4], [6, 7, 8, 9]);
    // Taken: nothing left to peek at or receive.
    assert!(net.peek(&mut head).is_none());
    assert!(net
        .recv_parts(&mut h, vkernel_proto::RawBytesMut::of(&mut d), &mut r)
        .is_none());
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
    net.send_gathered(
        peer.local_addr().unwrap(),
        b"head",
        vkernel_proto::RawBytes::of(b"+data"),
    );
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
