//! vkernel's side of the measurements: null operations, exchanges and bulk
//! transfers, between threads of this process with a stated placement and
//! waiting strategy, so that the raw baselines can run the same way.

use std::thread;
use std::time::{Duration, Instant};

use crate::Mode;
use vkernel::{FaultConfig, IpcError, Kernel, KernelConfig, Message, Pid, Process, Segment};

/// A host's settings for placement `pl` (a fixed waiting strategy).
pub(crate) fn kcfg(pl: Mode) -> KernelConfig {
    KernelConfig {
        spin: pl.spin_budget(),
        // A placement is a fixed waiting strategy, not a learned one.
        adaptive_spin: false,
        ..KernelConfig::default()
    }
}

/// Two logical hosts on loopback that know each other.
pub fn host_pair(pl: Mode, faults: FaultConfig) -> Result<(Kernel, Kernel), String> {
    host_pair_with(pl, faults, |_, _| {})
}

/// Two logical hosts like [`host_pair`], but waiting as a host does with
/// no setting (`KernelConfig::default()`: what the README's commands
/// get), threads unpinned.
pub fn host_pair_default(faults: FaultConfig) -> Result<(Kernel, Kernel), String> {
    let d = KernelConfig::default();
    host_pair_with(Mode::BLOCK, faults, |_, c| {
        c.spin = d.spin;
        c.adaptive_spin = d.adaptive_spin;
    })
}

/// Like [`host_pair`]; `adjust(i, cfg)` changes host i's (0 or 1) settings.
pub fn host_pair_with(
    pl: Mode,
    faults: FaultConfig,
    adjust: impl Fn(usize, &mut KernelConfig),
) -> Result<(Kernel, Kernel), String> {
    let mut ca = KernelConfig {
        faults: faults.clone(),
        ..kcfg(pl)
    };
    adjust(0, &mut ca);
    let a = Kernel::start(ca).map_err(|e| e.to_string())?;
    let mut cb = KernelConfig {
        peers: vec![a.local_addr()],
        faults: FaultConfig {
            seed: faults.seed.wrapping_add(1),
            ..faults
        },
        ..kcfg(pl)
    };
    adjust(1, &mut cb);
    let b = Kernel::start(cb).map_err(|e| e.to_string())?;
    a.add_peer(b.local_addr());
    Ok((a, b))
}

const STOP: u32 = 0xdead;
const MOVE_TO: u32 = 0x40;
const MOVE_FROM: u32 = 0x41;
const PAGE_READ: u32 = 0x42;
const PAGE_WRITE: u32 = 0x43;
/// Thoth-style write: the server MoveFroms w1 bytes of the segment.
const PULL_N: u32 = 0x44;
/// The server MoveTos w1 bytes into the segment.
const PUSH_N: u32 = 0x45;
/// Program load: MoveTo the whole segment in transfer units of w1 bytes.
const LOAD: u32 = 0x46;
/// Reply with the server thread's CPU time (ns in w1..w2).
const CPU: u32 = 0x47;
/// Page read, then the server waits w2 µs ("disk latency") before its
/// next Receive.
const SEQ_READ: u32 = 0x48;
/// Echo: the request's appended bytes come back with the reply.
const ECHO_SEG: u32 = 0x49;
/// Set the server's spin budget to w1 µs (0: always block).
const SPIN: u32 = 0x4a;
/// Pin the server thread to CPU w1 − 1 (w1 = 0: back to where it started).
const PIN: u32 = 0x4b;
/// Set the server's adaptive spin cap to w1 µs (`--spin auto`).
const SPIN_AUTO: u32 = 0x4c;
/// As LOAD, from a shared buffer (`Process::move_to_shared`).
const LOAD_SHARED: u32 = 0x4d;

/// Calls `each` on `0..total` in consecutive ranges of `unit` bytes (at
/// least 1; the last may be shorter) until one fails.
fn in_units<E>(
    total: usize,
    unit: usize,
    mut each: impl FnMut(std::ops::Range<usize>) -> Result<(), E>,
) -> Result<(), E> {
    let unit = unit.max(1);
    (0..total)
        .step_by(unit)
        .try_for_each(|off| each(off..(off + unit).min(total)))
}

