//! Removals answered before the server has them (the default while the
//! server reports changes): they reach the server in order, other mounts
//! see them, an unmount sends what is queued, and one the server refuses
//! shows again and fails the directory's next fsync. `--sync-removals`
//! waits for the server instead.
//!
//! Real `vkernel fileserver` and `vkernel mount` processes on loopback;
//! skipped without /dev/fuse unless VKERNEL_REQUIRE_FUSE=1.

mod common;
mod mount_support;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mount_support::*;

/// `dirs` directories of `files` files each under `top`.
fn make_tree(top: &Path, dirs: usize, files: usize) {
    for d in 0..dirs {
        let dir = top.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..files {
            fs::write(dir.join(format!("f{f}")), format!("{d}/{f}\n")).unwrap();
        }
    }
}

/// fsync of a directory, its error returned.
fn try_fsync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Sets or clears the immutable flag on the server's disk; `false` when
/// the file system there has none.
fn immutable(path: &Path, on: bool) -> bool {
    Command::new("chattr")
        .arg(if on { "+i" } else { "-i" })
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_tree_removed_on_one_mount_is_gone_from_the_server_and_the_other_mount() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, d) = scratch_with("rm-tree", &["export", "a", "b"]);
    let (root, a, b) = (&d[0], &d[1], &d[2]);
    let (_ma, _mb) = two_mounts(root, a, b);
    for round in 0..3 {
        make_tree(&a.join("t"), 12, 60);
        // Listed on A (so A decides the removals itself) and on B.
        let (ok, out) = sh(a, "find t | wc -l", Duration::from_secs(30));
        assert!(ok && out.trim() == "733", "round {round}: A lists {out}");
        let (ok, out) = sh(b, "find t | wc -l", Duration::from_secs(30));
        assert!(ok && out.trim() == "733", "round {round}: B lists {out}");
        let (ok, out) = sh(a, "rm -rf t && echo removed", Duration::from_secs(60));
        assert!(ok, "round {round}: rm -rf on A: {out}");
        fsync_dir(a);
        // After the fsync, every removal is at the server.
        assert!(
            !root.join("t").exists(),
            "round {round}: the server's disk still has {:?}",
            fs::read_dir(root.join("t")).map(|r| r.count())
        );
        common::wait_for_why(
            Duration::from_secs(5),
            &format!("round {round}: B sees t gone"),
            || match fs::symlink_metadata(b.join("t")) {
                Err(_) => Ok(()),
                Ok(_) => Err("t is still on B".to_string()),
            },
        );
        // A name removed early can be made again at once.
        fs::write(a.join("again"), "new\n").unwrap();
        fs::remove_file(a.join("again")).unwrap();
        fs::write(a.join("again"), format!("round {round}\n")).unwrap();
        fsync_dir(a);
        assert_eq!(
            fs::read_to_string(root.join("again")).unwrap(),
            format!("round {round}\n")
        );
        fs::remove_file(a.join("again")).unwrap();
    }
}

#[test]
fn removals_are_answered_while_the_server_is_stopped_and_sent_at_unmount() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, d) = scratch_with("rm-unmount", &["export", "m"]);
    let (root, mnt) = (&d[0], &d[1]);
    make_tree(&root.join("t"), 20, 50);
    let mut m = Mount::new(root, mnt);
    // Everything listed (and statfs asked, as rm does), so the mount
    // decides every removal from its listings.
    let (ok, out) = sh(
        mnt,
        "df . >/dev/null && find . | wc -l",
        Duration::from_secs(30),
    );
    assert!(ok && out.trim() == "1022", "find: {out}");
    // rm -rf ends while the server cannot answer anything.
    let server = m.server.as_ref().unwrap();
    server.signal(libc::SIGSTOP);
    let rm =
        std::panic::catch_unwind(|| sh(mnt, "rm -rf t && echo removed", Duration::from_secs(5)));
    let Ok((ok, out)) = rm else {
        server.signal(libc::SIGCONT);
        panic!("rm -rf waited for the stopped server");
    };
    let listed = fs::read_dir(mnt).map(|r| r.count());
    // Unmounting must send them; the server answers again meanwhile.
    m.mount.as_ref().unwrap().signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    let still = root.join("t").exists();
    server.signal(libc::SIGCONT);
    assert!(ok, "rm -rf with the server stopped: {out}");
    assert_eq!(listed.unwrap(), 0, "the mount still lists t");
    assert!(
        still,
        "the server's disk lost t while its server was stopped"
    );
    let st = m.mount.take().unwrap().wait_for(Duration::from_secs(10));
    assert!(st.is_some_and(|s| s.success()), "mount exited with {st:?}");
    assert!(!mounted(mnt), "still mounted after SIGTERM");
    assert!(
        !root.join("t").exists(),
        "after the unmount the server's disk still has t ({:?} entries)",
        fs::read_dir(root.join("t")).map(|r| r.count())
    );
}

#[test]
fn a_removal_the_server_refuses_shows_again_and_fails_the_fsync() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, d) = scratch_with("rm-refused", &["export", "m", "s"]);
    let (root, mnt, smnt) = (&d[0], &d[1], &d[2]);
    fs::create_dir(root.join("dir")).unwrap();
    fs::write(root.join("dir/keep"), "kept\n").unwrap();
    fs::write(root.join("dir/other"), "x\n").unwrap();
    if !immutable(&root.join("dir/keep"), true) {
        eprintln!("skipping: chattr +i does not work on this file system");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        {
            let _m = Mount::new(root, mnt);
            let names = |m: &Path| {
                let mut v: Vec<String> = fs::read_dir(m.join("dir"))
                    .unwrap()
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect();
                v.sort();
                v
            };
            assert_eq!(names(mnt), ["keep", "other"]);
            // Answered from the listing: succeeds here, refused at the
            // server (EPERM) after.
            fs::remove_file(mnt.join("dir/keep")).expect("an unlink answered early");
            fs::remove_file(mnt.join("dir/other")).unwrap();
            let e = try_fsync_dir(&mnt.join("dir")).expect_err("fsync must report the refusal");
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "fsync: {e}");
            // Reported once; the name shows again, the other stays gone.
            try_fsync_dir(&mnt.join("dir")).expect("the error is reported once");
            assert_eq!(names(mnt), ["keep"]);
            assert_eq!(fs::read_to_string(mnt.join("dir/keep")).unwrap(), "kept\n");
            assert!(!root.join("dir/other").exists());
        }
        // With --sync-removals the unlink itself fails.
        let _m = Mount::with(root, smnt, &["--sync-removals"]);
        let _ = fs::read_dir(smnt.join("dir")).unwrap().count();
        let e = fs::remove_file(smnt.join("dir/keep")).expect_err("a refused unlink");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "unlink: {e}");
    });
    immutable(&root.join("dir/keep"), false);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
