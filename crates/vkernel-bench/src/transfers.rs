//! Section 5's bulk rows: what one remote MoveTo costs against its size,
//! congestion control under injected loss (clean and lossy pairs in the
//! same run), and UDP segmentation offload with Ethernet-sized datagrams.

use vkernel::FaultConfig;
use vkernel_proto::Pid;

use crate::report::{BulkRows, Goal, LossRow, MtuRow};
use crate::section::{Chart, Ctx};
use crate::stats::Summary;
use crate::vkbench::{self, Op};
use crate::{chart, Mode};

/// A pair of hosts with a bulk server on the first.
struct Pair {
    a: vkernel::Kernel,
    b: vkernel::Kernel,
    pid: Pid,
    server: std::thread::JoinHandle<()>,
    mbps: Vec<f64>,
}

impl Pair {
    fn new(
        pl: Mode,
        faults: FaultConfig,
        adjust: impl Fn(usize, &mut vkernel::KernelConfig),
    ) -> Result<Pair, String> {
        let (a, b) = vkbench::host_pair_with(pl, faults, adjust)?;
        let (pid, server) = vkbench::start_server(&a, pl)?;
        Ok(Pair {
            a,
            b,
            pid,
            server,
            mbps: Vec::new(),
        })
    }

    /// One transfer of `bytes`; its MB/s is kept.
    fn transfer(&mut self, bytes: usize, to: bool, pl: Mode) -> Result<(), String> {
        let r = vkbench::bulk(&self.b, self.pid, bytes, to, pl)?;
        if !r.intact {
            return Err(format!("a {bytes}-byte transfer delivered wrong bytes"));
        }
        self.mbps
            .push(r.bytes as f64 / r.elapsed.as_secs_f64().max(1e-9) / 1e6);
        Ok(())
    }

    /// Stops the server; the median MB/s and the pair's (bulk
    /// retransmissions, congestion-window cuts, datagrams sent segmented).
    fn finish(mut self) -> Result<(f64, (u64, u64, u64)), String> {
        let c = self.b.create_process().map_err(|e| e.to_string())?;
        vkbench::stop_server(&c, self.pid, self.server);
        let (sa, sb) = (self.a.stats(), self.b.stats());
        let counts = (
            sa.bulk_retransmits + sb.bulk_retransmits,
            sa.bulk_cwnd_cuts + sb.bulk_cwnd_cuts,
            self.a.batch_counts().1 + self.b.batch_counts().1,
        );
        self.mbps.sort_by(f64::total_cmp);
        Ok((self.mbps[self.mbps.len() / 2], counts))
    }
}

/// Median MB/s of `reps` transfers of `bytes` on two pairs of hosts, set
/// up by `(faults, adjust)` each, the transfers alternating between the
/// pairs so that both see the same machine.
#[allow(clippy::type_complexity)]
fn side_by_side(
    pl: Mode,
    x: (FaultConfig, &dyn Fn(usize, &mut vkernel::KernelConfig)),
    y: (FaultConfig, &dyn Fn(usize, &mut vkernel::KernelConfig)),
    bytes: usize,
    to: bool,
    reps: usize,
) -> Result<[(f64, (u64, u64, u64)); 2], String> {
    let mut px = Pair::new(pl, x.0, x.1)?;
    let mut py = Pair::new(pl, y.0, y.1)?;
    for _ in 0..reps {
        px.transfer(bytes, to, pl)?;
        py.transfer(bytes, to, pl)?;
    }
    Ok([px.finish()?, py.finish()?])
}

fn op_name(to: bool) -> String {
    if to { "MoveTo" } else { "MoveFrom" }.to_string()
}

