//! `vkernel disk`, `vkernel disk-cli` and `vkernel nbd` as separate OS
//! processes over loopback, with real NBD clients where installed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;
use common::{Proc, BIN};

/// Starts a vkernel command that exits by itself, and returns it with the
/// first `n` lines it printed.
fn start(args: &[&str], n: usize) -> (Proc, Vec<String>) {
    let mut c = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn vkernel");
    let mut r = BufReader::new(c.stdout.take().expect("stdout"));
    let mut lines = Vec::new();
    for _ in 0..n {
        let mut l = String::new();
        r.read_line(&mut l).expect("banner");
        lines.push(l);
    }
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    (Proc(c), lines)
}

/// The word after `marker` in `line`.
fn after(line: &str, marker: &str) -> String {
    line.split_whitespace()
        .skip_while(|w| *w != marker)
        .nth(1)
        .unwrap_or_else(|| panic!("no `{marker}` in {line:?}"))
        .trim_end_matches([';', ','])
        .to_string()
}

fn vk(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN).args(args).output().expect("run vkernel");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// PATH with the system's directories first: nbdsh runs `python3`, which
/// must be the one with Debian's libnbd bindings, not another earlier on
/// PATH (pyenv's, say).
fn system_path() -> String {
    format!(
        "/usr/bin:/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    )
}

fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .env("PATH", system_path())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var("VKERNEL_REQUIRE_NBD_TOOLS").as_deref() == Ok("1") {
        panic!("{tool} is required (VKERNEL_REQUIRE_NBD_TOOLS=1) but not installed");
    }
    ok
}

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vk-disk-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmpdir");
    d
}

/// `vkernel disk` on `backing` with owner key `key`, bound to `bind`
/// (stops by itself after 120 s).
fn file_disk(backing: &str, key: &str, bind: &str) -> (Proc, Vec<String>) {
    start(
        &[
            "disk",
            "--bind",
            bind,
            "--backing",
            backing,
            "--owner-key",
            key,
            "--exit-after",
            "120s",
        ],
        1,
    )
}

/// `vkernel nbd` in front of the disk at `disk_addr` (stops by itself
/// after 120 s).
fn gateway_to(disk_addr: &str, key: &str) -> (Proc, Vec<String>) {
    start(
        &[
            "nbd",
            "--peer",
            disk_addr,
            "--disk-key",
            key,
            "--listen",
            "127.0.0.1:0",
            "--exit-after",
            "120s",
        ],
        1,
    )
}

