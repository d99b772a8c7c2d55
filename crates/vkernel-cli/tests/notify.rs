//! Readiness under a service manager: each test plays systemd for a
//! `Type=notify` unit — a Unix datagram socket named by $NOTIFY_SOCKET —
//! and runs the real `vkernel` binary. READY=1 must come only once the
//! service serves (what a unit ordered after it would use works at once),
//! STOPPING=1 when it stops.
//!
//! To check that order without racing the service, the manager first
//! fills its socket's queue: the service's READY=1 then blocks in its
//! send, so whatever the service had not done before it stays undone
//! while the test looks (a READY sent too early never lets the banner,
//! printed after the service is set up, come out).

use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{Proc, BIN};

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        // Short: a Unix socket's path must fit in 108 bytes.
        let p = std::env::temp_dir().join(format!("vkn-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The service manager's end: the notify socket.
struct Manager {
    sock: UnixDatagram,
    path: PathBuf,
}

/// What a filled queue holds besides the service's notifications.
const FILLER: &[u8] = b"X-TEST=filler";

impl Manager {
    fn new(dir: &Path, name: &str) -> Manager {
        let path = dir.join(name);
        let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        Manager { sock, path }
    }

    /// Fills the socket's queue, so the next notification's sender
    /// blocks until [`Manager::next`] drains it.
    fn hold(&self) {
        let s = UnixDatagram::unbound().expect("socket");
        s.connect(&self.path).expect("connect");
        s.set_nonblocking(true).expect("nonblocking");
        let mut n = 0;
        while s.send(FILLER).is_ok() {
            n += 1;
            assert!(n < 100_000, "the queue never fills");
        }
    }

    /// `vkernel ARGS` with $NOTIFY_SOCKET naming this manager; its stdout
    /// lines come through the receiver.
    fn spawn(&self, args: &[&str]) -> (Proc, mpsc::Receiver<String>) {
        let mut c = Command::new(BIN)
            .args(args)
            .env("NOTIFY_SOCKET", &self.path)
            .env("VKERNEL_CONFIG", "")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn vkernel");
        let out = c.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        (Proc(c), rx)
    }

    /// The next notification (fillers skipped), if one comes within
    /// `limit`.
    fn next(&self, limit: Duration) -> Option<String> {
        let end = Instant::now() + limit;
        let mut buf = [0u8; 4096];
        while Instant::now() < end {
            match self.sock.recv(&mut buf) {
                Ok(n) if &buf[..n] == FILLER => {}
                Ok(n) => return Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(_) => {}
            }
        }
        None
    }

    /// Waits (a hang guard) for the notification holding `what`; fails on
    /// any other notification first, or if `child` exits.
    fn expect(&self, child: &mut Child, what: &str) -> String {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(m) = self.next(Duration::from_millis(200)) {
                assert!(m.contains(what), "expected {what}, got {m:?}");
                return m;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("exited with {st} before {what}");
            }
            assert!(Instant::now() < end, "no {what} within 30 s");
        }
    }
}

/// Waits (a hang guard) for a stdout line containing `what`.
fn line(out: &mpsc::Receiver<String>, what: &str) -> String {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match out.recv_timeout(left) {
            Ok(l) if l.contains(what) => return l,
            Ok(_) => {}
            Err(_) => panic!("no line with {what:?} within 30 s"),
        }
    }
}

/// The value of `KEY=` in a notification.
fn field<'a>(msg: &'a str, key: &str) -> &'a str {
    msg.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {msg:?}"))
}

/// The address in a STATUS= that says "listening on ADDR;".
fn listening(msg: &str) -> String {
    field(msg, "STATUS=")
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .unwrap_or_else(|| panic!("no address in {msg:?}"))
        .to_string()
}

fn term(c: &Child) {
    common::kill_with(c.id(), "TERM");
}

fn exits_ok(c: &mut Child, what: &str) {
    let st = common::exits_within(c, what);
    assert!(st.success(), "{what} exited with {st}");
}