/// Server for the exchange benchmarks. MoveTo/MoveFrom requests time the
/// move itself and return the nanoseconds in words 2..3.
/// `pl: None`: unpinned, waiting as its host's processes do.
fn server(p: Process, pl: Option<Mode>) {
    if let Some(pl) = pl {
        pl.pin(1);
        // The mode, not the host's default, decides how this server waits.
        p.set_spin(pl.spin_budget());
    }
    // Replies to other hosts wait while more requests are queued, and
    // leave together (every request here is served at once).
    p.set_reply_batching(true);
    let home = vkernel_peers::placement::current_affinity();
    let mut m = Message::zero();
    let mut page = vec![0u8; vkernel_proto::MAX_APPEND];
    let mut bulk: Vec<u8> = Vec::new();
    // LOAD_SHARED's image: immutable, so MoveTos need not copy it.
    let mut image: std::sync::Arc<[u8]> = std::sync::Arc::from(Vec::new());
    loop {
        let i = match p.receive_with_segment(&mut m, &mut page) {
            Ok(i) => i,
            Err(_) => return,
        };
        let r = match m.code() {
            STOP => {
                let _ = p.reply(&m, i.from);
                return;
            }
            MOVE_TO | MOVE_FROM => {
                let n = m.seg_len() as usize;
                if m.code() == MOVE_FROM {
                    // Start from zeros so a later MoveTo proves what arrived.
                    bulk.clear();
                    bulk.resize(n, 0);
                } else if bulk.len() != n {
                    bulk = (0..n)
                        .map(|k| (k as u32).wrapping_mul(2654435761) as u8)
                        .collect();
                }
                let t = Instant::now();
                let r = if m.code() == MOVE_TO {
                    p.move_to(i.from, 0, &bulk)
                } else {
                    p.move_from(i.from, 0, &mut bulk)
                };
                let ns = t.elapsed().as_nanos() as u64;
                m.0[1] = u32::from(r.is_err());
                m.0[2] = (ns >> 32) as u32;
                m.0[3] = ns as u32;
                p.reply(&m, i.from)
            }
            PAGE_READ | SEQ_READ => {
                let n = (m.0[1] as usize).min(page.len());
                let r = p.reply_with_segment(&m, i.from, 0, &page[..n]);
                if m.code() == SEQ_READ {
                    // Read-ahead of the next page: the disk is busy meanwhile.
                    std::thread::sleep(Duration::from_micros(m.0[2] as u64));
                }
                r
            }
            PULL_N | PUSH_N | LOAD => {
                let n = (m.0[1] as usize).min(m.seg_len() as usize);
                if bulk.len() < n {
                    bulk.resize(n, 0x5a);
                }
                let r = match m.code() {
                    PULL_N => p.move_from(i.from, 0, &mut bulk[..n]).map(|_| ()),
                    PUSH_N => p.move_to(i.from, 0, &bulk[..n]).map(|_| ()),
                    _ => {
                        let total = m.seg_len() as usize;
                        if bulk.len() < total {
                            bulk.resize(total, 0x5a);
                        }
                        in_units(total, n, |at| {
                            p.move_to(i.from, at.start as u32, &bulk[at]).map(|_| ())
                        })
                    }
                };
                m.0[1] = u32::from(r.is_err());
                p.reply(&m, i.from)
            }
            LOAD_SHARED => {
                let total = m.seg_len() as usize;
                if image.len() != total {
                    image = std::sync::Arc::from(vec![0x5au8; total]);
                }
                let r = in_units(total, m.0[1] as usize, |at| {
                    p.move_to_shared(i.from, at.start as u32, &image, at)
                        .map(|_| ())
                });
                m.0[1] = u32::from(r.is_err());
                p.reply(&m, i.from)
            }
            ECHO_SEG => {
                let n = i.seg_bytes.min(page.len());
                p.reply_with_segment(&m, i.from, 0, &page[..n])
            }
            SPIN => {
                p.set_spin(Duration::from_micros(u64::from(m.0[1])));
                p.reply(&m, i.from)
            }
            SPIN_AUTO => {
                p.set_spin_auto(Duration::from_micros(u64::from(m.0[1])));
                p.reply(&m, i.from)
            }
            PIN => {
                // Best effort: an unpinnable server only widens the spread.
                let _ = match (m.0[1], &home) {
                    (0, Ok(cpus)) => vkernel_peers::placement::set_current_affinity(cpus),
                    (0, Err(_)) => Ok(()),
                    (c, _) => vkernel_peers::placement::pin_current_thread(c as usize - 1),
                };
                p.reply(&m, i.from)
            }
            CPU => {
                let ns = vkernel::host::thread_cpu_time().as_nanos() as u64;
                m.0[1] = (ns >> 32) as u32;
                m.0[2] = ns as u32;
                p.reply(&m, i.from)
            }
            _ => p.reply(&m, i.from),
        };
        let _ = r;
    }
}

