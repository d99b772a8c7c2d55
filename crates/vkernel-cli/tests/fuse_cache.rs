//! The mount's caches against the truth: listings, names and attributes
//! the mount (and the kernel) keep while the server reports changes must
//! never hide a name made or removed, here or on another mount.
//!
//! Real `vkernel fileserver` and `vkernel mount` processes on loopback;
//! skipped without /dev/fuse unless VKERNEL_REQUIRE_FUSE=1.

mod common;
mod mount_support;

use std::path::Path;
use std::time::Duration;

use mount_support::*;

/// A git repository of `files` small files in 20 directories at `src`.
fn make_repo(src: &Path, files: usize) {
    std::fs::create_dir_all(src).unwrap();
    for i in 0..files {
        let d = src.join(format!("dir{}", i % 20));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.c")), format!("int f{i};\n")).unwrap();
    }
    let (ok, out) = sh(
        src,
        "git init -q -b main . && git add -A && git commit -q -m tree && echo ok",
        Duration::from_secs(60),
    );
    assert!(ok, "making the repository: {out}");
}

/// Every file under `dir` (relative paths, sorted).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// git clone onto the mount, then rm -rf: every name git made (objects in
/// directories made a moment before, by parallel requests) is listed, so
/// rm removes them all. On a2f22e8 a directory's "known empty" listing
/// was stored after the kernel had been answered, over names already
/// made in it, and rm -rf failed with "Directory not empty".
#[test]
fn a_clone_on_the_mount_is_listed_and_removed_whole() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, dirs) = scratch_with("clone-rm", &["src", "export", "mnt"]);
    let [src, root, mnt] = &dirs[..] else {
        unreachable!()
    };
    make_repo(src, 1500);
    let _m = Mount::new(root, mnt);
    for round in 0..3 {
        let script = format!(
            "git clone -q {} w && git -C w status --porcelain && rm -rf w && echo gone",
            src.display()
        );
        let (ok, out) = sh(mnt, &script, Duration::from_secs(120));
        fsync_dir(mnt);
        let left = tree(root);
        assert!(
            ok && left.is_empty(),
            "round {round}: clone + rm -rf failed ({out}); left on the server: {:?}",
            &left[..left.len().min(10)]
        );
    }
}

/// Directories made and filled at once by parallel programs: each
/// listing through the mount shows exactly what the server's disk holds.
#[test]
fn names_made_in_new_directories_by_parallel_programs_are_listed() {
    if fuse_available().is_none() {
        return;
    }
    let work = Scratch::new("par-mkdir");
    let (root, mnt) = (work.path().join("export"), work.path().join("mnt"));
    for d in [&root, &mnt] {
        std::fs::create_dir(d).unwrap();
    }
    let _m = Mount::new(&root, &mnt);
    let script = "for p in 1 2 3 4; do \
           (i=0; while [ $i -lt 150 ]; do mkdir d$p.$i && : > d$p.$i/a && : > d$p.$i/b; \
            i=$((i+1)); done) & \
         done; wait; echo made";
    let (ok, out) = sh(&mnt, script, Duration::from_secs(120));
    assert!(ok, "{out}");
    assert_eq!(
        tree(&mnt),
        tree(&root),
        "the mount lists what the disk holds"
    );
    assert_eq!(tree(&root).len(), 4 * 150 * 3);
    let (ok, out) = sh(&mnt, "rm -rf d* && ls | wc -l", Duration::from_secs(120));
    assert!(ok && out.trim() == "0", "rm -rf: {out}");
    fsync_dir(&mnt);
    assert!(tree(&root).is_empty());
}

