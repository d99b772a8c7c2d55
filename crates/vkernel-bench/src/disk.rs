//! Section 10: the network disk.

use std::time::{Duration, Instant};

use vkernel::Kernel;

use crate::report::{Disk, NativeDisk, ToolRow};
use crate::section::{Ctx, Section};
use crate::stats::median;
use crate::{baseline, vkbench};

/// Runs an external client tool; its wall time in seconds, or why not.
fn timed_tool(cmd: &mut std::process::Command) -> Result<(f64, String), String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let t = Instant::now();
    let o = cmd
        .output()
        .map_err(|e| format!("{name} not available ({e})"))?;
    if !o.status.success() {
        return Err(format!(
            "{name} failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        ));
    }
    Ok((
        t.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    ))
}

/// The part of fio's JSON output read here.
#[derive(serde::Deserialize)]
struct FioOutput {
    jobs: Vec<FioJob>,
}

#[derive(serde::Deserialize)]
struct FioJob {
    read: FioSide,
    write: FioSide,
}

#[derive(serde::Deserialize)]
struct FioSide {
    iops: f64,
}

/// 4 KiB random-read IOPS of fio's nbd engine against `uri`.
fn fio_iops(uri: &str, secs: u32, rw: &str) -> Result<f64, String> {
    let (_, out) = timed_tool(std::process::Command::new("fio").args([
        "--name=vk",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        &format!("--rw={rw}"),
        "--bs=4k",
        "--iodepth=32",
        "--time_based",
        &format!("--runtime={secs}"),
        "--size=16M",
        "--verify_state_save=0",
        "--output-format=json",
    ]))?;
    // fio may print notes before the JSON document.
    let doc = out.find('{').map_or("", |i| &out[i..]);
    let j: FioOutput = serde_json::from_str(doc).map_err(|e| format!("fio output: {e}"))?;
    let job = j.jobs.first().ok_or("fio reported no job")?;
    Ok(if rw.contains("read") {
        job.read.iops
    } else {
        job.write.iops
    })
}

/// Rounds of the sequential nbdcopy rows (each run moves the whole disk:
/// tens of milliseconds).
const SEQ_ROUNDS: usize = 5;

pub(crate) fn disk(c: &mut Ctx) -> Result<Disk, String> {
    use std::process::{Command, Stdio};
    use vkernel_disk::backing::{Backing, BackingSpec};
    Section::Disk
        .heading("(VISA/IPdisk): the NBD gateway beside nbdkit's memory plugin, same client tools");
    let size: usize = if c.quick { 16 << 20 } else { 64 << 20 };
    let secs = if c.quick { 1 } else { 3 };
    // Disk hosts block while waiting: dozens of spinning V processes
    // would starve each other on two CPUs.
    let kc = |peers: Vec<std::net::SocketAddr>| vkernel::KernelConfig {
        peers,
        spin: Duration::ZERO,
        ..Default::default()
    };
    let a = Kernel::start(kc(vec![])).map_err(|e| e.to_string())?;
    let b = Kernel::start(kc(vec![a.local_addr()])).map_err(|e| e.to_string())?;
    a.add_peer(b.local_addr());
    let store = Backing::open(&BackingSpec::Ram(size as u64)).map_err(|e| e.to_string())?;
    let srv = vkernel_disk::server::DiskServer::start(
        &a,
        store,
        vkernel_disk::server::ServerConfig {
            owner_key: Some(7),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let client = std::sync::Arc::new(
        vkernel_disk::client::Client::open(&b, srv.pid(), 0, 7, 32).map_err(|e| e.to_string())?,
    );
    // The native client against the raw UDP blast.
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let mut back = vec![0u8; size];
    // Median of three passes each way, like the blast it is compared with
    // (one pass would also time the first touch of every page).
    let (mut ws, mut rs) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let t = Instant::now();
        client.write(0, &data, false).map_err(|e| e.to_string())?;
        ws.push(size as f64 / t.elapsed().as_secs_f64() / 1e6);
        back.fill(0);
        let t = Instant::now();
        client.read(0, &mut back).map_err(|e| e.to_string())?;
        rs.push(size as f64 / t.elapsed().as_secs_f64() / 1e6);
        if back != data {
            return Err("IPdisk read back different data".into());
        }
    }
    let (w, r) = (median(&mut ws), median(&mut rs));
    // The blast blocks too: both sides of the ratio in one waiting mode.
    let blast = baseline::udp_blast(size, vkernel_proto::wire::MAX_DATAGRAM, c.pl.blocking(), 3)?;
    crate::outln!(
        "  native client, {} MiB (median of 3, blocking waits): write {w:.0} MB/s, read {r:.0} MB/s; raw UDP blast, blocking, {:.0} MB/s (write {:.2}×, read {:.2}×)",
        size >> 20,
        blast.mbps,
        w / blast.mbps.max(1e-9),
        r / blast.mbps.max(1e-9)
    );
    // A gateway on a loopback port serving `dev`, and its URI.
    let gateway = |dev: std::sync::Arc<vkernel_disk::client::Client>| {
        let g = vkernel_disk::nbd::Gateway::start(
            &vkernel_disk::nbd::ListenAddr::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            vec![vkernel_disk::nbd::Export {
                name: "ipdisk".into(),
                description: "bench".into(),
                dev,
            }],
        )
        .map_err(|e| e.to_string())?;
        let uri = match g.addr() {
            vkernel_disk::nbd::ListenAddr::Tcp(a) => format!("nbd://{a}"),
            vkernel_disk::nbd::ListenAddr::Unix(p) => {
                format!("nbd+unix:///?socket={}", p.display())
            }
        };
        Ok::<_, String>((g, uri))
    };
    let (_gw, gw_uri) = gateway(client.clone())?;
    // The same gateway inside the disk's own logical host (`vkernel disk
    // --nbd`): its V IPC with the disk is local.
    let (_gw1, gw1_uri) = gateway(std::sync::Arc::new(
        vkernel_disk::client::Client::open(&a, srv.pid(), 0, 7, 32).map_err(|e| e.to_string())?,
    ))?;
    // The same two-host gateway as a user gets it from the README's
    // commands: `KernelConfig::default()` waiting (adaptive spin) on both.
    let da = Kernel::start(vkernel::KernelConfig::default()).map_err(|e| e.to_string())?;
    let db = Kernel::start(vkernel::KernelConfig {
        peers: vec![da.local_addr()],
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    da.add_peer(db.local_addr());
    let dsrv = vkernel_disk::server::DiskServer::start(
        &da,
        Backing::open(&BackingSpec::Ram(size as u64)).map_err(|e| e.to_string())?,
        vkernel_disk::server::ServerConfig {
            owner_key: Some(7),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let (_gwd, gwd_uri) = gateway(std::sync::Arc::new(
        vkernel_disk::client::Client::open(&db, dsrv.pid(), 0, 7, 32).map_err(|e| e.to_string())?,
    ))?;
    // nbdkit's memory plugin on a free port, stopped with the section.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let nbdkit = Command::new("nbdkit")
        .args([
            "-f",
            "--exit-with-parent",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "memory",
        ])
        .arg(format!("{size}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut rows = Vec::new();
    let kit_uri = format!("nbd://127.0.0.1:{port}");
    let mut nbdkit = match nbdkit {
        Ok(ch) => Some(ch),
        Err(e) => {
            crate::outln!("  nbdkit not available ({e}): the gateway is measured alone");
            None
        }
    };
    std::thread::sleep(Duration::from_millis(300));
    let dir = std::env::temp_dir().join(format!("vkbench-disk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let img = dir.join("src.img");
    std::fs::write(&img, &data).map_err(|e| e.to_string())?;
    crate::outln!(
        "  {:<34} {:>15} {:>15} {:>15} {:>15} {:>7} {:>7} {:>7}",
        "client tool",
        "gateway 2 hosts",
        "gateway 1 host",
        "2 hosts default",
        "nbdkit memory",
        "ratio",
        "ratio",
        "ratio"
    );
    let targets: Vec<(&str, String)> = [
        ("gateway", gw_uri.clone()),
        ("gateway1", gw1_uri),
        ("gateway-defaults", gwd_uri),
    ]
    .into_iter()
    .chain(nbdkit.as_ref().map(|_| ("nbdkit", kit_uri.clone())))
    .collect();
    // The targets take turns, `rounds` times, and each row is the median
    // of its target's runs: a slow spell of the machine then falls on all
    // of them rather than on whichever ran during it.
    let mut measure =
        |label: &str, rounds: usize, f: &dyn Fn(&str) -> Result<f64, String>, unit: &str| {
            let mut runs: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
            let mut failed = vec![false; targets.len()];
            for _ in 0..rounds.max(1) {
                for (k, (_, u)) in targets.iter().enumerate() {
                    if failed[k] {
                        continue;
                    }
                    match f(u) {
                        Ok(v) => runs[k].push(v),
                        Err(e) => {
                            crate::outln!("  {label}: {e}");
                            failed[k] = true;
                        }
                    }
                }
            }
            let vals: Vec<Option<f64>> = runs
                .into_iter()
                .zip(&failed)
                .map(|(mut v, &bad)| (!bad && !v.is_empty()).then(|| median(&mut v)))
                .collect();
            let g = vals.first().copied().flatten();
            let g1 = vals.get(1).copied().flatten();
            let gd = vals.get(2).copied().flatten();
            let k = vals.get(3).copied().flatten();
            let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} {unit}"));
            let ratio = |g: Option<f64>| match (g, k) {
                (Some(g), Some(k)) if k > 0.0 => format!("{:.2}×", g / k),
                _ => "-".into(),
            };
            crate::outln!(
                "  {label:<34} {:>15} {:>15} {:>15} {:>15} {:>7} {:>7} {:>7}",
                fmt(g),
                fmt(g1),
                fmt(gd),
                fmt(k),
                ratio(g),
                ratio(g1),
                ratio(gd)
            );
            rows.push(ToolRow {
                test: label.into(),
                gateway: g,
                gateway_same_host: g1,
                gateway_defaults: gd,
                nbdkit: k,
                unit: unit.into(),
            });
        };
    let mb = size as f64 / 1e6;
    let img_s = img.to_string_lossy().into_owned();
    measure(
        "nbdcopy write (sequential)",
        SEQ_ROUNDS,
        &|u: &str| {
            timed_tool(Command::new("nbdcopy").args([img_s.as_str(), u])).map(|(t, _)| mb / t)
        },
        "MB/s",
    );
    measure(
        "nbdcopy read (sequential)",
        SEQ_ROUNDS,
        &|u: &str| timed_tool(Command::new("nbdcopy").args([u, "null:"])).map(|(t, _)| mb / t),
        "MB/s",
    );
    measure(
        "fio 4 KiB random read, depth 32",
        1,
        &|u: &str| fio_iops(u, secs, "randread"),
        "IOPS",
    );
    measure(
        "fio 4 KiB random write, depth 32",
        1,
        &|u: &str| fio_iops(u, secs, "randwrite"),
        "IOPS",
    );
    if let Some(ch) = nbdkit.as_mut() {
        let _ = ch.kill();
        let _ = ch.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    crate::outln!("  (sequential rows: the targets take turns, five rounds, median of each; \"2 hosts\": disk and gateway on two logical hosts of this process, the V hop over UDP; \"1 host\": the gateway in the disk's logical host, as `vkernel disk --nbd`; both with blocking waits; \"2 hosts default\": as \"2 hosts\" with the waiting a user gets without flags, {}; ratios against nbdkit)", vkbench::default_waiting());
    Ok(Disk {
        native: NativeDisk {
            write_mbps: w,
            read_mbps: r,
            raw_blast_mbps: blast.mbps,
            bytes: size,
        },
        tools: rows,
    })
}