/// A server process on `k` (spawned thread) and its pid.
pub fn start_server(k: &Kernel, pl: Mode) -> Result<(Pid, thread::JoinHandle<()>), String> {
    k.spawn("bench-server", move |p| server(p, Some(pl)))
        .map_err(|e| e.to_string())
}

/// Starts the benchmark server on `k`, unpinned and waiting as `k`'s
/// processes do by default (see [`host_pair_default`]).
pub fn start_default_server(k: &Kernel) -> Result<(Pid, thread::JoinHandle<()>), String> {
    k.spawn("bench-server", move |p| server(p, None))
        .map_err(|e| e.to_string())
}

/// Two hosts ([`host_pair`]) and a benchmark server on the first, all
/// waiting as `mode` says, or with `None` as with no setting
/// ([`host_pair_default`], [`start_default_server`]): the hosts, the
/// server's pid and its thread.
pub fn server_pair(
    mode: Option<Mode>,
) -> Result<(Kernel, Kernel, Pid, thread::JoinHandle<()>), String> {
    let (ka, kb) = match mode {
        Some(m) => host_pair(m, FaultConfig::default())?,
        None => host_pair_default(FaultConfig::default())?,
    };
    let (server, sh) = match mode {
        Some(m) => start_server(&ka, m)?,
        None => start_default_server(&ka)?,
    };
    Ok((ka, kb, server, sh))
}

/// Stops a server started with [`start_server`].
pub fn stop_server(c: &Process, s: Pid, h: thread::JoinHandle<()>) {
    let mut m = Message::with_code(STOP);
    // A server the STOP did not reach ends with its host instead; waiting
    // for it here would never end.
    if c.send(&mut m, s).is_ok() {
        let _ = h.join();
    }
}

/// What an exchange benchmark sends.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// Send-Receive-Reply with a bare 32-byte message.
    Null,
    /// Page read: Send, Reply-with-segment of n bytes.
    PageRead(usize),
    /// Page write: Send with n bytes appended, Receive-with-segment, Reply.
    PageWrite(usize),
    /// Thoth-style write: Send (segment not appended: write-only grant
    /// plus read), Receive, MoveFrom n bytes, Reply.
    ThothWrite(usize),
    /// MoveFrom n bytes of the client's segment by the server.
    MoveFrom(usize),
    /// MoveTo n bytes into the client's segment by the server.
    MoveTo(usize),
    /// Program load of `total` bytes by MoveTo in units of `unit` bytes.
    Load {
        /// Image bytes.
        total: usize,
        /// Bytes per MoveTo.
        unit: usize,
    },
    /// [`Op::Load`] from a buffer the server shares and cannot change
    /// (`Process::move_to_shared`: write-behind without a copy).
    LoadShared {
        /// Image bytes.
        total: usize,
        /// Bytes per MoveTo.
        unit: usize,
    },
    /// Sequential page read of n bytes with a server delay of `delay_us`.
    SeqRead {
        /// Page bytes.
        n: usize,
        /// Server delay after each reply.
        delay_us: u32,
    },
    /// A message of 32 + n bytes each way: n bytes appended to the request
    /// and returned with the reply.
    Echo(usize),
}

