//! A host that has heard from thousands of (forged) peer host ids: its
//! STATS still answers, whatever its size, and its per-peer table holds
//! only hosts it exchanged with, up to its bound.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use vkernel::{HostId, Message, Pid, Process};
use vkernel_proto::wire::{encode, Header, PacketType};

/// Sends one RemoteSend from each of `n` forged host ids to `dst` at
/// `target`, paced so the host keeps up (bounded in count and time).
fn forge(target: std::net::SocketAddr, dst: Pid, n: u16, base: u16) {
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let start = Instant::now();
    for k in 0..n {
        if start.elapsed() > Duration::from_secs(10) {
            break;
        }
        let mut hd = Header::new(PacketType::RemoteSend);
        hd.seq = 1;
        hd.src = Pid::new(HostId(base + k), 2);
        hd.dst = dst;
        hd.forwarder = hd.src;
        let _ = sock.send_to(&encode(&hd, &Message::with_code(1), &[]), target);
        if k % 64 == 63 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn peers_in(doc: &str) -> usize {
    let v: serde_json::Value = serde_json::from_str(doc).expect("STATS is JSON");
    v["peers"].as_object().map_or(0, |o| o.len())
}

#[test]
fn stats_of_a_host_that_heard_from_thousands_of_peers() {
    let (a, b) = common::two_hosts();
    // A server that answers everything: each forged sender completes an
    // exchange and so earns a table entry, up to the bound.
    let (srv, _h) = a
        .spawn("srv", |p: Process| {
            let mut m = Message::zero();
            while let Ok(i) = p.receive(&mut m) {
                let _ = p.reply(&m, i.from);
            }
        })
        .expect("server");
    // And one that does not exist: datagrams alone earn nothing.
    let nobody = Pid::new(a.host_id(), 0x7ffe);
    forge(a.local_addr(), nobody, 3000, 10_000);
    let c = b.create_process().expect("client");
    let doc = c
        .host_stats(a.host_id())
        .expect("STATS after forged datagrams");
    assert!(
        peers_in(&doc) <= 1,
        "peers that never exchanged got entries: {}",
        peers_in(&doc)
    );
    forge(a.local_addr(), srv, 3000, 1);
    let t = Instant::now();
    let doc = loop {
        let doc = c.host_stats(a.host_id()).expect("STATS of any size");
        if peers_in(&doc) >= 1000 || t.elapsed() > Duration::from_secs(10) {
            break doc;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(doc.len() > vkernel_proto::MAX_APPEND, "{} bytes", doc.len());
    let n = peers_in(&doc);
    assert!(
        (1000..=vkernel_proto::stats::MAX_PEERS).contains(&n),
        "{n} peers"
    );
}
