//! The configuration file: the shipped example passes check-config, errors
//! name FILE:LINE, and flags > command section > [common] > defaults.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::BIN;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("vk-config-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write file");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs vkernel with no configuration file but what `args` name.
fn vk(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("VKERNEL_CONFIG", "")
        .output()
        .expect("run vkernel")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn shipped_example_passes_check_config() {
    let example = repo().join("dist/vkernel.toml");
    let o = vk(&["check-config".as_ref(), example.as_os_str()]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}{out}", text(&o.stderr));
    for section in ["[host]", "[disk]", "[nbd]", "[fileserver]"] {
        assert!(
            out.contains(&format!("{section} `vkernel")),
            "{section}: {out}"
        );
    }
    assert!(
        out.contains("OK (4 command sections and [common])"),
        "{out}"
    );
    // The owner key is a secret: named, not shown.
    assert!(!out.contains("5eed0123456789ab"), "{out}");
}

#[test]
fn example_with_every_commented_key_enabled_passes_too() {
    // The commented-out keys document options: they must stay valid.
    let s = Scratch::new("uncomment");
    let keys = s.file("cluster.keys", &format!("1:{}\n", "ab".repeat(32)));
    let example = std::fs::read_to_string(repo().join("dist/vkernel.toml")).expect("example");
    let mut enabled = 0;
    let mut out = String::new();
    for line in example.lines() {
        let body = line.strip_prefix("# ").unwrap_or(line);
        let is_key = line.starts_with("# ")
            && body
                .split_once(" = ")
                .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        if !is_key {
            out += line;
        } else if body.starts_with("key_file = ") {
            enabled += 1;
            out += &format!("key_file = \"{}\"", keys.display());
        } else {
            enabled += 1;
            out += body;
        }
        out.push('\n');
    }
    assert!(enabled >= 10, "only {enabled} commented keys found");
    let f = s.file("all.toml", &out);
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    assert!(o.status.success(), "{}\n{out}", text(&o.stderr));
}

/// ISSUE 50: `host_timeout = 5` was 5 ms, shown as `5`. A duration now
/// needs its unit, and `check-config` says so at the line; `1m` works.
#[test]
fn a_duration_without_a_unit_is_refused_at_its_line() {
    let s = Scratch::new("units");
    let f = s.file("bare.toml", "[echo]\nhost_timeout = 5\n");
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "accepted: {}", text(&o.stdout));
    assert!(
        err.contains("bare.toml:2: [echo] host_timeout") && err.contains("needs a unit"),
        "{err}"
    );
    let f = s.file("minute.toml", "[echo]\nhost_timeout = \"1m\"\n");
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("host_timeout"));
    assert!(
        line.is_some_and(|l| l.contains("= 1m ") && l.contains("[echo] line 2")),
        "{out}"
    );
    let args = ["ping", "--deadline", "5", "-n", "1"].map(std::ffi::OsStr::new);
    let o = vk(&args);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("needs a unit"),
        "{}",
        text(&o.stderr)
    );
}

