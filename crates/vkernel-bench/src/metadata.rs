//! Section 16: metadata workloads (git clone and status, tar, a
//! configure-like stat storm, sqlite, rm -rf) on a local directory, the V
//! FUSE mount, bindfs (a plain FUSE passthrough: what FUSE itself costs
//! here) and sshfs, same run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use vkernel::Kernel;
use vkernel_fs::client::Client;
use vkernel_fs::fuse::{self, FuseOptions};
use vkernel_fs::server::{FileServer, ServerConfig};

use crate::files::{sshfs_mount, Scratch};
use crate::report::{Goal, SectionReport};
use crate::section::{Ctx, Outcome, Section};

/// One workload's wall time (ms) on each file system; `None`: not run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Workload {
    /// What ran.
    pub what: String,
    /// A local directory of this machine.
    pub local_ms: f64,
    /// The V mount (file server and FUSE client on two logical hosts of
    /// this process, loopback UDP).
    pub vmount_ms: Option<f64>,
    /// sshfs on a private sshd on loopback.
    pub sshfs_ms: Option<f64>,
    /// bindfs of the same export: FUSE with no network behind it.
    #[serde(default)]
    pub bindfs_ms: Option<f64>,
}

/// Section 16's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metadata {
    /// Files in the generated source tree.
    pub files: usize,
    /// The workloads, in the order run.
    pub workloads: Vec<Workload>,
    /// Why the V mount, bindfs or sshfs did not run, if so.
    pub skipped: Vec<String>,
    /// Rounds each time is the median of (1 before rounds were kept).
    #[serde(default = "one")]
    pub rounds: usize,
}

fn one() -> usize {
    1
}

/// Rounds of every workload on every file system (medians reported).
const ROUNDS: usize = 3;

/// The workloads, each a shell script run in the file system's directory
/// (`$SRC` is the generated git repository, on the local disk).
const STEPS: [(&str, &str); 6] = [
    ("git clone", "git clone -q \"$SRC\" w"),
    ("git status", "cd w && git status --porcelain >/dev/null"),
    ("tar c | tar t", "tar cf - w | tar tf - >/dev/null"),
    (
        "stat storm (configure-like)",
        "cd w && find . -type f | xargs stat -c %s >/dev/null && \
         i=0; while [ $i -lt 300 ]; do test -e conf$i.h || :; i=$((i+1)); done",
    ),
    (
        "sqlite insert + VACUUM",
        "sqlite3 db \"pragma journal_mode=wal; create table t(k integer primary key, v text); \
         begin; $(i=0; while [ $i -lt 400 ]; do printf \"insert into t(v) values('r%s');\" $i; \
         i=$((i+1)); done) commit; pragma wal_checkpoint(truncate); vacuum;\" >/dev/null",
    ),
    ("rm -rf", "rm -rf w db db-wal db-shm"),
];

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `script` in `dir`; its wall time in ms.
fn timed(dir: &Path, src: &Path, script: &str) -> Result<f64, String> {
    let t = Instant::now();
    let o = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .env("SRC", src)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !o.status.success() {
        return Err(format!(
            "`{script}` in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(ms)
}

/// Every step in `dir`, in order.
fn run_all(dir: &Path, src: &Path) -> Result<Vec<f64>, String> {
    STEPS.iter().map(|(_, s)| timed(dir, src, s)).collect()
}

/// A git repository of `files` small files in 20 directories.
fn make_source(src: &Path, files: usize) -> Result<(), String> {
    for i in 0..files {
        let d = src.join(format!("dir{}", i % 20));
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        let body = format!("/* file {i} */\nint f{i}(void) {{ return {i}; }}\n").repeat(1 + i % 7);
        std::fs::write(d.join(format!("f{i}.c")), body).map_err(|e| e.to_string())?;
    }
    let git = |args: &[&str]| -> Result<(), String> {
        let o = Command::new("git")
            .args(args)
            .current_dir(src)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", src)
            .env("GIT_AUTHOR_NAME", "V")
            .env("GIT_AUTHOR_EMAIL", "v@example.org")
            .env("GIT_COMMITTER_NAME", "V")
            .env("GIT_COMMITTER_EMAIL", "v@example.org")
            .output()
            .map_err(|e| e.to_string())?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "git {args:?}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    };
    git(&["init", "-q", "-b", "main", "."])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "tree"])
}

/// The V mount's target against local disk for a workload (issue 51):
/// what a user would take for "as fast as local" on each.
fn local_target(what: &str) -> f64 {
    match what {
        "git clone" | "rm -rf" | "sqlite insert + VACUUM" => 2.0,
        _ => 1.5,
    }
}

/// A bindfs mount, unmounted on drop.
struct Bindfs(std::path::PathBuf);

impl Drop for Bindfs {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.0)
            .stderr(Stdio::null())
            .status();
    }
}

/// Mounts `export` at `mnt` with bindfs (Debian: bindfs), as it comes.
fn bindfs_mount(export: &Path, mnt: &Path) -> Result<Bindfs, String> {
    if !have("bindfs") {
        return Err("not installed (package bindfs)".into());
    }
    let o = Command::new("bindfs")
        .arg(export)
        .arg(mnt)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("bindfs: {e}"))?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
    }
    Ok(Bindfs(mnt.to_path_buf()))
}