#[test]
fn disk_with_nbd_disk_cli_and_a_remote_gateway_agree_on_the_bytes() {
    let dir = tmp("agree");
    let (_disk, lines) = start(
        &[
            "disk",
            "--backing",
            "ram:4M",
            "--owner-key",
            "0x77",
            "--nbd",
            "127.0.0.1:0",
            "--exit-after",
            "60s",
        ],
        2,
    );
    let disk_addr = after(&lines[0], "on");
    assert!(lines[1].contains("NBD export"), "{lines:?}");
    let local_nbd = after(&lines[1], "on");

    // disk-cli: capacity, a write of a file and a read back of it.
    let peer = ["--peer", disk_addr.as_str(), "--disk-key", "0x77"];
    let (ok, out, err) = vk(&[&["disk-cli"][..], &peer, &["capacity"]].concat());
    assert!(ok, "{out}{err}");
    assert!(out.contains("8192 blocks of 512 bytes"), "{out}");
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let input = dir.join("in.bin");
    std::fs::write(&input, &data).expect("write input");
    let input_s = input.to_str().expect("utf-8 path");
    let (ok, out, err) = vk(&[
        &["disk-cli"][..],
        &peer,
        &["write", "--offset", "1M", "--input", input_s, "--fua"],
    ]
    .concat());
    assert!(ok && out.contains("wrote 65536 bytes"), "{out}{err}");
    let back = dir.join("back.bin");
    let back_s = back.to_str().expect("utf-8 path");
    let (ok, out, err) = vk(&[
        &["disk-cli"][..],
        &peer,
        &["read", "--offset", "1M", "--length", "64K", "--out", back_s],
    ]
    .concat());
    assert!(ok, "{out}{err}");
    assert_eq!(std::fs::read(&back).expect("read back"), data);

    // A wrong key is refused with a clear error, not a hang.
    let (ok, _, err) = vk(&[
        "disk-cli",
        "--peer",
        &disk_addr,
        "--disk-key",
        "0x78",
        "capacity",
    ]);
    assert!(!ok && !err.is_empty(), "{err}");

    // A gateway on another logical host (another OS process).
    let (_gw, glines) = start(
        &[
            "nbd",
            "--peer",
            &disk_addr,
            "--disk-key",
            "0x77",
            "--listen",
            "127.0.0.1:0",
            "--exit-after",
            "60s",
        ],
        1,
    );
    let remote_nbd = after(&glines[0], "on");

    if !have("nbdcopy") {
        return;
    }
    // Both exports hold the bytes disk-cli wrote; a write through one is
    // read through the other (each round writes a different pattern, so
    // the second round cannot pass on the first round's bytes).
    let copy = |from: &str, to: &str| {
        let st = Command::new("nbdcopy")
            .args([from, to])
            .status()
            .expect("nbdcopy");
        assert!(st.success(), "nbdcopy {from} {to}");
    };
    let whole = dir.join("whole.img");
    let again = dir.join("again.img");
    let (whole_s, again_s) = (
        whole.to_str().expect("utf-8 path"),
        again.to_str().expect("utf-8 path"),
    );
    for (round, (a, b)) in [(&local_nbd, &remote_nbd), (&remote_nbd, &local_nbd)]
        .into_iter()
        .enumerate()
    {
        let (a, b) = (format!("nbd://{a}"), format!("nbd://{b}"));
        copy(&a, whole_s);
        let img = std::fs::read(&whole).expect("image");
        assert_eq!(img.len(), 4 << 20);
        assert_eq!(&img[1 << 20..(1 << 20) + data.len()], &data[..]);
        let mut changed = img.clone();
        for (i, x) in changed.iter_mut().enumerate().take(1 << 20) {
            *x = (i % 13) as u8 ^ (0x40 << round);
        }
        assert_ne!(changed, img);
        std::fs::write(&whole, &changed).expect("write image");
        copy(whole_s, &a);
        copy(&b, again_s);
        assert!(
            std::fs::read(&again).expect("again") == changed,
            "a write through {a} did not read back through {b}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn disk_refuses_a_bad_nbd_address_clearly() {
    let (ok, _, err) = vk(&[
        "disk",
        "--backing",
        "ram:1M",
        "--nbd",
        "not-an-address",
        "--exit-after",
        "1s",
    ]);
    assert!(!ok, "{err}");
    assert!(err.contains("--nbd") || err.contains("address"), "{err}");
}

// ------------------------------------------- the NBD gateway's limits

/// A bare NBD client over TCP, for what the tools cannot do (pipeline
/// without reading replies, stall a handshake).
mod raw {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    pub const GO: u32 = 7;
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const TRIM: u16 = 4;
    pub const WRITE_ZEROES: u16 = 6;

    /// Connects; `None` if the gateway closed without its hello.
    pub fn connect(addr: &str) -> Option<TcpStream> {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).ok()?;
        assert_eq!(&hello[..16], b"NBDMAGICIHAVEOPT");
        Some(s)
    }

    /// Sends the client flags (fixed newstyle, no zeroes) and OPT_GO for
    /// `name`, and reads its replies up to the ACK.
    pub fn go(s: &mut TcpStream, name: &str) {
        let mut b = 3u32.to_be_bytes().to_vec();
        b.extend_from_slice(b"IHAVEOPT");
        b.extend_from_slice(&GO.to_be_bytes());
        b.extend_from_slice(&(6 + name.len() as u32).to_be_bytes());
        b.extend_from_slice(&(name.len() as u32).to_be_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&b).expect("GO");
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).expect("option reply");
            let ty = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let n = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            let mut d = vec![0u8; n];
            s.read_exact(&mut d).expect("option data");
            match ty {
                1 => return,
                3 => {}
                t => panic!("GO refused: {t:#x}"),
            }
        }
    }

    pub fn request(s: &mut TcpStream, ty: u16, cookie: u64, off: u64, len: u32, data: &[u8]) {
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&ty.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&off.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(data);
        s.write_all(&b).expect("request");
    }

    /// A simple reply: (error, cookie).
    pub fn reply(s: &mut TcpStream) -> (u32, u64) {
        let mut h = [0u8; 16];
        s.read_exact(&mut h).expect("reply");
        assert_eq!(&h[..4], &0x6744_6698u32.to_be_bytes());
        (
            u32::from_be_bytes(h[4..8].try_into().unwrap()),
            u64::from_be_bytes(h[8..16].try_into().unwrap()),
        )
    }

    /// True once the gateway has closed the connection; false if it is
    /// still open after the read timeout.
    pub fn closed(s: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }
}

