//! Sections 1–4: the network penalty, kernel operations, page access and sequential access.

use crate::paper::{self, fmt, Row};
use crate::report::{DefaultsRow, OpRow, Ops, Penalty, PenaltyRow, Sequential, SequentialRow};
use crate::section::{us, Ctx, Section};
use crate::stats::Summary;
use crate::vkbench::{self, Op};
use crate::{baseline, Mode};

/// The one-way penalty fit (µs per byte, µs) of raw UDP round trips at
/// `sizes` in mode `pl`, and the rows it was fitted to.
pub(crate) fn penalty_fit(
    pl: Mode,
    n: usize,
    warm: usize,
    sizes: &[usize],
) -> Result<((f64, f64), Vec<PenaltyRow>), String> {
    let mut pts = Vec::new();
    let mut rows = Vec::new();
    for &s in sizes {
        let r = baseline::udp_rtt(s, n, warm, pl)?;
        pts.push((s as f64, r.median_us / 2.0));
        rows.push(PenaltyRow {
            bytes: s,
            rtt: r,
            one_way_median_us: r.median_us / 2.0,
        });
    }
    let fit = vkernel_peers::linear_fit(&pts).ok_or("penalty fit needs two sizes")?;
    Ok((fit, rows))
}

pub(crate) fn penalty(c: &mut Ctx) -> Result<Penalty, String> {
    Section::Penalty
        .heading("(Table 4-1/3-1): raw UDP, memory to memory, one way = round trip / 2");
    let sizes: &[usize] = if c.quick {
        &[64, 1024, 8192, 65000]
    } else {
        &[64, 128, 256, 512, 1024, 1472, 4096, 8192, 65000]
    };
    let (fit, rows) = penalty_fit(c.pl, c.n, c.warm, sizes)?;
    crate::outln!(
        "  {:>7} {:>12} {:>12} {:>12} {:>14}",
        "bytes",
        "one-way µs",
        "RTT p99 µs",
        "1985 ms",
        "1985/today"
    );
    for r in &rows {
        let (b, ow, p99) = (r.bytes, r.one_way_median_us, r.rtt.p99_us);
        let old = paper::PENALTY_1985.iter().find(|p| p.0 == b).map(|p| p.1);
        let ratio = old.map_or("-".into(), |o| format!("{:.0}×", o * 1e3 / ow.max(1e-9)));
        crate::outln!(
            "  {b:>7} {ow:>12.2} {p99:>12.2} {:>12} {ratio:>14}",
            fmt(old)
        );
    }
    crate::outln!(
        "  fit: P(n) = {:.5}·n + {:.2} µs   (1983, 3 Mb/8 MHz: {:.1}·n + {:.0} µs)",
        fit.0,
        fit.1,
        paper::PENALTY_FIT_1983.0 * 1e3,
        paper::PENALTY_FIT_1983.1 * 1e3
    );
    c.fit = Some(fit);
    Ok(Penalty {
        rows,
        fit_us_per_byte: fit.0,
        fit_us: fit.1,
    })
}

fn table_header() {
    crate::outln!(
        "  {:<26} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>7}",
        "µs (ms for papers)",
        "local",
        "remote",
        "diff",
        "penalty",
        "client",
        "server",
        "rem p99",
        "r/l",
        "(r-l)/P"
    );
}

