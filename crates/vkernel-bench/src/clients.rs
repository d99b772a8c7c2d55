//! Section 18: one server, many clients. k client threads (k = 1 … 256)
//! each Send a 32-byte message to one echo server process on another
//! logical host, as fast as they can, beside a raw UDP echo server with
//! the same clients and the same waiting, same run; busy-polling and
//! blocking. Exchanges per second, latency median and p99, and the
//! clients' retransmissions (a clean loopback should see none).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use vkernel::service::{Handler, PoolConfig, Request, WorkerPool};
use vkernel::{FaultConfig, IpcError, Message};
use vkernel_peers::Wait;

use crate::chart::{self, Series};
use crate::programs::{self, raw_client};
use crate::report::{Goal, SectionReport};
use crate::section::{Chart, Ctx, Outcome, Section};
use crate::stats::Summary;
use crate::{vkbench, Mode};

/// One (waiting, k) configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// "block", "spin" (a fixed 100 ms budget) or "default" (as a host
    /// waits with no setting).
    pub wait: String,
    /// The raw clients' waiting, where it differs from `wait` ("default"
    /// rows: the raw waiting that did better at this k).
    pub raw_wait: Option<String>,
    /// Client threads.
    pub clients: usize,
    /// vkernel exchanges per second, all clients together.
    pub vk_per_s: f64,
    /// Raw UDP echo exchanges per second, same clients.
    pub raw_per_s: f64,
    /// vkernel exchange latency.
    pub vk: Summary,
    /// Raw UDP exchange latency.
    pub raw: Summary,
    /// Retransmissions by the clients' host during the vkernel run.
    pub retransmits: u64,
    /// Of those, the ones found needless: the server had the first copy
    /// (all of them, on a clean loopback, unless a datagram overflowed a
    /// socket buffer).
    pub needless: u64,
    /// CPU time per exchange, where measured (client threads in this
    /// program; not the separate-program rows).
    pub cpu: Option<CpuSplit>,
}

/// CPU time per exchange, µs, of the server thread and of the client
/// threads (all together), for each system: where the time goes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuSplit {
    /// vkernel server process's thread.
    pub vk_server_us: f64,
    /// vkernel client threads.
    pub vk_clients_us: f64,
    /// Raw UDP echo server thread.
    pub raw_server_us: f64,
    /// Raw UDP client threads.
    pub raw_clients_us: f64,
}

impl Row {
    /// A row from both systems' latencies over `dur`.
    fn new(
        wait: &str,
        clients: usize,
        dur: Duration,
        mut vk: Vec<Duration>,
        mut raw: Vec<Duration>,
        (retransmits, needless): (u64, u64),
    ) -> Row {
        let secs = dur.as_secs_f64();
        Row {
            wait: wait.into(),
            clients,
            vk_per_s: vk.len() as f64 / secs,
            raw_per_s: raw.len() as f64 / secs,
            vk: Summary::of(&mut vk),
            raw: Summary::of(&mut raw),
            retransmits,
            needless,
            cpu: None,
            raw_wait: None,
        }
    }
}

/// Section 18's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Clients {
    /// Seconds each configuration ran, per system.
    pub seconds: f64,
    /// The rows, block first.
    pub rows: Vec<Row>,
    /// Blocking rows with each client a separate program (a logical host
    /// of its own); empty when not run from the `vkernel` command.
    pub program_rows: Vec<Row>,
    /// Requests that cost CPU time at the server, served by worker pools
    /// of 1 … CPUs workers.
    pub workers: Vec<WorkRow>,
    /// How often this machine stalled a busy thread, measured before the
    /// rows: the context of their retransmission counts.
    pub stalls: Stalls,
}

/// Gaps in the progress of busy threads (one per CPU, reading the clock
/// in a loop): time the machine ran something else, or nothing (a VM's
/// vCPU descheduled by its host). A Send whose server stalls longer than
/// the minimum retransmission timeout is sent again however idle the
/// network, so these bound what "no retransmission" can mean here.
#[derive(Clone, Debug, Serialize)]
pub struct Stalls {
    /// How long the probe ran, s.
    pub seconds: f64,
    /// Busy threads (the CPUs).
    pub threads: usize,
    /// The minimum retransmission timeout the gaps are held against, µs.
    pub min_rto_us: u64,
    /// Gaps longer than that, per second, all threads together.
    pub over_min_rto_per_s: f64,
    /// The longest gap, µs.
    pub longest_us: f64,
}

