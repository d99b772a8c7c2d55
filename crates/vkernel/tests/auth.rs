//! Authenticated interkernel datagrams over real UDP: keyed hosts exchange
//! messages and bulk data (MAC and AEAD modes, and across a key rotation);
//! a host without the key, forged, truncated, unkeyed and unknown-key
//! datagrams from a raw socket are all rejected and counted, and the hosts
//! keep working.

mod common;

use std::net::UdpSocket;
use std::thread;
use std::time::Duration;

use common::pattern;
use vkernel::auth::Cipher;
use vkernel::{IpcError, Kernel, KernelConfig, Message, Process, Segment};
use vkernel_proto::auth::{Key, Reject};

fn key(id: u8, b: u8) -> Key {
    Key {
        id,
        secret: [b; 32],
    }
}

fn host(
    keys: Vec<Key>,
    send: Option<u8>,
    encrypt: bool,
    peers: Vec<std::net::SocketAddr>,
) -> Kernel {
    host_with(keys, send, encrypt.then(Cipher::default), peers)
}

/// A host that encrypts with `cipher`, or only authenticates (`None`).
fn host_with(
    keys: Vec<Key>,
    send: Option<u8>,
    cipher: Option<Cipher>,
    peers: Vec<std::net::SocketAddr>,
) -> Kernel {
    Kernel::start(KernelConfig {
        keys,
        send_key: send,
        encrypt: cipher.is_some(),
        cipher: cipher.unwrap_or_default(),
        peers,
        host_timeout: Duration::from_millis(800),
        ..Default::default()
    })
    .expect("start host")
}

/// Echo server: returns the message; a read+write segment is reversed
/// in place by MoveFrom + MoveTo.
fn serve(p: Process) {
    let mut m = Message::zero();
    while let Ok(i) = p.receive(&mut m) {
        if m.code() == 9 {
            let _ = p.reply(&m, i.from);
            return;
        }
        if m.code() == 2 {
            // A read: the data goes ahead of the reply (idempotent).
            let _ = p.reply_with_segment(&m, i.from, 0, &pattern(m.seg_len() as usize, 3));
            continue;
        }
        let n = m.seg_len() as usize;
        if n > 0 {
            let mut b = vec![0u8; n];
            if p.move_from(i.from, 0, &mut b).is_ok() {
                b.reverse();
                let _ = p.move_to(i.from, 0, &b);
            }
        }
        m.0[1] += 1;
        let _ = p.reply(&m, i.from);
    }
}

fn exchange(c: &Process, s: vkernel::Pid, bulk: usize) -> Result<(), IpcError> {
    let mut m = Message::with_code(1);
    m.0[1] = 41;
    let data = pattern(bulk, 5);
    let mut buf = data.clone();
    c.send_with_segment(&mut m, s, Segment::ReadWrite(&mut buf))?;
    assert_eq!(m.0[1], 42);
    let mut want = data;
    want.reverse();
    assert!(buf == want, "bulk data intact through authentication");
    Ok(())
}