/// Measures one operation locally and remotely and prints a row like the
/// papers', with the published rows under it.
fn op_row(
    c: &mut Ctx,
    name: &str,
    op: Op,
    minus_null: Option<&OpRow>,
    penalty_bytes: usize,
    papers: &[(&str, Row)],
) -> Result<OpRow, String> {
    let n = c.n;
    let l = c.timed(true, op, n)?;
    let r = c.timed(false, op, n)?;
    let mut ls = l.samples.clone();
    let mut rs = r.samples.clone();
    let (ls, rs) = (Summary::of(&mut ls), Summary::of(&mut rs));
    // Move rows: the enclosing Send-Receive-Reply's time and CPU come off.
    let sub = |k: fn(&OpRow) -> f64| minus_null.map_or(0.0, k);
    let (lm, rm) = (
        ls.median_us - sub(|v| v.local_us),
        rs.median_us - sub(|v| v.remote_us),
    );
    // CPU is clamped at zero: a Move's CPU cannot be below nothing, and a
    // negative difference is the spread of the two medians.
    let (ccpu, scpu) = (
        (us(r.client_cpu) - sub(|v| v.client_cpu_us)).max(0.0),
        (us(r.server_cpu) - sub(|v| v.server_cpu_us)).max(0.0),
    );
    let pen = c.penalty(penalty_bytes)?;
    // A local Move row is a difference of two medians; when it is within
    // the noise of that subtraction (or below zero) a ratio means nothing.
    let rl = if lm > 0.05 {
        format!("{:.1}", rm / lm)
    } else {
        "-".into()
    };
    crate::outln!(
        "  {name:<26} {lm:>8.2} {rm:>8.2} {:>8.2} {pen:>8.2} {:>8.2} {:>8.2} {:>8.2} {rl:>6} {:>7.2}",
        rm - lm,
        ccpu,
        scpu,
        rs.p99_us,
        (rm - lm) / pen.max(1e-9)
    );
    for (who, p) in papers {
        let diff = match (p.local, p.remote) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        };
        let ratio = match (p.local, p.remote) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.1}", b / a),
            _ => "-".into(),
        };
        let per_pen = match (diff, p.penalty) {
            (Some(d), Some(pp)) if pp > 0.0 => format!("{:.2}", d / pp),
            _ => "-".into(),
        };
        crate::outln!(
            "    {who:<24} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {ratio:>6} {per_pen:>7}",
            fmt(p.local),
            fmt(p.remote),
            fmt(diff),
            fmt(p.penalty),
            fmt(p.client),
            fmt(p.server),
            ""
        );
    }
    Ok(OpRow {
        op: name.into(),
        local: Some(ls),
        remote: Some(rs),
        local_us: lm,
        remote_us: rm,
        penalty_us: pen,
        client_cpu_us: ccpu,
        server_cpu_us: scpu,
        local_client_cpu_us: us(l.client_cpu),
        local_server_cpu_us: us(l.server_cpu),
    })
}

pub(crate) fn kernel_ops(c: &mut Ctx) -> Result<Ops, String> {
    Section::KernelOps
        .heading("(Tables 5-1/5-2, 3-5..3-8); Move rows exclude the enclosing exchange");
    table_header();
    let mut gt = vkbench::get_time(&c.ka, c.n, c.pl)?;
    let gt = Summary::of(&mut gt);
    crate::outln!(
        "  {:<26} {:>8.3}   (1983: {} ms)",
        "GetTime",
        gt.median_us,
        paper::GET_TIME_1983
    );
    let mut rows = vec![OpRow {
        op: "GetTime".into(),
        local: Some(gt),
        local_us: gt.median_us,
        ..OpRow::default()
    }];
    let null = op_row(
        c,
        "Send-Receive-Reply",
        Op::Null,
        None,
        76,
        &[
            ("1983 8MHz/3Mb", paper::SRR_1983),
            ("1985 10MHz/10Mb", paper::SRR_1985),
        ],
    )?;
    let base = null.clone();
    // The same exchange as a user gets it from the README's commands,
    // beside the placement's row (same run).
    let mut d = vkbench::default_exchanges(c.n, c.warm)?;
    let d = Summary::of(&mut d);
    let placed = null.remote_us;
    crate::outln!(
        "    {:<24} {:>8} {:>8.2}   p99 {:.2} µs; {:.2}× the row above ({})",
        "  defaults, unpinned",
        "",
        d.median_us,
        d.p99_us,
        d.median_us / placed.max(1e-9),
        vkbench::default_waiting()
    );
    let defaults = DefaultsRow {
        remote: d,
        waiting: vkbench::default_waiting(),
    };
    rows.push(null);
    rows.push(op_row(
        c,
        "MoveFrom 1 KiB",
        Op::MoveFrom(1024),
        Some(&base),
        1024 + 76,
        &[
            ("1983", paper::MOVE_FROM_1983),
            ("1985", paper::MOVE_FROM_1985),
        ],
    )?);
    rows.push(op_row(
        c,
        "MoveTo 1 KiB",
        Op::MoveTo(1024),
        Some(&base),
        1024 + 76,
        &[("1983", paper::MOVE_TO_1983), ("1985", paper::MOVE_TO_1985)],
    )?);
    crate::outln!("  message size (request and reply each carry it):");
    let sizes: &[usize] = if c.quick {
        &[32, 1024, 8192]
    } else {
        &[32, 128, 512, 1024, 4096, 8192]
    };
    for &s in sizes {
        let op = if s <= 32 { Op::Null } else { Op::Echo(s - 32) };
        rows.push(op_row(
            c,
            &format!("exchange {s} B"),
            op,
            None,
            s + 76,
            &[],
        )?);
    }
    Ok(Ops {
        rows,
        defaults: Some(defaults),
    })
}