/// Server thread CPU time, asked by message.
pub fn server_cpu(c: &Process, server: Pid) -> Result<Duration, String> {
    let mut m = Message::with_code(CPU);
    c.send(&mut m, server).map_err(|e| e.to_string())?;
    Ok(Duration::from_nanos(
        ((m.0[1] as u64) << 32) | m.0[2] as u64,
    ))
}

/// Batches of the CPU pass; each batch reads both CPU clocks once, and
/// the figure is the median batch (one slow wake-up spoils a batch, not
/// the figure).
pub const CPU_BATCHES: usize = 5;

/// Per-operation timings plus the CPU both sides spent on them.
pub struct Timed {
    /// Elapsed time of each operation.
    pub samples: Vec<Duration>,
    /// Client thread CPU per operation, measured with blocking waits
    /// (median of [`CPU_BATCHES`] batches).
    pub client_cpu: Duration,
    /// Server thread CPU per operation, likewise.
    pub server_cpu: Duration,
}

fn set_server_spin(c: &Process, server: Pid, d: Duration) -> Result<(), String> {
    server_call(
        c,
        server,
        SPIN,
        u32::try_from(d.as_micros()).unwrap_or(u32::MAX),
    )
}

/// Makes the server block at once when idle, so that it takes no CPU
/// from a baseline measured while it waits (a spinning server keeps
/// spinning for its budget after the last request).
pub fn pause_server(c: &Process, server: Pid) -> Result<(), String> {
    set_server_spin(c, server, Duration::ZERO)
}

/// Gives the server back the waiting of `pl` (None: its host's default,
/// as [`start_default_server`] left it).
pub fn resume_server(c: &Process, server: Pid, pl: Option<Mode>) -> Result<(), String> {
    match pl {
        Some(pl) => set_server_spin(c, server, pl.spin_budget()),
        None => {
            let d = KernelConfig::default();
            if d.adaptive_spin {
                let us = u32::try_from(d.spin.as_micros()).unwrap_or(u32::MAX);
                server_call(c, server, SPIN_AUTO, us)
            } else {
                set_server_spin(c, server, d.spin)
            }
        }
    }
}

/// Pins the server to `cpu`, or (None) returns it to where it started.
fn pin_server(c: &Process, server: Pid, cpu: Option<usize>) -> Result<(), String> {
    server_call(c, server, PIN, cpu.map_or(0, |c| c as u32 + 1))
}

fn server_call(c: &Process, server: Pid, code: u32, arg: u32) -> Result<(), String> {
    let mut m = Message::with_code(code);
    m.0[1] = arg;
    c.send(&mut m, server).map_err(|e| e.to_string())?;
    Ok(())
}

