//! Section 13's bulk rows between two programs: `vkernel echo` and
//! `vkernel ping --bulk` as separate processes, over loopback UDP (each
//! its own logical host) and attached to the section's machine host,
//! beside a TCP loopback stream of the same shape and memcpy. Each
//! exchange moves 64 MiB each way (MoveFrom, then MoveTo into the other
//! half of the client's segment); ping times the exchanges alone.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use serde::Serialize;

/// Bytes moved each way per exchange.
pub const BULK: usize = 64 << 20;

/// One way of moving 64 MiB each way between two programs.
#[derive(Clone, Debug, Serialize)]
pub struct BulkRow {
    /// What moves the data.
    pub what: String,
    /// Bytes moved (both ways) per second at the median exchange, MB/s.
    pub median_mbps: f64,
    /// The same at the 99th-percentile exchange, MB/s.
    pub p99_mbps: f64,
    /// Bulk chunks the client's host resent during the run.
    pub resent: u64,
}

/// An echo server program, killed when dropped (as the section's other
/// servers are: its exit summary is not wanted).
struct Echo(Child);

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `vkernel echo` with `args`; returns it, the pid and the host
/// address it printed ("... listening on ADDR; ... = pid PID").
fn start_echo(exe: &Path, args: &[&str]) -> Result<(Echo, String, String), String> {
    let mut c = Command::new(exe)
        .arg("echo")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start vkernel echo: {e}"))?;
    let out = c.stdout.take();
    let echo = Echo(c);
    let mut line = String::new();
    if let Some(o) = out {
        let _ = BufReader::new(o).read_line(&mut line);
    }
    let after = |tag: &str, end: char| {
        let rest = &line[line.find(tag)? + tag.len()..];
        Some(rest.split(end).next().unwrap_or(rest).trim().to_string())
    };
    match (after("= pid ", '\n'), after("listening on ", ';')) {
        (Some(pid), Some(addr)) => Ok((echo, pid, addr)),
        _ => Err(format!("vkernel echo did not start: {line:?}")),
    }
}

/// Runs `vkernel ping --bulk` with `args` for `n` timed exchanges.
fn ping(exe: &Path, args: &[&str], pid: &str, n: usize) -> Result<BulkRow, String> {
    let out = Command::new(exe)
        .arg("ping")
        .args(args)
        .args(["--pid", pid, "--json", "--warmup", "2", "--stop-on-error"])
        .args(["-n", &n.to_string(), "--bulk", &BULK.to_string()])
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("run vkernel ping: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "vkernel ping --bulk failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let j: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("vkernel ping --json printed no JSON: {e}"))?;
    let rate = |key: &str| {
        let us = j["summary"][key].as_f64().unwrap_or(0.0);
        if us > 0.0 {
            2.0 * BULK as f64 / us
        } else {
            0.0
        }
    };
    Ok(BulkRow {
        what: String::new(),
        median_mbps: rate("median_us"),
        p99_mbps: rate("p99_us"),
        resent: j["bulk_retransmits"].as_u64().unwrap_or(0),
    })
}

/// 64 MiB each way between two programs over loopback UDP, each its own
/// logical host.
pub(crate) fn remote(exe: &Path, n: usize) -> Result<BulkRow, String> {
    let (_echo, pid, addr) = start_echo(exe, &["--bind", "127.0.0.1:0"])?;
    ping(exe, &["--peer", &addr], &pid, n)
}

/// 64 MiB each way between two programs attached to the machine host at
/// `sock`.
pub(crate) fn attached(exe: &Path, sock: &Path, n: usize) -> Result<BulkRow, String> {
    let s = sock.to_string_lossy();
    let (_echo, pid, _) = start_echo(exe, &["--attach", &s])?;
    ping(exe, &["--attach", &s], &pid, n)
}

/// The same exchange over a TCP loopback connection between two threads:
/// 64 MiB written and echoed back whole. Median and p99 in MB/s.
pub(crate) fn tcp(n: usize) -> Result<BulkRow, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let at = l.local_addr().map_err(|e| e.to_string())?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; BULK];
        loop {
            match s.read_exact(&mut buf) {
                Ok(()) => s.write_all(&buf)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut c = TcpStream::connect(at).map_err(|e| e.to_string())?;
    let _ = c.set_nodelay(true);
    let out = vec![7u8; BULK];
    let mut back = vec![0u8; BULK];
    let mut v = Vec::with_capacity(n);
    for i in 0..n + 2 {
        let t = Instant::now();
        c.write_all(&out).map_err(|e| e.to_string())?;
        c.read_exact(&mut back).map_err(|e| e.to_string())?;
        if i >= 2 {
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(c);
    let _ = server.join();
    if back != out {
        return Err("TCP echo returned other bytes".into());
    }
    let (med, p99) = crate::attach::quantiles(v);
    Ok(BulkRow {
        what: String::new(),
        median_mbps: 2.0 * BULK as f64 / med.max(1e-9),
        // The slowest exchanges give the lowest rate.
        p99_mbps: 2.0 * BULK as f64 / p99.max(1e-9),
        resent: 0,
    })
}
