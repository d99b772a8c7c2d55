//! The team server: loads programs from a file server and runs them.
//!
//! A RUN request names a file server and a program path on it. The team
//! server loads the image as V did — a header read, then the image by
//! MoveTo ([`vkernel_fs::client::Client::load_program`]) — and runs it as
//! an OS process in its own process group. The program's stdin, stdout
//! and stderr are V pipes on this host's pipe server whose outer ends are
//! handed to the client; pump processes copy between them and the OS
//! pipes. WAIT is answered (a delayed Reply) with the exit status. A job
//! whose client no longer exists is killed, with its whole process group:
//! killing `vkernel run` leaves no orphans.
//!
//! Messages (word 0 = request code; replies: word 0 = [`Status`]):
//!
//! | code | request | w1 | w2 | segment | reply |
//! |---|---|---|---|---|---|
//! | `0x544d01` | RUN | file server pid | | R: `path\0arg1\0arg2…` | w1 job, w2 stdin pipe, w3 stdout pipe, w4 stderr pipe, w5 pipe server, w6 OS pid |
//! | `0x544d02` | WAIT | job | | | w1 exit code (128+signal if killed), w2 signal |
//! | `0x544d03` | KILL | job | signal | | |
//! | `0x544d04` | LOAD | | | | w1 load average × 100, w2 jobs running, w3 CPUs |

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vkernel::{IpcError, Kernel, Message, Pid, Process, Segment};

use crate::msg::{exit_reply, reply_exit, status_reply, Load, Started, TeamRequest};
use crate::pipe::{End, PipeServer, Pipes};
use crate::Status;

/// RUN request code.
pub const RUN: u32 = 0x54_4d01;
/// WAIT request code.
pub const WAIT: u32 = 0x54_4d02;
/// KILL request code.
pub const KILL: u32 = 0x54_4d03;
/// LOAD request code (also answered to group queries).
pub const LOAD: u32 = 0x54_4d04;
/// Internal: a job's program ended (w1 job, w2 code, w3 signal).
pub(crate) const DONE: u32 = 0x54_4d05;

/// Most bytes of `path\0args` in a RUN request.
pub const MAX_ARGV: usize = 16 << 10;
/// Most jobs one team server runs at once.
pub const MAX_JOBS: usize = 64;
/// The service name team servers register under and whose well-known
/// group they join.
pub const SERVICE: &str = vkernel::service::TEAM;

/// The well-known group of team servers (for `run --on any`).
pub fn team_group() -> Pid {
    vkernel::service::group(SERVICE)
}

/// Policy and limits of a team server.
#[derive(Clone, Debug)]
pub struct TeamConfig {
    /// Refuse RUN requests from processes on other logical hosts.
    pub refuse_remote: bool,
    /// Only these principals may RUN (`None`: any).
    pub allowed_principals: Option<Vec<u32>>,
    /// Largest program image accepted.
    pub max_image: u64,
    /// How often a job checks that its client still exists.
    pub client_check: Duration,
    /// The machine host this team server is attached to: programs it
    /// starts get `VKERNEL_HOST` set to it, so a program that attaches
    /// (`Kernel::attach_default`, `--attach`) runs its processes on this
    /// host, as V processes of the host it was started on.
    pub machine_host: Option<std::path::PathBuf>,
}

