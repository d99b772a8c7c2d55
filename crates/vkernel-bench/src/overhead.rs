//! Sections 9 and 12: the costs of observability and of security, each
//! measured as three host pairs compared in alternating rounds.

use std::thread::JoinHandle;
use std::time::Duration;

use vkernel::{FaultConfig, Kernel, KernelConfig};
use vkernel_proto::Pid;

use crate::report::{Goal, Observability, SectionReport, Security, SetupRow};
use crate::section::{Ctx, Outcome, Section};
use crate::stats::{median, Summary};
use crate::vkbench::{self, Op};

/// Waits until the other pairs' busy-polling threads have given up their
/// spin budget, so a bulk move does not share the CPUs with them (section
/// 5 moves with no other pair active).
fn settle(c: &Ctx) {
    if c.pl.spins() {
        std::thread::sleep(c.pl.spin_budget() + Duration::from_millis(50));
    }
}

/// Named host pairs with an exchange server on each first host.
struct Setups {
    pairs: Vec<(&'static str, (Kernel, Kernel))>,
    servers: Vec<(Pid, JoinHandle<()>)>,
}

impl Setups {
    /// Starts a pair per name, `adjust(name_index, host_index, cfg)` setting
    /// each host up.
    fn start(
        c: &Ctx,
        names: &[&'static str],
        adjust: impl Fn(usize, usize, &mut KernelConfig),
    ) -> Result<Setups, String> {
        let mut pairs = Vec::new();
        for (i, &name) in names.iter().enumerate() {
            let pair =
                vkbench::host_pair_with(c.pl, FaultConfig::default(), |h, k| adjust(i, h, k))?;
            pairs.push((name, pair));
        }
        let servers = pairs
            .iter()
            .map(|(_, (ka, _))| vkbench::start_server(ka, c.pl))
            .collect::<Result<_, _>>()?;
        Ok(Setups { pairs, servers })
    }

    /// Remote null exchanges (and, with `bulk`, one MoveTo of that many
    /// bytes) on each pair in turn, four rounds, so a slow spell of the
    /// machine falls on all of them, each turn once the other pairs'
    /// threads went idle; summaries and median MB/s per pair.
    fn alternate(&self, c: &Ctx, bulk: Option<usize>) -> Result<(Vec<Summary>, Vec<f64>), String> {
        let rounds = 4;
        let per = (c.n / rounds).max(50);
        let k = self.pairs.len();
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); k];
        let mut mbps: Vec<Vec<f64>> = vec![Vec::new(); k];
        for _ in 0..rounds {
            for (i, (name, (_, kb))) in self.pairs.iter().enumerate() {
                let s = self.servers[i].0;
                // The last pair's server spins out its budget after its
                // last request; a third runnable thread would make this
                // pair's spinners yield to it (`spin::RunQueue`).
                settle(c);
                samples[i].extend(vkbench::exchanges(kb, s, Op::Null, per, c.warm / 4, c.pl)?);
                if let Some(bytes) = bulk {
                    settle(c);
                    let r = vkbench::bulk(kb, s, bytes, true, c.pl)?;
                    if !r.intact {
                        return Err(format!("{name}: MoveTo data differ"));
                    }
                    mbps[i].push(bytes as f64 / r.elapsed.as_secs_f64().max(1e-9) / 1e6);
                }
            }
        }
        let sums = samples.iter_mut().map(|s| Summary::of(s)).collect();
        Ok((sums, mbps.iter_mut().map(|v| median(v)).collect()))
    }

    /// Stops the servers, each from its own pair (the pairs do not know
    /// each other).
    fn stop(self) -> Result<(), String> {
        for ((_, (_, kb)), (pid, h)) in self.pairs.iter().zip(self.servers) {
            let probe = kb.create_process().map_err(|e| e.to_string())?;
            vkbench::stop_server(&probe, pid, h);
        }
        Ok(())
    }
}