/// Names of `dir` as listed through a mount, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("ls {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The kernel keeps listings (no OPENDIR; FOPEN_CACHE_DIR) and symbolic
/// links while the server reports changes. A listing held by mount B's
/// kernel shows a name made, removed or renamed through mount A as soon
/// as A's call returns, and a link replaced on A reads anew on B.
#[test]
fn listings_and_links_the_kernel_keeps_follow_another_mount() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, dirs) = scratch_with("kcache", &["export", "a", "b"]);
    let [root, a, b] = &dirs[..] else {
        unreachable!()
    };
    let (_ma, _mb) = two_mounts(root, a, b);
    std::fs::create_dir(a.join("d")).unwrap();
    for i in 0..50 {
        std::fs::write(a.join(format!("d/f{i}")), "x").unwrap();
    }
    std::os::unix::fs::symlink("f1", a.join("d/link")).unwrap();
    let mut want = names(&a.join("d"));
    for round in 0..20 {
        // B lists twice (the second from its kernel's cache) and reads
        // the link, then A changes the directory.
        assert_eq!(names(&b.join("d")), want, "round {round}");
        assert_eq!(names(&b.join("d")), want, "round {round}, cached");
        let target = std::fs::read_link(b.join("d/link")).unwrap();
        match round % 4 {
            0 => std::fs::write(a.join(format!("d/new{round}")), "y").unwrap(),
            1 => std::fs::remove_file(a.join(format!("d/f{round}"))).unwrap(),
            2 => std::fs::rename(
                a.join(format!("d/f{round}")),
                a.join(format!("d/moved{round}")),
            )
            .unwrap(),
            _ => {
                let next = format!("f{}", round + 10);
                assert_ne!(target.to_string_lossy(), next);
                std::fs::remove_file(a.join("d/link")).unwrap();
                std::os::unix::fs::symlink(&next, a.join("d/link")).unwrap();
                common::wait_for_why(
                    Duration::from_secs(1),
                    &format!("round {round}: the link B reads"),
                    || match std::fs::read_link(b.join("d/link")) {
                        Ok(t) if t.to_string_lossy() == next => Ok(()),
                        other => Err(format!("{other:?}")),
                    },
                );
            }
        }
        want = names(&a.join("d"));
        // B's kernel is told on a thread of its own, within milliseconds
        // of A's call returning (docs/VIO.md); a listing kept past that is
        // a lost report.
        common::wait_for_why(
            Duration::from_secs(1),
            &format!("round {round}: B's listing after A's change"),
            || {
                let got = names(&b.join("d"));
                if got == want {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                }
            },
        );
    }
}

/// The mount asks the kernel for 1 MiB of read-ahead (as root), so a
/// sequential read is one READ per MiB, not per 128 KiB.
#[test]
fn the_mount_reads_ahead_a_mebibyte() {
    if fuse_available().is_none() {
        return;
    }
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: only root may set a mount's read-ahead");
        return;
    }
    let work = Scratch::new("readahead");
    let (root, mnt) = (work.path().join("export"), work.path().join("mnt"));
    for d in [&root, &mnt] {
        std::fs::create_dir(d).unwrap();
    }
    let _m = Mount::new(&root, &mnt);
    let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(&mnt).unwrap());
    let bdi = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    assert_eq!(
        std::fs::read_to_string(&bdi).unwrap().trim(),
        "1024",
        "{bdi}"
    );
}

/// lgetxattr(2) of `name` on `p`: the value, or the errno.
fn getxattr(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (cp, cn) = (
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap(),
        std::ffi::CString::new(name).unwrap(),
    );
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated and live across the call;
    // the buffer's pointer and length describe writable memory we own.
    let n = unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), 256) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// lsetxattr(2) of `name` on `p` to `value`.
fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let (cp, cn) = (
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap(),
        std::ffi::CString::new(name).unwrap(),
    );
    // SAFETY: both strings are NUL-terminated and live across the call;
    // the value's pointer and length describe memory we own.
    let r = unsafe {
        libc::lsetxattr(
            cp.as_ptr(),
            cn.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr {name}: {}", std::io::Error::last_os_error());
}

/// An extended attribute known absent (the mount answers what `ls -l`
/// and writes ask, once the server said "no such attribute") shows up
/// as soon as it is set, through this mount or another.
#[test]
fn extended_attributes_known_absent_follow_changes() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, dirs) = scratch_with("xattr", &["export", "a", "b"]);
    let [root, a, b] = &dirs[..] else {
        unreachable!()
    };
    let (_ma, _mb) = two_mounts(root, a, b);
    std::fs::write(a.join("f"), "x").unwrap();
    for (round, name) in ["user.one", "user.two", "user.three"].iter().enumerate() {
        // Asked twice on each mount: the second answer is the mount's own.
        for m in [a, b, a, b] {
            assert_eq!(getxattr(&m.join("f"), name), Err(libc::ENODATA), "{name}");
        }
        let (setter, other) = if round % 2 == 0 { (a, b) } else { (b, a) };
        let want = format!("v{round}").into_bytes();
        setxattr(&setter.join("f"), name, &want);
        assert_eq!(
            getxattr(&setter.join("f"), name),
            Ok(want.clone()),
            "{name} where set"
        );
        assert_eq!(
            getxattr(&other.join("f"), name),
            Ok(want),
            "{name} on the other mount"
        );
    }
}

/// A read-only open is closed without FLUSH (`FOPEN_NOFLUSH`): a lock set
/// through it still goes when it is closed, while its program lives on,
/// so a program on another mount can take the file at once.
#[test]
fn a_lock_through_a_read_only_open_goes_with_its_close() {
    if fuse_available().is_none() || !have("python3") {
        return;
    }
    let (work, dirs) = scratch_with("roflush", &["export", "a", "b"]);
    let [root, a, b] = &dirs[..] else {
        unreachable!()
    };
    let (_ma, _mb) = two_mounts(root, a, b);
    std::fs::write(a.join("f"), "x").unwrap();
    let (closed, done) = (work.path().join("closed"), work.path().join("done"));
    // Holds a read lock through a read-only descriptor, closes it, and
    // lives on until told.
    let holder = format!(
        "import fcntl, os, time\n\
         fd = os.open('f', os.O_RDONLY)\n\
         fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)\n\
         os.close(fd)\n\
         open('{closed}', 'w').close()\n\
         t = time.time()\n\
         while not os.path.exists('{done}') and time.time() - t < 30: time.sleep(0.01)\n",
        closed = closed.display(),
        done = done.display()
    );
    let dir = a.clone();
    let h = std::thread::spawn(move || {
        sh(
            &dir,
            &format!("python3 -c \"{holder}\""),
            Duration::from_secs(60),
        )
    });
    common::wait_for(Duration::from_secs(20), "the holder's close", || {
        closed.exists().then_some(())
    });
    let (ok, out) = sh(
        b,
        "python3 -c \"import fcntl, os; fd = os.open('f', os.O_RDWR); \
         fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('locked')\"",
        Duration::from_secs(30),
    );
    std::fs::write(&done, "").unwrap();
    let (hok, hout) = h.join().unwrap();
    assert!(hok, "the holder: {hout}");
    assert!(
        ok && out.trim() == "locked",
        "the lock outlived its close: {out}"
    );
}

/// A mount that unmounts tells the server (UNWATCH), so the changes the
/// other mount makes afterwards do not wait on the gone mount's callback.
/// Before UNWATCH, the first change after an unmount took the server's
/// 2 s callback deadline.
#[test]
fn an_unmounted_mount_is_no_longer_told_of_changes() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, dirs) = scratch_with("unwatch", &["export", "a", "b"]);
    let [root, a, b] = &dirs[..] else {
        unreachable!()
    };
    let (mut ma, _mb) = two_mounts(root, a, b);
    // A holds B's file's attributes, so B's writes would be reported to it.
    std::fs::write(b.join("f"), "x").unwrap();
    assert_eq!(std::fs::read(a.join("f")).unwrap(), b"x");
    ma.unmount();
    for i in 0..5 {
        let t = std::time::Instant::now();
        std::fs::write(b.join(format!("g{i}")), "y").unwrap();
        std::fs::write(b.join("f"), format!("{i}")).unwrap();
        std::fs::remove_file(b.join(format!("g{i}"))).unwrap();
        fsync_dir(b);
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "change {i} through B took {took:?}: the server still waited on the unmounted A"
        );
    }
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"4");
}
