//! Counters match the exchanges performed; the JSON is readable remotely
//! through the kernel server; the Prometheus text parses, passes
//! `promtool check metrics` (skipped without promtool unless
//! VKERNEL_REQUIRE_PROMTOOL=1), shows the same series scrape after scrape,
//! and bounds its per-peer series; the HTTP endpoint serves both.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{two_hosts, wait_for};
use vkernel::{Kernel, KernelConfig, Message, Process, Segment};

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
    assert!(get("vkernel_remote_exchange_latency_seconds_count") >= 10.0);
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

/// The body of `GET path` from a metrics endpoint.
fn scrape(addr: SocketAddr, path: &str) -> String {
    let mut t = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    write!(t, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut r = String::new();
    t.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    r.split_once("\r\n\r\n").expect("a body").1.to_string()
}

/// Every series of a Prometheus text (name and labels, no value).
fn series(text: &str) -> BTreeSet<String> {
    parse_prometheus(text).into_iter().map(|(n, _)| n).collect()
}

/// The value of one series.
fn value(text: &str, series: &str) -> Option<f64> {
    parse_prometheus(text)
        .into_iter()
        .find(|(n, _)| n == series)
        .map(|x| x.1)
}

/// The `peer` label values of one metric.
fn peer_labels(text: &str, metric: &str) -> BTreeSet<String> {
    series(text)
        .iter()
        .filter(|s| s.starts_with(&format!("{metric}{{")))
        .filter_map(|s| {
            s.split("peer=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(String::from)
        })
        .collect()
}

fn host(id: u16, peers: Vec<SocketAddr>) -> Kernel {
    Kernel::start(KernelConfig {
        host_id: Some(id),
        peers,
        alien_pool: 64,
        // Short, so that a peer is gone after 2 × (2 × 0.1 + 2) s.
        host_timeout: Duration::from_millis(100),
        ..Default::default()
    })
    .expect("start a host")
}

/// A server on `a`, `n` exchanges from a process of `from` (each with a
/// segment) and `n` local ones on `a`.
fn traffic(a: &Kernel, from: &Kernel, n: usize) {
    let (s, h) = a.spawn("srv", serve).unwrap();
    let c = from.create_process().unwrap();
    let local = a.create_process().unwrap();
    let page = [5u8; 300];
    for _ in 0..n {
        let mut m = Message::with_code(1);
        c.send_with_segment(&mut m, s, Segment::Read(&page))
            .unwrap();
        let mut m = Message::with_code(1);
        local.send(&mut m, s).unwrap();
    }
    let mut m = Message::with_code(9);
    local.send(&mut m, s).unwrap();
    h.join().unwrap();
}

#[test]
fn promtool_check_metrics_passes_on_a_live_scrape() {
    let Some(promtool) = ["/usr/bin/promtool", "/usr/local/bin/promtool"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        if std::env::var("VKERNEL_REQUIRE_PROMTOOL").as_deref() == Ok("1") {
            panic!("promtool is required (VKERNEL_REQUIRE_PROMTOOL=1) but not installed");
        }
        eprintln!("skipped: promtool not installed (Debian package prometheus)");
        return;
    };
    let a = host(0x0a01, vec![]);
    let b = host(0x0a02, vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    traffic(&a, &b, 50);
    for k in [&a, &b] {
        let addr = k.serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
        let text = scrape(addr, "/metrics");
        let other = format!(
            "{:04x}",
            if k.host_id() == a.host_id() {
                b.host_id().0
            } else {
                a.host_id().0
            }
        );
        assert!(
            peer_labels(&text, "vkernel_peer_messages_sent_total").contains(&other),
            "a remote peer's series: {text}"
        );
        let mut child = std::process::Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run promtool");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "promtool check metrics on host {:04x} ({} lines): exit {:?}, output {said:?}",
            k.host_id().0,
            text.lines().count(),
            out.status.code()
        );
        assert!(out.status.success() && said.is_empty(), "promtool: {said}");
    }
}

#[test]
fn every_bucket_is_there_before_anything_is_observed_and_series_stay_the_same() {
    let a = host(0x0b01, vec![]);
    let b = host(0x0b02, vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    let fresh = a.prometheus();
    for (h, buckets) in [
        ("vkernel_local_exchange_latency_seconds", 24),
        ("vkernel_remote_exchange_latency_seconds", 24),
        ("vkernel_message_size_bytes", 11),
        ("vkernel_segment_size_bytes", 11),
    ] {
        let lines: Vec<&str> = fresh
            .lines()
            .filter(|l| l.starts_with(&format!("{h}_bucket{{")))
            .collect();
        assert_eq!(lines.len(), buckets + 1, "{h}: {lines:?}");
        assert!(lines.iter().all(|l| l.ends_with(" 0")), "{lines:?}");
        assert!(lines.last().unwrap().contains("le=\"+Inf\""));
    }
    assert!(
        fresh.contains(
            "vkernel_local_exchange_latency_seconds_bucket{host=\"0b01\",le=\"1e-06\"} 0"
        ),
        "{fresh}"
    );
    assert!(
        fresh.contains("vkernel_message_size_bytes_bucket{host=\"0b01\",le=\"65535\"} 0"),
        "{fresh}"
    );
    traffic(&a, &b, 20);
    let first = a.prometheus();
    traffic(&a, &b, 20);
    let second = a.prometheus();
    assert_eq!(series(&first), series(&second), "the same series");
    let peer = format!("peer=\"{:04x}\"", b.host_id().0);
    let only_peers = |t: &str| -> BTreeSet<String> {
        series(t)
            .into_iter()
            .filter(|s| !s.contains(&peer))
            .collect()
    };
    assert_eq!(
        only_peers(&fresh),
        only_peers(&first),
        "only b's series came"
    );
    let count = |t: &str| {
        value(
            t,
            "vkernel_local_exchange_latency_seconds_count{host=\"0b01\"}",
        )
        .unwrap()
    };
    assert_eq!(
        count(&second) - count(&first),
        21.0,
        "20 exchanges and the stop"
    );
    let inf = value(
        &second,
        "vkernel_local_exchange_latency_seconds_bucket{host=\"0b01\",le=\"+Inf\"}",
    );
    assert_eq!(inf, Some(count(&second)));
    let sum = value(
        &second,
        "vkernel_local_exchange_latency_seconds_sum{host=\"0b01\"}",
    )
    .unwrap();
    assert!(
        sum > 0.0 && sum < count(&second) * 10.0,
        "in seconds: {sum}"
    );
}

#[test]
fn a_peers_series_go_when_the_peer_has_gone() {
    let a = host(0x0c01, vec![]);
    let mut b = host(0x0c02, vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    let addr = a.serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
    let before = scrape(addr, "/metrics");
    traffic(&a, &b, 10);
    let with_b = scrape(addr, "/metrics");
    let metric = "vkernel_peer_messages_sent_total";
    assert!(peer_labels(&with_b, metric).contains("0c02"), "{with_b}");
    let j: serde_json::Value = serde_json::from_str(&scrape(addr, "/stats.json")).unwrap();
    assert!(j["peers"]["0c02"].is_object(), "{j}");
    b.shutdown();
    let after = wait_for(Duration::from_secs(60), "b's series to go", || {
        std::thread::sleep(Duration::from_millis(200));
        let t = scrape(addr, "/metrics");
        (!peer_labels(&t, metric).contains("0c02")).then_some(t)
    });
    assert_eq!(
        series(&after),
        series(&before),
        "back to the series of before"
    );
    for m in [
        "vkernel_peer_bytes_sent_total",
        "vkernel_peer_bytes_received_total",
        "vkernel_peer_messages_received_total",
    ] {
        assert_eq!(
            peer_labels(&after, m),
            BTreeSet::from(["other".to_string()]),
            "{m}"
        );
    }
    let j: serde_json::Value = serde_json::from_str(&scrape(addr, "/stats.json")).unwrap();
    assert_eq!(j["peers"].as_object().map(|o| o.len()), Some(0), "{j}");
    assert_eq!(a.stats().peers.len(), 0, "gone from the counters too");
}

#[test]
fn per_peer_series_stop_at_the_cap_and_the_rest_add_up_under_other() {
    let cap = vkernel::metrics::MAX_PEER_SERIES;
    let a = host(0x0d00, vec![]);
    let (s, h) = a.spawn("srv", serve).unwrap();
    let clients: Vec<Kernel> = (1..=cap as u16 + 6)
        .map(|k| host(0x0d00 + k, vec![a.local_addr()]))
        .collect();
    for c in &clients {
        let p = c.create_process().unwrap();
        for _ in 0..3 {
            let mut m = Message::with_code(1);
            p.send(&mut m, s).unwrap();
        }
    }
    let text = a.prometheus();
    let metric = "vkernel_peer_messages_sent_total";
    let labels = peer_labels(&text, metric);
    assert_eq!(labels.len(), cap + 1, "{labels:?}");
    assert!(labels.contains("other"));
    let total: f64 = series(&text)
        .iter()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter_map(|l| value(&text, l))
        .sum();
    // Every message sent is under one peer label or other (a request
    // retransmitted under load may earn a second reply).
    let sent = |t: &str| {
        let k = format!("vkernel_datagrams_sent_total{{host=\"0d00\",type=\"{t}\"}}");
        value(&text, &k).unwrap()
    };
    assert_eq!(total, sent("RemoteReply") + sent("RemoteSend"), "{text}");
    assert!(total >= 3.0 * clients.len() as f64, "{text}");
    let other = value(&text, &format!("{metric}{{host=\"0d00\",peer=\"other\"}}")).unwrap();
    assert!(
        other >= 18.0,
        "6 peers beyond the cap, 3 replies each: {text}"
    );
    // The JSON document keeps every peer.
    let j: serde_json::Value = serde_json::from_str(&a.stats_json()).unwrap();
    assert_eq!(j["peers"].as_object().map(|o| o.len()), Some(clients.len()));
    let c = clients[0].create_process().unwrap();
    let mut m = Message::with_code(9);
    c.send(&mut m, s).unwrap();
    h.join().unwrap();
}

#[test]
fn stats_json_is_one_serde_document_with_every_field() {
    let (a, b) = two_hosts();
    traffic(&a, &b, 5);
    let addr = a.serve_metrics("127.0.0.1:0".parse().unwrap()).unwrap();
    let text = scrape(addr, "/stats.json");
    let j: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for k in [
        "host",
        "uptime_us",
        "processes",
        "queued_messages",
        "aliens_in_use",
        "datagrams_rx",
        "datagrams_tx",
        "bytes_rx",
        "bytes_tx",
        "decode_errors",
        "drops",
        "auth_rejects",
        "retransmits",
        "retransmits_deferred",
        "retransmits_needless",
        "bulk_retransmits",
        "bulk_duplicates",
        "bulk_cwnd_cuts",
        "bulk_write_behind",
        "duplicates",
        "saved_replies_resent",
        "timeouts",
        "deadlines",
        "reply_pending_tx",
        "nacks_tx",
        "local_exchanges",
        "remote_exchanges",
        "direct_sends",
        "bulk_moves",
        "bulk_bytes",
        "group_sends",
        "group_deliveries",
        "group_replies",
        "message_sizes",
        "segment_sizes",
        "local_latency_us",
        "remote_latency_us",
        "peers",
        "other_peers",
    ] {
        assert!(j.get(k).is_some(), "no {k} in {text}");
    }
    assert_eq!(j["host"], format!("{:04x}", a.host_id().0));
    assert!(j["local_exchanges"].as_u64().unwrap() >= 6);
    assert!(j["datagrams_rx"]["RemoteSend"].as_u64().unwrap() >= 5);
    assert_eq!(j["drops"].as_object().map(|o| o.len()), Some(11));
    let h = &j["local_latency_us"];
    assert!(h["count"].as_u64().unwrap() >= 6);
    let buckets = h["buckets"].as_array().unwrap();
    assert!(
        !buckets.is_empty()
            && buckets
                .iter()
                .all(|b| b.as_array().map(Vec::len) == Some(3))
    );
    let peer = &j["peers"][format!("{:04x}", b.host_id().0)];
    assert_eq!(peer["tx_messages"].as_u64(), Some(5), "{j}");
    // The typed document reads back the same.
    let doc: vkernel::metrics::StatsDoc = serde_json::from_str(&text).unwrap();
    assert_eq!(serde_json::to_value(&doc).unwrap(), j);
}
