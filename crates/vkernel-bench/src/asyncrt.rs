//! Section 15: async Rust. Null exchanges awaited on tokio runtimes beside
//! the blocking API's, in the same run: two processes of one logical host,
//! and two hosts on loopback. The blocking rows use the defaults a user
//! gets (adaptive spin) and a zero spin (always block); the async rows a
//! one-thread runtime (client and server tasks on one thread) and a
//! two-thread runtime (tasks where tokio puts them), whose idle workers
//! park in the kernel. Threads unpinned.

use std::time::{Duration, Instant};

use serde::Serialize;
use vkernel::{AsyncProcess, Kernel, Message, Pid};

use crate::attach::{echo_server, exchanges, quantiles, stop, AttachRow, STOP};
use crate::report::{Goal, SectionReport};
use crate::section::{us, Ctx, Outcome, Section};

/// Section 15.
#[derive(Clone, Debug, Serialize)]
pub struct AsyncReport {
    /// One row per placement.
    pub rows: Vec<AttachRow>,
}

/// Blocking client and server threads; `spin` None = the host default.
fn blocking(
    ks: &Kernel,
    kc: &Kernel,
    spin: Option<Duration>,
    n: usize,
) -> Result<(f64, f64), String> {
    let s = ks.create_process().map_err(|e| e.to_string())?;
    let c = kc.create_process().map_err(|e| e.to_string())?;
    if let Some(d) = spin {
        s.set_spin(d);
        c.set_spin(d);
    }
    let spid = s.pid();
    let t = std::thread::spawn(move || echo_server(s));
    let v = exchanges(&c, spid, n);
    stop(&c, spid);
    let _ = t.join();
    Ok(quantiles(v?))
}

async fn async_server(mut s: AsyncProcess) {
    let mut m = Message::zero();
    while let Ok(i) = s.receive(&mut m).await {
        let stop = m.code() == STOP;
        let _ = s.reply(&m, i.from).await;
        if stop {
            break;
        }
    }
    if std::env::var_os("VKERNEL_BENCH_DEBUG").is_some() {
        eprintln!("  server waits: {:?}", s.wait_counts());
    }
}

async fn async_client(mut c: AsyncProcess, to: Pid, n: usize) -> Result<Vec<f64>, String> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let mut m = Message::with_code(1);
        let t = Instant::now();
        c.send(&mut m, to).await.map_err(|e| e.to_string())?;
        if i >= n / 10 {
            v.push(us(t.elapsed()));
        }
    }
    let _ = c.send(&mut Message::with_code(STOP), to).await;
    if std::env::var_os("VKERNEL_BENCH_DEBUG").is_some() {
        eprintln!("  client waits: {:?}", c.wait_counts());
    }
    Ok(v)
}

/// Awaited exchanges on a runtime with `threads` workers (1: current
/// thread).
fn awaited(ks: &Kernel, kc: &Kernel, threads: usize, n: usize) -> Result<(f64, f64), String> {
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .map_err(|e| e.to_string())?;
    let s = ks.create_async_process().map_err(|e| e.to_string())?;
    let c = kc.create_async_process().map_err(|e| e.to_string())?;
    let spid = s.pid();
    let v = rt.block_on(async move {
        let server = tokio::spawn(async_server(s));
        let client = tokio::spawn(async_client(c, spid, n));
        let v = client.await.map_err(|e| e.to_string());
        let _ = server.await;
        v
    })??;
    Ok(quantiles(v))
}

/// Awaited exchanges with the server's task on its own one-thread
/// runtime (another OS thread), as two programs would run them.
fn awaited_apart(ks: &Kernel, kc: &Kernel, n: usize) -> Result<(f64, f64), String> {
    let one = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    };
    let (rs, rc) = (one()?, one()?);
    let s = ks.create_async_process().map_err(|e| e.to_string())?;
    let c = kc.create_async_process().map_err(|e| e.to_string())?;
    let spid = s.pid();
    let t = std::thread::spawn(move || rs.block_on(async_server(s)));
    let v = rc.block_on(async_client(c, spid, n));
    let _ = t.join();
    Ok(quantiles(v?))
}

pub(crate) fn section(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Async.heading("(null exchanges; threads unpinned)");
    let n = if c.quick {
        2_000
    } else {
        c.n.clamp(5_000, 20_000)
    };
    let one = &c.ka;
    let (ka, kb) = (&c.ka, &c.kb);
    let mut rows = Vec::new();
    let mut push =
        |what: &str, wait: &str, r: (f64, f64)| AttachRow::push(&mut rows, (44, 21), what, wait, r);
    let lb = push(
        "one host: blocking API",
        "default (auto spin)",
        blocking(one, one, None, n)?,
    );
    let lz = push(
        "one host: blocking API",
        "block (zero spin)",
        blocking(one, one, Some(Duration::ZERO), n)?,
    );
    push(
        "one host: awaited, 1-thread runtime",
        "tokio current thread",
        awaited(one, one, 1, n)?,
    );
    let l2 = push(
        "one host: awaited, 2-thread runtime",
        "tokio, parking workers",
        awaited(one, one, 2, n)?,
    );
    let la = push(
        "one host: awaited, a 1-thread runtime each",
        "tokio current thread",
        awaited_apart(one, one, n)?,
    );
    let rb = push(
        "two hosts: blocking API",
        "default (auto spin)",
        blocking(kb, ka, None, n)?,
    );
    let rz = push(
        "two hosts: blocking API",
        "block (zero spin)",
        blocking(kb, ka, Some(Duration::ZERO), n)?,
    );
    push(
        "two hosts: awaited, 1-thread runtime",
        "tokio current thread",
        awaited(kb, ka, 1, n)?,
    );
    let r2 = push(
        "two hosts: awaited, 2-thread runtime",
        "tokio, parking workers",
        awaited(kb, ka, 2, n)?,
    );
    let ra = push(
        "two hosts: awaited, a 1-thread runtime each",
        "tokio current thread",
        awaited_apart(kb, ka, n)?,
    );
    // Goals compare like placements: two runtime threads, or a runtime
    // thread per side, against a blocking thread per side. A one-thread
    // runtime serves both sides on one thread (printed, not a goal).
    let goals = vec![
        Goal::at_most(
            "one host: awaited (2-thread runtime) / blocking (default)",
            l2 / lb,
            1.3,
            "×",
        ),
        Goal::at_most(
            "one host: awaited (a runtime each) / blocking (default)",
            la / lb,
            1.3,
            "×",
        ),
        Goal::at_most(
            "two hosts: awaited (2-thread runtime) / blocking (default)",
            r2 / rb,
            1.3,
            "×",
        ),
        Goal::at_most(
            "two hosts: awaited (a runtime each) / blocking (default)",
            ra / rb,
            1.3,
            "×",
        ),
        Goal::at_most(
            "one host: awaited (2-thread runtime) / blocking (zero spin)",
            l2 / lz,
            1.3,
            "×",
        ),
        Goal::at_most(
            "two hosts: awaited (2-thread runtime) / blocking (zero spin)",
            r2 / rz,
            1.3,
            "×",
        ),
    ];

    Ok(Outcome {
        report: SectionReport::Async(AsyncReport { rows }),
        goals,
        charts: Vec::new(),
    })
}
