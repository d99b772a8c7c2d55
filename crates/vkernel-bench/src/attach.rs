//! Section 13: one machine host shared by programs. The null exchange
//! between two attached programs, between two threads of one program,
//! and a Unix-domain datagram ping-pong, each busy-polling and blocking;
//! a 64 MiB MoveTo between attached programs against memcpy; 64 MiB each
//! way between two programs (`vkernel echo` and `vkernel ping --bulk`),
//! over UDP and attached, against a TCP loopback stream.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use vkernel::{Kernel, KernelConfig, Message, Pid, Process, Segment};

use crate::report::{Goal, SectionReport};
use crate::section::{us, Ctx, Outcome, Section};
use crate::stats::median;
use crate::Mode;

/// Section 13.
#[derive(Clone, Debug, Serialize)]
pub struct Attach {
    /// One row per pair and waiting mode.
    pub rows: Vec<AttachRow>,
    /// 64 MiB MoveTo between two attached programs, MB/s.
    pub move_mbps: f64,
    /// Single-thread memcpy of 64 MiB, MB/s.
    pub memcpy_mbps: f64,
    /// 64 MiB each way between two programs, and over TCP.
    pub bulk: Vec<crate::bulkprograms::BulkRow>,
}

/// A null exchange's round trip.
#[derive(Clone, Debug, Serialize)]
pub struct AttachRow {
    /// What exchanges.
    pub what: String,
    /// "spin" (busy-polling) or "block".
    pub wait: String,
    /// Median round trip, µs.
    pub median_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
}

impl AttachRow {
    /// Prints the row (`what` and `wait` padded to `widths`) and adds it
    /// to `rows`; returns the median.
    pub(crate) fn push(
        rows: &mut Vec<AttachRow>,
        widths: (usize, usize),
        what: &str,
        wait: &str,
        r: (f64, f64),
    ) -> f64 {
        crate::outln!(
            "  {what:<w$} {wait:<v$}  median {:>8.2} µs  p99 {:>9.2} µs",
            r.0,
            r.1,
            w = widths.0,
            v = widths.1
        );
        rows.push(AttachRow {
            what: what.into(),
            wait: wait.into(),
            median_us: r.0,
            p99_us: r.1,
        });
        r.0
    }
}

const BIG: usize = 64 << 20;
pub(crate) const STOP: u32 = 0xdead;

pub(crate) fn quantiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    (at(0.5), at(0.99))
}

/// Times `n` null exchanges from `c` to a server process that echoes
/// until it gets STOP.
pub(crate) fn exchanges(c: &Process, server: Pid, n: usize) -> Result<Vec<f64>, String> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let mut m = Message::with_code(1);
        let t = Instant::now();
        c.send(&mut m, server).map_err(|e| e.to_string())?;
        if i >= n / 10 {
            v.push(us(t.elapsed()));
        }
    }
    Ok(v)
}

pub(crate) fn echo_server(p: Process) {
    let mut m = Message::zero();
    while let Ok(i) = p.receive(&mut m) {
        let stop = m.code() == STOP;
        let _ = p.reply(&m, i.from);
        if stop {
            break;
        }
    }
}

pub(crate) fn stop(c: &Process, server: Pid) {
    let mut m = Message::with_code(STOP);
    let _ = c.send(&mut m, server);
}

fn set_wait(p: &Process, spin: bool) {
    p.set_spin(if spin {
        Duration::from_micros(500)
    } else {
        Duration::ZERO
    });
}

/// A pair of processes on `ks` and `kc` exchanging null messages.
pub(crate) fn pair(ks: &Kernel, kc: &Kernel, spin: bool, n: usize) -> Result<(f64, f64), String> {
    let s = ks.create_process().map_err(|e| e.to_string())?;
    let c = kc.create_process().map_err(|e| e.to_string())?;
    set_wait(&s, spin);
    set_wait(&c, spin);
    let spid = s.pid();
    let t = std::thread::spawn(move || echo_server(s));
    let v = exchanges(&c, spid, n);
    stop(&c, spid);
    let _ = t.join();
    Ok(quantiles(v?))
}

