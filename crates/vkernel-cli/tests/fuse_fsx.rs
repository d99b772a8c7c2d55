//! fsx (the File System eXerciser, fsx-rs 0.3.2 from crates.io) on the
//! mount: random reads, writes, mapped reads and writes, truncation,
//! fallocate, hole punching, copy_file_range, sendfile, fadvise, fsync
//! and reopening, each checked against fsx's own copy of the file.
//!
//! Needs `fsx` on PATH (`cargo install fsx --version 0.3.2 --locked`);
//! skipped without it unless VKERNEL_REQUIRE_FSX=1 (as in CI).

mod common;
mod mount_support;

use std::process::Command;
use std::time::Duration;

use mount_support::*;

/// Every operation fsx 0.3.2 knows, fallocate and hole punching included.
const CONFIG: &str = "flen = 262144
[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 2
punch_hole = 2
sendfile = 1
posix_fadvise = 1
copy_file_range = 2
";

#[test]
fn fsx_with_fallocate_finds_no_error_on_the_mount() {
    if fuse_available().is_none() {
        return;
    }
    if !have("fsx") {
        if std::env::var("VKERNEL_REQUIRE_FSX").as_deref() == Ok("1") {
            panic!("fsx required but missing: cargo install fsx --version 0.3.2 --locked");
        }
        eprintln!("skipping: no fsx (cargo install fsx --version 0.3.2 --locked)");
        return;
    }
    let (work, dirs) = scratch_with("fsx", &["export", "mnt", "artifacts"]);
    let [root, mnt, art] = &dirs[..] else {
        unreachable!()
    };
    let config = work.path().join("fsx.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let _m = Mount::new(root, mnt);
    for seed in 1..=4 {
        let file = mnt.join(format!("fsx.{seed}"));
        let mut child = Command::new("fsx")
            .args(["-q", "-N", "20000", "-S", &seed.to_string(), "-f"])
            .arg(&config)
            .arg("-P")
            .arg(art)
            .arg(&file)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn fsx");
        let done = common::wait_for(Duration::from_secs(240), "fsx", || {
            child.try_wait().ok().flatten()
        });
        let out = child.wait_with_output().expect("fsx output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            done.success() && text.contains("All operations completed A-OK"),
            "fsx seed {seed} on the mount: {done}\n{text}"
        );
        // What fsx checked is on the server's disk too.
        let (a, b) = (
            std::fs::read(&file).unwrap(),
            std::fs::read(root.join(format!("fsx.{seed}"))).unwrap(),
        );
        assert_eq!(a, b, "seed {seed}: the mount and the disk differ");
    }
}
