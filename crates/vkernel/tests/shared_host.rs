//! A machine host shared by several users: what another user's program
//! (`examples/shared_host_role.rs`, run as `nobody` with runuser) may not
//! do to root's processes, one test per operation (docs/SECURITY.md, "A
//! machine host shared by several users").
//!
//! They need root and runuser; without them they skip, unless
//! VKERNEL_REQUIRE_NETNS=1 (as in CI) makes that a failure. A plain
//! `cargo test` builds the role; alone: `cargo build --release -p vkernel
//! --example shared_host_role && cargo test --release -p vkernel --test
//! shared_host`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use vkernel::{Kernel, KernelConfig, Message, Pid, Process, Scope};

/// The uid `nobody` runs as.
const NOBODY: u32 = 65534;

/// Whether the tests can run programs as `nobody`; else why not.
fn can_run_as_nobody() -> bool {
    let why = if !Path::new("/usr/sbin/runuser").exists() && !on_path("runuser") {
        "runuser is missing"
    } else if rustix::process::geteuid().as_raw() != 0 {
        "the tests do not run as root"
    } else {
        assert!(
            role_bin().exists(),
            "{} is not built: cargo build -p vkernel --example shared_host_role \
             (with this test's profile), or a plain cargo test",
            role_bin().display()
        );
        return true;
    };
    if std::env::var("VKERNEL_REQUIRE_NETNS").as_deref() == Ok("1") {
        panic!("cannot run programs as nobody: {why}");
    }
    eprintln!("skipped: cannot run programs as nobody: {why}");
    false
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).exists()))
}

/// The `shared_host_role` binary cargo built beside this test.
fn role_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/shared_host_role")
}

/// A machine host anyone may attach to, and root's program attached to it.
struct Shared {
    host: Kernel,
    _srv: vkernel::AttachServer,
    path: PathBuf,
    root: Kernel,
}

fn shared_host(name: &str) -> Shared {
    let dir = std::env::temp_dir().join(format!("vk-shared-{}-{name}", std::process::id()));
    let path = dir.join("host.sock");
    let host = Kernel::start(KernelConfig::default()).unwrap();
    let srv = host.serve_attach(&path, 0o666).unwrap();
    let root = Kernel::attach(&path).unwrap();
    Shared {
        host,
        _srv: srv,
        path,
        root,
    }
}

impl Shared {
    /// `shared_host_role ROLE PATH ARGS` as nobody: its one line.
    fn as_nobody(&self, role: &str, args: &[String]) -> String {
        let out = self
            .nobody(role, args)
            .stdout(Stdio::piped())
            .output()
            .expect("runuser");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn nobody(&self, role: &str, args: &[String]) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"])
            .arg(role_bin())
            .arg(role)
            .arg(&self.path)
            .args(args);
        c
    }

    /// A process of root's program that answers every message (and, in
    /// word 1, the principal it came from) until the test ends.
    fn answering(&self) -> Pid {
        let p = self.root.create_process().unwrap();
        let pid = p.pid();
        std::thread::spawn(move || loop {
            let mut m = Message::zero();
            let Ok(i) = p.receive(&mut m) else { return };
            m.set_word(1, i.principal);
            let _ = p.reply(&m, i.from);
        });
        pid
    }
}

fn hex(p: Pid) -> String {
    format!("{:x}", p.0)
}

#[test]
fn another_user_cannot_take_over_or_clear_a_name() {
    if !can_run_as_nobody() {
        return;
    }
    let s = shared_host("name");
    let r = s.root.create_process().unwrap();
    let id = vkernel::service::id("echo");
    r.set_pid(id, r.pid(), Scope::Any);
    let id_arg = format!("{id:x}");
    let out = s.as_nobody("setpid", std::slice::from_ref(&id_arg));
    assert_eq!(out, format!("refused {}", r.pid()));
    let out = s.as_nobody("clear", &[id_arg]);
    assert_eq!(out, format!("kept {}", r.pid()));
    assert_eq!(r.get_pid(id, Scope::Any).unwrap(), r.pid());
    // A name nobody else holds is anyone's; and root may take any.
    let free = format!("{:x}", vkernel::service::id("nobody's own"));
    assert_eq!(s.as_nobody("setpid", &[free]), "registered");
    let c = s.host.create_process().unwrap();
    assert_eq!(c.get_pid(id, Scope::Local).unwrap(), r.pid());
}