/// A Unix-domain datagram ping-pong between two threads.
fn unix_pingpong(spin: bool, n: usize) -> Result<(f64, f64), String> {
    let (a, b) = UnixDatagram::pair().map_err(|e| e.to_string())?;
    a.set_nonblocking(spin).map_err(|e| e.to_string())?;
    b.set_nonblocking(spin).map_err(|e| e.to_string())?;
    let recv = move |s: &UnixDatagram, buf: &mut [u8]| loop {
        match s.recv(buf) {
            Ok(k) => return Some(k),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(_) => return None,
        }
    };
    let total = n + n / 10;
    let t = std::thread::spawn(move || {
        let mut buf = [0u8; 32];
        for _ in 0..total {
            if recv(&b, &mut buf).is_none() || b.send(&buf).is_err() {
                break;
            }
        }
    });
    let mut v = Vec::with_capacity(n);
    let mut buf = [0u8; 32];
    for i in 0..total {
        let t0 = Instant::now();
        a.send(&buf).map_err(|e| e.to_string())?;
        recv(&a, &mut buf).ok_or("unix recv failed")?;
        if i >= n / 10 {
            v.push(us(t0.elapsed()));
        }
    }
    let _ = t.join();
    Ok(quantiles(v))
}

/// A word in a shared mapping, for the raw ping-pong.
fn word_at(base: *mut libc::c_void, off: usize) -> &'static AtomicU32 {
    // SAFETY: `base` is a live page-aligned shared mapping of a page that
    // the caller unmaps only after every user of the word is done (the
    // child has exited); `off` is a multiple of 4 below 4096; AtomicU32
    // has no invalid bit patterns.
    unsafe { &*(base.cast::<u8>().add(off) as *const AtomicU32) }
}

fn futex(word: &AtomicU32, op: libc::c_int, val: u32) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    // SAFETY: FUTEX_WAIT/FUTEX_WAKE on a valid, aligned u32 in a shared
    // mapping (not FUTEX_PRIVATE: the other side is another process); the
    // timeout bounds a wait whose wake was missed.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            &ts as *const libc::timespec,
        );
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; it is
    // async-signal-safe, as the forked child needs.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits until `word` reaches `want`: busy-polling, or blocking on the
/// futex at once; false after `deadline_ns`.
fn await_word(word: &AtomicU32, want: u32, spin: bool, deadline_ns: u64) -> bool {
    let mut i: u32 = 0;
    loop {
        let v = word.load(Ordering::Acquire);
        if v >= want {
            return true;
        }
        if spin {
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i.is_multiple_of(4096) && monotonic_ns() > deadline_ns {
                return false;
            }
        } else {
            futex(word, libc::FUTEX_WAIT, v);
            if monotonic_ns() > deadline_ns {
                return word.load(Ordering::Acquire) >= want;
            }
        }
    }
}