impl Default for TeamConfig {
    fn default() -> Self {
        TeamConfig {
            refuse_remote: false,
            allowed_principals: None,
            max_image: 256 << 20,
            client_check: Duration::from_millis(200),
            machine_host: None,
        }
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The IPC failed (team server or its host gone).
    #[error("IPC: {0}")]
    Ipc(#[from] IpcError),
    /// The team server refused or could not run the program.
    #[error("team server: {0}")]
    Status(Status),
    /// A pipe failed while carrying the program's I/O.
    #[error("pipe: {0}")]
    Pipe(#[from] crate::pipe::PipeError),
    /// No team server answered.
    #[error("no team server found")]
    NoTeamServer,
}

/// How a program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Exit code; 128 + signal when a signal ended it (as shells report).
    pub code: i32,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
}

struct Job {
    client: Pid,
    os_pid: u32,
    done: Option<Exit>,
    waiter: Option<Pid>,
    in_pump: Pid,
    image: PathBuf,
}

/// A running team server (with its host's pipe server).
pub struct TeamServer {
    pid: Pid,
    pipes: PipeServer,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for TeamServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeamServer")
            .field("pid", &self.pid)
            .finish()
    }
}

impl TeamServer {
    /// Starts a team server and a pipe server on `kernel`'s host; the team
    /// server registers as [`SERVICE`] and joins [`team_group`].
    pub fn start(kernel: Arc<Kernel>, cfg: TeamConfig) -> Result<TeamServer, IpcError> {
        let pipes = PipeServer::start(&kernel)?;
        let p = kernel.create_process()?;
        let pid = p.pid();
        vkernel::service::register(&p, SERVICE, pid, vkernel::Scope::Any);
        p.join_group(team_group(), pid)?;
        let dir = tempfile::Builder::new()
            .prefix("vkernel-team-")
            .tempdir()
            .map_err(|_| IpcError::NoResources)?;
        let ps = Pipes {
            server: pipes.pid(),
        };
        let h = std::thread::Builder::new()
            .name("team-server".into())
            .spawn(move || {
                let mut s = Team {
                    k: kernel,
                    p,
                    cfg,
                    pipes: ps,
                    dir,
                    jobs: HashMap::new(),
                    next: 1,
                };
                s.serve();
            })
            .map_err(|_| IpcError::TableFull)?;
        Ok(TeamServer {
            pid,
            pipes,
            threads: vec![h],
        })
    }

    /// The team server's pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The pipe server it started.
    pub fn pipe_server(&self) -> Pid {
        self.pipes.pid()
    }

    /// Waits for the servers' threads (they end with the host).
    pub fn join(self) {
        for h in self.threads {
            let _ = h.join();
        }
        self.pipes.join();
    }
}

struct Team {
    k: Arc<Kernel>,
    p: Process,
    cfg: TeamConfig,
    pipes: Pipes,
    dir: tempfile::TempDir,
    jobs: HashMap<u32, Job>,
    next: u32,
}

impl Team {
    fn serve(&mut self) {
        let mut m = Message::zero();
        let mut seg = vec![0u8; MAX_ARGV];
        loop {
            let inc = match self.p.receive_with_segment(&mut m, &mut seg) {
                Ok(i) => i,
                Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => break,
                Err(e) => {
                    tracing::debug!("team server: receive: {e}");
                    continue;
                }
            };
            let args = &seg[..inc.seg_bytes.min(seg.len())];
            let r = match TeamRequest::decode(&m) {
                Some(TeamRequest::Load) => Some(self.load()),
                Some(TeamRequest::Run { fs }) => Some(match self.admit(&inc) {
                    Ok(()) => self.run(fs, inc.from, args),
                    Err(s) => status_reply(s),
                }),
                Some(TeamRequest::Wait { job }) => self.wait(job, inc.from),
                Some(TeamRequest::Kill { job, signal }) => Some(self.kill(job, signal, inc.from)),
                Some(TeamRequest::Done { job, exit }) if inc.from.host() == self.p.pid().host() => {
                    self.done(job, exit);
                    Some(status_reply(Status::OK))
                }
                _ => Some(status_reply(Status::ENOSYS)),
            };
            if let Some(r) = r {
                let _ = self.p.reply(&r, inc.from);
            }
        }
        // The host is going away: no job outlives its team server.
        for j in self.jobs.values() {
            kill_group(j.os_pid, libc::SIGKILL);
        }
    }

    fn admit(&self, inc: &vkernel::Incoming) -> Result<(), Status> {
        if self.cfg.refuse_remote && inc.from.host() != self.p.pid().host() {
            return Err(Status::EACCES);
        }
        if let Some(ok) = &self.cfg.allowed_principals {
            if !ok.contains(&inc.principal) {
                return Err(Status::EACCES);
            }
        }
        Ok(())
    }

    fn load(&self) -> Message {
        Load {
            load_x100: (vkernel::host::load_average() * 100.0).clamp(0.0, u32::MAX as f64) as u32,
            jobs: self.jobs.values().filter(|j| j.done.is_none()).count() as u32,
            cpus: vkernel::host::online_cpus() as u32,
        }
        .encode()
    }

    fn run(&mut self, fs: Pid, client: Pid, argv: &[u8]) -> Message {
        match self.start_job(fs, client, argv) {
            Ok(r) => r,
            Err(s) => status_reply(s),
        }
    }