pub(crate) fn pages(c: &mut Ctx) -> Result<Ops, String> {
    Section::Pages.heading("(Table 6-1, 3-9/3-10): two datagrams per page");
    table_header();
    let mut rows = Vec::new();
    for &n in &[512usize, 4096] {
        let papers: Vec<(&str, Row)> = if n == 512 {
            vec![("1985 10Mb", paper::PAGE_READ_1985)]
        } else {
            vec![]
        };
        rows.push(op_row(
            c,
            &format!("page read {n} B"),
            Op::PageRead(n),
            None,
            n + 152,
            &papers,
        )?);
        let papers: Vec<(&str, Row)> = if n == 512 {
            vec![("1985 10Mb", paper::PAGE_WRITE_1985)]
        } else {
            vec![]
        };
        rows.push(op_row(
            c,
            &format!("page write {n} B"),
            Op::PageWrite(n),
            None,
            n + 152,
            &papers,
        )?);
        let t = op_row(
            c,
            &format!("Thoth write {n} B"),
            Op::ThothWrite(n),
            None,
            n + 228,
            &[],
        )?;
        let w = rows.last().map_or(0.0, |r| r.remote_us);
        let tr = t.remote_us;
        crate::outln!(
            "    segment saving per remote page write: {:.2} µs ({:.0}%); 1985: {:.1} ms",
            tr - w,
            (tr - w) / tr.max(1e-9) * 100.0,
            paper::THOTH_WRITE_1985 - paper::PAGE_WRITE_1985.remote.unwrap_or(0.0)
        );
        rows.push(t);
    }
    Ok(Ops {
        rows,
        defaults: None,
    })
}

pub(crate) fn sequential(c: &mut Ctx) -> Result<Sequential, String> {
    Section::Sequential
        .heading("(Table 6-2): server read-ahead waits a disk latency after each reply");
    crate::outln!(
        "  {:>10} {:>14} {:>12} {:>14}",
        "latency ms",
        "ms per page",
        "% above min",
        "1983 ms/page"
    );
    let pages = if c.quick { 4 } else { 20 };
    let mut rows = Vec::new();
    for &d in &[0.1f64, 1.0, 10.0, 15.0, 20.0] {
        let op = Op::SeqRead {
            n: 512,
            delay_us: (d * 1e3) as u32,
        };
        let t = c.timed(false, op, pages)?;
        let mut s = t.samples.clone();
        let s = Summary::of(&mut s);
        let per = s.median_us / 1e3;
        let old = paper::SEQUENTIAL_1983
            .iter()
            .find(|p| p.0 == d)
            .map(|p| p.1);
        crate::outln!(
            "  {d:>10.1} {per:>14.3} {:>11.1}% {:>14}",
            (per - d) / d * 100.0,
            fmt(old)
        );
        rows.push(SequentialRow {
            latency_ms: d,
            per_page: s,
        });
    }
    Ok(Sequential { rows })
}
