//! Sections 5 and 6: program loading and load.

use std::time::{Duration, Instant};

use vkernel::FaultConfig;
use vkernel_proto::Pid;

use crate::paper;
use crate::report::{Faulty, Goal, Image, Load, LoadRow, Loading, LoadingRow, SectionReport};
use crate::section::{ms, us, Chart, Ctx, Outcome, Section};
use crate::stats::Summary;
use crate::vkbench::{self, Op};
use crate::{baseline, chart, transfers};

/// Runs `f` and says what the moving host `mover` resent meanwhile: a
/// transfer rate that falls between runs shows why beside it.
fn bulk_counts<T>(
    mover: &vkernel::Kernel,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<(T, String), String> {
    let s0 = mover.stats();
    let t = f()?;
    let s1 = mover.stats();
    let resent = format!(
        "{} chunks resent, {} window cuts",
        s1.bulk_retransmits.saturating_sub(s0.bulk_retransmits),
        s1.bulk_cwnd_cuts.saturating_sub(s0.bulk_cwnd_cuts)
    );
    Ok((t, resent))
}

pub(crate) fn loading(c: &mut Ctx) -> Result<Outcome, String> {
    let lossy = c.lossy.clone();
    Section::Loading.heading("(Table 6-3, 3-11/3-12): 64 KiB read by MoveTo in transfer units");
    crate::outln!(
        "  {:<12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}   1985 local/remote/client/server ms",
        "unit",
        "local ms",
        "remote ms",
        "diff",
        "client",
        "server",
        "MB/s",
    );
    let reps = if c.quick { 5 } else { 30 };
    let mut rows = Vec::new();
    for &(kib, l0, r0, c0, s0) in &paper::LOADING_1985 {
        let op = Op::Load {
            total: 64 << 10,
            unit: kib << 10,
        };
        let l = c.timed(true, op, reps)?;
        let r = c.timed(false, op, reps)?;
        let (mut a, mut b) = (l.samples.clone(), r.samples.clone());
        let (ls, rs) = (Summary::of(&mut a), Summary::of(&mut b));
        let mbps = 65536.0 / rs.median_us.max(1e-9);
        crate::outln!(
            "  {:<12} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10.1}   {l0}/{r0}/{c0}/{s0}",
            format!("{kib} KiB"),
            ls.median_us / 1e3,
            rs.median_us / 1e3,
            (rs.median_us - ls.median_us) / 1e3,
            ms(r.client_cpu),
            ms(r.server_cpu),
            mbps
        );
        rows.push(LoadingRow {
            unit_kib: kib,
            local: ls,
            remote: rs,
            mbps,
            client_cpu_ms: ms(r.client_cpu),
            server_cpu_ms: ms(r.server_cpu),
        });
    }
    let big: &[usize] = if c.quick {
        &[1 << 20, 8 << 20]
    } else {
        &[1 << 20, 64 << 20]
    };
    let mut images = Vec::new();
    for &total in big {
        let blast = baseline::udp_blast(total, vkernel_proto::wire::MAX_DATAGRAM, c.pl, 3)?;
        for unit in [64 << 10, total] {
            let op = Op::Load { total, unit };
            let (r, resent) =
                bulk_counts(&c.ka, || c.timed(false, op, if c.quick { 2 } else { 5 }))?;
            let mut s = r.samples.clone();
            let s = Summary::of(&mut s);
            let mbps = total as f64 / s.median_us.max(1e-9);
            let how = if unit == total {
                "one MoveTo".to_string()
            } else {
                format!("{} KiB MoveTo", unit >> 10)
            };
            crate::outln!(
                "  image {:>3} MiB by {how:<12} {:8.1} MB/s; raw UDP blast {:8.1} MB/s (loss {:.1}%): {:.2}× ({resent})",
                total >> 20,
                mbps,
                blast.mbps,
                blast.loss * 100.0,
                mbps / blast.mbps.max(1e-9)
            );
            if unit == total {
                c.big_move_mbps = Some((total, mbps));
            }
            images.push(Image {
                bytes: total,
                unit,
                mbps,
                n: s.n,
                raw_blast_mbps: blast.mbps,
                raw_blast_loss: blast.loss,
            });
        }
    }
    // The largest image in 64 KiB units again, write-behind off: what the
    // default gains (same bytes, same placement, this run).
    let no_wb = {
        let total = big[big.len() - 1];
        let (a, b) =
            vkbench::host_pair_with(c.pl, FaultConfig::default(), |_, k| k.write_behind = 0)?;
        let (pid, h) = vkbench::start_server(&a, c.pl)?;
        let op = Op::Load {
            total,
            unit: 64 << 10,
        };
        let n = if c.quick { 2 } else { 5 };
        let (r, resent) = bulk_counts(&a, || vkbench::timed(&b, pid, op, n, 1, c.pl))?;
        let cl = b.create_process().map_err(|e| e.to_string())?;
        vkbench::stop_server(&cl, pid, h);
        let mut s = r.samples.clone();
        let mbps = total as f64 / Summary::of(&mut s).median_us.max(1e-9);
        let with = images
            .iter()
            .find(|i| i.bytes == total && i.unit == 64 << 10)
            .map_or(0.0, |i| i.mbps);
        crate::outln!(
            "  image {:>3} MiB by 64 KiB MoveTo, write-behind off {mbps:8.1} MB/s ({resent}); on (default) {with:.1} MB/s: {:.2}×",
            total >> 20,
            with / mbps.max(1e-9)
        );
        mbps
    };
    // The same units from a buffer the server shares and cannot change:
    // write-behind then keeps the buffer instead of copying it.
    let shared_units = {
        let total = big[big.len() - 1];
        let op = Op::LoadShared {
            total,
            unit: 64 << 10,
        };
        let (r, resent) = bulk_counts(&c.ka, || c.timed(false, op, if c.quick { 2 } else { 5 }))?;
        let mut s = r.samples.clone();
        let mbps = total as f64 / Summary::of(&mut s).median_us.max(1e-9);
        let of = |unit: usize| {
            images
                .iter()
                .find(|i| i.bytes == total && i.unit == unit)
                .map_or(0.0, |i| i.mbps)
        };
        crate::outln!(
            "  image {:>3} MiB by 64 KiB MoveTo from a shared buffer (move_to_shared) {mbps:8.1} MB/s: {:.2}× the copying units, {:.2}× one MoveTo ({resent})",
            total >> 20,
            mbps / of(64 << 10).max(1e-9),
            mbps / of(total).max(1e-9)
        );
        mbps
    };
    // The same 64 MiB-class transfer on a bad network.
    let (la, lb) = vkbench::host_pair(c.pl, lossy.clone())?;
    let (lpid, lh) = vkbench::start_server(&la, c.pl)?;
    let total = if c.quick { 8 << 20 } else { 64 << 20 };
    let to = vkbench::bulk(&lb, lpid, total, true, c.pl)?;
    let from = vkbench::bulk(&lb, lpid, total, false, c.pl)?;
    let mb = |b: usize, d: Duration| b as f64 / d.as_secs_f64().max(1e-9) / 1e6;
    crate::outln!(
        "  with faults ({}): {} MiB MoveTo {:.1} MB/s ({}), MoveFrom {:.1} MB/s ({})",
        crate::describe_faults(&lossy),
        total >> 20,
        mb(to.bytes, to.elapsed),
        if to.intact { "intact" } else { "CORRUPT" },
        mb(from.bytes, from.elapsed),
        if from.intact { "intact" } else { "CORRUPT" }
    );
    let cl = lb.create_process().map_err(|e| e.to_string())?;
    vkbench::stop_server(&cl, lpid, lh);
    if !(to.intact && from.intact) {
        return Err("a transfer on the faulty network delivered wrong bytes".into());
    }
    let mut goals = Vec::new();
    let image = |unit_is_total: bool| {
        images
            .iter()
            .filter(|i| i.bytes == total && (i.unit == i.bytes) == unit_is_total)
            .map(|i| i.mbps)
            .next()
    };
    if let (Some(one), Some(units)) = (image(true), image(false)) {
        goals.push(Goal::at_least(
            &format!("{} MiB by one MoveTo, MB/s", total >> 20),
            one,
            8000.0,
            "",
        ));
        goals.push(Goal::at_least(
            &format!("{} MiB in 64 KiB MoveTo units / one MoveTo", total >> 20),
            units / one.max(1e-9),
            0.9,
            "×",
        ));
        goals.push(Goal::at_least(
            &format!(
                "{} MiB in 64 KiB MoveTo units from a shared buffer / one MoveTo",
                total >> 20
            ),
            shared_units / one.max(1e-9),
            0.9,
            "×",
        ));
    }
    let (mtu_units, mtu_goals) = crate::mtu::rows(c.quick, c.pl);
    goals.extend(mtu_goals);
    let (bulk, bulk_goals, bulk_chart) = transfers::rows(c)?;
    goals.extend(bulk_goals);
    let bars: Vec<(String, f64)> = rows
        .iter()
        .map(|r| (format!("{} KiB", r.unit_kib), r.mbps))
        .collect();
    Ok(Outcome {
        report: SectionReport::Loading(Loading {
            rows,
            images,
            faulty: Faulty {
                faults: crate::describe_faults(&lossy),
                move_to_mbps: mb(to.bytes, to.elapsed),
                move_from_mbps: mb(from.bytes, from.elapsed),
                intact: true,
            },
            units_without_write_behind_mbps: no_wb,
            units_shared_mbps: shared_units,
            mtu_units,
            bulk,
        }),
        goals,
        charts: vec![
            bulk_chart,
            Chart {
                file: "loading.svg",
                draw: Box::new(move |p| {
                    chart::bars(
                        p,
                        "Program loading, 64 KiB by MoveTo: remote throughput by transfer unit",
                        "transfer unit",
                        "MB/s",
                        &[("vkernel remote".to_string(), bars)],
                    )
                }),
            },
        ],
    })
}

pub(crate) fn load(c: &mut Ctx) -> Result<Load, String> {
    Section::Load.heading(": concurrent exchanges, blocking waits (spinning k threads on 2 CPUs would only measure the scheduler)");
    let dur = if c.quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };
    let block = c.pl.blocking();
    let (ka, kb) = vkbench::host_pair(block, FaultConfig::default())?;
    let mut rows = Vec::new();
    crate::outln!(
        "  {:<26} {:>12} {:>18}",
        "configuration",
        "exchanges/s",
        "server CPU µs/exch"
    );
    // Up to 8 (full run): past the point where two CPUs saturate.
    let configs: &[(usize, bool)] = if c.quick {
        &[(1, false), (2, false), (4, false), (2, true), (4, true)]
    } else {
        &[
            (1, false),
            (2, false),
            (4, false),
            (8, false),
            (1, true),
            (2, true),
            (4, true),
            (8, true),
        ]
    };
    for &(k, shared) in configs {
        let servers: Vec<(Pid, std::thread::JoinHandle<()>)> = (0..if shared { 1 } else { k })
            .map(|_| vkbench::start_server(&ka, block))
            .collect::<Result<_, _>>()?;
        let probe = kb.create_process().map_err(|e| e.to_string())?;
        let cpu0: Duration = servers
            .iter()
            .map(|(s, _)| vkbench::server_cpu(&probe, *s))
            .sum::<Result<Duration, String>>()?;
        let deadline = Instant::now() + dur;
        let counts: Vec<usize> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..k)
                .map(|j| {
                    let target = servers[if shared { 0 } else { j }].0;
                    let p = kb.create_process();
                    sc.spawn(move || -> Result<usize, String> {
                        let p = p.map_err(|e| e.to_string())?;
                        let mut done = 0;
                        while Instant::now() < deadline {
                            let mut m = vkernel::Message::with_code(1);
                            p.send(&mut m, target).map_err(|e| e.to_string())?;
                            done += 1;
                        }
                        Ok(done)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("load client panicked".into()))
                })
                .collect::<Result<Vec<usize>, String>>()
        })?;
        let cpu1: Duration = servers
            .iter()
            .map(|(s, _)| vkbench::server_cpu(&probe, *s))
            .sum::<Result<Duration, String>>()?;
        let total: usize = counts.iter().sum();
        let rate = total as f64 / dur.as_secs_f64();
        let cpu = us(cpu1.saturating_sub(cpu0)) / total.max(1) as f64;
        let name = if shared {
            format!("1 server, {k} clients")
        } else {
            format!("{k} client/server pairs")
        };
        crate::outln!("  {name:<26} {rate:>12.0} {cpu:>18.2}");
        rows.push(LoadRow {
            config: name,
            exchanges_per_s: rate,
            server_cpu_us: cpu,
        });
        for (s, h) in servers {
            vkbench::stop_server(&probe, s, h);
        }
    }
    crate::outln!(
        "  (1985: a server saturated at ~{} exchanges/s)",
        paper::SERVER_LIMIT_1985
    );
    Ok(Load {
        rows,
        seconds: dur.as_secs_f64(),
    })
}
