//! The services as separate programs attached to one `vkernel host`, and
//! what they see when that host is killed and started again.

mod common;

use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{listening_addr, spawn_serving, wait_for, Proc, BIN};

fn host(sock: &std::path::Path) -> Proc {
    let (p, line) = spawn_serving([
        OsStr::new("host"),
        OsStr::new("--exit-after"),
        OsStr::new("120s"),
        OsStr::new("--socket"),
        sock.as_os_str(),
    ]);
    assert!(line.contains("programs attach at"), "{line}");
    p
}

/// A machine host at `sock` that knows the logical host at `peer`, and
/// its banner.
fn host_with_peer(sock: &std::path::Path, peer: &str) -> (Proc, String) {
    spawn_serving([
        OsStr::new("host"),
        OsStr::new("--exit-after"),
        OsStr::new("120s"),
        OsStr::new("--peer"),
        OsStr::new(peer),
        OsStr::new("--socket"),
        sock.as_os_str(),
    ])
}

/// `vkernel ARGS --attach SOCK`, once it serves.
fn attached(args: &[&str], sock: &std::path::Path) -> (Proc, String) {
    let args = args.iter().map(OsStr::new);
    spawn_serving(args.chain([OsStr::new("--attach"), sock.as_os_str()]))
}

fn attached_echo(sock: &std::path::Path) -> Proc {
    attached(&["echo", "--exit-after", "120s"], sock).0
}

fn ping(sock: &std::path::Path, n: &str) -> std::process::Output {
    Command::new(BIN)
        .args(["ping", "-n", n, "--attach"])
        .arg(sock)
        .output()
        .expect("ping")
}

#[test]
fn services_share_one_host_and_reattach_after_it_restarts() {
    let dir = std::env::temp_dir().join(format!("vk-cli-attach-{}", std::process::id()));
    let sock = dir.join("host.sock");
    let mut h = host(&sock);
    let _echo = attached_echo(&sock);
    let out = ping(&sock, "500");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("failures 0"), "{text}");

    // A long run, then the host is killed under it.
    let mut long = Command::new(BIN)
        .args(["ping", "-n", "100000000", "--stop-on-error", "--attach"])
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("long ping");
    std::thread::sleep(Duration::from_millis(300));
    h.0.kill().unwrap();
    h.0.wait().unwrap();
    let status = wait_for(
        Duration::from_secs(30),
        "ping ends when its host is killed",
        || long.try_wait().unwrap(),
    );
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut long.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("has gone"), "{err}");

    // A new host on the same socket (the dead one's file is replaced), and
    // the services attach again.
    let _h2 = host(&sock);
    let _echo2 = attached_echo(&sock);
    let out = ping(&sock, "200");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("failures 0"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attaching_without_a_host_says_what_to_do() {
    let out = Command::new(BIN)
        .args(["ping", "-n", "1", "--attach", "/nonexistent/vk.sock"])
        .output()
        .expect("ping");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("vkernel host") && err.contains("VKERNEL_HOST"),
        "{err}"
    );
}

