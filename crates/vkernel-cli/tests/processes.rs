//! Separate OS processes over loopback: `vkernel echo` and `vkernel ping`.

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{exits_within, kill_with, Proc, BIN};

/// Starts `vkernel echo` and returns it with the address it printed.
fn start_echo(bind: &str, extra: &[&str]) -> (Proc, String) {
    let (p, addr, _) = start_echo_for(bind, "60s", extra);
    (p, addr)
}

/// Starts `vkernel echo` that exits by itself after `life`; also returns
/// its stdout for the exit report.
fn start_echo_for(
    bind: &str,
    life: &str,
    extra: &[&str],
) -> (Proc, String, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(BIN)
        .args(["echo", "--bind", bind, "--exit-after", life])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn echo");
    let out = c.stdout.take().expect("stdout");
    let mut r = BufReader::new(out);
    let mut line = String::new();
    r.read_line(&mut line).expect("echo banner");
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .expect("address in banner")
        .trim_end_matches(';')
        .to_string();
    (Proc(c), addr, r)
}

fn ping(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN)
        .arg("ping")
        .args(args)
        .output()
        .expect("run ping");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn failures(out: &str) -> usize {
    out.split("failures ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("failures count in output")
}

#[test]
fn ping_finds_echo_by_name_ipv4_and_ipv6() {
    for bind in ["127.0.0.1:0", "[::1]:0"] {
        let (_echo, addr) = start_echo(bind, &["--name", "svc"]);
        let (ok, out, err) = ping(&[
            "--peer", &addr, "--bind", bind, "--name", "svc", "-n", "300", "--size", "32",
        ]);
        assert!(ok, "{out}\n{err}");
        assert!(out.contains("\"svc\" = pid"), "{out}");
        assert_eq!(failures(&out), 0, "{out}");
        let (ok, out, err) = ping(&[
            "--peer", &addr, "--bind", bind, "--name", "svc", "-n", "100", "--size", "4096",
        ]);
        assert!(ok, "{out}\n{err}");
        assert_eq!(failures(&out), 0, "{out}");
        // A host sending only from its main socket and one using side
        // sockets talk as well.
        let (ok, out, err) = ping(&[
            "--peer",
            &addr,
            "--bind",
            bind,
            "--name",
            "svc",
            "-n",
            "100",
            "--no-side-sockets",
        ]);
        assert!(ok, "{out}\n{err}");
        assert_eq!(failures(&out), 0, "{out}");
    }
}

#[test]
fn ping_survives_injected_faults() {
    let (_echo, addr) = start_echo(
        "127.0.0.1:0",
        &["--fault", "loss=0.05,dup=0.05,reorder=0.05,seed=5"],
    );
    let (ok, out, err) = ping(&[
        "--peer",
        &addr,
        "-n",
        "500",
        "--size",
        "2000",
        "--fault",
        "loss=0.05,dup=0.05,reorder=0.05,delay=0.05:2ms,seed=9",
    ]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(failures(&out), 0, "{out}");
}

#[test]
fn unknown_name_and_bad_arguments_give_clear_errors() {
    let (_echo, addr) = start_echo("127.0.0.1:0", &[]);
    let (ok, _out, err) = ping(&["--peer", &addr, "--name", "nobody", "-n", "1"]);
    assert!(!ok);
    assert!(err.contains("no host among"), "{err}");
    let (ok, _, err) = ping(&["-n", "1"]);
    assert!(!ok);
    assert!(err.contains("--peer"), "{err}");
    let (ok, _, err) = ping(&["--peer", &addr, "--fault", "loss=7"]);
    assert!(!ok);
    assert!(err.contains("not in 0..=1"), "{err}");
    let o = Command::new(BIN).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("Send/Receive/Reply"));
}

#[test]
fn killed_echo_host_fails_ping_within_the_host_timeout() {
    let (mut echo, addr) = start_echo("127.0.0.1:0", &[]);
    let c = Command::new(BIN)
        .args([
            "ping",
            "--peer",
            &addr,
            "-n",
            "100000000",
            "--warmup",
            "0",
            "--host-timeout",
            "1s",
            "--stop-on-error",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = Proc(c);
    // Host-id allocation takes ~0.5 s, then the exchanges run for a while.
    std::thread::sleep(Duration::from_millis(1500));
    echo.0.kill().unwrap();
    let _ = echo.0.wait();
    let killed_at = Instant::now();
    let mut c = c;
    let status = loop {
        if let Some(s) = c.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(10),
            "ping hung after its peer died"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let waited = killed_at.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(c.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(err.contains("did not answer (timeout)"), "{err}");
    // Host timeout 1 s; allow for scheduling slack.
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[test]
fn malformed_datagrams_are_dropped_and_counted() {
    let (mut echo, addr, mut out) = start_echo_for("127.0.0.1:0", "4s", &[]);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut x: u32 = 12345;
    let sent = 2000usize;
    for i in 0..sent {
        let n = i % 200;
        let mut d: Vec<u8> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        if i % 3 == 0 && d.len() > 8 {
            // Looks like ours: right magic and version, garbage after.
            d[0] = 0x56;
            d[1] = 1;
        }
        s.send_to(&d, &addr).unwrap();
        if i % 100 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let (ok, o, err) = ping(&["--peer", &addr, "-n", "200"]);
    assert!(ok, "{o}\n{err}");
    assert_eq!(failures(&o), 0);
    let status = echo.0.wait().unwrap();
    assert!(status.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let dropped: usize = rest
        .split(" malformed")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no malformed count in {rest:?}"));
    assert_eq!(dropped, sent, "{rest}");
}

#[test]
fn demo_and_bench_run_and_report() {
    let o = Command::new(BIN)
        .args(["demo", "-n", "300", "--bulk", "1048576"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("remote Send-Receive-Reply"), "{out}");
    assert!(out.contains("datagrams per remote exchange: 2.0"), "{out}");
    assert_eq!(out.matches("(intact)").count(), 4, "{out}");
    let dir = std::env::temp_dir().join(format!("vkbench-{}", std::process::id()));
    let o = Command::new(BIN)
        .args(["bench", "--quick", "--placement", "block", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Every section prints its table with the papers' figures beside today's.
    for title in [
        "1. Network penalty",
        "2. Kernel operations",
        "3. Page-level file access",
        "4. Sequential access",
        "5. Program loading",
        "6. Load",
        "7. Peers",
        "8. Process groups",
        "9. Observability",
        "10. Network disk",
        "11. File service",
        "12. Security",
        "13. One machine host",
        "14. Python",
        "16. File metadata",
        "17. Many processes",
        "18. Many clients",
    ] {
        assert!(out.contains(title), "missing {title}:\n{out}");
    }
    assert!(out.contains("1983 8MHz/3Mb"), "{out}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench.json")).unwrap()).unwrap();
    for chart in [
        "latency.svg",
        "loading.svg",
        "bulk.svg",
        "groups.svg",
        "hosts.svg",
        "processes.svg",
        "clients.svg",
    ] {
        let svg = std::fs::read_to_string(dir.join(chart)).unwrap();
        assert!(svg.contains("<svg") && svg.contains("</svg>"), "{chart}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(j["placement"], "block");
    let s = &j["sections"];
    let pos = |v: &serde_json::Value| v.as_f64().is_some_and(|x| x > 0.0 && x.is_finite());
    // The fit is a measurement: with few quick-mode sizes, blocking waits
    // and a loaded machine, wake-up noise can swamp the per-byte cost and
    // make either coefficient negative, so
    // only their presence and finiteness are checked.
    for k in ["fit_us", "fit_us_per_byte"] {
        assert!(
            s["section1"][k].as_f64().is_some_and(f64::is_finite),
            "{k}: {s}"
        );
    }
    // Section 14 ran, or said why not (no Python with vkernel here).
    assert!(s["section14"]["python"].is_string(), "{s}");
    // Section 16 timed its six workloads on the local directory at least.
    let w = s["section16"]["workloads"].as_array().expect("section 16");
    assert_eq!(w.len(), 6, "{s}");
    assert!(w.iter().all(|x| pos(&x["local_ms"])), "{s}");
    // Section 17 grew the table to 10,000 processes, measuring each size.
    let r = s["section17"]["rows"].as_array().expect("section 17");
    assert_eq!(
        r.last().map(|x| x["processes"].as_u64()),
        Some(Some(10_000)),
        "{s}"
    );
    assert!(r.iter().all(|x| pos(&x["first_send"]["median_us"])), "{s}");
    // Section 18: three waitings (block, spin, the default) at k = 1, 8,
    // 64, vkernel and raw UDP.
    let r = s["section18"]["rows"].as_array().expect("section 18");
    assert_eq!(r.len(), 9, "{s}");
    for w in ["block", "spin", "default"] {
        assert_eq!(r.iter().filter(|x| x["wait"] == w).count(), 3, "{w}: {s}");
    }
    // The default rows name the raw waiting they were compared with.
    assert!(
        r.iter()
            .filter(|x| x["wait"] == "default")
            .all(|x| x["raw_wait"] == "spin" || x["raw_wait"] == "block"),
        "{s}"
    );
    // …and blocking with each client a separate program (k = 1, 8).
    let p = s["section18"]["program_rows"]
        .as_array()
        .expect("section 18");
    assert_eq!(p.len(), 2, "{s}");
    assert!(
        p.iter()
            .all(|x| pos(&x["vk_per_s"]) && pos(&x["raw_per_s"])),
        "{s}"
    );
    // The stall probe ran (its counts may be anything, zero included).
    let st = &s["section18"]["stalls"];
    assert!(pos(&st["seconds"]) && pos(&st["longest_us"]), "{st}");
    assert!(st["threads"].as_u64().is_some_and(|t| t >= 1), "{st}");
    assert_eq!(st["min_rto_us"], 2000, "{st}");
    assert!(
        st["over_min_rto_per_s"].as_f64().is_some_and(|x| x >= 0.0),
        "{st}"
    );
    // A worker pool of 1 and of one worker per CPU served the same load.
    let w = s["section18"]["workers"].as_array().expect("section 18");
    assert_eq!(w.len(), 2, "{s}");
    assert!(w.iter().all(|x| pos(&x["per_s"])), "{s}");
    assert!(
        r.iter()
            .all(|x| pos(&x["vk_per_s"]) && pos(&x["raw_per_s"])),
        "{s}"
    );
    let rows = s["section2"]["rows"].as_array().unwrap();
    let srr = rows
        .iter()
        .find(|r| r["op"] == "Send-Receive-Reply")
        .expect("a Send-Receive-Reply row");
    let d = &s["section2"]["defaults"];
    assert!(pos(&d["remote"]["median_us"]), "the defaults row: {d}");
    assert!(pos(&srr["remote"]["median_us"]) && pos(&srr["remote"]["p99_us"]));
    assert!(srr["remote"]["n"].as_u64().unwrap() >= 500);
    assert!(pos(&srr["client_cpu_us"]) && pos(&srr["server_cpu_us"]));
    assert_eq!(s["section3"]["rows"].as_array().unwrap().len(), 6);
    assert_eq!(s["section4"]["rows"].as_array().unwrap().len(), 5);
    assert_eq!(s["section5"]["faulty"]["intact"], true);
    assert!(pos(&s["section5"]["images"][0]["raw_blast_mbps"]));
    // The units again: write-behind off, and from a shared buffer.
    assert!(
        pos(&s["section5"]["units_without_write_behind_mbps"]),
        "{s}"
    );
    assert!(pos(&s["section5"]["units_shared_mbps"]), "{s}");
    // The units across a veth pair of MTU 1,500 and 9,000 (network
    // namespaces: root and iproute2, which CI has).
    let mtu = s["section5"]["mtu_units"].as_array().expect("mtu_units");
    if std::env::var("VKERNEL_REQUIRE_NETNS").as_deref() == Ok("1") {
        let mtus: Vec<_> = mtu.iter().map(|r| r["mtu"].as_u64()).collect();
        assert_eq!(mtus, [Some(1500), Some(9000)], "{mtu:?}");
    }
    for r in mtu {
        assert!(
            pos(&r["one_mbps"]) && pos(&r["units_mbps"]) && pos(&r["shared_units_mbps"]),
            "{r}"
        );
        assert_eq!(r["datagram"].as_u64(), r["mtu"].as_u64().map(|m| m - 28));
    }
    // Section 5's bulk rows: cost by size, clean and lossy pairs, and
    // 1,472-byte datagrams with and without segmentation offload.
    let b = &s["section5"]["bulk"];
    assert_eq!(b["by_bytes"].as_array().map(Vec::len), Some(4), "{b}");
    for row in b["loss"]
        .as_array()
        .unwrap()
        .iter()
        .chain(b["mtu"].as_array().unwrap())
    {
        assert!(
            pos(&row["clean_mbps"]) && pos(&row["lossy_mbps"])
                || pos(&row["plain_mbps"]) && pos(&row["gso_mbps"]),
            "{row}"
        );
    }
    assert_eq!(b["loss"].as_array().unwrap().len(), 2, "{b}");
    assert!(
        b["mtu"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| pos(&r["gso_datagrams"])),
        "no datagram left by segmentation offload: {b}"
    );
    assert!(pos(&s["section6"]["rows"][0]["exchanges_per_s"]));
    assert!(pos(&s["section8"]["one_reply"]["median_us"]), "{s}");
    // Cost against members and against hosts (quick: 1, 2, 4, 8 members;
    // 1, 2, 4 hosts), each row measured.
    for (k, n) in [("multi_reply", 4), ("by_hosts", 3)] {
        let rows = s["section8"][k].as_array().unwrap();
        assert_eq!(rows.len(), n, "{k}: {s}");
        assert!(rows.iter().all(|r| pos(&r["all"]["median_us"])), "{k}: {s}");
    }
    assert_eq!(s["section9"]["overhead"].as_array().unwrap().len(), 3);
    assert!(pos(&s["section10"]["native"]["read_mbps"]), "{s}");
    assert!(pos(&s["section11"]["page_read"]["median_us"]), "{s}");
    // No key, MAC, and the two AEADs.
    assert_eq!(s["section12"]["rows"].as_array().unwrap().len(), 4);
    for i in 2..4 {
        assert!(pos(&s["section12"]["rows"][i]["moveto_mbps"]), "{s}");
    }
    // Section 13: every row measured, the move's data arrived.
    let r13 = s["section13"]["rows"].as_array().unwrap();
    assert_eq!(r13.len(), 17, "{s}");
    assert!(r13.iter().all(|r| pos(&r["median_us"])), "{s}");
    assert!(pos(&s["section13"]["move_mbps"]), "{s}");
    // 64 MiB each way between two programs (echo and ping --bulk as
    // processes of this build), over UDP and attached, and over TCP.
    let bulk = s["section13"]["bulk"].as_array().unwrap();
    assert_eq!(bulk.len(), 3, "{s}");
    assert!(bulk.iter().all(|r| pos(&r["median_mbps"])), "{s}");
    assert!(pos(&s["section11"]["program_load"][1]["mbps"]), "{s}");
    // The FUSE mount is measured where FUSE exists (CI requires it).
    if std::env::var("VKERNEL_REQUIRE_FUSE").as_deref() == Ok("1") {
        assert!(
            pos(&s["section11"]["sequential"]["vmount"]["read_mbps"]),
            "{s}"
        );
    }
    assert!(
        s["section9"]["characterization"]["messages"]
            .as_u64()
            .unwrap()
            > 100
    );
    assert_eq!(s["section8"]["multi_reply"].as_array().unwrap().len(), 4);
    let peers = &s["section7"]["rows"][0];
    for k in [
        "vkernel_local",
        "vkernel_remote",
        "udp",
        "tcp",
        "zeromq",
        "grpc",
    ] {
        assert!(pos(&peers[k]["median_us"]), "{k}: {peers}");
    }
}

#[test]
fn stats_reads_a_remote_host_and_metrics_are_served() {
    let port = 20000 + (std::process::id() % 20000) as u16;
    let metrics = format!("127.0.0.1:{port}");
    let (_echo, addr) = start_echo("127.0.0.1:0", &["--metrics", &metrics]);
    let (ok, out, err) = ping(&["--peer", &addr, "-n", "500"]);
    assert!(ok, "{out}\n{err}");
    let o = Command::new(BIN)
        .args(["stats", "--peer", &addr, "--json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(
        j["datagrams_rx"]["RemoteSend"].as_u64().unwrap() >= 600,
        "{j}"
    );
    let o = Command::new(BIN)
        .args(["stats", "--peer", &addr, "--watch", "100ms", "--count", "2"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && table.matches("remote ex").count() == 2,
        "{table}"
    );
    let mut t = std::net::TcpStream::connect(&metrics).unwrap();
    std::io::Write::write_all(&mut t, b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    std::io::Read::read_to_string(&mut t, &mut body).unwrap();
    assert!(body.contains("vkernel_datagrams_received_total{"), "{body}");
}

#[test]
fn trace_report_characterizes_and_its_conservation_check_finds_injected_drops() {
    let dir = std::env::temp_dir().join(format!("vktrace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = |files: &[std::path::PathBuf]| -> serde_json::Value {
        let o = Command::new(BIN)
            .args(["trace", "report", "--json"])
            .args(files)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    for (loss, tag) in [("", "clean"), ("loss=0.1,seed=9", "lossy")] {
        let (ta, tb) = (
            dir.join(format!("{tag}-a.jsonl")),
            dir.join(format!("{tag}-b.jsonl")),
        );
        // Keep its stdout open: it prints a report when it exits.
        let (mut echo, addr, _stdout) =
            start_echo_for("127.0.0.1:0", "3s", &["--trace", ta.to_str().unwrap()]);
        let mut args = vec![
            "--peer",
            &addr,
            "-n",
            "400",
            "--trace",
            tb.to_str().unwrap(),
        ];
        if !loss.is_empty() {
            args.extend(["--fault", loss]);
        }
        let (ok, out, err) = ping(&args);
        assert!(ok, "{out}{err}");
        assert!(echo.0.wait().unwrap().success());
        let j = report(&[ta.clone(), tb.clone()]);
        assert!(j["messages"].as_u64().unwrap() >= 800, "{j}");
        let handler = &j["phases_us"][2];
        assert!(handler["n"].as_u64().unwrap() >= 400, "{j}");
        let dropped: u64 = j["conservation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["dropped"].as_u64().unwrap())
            .sum();
        let sent: u64 = j["conservation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["sent"].as_u64().unwrap())
            .sum();
        if loss.is_empty() {
            assert_eq!(dropped, 0, "{j}");
        } else {
            assert!(
                dropped > 10 && dropped < sent / 4,
                "{dropped} of {sent}: {j}"
            );
        }
        if tag == "lossy" {
            let chrome = dir.join("chrome.json");
            let o = Command::new(BIN)
                .args(["trace", "report", "--out"])
                .arg(&dir)
                .arg("--chrome")
                .arg(&chrome)
                .args([&ta, &tb])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(
                text.contains("conservation") && text.contains("dropped"),
                "{text}"
            );
            let c: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
            assert!(c["traceEvents"].as_array().unwrap().len() > 400);
            assert!(std::fs::read_to_string(dir.join("sizes.svg"))
                .unwrap()
                .contains("<svg"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// ISSUE 50: SIGTERM (how systemd, podman and Kubernetes stop things)
/// killed `vkernel echo` at once: its trace lost its last lines and the
/// report then found datagrams "dropped" that never were. Now it stops
/// as at --exit-after: summary printed, trace whole, exit status 0.
#[test]
fn sigterm_stops_echo_with_its_whole_trace() {
    let dir = std::env::temp_dir().join(format!("vkterm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ta, tb) = (dir.join("echo.jsonl"), dir.join("ping.jsonl"));
    let (mut echo, addr, mut out) =
        start_echo_for("127.0.0.1:0", "60s", &["--trace", ta.to_str().unwrap()]);
    let (ok, o, e) = ping(&[
        "--peer",
        &addr,
        "-n",
        "400",
        "--trace",
        tb.to_str().unwrap(),
    ]);
    assert!(ok, "{o}{e}");
    kill_with(echo.0.id(), "TERM");
    let status = exits_within(&mut echo.0, "vkernel echo");
    assert!(status.success(), "echo ended by SIGTERM with {status}");
    let mut summary = String::new();
    out.read_line(&mut summary).unwrap();
    assert!(summary.contains("exiting after"), "{summary}");
    // The 400 timed exchanges and ping's warm-up ones.
    let answered: u64 = summary
        .split("; ")
        .nth(1)
        .and_then(|t| t.strip_suffix(" requests answered, 0 malformed datagrams dropped (0 of them failed authentication)\n"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(answered >= 400, "{summary}");
    let r = Command::new(BIN)
        .args(["trace", "report", "--json"])
        .args([&ta, &tb])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let j: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    for row in j["conservation"].as_array().unwrap() {
        assert_eq!(row["dropped"].as_u64(), Some(0), "{j}");
    }
    assert!(j["messages"].as_u64().unwrap() >= 800, "{j}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C (SIGINT) stops a machine host as cleanly: exit status 0 and
/// its attach socket removed.
#[test]
fn sigint_stops_a_machine_host_and_removes_its_socket() {
    let dir = std::env::temp_dir().join(format!("vkint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("host.sock");
    let mut h = Command::new(BIN)
        .args(["host", "--socket"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(h.stdout.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    assert!(sock.exists(), "{banner}");
    kill_with(h.id(), "INT");
    let status = exits_within(&mut h, "vkernel host");
    assert!(status.success(), "host ended by SIGINT with {status}");
    assert!(!sock.exists(), "socket left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vkernel bench | head -1`: the bench ends quietly with status 0 when
/// its reader goes (it panicked in `println!` before); and without a
/// terminal its progress is plain lines on stderr.
#[test]
fn bench_into_a_closed_pipe_ends_quietly() {
    let out = std::env::temp_dir().join(format!("vk-bench-pipe-{}", std::process::id()));
    let bench = || {
        let mut c = Command::new(BIN);
        c.args(["bench", "--quick", "--sections", "1", "--out"])
            .arg(&out)
            .stderr(Stdio::piped());
        c
    };
    let mut c = bench().stdout(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("vkernel bench"), "{first:?}");
    // The reader is gone: the bench's next line finds the pipe closed.
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}", o.status);
    assert!(!err.contains("panicked"), "{err}");

    let o = bench().stdout(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("vkernel bench: section 1 (Network penalty) (0 s so far)"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Ctrl-C ends a long ping as ping(8) does: with the exchanges so far
/// summarized and status 0 (it killed the process with nothing before).
#[test]
fn ctrl_c_ends_a_long_ping_with_its_summary() {
    let (_echo, addr, _out) = start_echo_for("127.0.0.1:0", "60s", &[]);
    let c = Command::new(BIN)
        .args(["ping", "--peer", &addr, "-n", "100000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = Proc(c);
    std::thread::sleep(Duration::from_millis(700));
    kill_with(c.0.id(), "INT");
    let status = exits_within(&mut c.0, "vkernel ping");
    let mut out = String::new();
    let mut err = String::new();
    std::io::Read::read_to_string(c.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    std::io::Read::read_to_string(c.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {out}{err}");
    assert!(out.contains("failures 0"), "{out}{err}");
    assert!(err.contains("SIGINT received: stopped after"), "{err}");
    assert!(!out.contains("100000000 exchanges"), "{out}");
}
