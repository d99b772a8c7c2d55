//! `vkernel teamserver` and `vkernel run`: program loading and remote
//! execution (docs/EXEC.md).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use vkernel::service::FILESERVER;
use vkernel_team::team::{self, TeamConfig, TeamServer};

use crate::hostopts::{wait_exit, HostOpts};
use crate::mount::locate_service;
use crate::units::Size;

/// Arguments of `vkernel teamserver`.
///
/// Runs a team server and a pipe server on a logical host. The team server
/// loads programs from a file server (a header read, then the image by
/// MoveTo), runs them as OS processes with stdin, stdout and stderr over
/// V pipes, returns their exit status, and kills a program (with its
/// process group) when the client that started it is gone. Team servers
/// join a well-known group, so `vkernel run --on any` finds the least
/// loaded one.
#[derive(clap::Args, Debug)]
pub struct TeamServerArgs {
    #[command(flatten)]
    host: HostOpts,
    /// Refuse requests from processes on other logical hosts.
    #[arg(long)]
    refuse_remote: bool,
    /// Accept requests only from this principal (repeatable); default:
    /// any principal.
    #[arg(long, value_name = "N")]
    allow_principal: Vec<u32>,
    /// Largest program image accepted (a SIZE, e.g. 64MiB).
    #[arg(long, default_value = "256MiB", value_name = "SIZE", value_parser = Size::parse)]
    max_image: Size,
    /// Exit after this long (default: run until interrupted).
    #[arg(long, value_parser = vkernel::net::parse_duration)]
    exit_after: Option<Duration>,
}

/// Runs `vkernel teamserver`.
pub fn serve(a: TeamServerArgs) -> Result<(), String> {
    // Caught from the start: a stop during start-up is clean too.
    let stop = crate::stop::Stop::install();
    let k = Arc::new(a.host.start()?);
    let cfg = TeamConfig {
        refuse_remote: a.refuse_remote,
        allowed_principals: (!a.allow_principal.is_empty()).then(|| a.allow_principal.clone()),
        max_image: a.max_image.0,
        machine_host: a.host.attach_path(),
        ..TeamConfig::default()
    };
    let ts = TeamServer::start(k.clone(), cfg).map_err(|e| e.to_string())?;
    let status = format!(
        "host {} listening on {}; team server pid {}, pipe server pid {}{}{}",
        k.host_id(),
        k.local_addr(),
        ts.pid(),
        ts.pipe_server(),
        if a.refuse_remote {
            "; refusing remote requests"
        } else {
            ""
        },
        if a.allow_principal.is_empty() {
            String::new()
        } else {
            format!("; principals {:?} only", a.allow_principal)
        }
    );
    println!("vkernel teamserver: {status}");
    wait_exit(&stop, a.exit_after, &status);
    Ok(())
}

/// Arguments of `vkernel run`.
#[derive(clap::Args, Debug)]
#[command(after_help = RUN_HELP)]
pub struct RunArgs {
    #[command(flatten)]
    host: HostOpts,
    /// Where to run: ADDR or NAME@ADDR (the team server of the logical
    /// host at that address, and no other), 0xPID of a team server, or
    /// `any` (the least loaded team server that answers). Default: the
    /// first team server found through --peer.
    #[arg(long, value_name = "HOST")]
    on: Option<String>,
    /// The file server holding the program: ADDR, NAME@ADDR, NAME or 0xPID.
    #[arg(long, default_value = FILESERVER, value_name = "SERVER")]
    fs: String,
    /// For --on any: stop after this many answers.
    #[arg(long, default_value_t = 8)]
    max_replies: usize,
    /// For --on any: wait at most this long for answers.
    #[arg(long, default_value = "200ms", value_parser = vkernel::net::parse_duration)]
    select_time: Duration,
    /// Run as this V principal (a team server started with
    /// --allow-principal admits only the principals it lists; with a
    /// cluster key the principal is authenticated).
    #[arg(long, default_value_t = 0, value_name = "N")]
    principal: u32,
    /// Every request (to the team, file and pipe servers) fails if not
    /// answered within this long. Off (0) by default: waiting for the
    /// program's exit and reading its output are answered only when the
    /// program ends or writes, so a deadline also bounds its run time.
    #[arg(long, default_value = "0", value_parser = vkernel::net::parse_duration)]
    deadline: Duration,
    /// The program's path on the file server, then its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<std::ffi::OsString>,
}

