//! Section 5's transfer units on real link MTUs: two logical hosts in two
//! network namespaces joined by a veth pair whose MTU is 1,500 or 9,000,
//! each host's bulk datagrams sized to the link (MTU − 28). On loopback a
//! 64 KiB unit plus its header is two datagrams, which no real link has;
//! here a unit and one long MoveTo are cut into the same datagrams.
//!
//! The namespaces are made with `ip` and removed when the pair is
//! dropped. Each host is started on a thread that entered its namespace
//! (`setns`), so its sockets and the threads it starts live there. Needs
//! root and iproute2; without them the rows are skipped and say why.

use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use vkernel::{Kernel, KernelConfig};

use crate::stats::Summary;
use crate::vkbench::{self, Op};
use crate::Mode;

/// Two namespaces on a veth pair; removed on drop.
struct NsPair {
    a: String,
    b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    crate::files::run_quiet(Command::new("ip").args(args))
        .map_err(|e| format!("{e} (ip {})", args.join(" ")))
}

/// Addresses of the two ends (TEST-NET-1, inside the namespaces only).
const ADDR_A: [u8; 4] = [192, 0, 2, 1];
const ADDR_B: [u8; 4] = [192, 0, 2, 2];

impl NsPair {
    fn create(mtu: u32) -> Result<NsPair, String> {
        let id = std::process::id() % 100_000;
        let p = NsPair {
            a: format!("vkmtu{mtu}a{id}"),
            b: format!("vkmtu{mtu}b{id}"),
        };
        let (va, vb) = (format!("vm{mtu}a{id}"), format!("vm{mtu}b{id}"));
        let m = mtu.to_string();
        ip(&["netns", "add", &p.a])?;
        ip(&["netns", "add", &p.b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &p.a])?;
        ip(&["link", "set", &vb, "netns", &p.b])?;
        for (ns, dev, addr) in [(&p.a, &va, "192.0.2.1/24"), (&p.b, &vb, "192.0.2.2/24")] {
            ip(&["-n", ns, "link", "set", dev, "mtu", &m])?;
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(p)
    }
}

impl Drop for NsPair {
    fn drop(&mut self) {
        // Deleting a namespace removes its end of the veth, and so both.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// Moves the calling thread into the network namespace `name`.
fn enter(name: &str) -> Result<(), String> {
    let f = std::fs::File::open(format!("/var/run/netns/{name}"))
        .map_err(|e| format!("namespace {name}: {e}"))?;
    // SAFETY: setns(2) on a namespace file we hold open; CLONE_NEWNET
    // changes only this thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r == 0 {
        Ok(())
    } else {
        Err(format!("setns {name}: {}", std::io::Error::last_os_error()))
    }
}

/// One MTU's rows.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MtuUnits {
    /// The link's MTU.
    pub mtu: u32,
    /// Bulk datagram payload the hosts used (MTU − 28).
    pub datagram: usize,
    /// Bytes moved per load.
    pub bytes: usize,
    /// One MoveTo of `bytes`, MB/s (median).
    pub one_mbps: f64,
    /// `bytes` in 64 KiB MoveTo units, MB/s (median).
    pub units_mbps: f64,
    /// The same units from a buffer the server shares
    /// (`Process::move_to_shared`: write-behind without its copy), MB/s.
    pub shared_units_mbps: f64,
    /// Loads timed of each.
    pub n: usize,
    /// Chunks the mover resent and window cuts, per kind (one MoveTo,
    /// units, shared units), over the timed loads.
    pub resent: [(u64, u64); 3],
}

/// The timed loads of each kind, and what the mover resent for each.
type Loads = (Vec<Duration>, Vec<Duration>, Vec<Duration>, [(u64, u64); 3]);

/// The benchmark server's pid and thread.
type Server = (vkernel::Pid, std::thread::JoinHandle<()>);

/// Starts a host in namespace `ns` bound to `addr`, on a thread of that
/// namespace; with `server`, the benchmark server too.
fn host_in(
    ns: String,
    addr: [u8; 4],
    cfg: KernelConfig,
    server: bool,
    pl: Mode,
) -> Result<(Kernel, Option<Server>), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = (|| {
            enter(&ns)?;
            let k = Kernel::start(KernelConfig {
                bind: (addr, 0).into(),
                ..cfg
            })
            .map_err(|e| e.to_string())?;
            let s = if server {
                Some(vkbench::start_server(&k, pl)?)
            } else {
                None
            };
            Ok((k, s))
        })();
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(20))
        .map_err(|_| "a host in a namespace did not start".to_string())?
}

