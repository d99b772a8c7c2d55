//! `vkernel ping`: finds a named echo server and times exchanges with it.

use std::time::Instant;

use vkernel::{Pid, Scope};

use crate::hostopts::{auth_hint, logical_id, HostOpts};
use vkernel_bench::echo::{time_exchanges, Timing, MAX_BULK};

/// Arguments of `vkernel ping`.
#[derive(clap::Args, Debug)]
pub struct PingArgs {
    #[command(flatten)]
    host: HostOpts,
    /// Service name to look up (GetPid, remote scope, via --peer).
    #[arg(long, default_value = "echo")]
    name: String,
    /// Or: the server's pid in hex, skipping the lookup.
    #[arg(long, value_parser = parse_pid)]
    pid: Option<Pid>,
    /// Number of timed exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    count: usize,
    /// Untimed exchanges first.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Bytes per request: 32 is a bare message; more adds a read/write
    /// segment of (size − 32) bytes that the echo server returns with its reply.
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// Bulk mode: each exchange moves this many bytes each way. The
    /// client lends a segment of twice that: the server MoveFroms the
    /// first half into a buffer it keeps and MoveTos it into the second
    /// half. The client fills and checks the halves outside the timed
    /// interval, so the times are the transport's.
    #[arg(long, value_name = "BYTES")]
    bulk: Option<usize>,
    /// With --bulk: the older bulk echo instead, whose server inverts
    /// every byte between its MoveFrom and its MoveTo (timed too).
    #[arg(long, requires = "bulk")]
    invert: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Stop at the first failed exchange (exit status 1, with the error and
    /// how long the failing exchange took).
    #[arg(long)]
    stop_on_error: bool,
    /// Each exchange fails if not replied to within this long (a server
    /// that never answers costs an error, not a hang); 0 = no deadline.
    #[arg(long, default_value = "30s", value_parser = vkernel::net::parse_duration)]
    deadline: std::time::Duration,
}

fn parse_pid(s: &str) -> Result<Pid, String> {
    u32::from_str_radix(s.trim_start_matches("0x"), 16)
        .map(Pid)
        .map_err(|_| format!("`{s}` is not a hex pid"))
}

/// Runs `vkernel ping`.
pub fn run(a: PingArgs) -> Result<(), String> {
    if a.host.peers.is_empty()
        && a.pid.is_none()
        && a.host.multicast_port.is_none()
        && a.host.attach.is_none()
    {
        return Err(
            "give --peer ADDR (where an echo host listens), --multicast-port PORT, --pid, or --attach (a server on the machine host)".into(),
        );
    }
    if a.size < 32 || a.size > 32 + vkernel_proto::MAX_APPEND {
        return Err(format!(
            "--size must be in 32..={}",
            32 + vkernel_proto::MAX_APPEND
        ));
    }
    if a.bulk.is_some_and(|b| b == 0 || b > MAX_BULK) {
        return Err(format!("--bulk must be in 1..={MAX_BULK}"));
    }
    let k = a.host.start()?;
    let p = k.create_process().map_err(|e| e.to_string())?;
    p.set_send_deadline((!a.deadline.is_zero()).then_some(a.deadline));
    let t = Instant::now();
    let server = match a.pid {
        Some(pid) => pid,
        None => {
            // Attached, the server is usually a process of the same host.
            let scope = if k.is_attached() {
                Scope::Any
            } else {
                Scope::Remote
            };
            let pid = p
                .get_pid(logical_id(&a.name), scope)
                .map_err(|e| format!("GetPid(\"{}\"): {e}{}", a.name, auth_hint(&k)))?;
            if pid.is_none() {
                return Err(a.host.no_answer(&k, "a process", &a.name));
            }
            pid
        }
    };
    if !a.json {
        println!(
            "vkernel ping: host {} on {}; \"{}\" = pid {} (found in {:.2} ms)",
            k.host_id(),
            k.local_addr(),
            a.name,
            server,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    let stop = crate::stop::Stop::install();
    let t = Timing {
        count: a.count,
        warmup: a.warmup,
        size: a.size,
        bulk: a.bulk,
        invert: a.invert,
        stop_on_error: a.stop_on_error,
        // Ctrl-C or SIGTERM ends the run with what it has, as ping(8) does.
        stop: Some(stop.flag()),
    };
    let (s, failures, last_err, elapsed) = time_exchanges(&p, server, &t).map_err(|e| {
        match crate::echo::host_gone(&p, a.host.attach_path().as_deref()) {
            Some(why) => format!("{why} ({e})"),
            None => format!("{e}{}", auth_hint(&k)),
        }
    })?;
    if let Some(sig) = stop.received() {
        eprintln!(
            "vkernel ping: {sig} received: stopped after {} of {} exchanges",
            s.n + failures,
            a.count
        );
    }
    let st = k.stats();
    let waits = p.wait_counts();
    if a.json {
        let j = serde_json::json!({
            "server": server.to_string(), "size": a.size, "summary": s, "failures": failures,
            "retransmits": st.retransmits, "bulk_retransmits": st.bulk_retransmits, "spin_us": a.host.spin.max.as_micros() as u64, "adaptive_spin": a.host.spin.adaptive,
            "waits_unblocked": waits.unblocked, "waits_blocked": waits.blocked,
            "waits_blocked_crowded": waits.blocked_crowded,
            "bulk_duplicates": st.bulk_duplicates,
            "mb_per_s": t.rate_mb_s(&s),
        });
        println!("{j}");
    } else {
        println!("{}", t.describe(&s, failures));
        println!(
            "  {:.0} exchanges/s; retransmissions {} ({} requests, {} bulk chunks); wait: {} ({} waits blocked, {} did not)",
            (a.warmup + a.count) as f64 / elapsed.as_secs_f64().max(1e-9),
            st.retransmits + st.bulk_retransmits,
            st.retransmits,
            st.bulk_retransmits,
            a.host.spin,
            waits.blocked,
            waits.unblocked
        );
    }
    if let Some(e) = last_err {
        eprintln!("last error: {e}{}", auth_hint(&k));
    }
    if failures == a.count && a.count > 0 {
        return Err("every exchange failed".into());
    }
    Ok(())
}