const RUN_HELP: &str = "\
The program is loaded by the team server from the file server, not from
this machine's disk; its stdin, stdout and stderr travel over V pipes, and
`vkernel run` exits with the program's exit code (128 + N if signal N ended
it). Killing `vkernel run` (even with SIGKILL) makes the team server kill
the program and its process group within about --host-timeout.

Example:
  vkernel fileserver --root /srv/bin --bind 127.0.0.1:7200 &
  vkernel teamserver --bind 127.0.0.1:7300 --peer 127.0.0.1:7200 &
  vkernel run --peer 127.0.0.1:7200 --peer 127.0.0.1:7300 \\
      --fs 127.0.0.1:7200 --on any ./hello.sh world";

/// Runs `vkernel run`; returns the exit code to leave with.
pub fn run(mut a: RunArgs) -> Result<i32, String> {
    use std::os::unix::ffi::OsStrExt;
    // `--on ADDR` must run on the host at ADDR, but GetPid with scope Any
    // takes the first answer from any known host. So the host starts
    // knowing only ADDR, resolves the team server there, and learns the
    // other peers afterwards.
    let on_addr: Option<std::net::SocketAddr> = match a.on.as_deref() {
        Some("any") | None => None,
        Some(h) if h.starts_with("0x") => None,
        Some(h) => h.rsplit_once('@').map_or(h, |(_, ad)| ad).parse().ok(),
    };
    let mut cfg = a.host.config();
    cfg.send_deadline = (!a.deadline.is_zero()).then_some(a.deadline);
    let later = std::mem::take(&mut a.host.peers);
    if let Some(ad) = on_addr {
        cfg.peers = vec![ad];
        cfg.named_peers.clear();
    }
    let k = a.host.start_with(cfg)?;
    let pinned = match (on_addr, a.on.as_deref()) {
        (Some(_), Some(h)) => Some(locate_service(
            &k,
            &mut a.host,
            h,
            team::SERVICE,
            "a team server",
        )?),
        _ => None,
    };
    if on_addr.is_some() {
        for p in &later {
            k.add_peer_spec(p).map_err(|e| format!("--peer {p}: {e}"))?;
        }
    }
    a.host.peers.extend(later);
    let fs = locate_service(&k, &mut a.host, &a.fs, FILESERVER, "a file server")?;
    let team = match (pinned, a.on.as_deref()) {
        (Some(t), _) => t,
        (None, Some("any")) => {
            let p = k.create_process().map_err(|e| e.to_string())?;
            team::select_team(&p, a.max_replies, a.select_time, 0.25)
                .map_err(|e| format!("--on any: {e}"))?
        }
        (None, Some(h)) => locate_service(&k, &mut a.host, h, team::SERVICE, "a team server")?,
        (None, None) => locate_service(
            &k,
            &mut a.host,
            team::SERVICE,
            team::SERVICE,
            "a team server",
        )?,
    };
    let argv: Vec<Vec<u8>> = a.command.iter().map(|s| s.as_bytes().to_vec()).collect();
    let exit = team::run_as(
        &k,
        a.principal,
        team,
        fs,
        &argv,
        Some(Box::new(std::io::stdin())),
        Box::new(std::io::stdout()),
        Box::new(std::io::stderr()),
    )
    .map_err(|e| {
        format!(
            "running {} on team server {team}: {e}",
            String::from_utf8_lossy(&argv[0])
        )
    })?;
    let _ = std::io::stdout().flush();
    Ok(exit.code)
}