/// 64 KiB MoveTo units against one MoveTo of `total` bytes between two
/// namespaces on a link of `mtu`, `n` loads each, alternating.
pub fn units_on_mtu(mtu: u32, total: usize, n: usize, pl: Mode) -> Result<MtuUnits, String> {
    let pair = NsPair::create(mtu)?;
    let datagram = mtu as usize - 28;
    let cfg = KernelConfig {
        datagram_size: Some(datagram),
        ..vkbench::kcfg(pl)
    };
    let (ka, srv) = host_in(pair.a.clone(), ADDR_A, cfg.clone(), true, pl)?;
    let Some((pid, h)) = srv else {
        return Err("the server did not start".into());
    };
    let (kb, _) = host_in(
        pair.b.clone(),
        ADDR_B,
        KernelConfig {
            peers: vec![ka.local_addr()],
            ..cfg
        },
        false,
        pl,
    )?;
    ka.add_peer(kb.local_addr());
    // The client runs on a thread of B's namespace too (its process may
    // open sockets of its own).
    let b_ns = pair.b.clone();
    let result = std::thread::scope(|s| {
        s.spawn(|| -> Result<Loads, String> {
            enter(&b_ns)?;
            pl.pin(0);
            let c = kb.create_process().map_err(|e| e.to_string())?;
            let (mut one, mut units, mut shared) = (Vec::new(), Vec::new(), Vec::new());
            let mut resent = [(0u64, 0u64); 3];
            let unit = 64 << 10;
            // Alternating, after one of each to warm up.
            let r = (|| {
                for round in 0..n + 1 {
                    for (i, (op, out)) in [
                        (Op::Load { total, unit: total }, &mut one),
                        (Op::Load { total, unit }, &mut units),
                        (Op::LoadShared { total, unit }, &mut shared),
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        let s0 = ka.stats();
                        let s = vkbench::elapsed_only(&c, pid, op, 1, 0)?;
                        let s1 = ka.stats();
                        if round > 0 {
                            out.extend(s);
                            resent[i].0 += s1.bulk_retransmits - s0.bulk_retransmits;
                            resent[i].1 += s1.bulk_cwnd_cuts - s0.bulk_cwnd_cuts;
                        }
                    }
                }
                Ok::<(), String>(())
            })();
            // Stopped from this namespace's thread, whatever happened.
            vkbench::stop_server(&c, pid, h);
            r.map(|()| (one, units, shared, resent))
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    });
    drop((kb, ka));
    drop(pair);
    let (mut one, mut units, mut shared, resent) = result?;
    let mbps = |s: &mut [Duration]| total as f64 / Summary::of(s).median_us.max(1e-9);
    Ok(MtuUnits {
        mtu,
        datagram,
        bytes: total,
        one_mbps: mbps(&mut one),
        units_mbps: mbps(&mut units),
        shared_units_mbps: mbps(&mut shared),
        resent,
        n,
    })
}

/// Whether namespaces can be made here (root and iproute2).
pub fn available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root".into());
    }
    Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("needs iproute2 ({e})"))
        .map(|_| ())
}

/// Section 5's rows: both MTUs, printed, with their goals (64 KiB units
/// ≥ 0.9× one MoveTo). Skipped, and said so, where namespaces cannot be
/// made.
pub(crate) fn rows(quick: bool, pl: Mode) -> (Vec<MtuUnits>, Vec<crate::report::Goal>) {
    let (total, n) = if quick { (8 << 20, 3) } else { (64 << 20, 5) };
    let mut out = Vec::new();
    let mut goals = Vec::new();
    if let Err(why) = available() {
        crate::outln!("  units on real MTUs (network namespaces): skipped, {why}");
        return (out, goals);
    }
    for mtu in [1500, 9000] {
        match units_on_mtu(mtu, total, n, pl) {
            Ok(r) => {
                let ratio = r.units_mbps / r.one_mbps.max(1e-9);
                let shared = r.shared_units_mbps / r.one_mbps.max(1e-9);
                crate::outln!(
                    "  {} MiB across a veth of MTU {mtu} ({} B datagrams, two namespaces): one MoveTo {:.1} MB/s; 64 KiB units {:.1} MB/s: {ratio:.2}×; from a shared buffer {:.1} MB/s: {shared:.2}× (medians of {n}, alternating; chunks resent/window cuts {:?})",
                    total >> 20,
                    r.datagram,
                    r.one_mbps,
                    r.units_mbps,
                    r.shared_units_mbps,
                    r.resent,
                );
                goals.push(crate::report::Goal::at_least(
                    &format!("MTU {mtu}: 64 KiB MoveTo units / one MoveTo"),
                    ratio,
                    0.9,
                    "×",
                ));
                goals.push(crate::report::Goal::at_least(
                    &format!("MTU {mtu}: 64 KiB units from a shared buffer / one MoveTo"),
                    shared,
                    0.9,
                    "×",
                ));
                out.push(r);
            }
            Err(e) => crate::outln!("  units across a veth of MTU {mtu}: failed: {e}"),
        }
    }
    (out, goals)
}