/// Like [`exchanges`], also measuring both sides' CPU per operation (the
/// modern form of the papers' busywork counter).
///
/// Elapsed times use the mode's waiting. CPU is measured in a separate pass
/// in which both sides block while they wait: under busy-polling every
/// thread burns its whole wall time, which would say nothing about the work
/// an operation costs. Both threads run on CPU 0 for the pass: a wake-up
/// across CPUs costs an interrupt (in a VM, an exit) several times the
/// work of a small exchange, and where an unpinned scheduler puts the two
/// threads would decide the figure. The pass runs [`CPU_BATCHES`] batches
/// of at least 200 operations after a warm-up and keeps the median batch.
pub fn timed(
    client_kernel: &Kernel,
    server_pid: Pid,
    op: Op,
    iters: usize,
    warmup: usize,
    pl: Mode,
) -> Result<Timed, String> {
    let c = client_kernel.create_process().map_err(|e| e.to_string())?;
    let (r, c) = pl.run_as(0, move || {
        let r = run_ops(&c, server_pid, op, iters, warmup);
        (r, c)
    });
    let (samples, _) = r?;
    // CPU pass: blocking waits on both sides, then the mode's spin back.
    // Bulk operations (few iterations) keep their own count per batch.
    let batch = if iters < 200 {
        iters.max(1)
    } else {
        (iters / 4).max(200)
    };
    c.set_spin(Duration::ZERO);
    set_server_spin(&c, server_pid, Duration::ZERO)?;
    pin_server(&c, server_pid, Some(0))?;
    let one_cpu = Mode {
        cpus: vkernel_peers::Placement::pinned(0, 0),
        ..pl.blocking()
    };
    let (r, c) = one_cpu.run_as(0, move || {
        c.set_spin(Duration::ZERO);
        let r = (|| -> Result<Vec<(Duration, Duration)>, String> {
            run_ops(&c, server_pid, op, 0, warmup.max(batch))?;
            let mut per = Vec::with_capacity(CPU_BATCHES);
            for _ in 0..CPU_BATCHES {
                let s0 = server_cpu(&c, server_pid)?;
                let (_, client) = run_ops(&c, server_pid, op, batch, 0)?;
                let s1 = server_cpu(&c, server_pid)?;
                let n = batch as u32;
                per.push((client / n, s1.saturating_sub(s0) / n));
            }
            Ok(per)
        })();
        (r, c)
    });
    pin_server(&c, server_pid, None)?;
    set_server_spin(&c, server_pid, pl.spin_budget())?;
    let per = r?;
    let mut cl: Vec<Duration> = per.iter().map(|p| p.0).collect();
    let mut sv: Vec<Duration> = per.iter().map(|p| p.1).collect();
    cl.sort_unstable();
    sv.sort_unstable();
    Ok(Timed {
        samples,
        client_cpu: cl[cl.len() / 2],
        server_cpu: sv[sv.len() / 2],
    })
}

/// How a request lends its segment.
#[derive(Clone, Copy)]
enum Lend {
    Read,
    Write,
    ReadWrite,
}

fn run_ops(
    c: &Process,
    server_pid: Pid,
    op: Op,
    iters: usize,
    warmup: usize,
) -> Result<(Vec<Duration>, Duration), String> {
    let size = match op {
        Op::Load { total, .. } | Op::LoadShared { total, .. } => total,
        _ => 65_000,
    };
    let mut buf = vec![0x5au8; size];
    let mut out = Vec::with_capacity(iters);
    // The request (code, words 1–2) and the segment lent with it.
    let (code, w1, w2, lend, len) = match op {
        Op::Null => (1, 0, 0, None, 0),
        Op::PageWrite(n) => (PAGE_WRITE, 0, 0, Some(Lend::Read), n),
        Op::PageRead(n) => (PAGE_READ, n as u32, 0, Some(Lend::Write), n),
        Op::SeqRead { n, delay_us } => (SEQ_READ, n as u32, delay_us, Some(Lend::Write), n),
        Op::ThothWrite(n) | Op::MoveFrom(n) => (PULL_N, n as u32, 0, Some(Lend::Read), n),
        Op::Echo(n) => (ECHO_SEG, 0, 0, Some(Lend::ReadWrite), n),
        Op::MoveTo(n) => (PUSH_N, n as u32, 0, Some(Lend::Write), n),
        Op::Load { total, unit } => (LOAD, unit as u32, 0, Some(Lend::Write), total),
        Op::LoadShared { total, unit } => (LOAD_SHARED, unit as u32, 0, Some(Lend::Write), total),
    };
    let mut request = Message::with_code(code);
    request.0[1] = w1;
    request.0[2] = w2;
    // The page is not appended: the server fetches it with MoveFrom.
    request.set_flag(
        vkernel_proto::message::NO_APPEND,
        matches!(op, Op::ThothWrite(_) | Op::MoveFrom(_)),
    );
    let cpu0 = vkernel::host::thread_cpu_time();
    for k in 0..warmup + iters {
        let mut m = request;
        let t = Instant::now();
        let r = match lend {
            None => c.send(&mut m, server_pid),
            Some(Lend::Read) => c.send_with_segment(&mut m, server_pid, Segment::Read(&buf[..len])),
            Some(Lend::Write) => {
                c.send_with_segment(&mut m, server_pid, Segment::Write(&mut buf[..len]))
            }
            Some(Lend::ReadWrite) => {
                c.send_with_segment(&mut m, server_pid, Segment::ReadWrite(&mut buf[..len]))
            }
        };
        let dt = crate::stats::sample(t);
        r.map_err(|e| format!("operation {k}: {e}"))?;
        if k >= warmup {
            out.push(dt);
        }
    }
    Ok((out, vkernel::host::thread_cpu_time().saturating_sub(cpu0)))
}

