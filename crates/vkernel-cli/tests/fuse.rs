//! The FUSE mount end to end: the real `vkernel fileserver` and `vkernel
//! mount` processes on loopback, unmodified programs (cp, tar, diff,
//! sha256sum, git, sqlite3, and a program stored on the server) run on the
//! mount and on a local directory, and their results compared.
//!
//! Needs /dev/fuse and fusermount3 (Debian fuse3), plus git and sqlite3;
//! without them the tests skip with a message, unless VKERNEL_REQUIRE_FUSE=1
//! (as in CI) makes that a failure. Every command runs under a deadline,
//! and the mount and server processes are stopped and unmounted on drop.

mod common;
mod mount_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mount_support::*;

/// The same workload on a local directory and on the mount: the outputs
/// (hashes, listings, commit ids, query results) must be identical.
const WORKLOAD: &str = r#"set -e
mkdir -p src/sub src/deeper
i=0
while [ $i -lt 40 ]; do
  printf 'line %s of a text file\n' $(seq 1 $i) > src/sub/t$i.txt
  i=$((i+1))
done
dd if=/dev/zero bs=65536 count=40 2>/dev/null | tr '\0' 'v' > src/big.bin
cp /bin/sh src/deeper/shell.copy
ln -s sub/t3.txt src/link
cp -r src copy
diff -r src copy
echo "cp+diff ok"
(cd copy && find . -type f | sort | xargs sha256sum)
tar --sort=name --mtime=2001-01-01 --owner=0 --group=0 --numeric-owner -cf a.tar src
sha256sum a.tar | cut -c1-64
mkdir x && tar -xf a.tar -C x && diff -r src x/src && echo "tar ok"
mkdir repo && cd repo && git init -q -b main .
cp -r ../src . && git add -A && git commit -q -m first
echo more >> src/sub/t1.txt && git commit -q -am second
git rev-parse HEAD
git fsck --full 2>&1 | grep -v '^Checking' || true
git log --format=%s | tr '\n' ' '; echo
cd ..
sqlite3 db.sqlite "create table t(k integer primary key, v text); begin; $(i=0; while [ $i -lt 500 ]; do printf "insert into t(v) values('row%s');" $i; i=$((i+1)); done) commit;"
sqlite3 db.sqlite "update t set v = v || '!' where k % 7 = 0; select count(*), sum(k), count(*) filter (where v like '%!') from t; pragma integrity_check;"
sqlite3 db.sqlite "delete from t where k > 100; vacuum; select count(*) from t;"
printf '#!/bin/sh\necho "script says $1"\n' > run.sh && chmod +x run.sh && ./run.sh hi
mv copy moved && rm -r moved/sub && ls moved | sort | tr '\n' ' '; echo
"#;

#[test]
fn unmodified_programs_on_the_mount_match_a_local_directory() {
    if fuse_available().is_none() {
        return;
    }
    let work = Scratch::new("programs");
    let root = work.path().join("export");
    let mnt = work.path().join("mnt");
    let local = work.path().join("local");
    for d in [&root, &mnt, &local] {
        std::fs::create_dir(d).unwrap();
    }
    // A program stored on the server (put there on the server's side).
    std::fs::copy("/bin/echo", root.join("stored-echo")).unwrap();
    let mut m = Mount::new(&root, &mnt);
    let limit = Duration::from_secs(180);

    let (ok, out) = sh(&mnt, "./stored-echo executed from the mount", limit);
    assert!(ok, "running a program stored on the server");
    assert_eq!(out.trim(), "executed from the mount");

    let (ok_l, out_l) = sh(&local, WORKLOAD, limit);
    assert!(ok_l, "workload on the local directory failed:\n{out_l}");
    let (ok_m, out_m) = sh(&mnt, WORKLOAD, limit);
    assert!(ok_m, "workload on the mount failed:\n{out_m}");
    assert_eq!(out_m, out_l, "mount and local directory disagree");
    assert!(out_m.contains("tar ok") && out_m.contains("cp+diff ok"));
    assert!(out_m.contains("script says hi"));
    // The server's tree holds what the programs wrote through the mount
    // (git's index records inode numbers and times, so it differs anyway).
    let (ok, d) = sh(
        work.path(),
        "diff -r --no-dereference -x stored-echo -x index local export 2>&1; echo status $?",
        limit,
    );
    assert!(
        ok && d.trim() == "status 0",
        "server tree differs from local:\n{d}"
    );
    // The same files read through the mount and directly hash the same.
    let (_, a) = sh(&mnt, "sha256sum db.sqlite a.tar src/big.bin", limit);
    let (_, b) = sh(&root, "sha256sum db.sqlite a.tar src/big.bin", limit);
    assert_eq!(a, b);
    m.unmount();
}