#[test]
fn a_program_run_by_an_attached_team_server_is_a_process_of_its_host() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("vk-cli-attach-run-{}", std::process::id()));
    let root = dir.join("export");
    std::fs::create_dir_all(&root).unwrap();
    let sock = dir.join("host.sock");
    // The program: attaches to the host it runs on ($VKERNEL_HOST, set by
    // the team server) and exchanges with a server found there by name.
    let prog = root.join("client.sh");
    std::fs::write(&prog, format!("#!/bin/sh\nexec {BIN} ping --attach -n 5\n")).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_fs, line) = spawn_serving([
        OsStr::new("fileserver"),
        OsStr::new("--exit-after"),
        OsStr::new("60s"),
        OsStr::new("--root"),
        root.as_os_str(),
    ]);
    let fs_addr = listening_addr(&line);
    let (_h, line) = host_with_peer(&sock, &fs_addr);
    let host_addr = listening_addr(&line);
    let _echo = attached_echo(&sock);
    let (_ts, _) = attached(&["teamserver", "--exit-after", "60s"], &sock);
    let out = Command::new(BIN)
        .args([
            "run", "--peer", &fs_addr, "--peer", &host_addr, "--fs", &fs_addr, "--on",
        ])
        .arg(&host_addr)
        .arg("client.sh")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("failures 0"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_disk_and_its_client_attached_to_one_host() {
    let dir = std::env::temp_dir().join(format!("vk-cli-attach-disk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("host.sock");
    let _h = host(&sock);
    let args = [
        "disk",
        "--backing",
        "ram:4M",
        "--owner-key",
        "0x55",
        "--exit-after",
        "60s",
    ];
    let (_d, _) = attached(&args, &sock);
    let cli = |args: &[&str]| {
        let o = Command::new(BIN)
            .args(["disk-cli", "--disk-key", "0x55", "--attach"])
            .arg(&sock)
            .args(args)
            .output()
            .expect("disk-cli");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.success(), text)
    };
    let (ok, out) = cli(&["capacity"]);
    assert!(ok && out.contains("8192 blocks of 512 bytes"), "{out}");
    // 1 MiB through MoveTo/MoveFrom between the two attached programs.
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 13 % 251) as u8).collect();
    let input = dir.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    let (ok, out) = cli(&[
        "write",
        "--offset",
        "64K",
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(ok && out.contains("wrote 1048576 bytes"), "{out}");
    let back = dir.join("back.bin");
    let (ok, out) = cli(&[
        "read",
        "--offset",
        "64K",
        "--length",
        "1M",
        "--out",
        back.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert!(std::fs::read(&back).unwrap() == data, "read back exact");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The machine host's id, from its banner ("… host 101e listening …").
fn host_id(banner: &str) -> String {
    banner
        .split("host ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("host id")
        .to_string()
}

#[test]
fn an_attached_ping_to_another_host_sends_from_its_own_socket() {
    let dir = std::env::temp_dir().join(format!("vk-cli-direct-{}", std::process::id()));
    let sock = dir.join("host.sock");
    // The echo server: another logical host, in a program of its own.
    let (_echo, line) = spawn_serving(["echo", "--bind", "127.0.0.1:0", "--exit-after", "120s"]);
    let echo_addr = listening_addr(&line);
    let (_h, banner) = host_with_peer(&sock, &echo_addr);
    let out = ping(&sock, "3000");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("failures 0"), "{text}");
    // The machine host's engine sent only the first few (before it knew
    // where the echo host is); the rest left from the ping's own socket.
    let stats = Command::new(BIN)
        .args(["stats", "--json", "--attach"])
        .arg(&sock)
        .arg(host_id(&banner))
        .output()
        .expect("stats");
    let json = String::from_utf8_lossy(&stats.stdout);
    let sent = json
        .split("\"datagrams_tx\":{")
        .nth(1)
        .and_then(|s| s.split("\"RemoteSend\":").nth(1))
        .and_then(|s| s.split([',', '}']).next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no RemoteSend count in {json}"));
    // (The ping reports its direct Sends to the host, which counts them
    // with its own: `direct_sends` says how many ran outside its engine.)
    let direct = json
        .split("\"direct_sends\":")
        .nth(1)
        .and_then(|s| s.split([',', '}']).next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no direct_sends in {json}"));
    assert!(
        direct >= 2000 && sent.saturating_sub(direct) < 1000,
        "the host's engine sent {} of 3000 RemoteSends ({direct} direct): {json}",
        sent.saturating_sub(direct)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vkernel ARGS` in a PID namespace of its own, as a container runs it.
/// Namespaces made this way are siblings, so a host in one reads pid 0
/// (SO_PEERCRED) for a program in another.
fn in_own_pid_namespace(args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    // --kill-child: killing `unshare` takes the namespace's pid 1 with it.
    c.args(["--pid", "--fork", "--kill-child", BIN]).args(args);
    c
}

/// Starts `c` and reads the first line it prints (a service's banner).
fn serving(mut c: Command) -> (Proc, String) {
    c.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut p = Proc(c.spawn().expect("unshare"));
    let mut line = String::new();
    let mut out = std::io::BufReader::new(p.0.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    // Later output goes nowhere rather than blocking the service.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (p, line)
}

#[test]
fn programs_in_other_pid_namespaces_attach() {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "true"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var("VKERNEL_REQUIRE_NETNS").as_deref() != Ok("1"),
            "unshare --pid is required (VKERNEL_REQUIRE_NETNS=1) but failed"
        );
        eprintln!("skipped: cannot make a PID namespace here (needs root)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("vk-cli-attach-pidns-{}", std::process::id()));
    let sock = dir.join("host.sock");
    let sock_s = sock.to_str().unwrap();
    let (_h, banner) = serving(in_own_pid_namespace(&[
        "host",
        "--exit-after",
        "60s",
        "--socket",
        sock_s,
    ]));
    assert!(banner.contains("programs attach at"), "{banner}");
    let (_echo, line) = serving(in_own_pid_namespace(&[
        "echo",
        "--exit-after",
        "60s",
        "--attach",
        sock_s,
    ]));
    assert!(
        line.contains("echo"),
        "the namespaced echo did not serve: {line:?}"
    );

    let out = in_own_pid_namespace(&["ping", "-n", "300", "--attach", sock_s])
        .output()
        .expect("unshare ping");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("failures 0"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