/// Times `iters` operations of `op` from `c` on the calling thread (after
/// `warmup`), without [`timed`]'s CPU pass: for bulk rows where that pass
/// would cost more than the rows.
pub(crate) fn elapsed_only(
    c: &Process,
    server_pid: Pid,
    op: Op,
    iters: usize,
    warmup: usize,
) -> Result<Vec<Duration>, String> {
    run_ops(c, server_pid, op, iters, warmup).map(|(s, _)| s)
}

/// Times `iters` exchanges of `op` from a client thread (after `warmup`).
pub fn exchanges(
    client_kernel: &Kernel,
    server_pid: Pid,
    op: Op,
    iters: usize,
    warmup: usize,
    pl: Mode,
) -> Result<Vec<Duration>, String> {
    let c = client_kernel.create_process().map_err(|e| e.to_string())?;
    pl.run_as(0, move || run_ops(&c, server_pid, op, iters, warmup))
        .map(|(s, _)| s)
}

/// Times the GetTime null kernel operation (per call).
pub fn get_time(k: &Kernel, iters: usize, pl: Mode) -> Result<Vec<Duration>, String> {
    let p = k.create_process().map_err(|e| e.to_string())?;
    pl.run_as(0, move || {
        let batch = 100;
        let mut out = Vec::with_capacity(iters / batch + 1);
        for _ in 0..(iters / batch).max(1) {
            let t = Instant::now();
            for _ in 0..batch {
                std::hint::black_box(p.get_time());
            }
            out.push(t.elapsed() / batch as u32);
        }
        Ok(out)
    })
}

/// Result of one bulk transfer.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct BulkRun {
    /// Bytes moved.
    pub bytes: usize,
    /// Time of the MoveTo/MoveFrom call itself, at the mover.
    pub elapsed: Duration,
    /// The bytes arrived exactly.
    pub intact: bool,
}

/// One MoveTo (`to = true`) or MoveFrom of `bytes` between two hosts, the
/// client's segment written before the move.
pub fn bulk(
    client_kernel: &Kernel,
    server_pid: Pid,
    bytes: usize,
    to: bool,
    pl: Mode,
) -> Result<BulkRun, String> {
    bulk_into(client_kernel, server_pid, bytes, to, pl, true)
}

/// Like [`bulk`]; with `touched = false` a MoveTo lands in freshly
/// allocated memory never written, so the move also pays the kernel's
/// first-touch page faults (what a program reading into a new buffer pays).
pub fn bulk_into(
    client_kernel: &Kernel,
    server_pid: Pid,
    bytes: usize,
    to: bool,
    pl: Mode,
    touched: bool,
) -> Result<BulkRun, String> {
    let c = client_kernel.create_process().map_err(|e| e.to_string())?;
    pl.run_as(0, move || {
        let expect: Vec<u8> = (0..bytes)
            .map(|k| (k as u32).wrapping_mul(2654435761) as u8)
            .collect();
        let mut seg = match (to, touched) {
            (false, _) => expect.clone(),
            (true, true) => vec![0xa5u8; bytes],
            (true, false) => vec![0u8; bytes],
        };
        let mut m = Message::with_code(if to { MOVE_TO } else { MOVE_FROM });
        let r: Result<_, IpcError> = if to {
            c.send_with_segment(&mut m, server_pid, Segment::Write(&mut seg))
        } else {
            c.send_with_segment(&mut m, server_pid, Segment::Read(&seg))
        };
        r.map_err(|e| e.to_string())?;
        if m.0[1] != 0 {
            return Err("the server's move failed".into());
        }
        let ns = ((m.0[2] as u64) << 32) | m.0[3] as u64;
        // MoveFrom: the server checks nothing; verify by pulling it back.
        let intact = if to {
            seg == expect
        } else {
            let mut back = vec![0u8; bytes];
            let mut m = Message::with_code(MOVE_TO);
            c.send_with_segment(&mut m, server_pid, Segment::Write(&mut back))
                .map_err(|e| e.to_string())?;
            back == expect
        };
        Ok(BulkRun {
            bytes,
            elapsed: Duration::from_nanos(ns),
            intact,
        })
    })
}