/// ISSUE 50: sizes need their unit too, K is 1024, and check-config
/// prints durations and sizes as parsed, with their units.
#[test]
fn sizes_need_a_unit_and_values_print_with_units() {
    let s = Scratch::new("sizes");
    let f = s.file("bare.toml", "[nbd]\n\nmemory = 65536\n");
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "accepted: {}", text(&o.stdout));
    assert!(
        err.contains("bare.toml:3: [nbd] memory")
            && err.contains("needs a unit: e.g. 65536B, 64KiB or 1GiB"),
        "{err}"
    );
    let f = s.file(
        "units.toml",
        "[common]\nwindow = \"64K\"\nwrite_behind = 0\nhost_timeout = \"90s\"\n\
         [nbd]\nmemory = \"1.5GiB\"\nrediscover = \"1h 30m\"\ndeadline = \"0\"\n",
    );
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let value = |key: &str| -> String {
        let l = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key} in {out}"));
        let v = l.split_once(" = ").map_or("", |(_, v)| v);
        v.split(" # ").next().unwrap_or_default().trim().to_string()
    };
    assert_eq!(value("window"), "64 KiB");
    assert_eq!(value("write_behind"), "0 B");
    assert_eq!(value("host_timeout"), "1m 30s");
    assert_eq!(value("memory"), "1536 MiB");
    assert_eq!(value("rediscover"), "1h 30m");
    assert_eq!(value("deadline"), "0s");
    assert_eq!(value("handshake_timeout"), "10s");
    // The help says what K means.
    let o = vk(&["nbd".as_ref(), "--help".as_ref()]);
    assert!(
        text(&o.stdout).contains("K, M, G and T are powers of\n1024"),
        "{}",
        text(&o.stdout)
    );
    // A backing file's size needs its unit too (not a file named `x:4096`).
    let args = ["disk", "--backing", "file:x:4096"].map(std::ffi::OsStr::new);
    let o = vk(&args);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("`4096` needs a unit"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn errors_name_file_line_and_key() {
    let s = Scratch::new("errors");
    let f = s.file(
        "bad.toml",
        "[common]\n\
         host_timeout = \"3s\"\n\
         windw = 5\n\
         [host]\n\
         spin = \"sometimes\"\n\
         socket_mode = [\"600\"]\n\
         [hots]\n\
         x = 1\n\
         [echo]\n\
         peers = [\"not an address\"]\n\
         bind = \"127.0.0.1:0\"\n",
    );
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    let err = text(&o.stderr);
    assert!(
        !o.status.success(),
        "bad file accepted: {}",
        text(&o.stdout)
    );
    let want = [
        "bad.toml:3: [common] windw: unknown key",
        "bad.toml:5: [host] spin: invalid value 'sometimes'",
        "bad.toml:6: [host] socket_mode: takes one value",
        "bad.toml:7: unknown section [hots]",
        "bad.toml:10: [echo] peers: invalid value 'not an address'",
    ];
    for w in want {
        assert!(err.contains(w), "missing `{w}` in:\n{err}");
    }
    // In line order, and nothing about the good lines.
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), want.len(), "{err}");
    assert!(!err.contains(":11:"), "{err}");

    // A syntax error, a per-host key in [common], a missing key file.
    for (body, want) in [
        ("[host\n", "bad2.toml:1:"),
        (
            "[common]\nbind = \"127.0.0.1:0\"\n",
            "bad2.toml:2: [common] bind: `bind` belongs to one logical host",
        ),
        (
            "[common]\n\n key_file = \"/nonexistent/vk.keys\"\n",
            "bad2.toml:3: [common] key_file: invalid value '/nonexistent/vk.keys'",
        ),
        (
            "[host]\nencrypt = \"yes\"\n",
            "bad2.toml:2: [host] encrypt: expects true or false",
        ),
        ("bind = 1\n", "bad2.toml:1: `bind` is outside any section"),
    ] {
        let f = s.file("bad2.toml", body);
        let o = vk(&["check-config".as_ref(), f.as_os_str()]);
        assert!(!o.status.success(), "{body:?} accepted");
        assert!(
            text(&o.stderr).contains(want),
            "{body:?}: {}",
            text(&o.stderr)
        );
    }

    // A command's section must give what the command requires.
    let f = s.file("noroot.toml", "[fileserver]\nworkers = 2\n");
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    assert!(!o.status.success());
    assert!(text(&o.stderr)
        .contains("[fileserver]: the following required arguments were not provided"));
    assert!(text(&o.stderr).contains("--root"), "{}", text(&o.stderr));

    // And a command run with a bad file stops before starting anything.
    let f = s.file("run.toml", "[host]\nsocket_mod = \"600\"\n");
    let o = vk(&["host".as_ref(), "--config".as_ref(), f.as_os_str()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("run.toml:2: [host] socket_mod: unknown key"));
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}

#[test]
fn section_wins_over_common_and_defaults() {
    let s = Scratch::new("layers");
    let f = s.file(
        "layers.toml",
        "[common]\nhost_timeout = \"5s\"\npeers = [\"127.0.0.1:7001\", \"127.0.0.1:7002\"]\n\
         [echo]\nhost_timeout = \"2s\"\npeers = [\"127.0.0.1:7003\"]\n\
         [host]\nsocket_mode = 660\n",
    );
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let section = |name: &str| -> String {
        out.split(&format!("[{name}] `vkernel {name}`"))
            .nth(1)
            .and_then(|r| r.split("\n\n").next())
            .unwrap_or_else(|| panic!("no [{name}] in {out}"))
            .to_string()
    };
    let line = |sec: &str, key: &str| -> String {
        section(sec)
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key} in [{sec}]"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        line("echo", "host_timeout"),
        "host_timeout = 2s # [echo] line 5"
    );
    assert_eq!(
        line("echo", "peers"),
        "peers = 127.0.0.1:7003 # [echo] line 6"
    );
    assert_eq!(
        line("host", "host_timeout"),
        "host_timeout = 5s # [common] line 2"
    );
    assert_eq!(
        line("host", "peers"),
        "peers = 127.0.0.1:7001, 127.0.0.1:7002 # [common] line 3"
    );
    assert_eq!(
        line("host", "socket_mode"),
        "socket_mode = 660 # [host] line 8"
    );
    assert_eq!(line("host", "window"), "window = 1 MiB # default");
    // A TOML octal literal reaches --socket-mode as written (not as 416).
    let f = s.file("octal.toml", "[host]\nsocket_mode = 0o640\n");
    let o = vk(&["check-config".as_ref(), f.as_os_str()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("= 0o640 "), "{}", text(&o.stdout));
}

