//! Sections 7 and 8: the peers and process groups.

use std::time::Duration;

use vkernel::{GroupMode, Kernel};

use crate::report::{GroupRow, Groups, PeerRatios, PeerRow, Peers, SectionReport};
use crate::section::{Chart, Ctx, Outcome, Section};
use crate::stats::Summary;
use crate::vkbench::{self, Op};
use crate::{baseline, chart};

/// Rounds in which section 7 alternates vkernel remote and raw UDP.
const PEER_ROUNDS: usize = 5;

pub(crate) fn peers(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Peers.heading(&format!(
        ", same run, same sizes: round trip µs (median / p99); every column in one mode, {} (gRPC excepted: tonic blocks in its reactor whatever the mode)",
        c.pl.describe()
    ));
    let sizes: &[usize] = if c.quick {
        &[32, 1024, 8192]
    } else {
        &[32, 256, 1024, 4096, 8192]
    };
    crate::outln!(
        "  {:>6} {:>15} {:>15} {:>15} {:>15} {:>15} {:>15}  {:>7} {:>7} {:>7} {:>7}",
        "bytes",
        "vkernel local",
        "vkernel remote",
        "raw UDP",
        "TCP NODELAY",
        "ZeroMQ",
        "gRPC",
        "vk/UDP",
        "vk/TCP",
        "vk/ZMQ",
        "vk/gRPC"
    );
    let names = [
        "vkernel local",
        "vkernel remote",
        "raw UDP",
        "TCP",
        "ZeroMQ",
        "gRPC",
    ];
    let mut series: Vec<chart::Series> =
        names.iter().map(|s| (s.to_string(), Vec::new())).collect();
    let mut rows = Vec::new();
    // gRPC calls cost tens of µs: fewer of them keep the section short.
    let grpc_n = (c.n / 4).max(100);
    for &s in sizes {
        let op = if s <= 32 { Op::Null } else { Op::Echo(s - 32) };
        let mut l = vkbench::exchanges(&c.ka, c.server, op, c.n, c.warm, c.pl)?;
        // The headline ratio's two sides alternate in rounds, so a slow
        // spell of the machine falls on both rather than on one.
        let (mut r, mut u) = (Vec::new(), Vec::new());
        for _ in 0..PEER_ROUNDS {
            // Each round warms up in full (a fresh client process and
            // thread, fresh sockets).
            let (n, w) = (c.n / PEER_ROUNDS, c.warm);
            r.extend(vkbench::exchanges(&c.kb, c.server, op, n, w, c.pl)?);
            u.extend(baseline::udp_samples(s, n, w, c.pl)?);
        }
        let (l, r, u) = (
            Summary::of(&mut l),
            Summary::of(&mut r),
            Summary::of(&mut u),
        );
        let t = baseline::tcp_rtt(s, c.n, c.warm, c.pl)?;
        // A peer that fails is reported and left out, not fatal.
        let peer = |r: Result<Summary, String>| {
            r.unwrap_or_else(|e| {
                crate::outln!("  {s} B: {e}");
                Summary::of(&mut [])
            })
        };
        let z = peer(baseline::zmq_rtt(s, c.n, c.warm, c.pl));
        let g = peer(baseline::grpc_rtt(s, grpc_n, c.warm / 4, c.pl));
        let ratio = |x: &Summary| {
            if x.n == 0 {
                f64::NAN
            } else {
                r.median_us / x.median_us.max(1e-9)
            }
        };
        let cell = |x: &Summary| format!("{:.2} / {:.1}", x.median_us, x.p99_us);
        crate::outln!(
            "  {s:>6} {:>15} {:>15} {:>15} {:>15} {:>15} {:>15}  {:>6.2}× {:>6.2}× {:>6.2}× {:>6.2}×",
            cell(&l), cell(&r), cell(&u), cell(&t), cell(&z), cell(&g),
            ratio(&u), ratio(&t), ratio(&z), ratio(&g)
        );
        for (i, v) in [&l, &r, &u, &t, &z, &g].iter().enumerate() {
            if v.n > 0 {
                series[i].1.push((s as f64, v.median_us));
            }
        }
        rows.push(PeerRow {
            bytes: s,
            vkernel_local: l,
            vkernel_remote: r,
            udp: u,
            tcp: t,
            zeromq: z,
            grpc: g,
            ratios: PeerRatios {
                vk_udp: ratio(&u),
                vk_tcp: ratio(&t),
                vk_zmq: ratio(&z),
                vk_grpc: ratio(&g),
            },
        });
    }
    crate::outln!("  (vkernel remote and raw UDP: {PEER_ROUNDS} alternating rounds, pooled; ZeroMQ: libzmq REQ/REP over TCP; gRPC: tonic unary over HTTP/2, which always waits in its reactor)");
    Ok(Outcome {
        report: SectionReport::Peers(Peers { rows }),
        goals: Vec::new(),
        charts: vec![Chart {
            file: "latency.svg",
            draw: Box::new(move |p| {
                chart::lines(
                    p,
                    "Round trip vs message size (median, log scales)",
                    "message bytes",
                    "round trip µs",
                    &series,
                    true,
                )
            }),
        }],
    })
}