/// The floor: a ping-pong of one word each way between this process and a
/// forked child through a shared page, busy-polling or blocking on a
/// futex at once. No kernel, no protocol: what the hardware and the OS
/// charge for two processes to see each other's stores.
fn shm_pingpong(spin: bool, n: usize) -> Result<(f64, f64), String> {
    let total = (n + n / 10) as u32;
    // SAFETY: a fresh anonymous shared mapping of one page, unmapped below
    // after the child has exited.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err("mmap of the shared page failed".into());
    }
    let (ping, pong) = (word_at(base, 0), word_at(base, 64));
    let deadline = monotonic_ns() + 30_000_000_000;
    // SAFETY: fork in a threaded program: the child only loads and stores
    // atomics in the shared page and makes async-signal-safe calls
    // (futex, clock_gettime, _exit); it allocates nothing and takes no
    // lock, and it ends by the deadline even if this process dies.
    let child = unsafe { libc::fork() };
    if child < 0 {
        // SAFETY: the mapping made above; nobody else uses it.
        unsafe { libc::munmap(base, 4096) };
        return Err("fork failed".into());
    }
    if child == 0 {
        for i in 1..=total {
            if !await_word(ping, i, spin, deadline) {
                break;
            }
            pong.store(i, Ordering::Release);
            if !spin {
                futex(pong, libc::FUTEX_WAKE, 1);
            }
        }
        // SAFETY: leaves the child at once, running no destructors or
        // atexit handlers that belong to the parent's threads.
        unsafe { libc::_exit(0) };
    }
    let mut v = Vec::with_capacity(n);
    let mut ok = true;
    for i in 1..=total {
        let t0 = Instant::now();
        ping.store(i, Ordering::Release);
        if !spin {
            futex(ping, libc::FUTEX_WAKE, 1);
        }
        if !await_word(pong, i, spin, deadline) {
            ok = false;
            break;
        }
        if i as usize > n / 10 {
            v.push(us(t0.elapsed()));
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above (it exits by the deadline).
    unsafe { libc::waitpid(child, &mut status, 0) };
    // SAFETY: the child has exited; nothing else uses the page.
    unsafe { libc::munmap(base, 4096) };
    if !ok {
        return Err("the shared-memory ping-pong's child stopped answering".into());
    }
    Ok(quantiles(v))
}

/// 64 MiB MoveTo from an attached server into an attached client's
/// segment, MB/s (median of `rounds`).
fn big_move(ks: &Kernel, kc: &Kernel, rounds: usize) -> Result<f64, String> {
    let s = ks.create_process().map_err(|e| e.to_string())?;
    let c = kc.create_process().map_err(|e| e.to_string())?;
    let spid = s.pid();
    let t = std::thread::spawn(move || -> Vec<f64> {
        let src = vec![7u8; BIG];
        let mut m = Message::zero();
        let mut out = Vec::new();
        while let Ok(i) = s.receive(&mut m) {
            if m.code() == STOP {
                let _ = s.reply(&m, i.from);
                break;
            }
            let t0 = Instant::now();
            if s.move_to(i.from, 0, &src).is_ok() {
                out.push(BIG as f64 / t0.elapsed().as_secs_f64() / 1e6);
            }
            let _ = s.reply(&m, i.from);
        }
        out
    });
    let mut dst = vec![0u8; BIG];
    for _ in 0..rounds {
        let mut m = Message::with_code(1);
        c.send_with_segment(&mut m, spid, Segment::Write(&mut dst))
            .map_err(|e| e.to_string())?;
    }
    stop(&c, spid);
    let mut v = t.join().map_err(|_| "mover panicked")?;
    if dst[BIG - 1] != 7 {
        return Err("the moved data did not arrive".into());
    }
    Ok(median(&mut v))
}

fn memcpy_mbps(rounds: usize) -> f64 {
    let src = vec![7u8; BIG];
    let mut dst = vec![0u8; BIG];
    let mut v: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            BIG as f64 / t.elapsed().as_secs_f64() / 1e6
        })
        .collect();
    median(&mut v)
}

/// The pause before each waiting mode's rows (see `section`).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(300);

