//! `vkernel echo`: a logical host with an echo server registered by name.

use std::time::Duration;

use vkernel::Scope;
use vkernel_bench::echo::serve;

use crate::hostopts::{exit_summary, logical_id, service_group, wait_exit, HostOpts};

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
    let k = a.host.start()?;
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
    // On a machine host shared by several users, a name another user's
    // program holds is refused; SetPid does not say so, GetPid does.
    match reg.get_pid(lid, Scope::Local) {
        Ok(p) if p == pids[0] => {}
        Ok(p) => {
            return Err(format!(
                "cannot register \"{}\": another user's program holds that name on this host (pid {p}); choose another --name",
                a.name
            ))
        }
        Err(e) => return Err(format!("cannot check the registration of \"{}\": {e}", a.name)),
    }
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
    let start = wait_exit(a.exit_after);
    let s = k.stats();
    let auth: u64 = s.auth_rejects.iter().sum();
    exit_summary(format_args!(
        "vkernel echo: exiting after {:.1} s; {} requests received, {} malformed datagrams dropped ({} of them failed authentication)",
        start.elapsed().as_secs_f64(),
        s.rx_of(vkernel_proto::wire::PacketType::RemoteSend),
        s.malformed() + auth,
        auth
    ));
    Ok(())
}