pub(crate) fn groups(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Groups.heading("(thesis ch. 6): group Send beside one-to-one Send, same run");
    let g = vkernel::Pid::well_known_group(0x4242);
    let admin = c.kb.create_process().map_err(|e| e.to_string())?;
    admin.join_group(g, c.server).map_err(|e| e.to_string())?;
    let n = c.n.min(2000);
    let (mut one, _) = vkbench::group_sends(&c.kb, g, GroupMode::One, 1, n, c.warm, c.pl)?;
    let (mut direct, _) =
        vkbench::group_sends(&c.kb, c.server, GroupMode::One, 1, n, c.warm, c.pl)?;
    admin.leave_group(g, c.server).map_err(|e| e.to_string())?;
    let (one, direct) = (Summary::of(&mut one), Summary::of(&mut direct));
    crate::outln!(
        "  1-reply group Send, 1 remote member: {:.2} µs (p99 {:.1}); one-to-one Send to it: {:.2} µs (p99 {:.1}); group/one-to-one {:.2}×   (1985: both ≈ 2.2 ms)",
        one.median_us,
        one.p99_us,
        direct.median_us,
        direct.p99_us,
        one.median_us / direct.median_us.max(1e-9)
    );
    // Multi-reply gathering: members on two remote hosts and the client
    // all block (eight spinning members would only measure the scheduler).
    let block = c.pl.blocking();
    crate::outln!("  multi-reply rows: members and client all with blocking waits");
    let kc = Kernel::start(vkernel::KernelConfig {
        peers: vec![c.ka.local_addr(), c.kb.local_addr()],
        spin: Duration::ZERO,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    c.kb.add_peer(kc.local_addr());
    c.ka.add_peer(kc.local_addr());
    let g = vkernel::Pid::well_known_group(0x4243);
    let mut servers = Vec::new();
    let mut rows = Vec::new();
    crate::outln!(
        "  {:>8} {:>16} {:>16} {:>20}",
        "members",
        "first reply µs",
        "all replies µs",
        "per extra reply µs"
    );
    // Per extra reply = (all − first) / (members − 1): within each sample
    // the last reply never precedes the first, so the medians keep that
    // order and the figure is the spacing of the replies after the first
    // (a difference between runs with different member counts can go
    // negative with noise).
    let iters = if c.quick { 100 } else { 500 };
    let counts: &[usize] = if c.quick {
        &[1, 2, 4, 8]
    } else {
        &[1, 2, 4, 8, 16, 32]
    };
    for &want in counts {
        while servers.len() < want {
            let k = if servers.len() % 2 == 0 { &c.ka } else { &kc };
            let (pid, h) = vkbench::start_server(k, block)?;
            admin.join_group(g, pid).map_err(|e| e.to_string())?;
            servers.push((pid, h));
        }
        let (mut f, mut a) =
            vkbench::group_sends(&c.kb, g, GroupMode::Many, want, iters, iters / 10, block)?;
        let (f, a) = (Summary::of(&mut f), Summary::of(&mut a));
        let per = if want > 1 {
            (a.median_us - f.median_us).max(0.0) / (want - 1) as f64
        } else {
            0.0
        };
        crate::outln!(
            "  {want:>8} {:>9.2} / {:>4.0} {:>9.2} / {:>4.0} {:>20}",
            f.median_us,
            f.p99_us,
            a.median_us,
            a.p99_us,
            if want > 1 {
                format!("{per:.2}")
            } else {
                "-".into()
            }
        );
        rows.push(GroupRow {
            members: want,
            first: f,
            all: a,
            per_extra_reply_us: per,
        });
    }
    crate::outln!("  (1985, 10 Mb Ethernet: ~200 µs per additional reply)");
    for (pid, h) in servers {
        vkbench::stop_server(&admin, pid, h);
    }
    let by_hosts = group_hosts(c, block)?;
    let members: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.members as f64, r.all.median_us))
        .collect();
    let hosts: Vec<(f64, f64)> = by_hosts
        .iter()
        .map(|r| (r.members as f64, r.all.median_us))
        .collect();
    let report = Groups {
        one_reply: one,
        one_to_one: direct,
        ratio: one.median_us / direct.median_us.max(1e-9),
        multi_reply: rows,
        by_hosts,
    };
    let line = |file, title: &'static str, x: &'static str, pts: Vec<(f64, f64)>| Chart {
        file,
        draw: Box::new(move |p| {
            chart::lines(
                p,
                title,
                x,
                "µs until the last reply (median)",
                &[("multi-reply group Send".to_string(), pts)],
                false,
            )
        }),
    };
    Ok(Outcome {
        report: SectionReport::Groups(report),
        goals: Vec::new(),
        charts: vec![
            line(
                "groups.svg",
                "Group Send: time to every reply against members (two hosts)",
                "members",
                members,
            ),
            line(
                "hosts.svg",
                "Group Send: time to every reply against hosts (one member each)",
                "hosts",
                hosts,
            ),
        ],
    })
}

