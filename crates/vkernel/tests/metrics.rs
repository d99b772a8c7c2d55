//! Counters match the exchanges performed; the JSON is readable remotely
//! through the kernel server; the Prometheus text parses; the HTTP
//! endpoint serves both.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::two_hosts;
use vkernel::{Message, Process, Segment};

fn serve(p: Process) {
    let mut m = Message::zero();
    let mut buf = vec![0u8; 8192];
    while let Ok(i) = p.receive_with_segment(&mut m, &mut buf) {
        let _ = p.reply(&m, i.from);
        if m.code() == 9 {
            return;
        }
    }
}

/// Checks every sample line of a Prometheus text document.
fn parse_prometheus(t: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for line in t.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            assert!(
                rest.starts_with("HELP ") || rest.starts_with("TYPE "),
                "{line}"
            );
            continue;
        }
        let (name_labels, value) = line.rsplit_once(' ').expect(line);
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
        let name = name_labels.split('{').next().unwrap();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        if let Some(l) = name_labels.strip_prefix(name) {
            assert!(l.starts_with('{') && l.ends_with('}'), "{line}");
            let inner = &l[1..l.len() - 1];
            for kv in inner.split(',').filter(|s| !s.is_empty()) {
                let (k, v) = kv.split_once('=').expect(line);
                assert!(
                    k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "{line}"
                );
                assert!(v.starts_with('"') && v.ends_with('"'), "{line}");
            }
        }
        out.push((name_labels.to_string(), v));
    }
    out
}

#[test]
fn counters_match_the_exchanges_performed() {
    let (a, b) = two_hosts();
    let (s, h) = a.spawn("srv", serve).unwrap();
    let local = a.create_process().unwrap();
    let remote = b.create_process().unwrap();
    let (a0, b0) = (a.stats(), b.stats());
    for _ in 0..37 {
        let mut m = Message::with_code(1);
        local.send(&mut m, s).unwrap();
    }
    let page = vec![7u8; 1000];
    for _ in 0..23 {
        let mut m = Message::with_code(1);
        remote
            .send_with_segment(&mut m, s, Segment::Read(&page))
            .unwrap();
    }
    let (a1, b1) = (a.stats(), b.stats());
    assert_eq!(a1.local_exchanges - a0.local_exchanges, 37);
    assert_eq!(
        a1.local_latency_us.count() - a0.local_latency_us.count(),
        37
    );
    assert_eq!(b1.remote_exchanges - b0.remote_exchanges, 23);
    assert_eq!(
        b1.remote_latency_us.count() - b0.remote_latency_us.count(),
        23
    );
    let to_a = |s: &vkernel::Stats| s.peers.get(&a.host_id().0).copied().unwrap_or_default();
    assert_eq!(to_a(&b1).tx_messages - to_a(&b0).tx_messages, 23);
    assert_eq!(to_a(&b1).rx_messages - to_a(&b0).rx_messages, 23);
    // 23 requests of 76 + 1000 bytes, 23 replies of 76.
    assert_eq!(b1.segment_sizes.count() - b0.segment_sizes.count(), 23);
    assert_eq!(b1.message_sizes.count() - b0.message_sizes.count(), 46);
    assert_eq!(
        b1.message_sizes.sum() - b0.message_sizes.sum(),
        23 * (76 + 1000) + 23 * 76
    );
    // The same counters, read remotely through a's kernel server.
    let doc = remote.host_stats(a.host_id()).unwrap();
    let j: serde_json::Value = serde_json::from_str(&doc).expect("valid JSON");
    assert_eq!(j["host"], format!("{:04x}", a.host_id().0));
    assert!(j["local_exchanges"].as_u64().unwrap() >= 37);
    assert!(j["processes"].as_u64().unwrap() >= 3);
    assert_eq!(
        j["peers"][format!("{:04x}", b.host_id().0)]["rx_messages"].as_u64(),
        Some(to_a(&b1).tx_messages),
        "the STATS request itself is counted too, but not b's first request: a peer \
         gets its own counters from a's first answer to it (before, in other_peers)"
    );
    let mut m = Message::with_code(9);
    local.send(&mut m, s).unwrap();
    h.join().unwrap();
}

#[test]
fn prometheus_text_parses_and_is_served_over_http() {
    let (a, b) = two_hosts();
    let (s, h) = a.spawn("srv", serve).unwrap();
    let c = b.create_process().unwrap();
    for _ in 0..10 {
        let mut m = Message::with_code(1);
        c.send(&mut m, s).unwrap();
    }
    let samples = parse_prometheus(&b.prometheus());
    let get = |k: &str| {
        samples
            .iter()
            .find(|(n, _)| n.starts_with(k))
            .map(|x| x.1)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    assert!(get("vkernel_remote_exchanges_total") >= 10.0);
    assert!(get("vkernel_remote_exchange_latency_us_count") >= 10.0);
    let addr = b
        .serve_metrics("127.0.0.1:0".parse().unwrap())
        .expect("metrics endpoint");
    for (path, want) in [
        ("/metrics", "vkernel_datagrams_sent_total"),
        ("/stats.json", "\"remote_exchanges\""),
    ] {
        let mut t = TcpStream::connect(addr).unwrap();
        write!(t, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut body = String::new();
        t.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(body.contains(want), "{path}");
        if path == "/metrics" {
            let text = body.split("\r\n\r\n").nth(1).unwrap();
            assert!(!parse_prometheus(text).is_empty());
        }
    }
    let mut m = Message::with_code(9);
    c.send(&mut m, s).unwrap();
    h.join().unwrap();
}