#[test]
fn echo_is_ready_once_its_name_is_registered_and_stops_on_sigterm() {
    let dir = Scratch::new("echo");
    let m = Manager::new(&dir.0, "notify");
    m.hold();
    let (mut echo, out) = m.spawn(&[
        "echo",
        "--bind",
        "127.0.0.1:0",
        "--name",
        "notified",
        "--exit-after",
        "60s",
    ]);
    let banner = line(&out, "listening on");
    let addr = banner
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .expect("address")
        .to_string();
    // While its READY waits in the queue, the name is found (ping asks
    // once).
    let o = Command::new(BIN)
        .args(["ping", "--peer", &addr, "--name", "notified", "-n", "1"])
        .env("VKERNEL_CONFIG", "")
        .output()
        .expect("ping");
    assert!(
        o.status.success(),
        "lookup at READY: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let ready = m.expect(&mut echo.0, "READY=1");
    assert_eq!(listening(&ready), addr);
    assert!(
        field(&ready, "STATUS=").contains("\"notified\""),
        "{ready:?}"
    );
    assert_eq!(m.next(Duration::from_millis(300)), None, "a second notice");
    term(&echo.0);
    let stopping = m.expect(&mut echo.0, "STOPPING=1");
    assert!(
        field(&stopping, "STATUS=").contains("SIGTERM"),
        "{stopping:?}"
    );
    exits_ok(&mut echo.0, "echo");
}

#[test]
fn a_manager_that_cannot_be_told_does_not_stop_the_service() {
    let dir = Scratch::new("gone");
    let mut c = Command::new(BIN)
        .args(["echo", "--bind", "127.0.0.1:0", "--exit-after", "300ms"])
        .env("NOTIFY_SOCKET", dir.0.join("nobody-here"))
        .env("VKERNEL_CONFIG", "")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = String::new();
    c.stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    let st = c.wait().expect("wait");
    assert!(st.success() && out.contains("exiting after"), "{st}: {out}");
}

#[test]
fn the_machine_host_is_ready_once_programs_can_attach() {
    let dir = Scratch::new("host");
    let m = Manager::new(&dir.0, "notify");
    let sock = dir.0.join("host.sock");
    let sock_s = sock.to_str().expect("path");
    m.hold();
    let (mut host, out) = m.spawn(&["host", "--socket", sock_s, "--exit-after", "60s"]);
    line(&out, "programs attach at");
    // While its READY waits, a program attaches (attaching does not
    // retry).
    let o = Command::new(BIN)
        .args(["echo", "--attach", sock_s, "--exit-after", "10ms"])
        .env("VKERNEL_CONFIG", "")
        .output()
        .expect("attached echo");
    assert!(
        o.status.success(),
        "attach at READY: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let ready = m.expect(&mut host.0, "READY=1");
    assert!(field(&ready, "STATUS=").contains(sock_s), "{ready:?}");
    term(&host.0);
    m.expect(&mut host.0, "STOPPING=1");
    exits_ok(&mut host.0, "host");
}

/// The units' order: vkernel-nbd.service starts when vkernel-disk.service
/// is ready, and its first try must find the disk (it used to exit and be
/// restarted until the disk had registered).
#[test]
fn a_gateway_started_when_the_disk_is_ready_finds_it_and_serves() {
    let dir = Scratch::new("nbd");
    let disk_mgr = Manager::new(&dir.0, "disk");
    disk_mgr.hold();
    let (mut disk, disk_out) = disk_mgr.spawn(&[
        "disk",
        "--bind",
        "127.0.0.1:0",
        "--backing",
        "ram:4MiB",
        "--owner-key",
        "0x77",
        "--name",
        "notified-disk",
        "--exit-after",
        "60s",
    ]);
    let banner = line(&disk_out, "listening on");
    let addr = banner
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .expect("address")
        .to_string();
    // The gateway starts while the disk's READY waits.
    let nbd_mgr = Manager::new(&dir.0, "nbd");
    nbd_mgr.hold();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        l.local_addr().expect("addr").port()
    };
    let listen = format!("127.0.0.1:{port}");
    let (mut nbd, nbd_out) = nbd_mgr.spawn(&[
        "nbd",
        "--peer",
        &addr,
        "--disk",
        "notified-disk",
        "--disk-key",
        "0x77",
        "--listen",
        &listen,
        "--exit-after",
        "60s",
    ]);
    line(&nbd_out, "export");
    // And while the gateway's READY waits, an NBD client gets the
    // server's greeting.
    let mut c = std::net::TcpStream::connect(&listen).expect("connect at READY");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut hello = [0u8; 8];
    c.read_exact(&mut hello).expect("greeting");
    assert_eq!(&hello, b"NBDMAGIC");
    drop(c);
    let ready = nbd_mgr.expect(&mut nbd.0, "READY=1");
    assert!(field(&ready, "STATUS=").contains(&listen), "{ready:?}");
    let ready = disk_mgr.expect(&mut disk.0, "READY=1");
    assert_eq!(listening(&ready), addr);
    // The owner key is in the banner (the journal), not in STATUS=.
    let status = field(&ready, "STATUS=");
    assert!(banner.contains("0x0000000000000077"), "{banner}");
    assert!(
        !status.contains("77") && !status.contains("key"),
        "{status}"
    );
    for (mgr, p, what) in [(&nbd_mgr, &mut nbd, "nbd"), (&disk_mgr, &mut disk, "disk")] {
        term(&p.0);
        mgr.expect(&mut p.0, "STOPPING=1");
        exits_ok(&mut p.0, what);
    }
}

/// The FUSE mount: READY=1 once the file system is mounted. Skips without
/// /dev/fuse and fusermount3 unless VKERNEL_REQUIRE_FUSE=1.
#[test]
fn a_mount_is_ready_once_mounted() {
    let usable = Path::new("/dev/fuse").exists()
        && Command::new("fusermount3")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !usable {
        assert!(
            std::env::var("VKERNEL_REQUIRE_FUSE").as_deref() != Ok("1"),
            "FUSE required (VKERNEL_REQUIRE_FUSE=1) but /dev/fuse or fusermount3 is missing"
        );
        eprintln!("skipped: no /dev/fuse or fusermount3");
        return;
    }
    let dir = Scratch::new("mount");
    let (root, mnt) = (dir.0.join("export"), dir.0.join("mnt"));
    std::fs::create_dir_all(&root).expect("root");
    std::fs::create_dir_all(&mnt).expect("mountpoint");
    std::fs::write(root.join("hello"), b"over V").expect("file");
    let fs_mgr = Manager::new(&dir.0, "fs");
    let (mut fs, _) = fs_mgr.spawn(&[
        "fileserver",
        "--root",
        root.to_str().expect("path"),
        "--bind",
        "127.0.0.1:0",
        "--exit-after",
        "60s",
    ]);
    let addr = listening(&fs_mgr.expect(&mut fs.0, "READY=1"));
    let mount_mgr = Manager::new(&dir.0, "mount");
    mount_mgr.hold();
    let (mut mount, out) = mount_mgr.spawn(&["mount", &addr, mnt.to_str().expect("path")]);
    line(&out, "mounted at");
    // Read while the mount's READY waits.
    let read = std::fs::read(mnt.join("hello"));
    mount_mgr.expect(&mut mount.0, "READY=1");
    term(&mount.0);
    mount_mgr.expect(&mut mount.0, "STOPPING=1");
    exits_ok(&mut mount.0, "mount");
    assert_eq!(
        read.expect("read through the mount right after READY"),
        b"over V"
    );
    term(&fs.0);
    fs_mgr.expect(&mut fs.0, "STOPPING=1");
    exits_ok(&mut fs.0, "fileserver");
}

#[test]
fn a_team_server_is_ready_once_registered_and_stops_on_sigterm() {
    let dir = Scratch::new("team");
    let m = Manager::new(&dir.0, "notify");
    let (mut team, out) = m.spawn(&["teamserver", "--bind", "127.0.0.1:0"]);
    let banner = line(&out, "team server pid");
    let ready = m.expect(&mut team.0, "READY=1");
    assert!(
        banner.ends_with(field(&ready, "STATUS=")),
        "{banner} / {ready:?}"
    );
    term(&team.0);
    m.expect(&mut team.0, "STOPPING=1");
    exits_ok(&mut team.0, "teamserver");
}