    fn start_job(&mut self, fs: Pid, client: Pid, argv: &[u8]) -> Result<Message, Status> {
        if self.jobs.len() >= MAX_JOBS {
            return Err(Status::ENFILE);
        }
        let mut parts = argv.split(|&b| b == 0);
        let path = parts
            .next()
            .filter(|p| !p.is_empty())
            .ok_or(Status::EINVAL)?;
        let args: Vec<&[u8]> = parts.collect();
        // The header read and the MoveTo of the image.
        let fsc = vkernel_fs::client::Client::connect(&self.k, fs, 1).map_err(|e| {
            tracing::info!("team: file server {fs}: {e}");
            match e {
                vkernel_fs::client::ClientError::Server(s) => Status(s.0),
                _ => Status::ENOENT,
            }
        })?;
        let img = fsc
            .load_program(path, self.cfg.max_image)
            .map_err(|e| match e {
                vkernel_fs::client::ClientError::Server(s) => Status(s.0),
                _ => Status::ENOENT,
            })?;
        drop(fsc);
        let job = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        let file = self.dir.path().join(format!("job-{job}"));
        write_image(&file, &img.image).map_err(|_| Status::ECHILD)?;
        // The pump processes hold the inner pipe ends; the outer ends go
        // to the client.
        let mk = || self.k.create_process().map_err(|_| Status::ENFILE);
        let (pin, pout, perr, pwait) = (mk()?, mk()?, mk()?, mk()?);
        let pipe_in = self.pipes.create(&pin, 0).map_err(|_| Status::ENFILE)?;
        let pipe_out = self.pipes.create(&pout, 0).map_err(|_| Status::ENFILE)?;
        let pipe_err = self.pipes.create(&perr, 0).map_err(|_| Status::ENFILE)?;
        let handed = self
            .pipes
            .hand_off(&pin, pipe_in, End::Write, client)
            .and_then(|()| self.pipes.hand_off(&pout, pipe_out, End::Read, client))
            .and_then(|()| self.pipes.hand_off(&perr, pipe_err, End::Read, client));
        if handed.is_err() {
            let _ = std::fs::remove_file(&file);
            return Err(Status::EBADF);
        }
        let mut cmd = std::process::Command::new(&file);
        cmd.arg0(std::ffi::OsStr::from_bytes(path))
            .args(args.iter().map(|a| std::ffi::OsStr::from_bytes(a)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0);
        if let Some(h) = &self.cfg.machine_host {
            cmd.env(vkernel::attach::ENV, h);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::info!("team: cannot start {}: {e}", String::from_utf8_lossy(path));
                let _ = std::fs::remove_file(&file);
                return Err(if e.raw_os_error() == Some(libc::ENOEXEC) {
                    Status::ENOEXEC
                } else {
                    Status::ECHILD
                });
            }
        };
        let os_pid = child.id();
        let ps = self.pipes;
        let in_pump = pin.pid();
        if let Some(mut to) = child.stdin.take() {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; crate::pipe::CHUNK];
                loop {
                    match ps.read(&pin, pipe_in, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = ps.close(&pin, pipe_in, End::Read);
            });
        }
        let pump = |from: Option<Box<dyn Read + Send>>, p: Process, pipe: u32| {
            std::thread::spawn(move || {
                if let Some(mut from) = from {
                    copy_in(&mut *from, ps, &p, pipe);
                }
                let _ = ps.close(&p, pipe, End::Write);
            })
        };
        let out_h = pump(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            pout,
            pipe_out,
        );
        let err_h = pump(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            perr,
            pipe_err,
        );
        let team = self.p.pid();
        let check = self.cfg.client_check;
        std::thread::spawn(move || {
            let exit = supervise(&mut child, &pwait, client, check);
            let _ = out_h.join();
            let _ = err_h.join();
            let mut m = TeamRequest::Done { job, exit }.encode();
            let _ = pwait.send(&mut m, team);
        });
        self.jobs.insert(
            job,
            Job {
                client,
                os_pid,
                done: None,
                waiter: None,
                in_pump,
                image: file,
            },
        );
        Ok(Started {
            job,
            stdin: pipe_in,
            stdout: pipe_out,
            stderr: pipe_err,
            pipe_server: self.pipes.server,
            os_pid,
        }
        .encode())
    }

