//! `vkernel echo`: a logical host with an echo server registered by name.

use std::time::{Duration, Instant};

use vkernel::{IpcError, Kernel, Message, Process, Scope};

use crate::hostopts::{logical_id, HostOpts};

/// Request code of an echo exchange.
pub const ECHO: u32 = 0x0e_c400;

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
    /// Exit after this long (default: run until interrupted).
    #[arg(long, value_parser = vkernel::net::parse_duration)]
    exit_after: Option<Duration>,
}

/// Runs `vkernel echo`.
pub fn run(a: EchoArgs) -> Result<(), String> {
    let k = Kernel::start(a.host.config()).map_err(|e| format!("cannot start host: {e}"))?;
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
            println!(
                "vkernel echo: exiting after {:.1} s; {} requests received, {} malformed datagrams dropped",
                start.elapsed().as_secs_f64(),
                s.rx_of(vkernel_proto::wire::PacketType::RemoteSend),
                s.malformed()
            );
            return Ok(());
        }
    }
}