/// Times Sends to `target` (a process or a group; `mode` sets the group
/// reply mode) after `warmup`. With `gather > 1` each sample also waits,
/// polling GetReply, until that many replies in all have arrived (a
/// multi-reply query); returns (time to first reply, time to all).
pub fn group_sends(
    client_kernel: &Kernel,
    target: Pid,
    mode: vkernel::GroupMode,
    gather: usize,
    iters: usize,
    warmup: usize,
    pl: Mode,
) -> Result<(Vec<Duration>, Vec<Duration>), String> {
    let c = client_kernel.create_process().map_err(|e| e.to_string())?;
    pl.run_as(0, move || {
        let (mut first, mut all) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
        let mut m = Message::zero();
        for k in 0..warmup + iters {
            let mut q = Message::with_code(0x4f);
            q.set_group_mode(mode);
            let t = Instant::now();
            c.send(&mut q, target)
                .map_err(|e| format!("group send: {e}"))?;
            let t1 = crate::stats::sample(t);
            let mut got = 1;
            let limit = Instant::now() + Duration::from_secs(2);
            while got < gather {
                if c.get_reply(&mut m).is_some() {
                    got += 1;
                } else if Instant::now() > limit {
                    return Err(format!("only {got} of {gather} replies within 2 s"));
                } else {
                    std::hint::spin_loop();
                }
            }
            if k >= warmup {
                first.push(t1);
                all.push(crate::stats::sample(t));
            }
        }
        Ok((first, all))
    })
}

/// The waiting strategy a host gets without any setting (the README's
/// commands), in words.
pub fn default_waiting() -> String {
    let d = KernelConfig::default();
    if d.spin.is_zero() {
        "blocking waits".into()
    } else if d.adaptive_spin {
        format!("adaptive spin ≤ {:?} (--spin auto)", d.spin)
    } else {
        format!("spin {:?} then block", d.spin)
    }
}

/// Remote null exchanges between two hosts configured as a user gets them
/// by default (`KernelConfig::default()`: no spin or placement set, threads
/// unpinned): what the README's `vkernel echo` + `vkernel ping` measure.
pub fn default_exchanges(iters: usize, warmup: usize) -> Result<Vec<Duration>, String> {
    let a = Kernel::start(KernelConfig::default()).map_err(|e| e.to_string())?;
    let b = Kernel::start(KernelConfig {
        peers: vec![a.local_addr()],
        ..KernelConfig::default()
    })
    .map_err(|e| e.to_string())?;
    a.add_peer(b.local_addr());
    let s = a.create_process().map_err(|e| e.to_string())?;
    let server = s.pid();
    let srv = thread::spawn(move || {
        let mut m = Message::zero();
        while let Ok(i) = s.receive(&mut m) {
            if m.code() == STOP {
                let _ = s.reply(&m, i.from);
                break;
            }
            let _ = s.reply(&m, i.from);
        }
    });
    let c = b.create_process().map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(iters);
    let mut err = None;
    for i in 0..warmup + iters {
        let mut m = Message::with_code(1);
        let t = Instant::now();
        if let Err(e) = c.send(&mut m, server) {
            err = Some(e.to_string());
            break;
        }
        if i >= warmup {
            out.push(t.elapsed());
        }
    }
    let _ = c.send(&mut Message::with_code(STOP), server);
    let _ = srv.join();
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}
