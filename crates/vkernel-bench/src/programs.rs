//! Section 18's clients as separate programs: k copies of this executable
//! (`vkernel bench-client`, a hidden command), each a client of its own,
//! started together, against the same vkernel echo server or raw UDP echo
//! server as the thread rows. Each vkernel client program is a logical
//! host of its own (as any program that does not attach to a machine
//! host), so k programs are k hosts sending to one server.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vkernel::{Kernel, KernelConfig, Message, Pid};
use vkernel_peers::Wait;

use crate::Mode;

/// What one client program does (the hidden command's arguments).
#[derive(Clone, Debug)]
pub struct ClientArgs {
    /// The raw UDP echo server, or the vkernel server's host address.
    pub server: SocketAddr,
    /// The vkernel echo server's pid; `None`: raw UDP.
    pub pid: Option<u32>,
    /// Logical host id of the client's host (vkernel only).
    pub host_id: u16,
    /// Busy-poll (`true`) or block.
    pub spin: bool,
    /// Start at this Unix time (ms) and run for `ms`.
    pub start_at_ms: u64,
    /// How long to run, ms.
    pub ms: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs one client program: waits for the start time, exchanges until
/// the end, prints `exchanges retransmits needless latency_us…` on one
/// line.
pub fn client_main(a: &ClientArgs) -> Result<(), String> {
    let mode = if a.spin { Mode::SPIN } else { Mode::BLOCK };
    let kernel;
    let mut one: Box<dyn FnMut() -> Result<Duration, String>> = match a.pid {
        Some(pid) => {
            let k = Kernel::start(KernelConfig {
                host_id: Some(a.host_id),
                peers: vec![a.server],
                spin: mode.spin_budget(),
                adaptive_spin: false,
                ..KernelConfig::default()
            })
            .map_err(|e| e.to_string())?;
            let p = k.create_process().map_err(|e| e.to_string())?;
            kernel = Some(k);
            let to = Pid(pid);
            Box::new(move || {
                let mut m = Message::with_code(1);
                let t = Instant::now();
                p.send(&mut m, to).map_err(|e| e.to_string())?;
                Ok(t.elapsed())
            })
        }
        None => {
            kernel = None;
            Box::new(raw_client(a.server, mode.wait)?)
        }
    };
    let now = unix_ms();
    if a.start_at_ms > now {
        std::thread::sleep(Duration::from_millis(a.start_at_ms - now));
    }
    let end = Instant::now() + Duration::from_millis(a.ms);
    let mut lat = Vec::new();
    while Instant::now() < end {
        lat.push(one()?);
    }
    let (retx, needless) = kernel.as_ref().map_or((0, 0), |k| {
        let s = k.stats();
        (s.retransmits, s.retransmits_needless)
    });
    let mut line = format!("{} {retx} {needless}", lat.len());
    for d in lat {
        line.push(' ');
        line.push_str(&format!("{:.1}", d.as_secs_f64() * 1e6));
    }
    crate::outln!("{line}");
    Ok(())
}

/// One raw UDP client: a connected socket; each call one exchange.
pub(crate) fn raw_client(
    server: SocketAddr,
    wait: Wait,
) -> Result<impl FnMut() -> Result<Duration, String> + Send, String> {
    let s = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    s.connect(server).map_err(|e| e.to_string())?;
    match wait {
        Wait::Spin => s.set_nonblocking(true),
        // A lost datagram is resent after this long (none are, here).
        Wait::Block => s.set_read_timeout(Some(Duration::from_millis(200))),
    }
    .map_err(|e| e.to_string())?;
    Ok(move || {
        let m = [7u8; 32];
        let mut b = [0u8; 64];
        let t = Instant::now();
        s.send(&m).map_err(|e| e.to_string())?;
        let give_up = t + Duration::from_secs(1);
        loop {
            match s.recv(&mut b) {
                Ok(_) => return Ok(t.elapsed()),
                Err(_) if Instant::now() > give_up => {
                    return Err("raw UDP echo: no answer within 1 s".into())
                }
                Err(_) if wait == Wait::Spin => std::hint::spin_loop(),
                Err(_) => {
                    s.send(&m).map_err(|e| e.to_string())?;
                }
            }
        }
    })
}

/// This executable, if it is the `vkernel` command (which has the hidden
/// `bench-client` command); test binaries are not.
pub(crate) fn client_program() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    (exe.file_stem()? == "vkernel").then_some(exe)
}

/// Runs `k` client programs together for `dur` against `server` (a raw
/// UDP address, or a vkernel host address with `pid`): every latency, and
/// the programs' retransmissions (all, and those found needless). Host ids `first_id..first_id + k`.
pub(crate) fn run_programs(
    exe: &std::path::Path,
    k: usize,
    dur: Duration,
    server: SocketAddr,
    pid: Option<Pid>,
    spin: bool,
    first_id: u16,
) -> Result<(Vec<Duration>, (u64, u64)), String> {
    // Time for k programs to start (and each host to bind) before the run.
    let start_at = unix_ms() + 300 + 10 * k as u64;
    let mut children = Vec::new();
    for i in 0..k {
        let mut c = Command::new(exe);
        c.arg("bench-client")
            .arg("--server")
            .arg(server.to_string())
            .arg("--start-at-ms")
            .arg(start_at.to_string())
            .arg("--ms")
            .arg(dur.as_millis().to_string())
            .arg("--host-id")
            .arg((first_id + i as u16).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(p) = pid {
            c.arg("--pid").arg(p.0.to_string());
        }
        if spin {
            c.arg("--spin");
        }
        children.push(c.spawn().map_err(|e| format!("client program: {e}"))?);
    }
    let mut lat = Vec::new();
    let mut retx = (0, 0);
    for ch in children {
        let o = ch.wait_with_output().map_err(|e| e.to_string())?;
        let out = String::from_utf8_lossy(&o.stdout);
        if !o.status.success() {
            return Err(format!(
                "client program failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        let mut it = out.split_whitespace();
        let _n = it.next();
        let mut count = || it.next().and_then(|r| r.parse::<u64>().ok()).unwrap_or(0);
        retx.0 += count();
        retx.1 += count();
        lat.extend(
            it.filter_map(|x| x.parse::<f64>().ok())
                .map(|us| Duration::from_secs_f64(us / 1e6)),
        );
    }
    Ok((lat, retx))
}
