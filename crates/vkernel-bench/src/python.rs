//! Section 14: vkernel from Python. Two Python programs attached to one
//! machine host exchange null messages; beside them, in the same run, two
//! Rust programs attached to that host and two Python programs using
//! pyzmq REQ/REP over TCP loopback. All busy-poll (Python's vkernel calls
//! with a fixed spin; zmq's own waiting). Needs a Python that imports
//! `vkernel` (`pip install ./python`; `$VKERNEL_PYTHON` names it, else
//! `python3`), and `zmq` for the pyzmq row; a row that cannot run says so.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde::Serialize;
use vkernel::{Kernel, KernelConfig};

use crate::report::{Goal, SectionReport};
use crate::section::{Ctx, Outcome, Section};

/// Section 14.
#[derive(Clone, Debug, Serialize)]
pub struct PythonReport {
    /// The interpreter used, or why the section was skipped.
    pub python: String,
    /// One row per pair.
    pub rows: Vec<crate::attach::AttachRow>,
}

/// The Python programs: `vk server PATH`, `vk client PATH N`,
/// `zmq server PORT N`, `zmq client PORT N`. Clients print "median p99"
/// in µs.
const SCRIPT: &str = r#"
import os, sys, time
# Unpinned, as the Rust pairs: not the CPU the bench's thread may be on.
os.sched_setaffinity(0, range(os.cpu_count()))
mode, role = sys.argv[1], sys.argv[2]
def report(t):
    t = sorted(t[len(t) // 11:])
    print(f"{t[len(t) // 2] * 1e6:.3f} {t[int(len(t) * 0.99)] * 1e6:.3f}", flush=True)
if mode == "vk":
    import vkernel
    with vkernel.Kernel.attach(sys.argv[3]) as k:
        p = k.create_process()
        p.set_spin(500)
        if role == "server":
            p.register("vkbench-py-echo")
            print("ready", flush=True)
            while True:
                m, w = p.receive()
                p.reply(m, w.sender)
                if m.code == 0:
                    break
        else:
            n = int(sys.argv[4])
            to = p.lookup("vkbench-py-echo")
            m, t = vkernel.Message(1, 2), []
            for _ in range(n + n // 10):
                t0 = time.perf_counter(); p.send(m, to); t.append(time.perf_counter() - t0)
            p.send(vkernel.Message(0), to)
            report(t)
else:
    import zmq
    ctx = zmq.Context()
    n = int(sys.argv[4])
    if role == "server":
        s = ctx.socket(zmq.REP); s.bind(f"tcp://127.0.0.1:{sys.argv[3]}")
        print("ready", flush=True)
        for _ in range(n + n // 10):
            s.send(s.recv())
    else:
        s = ctx.socket(zmq.REQ); s.connect(f"tcp://127.0.0.1:{sys.argv[3]}")
        t, msg = [], b"x" * 32
        for _ in range(n + n // 10):
            t0 = time.perf_counter(); s.send(msg); s.recv(); t.append(time.perf_counter() - t0)
        report(t)
"#;

fn python() -> String {
    std::env::var("VKERNEL_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether `py` imports `module`.
fn imports(py: &str, module: &str) -> bool {
    Command::new(py)
        .args(["-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs a server and a client of SCRIPT; returns the client's (median,
/// p99).
fn python_pair(py: &str, mode: &str, arg: &str, n: usize) -> Result<(f64, f64), String> {
    let mut server = Command::new(py)
        .args(["-c", SCRIPT, mode, "server", arg, &n.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{py}: {e}"))?;
    let mut line = String::new();
    if let Some(out) = server.stdout.as_mut() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim() != "ready" {
        let _ = server.kill();
        let _ = server.wait();
        return Err(format!("the {mode} server did not start"));
    }
    let out = Command::new(py)
        .args(["-c", SCRIPT, mode, "client", arg, &n.to_string()])
        .output()
        .map_err(|e| format!("{py}: {e}"));
    let _ = server.kill();
    let _ = server.wait();
    let out = out?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut w = text.split_whitespace().map(str::parse::<f64>);
    match (w.next(), w.next()) {
        (Some(Ok(m)), Some(Ok(p))) => Ok((m, p)),
        _ => Err(format!(
            "the {mode} client failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Section 14.
pub(crate) fn section(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Python.heading("(separate programs, busy-polling, unpinned)");
    let py = python();
    if !imports(&py, "vkernel") {
        let why = format!(
            "skipped: {py} cannot import vkernel (pip install ./python, in a venv; $VKERNEL_PYTHON names the interpreter)"
        );
        crate::outln!("  {why}");
        return Ok(SectionReport::Python(PythonReport {
            python: why,
            rows: Vec::new(),
        })
        .into());
    }
    let n = if c.quick {
        2_000
    } else {
        c.n.clamp(5_000, 20_000)
    };
    let dir = std::env::temp_dir().join(format!("vkernel-bench-py-{}", std::process::id()));
    let path = dir.join("host.sock");
    let host = Kernel::start(KernelConfig::default()).map_err(|e| e.to_string())?;
    let srv = host.serve_attach(&path, 0o600).map_err(|e| e.to_string())?;
    let a = Kernel::attach(&path).map_err(|e| e.to_string())?;
    let b = Kernel::attach(&path).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let mut push = |what: &str, r: (f64, f64)| {
        crate::attach::AttachRow::push(&mut rows, (36, 5), what, "spin", r);
    };
    let p = path.to_string_lossy().to_string();
    let before = srv.peer_exchanges();
    push(
        "two Python programs attached",
        python_pair(&py, "vk", &p, n)?,
    );
    crate::outln!(
        "    ({} of {} exchanges through peer pages)",
        srv.peer_exchanges() - before,
        n + n / 10 + 1
    );
    push(
        "two Rust programs attached",
        crate::attach::pair(&a, &b, true, n)?,
    );
    let zmq = if imports(&py, "zmq") {
        // A port the kernel picks, freed for the Python server to bind.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let r = python_pair(&py, "zmq", &port.to_string(), n)?;
        push("two Python programs, pyzmq REQ/REP", r);
        Some(r.0)
    } else {
        crate::outln!("  pyzmq REQ/REP: skipped ({py} cannot import zmq: pip install pyzmq)");
        None
    };
    drop((a, b, srv));
    let _ = std::fs::remove_dir_all(&dir);
    let (pyv, rs) = (rows[0].median_us, rows[1].median_us);
    let mut goals = vec![Goal::at_most(
        "Python null exchange - Rust, spin",
        pyv - rs,
        2.0,
        " µs",
    )];
    if let Some(z) = zmq {
        goals.push(Goal::at_least(
            "pyzmq REQ/REP / Python vkernel",
            z / pyv,
            5.0,
            "×",
        ));
    }
    Ok(Outcome {
        report: SectionReport::Python(PythonReport { python: py, rows }),
        goals,
        charts: Vec::new(),
    })
}