    fn wait(&mut self, job: u32, from: Pid) -> Option<Message> {
        let Some(j) = self.jobs.get_mut(&job) else {
            return Some(status_reply(Status::EBADF));
        };
        if j.client != from {
            return Some(status_reply(Status::EBADF));
        }
        match j.done {
            Some(e) => {
                self.jobs.remove(&job);
                Some(exit_reply(e))
            }
            None => {
                j.waiter = Some(from);
                None
            }
        }
    }

    fn kill(&mut self, job: u32, sig: i32, from: Pid) -> Message {
        match self.jobs.get(&job) {
            Some(j) if j.client == from => {
                if j.done.is_none() && (1..=64).contains(&sig) {
                    kill_group(j.os_pid, sig);
                }
                status_reply(Status::OK)
            }
            _ => status_reply(Status::EBADF),
        }
    }

    fn done(&mut self, job: u32, e: Exit) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.done = Some(e);
        let _ = std::fs::remove_file(&j.image);
        // The stdin pump may still wait on the client's pipe: end it.
        let _ = self.p.destroy(j.in_pump);
        if let Some(w) = j.waiter.take() {
            let _ = self.p.reply(&exit_reply(e), w);
            self.jobs.remove(&job);
        } else if !matches!(self.p.process_exists(j.client), Ok(true)) {
            // Nobody will ask.
            self.jobs.remove(&job);
        }
    }
}

/// Copies `from` into `pipe`, written by `p`, up to the end of the input
/// or a read error. False if the pipe refused a write.
fn copy_in(from: &mut dyn Read, pipes: Pipes, p: &Process, pipe: u32) -> bool {
    let mut buf = vec![0u8; crate::pipe::CHUNK];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return true,
            Ok(n) => {
                if pipes.write(p, pipe, &buf[..n]).is_err() {
                    return false;
                }
            }
        }
    }
}

fn write_image(path: &std::path::Path, image: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)?;
    f.write_all(image)?;
    f.sync_all()
}

/// Sends `sig` to the process group `pgid` (the job ran with
/// `process_group(0)`, so its group id is its pid).
fn kill_group(pgid: u32, sig: i32) {
    let Ok(g) = i32::try_from(pgid) else {
        return;
    };
    if g <= 1 {
        return;
    }
    // SAFETY: kill(2) takes no pointers; a negative pid names the group.
    unsafe {
        libc::kill(-g, sig);
    }
}