/// `vkernel disk --nbd` on a free port with `extra` options: (process,
/// its pid, the NBD address, the export name).
fn gateway(backing: &str, extra: &[&str]) -> (Proc, u32, String) {
    let args = [
        &[
            "disk",
            "--backing",
            backing,
            "--owner-key",
            "0x77",
            "--nbd",
            "127.0.0.1:0",
            "--exit-after",
            "120s",
        ][..],
        extra,
    ]
    .concat();
    let (p, lines) = start(&args, 2);
    assert!(lines[1].contains("NBD export"), "{lines:?}");
    let addr = after(&lines[1], "on");
    let pid = p.0.id();
    (p, pid, addr)
}

/// A process's resident set in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// A process's threads.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("task dir")
        .count()
}

#[test]
fn nbd_gateway_memory_stays_bounded_under_clients_that_pipeline_without_reading() {
    // 16 connections each pipeline 8 READs of 32 MiB (4 GiB asked for)
    // and read nothing back. Without a budget each connection's pumps
    // held their buffers: ~2 GiB. The default budget is 256 MiB.
    const CONNS: usize = 16;
    const READS: u64 = 8;
    const LEN: u32 = 32 << 20;
    let (_g, pid, addr) = gateway("ram:64M", &[]);
    let before = rss_kib(pid);
    let mut conns: Vec<_> = (0..CONNS)
        .map(|_| {
            let mut s = raw::connect(&addr).expect("hello");
            raw::go(&mut s, "ipdisk");
            for i in 0..READS {
                raw::request(&mut s, raw::READ, i, (i % 2) * u64::from(LEN), LEN, &[]);
            }
            s
        })
        .collect();
    // Sample the gateway's memory while its replies cannot drain.
    let mut peak = before;
    for _ in 0..30 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        peak = peak.max(rss_kib(pid));
    }
    let grown_mib = (peak.saturating_sub(before)) / 1024;
    eprintln!(
        "gateway RSS {} MiB before, peak {} MiB",
        before / 1024,
        peak / 1024
    );
    assert!(
        grown_mib < 512,
        "gateway grew by {grown_mib} MiB with replies not drained (budget 256 MiB)"
    );
    // Nothing was dropped: every READ comes back whole once the clients
    // read (all at once: the budget is held by replies not yet read).
    let readers: Vec<_> = conns
        .drain(..)
        .map(|mut s| {
            std::thread::spawn(move || {
                let mut data = vec![0u8; LEN as usize];
                let mut cookies = Vec::new();
                for _ in 0..READS {
                    let (err, cookie) = raw::reply(&mut s);
                    assert_eq!(err, 0, "READ {cookie} failed");
                    std::io::Read::read_exact(&mut s, &mut data).expect("READ data");
                    cookies.push(cookie);
                }
                cookies.sort_unstable();
                cookies
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.join().expect("reader"), (0..READS).collect::<Vec<_>>());
    }
}

#[test]
fn nbd_gateway_refuses_connections_over_its_limit_and_admits_after_one_leaves() {
    let (_g, _pid, addr) = gateway("ram:4M", &["--nbd-max-connections", "4"]);
    let mut open: Vec<_> = (0..4)
        .map(|_| raw::connect(&addr).expect("within the limit"))
        .collect();
    raw::go(&mut open[0], "ipdisk");
    // The fifth is closed without a hello.
    assert!(
        raw::connect(&addr).is_none(),
        "a fifth connection was served"
    );
    // The four still work.
    raw::request(&mut open[0], raw::READ, 1, 0, 4096, &[]);
    assert_eq!(raw::reply(&mut open[0]), (0, 1));
    // One leaves: a new one is admitted (bounded wait for the close to land).
    drop(open.pop());
    let mut admitted = false;
    for _ in 0..50 {
        if let Some(mut s) = raw::connect(&addr) {
            raw::go(&mut s, "ipdisk");
            admitted = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(admitted, "no connection admitted after one left");
}

#[test]
fn nbd_gateway_closes_a_connection_that_stalls_its_handshake() {
    // The default handshake timeout (10 s): a client that connects and
    // says nothing, and one that stops after its flags, are both closed;
    // a negotiated connection that idles just as long stays open.
    let (_g, _pid, addr) = gateway("ram:4M", &[]);
    let mut silent = raw::connect(&addr).expect("hello");
    let mut partial = raw::connect(&addr).expect("hello");
    std::io::Write::write_all(&mut partial, &3u32.to_be_bytes()).expect("flags");
    let mut good = raw::connect(&addr).expect("hello");
    raw::go(&mut good, "ipdisk");
    // The read timeout is 20 s: a gateway that never closes fails here.
    let t = std::time::Instant::now();
    assert!(raw::closed(&mut silent), "silent client not closed");
    assert!(raw::closed(&mut partial), "stalled handshake not closed");
    eprintln!("stalled handshakes closed after {:?}", t.elapsed());
    raw::request(&mut good, raw::READ, 9, 0, 4096, &[]);
    assert_eq!(
        raw::reply(&mut good),
        (0, 9),
        "negotiated connection closed"
    );
}

#[test]
fn idle_nbd_connections_hold_no_threads_and_wake_when_used() {
    // 100 connections that said nothing yet and 100 negotiated and idle:
    // one thread each (or five, with pumps) before; none now.
    let (_g, pid, addr) = gateway("ram:4M", &[]);
    let base = threads(pid);
    let _silent: Vec<_> = (0..100)
        .map(|_| raw::connect(&addr).expect("hello"))
        .collect();
    let mut idle: Vec<_> = (0..100)
        .map(|_| {
            let mut s = raw::connect(&addr).expect("hello");
            raw::go(&mut s, "ipdisk");
            raw::request(&mut s, raw::READ, 1, 0, 4096, &[]);
            assert_eq!(raw::reply(&mut s), (0, 1));
            let mut d = vec![0u8; 4096];
            std::io::Read::read_exact(&mut s, &mut d).expect("data");
            s
        })
        .collect();
    // Bounded wait for the served connections to go idle (after 2 s
    // without a request).
    let mut now = usize::MAX;
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        now = threads(pid);
        if now <= base + 2 {
            break;
        }
    }
    eprintln!("gateway threads: {base} before, {now} with 200 idle connections");
    assert!(
        now <= base + 2,
        "{now} threads for 200 idle connections ({base} before)"
    );
    // Each idle connection still answers.
    for (i, s) in idle.iter_mut().enumerate().step_by(7) {
        raw::request(s, raw::READ, i as u64, 4096, 4096, &[]);
        assert_eq!(raw::reply(s), (0, i as u64));
        let mut d = vec![0u8; 4096];
        std::io::Read::read_exact(s, &mut d).expect("data");
    }
}

#[test]
fn nbd_read_and_trim_past_the_end_are_einval() {
    // The spec: EINVAL for a read or trim past the end, ENOSPC for a
    // write (of data or zeros) past it.
    let (_g, _pid, addr) = gateway("ram:4M", &[]);
    let mut s = raw::connect(&addr).expect("hello");
    raw::go(&mut s, "ipdisk");
    let end = 4u64 << 20;
    raw::request(&mut s, raw::READ, 1, end - 512, 1024, &[]);
    assert_eq!(raw::reply(&mut s), (22, 1), "READ past the end");
    raw::request(&mut s, raw::TRIM, 2, end, 512, &[]);
    assert_eq!(raw::reply(&mut s), (22, 2), "TRIM past the end");
    raw::request(&mut s, raw::WRITE, 3, end, 512, &[0u8; 512]);
    assert_eq!(raw::reply(&mut s), (28, 3), "WRITE past the end");
    raw::request(&mut s, raw::WRITE_ZEROES, 4, end - 512, 1024, &[]);
    assert_eq!(raw::reply(&mut s), (28, 4), "WRITE_ZEROES past the end");
    raw::request(&mut s, raw::READ, 5, end - 512, 512, &[]);
    assert_eq!(raw::reply(&mut s), (0, 5), "still in sync");
    if have("nbdsh") {
        let uri = format!("nbd://{addr}/ipdisk");
        let o = Command::new("nbdsh")
            .env("PATH", system_path())
            .args(["-u", &uri, "-c", &format!("h.pread(1024, {})", end - 512)])
            .output()
            .expect("nbdsh");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("Invalid argument"),
            "{err}"
        );
    }
}

#[test]
fn dvd_set_with_a_range_outside_the_device_says_so() {
    let (_disk, lines) = start(
        &[
            "disk",
            "--backing",
            "ram:4M",
            "--owner-key",
            "0x77",
            "--exit-after",
            "60s",
        ],
        1,
    );
    let disk_addr = after(&lines[0], "on");
    let peer = [
        "disk-cli",
        "--peer",
        disk_addr.as_str(),
        "--disk-key",
        "0x77",
    ];
    let (ok, out, err) = vk(&[&peer[..], &["dvd-set", "base=8000,len=1000,ro,allow=any"]].concat());
    assert!(!ok, "{out}");
    assert!(
        err.contains("8192 blocks") && err.contains("8000"),
        "no clear range error: {err}"
    );
    // Inside the device it still works.
    let (ok, out, err) = vk(&[&peer[..], &["dvd-set", "base=100,len=100,ro,allow=any"]].concat());
    assert!(ok && out.contains("set"), "{out}{err}");
}

// ------------------------------------------- a disk that restarts

#[test]
fn nbd_gateway_finds_a_restarted_disk_and_the_workload_finishes_intact() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    let dir = tmp("restart");
    let backing = format!("file:{}:8M", dir.join("disk.img").display());
    let disk = |bind: &str| file_disk(&backing, "0x99", bind);
    let (mut first, lines) = disk("127.0.0.1:0");
    let disk_addr = after(&lines[0], "on");
    let (_gw, glines) = gateway_to(&disk_addr, "0x99");
    let nbd = after(&glines[0], "on");

    // A writer fills the disk with 128 blocks of 64 KiB, one request at a
    // time, while the disk is killed and started again under it.
    const BLOCKS: u64 = 128;
    const BLOCK: usize = 64 << 10;
    let block = |i: u64| -> Vec<u8> {
        (0..BLOCK)
            .map(|j| (i as usize * 31 + j * 7 % 253) as u8)
            .collect()
    };
    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let done = done.clone();
        let nbd = nbd.clone();
        std::thread::spawn(move || {
            let mut s = raw::connect(&nbd).expect("hello");
            raw::go(&mut s, "ipdisk");
            for i in 0..BLOCKS {
                raw::request(
                    &mut s,
                    raw::WRITE,
                    i,
                    i * BLOCK as u64,
                    BLOCK as u32,
                    &block(i),
                );
                let r = raw::reply(&mut s);
                if r != (0, i) {
                    return Err(format!("write {i}: {r:?}"));
                }
                done.store(i + 1, Ordering::Release);
                // Pace the writes so the restart falls in the middle.
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(s)
        })
    };
    common::wait_for(Duration::from_secs(30), "no writes got through", || {
        (done.load(Ordering::Acquire) >= 20).then_some(())
    });
    first.0.kill().expect("kill the disk");
    let _ = first.0.wait();
    let at_kill = done.load(Ordering::Acquire);
    std::thread::sleep(Duration::from_millis(300));
    let (_second, _) = disk(&disk_addr);

    let mut s = writer
        .join()
        .expect("writer")
        .expect("every write answered");
    assert!(at_kill < BLOCKS, "the restart fell after the workload");
    // Every block reads back as written.
    for i in 0..BLOCKS {
        raw::request(
            &mut s,
            raw::READ,
            1000 + i,
            i * BLOCK as u64,
            BLOCK as u32,
            &[],
        );
        assert_eq!(raw::reply(&mut s), (0, 1000 + i), "read {i}");
        let mut got = vec![0u8; BLOCK];
        std::io::Read::read_exact(&mut s, &mut got).expect("read data");
        assert!(got == block(i), "block {i} differs after the restart");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 19 item 4 with a real NBD client: an fio job writing through the
/// gateway (with checksums it verifies afterwards) while the disk is
/// killed with SIGKILL and started again on the same file. The job
/// finishes without an I/O error and every block verifies.
#[test]
fn fio_through_the_gateway_survives_a_disk_restart() {
    use std::time::Duration;

    if Command::new("fio").arg("--version").output().is_err() {
        panic!("fio is not installed (bash .ci/deps installs it)");
    }
    let dir = tmp("fio-restart");
    let backing = format!("file:{}:16M", dir.join("disk.img").display());
    let disk = |bind: &str| file_disk(&backing, "0x77", bind);
    let (mut first, lines) = disk("127.0.0.1:0");
    let disk_addr = after(&lines[0], "on");
    let (_gw, glines) = gateway_to(&disk_addr, "0x77");
    let uri = format!("nbd://{}", after(&glines[0], "on"));
    let log = dir.join("fio.log");
    // 2,048 random 4 KiB writes, 8 in flight, paced to about 2 s so the
    // restart falls in the middle; then fio reads every block back and
    // checks its CRC.
    let mut fio = Proc(
        Command::new("fio")
            .args([
                "--name=restart",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randwrite",
                "--bs=4k",
                "--size=8M",
                "--iodepth=8",
                "--rate_iops=1000",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--do_verify=1",
                &format!("--output={}", log.display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fio"),
    );
    std::thread::sleep(Duration::from_millis(600));
    first.0.kill().expect("kill the disk");
    let _ = first.0.wait();
    std::thread::sleep(Duration::from_millis(300));
    let (_second, _) = disk(&disk_addr);
    let status = common::wait_for(
        Duration::from_secs(60),
        "fio did not finish after the restart",
        || fio.0.try_wait().expect("fio status"),
    );
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let mut err = String::new();
    if let Some(mut e) = fio.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(
        status.success(),
        "fio failed across the restart: {err}\n{out}"
    );
    assert!(out.contains("err= 0"), "fio reported errors: {out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A disk logs its clients at info by default (RUST_LOG unset): the NBD
/// connection with its address and export, its close, and a client the
/// owner's key refuses; as plain text, with no colour codes in a pipe.
#[test]
fn a_disk_logs_its_clients_and_refusals_at_info() {
    let dir = tmp("log");
    let log = dir.join("disk.log");
    let mut c = Command::new(BIN)
        .args([
            "disk",
            "--backing",
            "ram:4M",
            "--owner-key",
            "0x77",
            "--nbd",
            "127.0.0.1:0",
            "--exit-after",
            "60s",
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn vkernel disk");
    let mut r = BufReader::new(c.stdout.take().expect("stdout"));
    let mut lines = vec![String::new(), String::new()];
    for l in &mut lines {
        r.read_line(l).expect("banner");
    }
    let disk = Proc(c);
    let disk_addr = after(&lines[0], "on");
    let nbd = after(&lines[1], "on");
    // A client with the wrong key, then (if installed) a real NBD client.
    let (ok, _, _) = vk(&[
        "disk-cli",
        "--peer",
        &disk_addr,
        "--disk-key",
        "0x78",
        "capacity",
    ]);
    assert!(!ok, "a wrong key opened the disk");
    let qemu = have("qemu-img");
    if qemu {
        let o = Command::new("qemu-img")
            .env("PATH", system_path())
            .args(["info", &format!("nbd://{nbd}")])
            .output()
            .expect("qemu-img");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    common::stop_with_sigterm(disk);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(" INFO "), "{text}");
    assert!(!text.contains('\x1b'), "colour codes in a pipe: {text:?}");
    assert!(
        text.contains("may not open DVD 0: not authorised"),
        "{text}"
    );
    if qemu {
        for want in [
            " from 127.0.0.1:",
            "(1 open)",
            ": export \"ipdisk\" (4194304 bytes)",
            "closed after",
        ] {
            assert!(text.contains(want), "no {want:?} in:\n{text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