pub(crate) fn section(c: &mut Ctx) -> Result<Outcome, String> {
    Section::Metadata
        .heading("(metadata workloads: local directory, V mount, bindfs, sshfs; same run)");
    for t in ["git", "tar", "sqlite3", "find", "xargs", "stat"] {
        if !have(t) {
            return Err(format!("{t} is not installed"));
        }
    }
    let files = if c.quick { 200 } else { 1500 };
    let work = Scratch(std::env::temp_dir().join(format!(
        "vkbench-meta-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    )));
    let (src, local, export, vmnt, smnt, bmnt) = (
        work.0.join("src"),
        work.0.join("local"),
        work.0.join("export"),
        work.0.join("vmnt"),
        work.0.join("smnt"),
        work.0.join("bmnt"),
    );
    for d in [&src, &local, &export, &vmnt, &smnt, &bmnt] {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    make_source(&src, files)?;
    let rounds = if c.quick { 1 } else { ROUNDS };
    crate::outln!(
        "  a git repository of {files} small files in 20 directories; each workload's wall time, \
         caches warm from the steps before it; median of {rounds} rounds, the file systems \
         alternating in each; file server and FUSE client on two logical hosts of this process \
         (loopback UDP, default waiting), the mount's defaults (the server reports changes; \
         caches live 10 s; the kernel keeps listings)"
    );
    let mut skipped = Vec::new();
    // The V mount, as `vkernel mount` makes it.
    let ka = Kernel::start(vkernel::KernelConfig::default()).map_err(|e| e.to_string())?;
    let kb = Kernel::start(vkernel::KernelConfig {
        peers: vec![ka.local_addr()],
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    ka.add_peer(kb.local_addr());
    let srv =
        FileServer::start(&ka, &export, ServerConfig::default()).map_err(|e| e.to_string())?;
    let client = Arc::new(Client::connect(&kb, srv.pid(), 8).map_err(|e| e.to_string())?);
    let mut vsession = fuse::mount(
        &kb,
        client,
        &vmnt,
        &FuseOptions {
            fsname: "vkernel-bench".into(),
            ..FuseOptions::default()
        },
    )
    .map_err(|e| skipped.push(format!("V mount: FUSE mount: {e}")))
    .ok();
    let bguard = bindfs_mount(&export, &bmnt)
        .map_err(|e| skipped.push(format!("bindfs: {e}")))
        .ok();
    let sguard = sshfs_mount(&work.0, &export, &smnt)
        .map_err(|e| skipped.push(format!("sshfs: {e}")))
        .ok();
    // Per file system, per step: the round's times; `None` once a step
    // failed (reported, and that file system is not run again).
    let mut times: [Option<Vec<Vec<f64>>>; 4] = [
        Some(Vec::new()),
        vsession.as_ref().map(|_| Vec::new()),
        bguard.as_ref().map(|_| Vec::new()),
        sguard.as_ref().map(|_| Vec::new()),
    ];
    let dirs = [
        local.clone(),
        vmnt.clone(),
        bmnt.clone(),
        sguard.as_ref().map_or(smnt.clone(), |m| m.mnt.clone()),
    ];
    let names = ["local", "V mount", "bindfs", "sshfs"];
    for round in 0..rounds {
        for k in 0..4 {
            // Alternate the order, so no file system always runs first.
            let fs = (k + round) % 4;
            let Some(t) = times[fs].as_mut() else {
                continue;
            };
            match run_all(&dirs[fs], &src) {
                Ok(ms) => t.push(ms),
                Err(e) if fs == 0 => return Err(e),
                Err(e) => {
                    skipped.push(format!("{}: {e}", names[fs]));
                    times[fs] = None;
                }
            }
        }
    }
    if let Some(s) = vsession.take() {
        let _ = fuse::unmount(s, &vmnt);
    }
    drop(bguard);
    drop(sguard);
    let med = |fs: usize| -> Option<Vec<f64>> {
        let t = times[fs].as_ref()?;
        Some(
            (0..STEPS.len())
                .map(|i| {
                    let mut v: Vec<f64> = t.iter().map(|r| r[i]).collect();
                    crate::stats::median(&mut v)
                })
                .collect(),
        )
    };
    let (local_ms, v, b, s) = match med(0) {
        Some(l) => (l, med(1), med(2), med(3)),
        None => return Err("the local directory's workloads did not run".into()),
    };
    crate::outln!(
        "  {:<28} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}",
        "workload, ms",
        "local",
        "V mount",
        "bindfs",
        "sshfs",
        "V/local",
        "V/bindfs",
        "sshfs/V"
    );
    let mut workloads = Vec::new();
    let mut goals = Vec::new();
    for (i, (what, _)) in STEPS.iter().enumerate() {
        let (l, vm, sm, bm) = (
            local_ms[i],
            v.as_ref().map(|x| x[i]),
            s.as_ref().map(|x| x[i]),
            b.as_ref().map(|x| x[i]),
        );
        let cell = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}×", a / b.max(1e-9)),
            _ => "-".into(),
        };
        crate::outln!(
            "  {what:<28} {l:>10.1} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}",
            cell(vm),
            cell(bm),
            cell(sm),
            ratio(vm, Some(l)),
            ratio(vm, bm),
            ratio(sm, vm)
        );
        if let Some(vm) = vm {
            goals.push(Goal::at_most(
                &format!("{what}: V mount / local"),
                vm / l.max(1e-9),
                local_target(what),
                "×",
            ));
            if let Some(bm) = bm {
                goals.push(Goal::at_most(
                    &format!("{what}: V mount / bindfs"),
                    vm / bm.max(1e-9),
                    0.5,
                    "×",
                ));
            }
        }
        workloads.push(Workload {
            what: (*what).into(),
            local_ms: l,
            vmount_ms: vm,
            sshfs_ms: sm,
            bindfs_ms: bm,
        });
    }
    for e in &skipped {
        crate::outln!("  skipped: {e}");
    }
    drop(srv);
    Ok(Outcome {
        report: SectionReport::Metadata(Metadata {
            files,
            workloads,
            skipped,
            rounds,
        }),
        goals,
        charts: Vec::new(),
    })
}
