//! Section 11: the file service. 4 KiB page reads and writes through
//! the file server over V, sequential throughput through the FUSE mount
//! beside the same files read locally and through sshfs (Debian's sshfs
//! against a private sshd on loopback), and program-load times.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkernel::Kernel;
use vkernel_fs::client::Client;
use vkernel_fs::fuse::{self, FuseOptions};
use vkernel_fs::server::{FileServer, ServerConfig};

use crate::paper;
use crate::report::{
    Files, FilesPaper, Latency, Measured, ProgramLoad, ReadWrite, SectionReport, SequentialFiles,
};
use crate::section::{Ctx, Outcome, Section};
use crate::stats::Summary;

/// Median and p99 in µs.
fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    let s = Summary::of(&mut v);
    (s.median_us, s.p99_us)
}

/// A scratch directory removed on drop.
pub(crate) struct Scratch(pub(crate) PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed on drop.
struct Kid(Child);
impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An sshfs mount unmounted on drop (with the sshd it talks to).
pub(crate) struct Sshfs {
    pub(crate) mnt: PathBuf,
    _sshd: Kid,
}
impl Drop for Sshfs {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `cmd` with no input; its first line of stderr as the error.
pub(crate) fn run_quiet(cmd: &mut Command) -> Result<(), String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{name}: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("failed")
        ))
    }
}

/// Starts a private sshd on a free loopback port and mounts `export`
/// at `mnt` with sshfs.
pub(crate) fn sshfs_mount(work: &Path, export: &Path, mnt: &Path) -> Result<Sshfs, String> {
    for t in ["/usr/sbin/sshd", "/usr/bin/sshfs", "/usr/bin/ssh-keygen"] {
        if !Path::new(t).exists() {
            return Err(format!(
                "{t} not installed (packages openssh-server, sshfs)"
            ));
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let key = |name: &str| -> Result<PathBuf, String> {
        let p = work.join(name);
        run_quiet(
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(&p),
        )?;
        Ok(p)
    };
    let host_key = key("host_key")?;
    let id = key("id")?;
    std::fs::copy(id.with_extension("pub"), work.join("authorized_keys"))
        .map_err(|e| e.to_string())?;
    let _ = std::fs::create_dir_all("/run/sshd");
    let cfg = work.join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
             PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile {}\n\
             Subsystem sftp internal-sftp\n",
            host_key.display(),
            work.join("authorized_keys").display(),
            work.join("sshd.pid").display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let sshd = Kid(Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-f"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("sshd: {e}"))?);
    // Wait for it to listen.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("sshd did not start listening".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    run_quiet(
        Command::new("sshfs")
            .arg(format!("{user}@127.0.0.1:{}", export.display()))
            .arg(mnt)
            .args(["-p", &port.to_string(), "-o"])
            .arg(format!(
                "IdentityFile={},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes",
                id.display()
            )),
    )?;
    Ok(Sshfs {
        mnt: mnt.to_path_buf(),
        _sshd: sshd,
    })
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ seed)
        .collect()
}

/// Reads `path` in 1 MiB reads; MB/s.
fn read_mbps(path: &Path) -> Result<f64, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut n = 0usize;
    loop {
        let k = f.read(&mut buf).map_err(|e| e.to_string())?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64() / 1e6)
}

/// Writes `data` to `path` in 1 MiB writes and fsyncs; MB/s.
fn write_mbps(path: &Path, data: &[u8]) -> Result<f64, String> {
    let t = Instant::now();
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for c in data.chunks(1 << 20) {
        f.write_all(c).map_err(|e| e.to_string())?;
    }
    f.sync_all().map_err(|e| e.to_string())?;
    Ok(data.len() as f64 / t.elapsed().as_secs_f64() / 1e6)
}

fn median(mut v: Vec<f64>) -> f64 {
    crate::stats::median(&mut v)
}

