//! Trees deeper than PATH_MAX (4096 bytes) on the mount: a program whose
//! working directory is deep in a tree uses short relative paths, as on a
//! local disk, though the server's paths from its root are longer.
//!
//! Real `vkernel fileserver` and `vkernel mount` processes on loopback;
//! skipped without /dev/fuse unless VKERNEL_REQUIRE_FUSE=1.

mod common;
mod mount_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mount_support::*;

/// Levels of 100-byte names: 60 of them are 6,060 bytes.
const LEVELS: usize = 60;

/// Goes down the tree under `top` (`cd -P`: the shell's logical `cd`
/// builds the whole path, which a local disk refuses too).
fn down() -> String {
    format!(
        "name=$(printf 'd%099d' 0); cd -P top; n=0; \
         while [ $n -lt {LEVELS} ]; do cd -P $name; n=$((n+1)); done; "
    )
}

/// Makes the tree and uses files at its bottom by relative paths.
fn make() -> String {
    format!(
        "set -e; mkdir top; name=$(printf 'd%099d' 0); cd -P top; n=0; \
         while [ $n -lt {LEVELS} ]; do mkdir $name; cd -P $name; n=$((n+1)); done; \
         printf 'hello from the bottom\\n' > f1; cat f1; mv f1 f2; echo more >> f2; cat f2; \
         ln -s f2 l; readlink l; cat l; ln f2 h; \
         mkdir sub; echo x > sub/x; mv sub/x sub/y; mv sub sub2; ls sub2; \
         cp f2 f3; cmp f2 f3 && echo same; rm l f3; \
         dd if=/dev/zero bs=1024 count=300 2>/dev/null | tr '\\0' 'z' > big; \
         mv big ../big; cd -P ..; wc -c < big; mv big $name/big; ls $name | tr '\\n' ' '; echo"
    )
}

/// What is at the bottom, to compare the mount with the server's disk.
fn inspect() -> String {
    format!(
        "set -e; {}find . | sort; cat f2 sub2/y; sha256sum big; \
         stat -c '%n %s %h %a %F' f2 h sub2 sub2/y big | sort",
        down()
    )
}

/// A directory tree about 6,000 bytes deep made on the mount from a
/// shell: files at its bottom are made, written, read, renamed and
/// removed by relative paths, as on a local directory; the server's disk
/// holds the same; `rm -rf` removes it all. Before the limit was raised
/// the `mkdir` past 4096 bytes failed with ENAMETOOLONG.
#[test]
fn a_tree_deeper_than_path_max_is_usable_on_the_mount() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, dirs) = scratch_with("long", &["export", "mnt", "local"]);
    let [root, mnt, local] = &dirs[..] else {
        unreachable!()
    };
    let _m = Mount::new(root, mnt);
    let limit = Duration::from_secs(120);
    let (ok_l, made_l) = sh(local, &make(), limit);
    assert!(ok_l, "on a local directory:\n{made_l}");
    let (ok_m, made_m) = sh(mnt, &make(), limit);
    assert!(ok_m, "on the mount:\n{made_m}");
    assert_eq!(made_m, made_l);
    assert!(made_m.contains("same\n307200\n"), "{made_m}");
    let (ok, seen_m) = sh(mnt, &inspect(), limit);
    assert!(ok, "looking on the mount:\n{seen_m}");
    let (ok, seen_disk) = sh(root, &inspect(), limit);
    assert!(ok, "looking on the server's disk:\n{seen_disk}");
    assert_eq!(seen_m, seen_disk);
    let (ok, seen_l) = sh(local, &inspect(), limit);
    assert!(ok);
    assert_eq!(seen_m, seen_l);
    assert!(seen_m.contains("f2 27 2 "), "{seen_m}");
    let (ok, out) = sh(mnt, "rm -rf top && ls -A", limit);
    assert!(ok, "rm -rf on the mount: {out}");
    assert_eq!(out, "");
    fsync_dir(mnt);
    assert!(
        std::fs::read_dir(root).unwrap().next().is_none(),
        "left on the server"
    );
}

/// A bind mount, undone on drop: before the FUSE mount under it goes,
/// which could not end while the bind holds it.
struct Bind(PathBuf);

impl Bind {
    fn new(from: &Path, at: &Path) -> Option<Bind> {
        let ok = Command::new("mount")
            .arg("--bind")
            .args([from, at])
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Bind(at.to_path_buf()))
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        if mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// pjdfstest (see fuse.rs) on a directory 2,000 bytes deep in the
/// mount, bind-mounted at a short path: the suite's paths (absolute; its
/// PATH_MAX cases 4095 bytes long) are then over 6,000 bytes from the
/// server's root. Every test it can run here must pass. (Run from a deep
/// working directory instead, the suite still names everything by
/// absolute path, so its paths from the root stay short; and its
/// sockets' paths outgrow a socket address. A private mount namespace
/// for the bind would hold a copy of every FUSE mount on the machine,
/// keeping them from ending while the suite runs.)
#[test]
fn the_posix_conformance_suite_passes_deep_in_the_mount() {
    if fuse_available().is_none() {
        return;
    }
    let required = std::env::var("VKERNEL_REQUIRE_PJDFSTEST").as_deref() == Ok("1");
    if !have("pjdfstest") {
        if required {
            panic!(
                "pjdfstest required but missing (cargo install pjdfstest --version 0.2.2 --locked)"
            );
        }
        eprintln!("skipping: pjdfstest is not installed");
        return;
    }
    let work = Scratch::short("pd");
    let (root, mnt, short) = (
        work.path().join("export"),
        work.path().join("mnt"),
        work.path().join("s"),
    );
    for d in [&root, &mnt, &short] {
        std::fs::create_dir(d).unwrap();
    }
    let conf = work.path().join("pjdfstest.toml");
    std::fs::write(
        &conf,
        "[features]\nutime_now = {}\nutimensat = {}\nposix_fallocate = {}\nrename_ctime = {}\n\n\
         [dummy_auth]\nentries = [[\"nobody\", \"nogroup\"], [\"daemon\", \"daemon\"]]\n",
    )
    .unwrap();
    let _m = Mount::with(&root, &mnt, &["--allow-other"]);
    let mut deep = mnt.clone();
    for i in 0..10 {
        deep.push(format!("{i}{}", "p".repeat(199)));
        // The suite's users go through every level.
        std::fs::create_dir(&deep).unwrap();
        std::fs::set_permissions(&deep, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    // Dropped before the mount (declared after it).
    let Some(_bind) = Bind::new(&deep, &short) else {
        assert!(!required, "mount --bind failed (the suite runs as root)");
        eprintln!("skipping: cannot bind-mount (not root?)");
        return;
    };
    let (_, out) = sh(
        work.path(),
        &format!(
            "pjdfstest -c {} -p {} 2>&1",
            conf.display(),
            short.display()
        ),
        Duration::from_secs(900),
    );
    let summary = out
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| panic!("no summary from pjdfstest:\n{out}"));
    println!("pjdfstest 2,000 bytes deep in the V mount: {summary}");
    let count = |what: &str| -> u32 {
        summary
            .split(',')
            .find(|p| p.trim().ends_with(what))
            .and_then(|p| p.split_whitespace().find_map(|w| w.parse().ok()))
            .unwrap_or_else(|| panic!("no `{what}` count in {summary}"))
    };
    let failed: Vec<&str> = out.lines().filter(|l| l.contains("FAILED")).collect();
    assert_eq!(count("failed"), 0, "{failed:#?}\n{out}");
    assert!(count("passed") >= 380, "{summary}");
}
