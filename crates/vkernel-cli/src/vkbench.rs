//! vkernel's side of the measurements: null operations, exchanges and bulk
//! transfers, between threads of this process with a stated placement and
//! waiting strategy, so that the raw baselines can run the same way.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use vkernel::{FaultConfig, IpcError, Kernel, KernelConfig, Message, Pid, Process, Segment};

/// How threads are placed and how they wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// Pin the client to CPU 0 and the server to CPU 1.
    pub pinned: bool,
    /// Busy-poll (true) or block after a short spin (false).
    pub spin: bool,
}

impl Placement {
    /// The kernel spin budget this placement implies.
    pub fn spin_budget(&self) -> Duration {
        if self.spin {
            // Long enough to cover any exchange; an idle server then blocks.
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        }
    }

    /// Pins the calling thread as a client (0) or server (1).
    pub fn pin(&self, role: usize) {
        if self.pinned {
            let _ = vkernel::sys::pin_to_cpu(role % vkernel::sys::online_cpus());
        }
    }

    /// Runs `f` on a new thread placed as `role`, so the caller's own
    /// affinity (inherited by threads it starts later) is never changed.
    pub fn run_as<T: Send>(&self, role: usize, f: impl FnOnce() -> T + Send) -> T {
        thread::scope(|s| {
            s.spawn(|| {
                self.pin(role);
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Human-readable description.
    pub fn describe(&self) -> String {
        format!(
            "{}, {}",
            if self.pinned {
                "client on CPU 0, server on CPU 1"
            } else {
                "threads unpinned"
            },
            if self.spin {
                "busy-poll waiting"
            } else {
                "blocking waits"
            }
        )
    }
}

fn kcfg(pl: Placement) -> KernelConfig {
    KernelConfig {
        spin: pl.spin_budget(),
        ..KernelConfig::default()
    }
}

/// Two logical hosts on loopback that know each other.
pub fn host_pair(pl: Placement, faults: FaultConfig) -> Result<(Kernel, Kernel), String> {
    let a = Kernel::start(KernelConfig {
        faults: faults.clone(),
        ..kcfg(pl)
    })
    .map_err(|e| e.to_string())?;
    let b = Kernel::start(KernelConfig {
        peers: vec![a.local_addr()],
        faults: FaultConfig {
            seed: faults.seed.wrapping_add(1),
            ..faults
        },
        ..kcfg(pl)
    })
    .map_err(|e| e.to_string())?;
    a.add_peer(b.local_addr());
    Ok((a, b))
}

const STOP: u32 = 0xdead;
const MOVE_TO: u32 = 0x40;
const MOVE_FROM: u32 = 0x41;
const PAGE_READ: u32 = 0x42;
const PAGE_WRITE: u32 = 0x43;

/// Server for the exchange benchmarks. MoveTo/MoveFrom requests time the
/// move itself and return the nanoseconds in words 2..3.
fn server(p: Process, pl: Placement) {
    pl.pin(1);
    let mut m = Message::zero();
    let mut page = vec![0u8; vkernel_proto::MAX_APPEND];
    let mut bulk: Vec<u8> = Vec::new();
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
            PAGE_READ => {
                let n = (m.0[1] as usize).min(page.len());
                p.reply_with_segment(&m, i.from, 0, &page[..n])
            }
            _ => p.reply(&m, i.from),
        };
        let _ = r;
    }
}

/// A server process on `k` (spawned thread) and its pid.
pub fn start_server(k: &Kernel, pl: Placement) -> Result<(Pid, thread::JoinHandle<()>), String> {
    k.spawn("bench-server", move |p| server(p, pl))
        .map_err(|e| e.to_string())
}

/// Stops a server started with [`start_server`].
pub fn stop_server(c: &Process, s: Pid, h: thread::JoinHandle<()>) {
    let mut m = Message::with_code(STOP);
    let _ = c.send(&mut m, s);
    let _ = h.join();
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
}

/// Times `iters` exchanges of `op` from a client thread (after `warmup`).
pub fn exchanges(
    client_kernel: &Kernel,
    server_pid: Pid,
    op: Op,
    iters: usize,
    warmup: usize,
    pl: Placement,
) -> Result<Vec<Duration>, String> {
    let c = client_kernel.create_process().map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        s.spawn(move || {
            pl.pin(0);
            let mut buf = vec![0x5au8; 65_000];
            let mut out = Vec::with_capacity(iters);
            for k in 0..warmup + iters {
                let mut m = Message::with_code(1);
                let t = Instant::now();
                let r = match op {
                    Op::Null => c.send(&mut m, server_pid),
                    Op::PageWrite(n) => {
                        m.set_code(PAGE_WRITE);
                        c.send_with_segment(&mut m, server_pid, Segment::Read(&buf[..n]))
                    }
                    Op::PageRead(n) => {
                        m.set_code(PAGE_READ);
                        m.0[1] = n as u32;
                        c.send_with_segment(&mut m, server_pid, Segment::Write(&mut buf[..n]))
                    }
                };
                let dt = t.elapsed();
                if let Err(e) = r {
                    let _ = tx.send(Err(format!("exchange {k}: {e}")));
                    return;
                }
                if k >= warmup {
                    out.push(dt);
                }
            }
            let _ = tx.send(Ok(out));
        });
    });
    rx.recv().map_err(|e| e.to_string())?
}

/// Times the GetTime null kernel operation (per call).
pub fn get_time(k: &Kernel, iters: usize, pl: Placement) -> Result<Vec<Duration>, String> {
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

/// One MoveTo (`to = true`) or MoveFrom of `bytes` between two hosts.
pub fn bulk(
    client_kernel: &Kernel,
    server_pid: Pid,
    bytes: usize,
    to: bool,
    pl: Placement,
) -> Result<BulkRun, String> {
    let c = client_kernel.create_process().map_err(|e| e.to_string())?;
    pl.run_as(0, move || {
        let expect: Vec<u8> = (0..bytes)
            .map(|k| (k as u32).wrapping_mul(2654435761) as u8)
            .collect();
        let mut seg = if to { vec![0u8; bytes] } else { expect.clone() };
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