pub(crate) fn observability(c: &mut Ctx) -> Result<Observability, String> {
    Section::Observability
        .heading(": the cost of metrics and tracing, and a traced characterization run");
    let dir = c.out.join("trace");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files = [dir.join("host-a.jsonl"), dir.join("host-b.jsonl")];
    let setups = Setups::start(
        c,
        &["metrics off", "metrics on", "metrics + tracing"],
        |i, h, k| {
            k.metrics = i > 0;
            k.trace = (i == 2).then(|| files[h].clone());
        },
    )?;
    let (sums, _) = setups.alternate(c, None)?;
    crate::outln!("  remote Send-Receive-Reply µs     median      p99   vs metrics off");
    let mut rows = Vec::new();
    for (i, (name, _)) in setups.pairs.iter().enumerate() {
        let r = sums[i].median_us / sums[0].median_us.max(1e-9);
        crate::outln!(
            "  {name:<30} {:>8.2} {:>8.1} {:>10.3}×",
            sums[i].median_us,
            sums[i].p99_us,
            r
        );
        rows.push(SetupRow {
            setup: name.to_string(),
            latency: sums[i],
            ratio_vs_off: r,
            moveto_mbps: None,
            moveto_ratio: None,
        });
    }
    // A traced remote exchange writes 8 events: the datagram leaving and
    // arriving on each side (4) and the Send, Deliver, Reply and Complete
    // phases (4).
    let probe_ns = (sums[2].median_us - sums[1].median_us) * 1e3 / 8.0;
    crate::outln!(
        "  cost of one trace probe: ≈{probe_ns:.0} ns (latency added per exchange / 8 events)"
    );
    // A traced mixed workload on the traced pair: page reads and writes,
    // small exchanges, 64 KiB moves.
    let (ka, kb) = &setups.pairs[2].1;
    let sp = setups.servers[2].0;
    let k = if c.quick { 100 } else { 500 };
    for (op, n) in [
        (Op::Null, k),
        (Op::PageRead(4096), k),
        (Op::PageWrite(512), k),
        (Op::Echo(200), k),
        (Op::MoveFrom(60_000), k / 10),
    ] {
        vkbench::exchanges(kb, sp, op, n, 0, c.pl)?;
        vkbench::exchanges(ka, sp, op, n / 4, 0, c.pl)?;
    }
    setups.stop()?;
    crate::outln!(
        "\n  characterization of the traced run (vkernel trace report {}/*.jsonl):",
        dir.display()
    );
    let report =
        crate::trace::report_files(&files, false, Some(&dir), Some(&dir.join("chrome.json")))?;
    Ok(Observability {
        overhead: rows,
        probe_ns,
        characterization: report,
    })
}

pub(crate) fn security(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Security.heading(&format!(
        ": the cost of authenticated datagrams (alternating rounds; {})",
        c.pl.describe()
    ));
    let key = vkernel_proto::auth::Key {
        id: 1,
        secret: [0x42; 32],
    };
    let setups = Setups::start(
        c,
        &[
            "no key",
            "MAC (BLAKE3)",
            "AEAD (ChaCha20-Poly1305)",
            "AEAD (AES-256-GCM)",
        ],
        |i, _, k| {
            if i > 0 {
                k.keys = vec![key.clone()];
            }
            k.encrypt = i >= 2;
            if i == 3 {
                k.cipher = vkernel_proto::auth::Cipher::Aes256Gcm;
            }
        },
    )?;
    let bulk = if c.quick { 8 << 20 } else { 64 << 20 };
    let (sums, mb) = setups.alternate(c, Some(bulk))?;
    crate::outln!(
        "  {:<26} {:>10} {:>8} {:>10} {:>14} {:>10}",
        "setup",
        "median µs",
        "p99 µs",
        "vs no key",
        format!("{} MiB MoveTo", bulk >> 20),
        "vs no key"
    );
    let mut rows = Vec::new();
    for (i, (name, _)) in setups.pairs.iter().enumerate() {
        let r = sums[i].median_us / sums[0].median_us.max(1e-9);
        let rb = mb[i] / mb[0].max(1e-9);
        crate::outln!(
            "  {name:<26} {:>10.2} {:>8.1} {:>9.3}× {:>9.0} MB/s {:>9.2}×",
            sums[i].median_us,
            sums[i].p99_us,
            r,
            mb[i],
            rb
        );
        rows.push(SetupRow {
            setup: name.to_string(),
            latency: sums[i],
            ratio_vs_off: r,
            moveto_mbps: Some(mb[i]),
            moveto_ratio: Some(rb),
        });
    }
    // The same move into memory never written: what the first-touch page
    // faults add, printed so the two conditions are not confused.
    let (_, kb) = &setups.pairs[0].1;
    settle(c);
    let cold = vkbench::bulk_into(kb, setups.servers[0].0, bulk, true, c.pl, false)?;
    let cold_mbps = bulk as f64 / cold.elapsed.as_secs_f64().max(1e-9) / 1e6;
    setups.stop()?;
    let s5 = match c.big_move_mbps {
        Some((bytes, m)) if bytes == bulk => {
            format!("section 5's one-MoveTo image in this run: {m:.0} MB/s; ")
        }
        _ => String::new(),
    };
    crate::outln!(
        "  (MoveTo: one {} MiB move per round, after the other pairs' spinning threads went idle, into a buffer written beforehand — the conditions of section 5's image rows; {s5}no key, into never-written memory: {cold_mbps:.0} MB/s — a fresh buffer's first-touch page faults fall inside the move)",
        bulk >> 20
    );
    let goals = vec![
        Goal::at_most(
            "remote exchange with a MAC / without a key",
            rows[1].ratio_vs_off,
            1.10,
            "×",
        ),
        Goal::at_least(
            "64 MiB MoveTo with a MAC / without a key",
            rows[1].moveto_ratio.unwrap_or(0.0),
            0.8,
            "×",
        ),
        Goal::at_least(
            "64 MiB MoveTo encrypted (fastest cipher) / without a key",
            rows[2..]
                .iter()
                .filter_map(|r| r.moveto_ratio)
                .fold(0.0, f64::max),
            0.5,
            "×",
        ),
    ];
    Ok(Outcome {
        report: SectionReport::Security(Security {
            rows,
            bulk_bytes: bulk,
        }),
        goals,
        charts: Vec::new(),
    })
}