/// Two hosts with key 1 (sealed, or `encrypt`ed), a server on the first
/// and a client process on the second.
fn keyed_pair(
    cipher: Option<Cipher>,
) -> (
    Kernel,
    Kernel,
    vkernel::Pid,
    std::thread::JoinHandle<()>,
    vkernel::Process,
) {
    let a = host_with(vec![key(1, 7)], None, cipher, vec![]);
    let b = host_with(vec![key(1, 7)], None, cipher, vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    let (s, h) = a.spawn("srv", serve).unwrap();
    let c = b.create_process().unwrap();
    (a, b, s, h, c)
}

/// The modes: MAC only, and each AEAD.
const MODES: [Option<Cipher>; 3] = [
    None,
    Some(Cipher::ChaCha20Poly1305),
    Some(Cipher::Aes256Gcm),
];

#[test]
fn keyed_hosts_exchange_in_mac_and_aead_modes() {
    let mut keep = Vec::new();
    for cipher in MODES {
        let (a, b, s, h, c) = keyed_pair(cipher);
        for _ in 0..50 {
            exchange(&c, s, 100).unwrap();
        }
        exchange(&c, s, 3 << 20).unwrap();
        // Reply data sent ahead is sealed (and opened) like any datagram.
        let mut read = Message::with_code(2);
        read.set_flag(vkernel_proto::message::IDEMPOTENT, true);
        let mut buf = vec![0u8; 300_000];
        let r = c
            .send_with_segment(&mut read, s, Segment::Write(&mut buf))
            .unwrap();
        assert_eq!(r.seg_bytes, buf.len(), "sent ahead, not moved");
        assert!(buf == pattern(300_000, 3), "reply data intact");
        let mut stop = Message::with_code(9);
        c.send(&mut stop, s).unwrap();
        h.join().unwrap();
        assert_eq!(
            a.stats().auth_rejects.iter().sum::<u64>(),
            0,
            "{:?}",
            a.stats().auth_rejects
        );
        // Kept to the end: a port freed here could be the next round's,
        // and a late datagram of this round (MAC) would be counted there
        // (AEAD) as a forgery.
        keep.push((a, b));
    }
}

#[test]
fn strangers_and_forgeries_are_rejected_and_counted() {
    let a = host(vec![key(1, 7)], None, false, vec![]);
    let (s, h) = a.spawn("srv", serve).unwrap();
    // No key at all: the keyed host never hears it.
    let plain = host(vec![], None, false, vec![a.local_addr()]);
    let p = plain.create_process().unwrap();
    let mut m = Message::with_code(1);
    assert!(matches!(p.send(&mut m, s), Err(IpcError::Timeout(_))));
    assert!(a.stats().auth_rejects_of(Reject::NoKey) >= 1);
    // Same key id, wrong secret.
    let wrong = host(vec![key(1, 8)], None, false, vec![a.local_addr()]);
    let w = wrong.create_process().unwrap();
    assert!(matches!(w.send(&mut m, s), Err(IpcError::Timeout(_))));
    assert!(a.stats().auth_rejects_of(Reject::BadTag) >= 1);
    // Hand-made datagrams from a raw socket.
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut h0 = vkernel_proto::wire::Header::new(vkernel_proto::wire::PacketType::RemoteSend);
    h0.src = vkernel::Pid::new(vkernel::HostId(0x0777), 5);
    h0.dst = s;
    let good = vkernel_proto::wire::encode(&h0, &Message::with_code(1), &[0u8; 64]);
    let before = a.stats();
    let mut forged = good.clone();
    forged[5] = 1; // claims key 1
    forged.extend_from_slice(&[0u8; 28]); // with a made-up trailer
    let mut unknown = forged.clone();
    unknown[5] = 42;
    let mut flipped = forged.clone();
    flipped[50] ^= 1;
    for d in [
        &forged[..],
        &unknown[..],
        &flipped[..],
        &forged[..40],
        &good[..],
    ] {
        raw.send_to(d, a.local_addr()).unwrap();
    }
    thread::sleep(Duration::from_millis(200));
    let after = a.stats();
    let d = |r: Reject| after.auth_rejects_of(r) - before.auth_rejects_of(r);
    assert_eq!(d(Reject::BadTag), 2, "forged and flipped");
    assert_eq!(d(Reject::UnknownKey), 1);
    assert_eq!(d(Reject::Truncated), 1);
    assert_eq!(d(Reject::NoKey), 1);
    assert_eq!(after.rx, before.rx, "none reached the protocol");
    // A keyed client still gets through.
    let b = host(vec![key(1, 7)], None, false, vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    let c = b.create_process().unwrap();
    exchange(&c, s, 10_000).unwrap();
    let mut stop = Message::with_code(9);
    c.send(&mut stop, s).unwrap();
    h.join().unwrap();
}

#[test]
fn keys_rotate_without_a_restart() {
    // Old key 1 everywhere; the new key 2 is installed beside it, hosts
    // switch their send key one by one, then key 1 is retired.
    let a = host(vec![key(1, 1), key(2, 2)], Some(1), false, vec![]);
    let b = host(
        vec![key(1, 1), key(2, 2)],
        Some(2),
        false,
        vec![a.local_addr()],
    );
    let retired = host(vec![key(2, 2)], Some(2), false, vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    a.add_peer(retired.local_addr());
    let (s, h) = a.spawn("srv", serve).unwrap();
    let c = b.create_process().unwrap();
    exchange(&c, s, 2000).unwrap(); // b sends with 2, a answers with 1
                                    // A host that only has key 2 does not accept a's key-1 answers.
    let r = retired.create_process().unwrap();
    let mut m = Message::with_code(1);
    assert!(matches!(r.send(&mut m, s), Err(IpcError::Timeout(_))));
    assert!(retired.stats().auth_rejects_of(Reject::UnknownKey) >= 1);
    let mut stop = Message::with_code(9);
    c.send(&mut stop, s).unwrap();
    h.join().unwrap();
}

#[test]
fn principals_travel_with_sends_and_services_can_restrict_them() {
    let a = host(vec![key(1, 7)], None, false, vec![]);
    let b = host(vec![key(1, 7)], None, false, vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    let (s, h) = a
        .spawn("restricted", |p: Process| {
            p.set_principal(500);
            p.restrict_senders(Some(vec![1000]));
            let mut m = Message::zero();
            while let Ok(i) = p.receive(&mut m) {
                m.0[1] = i.principal;
                let stop = m.code() == 9;
                let _ = p.reply(&m, i.from);
                if stop {
                    return;
                }
            }
        })
        .unwrap();
    thread::sleep(Duration::from_millis(50));
    for (k, label) in [(&a, "local"), (&b, "remote")] {
        let alice = k.create_process().unwrap();
        alice.set_principal(1000);
        let mallory = k.create_process().unwrap();
        mallory.set_principal(666);
        let mut m = Message::with_code(1);
        alice.send(&mut m, s).unwrap();
        assert_eq!(m.0[1], 1000, "{label}: the server saw alice's principal");
        let mut m = Message::with_code(1);
        assert_eq!(
            mallory.send(&mut m, s),
            Err(IpcError::AccessDenied(s)),
            "{label}: an unlisted principal is refused"
        );
        if label == "remote" {
            // Only the process's own principal may destroy it remotely.
            assert_eq!(mallory.destroy(s), Err(IpcError::AccessDenied(s)));
        }
    }
    let alice = b.create_process().unwrap();
    alice.set_principal(1000);
    let mut stop = Message::with_code(9);
    alice.send(&mut stop, s).unwrap();
    h.join().unwrap();
}

#[test]
fn keyed_hosts_keep_the_direct_path() {
    // ISSUE 49: a cluster key switched direct Sends off, so the secure
    // configuration was the slow one. They are sealed and opened with the
    // host's keys now (one packet counter per host, shared with the
    // engine), in both modes.
    let mut keep = Vec::new();
    for cipher in MODES {
        let encrypt = cipher.is_some();
        let (a, b, s, h, c) = keyed_pair(cipher);
        let direct = || {
            b.net_counters()
                .direct_sends
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = direct();
        for i in 0..300u32 {
            let mut m = Message::with_code(1);
            m.0[1] = i;
            c.send(&mut m, s).unwrap();
            assert_eq!(m.0[1], i + 1);
            // Engine Sends (with a segment) between direct ones: the
            // server's replay window sees one counter order from `b`.
            if i % 50 == 0 {
                exchange(&c, s, 100).unwrap();
            }
        }
        assert!(
            direct() - before >= 290,
            "{} direct Sends",
            direct() - before
        );
        let mut stop = Message::with_code(9);
        c.send(&mut stop, s).unwrap();
        h.join().unwrap();
        let rejects = |k: &Kernel| k.stats().auth_rejects.iter().sum::<u64>();
        assert_eq!((rejects(&a), rejects(&b)), (0, 0), "encrypt={encrypt}");
        keep.push((a, b));
    }
    // A stranger's answers to a direct Send are refused and counted.
    let a = host(vec![key(2, 9)], None, false, vec![]);
    let (s, h) = a.spawn("srv", serve).unwrap();
    let b = host(vec![key(2, 8)], None, false, vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    let c = b.create_process().unwrap();
    let mut m = Message::with_code(1);
    assert!(matches!(c.send(&mut m, s), Err(IpcError::Timeout(_))));
    assert!(a.stats().auth_rejects_of(Reject::BadTag) >= 1);
    drop(a);
    h.join().unwrap();
}

/// Hosts that encrypt with different ciphers cannot talk: each refuses
/// the other's datagrams as forged (counted), and the Send fails.
#[test]
fn hosts_with_different_ciphers_refuse_each_other() {
    let a = host_with(vec![key(1, 7)], None, Some(Cipher::Aes256Gcm), vec![]);
    let b = host_with(
        vec![key(1, 7)],
        None,
        Some(Cipher::ChaCha20Poly1305),
        vec![a.local_addr()],
    );
    a.add_peer(b.local_addr());
    let (s, _h) = a.spawn("srv", serve).unwrap();
    let c = b.create_process().unwrap();
    c.set_send_deadline(Some(Duration::from_millis(500)));
    let mut m = Message::with_code(1);
    assert!(c.send(&mut m, s).is_err(), "an exchange across ciphers");
    let bad = a.stats().auth_rejects_of(Reject::BadTag);
    assert!(bad > 0, "{:?}", a.stats().auth_rejects);
}