#[test]
fn mount_reports_a_dead_server_and_unmounts_on_sigterm() {
    if fuse_available().is_none() {
        return;
    }
    let work = Scratch::new("dead");
    let root = work.path().join("export");
    let mnt = work.path().join("mnt");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let mut m = Mount::new(&root, &mnt);
    let limit = Duration::from_secs(60);
    let (ok, _) = sh(&mnt, "echo durable > f && sync f && cat f", limit);
    assert!(ok);
    // Kill the server outright, then use the mount: a clear error, no hang.
    if let Some(mut s) = m.server.take() {
        s.signal(libc::SIGKILL);
        let _ = s.wait_for(Duration::from_secs(5));
    }
    std::thread::sleep(Duration::from_millis(1500)); // attribute cache expires
    let t = Instant::now();
    let (ok, _) = sh(&mnt, "cat f && ls -l && echo x > g", limit);
    assert!(!ok, "operations on a dead server must fail");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"durable\n");
    m.unmount();
}

#[test]
fn mount_finds_a_restarted_server_and_carries_on() {
    use std::io::{Read, Seek, Write};
    if fuse_available().is_none() {
        return;
    }
    let work = Scratch::new("restart");
    let root = work.path().join("export");
    let mnt = work.path().join("mnt");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let data: Vec<u8> = (0..24usize << 20).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(root.join("big.bin"), &data).unwrap();
    let (server, addr) = fileserver(&root, "127.0.0.1:0");
    let mut m = Mount {
        mnt: mnt.clone(),
        mount: None,
        server: Some(server),
    };
    let (mount, _) = start(
        "mount",
        &[
            "mount",
            &addr,
            mnt.to_str().unwrap(),
            "--host-timeout",
            "2s",
        ],
        "mounted at",
    );
    m.mount = Some(mount);
    let restart = |m: &mut Mount| {
        if let Some(mut s) = m.server.take() {
            s.signal(libc::SIGKILL);
            let _ = s.wait_for(Duration::from_secs(5));
        }
        std::thread::sleep(Duration::from_millis(300));
        m.server = Some(fileserver(&root, &addr).0);
    };

    // A file read slowly, with the server killed and restarted part way:
    // every byte arrives, as on the server's disk.
    let mut f = std::fs::File::open(mnt.join("big.bin")).unwrap();
    let mut got = Vec::with_capacity(data.len());
    let mut chunk = vec![0u8; 1 << 20];
    let mut chunks = 0;
    loop {
        let n = f.read(&mut chunk).expect("read across the restart");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&chunk[..n]);
        chunks += 1;
        if chunks == 6 {
            restart(&mut m);
        }
    }
    assert!(got == data, "the file read across the restart differs");
    // A file written after the restart is on the server's disk.
    std::fs::write(mnt.join("after.txt"), b"written after the restart\n").unwrap();
    assert_eq!(
        std::fs::read(root.join("after.txt")).unwrap(),
        b"written after the restart\n"
    );
    // A file written but not synced when the server dies may have lost
    // write-behind data: its next use says so (EIO), never silence. The
    // next server is forked before the file is opened: a child forked
    // while it is open would close it at exec, and that close (a FUSE
    // flush of unsynced data) waits for the server it is to start.
    let mut next = Command::new("sh")
        .args([
            "-c",
            "read go && exec \"$0\" fileserver --root \"$1\" --bind \"$2\"",
        ])
        .args([BIN, root.to_str().unwrap(), addr.as_str()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sh");
    let mut go = next.stdin.take().expect("stdin");
    let out = next.stdout.take().expect("stdout");
    let next = Proc {
        child: next,
        name: "fileserver",
    };
    let mut w = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join("unsynced.bin"))
        .unwrap();
    w.write_all(&data[..1 << 20]).unwrap();
    if let Some(mut s) = m.server.take() {
        s.signal(libc::SIGKILL);
        let _ = s.wait_for(Duration::from_secs(5));
    }
    go.write_all(b"go\n").expect("start the next server");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).expect("banner");
    assert!(line.contains("listening on"), "{line}");
    m.server = Some(next);
    let r = w.write_all(&data[..4096]).and_then(|_| w.sync_all());
    let e = r.expect_err("a write after unsynced data died with the server");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    drop(w);
    // A file open only for reading across the restart reads on.
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact(&mut head).expect("reopened handle reads");
    assert!(head[..] == data[..4096]);
    drop(f);
    m.unmount();
}

