//! Peers found by DNS name (`--peer NAME:PORT`), with names from a hosts
//! file: `ip netns exec NS` shows `/etc/netns/NS/hosts` as `/etc/hosts` to
//! the program it runs. Everything runs on the loopback addresses of one
//! network namespace the test creates (and removes, with its hosts file,
//! even on failure). Needs root and iproute2; without them the test skips,
//! unless VKERNEL_REQUIRE_NETNS=1 (as in CI) makes that a failure. Also:
//! peer names in the configuration file (no namespace needed).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{wait_for_why, Proc, BIN};

const PORT: &str = "7400";

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A namespace with its loopback up and its own hosts file; removed with
/// the hosts file's directory on drop.
struct Ns {
    name: String,
    etc: PathBuf,
    dir: PathBuf,
}

impl Ns {
    fn create() -> Option<Ns> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let have_ip = Command::new("ip").arg("-V").output().is_ok();
        if !root || !have_ip {
            if std::env::var("VKERNEL_REQUIRE_NETNS").as_deref() == Ok("1") {
                panic!("netns tests need root and iproute2 (root={root}, ip={have_ip})");
            }
            eprintln!("skipping DNS peer test: needs root and iproute2");
            return None;
        }
        let name = format!("vkt-dns-{}", std::process::id());
        let ns = Ns {
            etc: PathBuf::from("/etc/netns").join(&name),
            dir: std::env::temp_dir().join(&name),
            name,
        };
        // The guard exists before anything is created, so a failure below
        // still cleans up.
        std::fs::create_dir_all(&ns.etc).expect("/etc/netns/NS");
        std::fs::create_dir_all(&ns.dir).expect("scratch dir");
        ns.hosts(&[]);
        assert!(
            ip(&["netns", "add", &ns.name]) && ip(&["-n", &ns.name, "link", "set", "lo", "up"]),
            "could not create namespace {}",
            ns.name
        );
        Some(ns)
    }

    /// Writes the namespace's hosts file: `(address, name)` lines. In
    /// place, not by rename: a running program sees the file through a
    /// bind mount of this very inode.
    fn hosts(&self, entries: &[(&str, &str)]) {
        let mut s = String::from("127.0.0.1 localhost\n");
        for (a, n) in entries {
            s += &format!("{a} {n}\n");
        }
        std::fs::write(self.etc.join("hosts"), s).expect("write hosts file");
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, BIN]).args(args);
        c
    }

    /// Starts a long-running `vkernel` (it stops by itself after 120 s)
    /// and waits for its first line.
    fn serve(&self, args: &[&str]) -> Proc {
        use std::io::BufRead;
        let mut c = self
            .cmd(args)
            .args(["--exit-after", "120s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn in netns");
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("banner");
        assert!(
            line.contains("listening") || line.contains("attach"),
            "{line}"
        );
        Proc(c)
    }

    /// Runs a `vkernel` command to its end: (success, stdout, stderr).
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let o = self.cmd(args).output().expect("run in netns");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// How many logical hosts answer `vkernel hosts ARGS`.
    fn count_hosts(&self, args: &[&str]) -> usize {
        self.hosts_answer(args).0
    }

    /// [`Ns::count_hosts`], and what the command printed.
    fn hosts_answer(&self, args: &[&str]) -> (usize, String) {
        let mut a = vec!["hosts", "--wait", "500ms"];
        a.extend_from_slice(args);
        let (ok, out, err) = self.run(&a);
        assert!(ok, "vkernel hosts failed: {out}{err}");
        let n = out
            .split(" logical host(s) answered")
            .next()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no host count in {out}"));
        (n, out)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(&self.etc);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn addr(ip: &str) -> String {
    format!("{ip}:{PORT}")
}

#[test]
fn peers_by_name_are_found_and_followed_as_the_name_changes() {
    let Some(ns) = Ns::create() else { return };
    let peers = format!("vkpeers:{PORT}");
    let later = format!("vklater:{PORT}");
    ns.hosts(&[("127.0.0.1", "vkpeers"), ("127.0.0.2", "vkpeers")]);

    // A malformed peer is refused with a clear message.
    let (ok, _, err) = ns.run(&["hosts", "--peer", "vkpeers"]);
    assert!(!ok && err.contains("has no port"), "{err}");

    // The machine host on .1 follows both names; `vklater` does not
    // resolve yet, which is only a warning. An echo host on .2.
    let sock = ns.dir.join("host.sock");
    let sock = sock.to_str().expect("utf-8 path");
    let _m = ns.serve(&[
        "host",
        "--bind",
        &addr("127.0.0.1"),
        "--socket",
        sock,
        "--peer",
        &peers,
        "--peer",
        &later,
        "--resolve-interval",
        "200ms",
    ]);
    let _a = ns.serve(&["echo", "--bind", &addr("127.0.0.2")]);

    // An embedded host given the name finds both addresses behind it.
    let n = ns.count_hosts(&["--bind", "127.0.0.9:0", "--peer", &peers]);
    assert_eq!(n, 3, "this host, the machine host and the echo host");
    let (ok, out, err) = ns.run(&["ping", "--bind", "127.0.0.9:0", "--peer", &peers, "-n", "5"]);
    assert!(ok && out.contains("failures 0"), "{out}{err}");
    // The machine host knows the echo host through the name too.
    assert_eq!(ns.count_hosts(&["--attach", sock]), 2);

    // Two more hosts appear, knowing nobody: one behind the name the
    // machine host already resolves, one behind the name that did not
    // resolve at first. The machine host finds both without a restart.
    let _b = ns.serve(&["echo", "--bind", &addr("127.0.0.3")]);
    let _c = ns.serve(&["echo", "--bind", &addr("127.0.0.4")]);
    ns.hosts(&[
        ("127.0.0.1", "vkpeers"),
        ("127.0.0.2", "vkpeers"),
        ("127.0.0.3", "vkpeers"),
        ("127.0.0.4", "vklater"),
    ]);
    // The last answer goes into the failure message: which host is
    // missing, or counted twice.
    wait_for_why(
        Duration::from_secs(30),
        "the machine host did not find the hosts added to the names",
        || match ns.hosts_answer(&["--attach", sock]) {
            (4, _) => Ok(()),
            (_, out) => Err(format!("`vkernel hosts --attach` said:\n{out}")),
        },
    );
}

/// The configuration file's `peers` go through `--peer`'s own parser:
/// names are taken, and a malformed peer is refused with its message.
/// (No namespace needed.)
#[test]
fn a_config_file_takes_peer_names() {
    let dir = std::env::temp_dir().join(format!("vkt-dns-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let check = |text: &str| {
        let f = dir.join("vkernel.toml");
        std::fs::write(&f, text).expect("write config");
        let o = Command::new(BIN)
            .arg("check-config")
            .arg(&f)
            .output()
            .expect("check-config");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        (
            o.status.success(),
            out + &String::from_utf8_lossy(&o.stderr),
        )
    };
    let (ok, out) = check(
        "[common]\nresolve_interval = \"5s\"\n[echo]\npeers = [\"vkernel.default.svc.cluster.local:7000\", \"10.0.0.2:7000\"]\n",
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("vkernel.default.svc.cluster.local:7000"),
        "{out}"
    );
    let (ok, out) = check("[echo]\npeers = [\"vkernel.default.svc\"]\n");
    assert!(
        !ok && out.contains(":2:") && out.contains("has no port"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