/// Runs `vkernel host` for a moment with `args`; returns its banner.
fn host_banner(args: &[&std::ffi::OsStr], env_config: Option<&Path>) -> String {
    let mut c = Command::new(BIN);
    c.arg("host").args(args).args(["--exit-after", "100ms"]);
    match env_config {
        Some(p) => c.env("VKERNEL_CONFIG", p),
        None => c.env("VKERNEL_CONFIG", ""),
    };
    let o = c.output().expect("run vkernel host");
    assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
    text(&o.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn flags_win_over_the_file_when_a_command_runs() {
    let s = Scratch::new("flags");
    let sock_file = s.0.join("file.sock");
    let sock_flag = s.0.join("flag.sock");
    let f = s.file(
        "host.toml",
        &format!(
            "[host]\nbind = \"127.0.0.2:0\"\nsocket = \"{}\"\nsocket_mode = \"640\"\n",
            sock_file.display()
        ),
    );
    let cfg = ["--config".as_ref(), f.as_os_str()];
    // From the file: address, socket and mode.
    let b = host_banner(&cfg, None);
    assert!(b.contains("listening on 127.0.0.2:"), "{b}");
    assert!(
        b.contains(&format!("attach at {} (mode 640)", sock_file.display())),
        "{b}"
    );
    // A flag replaces its key; the other keys still come from the file.
    let b = host_banner(
        &[&cfg[..], &["--socket".as_ref(), sock_flag.as_os_str()]].concat(),
        None,
    );
    assert!(b.contains("listening on 127.0.0.2:"), "{b}");
    assert!(
        b.contains(&format!("attach at {} (mode 640)", sock_flag.display())),
        "{b}"
    );
    let b = host_banner(
        &[
            &cfg[..],
            &[
                "--bind=127.0.0.1:0".as_ref(),
                "--socket-mode".as_ref(),
                "600".as_ref(),
            ],
        ]
        .concat(),
        None,
    );
    assert!(b.contains("listening on 127.0.0.1:"), "{b}");
    assert!(b.contains("(mode 600)"), "{b}");
    // $VKERNEL_CONFIG names the file when --config does not; --config
    // /dev/null reads nothing.
    let b = host_banner(&[], Some(&f));
    assert!(b.contains("listening on 127.0.0.2:"), "{b}");
    let b = host_banner(
        &[
            "--config".as_ref(),
            "/dev/null".as_ref(),
            "--socket".as_ref(),
            sock_flag.as_os_str(),
        ],
        Some(&f),
    );
    assert!(b.contains("listening on 127.0.0.1:"), "{b}");
    assert!(b.contains("(mode 600)"), "{b}");
}

#[test]
fn required_options_can_come_from_the_file() {
    let s = Scratch::new("required");
    let export = s.0.join("export");
    std::fs::create_dir_all(&export).expect("export dir");
    let f = s.file(
        "fs.toml",
        &format!(
            "[fileserver]\nroot = \"{}\"\nname = \"fs-from-file\"\nexit_after = \"100ms\"\n",
            export.display()
        ),
    );
    let o = vk(&["fileserver".as_ref(), "--config".as_ref(), f.as_os_str()]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(out.contains("\"fs-from-file\""), "{out}");
    assert!(
        out.contains(&format!("exporting {}", export.display())),
        "{out}"
    );
}

#[test]
fn help_works_with_a_broken_file() {
    let s = Scratch::new("help");
    let f = s.file("broken.toml", "[host]\nnope = 1\n");
    let o = Command::new(BIN)
        .args(["host", "--help"])
        .env("VKERNEL_CONFIG", &f)
        .output()
        .expect("run vkernel");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("--config <FILE>"));
    // check-config's long help explains the file.
    let o = Command::new(BIN)
        .args(["check-config", "--help"])
        .output()
        .expect("run vkernel");
    assert!(
        text(&o.stdout).contains("plus [common] for the"),
        "{}",
        text(&o.stdout)
    );
    // check-config without a file says where it looked.
    let o = Command::new(BIN)
        .arg("check-config")
        .env("VKERNEL_CONFIG", "")
        .output()
        .expect("run vkernel");
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("$VKERNEL_CONFIG is empty"),
        "{}",
        text(&o.stderr)
    );
    // A missing file named by $VKERNEL_CONFIG is an error, not ignored.
    let o = Command::new(BIN)
        .args(["host", "--exit-after", "10ms"])
        .env("VKERNEL_CONFIG", s.0.join("missing.toml"))
        .output()
        .expect("run vkernel");
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("missing.toml: cannot read"),
        "{}",
        text(&o.stderr)
    );
}