/// Waits for the program, killing its group if the client goes away.
fn supervise(child: &mut std::process::Child, p: &Process, client: Pid, check: Duration) -> Exit {
    let mut last = Instant::now();
    let mut killed = false;
    // A pidfd becomes readable when the program exits: the reply goes out
    // at once (polling every 5 ms added 2.5 ms on average). Kernels without
    // pidfds (before 5.3) fall back to polling.
    let pidfd = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .and_then(|pid| {
            rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
        });
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                // The program is gone; end anything it left in its group.
                kill_group(child.id(), libc::SIGKILL);
                return match st.signal() {
                    Some(s) => Exit {
                        code: 128 + s,
                        signal: Some(s),
                    },
                    None => Exit {
                        code: st.code().unwrap_or(-1),
                        signal: None,
                    },
                };
            }
            Ok(None) => {}
            Err(_) => {
                return Exit {
                    code: -1,
                    signal: None,
                }
            }
        }
        if !killed && last.elapsed() >= check {
            last = Instant::now();
            let gone = match p.process_exists(client) {
                Ok(live) => !live,
                Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => true,
                Err(_) => true,
            };
            if gone {
                tracing::info!("team: client {client} is gone; killing its job");
                kill_group(child.id(), libc::SIGKILL);
                killed = true;
            }
        }
        match &pidfd {
            // Until the exit, or the next look at the client.
            Some(fd) => {
                let wait = check.saturating_sub(last.elapsed());
                let wait = rustix::event::Timespec::try_from(wait.max(Duration::from_millis(1)))
                    .unwrap_or(rustix::event::Timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    });
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                let _ = rustix::event::poll(&mut fds, Some(&wait));
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Asks the team servers' group for their load (multi-reply) and returns
/// the least-loaded one's pid; stops at the first idle host (load below
/// `idle_load` per CPU), after `limit`, or after `max` replies.
pub fn select_team(
    p: &Process,
    max: usize,
    limit: Duration,
    idle_load: f64,
) -> Result<Pid, RunError> {
    let mut m = TeamRequest::Load.encode();
    m.set_group_mode(vkernel::GroupMode::Many);
    let t = Instant::now();
    let r = match p.send(&mut m, team_group()) {
        Ok(r) => r,
        Err(IpcError::Timeout(_)) => return Err(RunError::NoTeamServer),
        Err(e) => return Err(e.into()),
    };
    let rank = |m: &Message| {
        let l = Load::decode(m);
        (l.per_cpu(), l.jobs)
    };
    let (load, jobs) = rank(&m);
    let mut best = (load, jobs, r.from);
    let mut n = 1;
    while n < max.max(1) && t.elapsed() < limit && best.0 >= idle_load {
        match p.get_reply(&mut m) {
            Some(from) => {
                n += 1;
                let (load, jobs) = rank(&m);
                let c = (load, jobs, from);
                if c.0 < best.0 || (c.0 == best.0 && c.1 < best.1) {
                    best = c;
                }
            }
            None => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    Ok(best.2)
}

/// Runs `argv[0]` (a path on file server `fs`) through team server `team`,
/// with `stdin` fed to the program (`None`: it sees end of file at once)
/// and its output written to `stdout` and `stderr`. Returns how it ended.
pub fn run(
    kernel: &Kernel,
    team: Pid,
    fs: Pid,
    argv: &[Vec<u8>],
    stdin: Option<Box<dyn Read + Send>>,
    stdout: Box<dyn Write + Send>,
    stderr: Box<dyn Write + Send>,
) -> Result<Exit, RunError> {
    run_as(kernel, 0, team, fs, argv, stdin, stdout, stderr)
}

/// Like [`run`], with the RUN request sent as V principal `principal`
/// (a team server started with `--allow-principal` checks it).
#[allow(clippy::too_many_arguments)]
pub fn run_as(
    kernel: &Kernel,
    principal: u32,
    team: Pid,
    fs: Pid,
    argv: &[Vec<u8>],
    stdin: Option<Box<dyn Read + Send>>,
    stdout: Box<dyn Write + Send>,
    stderr: Box<dyn Write + Send>,
) -> Result<Exit, RunError> {
    let mut spec = Vec::new();
    for (i, a) in argv.iter().enumerate() {
        if i > 0 {
            spec.push(0);
        }
        spec.extend_from_slice(a);
    }
    if argv.is_empty() || spec.len() > MAX_ARGV {
        return Err(RunError::Status(Status::EINVAL));
    }
    let main = kernel.create_process()?;
    if principal != 0 {
        main.set_principal(principal);
    }
    let mut m = TeamRequest::Run { fs }.encode();
    main.send_with_segment(&mut m, team, Segment::Read(&spec))?;
    let s = Started::decode(&m).map_err(RunError::Status)?;
    let (job, pin, pout, perr) = (s.job, s.stdin, s.stdout, s.stderr);
    let pipes = Pipes {
        server: s.pipe_server,
    };
    // The outer ends were handed to `main`; pass them to one process per
    // stream so each can block on its own.
    let copy_out = |pipe: u32, mut to: Box<dyn Write + Send>| -> Result<JoinHandle<()>, RunError> {
        let p = kernel.create_process()?;
        pipes.hand_off(&main, pipe, End::Read, p.pid())?;
        Ok(std::thread::spawn(move || {
            let mut buf = vec![0u8; crate::pipe::CHUNK];
            while let Ok(n) = pipes.read(&p, pipe, &mut buf) {
                if n == 0 || to.write_all(&buf[..n]).is_err() {
                    break;
                }
                let _ = to.flush();
            }
            let _ = to.flush();
            let _ = pipes.close(&p, pipe, End::Read);
        }))
    };
    let ho = copy_out(pout, stdout)?;
    let he = copy_out(perr, stderr)?;
    match stdin {
        Some(mut input) => {
            let p = kernel.create_process()?;
            pipes.hand_off(&main, pin, End::Write, p.pid())?;
            // Detached: a program that never reads stdin must not keep us.
            std::thread::spawn(move || {
                if copy_in(&mut *input, pipes, &p, pin) {
                    let _ = pipes.close(&p, pin, End::Write);
                }
            });
        }
        None => pipes.close(&main, pin, End::Write)?,
    }
    let _ = ho.join();
    let _ = he.join();
    let mut w = TeamRequest::Wait { job }.encode();
    main.send(&mut w, team)?;
    reply_exit(&w).map_err(RunError::Status)
}