pub(crate) fn section(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Attach.heading("(programs attached to one machine host; shared-memory call slots)");
    let n = if c.quick {
        2_000
    } else {
        c.n.clamp(5_000, 20_000)
    };
    let dir = std::env::temp_dir().join(format!("vkernel-bench-{}", std::process::id()));
    let path = dir.join("host.sock");
    let host = Kernel::start(KernelConfig::default()).map_err(|e| e.to_string())?;
    let srv = host.serve_attach(&path, 0o600).map_err(|e| e.to_string())?;
    let a = Kernel::attach(&path).map_err(|e| e.to_string())?;
    let b = Kernel::attach(&path).map_err(|e| e.to_string())?;
    let threads = Kernel::start(KernelConfig::default()).map_err(|e| e.to_string())?;
    // Another logical host on loopback, known to the machine host.
    let remote = Kernel::start(KernelConfig {
        peers: vec![host.local_addr()],
        ..KernelConfig::default()
    })
    .map_err(|e| e.to_string())?;
    host.add_peer(remote.local_addr());
    threads.add_peer(remote.local_addr());
    remote.add_peer(threads.local_addr());
    let mut rows = Vec::new();
    for spin in [true, false] {
        let wait = if spin { "spin" } else { "block" };
        let mode = if spin { Mode::SPIN } else { Mode::BLOCK };
        // Let the spin rows' waiters wind down first: a thread still
        // spinning keeps a vCPU awake, and a blocking pair measured then
        // trades wake-ups on the other CPU at a fifth of the cost of
        // waking a halted one (raw UDP 11-15 µs against 55-67 µs quiet),
        // which would favour whichever row came first.
        std::thread::sleep(SETTLE);
        let udp = crate::baseline::udp_rtt(32, n, n / 10, mode)?;
        let (peer0, direct0) = (srv.peer_exchanges(), srv.direct_grants());
        let attached = pair(&a, &b, spin, n)?;
        let peer = srv.peer_exchanges() - peer0;
        for (what, r) in [
            ("two attached programs", attached),
            (
                "two threads of one program",
                pair(&threads, &threads, spin, n)?,
            ),
            ("Unix datagram ping-pong", unix_pingpong(spin, n)?),
            ("shared-memory ping-pong (floor)", shm_pingpong(spin, n)?),
            (
                "attached program to a remote host",
                pair(&remote, &a, spin, n)?,
            ),
            (
                "embedded program to a remote host",
                pair(&remote, &threads, spin, n)?,
            ),
            ("raw UDP ping-pong", (udp.median_us, udp.p99_us)),
        ] {
            AttachRow::push(&mut rows, (40, 5), what, wait, r);
        }
        crate::outln!(
            "  ({wait}: {peer} of {} exchanges between the attached programs went through \
             peer pages; {} grants of the direct path for remote Sends)",
            n + n / 10 + 1,
            srv.direct_grants() - direct0
        );
    }
    // The remote rows again with a cluster key (MAC): a keyed machine host
    // lends its key to its programs' own sockets (docs/SECURITY.md). Its
    // hosts live only for these rows (idle hosts' threads would disturb
    // the others on two CPUs).
    {
        let key = vkernel::auth::Key {
            id: 1,
            secret: [0x42; 32],
        };
        let keyed = |peers: Vec<std::net::SocketAddr>| KernelConfig {
            keys: vec![key.clone()],
            peers,
            ..KernelConfig::default()
        };
        let kpath = dir.join("keyed.sock");
        let khost = Kernel::start(keyed(vec![])).map_err(|e| e.to_string())?;
        let ksrv = khost
            .serve_attach(&kpath, 0o600)
            .map_err(|e| e.to_string())?;
        let ka = Kernel::attach(&kpath).map_err(|e| e.to_string())?;
        let kremote = Kernel::start(keyed(vec![khost.local_addr()])).map_err(|e| e.to_string())?;
        khost.add_peer(kremote.local_addr());
        for spin in [true, false] {
            let wait = if spin { "spin" } else { "block" };
            std::thread::sleep(SETTLE);
            let r = pair(&kremote, &ka, spin, n)?;
            let what = "attached program to a remote host, keyed";
            AttachRow::push(&mut rows, (40, 5), what, wait, r);
        }
        drop(ksrv);
    }
    // Many programs attached, each with an idle process: does the pair's
    // exchange slow down?
    let many = if c.quick { 100 } else { 1000 };
    let mut crowd = Vec::with_capacity(many);
    for _ in 2..many {
        let k = Kernel::attach(&path).map_err(|e| e.to_string())?;
        let p = k.create_process().map_err(|e| e.to_string())?;
        crowd.push((k, p));
    }
    let crowded = pair(&a, &b, false, n)?;
    let crowd_what = format!("two attached programs among {many}");
    AttachRow::push(&mut rows, (40, 5), &crowd_what, "block", crowded);
    drop(crowd);
    let rounds = if c.quick { 3 } else { 7 };
    let move_mbps = big_move(&a, &b, rounds)?;
    let memcpy = memcpy_mbps(rounds);
    crate::outln!(
        "  64 MiB MoveTo between attached programs {move_mbps:>8.0} MB/s; memcpy {memcpy:>8.0} MB/s ({:.2}×)",
        move_mbps / memcpy
    );
    let bulk = bulk_rows(&path, if c.quick { 2 } else { 5 }, memcpy);
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
    let med = |what: &str, wait: &str| {
        rows.iter()
            .find(|r| r.what == what && r.wait == wait)
            .map_or(f64::NAN, |r| r.median_us)
    };
    let (att, thr, unx) = (
        "two attached programs",
        "two threads of one program",
        "Unix datagram ping-pong",
    );
    let (rem, udp) = ("attached program to a remote host", "raw UDP ping-pong");
    let mbps = |what: &str| {
        bulk.iter()
            .find(|r| r.what == what)
            .map_or(f64::NAN, |r| r.median_mbps)
    };
    let mut goals = vec![
        Goal::at_most("attached null exchange, spin", med(att, "spin"), 1.0, " µs"),
        Goal::at_most(
            "attached / Unix datagram, spin",
            med(att, "spin") / med(unx, "spin"),
            0.3,
            "×",
        ),
        Goal::at_most(
            "attached / Unix datagram, block",
            med(att, "block") / med(unx, "block"),
            1.0,
            "×",
        ),
        Goal::at_most("threads null exchange, spin", med(thr, "spin"), 0.7, " µs"),
        Goal::at_least("64 MiB MoveTo / memcpy", move_mbps / memcpy, 0.7, "×"),
        Goal::at_most(
            "remote from attached / raw UDP, spin",
            med(rem, "spin") / med(udp, "spin"),
            1.3,
            "×",
        ),
        Goal::at_most(
            "remote from attached / raw UDP, block",
            med(rem, "block") / med(udp, "block"),
            1.3,
            "×",
        ),
        Goal::at_most(
            "keyed / unkeyed remote from attached, spin",
            med("attached program to a remote host, keyed", "spin") / med(rem, "spin"),
            1.15,
            "×",
        ),
        Goal::at_most(
            &format!("attached exchange among {many} / among 2, block"),
            med(&crowd_what, "block") / med(att, "block"),
            1.5,
            "×",
        ),
    ];
    if !bulk.is_empty() {
        goals.push(Goal::at_least(
            "64 MiB each way, two programs over UDP / TCP",
            mbps(BULK_UDP) / mbps(BULK_TCP),
            0.9,
            "×",
        ));
        goals.push(Goal::at_least(
            "64 MiB each way, two attached programs / memcpy",
            mbps(BULK_ATTACHED) / memcpy,
            0.8,
            "×",
        ));
    }
    Ok(Outcome {
        report: SectionReport::Attach(Attach {
            rows,
            move_mbps,
            memcpy_mbps: memcpy,
            bulk,
        }),
        goals,
        charts: Vec::new(),
    })
}