/// Remote 32-byte exchanges between `kb` and an echo process on `ka`
/// (same hosts and waiting as the file service); median µs.
fn null_exchange(ka: &Kernel, kb: &Kernel, n: usize) -> Result<f64, String> {
    let (echo, h) = ka
        .spawn("fsbench-echo", |p| {
            let mut m = vkernel::Message::zero();
            while let Ok(i) = p.receive(&mut m) {
                let stop = m.code() == 0xdead;
                let _ = p.reply(&m, i.from);
                if stop {
                    return;
                }
            }
        })
        .map_err(|e| e.to_string())?;
    let c = kb.create_process().map_err(|e| e.to_string())?;
    let mut t = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let mut m = vkernel::Message::with_code(1);
        let s = Instant::now();
        c.send(&mut m, echo).map_err(|e| e.to_string())?;
        if i >= n / 10 {
            t.push(s.elapsed());
        }
    }
    let mut m = vkernel::Message::with_code(0xdead);
    let _ = c.send(&mut m, echo);
    let _ = h.join();
    Ok(stats(t).0)
}

/// Section 11, on two logical hosts of its own with blocking waits (a
/// file server's workers, FUSE threads and busy-polling processes would
/// starve each other on two CPUs); the exchange and the penalty it is
/// compared with are measured here in that same mode.
pub(crate) fn section(c: &mut Ctx) -> Result<Outcome, String> {
    let (quick, n) = (c.quick, c.n.min(2000));
    Section::Files
        .heading("(V I/O file server, FUSE mount, program loading) beside local files and sshfs");
    let block = c.pl.blocking();
    // With blocking waits the wake-up noise can exceed the per-byte cost:
    // a negative slope is read as "no measurable per-byte cost".
    let ((per_byte_us, _), _) =
        crate::kernel_ops::penalty_fit(block, n, c.warm, &[76, 1100, 4172, 8192])?;
    let per_byte_us = per_byte_us.max(0.0);
    let kc = |peers: Vec<std::net::SocketAddr>| vkernel::KernelConfig {
        peers,
        spin: Duration::ZERO,
        ..Default::default()
    };
    let ka = &Kernel::start(kc(vec![])).map_err(|e| e.to_string())?;
    let kb = &Kernel::start(kc(vec![ka.local_addr()])).map_err(|e| e.to_string())?;
    ka.add_peer(kb.local_addr());
    let null_us = null_exchange(ka, kb, n)?;
    let work = Scratch(std::env::temp_dir().join(format!(
        "vkbench-fs-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    )));
    let root = work.0.join("export");
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
    let srv = FileServer::start(ka, &root, ServerConfig::default()).map_err(|e| e.to_string())?;
    let client = Arc::new(Client::connect(kb, srv.pid(), 8).map_err(|e| e.to_string())?);

    // 4 KiB pages.
    let file_len = 1usize << 20;
    std::fs::write(root.join("pages"), pattern(file_len, 1)).map_err(|e| e.to_string())?;
    let (fh, _) = client
        .open("pages", libc::O_RDWR, 0)
        .map_err(|e| e.to_string())?;
    let mut page = vec![0u8; 4096];
    let pages = (file_len / 4096) as u64;
    let mut reads = Vec::with_capacity(n);
    let mut writes = Vec::with_capacity(n);
    for i in 0..(n + n / 10) as u64 {
        let off = (i * 37 % pages) * 4096;
        let t = Instant::now();
        client.read(fh, off, &mut page).map_err(|e| e.to_string())?;
        let d = t.elapsed();
        let t = Instant::now();
        client.write(fh, off, &page).map_err(|e| e.to_string())?;
        let w = t.elapsed();
        if i as usize >= n / 10 {
            reads.push(d);
            writes.push(w);
        }
    }
    let _ = client.close(fh);
    let (rm, rp) = stats(reads);
    let (wm, wp) = stats(writes);
    let expect = null_us + per_byte_us * 4096.0;
    crate::outln!("  mode: file server and client on two logical hosts of this process (loopback UDP), {}, everywhere (V, FUSE, sshfs, the exchange and raw UDP penalty alike)", block.describe());
    crate::outln!(
        "  {:<28} {:>12} {:>10} {:>22}",
        "4 KiB page over V",
        "median µs",
        "p99 µs",
        "vs exchange+penalty"
    );
    crate::outln!(
        "  {:<28} {rm:>12.2} {rp:>10.2} {:>21.2}×",
        "page read (READ)",
        rm / expect.max(1e-9)
    );
    crate::outln!(
        "  {:<28} {wm:>12.2} {wp:>10.2} {:>21.2}×",
        "page write (WRITE)",
        wm / expect.max(1e-9)
    );
    crate::outln!(
        "  (expected ≈ remote 32-byte exchange {null_us:.2} µs + 4096 B × {:.4} µs/B (raw UDP, blocking) = {expect:.2} µs; paper, 512-byte page remote: read {} / write {} ms on 10 Mb (1985), 5.56 / 5.60 ms on 3 Mb (1983) — today's 4 KiB read is {:.0}× faster than the 1985 512-byte read)",
        per_byte_us,
        paper::fmt(paper::PAGE_READ_1985.remote),
        paper::fmt(paper::PAGE_WRITE_1985.remote),
        paper::PAGE_READ_1985.remote.unwrap_or(0.0) * 1e3 / rm.max(1e-9)
    );

    // Program loading: a header read, then the image by MoveTo.
    let mut loads = Vec::new();
    let sizes: &[usize] = if quick {
        &[1 << 20, 16 << 20]
    } else {
        &[1 << 20, 64 << 20]
    };
    crate::outln!(
        "  {:<28} {:>12} {:>10} {:>10}",
        "program load",
        "median ms",
        "p99 ms",
        "MB/s"
    );
    for &sz in sizes {
        let mut img = b"\x7fELF".to_vec();
        img.extend(pattern(sz - 4, 2));
        let p = root.join(format!("prog-{sz}"));
        std::fs::write(&p, &img).map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let reps = if sz > (8 << 20) { 5 } else { 20 };
        let mut t = Vec::new();
        for _ in 0..reps {
            let s = Instant::now();
            let got = client
                .load_program(format!("prog-{sz}"), 1 << 30)
                .map_err(|e| e.to_string())?;
            t.push(s.elapsed());
            if got.image.len() != sz {
                return Err(format!(
                    "program load returned {} bytes of {sz}",
                    got.image.len()
                ));
            }
        }
        let (m, p99) = stats(t);
        let mbps = sz as f64 / (m / 1e6) / 1e6;
        crate::outln!(
            "  {:<28} {:>12.2} {:>10.2} {mbps:>10.0}",
            format!("{} MiB image", sz >> 20),
            m / 1e3,
            p99 / 1e3
        );
        loads.push(ProgramLoad {
            bytes: sz,
            median_us: m,
            p99_us: p99,
            mbps,
            cat_via_mount_ms: None,
        });
    }
    let (_, _, paper_load, _, _) = paper::LOADING_1985[3];
    crate::outln!(
        "  (paper: 64 KiB program by MoveTo, 64 KiB unit, remote {paper_load} ms on 10 Mb (1985) = {:.2} MB/s)",
        65536.0 / (paper_load / 1e3) / 1e6
    );

    // Sequential throughput: local directory, our FUSE mount, sshfs.
    let size = if quick { 16usize << 20 } else { 64 << 20 };
    let reps = 3;
    let data = pattern(size, 3);
    for r in 0..reps {
        // Files to read are written beside the server (server page cache
        // warm, client-side caches cold: each is read once per mount).
        std::fs::write(root.join(format!("seq-{r}")), &data).map_err(|e| e.to_string())?;
    }
    let mut local_r = Vec::new();
    let mut local_w = Vec::new();
    for r in 0..reps {
        local_r.push(read_mbps(&root.join(format!("seq-{r}")))?);
        local_w.push(write_mbps(&root.join(format!("local-w-{r}")), &data)?);
    }
    let mnt = work.0.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    let ours = match fuse::mount(
        kb,
        client.clone(),
        &mnt,
        &FuseOptions {
            fsname: "vkernel-bench".into(),
            ..FuseOptions::default()
        },
    ) {
        Ok(s) => {
            let mut rr = Vec::new();
            let mut ww = Vec::new();
            let mut err = None;
            // `cat` of each program image through the mount (read once,
            // client caches cold), beside the load_program times above.
            for (l, &sz) in loads.iter_mut().zip(sizes) {
                let s = Instant::now();
                match Command::new("cat")
                    .arg(mnt.join(format!("prog-{sz}")))
                    .stdout(Stdio::null())
                    .status()
                {
                    Ok(st) if st.success() => {
                        let ms = s.elapsed().as_secs_f64() * 1e3;
                        crate::outln!(
                            "  {:<28} {ms:>12.2} {:>10} {:>10.0}",
                            format!("cat {} MiB via V mount", sz >> 20),
                            "-",
                            sz as f64 / (ms / 1e3) / 1e6
                        );
                        l.cat_via_mount_ms = Some(ms);
                    }
                    other => err = Some(format!("cat via mount: {other:?}")),
                }
            }
            for r in 0..reps {
                match read_mbps(&mnt.join(format!("seq-{r}")))
                    .and_then(|x| write_mbps(&mnt.join(format!("v-w-{r}")), &data).map(|y| (x, y)))
                {
                    Ok((x, y)) => {
                        rr.push(x);
                        ww.push(y);
                    }
                    Err(e) => err = Some(e),
                }
            }
            let _ = fuse::unmount(s, &mnt);
            match err {
                Some(e) => Err(e),
                None => Ok((median(rr), median(ww))),
            }
        }
        Err(e) => Err(format!("FUSE mount: {e}")),
    };
    let smnt = work.0.join("smnt");
    std::fs::create_dir_all(&smnt).map_err(|e| e.to_string())?;
    let theirs = sshfs_mount(&work.0, &root, &smnt).and_then(|m| {
        let mut rr = Vec::new();
        let mut ww = Vec::new();
        for r in 0..reps {
            rr.push(read_mbps(&m.mnt.join(format!("seq-{r}")))?);
            ww.push(write_mbps(&m.mnt.join(format!("s-w-{r}")), &data)?);
        }
        drop(m);
        Ok((median(rr), median(ww)))
    });
    let (lr, lw) = (median(local_r), median(local_w));
    crate::outln!(
        "  {:<28} {:>12} {:>12} {:>12} {:>10} {:>10}",
        format!("sequential {} MiB, MB/s", size >> 20),
        "local dir",
        "V mount",
        "sshfs",
        "V/local",
        "V/sshfs"
    );
    let fmt = |r: &Result<(f64, f64), String>, read: bool| match r {
        Ok((a, b)) => format!("{:.0}", if read { *a } else { *b }),
        Err(_) => "-".into(),
    };
    let ratio = |a: &Result<(f64, f64), String>, b: f64, read: bool| match a {
        Ok((x, y)) => format!("{:.2}×", if read { *x } else { *y } / b.max(1e-9)),
        Err(_) => "-".into(),
    };
    let vs = |read: bool| match (&ours, &theirs) {
        (Ok(o), Ok(t)) => {
            let (a, b) = if read { (o.0, t.0) } else { (o.1, t.1) };
            format!("{:.2}×", a / b.max(1e-9))
        }
        _ => "-".into(),
    };
    for (label, read, local) in [("read", true, lr), ("write + fsync", false, lw)] {
        crate::outln!(
            "  {:<28} {:>12.0} {:>12} {:>12} {:>10} {:>10}",
            label,
            local,
            fmt(&ours, read),
            fmt(&theirs, read),
            ratio(&ours, local, read),
            vs(read)
        );
    }
    if let Err(e) = &ours {
        crate::outln!("  V mount skipped: {e}");
    }
    if let Err(e) = &theirs {
        crate::outln!("  sshfs skipped: {e}");
    }
    crate::outln!("  (files read once per mount: client caches cold, server page cache warm; median of {reps}; the local column is this machine's page cache)");
    let pair = |r: &Result<(f64, f64), String>| match r {
        Ok((a, b)) => Measured::Ok(ReadWrite {
            read_mbps: *a,
            write_mbps: *b,
        }),
        Err(e) => Measured::Skipped { skipped: e.clone() },
    };
    Ok(SectionReport::Files(Files {
        page_read: Latency {
            median_us: rm,
            p99_us: rp,
        },
        page_write: Latency {
            median_us: wm,
            p99_us: wp,
        },
        expected_us: expect,
        exchange_us: null_us,
        mode: block.describe(),
        paper_ms: FilesPaper {
            page_read_remote_1985: paper::PAGE_READ_1985.remote,
            page_write_remote_1985: paper::PAGE_WRITE_1985.remote,
            load_64k_remote_1985: paper_load,
        },
        program_load: loads,
        sequential: SequentialFiles {
            bytes: size,
            local: ReadWrite {
                read_mbps: lr,
                write_mbps: lw,
            },
            vmount: pair(&ours),
            sshfs: pair(&theirs),
        },
    })
    .into())
}
