//! The C examples (examples/c), built with gcc against the installed
//! library (scripts/install-c.sh, pkg-config), run as separate programs:
//! against each other, against the Rust echo server, and attached to a
//! machine host.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use vkernel::{Kernel, KernelConfig, Scope};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cargo target directory holding this test's build of the library.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Installs the library under a fresh prefix and builds both examples,
/// the client also statically.
struct Built {
    prefix: PathBuf,
    server: PathBuf,
    client: PathBuf,
    client_static: PathBuf,
}

/// Builds the shared and static libraries (a test's build of this crate
/// makes only what the test links), once per test binary.
fn build_libraries() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let target = target_dir();
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(root())
            .args(["build", "-p", "vkernel-c", "--lib", "--target-dir"])
            .arg(target.parent().unwrap());
        if target.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        run(&mut cmd);
    });
}

fn build(tag: &str) -> Built {
    build_libraries();
    let prefix = std::env::temp_dir().join(format!("vk-c-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    run(Command::new("sh")
        .arg(root().join("scripts/install-c.sh"))
        .arg("--from")
        .arg(target_dir())
        .arg(&prefix));
    let pc = prefix.join("lib/pkgconfig");
    let flags = |args: &[&str]| -> Vec<String> {
        run(Command::new("pkg-config")
            .args(args)
            .arg("vkernel")
            .env("PKG_CONFIG_PATH", &pc))
        .split_whitespace()
        .map(str::to_string)
        .collect()
    };
    let cflags = flags(&["--cflags"]);
    let libs = flags(&["--libs"]);
    let static_libs: Vec<String> = flags(&["--static", "--libs"])
        .into_iter()
        .map(|f| {
            if f == "-lvkernel" {
                "-l:libvkernel.a".into()
            } else {
                f
            }
        })
        .collect();
    let rpath = format!("-Wl,-rpath,{}", prefix.join("lib").display());
    let cc = |src: &str, out: &Path, libs: &[String]| {
        run(Command::new("gcc")
            .args([
                "-std=c11",
                "-D_DEFAULT_SOURCE",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-O2",
            ])
            .args(&cflags)
            .arg(root().join("examples/c").join(src))
            .arg("-o")
            .arg(out)
            .args(libs)
            .arg(&rpath));
    };
    let server = prefix.join("echo_server");
    let client = prefix.join("echo_client");
    let client_static = prefix.join("echo_client_static");
    cc("echo_server.c", &server, &libs);
    cc("echo_client.c", &client, &libs);
    cc("echo_client.c", &client_static, &static_libs);
    // The static client needs no libvkernel.so at run time.
    let ldd = run(Command::new("ldd").arg(&client_static));
    assert!(!ldd.contains("libvkernel"), "{ldd}");
    Built {
        prefix,
        server,
        client,
        client_static,
    }
}

/// Starts a C echo server; returns it and its "ready" line's address.
fn serve(b: &Built, args: &[&str]) -> (Child, String) {
    let mut s = Command::new(&b.server)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(s.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut w = line.split_whitespace();
    assert_eq!(w.next(), Some("ready"), "{line:?}");
    (s, w.next().unwrap_or_default().to_string())
}

fn ok_line(out: &str, n: u32) {
    let mut w = out.split_whitespace();
    assert_eq!(w.next(), Some("ok"), "{out}");
    assert_eq!(w.next(), Some(n.to_string().as_str()), "{out}");
    let med: f64 = w.next().unwrap_or("x").parse().expect("a median");
    assert!(med > 0.0, "{out}");
}

#[test]
fn the_c_client_and_server_exchange_over_udp() {
    let b = build("udp");
    let (mut s, addr) = serve(&b, &["127.0.0.1:0", "c-echo"]);
    let out = run(Command::new(&b.client).args(["--peer", &addr, "c-echo", "2000", "--stop"]));
    ok_line(&out, 2000);
    let status = s.wait().unwrap();
    assert!(status.success());
    let _ = std::fs::remove_dir_all(&b.prefix);
}

#[test]
fn the_c_client_talks_to_the_rust_echo_server() {
    let b = build("rust");
    let k = Kernel::start(KernelConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        ..KernelConfig::default()
    })
    .unwrap();
    let (pid, _h) = k.spawn("echo", vkernel_bench::echo::serve).unwrap();
    let reg = k.create_process().unwrap();
    vkernel::service::register(&reg, "rust-echo", pid, Scope::Any);
    let addr = k.local_addr().to_string();
    for client in [&b.client, &b.client_static] {
        let out = run(Command::new(client).args(["--peer", &addr, "rust-echo", "1000"]));
        ok_line(&out, 1000);
    }
    let _ = std::fs::remove_dir_all(&b.prefix);
}

#[test]
fn c_programs_attached_to_one_machine_host() {
    let b = build("attach");
    let path = b.prefix.join("host.sock");
    let host = Kernel::start(KernelConfig::default()).unwrap();
    let srv = host.serve_attach(&path, 0o600).unwrap();
    let p = path.to_str().unwrap();
    let (mut s, _) = serve(&b, &["--attach", p, "c-echo"]);
    let out = run(Command::new(&b.client).args(["--attach", p, "c-echo", "2000", "--stop"]));
    ok_line(&out, 2000);
    assert!(s.wait().unwrap().success());
    // Two programs of one user: their exchanges went through peer pages.
    // How many depends on the scheduler: a receiver preempted for longer
    // than the sender's claim spin gets that message through the host,
    // correctly (a CI run with both CPUs loaded saw 1,407 of 2,000; the
    // share is measured by the bench, section 13, not asserted here).
    assert!(srv.peer_exchanges() > 0, "{}", srv.peer_exchanges());
    drop(srv);
    std::thread::sleep(Duration::from_millis(10));
    let _ = std::fs::remove_dir_all(&b.prefix);
}

/// The text between `open` and the next `close` after it in `doc`.
fn between<'a>(doc: &'a str, open: &str, close: &str) -> &'a str {
    let start = doc
        .find(open)
        .unwrap_or_else(|| panic!("GUIDE.md has no {open:?}"))
        + open.len();
    let len = doc[start..].find(close).expect("closed");
    &doc[start..start + len]
}

#[test]
fn the_guides_c_program_builds_and_runs_as_written() {
    build_libraries();
    let doc = std::fs::read_to_string(root().join("docs/GUIDE.md")).unwrap();
    let home = std::env::temp_dir().join(format!("vk-c-guide-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    // The install step, with this test's build of the library.
    let install = between(&doc, "```sh\ncargo build --release -p vkernel-c\n", "```");
    let install = install.replace(
        "--from target/release",
        &format!("--from {}", target_dir().display()),
    );
    std::fs::write(home.join("hello.c"), between(&doc, "```c\n", "```")).unwrap();
    let gcc = between(&doc, "`gcc hello.c", "`");
    let script = format!(
        "set -eu\n{install}\ncd \"$HOME\"\ngcc hello.c{gcc} -Wall -Wextra -Werror\n./hello\n"
    );
    let out = run(Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(root())
        .env("HOME", &home));
    assert_eq!(out.lines().last(), Some("reply 42"), "{out}");
    let _ = std::fs::remove_dir_all(&home);
}