/// Issue 19 item 4 with an unmodified program: `cp -r` of a tree out of
/// the mount while the file server is killed with SIGKILL and started
/// again. cp finishes (exit 0) and the copy is identical.
#[test]
fn cp_out_of_the_mount_finishes_across_a_server_restart() {
    if fuse_available().is_none() {
        return;
    }
    let work = Scratch::new("cp-restart");
    let root = work.path().join("export");
    let mnt = work.path().join("mnt");
    let copy = work.path().join("copy");
    std::fs::create_dir_all(root.join("tree")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    // 400 files of 128 KiB: long enough for the restart to land inside.
    for i in 0..400usize {
        let d: Vec<u8> = (0..128usize << 10)
            .map(|j| (i * 7 + j * 13) as u8)
            .collect();
        std::fs::write(root.join("tree").join(format!("f{i:03}")), d).unwrap();
    }
    let (server, addr) = fileserver(&root, "127.0.0.1:0");
    let mut m = Mount {
        mnt: mnt.clone(),
        mount: None,
        server: Some(server),
    };
    // The README's mount command, with its defaults.
    let (mount, _) = start(
        "mount",
        &["mount", &addr, mnt.to_str().unwrap()],
        "mounted at",
    );
    m.mount = Some(mount);
    let mut cp = Command::new("cp")
        .arg("-r")
        .arg(mnt.join("tree"))
        .arg(&copy)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cp");
    // Kill the server once cp is under way.
    common::wait_for(Duration::from_secs(30), "cp made no progress", || {
        (std::fs::read_dir(&copy).map_or(0, |d| d.count()) >= 20).then_some(())
    });
    if let Some(mut s) = m.server.take() {
        s.signal(libc::SIGKILL);
        let _ = s.wait_for(Duration::from_secs(5));
    }
    let copied_at_kill = std::fs::read_dir(&copy).map_or(0, |d| d.count());
    std::thread::sleep(Duration::from_millis(300));
    m.server = Some(fileserver(&root, &addr).0);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = cp.try_wait().expect("cp status") {
            break s;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = cp.kill();
            panic!("cp did not finish within 60 s of the restart");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = cp.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(status.success(), "cp failed across the restart: {err}");
    assert!(copied_at_kill < 400, "the restart fell after the copy");
    for i in 0..400usize {
        let name = format!("f{i:03}");
        assert!(
            std::fs::read(copy.join(&name)).ok()
                == std::fs::read(root.join("tree").join(&name)).ok(),
            "{name} differs after the restart"
        );
    }
    m.unmount();
}

/// What each kind of special file and each user's new files look like,
/// through the mount and on the server.
const SPECIAL: &str = r#"set -e
mkfifo fifo
mknod cdev c 1 3
mknod bdev b 7 200
python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.bind("sock")'
stat -c '%n %F %a %t:%T' fifo cdev bdev sock
(echo through the fifo > fifo &) ; head -1 < fifo
chmod 0640 fifo && stat -c '%n %a' fifo
"#;

/// The same as an ordinary user in a shared, sticky directory: what they
/// make is theirs, and they can then change it.
const AS_USER: &str = r#"set -e
cd shared
echo mine > f
mkdir d
ln -s f l
mkfifo p
stat -c '%n %u:%g' f d p
stat -c '%n %u:%g' -L l
chmod 0600 f && truncate -s 2 f && touch -d 2001-02-03 f
mv f g && ln g h
stat -c '%n %a %s %Y %h' g
"#;

#[test]
fn special_files_and_owners_as_on_a_local_disk() {
    if fuse_available().is_none() {
        return;
    }
    if !have("python3") || !have("setpriv") {
        panic!("this test needs python3 and setpriv (util-linux)");
    }
    let work = Scratch::new("special");
    let root = work.path().join("export");
    let mnt = work.path().join("mnt");
    let local = work.path().join("local");
    for d in [&root, &mnt, &local] {
        std::fs::create_dir(d).unwrap();
    }
    let _m = Mount::with(&root, &mnt, &["--allow-other"]);
    let limit = Duration::from_secs(60);
    let (ok_l, out_l) = sh(&local, SPECIAL, limit);
    assert!(ok_l, "special files on the local directory:\n{out_l}");
    let (ok_m, out_m) = sh(&mnt, SPECIAL, limit);
    assert!(ok_m, "special files on the mount:\n{out_m}");
    assert_eq!(out_m, out_l);
    assert!(out_m.contains("through the fifo"));
    // On the server they are the same kinds of file.
    let (_, on_server) = sh(&root, "stat -c '%n %F %t:%T' fifo cdev bdev sock", limit);
    assert!(on_server.contains("fifo fifo"), "{on_server}");
    assert!(
        on_server.contains("cdev character special file 1:3"),
        "{on_server}"
    );
    assert!(
        on_server.contains("bdev block special file 7:c8"),
        "{on_server}"
    );
    assert!(on_server.contains("sock socket"), "{on_server}");

    // An ordinary user (nobody) in a shared directory, on both.
    let as_user = |dir: &Path| {
        std::fs::create_dir(dir.join("shared")).unwrap();
        sh(dir, "chmod 1777 shared", limit);
        sh(
            dir,
            &format!(
                "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '{}'",
                AS_USER.replace('\'', "'\\''")
            ),
            limit,
        )
    };
    let (ok_l, out_l) = as_user(&local);
    assert!(ok_l, "as nobody on the local directory:\n{out_l}");
    let (ok_m, out_m) = as_user(&mnt);
    assert!(ok_m, "as nobody on the mount:\n{out_m}");
    assert_eq!(out_m, out_l);
    assert!(out_m.contains("f 65534:65534"), "{out_m}");
    // The server's files belong to that user too.
    let (_, on_server) = sh(
        &root,
        "stat -c '%n %u:%g' shared/g shared/d shared/p",
        limit,
    );
    assert_eq!(
        on_server,
        "shared/g 65534:65534\nshared/d 65534:65534\nshared/p 65534:65534\n"
    );
}

/// A directory renamed through one mount while a program on the other
/// has its working directory and an open file in it: the program carries
/// on, and the directory is there under its new name.
#[test]
fn a_directory_renamed_elsewhere_stays_usable_here() {
    if fuse_available().is_none() {
        return;
    }
    let (work, dirs) = scratch_with("rename2", &["export", "a", "b"]);
    let [root, a, b] = &dirs[..] else {
        unreachable!()
    };
    let (_ma, _mb) = two_mounts(root, a, b);
    std::fs::create_dir_all(a.join("old/sub")).unwrap();
    std::fs::write(a.join("old/file"), "hello\n").unwrap();
    std::fs::write(a.join("old/sub/inner"), "inner\n").unwrap();
    let (ready, go) = (work.path().join("ready"), work.path().join("go"));
    let script = format!(
        "exec 3< file; ls sub; touch {ready}; \
         while [ ! -e {go} ]; do sleep 0.05; done; \
         cat file && ls sub && cat sub/inner && cat <&3 && echo x > sub/made && echo done",
        ready = ready.display(),
        go = go.display()
    );
    let dir = b.join("old");
    let user = std::thread::spawn(move || sh(&dir, &script, Duration::from_secs(60)));
    common::wait_for(Duration::from_secs(20), "the program on b", || {
        ready.exists().then_some(())
    });
    std::fs::rename(a.join("old"), a.join("new")).unwrap();
    std::fs::write(&go, "").unwrap();
    let (ok, out) = user.join().unwrap();
    assert!(ok, "the program in the renamed directory failed:\n{out}");
    assert_eq!(out, "inner\nhello\ninner\ninner\nhello\ndone\n");
    // Later, by the new name, from this mount.
    std::thread::sleep(Duration::from_millis(300));
    let mut names: Vec<String> = std::fs::read_dir(b.join("new/sub"))
        .unwrap_or_else(|e| panic!("ls b/new/sub: {e}"))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["inner", "made"]);
    assert_eq!(
        std::fs::read_to_string(a.join("new/sub/made")).unwrap(),
        "x\n"
    );
    assert!(!b.join("old").exists());
}

/// Programs on two mounts appending lines to one file (O_APPEND): every
/// line lands whole, none inside another, none lost.
#[test]
fn appends_from_two_mounts_land_whole() {
    if fuse_available().is_none() {
        return;
    }
    let (_work, dirs) = scratch_with("append2", &["export", "a", "b"]);
    let [root, a, b] = &dirs[..] else {
        unreachable!()
    };
    let (_ma, _mb) = two_mounts(root, a, b);
    std::fs::write(a.join("log"), "").unwrap();
    const LINES: usize = 2000;
    // One open each (the shell writes each line with one write(2)), and
    // one open per line.
    let writer = |dir: PathBuf, tag: &'static str| {
        let script = format!(
            "i=0; exec 3>>log; while [ $i -lt {LINES} ]; do \
               echo \"{tag} $i some text to make the line longer\" >&3; i=$((i+1)); done; \
             i=0; while [ $i -lt 200 ]; do echo \"{tag}o $i\" >> log; i=$((i+1)); done"
        );
        std::thread::spawn(move || sh(&dir, &script, Duration::from_secs(120)))
    };
    let (wa, wb) = (writer(a.clone(), "a"), writer(b.clone(), "b"));
    for w in [wa, wb] {
        let (ok, out) = w.join().unwrap();
        assert!(ok, "an appending program failed:\n{out}");
    }
    let text = std::fs::read_to_string(root.join("log")).unwrap();
    let mut seen = std::collections::HashSet::new();
    for line in text.lines() {
        let mut w = line.split(' ');
        let (tag, n) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
        let whole = match tag {
            "a" | "b" => line == format!("{tag} {n} some text to make the line longer"),
            "ao" | "bo" => w.next().is_none(),
            _ => false,
        };
        assert!(whole, "a line written over by another: {line:?}");
        assert!(seen.insert(line.to_string()), "twice: {line:?}");
    }
    assert_eq!(seen.len(), 2 * (LINES + 200), "lines lost");
    // A shared mapping of a file open with O_APPEND: its page goes back
    // where it was, the append after it at the end.
    if have("python3") {
        let script = r#"printf 'hello\n' > m && python3 -c '
import mmap, os
fd = os.open("m", os.O_RDWR | os.O_APPEND)
m = mmap.mmap(fd, 0)
m[0:1] = b"J"
m.flush()
m.close()
os.write(fd, b"more\n")
os.close(fd)
' && cat m"#;
        let (ok, out) = sh(b, script, Duration::from_secs(30));
        assert!(ok, "{out}");
        assert_eq!(
            std::fs::read_to_string(root.join("m")).unwrap(),
            "Jello\nmore\n"
        );
    }
}