/// Runs the rows, prints them, and returns them with their goals and the
/// cost-against-bytes chart.
pub(crate) fn rows(c: &mut Ctx) -> Result<(BulkRows, Vec<Goal>, Chart), String> {
    let quick = c.quick;
    let mut out = BulkRows::default();
    let mut goals = Vec::new();

    // Cost against bytes: one MoveTo of each size.
    crate::outln!("  one remote MoveTo by size (cost should grow linearly in bytes):");
    let sizes: &[usize] = if quick {
        &[64 << 10, 256 << 10, 1 << 20, 4 << 20]
    } else {
        &[64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    };
    for &bytes in sizes {
        let reps = match bytes {
            b if b <= 1 << 20 => {
                if quick {
                    20
                } else {
                    100
                }
            }
            b if b <= 4 << 20 => {
                if quick {
                    5
                } else {
                    20
                }
            }
            _ => 5,
        };
        let r = c.timed(
            false,
            Op::Load {
                total: bytes,
                unit: bytes,
            },
            reps,
        )?;
        let mut v = r.samples.clone();
        let s = Summary::of(&mut v);
        crate::outln!(
            "    {:>6} KiB  median {:>9.1} µs  p99 {:>9.1} µs  {:>7.1} µs/MiB  {:>7.1} MB/s",
            bytes >> 10,
            s.median_us,
            s.p99_us,
            s.median_us / (bytes as f64 / (1 << 20) as f64),
            bytes as f64 / s.median_us.max(1e-9)
        );
        out.by_bytes.push((bytes, s));
    }

    // Congestion control: the same transfers clean and at 1 % loss.
    let big = if quick { 8 << 20 } else { 64 << 20 };
    let reps = if quick { 2 } else { 5 };
    let loss = 0.01;
    crate::outln!(
        "  congestion control: {} MiB, median of {reps}, a clean pair and a pair losing {:.0} % of datagrams, transfers alternating:",
        big >> 20,
        loss * 100.0
    );
    for to in [true, false] {
        let lossy_faults = FaultConfig {
            loss,
            seed: 11,
            ..FaultConfig::default()
        };
        let same = |_: usize, _: &mut vkernel::KernelConfig| {};
        let [(clean, _), (lossy, (retx, cuts, _))] = side_by_side(
            c.pl,
            (FaultConfig::default(), &same),
            (lossy_faults, &same),
            big,
            to,
            reps,
        )?;
        crate::outln!(
            "    {:<8} clean {clean:>8.1} MB/s  1 % loss {lossy:>8.1} MB/s ({retx} chunks resent, {cuts} window cuts)",
            op_name(to)
        );
        goals.push(Goal::at_least(
            &format!("{} at 1 % loss / clean", op_name(to)),
            lossy / clean.max(1e-9),
            0.5,
            "×",
        ));
        out.loss.push(LossRow {
            op: op_name(to),
            bytes: big,
            loss,
            clean_mbps: clean,
            lossy_mbps: lossy,
            retransmits: retx,
            cwnd_cuts: cuts,
        });
    }

    // Segmentation offload with the datagram size of an Ethernet link.
    crate::outln!(
        "  1,472-byte datagrams (an Ethernet MTU), {} MiB, one send per datagram against UDP segmentation offload:",
        big >> 20
    );
    for to in [true, false] {
        let with = |gso: bool| {
            move |_: usize, k: &mut vkernel::KernelConfig| {
                k.datagram_size = Some(1472);
                k.gso = gso;
            }
        };
        let none = FaultConfig::default;
        let [(plain, _), (gso, (_, _, segs))] = side_by_side(
            c.pl,
            (none(), &with(false)),
            (none(), &with(true)),
            big,
            to,
            reps,
        )?;
        crate::outln!(
            "    {:<8} plain {plain:>8.1} MB/s  GSO {gso:>8.1} MB/s ({segs} datagrams segmented): {:.2}×",
            op_name(to),
            gso / plain.max(1e-9)
        );
        out.mtu.push(MtuRow {
            op: op_name(to),
            bytes: big,
            plain_mbps: plain,
            gso_mbps: gso,
            gso_datagrams: segs,
        });
    }

    let pts: Vec<(f64, f64)> = out
        .by_bytes
        .iter()
        .map(|(b, s)| (*b as f64 / 1024.0, s.median_us.max(1e-3)))
        .collect();
    let ideal: Vec<(f64, f64)> = pts
        .first()
        .map(|&(b0, t0)| pts.iter().map(|&(b, _)| (b, t0 * b / b0)).collect())
        .unwrap_or_default();
    let chart = Chart {
        file: "bulk.svg",
        draw: Box::new(move |p| {
            chart::lines(
                p,
                "One remote MoveTo: time against bytes (log-log)",
                "KiB moved",
                "µs (median)",
                &[
                    ("vkernel remote MoveTo".to_string(), pts),
                    ("linear from the smallest".to_string(), ideal),
                ],
                true,
            )
        }),
    };
    Ok((out, goals, chart))
}