/// Runs busy threads, one per CPU, for `dur`: their gaps (see [`Stalls`]).
fn stall_probe(dur: Duration) -> Stalls {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let min_rto = Duration::from_micros(vkernel_proto::Config::default().min_rto);
    let per: Vec<(u64, Duration)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(move || {
                    let start = Instant::now();
                    let (mut prev, mut over, mut longest) = (start, 0u64, Duration::ZERO);
                    while prev.duration_since(start) < dur {
                        let now = Instant::now();
                        let gap = now.duration_since(prev);
                        if gap > min_rto {
                            over += 1;
                        }
                        longest = longest.max(gap);
                        prev = now;
                    }
                    (over, longest)
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    Stalls {
        seconds: dur.as_secs_f64(),
        threads,
        min_rto_us: min_rto.as_micros() as u64,
        over_min_rto_per_s: per.iter().map(|p| p.0).sum::<u64>() as f64 / dur.as_secs_f64(),
        longest_us: per
            .iter()
            .map(|p| p.1)
            .max()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e6,
    }
}

/// A worker pool serving requests that each cost CPU time.
#[derive(Clone, Debug, Serialize)]
pub struct WorkRow {
    /// Worker processes.
    pub workers: usize,
    /// CPU time per request, µs.
    pub work_us: u64,
    /// Client threads (blocking).
    pub clients: usize,
    /// Exchanges per second, all clients together.
    pub per_s: f64,
    /// Exchange latency.
    pub latency: Summary,
}

/// Busy-works for the given time per request, then echoes it.
struct Work(Duration);

impl Handler for Work {
    type Scratch = ();

    fn handle(&self, r: Request<'_>, _: &mut ()) -> Result<(), IpcError> {
        let t = Instant::now();
        while t.elapsed() < self.0 {
            std::hint::spin_loop();
        }
        r.process.reply(&r.message, r.from)
    }

    fn failed(&self) -> Message {
        Message::with_code(0xf)
    }

    fn busy(&self) -> Message {
        Message::with_code(0xb)
    }
}

/// k blocking clients on one host send requests that each cost `work` of
/// CPU to a worker pool on another host, with 1 … CPUs workers: does one
/// service spread over the CPUs?
fn worker_rows(quick: bool, dur: Duration, goals: &mut Vec<Goal>) -> Result<Vec<WorkRow>, String> {
    let work = Duration::from_micros(40);
    let k = 8;
    let most = vkernel::host::online_cpus().clamp(2, 16);
    let mut counts = vec![1];
    while !quick && counts.last().is_some_and(|&w| 2 * w < most) {
        counts.push(2 * counts[counts.len() - 1]);
    }
    counts.push(most);
    crate::outln!(
        "  worker pool (block): {k} clients, each request {} µs of CPU at the server",
        work.as_micros()
    );
    let mut rows: Vec<WorkRow> = Vec::new();
    for w in counts {
        let (ka, kb) = vkbench::host_pair(Mode::BLOCK, FaultConfig::default())?;
        let cfg = PoolConfig {
            name: "bench-work".into(),
            workers: w,
            queue: 4 * k,
            idle_code: 0x7e_57fe,
            inline_upto: 0,
            logical_id: None,
            worker_spin: Some(Duration::ZERO),
        };
        let pool = WorkerPool::start(&ka, cfg, Arc::new(Work(work))).map_err(|e| e.to_string())?;
        let to = pool.pid();
        let (mut lat, _) = drive(k, dur, || {
            let p = kb.create_process().map_err(|e| e.to_string())?;
            Ok(move || {
                let mut m = Message::with_code(1);
                let t = Instant::now();
                p.send(&mut m, to).map_err(|e| e.to_string())?;
                if m.code() != 1 {
                    return Err(format!("worker pool answered code {:#x}", m.code()));
                }
                Ok(t.elapsed())
            })
        })?;
        // The pool's threads end with its host.
        drop((ka, kb));
        let row = WorkRow {
            workers: w,
            work_us: work.as_micros() as u64,
            clients: k,
            per_s: lat.len() as f64 / dur.as_secs_f64(),
            latency: Summary::of(&mut lat),
        };
        crate::outln!(
            "    {w} worker{}: {:>8.0} exchanges/s  median/p99 {:.1}/{:.1} µs",
            if w == 1 { " " } else { "s" },
            row.per_s,
            row.latency.median_us,
            row.latency.p99_us
        );
        rows.push(row);
    }
    if let (Some(one), Some(all)) = (rows.first(), rows.last()) {
        goals.push(Goal::at_least(
            &format!("worker pool, {} workers / 1 worker", all.workers),
            all.per_s / one.per_s.max(1e-9),
            0.75 * all.workers as f64,
            "×",
        ));
    }
    Ok(rows)
}

/// The raw waiting that served `k` clients faster in `rows` (blocking if
/// neither was measured).
fn better_raw(rows: &[Row], k: usize) -> Wait {
    let of = |w: &str| {
        rows.iter()
            .find(|r| r.wait == w && r.clients == k)
            .map_or(0.0, |r| r.raw_per_s)
    };
    if of("spin") > of("block") {
        Wait::Spin
    } else {
        Wait::Block
    }
}

/// Runs `k` threads of `one` (which does one exchange and returns its
/// latency, or an error) until `dur` passes; all latencies, and the CPU
/// time the threads used.
fn drive<F>(
    k: usize,
    dur: Duration,
    make: impl Fn() -> Result<F, String>,
) -> Result<(Vec<Duration>, Duration), String>
where
    F: FnMut() -> Result<Duration, String> + Send,
{
    let clients: Vec<F> = (0..k).map(|_| make()).collect::<Result<_, _>>()?;
    let deadline = Instant::now() + dur;
    std::thread::scope(|sc| {
        let hs: Vec<_> = clients
            .into_iter()
            .map(|mut one| {
                sc.spawn(move || -> Result<(Vec<Duration>, Duration), String> {
                    let cpu = vkernel::host::thread_cpu_time();
                    let mut v = Vec::new();
                    while Instant::now() < deadline {
                        v.push(one()?);
                    }
                    Ok((v, vkernel::host::thread_cpu_time().saturating_sub(cpu)))
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut cpu = Duration::ZERO;
        for h in hs {
            let (v, c) = h
                .join()
                .map_err(|_| "client thread panicked".to_string())??;
            all.extend(v);
            cpu += c;
        }
        Ok((all, cpu))
    })
}

pub(crate) fn section(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Clients
        .heading("(one echo server, k client threads; vkernel beside raw UDP, same run)");
    let ks: &[usize] = if c.quick {
        &[1, 8, 64]
    } else {
        &[1, 4, 16, 64, 256]
    };
    let dur = if c.quick {
        Duration::from_millis(200)
    } else {
        Duration::from_millis(750)
    };
    // Turns taken in rounds, each system first in every other one, so
    // that the machine's drifting speed falls on both alike.
    let rounds: u32 = if c.quick { 2 } else { 3 };
    let slice = dur / rounds;
    crate::outln!(
        "  threads unpinned; each client thread its own vkernel process (or UDP socket) on one \
         host, the server one process (or socket) on another; {} ms per configuration and \
         system, in {rounds} alternating turns of {} ms",
        dur.as_millis(),
        slice.as_millis()
    );
    crate::outln!(
        "  the vkernel server batches its replies (Process::set_reply_batching: held while more \
         requests are queued, sent by one sendmmsg); the raw server answers each with sendto"
    );
    crate::outln!(
        "  {:<8} {:>4} {:>11} {:>11} {:>7} {:>16} {:>16} {:>7} {:>8}",
        "wait",
        "k",
        "vk exch/s",
        "raw exch/s",
        "vk/raw",
        "vk med/p99 µs",
        "raw med/p99 µs",
        "retx",
        "needless"
    );
    let stalls = stall_probe(if c.quick {
        Duration::from_millis(200)
    } else {
        Duration::from_millis(500)
    });
    crate::outln!(
        "  stalls: {} busy threads for {} ms saw {:.1} gaps a second longer than the minimum \
         retransmission timeout ({} ms), the longest {:.1} ms (a Send whose server stalls that \
         long is sent again)",
        stalls.threads,
        (stalls.seconds * 1e3).round(),
        stalls.over_min_rto_per_s,
        stalls.min_rto_us as f64 / 1e3,
        stalls.longest_us / 1e3
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut program_rows = Vec::new();
    let mut goals = Vec::new();
    // Fixed waiting (block; spin, a 100 ms budget), then the waiting a
    // host has with no setting (adaptive spin), against the raw waiting
    // that did better at that k above: what a raw UDP user would pick.
    for mode in [Some(Mode::BLOCK), Some(Mode::SPIN), None] {
        let name = match mode {
            Some(m) if m.spins() => "spin",
            Some(_) => "block",
            None => "default",
        };
        let (ka, kb, server, sh) = vkbench::server_pair(mode)?;
        let probe = kb.create_process().map_err(|e| e.to_string())?;
        if mode.is_none() {
            crate::outln!(
                "  default: both hosts and all processes wait as with no setting ({}); \
                 raw: the waiting that did better at that k above",
                vkbench::default_waiting()
            );
        }
        for &k in ks {
            let raw_wait = match mode {
                Some(m) => m.wait,
                None => better_raw(&rows, k),
            };
            let s0 = kb.stats();
            let (mut vs, mut rs) = (Vec::new(), Vec::new());
            let (mut vk_server, mut vk_clients) = (Duration::ZERO, Duration::ZERO);
            let (mut raw_server, mut raw_clients) = (Duration::ZERO, Duration::ZERO);
            for r in 0..rounds {
                // Each system goes first in every other round.
                for vk_turn in [r % 2 == 0, r % 2 != 0] {
                    if vk_turn {
                        vkbench::resume_server(&probe, server, mode)?;
                        let c0 = vkbench::server_cpu(&probe, server)?;
                        let (v, cpu) = drive(k, slice, || {
                            let p = kb.create_process().map_err(|e| e.to_string())?;
                            Ok(move || {
                                let mut m = Message::with_code(1);
                                let t = Instant::now();
                                p.send(&mut m, server).map_err(|e| e.to_string())?;
                                Ok(t.elapsed())
                            })
                        })?;
                        vk_server += vkbench::server_cpu(&probe, server)?.saturating_sub(c0);
                        // Blocks at once from now: no spinning into the
                        // raw server's turn.
                        vkbench::pause_server(&probe, server)?;
                        vs.extend(v);
                        vk_clients += cpu;
                    } else {
                        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
                        let (raddr, rh) = crate::baseline::udp_echo_server(raw_wait, stop.clone())?;
                        let got = drive(k, slice, || raw_client(raddr, raw_wait));
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        raw_server += rh.join().unwrap_or_default();
                        let (v, cpu) = got?;
                        rs.extend(v);
                        raw_clients += cpu;
                    }
                }
            }
            let s1 = kb.stats();
            let retransmits = (
                s1.retransmits - s0.retransmits,
                s1.retransmits_needless - s0.retransmits_needless,
            );
            let per = |t: Duration, n: usize| t.as_secs_f64() * 1e6 / n.max(1) as f64;
            let cpu = CpuSplit {
                vk_server_us: per(vk_server, vs.len()),
                vk_clients_us: per(vk_clients, vs.len()),
                raw_server_us: per(raw_server, rs.len()),
                raw_clients_us: per(raw_clients, rs.len()),
            };
            let mut row = Row::new(name, k, slice * rounds, vs, rs, retransmits);
            row.cpu = Some(cpu);
            if mode.is_none() {
                row.raw_wait = Some(raw_wait.to_string());
            }
            report_row(&row, name, &mut goals);
            rows.push(row);
        }
        if mode.is_some_and(|m| !m.spins()) {
            program_rows = program_section(c.quick, dur, &ka, server, &mut goals)?;
        }
        vkbench::stop_server(&probe, server, sh);
    }
    let workers = worker_rows(c.quick, dur, &mut goals)?;
    let mut series: Vec<Series> = Vec::new();
    for wait in ["block", "spin", "default"] {
        let of = |f: fn(&Row) -> f64| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r.wait == wait)
                .map(|r| (r.clients as f64, f(r).max(1.0)))
                .collect()
        };
        series.push((format!("vkernel, {wait}"), of(|r| r.vk_per_s)));
        if wait != "default" {
            series.push((format!("raw UDP, {wait}"), of(|r| r.raw_per_s)));
        }
    }
    let charts = vec![Chart {
        file: "clients.svg",
        draw: Box::new(move |p| {
            chart::lines(
                p,
                "One server, k clients: exchanges per second (log scales)",
                "client threads",
                "exchanges / s",
                &series,
                true,
            )
        }),
    }];
    Ok(Outcome {
        report: SectionReport::Clients(Clients {
            seconds: dur.as_secs_f64(),
            rows,
            program_rows,
            workers,
            stalls,
        }),
        goals,
        charts,
    })
}

/// Prints a row and checks its goals: ≥ 0.9× raw UDP, no retransmission
/// up to k = 64, p99 ≤ 10× the median.
fn report_row(row: &Row, name: &str, goals: &mut Vec<Goal>) {
    let k = row.clients;
    let ratio = row.vk_per_s / row.raw_per_s.max(1e-9);
    crate::outln!(
        "  {:<8} {:>4} {:>11.0} {:>11.0} {:>6.2}× {:>7.1}/{:>8.1} {:>7.1}/{:>8.1} {:>7} {:>8}{}",
        name,
        k,
        row.vk_per_s,
        row.raw_per_s,
        ratio,
        row.vk.median_us,
        row.vk.p99_us,
        row.raw.median_us,
        row.raw.p99_us,
        row.retransmits,
        row.needless,
        row.raw_wait
            .as_ref()
            .map_or(String::new(), |w| format!("  (raw: {w})"))
    );
    if let Some(c) = &row.cpu {
        crate::outln!(
            "  {:<13} CPU µs per exchange: server vk {:.1} raw {:.1}, clients vk {:.1} raw {:.1}",
            "",
            c.vk_server_us,
            c.raw_server_us,
            c.vk_clients_us,
            c.raw_clients_us
        );
    }
    goals.push(Goal::at_least(
        &format!("{name}, k = {k}: vkernel / raw UDP exchanges per second"),
        ratio,
        0.9,
        "×",
    ));
    if k <= 64 {
        goals.push(Goal::at_most(
            &format!("{name}, k = {k}: retransmissions on a clean loopback"),
            row.retransmits as f64,
            0.0,
            "",
        ));
    }
    goals.push(Goal::at_most(
        &format!("{name}, k = {k}: vkernel p99 / median"),
        row.vk.p99_us / row.vk.median_us.max(1e-3),
        10.0,
        "×",
    ));
}

/// The blocking rows again with every client a separate program: k
/// copies of this executable against the same vkernel server, then
/// against a raw UDP echo server.
fn program_section(
    quick: bool,
    dur: Duration,
    ka: &vkernel::Kernel,
    server: vkernel::Pid,
    goals: &mut Vec<Goal>,
) -> Result<Vec<Row>, String> {
    let Some(exe) = programs::client_program() else {
        crate::outln!("  (separate-program rows skipped: run from the `vkernel` command)");
        return Ok(Vec::new());
    };
    crate::outln!("  the same, block, each client a separate program (its own logical host):");
    let ks: &[usize] = if quick { &[1, 8] } else { &[1, 8, 64] };
    // Fixed host ids for the programs, clear of the server's.
    let first_id = if ka.host_id().0 >= 20_000 {
        1_000
    } else {
        20_000
    };
    let mut rows = Vec::new();
    for &k in ks {
        let (vs, retransmits) =
            programs::run_programs(&exe, k, dur, ka.local_addr(), Some(server), false, first_id)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (raddr, rh) = crate::baseline::udp_echo_server(Wait::Block, stop.clone())?;
        let rs = programs::run_programs(&exe, k, dur, raddr, None, false, first_id);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = rh.join();
        let row = Row::new("block, programs", k, dur, vs, rs?.0, retransmits);
        report_row(&row, "programs", goals);
        rows.push(row);
    }
    Ok(rows)
}
