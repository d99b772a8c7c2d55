//! `vkernel echo`: a logical host with an echo server registered by name.

use std::time::{Duration, Instant};

use vkernel::{IpcError, Kernel, Message, Process, Scope};

use crate::hostopts::{logical_id, service_group, HostOpts};

/// Request code of an echo exchange.
pub const ECHO: u32 = 0x0e_c400;
/// Request code of a bulk echo: the server MoveFroms the whole segment,
/// flips every byte (XOR 0xff) and MoveTos it back before replying.
pub const ECHO_BULK: u32 = 0x0e_c401;

/// Largest segment a bulk echo accepts.
pub const MAX_BULK: usize = 256 << 20;

/// Serves echo requests until the host shuts down: the message comes back
/// unchanged, and a read+write segment's first part is returned with the reply.
pub fn serve(p: Process) {
    let mut m = Message::zero();
    let mut buf = vec![0u8; vkernel_proto::MAX_APPEND];
    loop {
        let i = match p.receive_with_segment(&mut m, &mut buf) {
            Ok(i) => i,
            Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
            Err(_) => continue,
        };
        let access = m.seg_access();
        if m.code() == ECHO_BULK {
            // A failed move still gets an answer (word 1 = u32::MAX): an
            // unanswered Send would wait on replyPending forever.
            match bulk(&p, &mut m, i.from) {
                Ok(()) => {}
                Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
                Err(e) => {
                    tracing::debug!("bulk echo for {}: {e}", i.from);
                    m.0[1] = u32::MAX;
                }
            }
            if let Err(e) = p.reply(&m, i.from) {
                tracing::debug!("bulk echo reply to {}: {e}", i.from);
            }
            continue;
        }
        let r = if m.code() == ECHO && access.write && i.seg_bytes > 0 {
            p.reply_with_segment(&m, i.from, 0, &buf[..i.seg_bytes])
        } else {
            p.reply(&m, i.from)
        };
        if let Err(e) = r {
            tracing::debug!("echo reply to {}: {e}", i.from);
        }
    }
}

fn bulk(p: &Process, m: &mut Message, from: vkernel::Pid) -> Result<(), IpcError> {
    let n = m.seg_len() as usize;
    let a = m.seg_access();
    if !(a.read && a.write) || n > MAX_BULK {
        m.0[1] = u32::MAX;
        return Ok(());
    }
    let mut data = vec![0u8; n];
    p.move_from(from, 0, &mut data)?;
    for b in &mut data {
        *b ^= 0xff;
    }
    p.move_to(from, 0, &data)?;
    m.0[1] = n as u32;
    Ok(())
}

/// Arguments of `vkernel echo`.
#[derive(clap::Args, Debug)]
pub struct EchoArgs {
    #[command(flatten)]
    host: HostOpts,
    /// Service name the echo server registers under (GetPid logical id).
    #[arg(long, default_value = "echo")]
    name: String,
    /// Echo server processes (each registered; the last registration wins for GetPid).
    #[arg(long, default_value_t = 1)]
    servers: usize,
    /// Also join the service's well-known process group, so that
    /// `vkernel locate NAME` (a group query) finds this server.
    #[arg(long)]
    group: bool,
    /// Serve Prometheus metrics (`/metrics`) and JSON (`/stats.json`) over
    /// HTTP on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Exit after this long (default: run until interrupted).
    #[arg(long, value_parser = vkernel::net::parse_duration)]
    exit_after: Option<Duration>,
}

/// Runs `vkernel echo`.
pub fn run(a: EchoArgs) -> Result<(), String> {
    let k = Kernel::start(a.host.config()).map_err(|e| format!("cannot start host: {e}"))?;
    if let Some(m) = a.metrics {
        let bound = k
            .serve_metrics(m)
            .map_err(|e| format!("cannot serve metrics on {m}: {e}"))?;
        eprintln!("vkernel echo: metrics on http://{bound}/metrics");
    }
    let lid = logical_id(&a.name);
    let mut pids = Vec::new();
    for i in 0..a.servers.max(1) {
        let (pid, _h) = k
            .spawn(&format!("echo-{i}"), serve)
            .map_err(|e| format!("cannot create echo process: {e}"))?;
        pids.push(pid);
    }
    let reg = k
        .create_process()
        .map_err(|e| format!("cannot create process: {e}"))?;
    reg.set_pid(lid, pids[0], Scope::Any);
    if a.group {
        let g = service_group(&a.name);
        for &p in &pids {
            reg.join_group(g, p)
                .map_err(|e| format!("cannot join group {g}: {e}"))?;
        }
    }
    println!(
        "vkernel echo: host {} listening on {}; \"{}\" (logical id {:#x}) = pid {}",
        k.host_id(),
        k.local_addr(),
        a.name,
        lid,
        pids[0]
    );
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if a.exit_after.is_some_and(|d| start.elapsed() >= d) {
            let s = k.stats();
            let auth: u64 = s.auth_rejects.iter().sum();
            println!(
                "vkernel echo: exiting after {:.1} s; {} requests received, {} malformed datagrams dropped ({} of them failed authentication)",
                start.elapsed().as_secs_f64(),
                s.rx_of(vkernel_proto::wire::PacketType::RemoteSend),
                s.malformed() + auth,
                auth
            );
            return Ok(());
        }
    }
}