/// Multi-reply group Sends to one member on each of 1 … 16 other logical
/// hosts (each its own socket on loopback), all waits blocking: the cost
/// of a group against the hosts it spans.
fn group_hosts(c: &mut Ctx, block: crate::Mode) -> Result<Vec<GroupRow>, String> {
    let counts: &[usize] = if c.quick {
        &[1, 2, 4]
    } else {
        &[1, 2, 4, 8, 16]
    };
    let most = counts.last().copied().unwrap_or(1);
    crate::outln!("  one member on each of N hosts (multi-reply, blocking waits):");
    crate::outln!(
        "  {:>8} {:>16} {:>16}",
        "hosts",
        "first reply µs",
        "all replies µs"
    );
    let client = Kernel::start(vkernel::KernelConfig {
        spin: Duration::ZERO,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let admin = client.create_process().map_err(|e| e.to_string())?;
    let g = vkernel::Pid::well_known_group(0x4244);
    let mut hosts: Vec<Kernel> = Vec::new();
    let mut servers = Vec::new();
    let mut rows = Vec::new();
    let iters = if c.quick { 100 } else { 300 };
    for &want in counts {
        while hosts.len() < want.min(most) {
            let k = Kernel::start(vkernel::KernelConfig {
                peers: vec![client.local_addr()],
                spin: Duration::ZERO,
                ..Default::default()
            })
            .map_err(|e| e.to_string())?;
            client.add_peer(k.local_addr());
            let (pid, h) = vkbench::start_server(&k, block)?;
            admin.join_group(g, pid).map_err(|e| e.to_string())?;
            servers.push((pid, h));
            hosts.push(k);
        }
        let (mut f, mut a) =
            vkbench::group_sends(&client, g, GroupMode::Many, want, iters, iters / 10, block)?;
        let (f, a) = (Summary::of(&mut f), Summary::of(&mut a));
        crate::outln!(
            "  {want:>8} {:>9.2} / {:>4.0} {:>9.2} / {:>4.0}",
            f.median_us,
            f.p99_us,
            a.median_us,
            a.p99_us
        );
        rows.push(GroupRow {
            members: want,
            first: f,
            all: a,
            per_extra_reply_us: if want > 1 {
                (a.median_us - f.median_us).max(0.0) / (want - 1) as f64
            } else {
                0.0
            },
        });
    }
    for (pid, h) in servers {
        vkbench::stop_server(&admin, pid, h);
    }
    Ok(rows)
}
