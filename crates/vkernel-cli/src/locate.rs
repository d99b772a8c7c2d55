//! `vkernel locate`: server location by process group (thesis §6). Servers
//! of a service join its well-known group (`vkernel echo --group`); a query
//! to the group finds one (1-reply) or lists several to choose from
//! (multi-reply).

use std::time::{Duration, Instant};

use vkernel::{GroupMode, Message, Pid};

use crate::hostopts::{service_group, HostOpts};
use vkernel_bench::echo::ECHO;

/// Arguments of `vkernel locate`.
#[derive(clap::Args, Debug)]
pub struct LocateArgs {
    #[command(flatten)]
    host: HostOpts,
    /// Service name (its servers joined the group with `vkernel echo --group`).
    #[arg(default_value = "echo")]
    name: String,
    /// `one`: the first server to answer; `many`: every server that answers
    /// within --wait.
    #[arg(long, default_value = "many", value_parser = ["one", "many"])]
    mode: String,
    /// How long to gather further answers in `many` mode.
    #[arg(long, default_value = "200ms", value_parser = vkernel::net::parse_duration)]
    wait: Duration,
    /// Stop gathering after this many answers.
    #[arg(long)]
    max: Option<usize>,
}

/// Runs `vkernel locate`.
pub fn run(a: LocateArgs) -> Result<(), String> {
    if a.host.peers.is_empty() && a.host.multicast_port.is_none() && a.host.attach.is_none() {
        return Err(
            "give --peer HOST:PORT (hosts to ask), --multicast-port PORT, or --attach (the machine host's peers)"
                .into(),
        );
    }
    let k = a.host.start()?;
    let p = k.create_process().map_err(|e| e.to_string())?;
    let g = service_group(&a.name);
    let mut m = Message::with_code(ECHO);
    m.set_group_mode(if a.mode == "one" {
        GroupMode::One
    } else {
        GroupMode::Many
    });
    let t = Instant::now();
    let r = p
        .send(&mut m, g)
        .map_err(|e| format!("no server of \"{}\" answered (group {g}): {e}", a.name))?;
    let mut found: Vec<(Pid, Duration)> = vec![(r.from, t.elapsed())];
    if a.mode == "many" {
        let max = a.max.unwrap_or(usize::MAX);
        while found.len() < max && t.elapsed() < a.wait {
            match p.get_reply(&mut m) {
                Some(from) if !found.iter().any(|f| f.0 == from) => {
                    found.push((from, t.elapsed()));
                }
                Some(_) => {}
                None => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }
    println!(
        "\"{}\" (group {g}): {} server(s) answered",
        a.name,
        found.len()
    );
    for (pid, dt) in &found {
        println!(
            "  pid {pid} on host {} after {:.3} ms",
            pid.host(),
            dt.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// Arguments of `vkernel hosts`.
#[derive(clap::Args, Debug)]
pub struct HostsArgs {
    #[command(flatten)]
    host: HostOpts,
    /// Stop after this many answers.
    #[arg(long, default_value_t = 64)]
    max: usize,
    /// Stop gathering after this long.
    #[arg(long, default_value = "300ms", value_parser = vkernel::net::parse_duration)]
    wait: Duration,
    /// A host whose load average is below this counts as idle and ends the
    /// query at once (the thesis's "stop at the first idle host"); the
    /// default gathers every answer.
    #[arg(long)]
    idle_below: Option<f64>,
}

/// Runs `vkernel hosts`: host selection by a multi-reply query to every
/// host's kernel server.
pub fn run_hosts(a: HostsArgs) -> Result<(), String> {
    if a.host.peers.is_empty() && a.host.multicast_port.is_none() && a.host.attach.is_none() {
        return Err(
            "give --peer HOST:PORT (hosts to ask), --multicast-port PORT, or --attach (the machine host's peers)"
                .into(),
        );
    }
    let k = a.host.start()?;
    let p = k.create_process().map_err(|e| e.to_string())?;
    let hs = p
        .select_hosts(a.max, a.wait, a.idle_below.unwrap_or(f64::NEG_INFINITY))
        .map_err(|e| format!("host query: {e}"))?;
    println!(
        "{} logical host(s) answered (this one is {}); least loaded first:",
        hs.len(),
        k.host_id()
    );
    println!(
        "  {:>6} {:>10} {:>6} {:>5} {:>10}",
        "host", "processes", "load", "cpus", "answer ms"
    );
    for h in &hs {
        println!(
            "  {:>6} {:>10} {:>6.2} {:>5} {:>10.3}",
            h.kernel_server.host(),
            h.processes,
            h.load,
            h.cpus,
            h.after.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
