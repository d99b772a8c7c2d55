//! `vkernel echo`: a logical host with an echo server registered by name.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use vkernel::{IpcError, Process, Scope};
use vkernel_bench::echo::serve;

use crate::hostopts::{exit_summary, logical_id, service_group, HostOpts};

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
    // Caught from the start: a stop during start-up is clean too.
    let stop = crate::stop::Stop::install();
    let k = a.host.start()?;
    if let Some(m) = a.metrics {
        let bound = k
            .serve_metrics(m)
            .map_err(|e| format!("cannot serve metrics on {m}: {e}"))?;
        eprintln!("vkernel echo: metrics on http://{bound}/metrics");
    }
    let lid = logical_id(&a.name);
    let mut pids = Vec::new();
    let mut servers = Vec::new();
    for i in 0..a.servers.max(1) {
        let (pid, h) = k
            .spawn(&format!("echo-{i}"), serve)
            .map_err(|e| format!("cannot create echo process: {e}"))?;
        pids.push(pid);
        servers.push(h);
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
    let status = format!(
        "host {} listening on {}; \"{}\" (logical id {:#x}) = pid {}",
        k.host_id(),
        k.local_addr(),
        a.name,
        lid,
        pids[0]
    );
    println!("vkernel echo: {status}");
    let _ = std::io::stdout().flush();
    // Registered (checked above): a GetPid from now on finds it.
    crate::notify::ready(&status);
    let start = Instant::now();
    // A server ends only when its host does: attached, that is the
    // machine host going away, which ends this program too.
    let gone = stop.wait(start, a.exit_after, || {
        if servers.iter().any(|h| h.is_finished()) {
            return host_gone(&reg, a.host.attach_path().as_deref());
        }
        None
    });
    if let Some(why) = gone {
        return Err(format!("echo: {why}"));
    }
    let s = k.stats();
    let auth: u64 = s.auth_rejects.iter().sum();
    exit_summary(format_args!(
        "vkernel echo: exiting after {:.1} s; {} requests answered, {} malformed datagrams dropped ({} of them failed authentication)",
        start.elapsed().as_secs_f64(),
        vkernel_bench::echo::served(),
        s.malformed() + auth,
        auth
    ));
    Ok(())
}

/// Why an attached program must end, if its machine host (at `path`) has
/// gone: every call of `p` fails at once then, and none ever succeeds
/// again (its processes are no more).
pub(crate) fn host_gone(p: &Process, path: Option<&Path>) -> Option<String> {
    if !p.is_attached() {
        return None;
    }
    match p.process_exists(p.pid()) {
        Err(IpcError::HostLost) => Some(format!(
            "the machine host at {} has gone (connection closed); attach again once it is back",
            path.map_or_else(|| "its socket".into(), |p| p.display().to_string())
        )),
        _ => None,
    }
}