/// fallocate(2) in each mode and lseek(2)'s SEEK_DATA/SEEK_HOLE on a
/// sparse file: what each answers, and the file after, as on the
/// server's own file system.
fn sparse_file_story(f: &Path) -> Vec<String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, MetadataExt};
    const MIB: i64 = 1 << 20;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(f)
        .unwrap();
    let fd = file.as_raw_fd();
    let errno = |r: i64| {
        if r < 0 {
            format!(
                "errno {}",
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
            )
        } else {
            r.to_string()
        }
    };
    // SAFETY: fallocate and lseek on a descriptor this function owns.
    let alloc = |mode: i32, off: i64, len: i64| {
        errno(unsafe { libc::fallocate(fd, mode, off, len) }.into())
    };
    // SAFETY: as above.
    let seek = |off: i64, whence: i32| errno(unsafe { libc::lseek(fd, off, whence) });
    let meta = |what: &str, out: &mut Vec<String>| {
        let m = std::fs::metadata(f).unwrap();
        out.push(format!("{what}: size {} blocks {}", m.len(), m.blocks()));
    };
    let zeros_at = |off: u64, len: usize| {
        let mut b = vec![1u8; len];
        file.read_exact_at(&mut b, off).unwrap();
        b.iter().all(|&x| x == 0)
    };
    let mut out = Vec::new();
    out.push(format!("mode 0: {}", alloc(0, 0, MIB)));
    meta("after mode 0", &mut out);
    out.push(format!(
        "keep size: {}",
        alloc(libc::FALLOC_FL_KEEP_SIZE, MIB, MIB)
    ));
    meta("after keep size", &mut out);
    // Data at 4 MiB beyond a hole; then holes and data as lseek sees them.
    file.write_all_at(&vec![b'v'; 64 << 10], 4 << 20).unwrap();
    file.sync_all().unwrap();
    for at in [0, 2 * MIB, 4 * MIB, 4 * MIB + (64 << 10), 5 * MIB] {
        out.push(format!(
            "at {at}: data {} hole {}",
            seek(at, libc::SEEK_DATA),
            seek(at, libc::SEEK_HOLE)
        ));
    }
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    out.push(format!("punch: {}", alloc(punch, 4 * MIB + 8192, 16384)));
    out.push(format!(
        "punched zeros: {}",
        zeros_at((4 << 20) + 8192, 16384)
    ));
    out.push(format!("hole at 4 MiB: {}", seek(4 * MIB, libc::SEEK_HOLE)));
    out.push(format!(
        "zero range: {}",
        alloc(libc::FALLOC_FL_ZERO_RANGE, 4 * MIB, 4096)
    ));
    out.push(format!("zeroed: {}", zeros_at(4 << 20, 4096)));
    out.push(format!("left alone: {}", !zeros_at((4 << 20) + 4096, 4096)));
    // (Blocks at the end depend on how the file system split extents.)
    out.push(format!(
        "size at the end: {}",
        file.metadata().unwrap().len()
    ));
    out
}

#[test]
fn fallocate_and_holes_as_on_the_servers_disk() {
    if fuse_available().is_none() {
        return;
    }
    let work = Scratch::new("sparse");
    let (root, mnt) = (work.path().join("export"), work.path().join("mnt"));
    for d in [&root, &mnt] {
        std::fs::create_dir(d).unwrap();
    }
    let _m = Mount::new(&root, &mnt);
    // On the server's file system itself, beside the export.
    let local = sparse_file_story(&work.path().join("local"));
    let mounted = sparse_file_story(&mnt.join("f"));
    assert_eq!(mounted, local);
    // Not a file system without holes: the story has some.
    assert!(
        local.iter().any(|l| l == "at 0: data 4194304 hole 0"),
        "{local:#?}"
    );
    // The mount's attributes are the server file's.
    let blocks = |p: &Path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap());
    assert_eq!(blocks(&mnt.join("f")), blocks(&root.join("f")));
}