#[test]
fn another_user_cannot_destroy_a_process() {
    if !can_run_as_nobody() {
        return;
    }
    let s = shared_host("destroy");
    let r = s.root.create_process().unwrap();
    let out = s.as_nobody("destroy", &[hex(r.pid())]);
    assert!(out.contains("does not grant"), "{out}");
    assert!(s.host.process_exists(r.pid()));
    // The host's own processes neither.
    let ks = s.host.kernel_server();
    let out = s.as_nobody("destroy", &[hex(ks)]);
    assert!(out.contains("does not grant"), "{out}");
    assert!(s.host.process_exists(ks));
}

#[test]
fn another_user_cannot_destroy_through_the_kernel_server() {
    if !can_run_as_nobody() {
        return;
    }
    let s = shared_host("ks");
    let r = s.root.create_process().unwrap();
    let out = s.as_nobody("ks-destroy", &[hex(r.pid())]);
    assert_ne!(out, "ok");
    assert!(s.host.process_exists(r.pid()), "{out}");
}

#[test]
fn another_user_cannot_forward_a_request_to_the_kernel_server_as_its_sender() {
    if !can_run_as_nobody() {
        return;
    }
    let s = shared_host("fwd");
    let victim = s.root.create_process().unwrap();
    let mut c = s
        .nobody("forward", &[hex(victim.pid())])
        .stdout(Stdio::piped())
        .spawn()
        .expect("runuser");
    let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let fwd = Pid(u32::from_str_radix(line.trim(), 16).expect("a pid"));
    // Root's program asks nobody's server something; the server tries to
    // pass it on to the kernel server as a destroy of root's process.
    let sender = s.root.create_process().unwrap();
    let mut m = Message::with_code(1);
    let r = sender.send_within(&mut m, fwd, Some(Duration::from_secs(10)));
    assert!(r.is_ok(), "{r:?}");
    line.clear();
    out.read_line(&mut line).unwrap();
    let _ = c.wait();
    assert_ne!(line.trim(), "forwarded");
    assert!(s.host.process_exists(victim.pid()));
}

/// One group Send from root to `g` is answered (by root's member).
fn answered(p: &Process, g: Pid) -> bool {
    let mut m = Message::with_code(2);
    p.send_within(&mut m, g, Some(Duration::from_secs(2)))
        .is_ok()
}

#[test]
fn another_user_cannot_change_anothers_group_memberships() {
    if !can_run_as_nobody() {
        return;
    }
    let s = shared_host("group");
    let member = s.answering();
    let sender = s.root.create_process().unwrap();
    let g = Pid::well_known_group(0x5a5a);
    s.root
        .create_process()
        .unwrap()
        .join_group(g, member)
        .unwrap();
    assert!(answered(&sender, g));
    // Removing root's member, joining root's process elsewhere, joining
    // a group root's processes hold.
    let out = s.as_nobody("leave", &[hex(g), hex(member)]);
    assert!(out.contains("does not grant"), "{out}");
    let other = Pid::well_known_group(0x5a5b);
    let out = s.as_nobody("join", &[hex(other), hex(member)]);
    assert!(out.contains("does not grant"), "{out}");
    let out = s.as_nobody("join", &[hex(g), "self".into()]);
    assert!(out.contains("does not grant"), "{out}");
    assert!(answered(&sender, g));
    // A group of its own is fine.
    assert_eq!(s.as_nobody("join", &[hex(other), "self".into()]), "ok");
}

#[test]
fn another_user_cannot_claim_another_principal() {
    if !can_run_as_nobody() {
        return;
    }
    let s = shared_host("principal");
    let q = s.answering();
    // Refused, so its Send still says nobody.
    let out = s.as_nobody("principal", &["0".into(), hex(q)]);
    assert_eq!(out, format!("seen as {NOBODY}"));
}