const BULK_UDP: &str = "two programs over UDP (ping --bulk)";
const BULK_ATTACHED: &str = "two attached programs (ping --bulk)";
const BULK_TCP: &str = "TCP loopback stream, two threads";

/// The rows of 64 MiB each way between two programs (separate
/// processes of this executable; none when the bench runs elsewhere, as
/// in tests), the attached ones through the host at `sock`.
fn bulk_rows(sock: &std::path::Path, n: usize, memcpy: f64) -> Vec<crate::bulkprograms::BulkRow> {
    use crate::bulkprograms as b;
    let Some(exe) = crate::programs::client_program() else {
        crate::outln!("  (64 MiB between programs: only when run as `vkernel bench`)");
        return Vec::new();
    };
    let mut rows = Vec::new();
    let tcp = b::tcp(n);
    let tcp_mbps = tcp.as_ref().map_or(f64::NAN, |r| r.median_mbps);
    for (what, r) in [
        (BULK_UDP, b::remote(&exe, n)),
        (BULK_ATTACHED, b::attached(&exe, sock, n)),
        (BULK_TCP, tcp),
    ] {
        match r {
            Ok(mut row) => {
                crate::outln!(
                    "  64 MiB each way, {what:<36} median {:>7.0} MB/s  p99 {:>7.0} MB/s  \
                     ({:.2}× TCP, {:.2}× memcpy; {} chunks resent)",
                    row.median_mbps,
                    row.p99_mbps,
                    row.median_mbps / tcp_mbps,
                    row.median_mbps / memcpy,
                    row.resent
                );
                row.what = what.into();
                rows.push(row);
            }
            Err(e) => crate::outln!("  64 MiB each way, {what}: skipped: {e}"),
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_shared_memory_ping_pong_runs_both_ways() {
        for spin in [true, false] {
            let (med, p99) = shm_pingpong(spin, 200).unwrap();
            assert!(med > 0.0 && med <= p99, "spin {spin}: {med} {p99}");
        }
    }
}
