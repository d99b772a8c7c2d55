//! Paths longer than Linux's PATH_MAX (4096 bytes) from the export root:
//! a real server and client (on one host, and across two over loopback
//! UDP) make and use a tree about 6,000 bytes deep, and the server's disk
//! holds what the client made. Over the limit the server reports
//! (64 KiB), ENAMETOOLONG as before. Invalidations of such paths reach a
//! watching client whole.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use vkernel::{Kernel, KernelConfig};
use vkernel_fs::client::{Client, ClientError};
use vkernel_fs::server::{FileServer, ServerConfig};
use vkernel_fs::vio::{self, Errno};

fn host(peers: Vec<std::net::SocketAddr>) -> Kernel {
    Kernel::start(KernelConfig {
        peers,
        host_timeout: Duration::from_secs(5),
        ..Default::default()
    })
    .expect("start host")
}

fn server_err(r: Result<impl std::fmt::Debug, ClientError>) -> Errno {
    match r {
        Err(ClientError::Server(e)) => e,
        other => panic!("expected a server error, got {other:?}"),
    }
}

/// A 100-byte component.
fn component(i: usize) -> String {
    format!("{i:03}-{}", "x".repeat(96))
}

/// The server's disk, read without a path over PATH_MAX: one
/// directory at a time.
fn on_disk(root: &Path, rel: &str) -> Option<Vec<u8>> {
    let mut dir: OwnedFd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
        .expect("open the root");
    let mut parts: Vec<&str> = rel.split('/').collect();
    let last = parts.pop()?;
    for p in parts {
        dir = rustix::fs::openat(&dir, p, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).ok()?;
    }
    let fd = rustix::fs::openat(&dir, last, OFlags::RDONLY, Mode::empty()).ok()?;
    let mut f = std::fs::File::from(fd);
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut out).ok()?;
    Some(out)
}

/// Makes a tree 60 components (6,060 bytes) deep and uses it: every
/// operation on the way down and at the bottom, then removes it.
fn deep_tree(c: &Client, root: &Path) {
    let mut path = String::new();
    for i in 0..60 {
        if i > 0 {
            path.push('/');
        }
        path.push_str(&component(i));
        let a = c.mkdir(&path, 0o755).unwrap_or_else(|e| {
            panic!("mkdir at {} bytes: {e}", path.len());
        });
        assert!(a.is_dir());
    }
    assert!(path.len() > 6000, "{}", path.len());
    let f = format!("{path}/file");
    let (fh, a) = c.create(&f, 0o640).unwrap();
    assert_eq!(a.mode & 0o777, 0o640);
    assert_eq!(c.write(fh, 0, b"deep data\n").unwrap(), 10);
    c.fsync(fh, false).unwrap();
    c.close(fh).unwrap();
    assert_eq!(c.stat(&f).unwrap().size, 10);
    assert_eq!(c.read_file(&f).unwrap(), b"deep data\n");
    assert_eq!(on_disk(root, &f).as_deref(), Some(&b"deep data\n"[..]));
    // Rename within the bottom directory, and to a shallow name and back.
    let g = format!("{path}/renamed");
    c.rename(&f, &g, 0).unwrap();
    assert_eq!(server_err(c.stat(&f)), Errno::ENOENT);
    c.rename(&g, "shallow", 0).unwrap();
    assert_eq!(
        on_disk(root, "shallow").as_deref(),
        Some(&b"deep data\n"[..])
    );
    c.rename("shallow", &g, 0).unwrap();
    assert_eq!(on_disk(root, &g).as_deref(), Some(&b"deep data\n"[..]));
    // Links, hard and symbolic, and attributes by path.
    let l = format!("{path}/link");
    c.symlink("renamed", &l).unwrap();
    assert_eq!(c.readlink(&l).unwrap(), b"renamed");
    assert_eq!(c.stat(&l).unwrap().size, 10);
    assert!(c.lstat(&l).unwrap().is_symlink());
    let h = format!("{path}/hard");
    assert_eq!(c.link(&g, &h).unwrap().nlink, 2);
    assert_eq!(c.chmod(&h, 0o600).unwrap().mode & 0o777, 0o600);
    c.truncate(&h, 4).unwrap();
    assert_eq!(c.read_file(&g).unwrap(), b"deep");
    let mut names: Vec<Vec<u8>> = c
        .readdir(&path)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    names.sort();
    assert_eq!(names, [&b"hard"[..], b"link", b"renamed"]);
    // Over the server's limit (64 KiB): as a local file system says it.
    let too_long = format!("{path}/{}", "y/".repeat(40_000));
    assert_eq!(server_err(c.stat(&too_long)), Errno::ENAMETOOLONG);
    // `..` a little way up is followed; out of the root never.
    let back = format!("{path}/../{}/renamed", component(59));
    assert_eq!(c.stat(back).unwrap().size, 4);
    let up = format!("{path}/{}", "../".repeat(60));
    assert_eq!(server_err(c.stat(format!("{up}.."))), Errno::EXDEV);
    // Everything removed again, bottom up.
    for n in [&g, &h, &l] {
        c.unlink(n).unwrap();
    }
    let mut at = path.clone();
    loop {
        c.rmdir(&at).unwrap();
        match at.rfind('/') {
            Some(i) => at.truncate(i),
            None => break,
        }
    }
    assert!(std::fs::read_dir(root).unwrap().next().is_none());
}

#[test]
fn a_tree_deeper_than_path_max_works_on_one_host() {
    let dir = tempfile::tempdir().unwrap();
    let k = host(vec![]);
    let srv = FileServer::start(&k, dir.path(), ServerConfig::default()).unwrap();
    let c = Client::connect(&k, srv.pid(), 2).unwrap();
    deep_tree(&c, dir.path());
}

#[test]
fn a_tree_deeper_than_path_max_works_across_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let a = host(vec![]);
    let b = host(vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    let srv = FileServer::start(&a, dir.path(), ServerConfig::default()).unwrap();
    let c = Client::connect(&b, srv.pid(), 2).unwrap();
    deep_tree(&c, dir.path());
}

/// A rename of names 40,000 bytes deep is reported to a watching client
/// on another host whole: both paths together are longer than a datagram
/// carries appended, and its callback process takes the rest by MoveFrom.
#[test]
fn invalidations_of_long_paths_arrive_whole() {
    let dir = tempfile::tempdir().unwrap();
    let k = host(vec![]);
    let other = host(vec![k.local_addr()]);
    k.add_peer(other.local_addr());
    let srv = FileServer::start(&k, dir.path(), ServerConfig::default()).unwrap();
    let watcher = Client::connect(&other, srv.pid(), 2).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = move |inv: vio::Invalidation, path: &[u8]| {
        let _ = tx.send((inv.flags, path.to_vec()));
    };
    assert!(watcher.watch(&other, sink).unwrap());
    let c = Client::connect(&k, srv.pid(), 2).unwrap();
    let mut path = String::new();
    for i in 0..200 {
        if i > 0 {
            path.push('/');
        }
        path.push_str(&format!("{i:03}{}", "w".repeat(196)));
        c.mkdir(&path, 0o755).unwrap();
    }
    assert_eq!(path.len(), 39_999);
    let (old, new) = (format!("{path}/old"), format!("{path}/new"));
    let (fh, _) = c.create(&old, 0o644).unwrap();
    c.close(fh).unwrap();
    c.rename(&old, &new, 0).unwrap();
    let want = [old.as_bytes(), b"\0", new.as_bytes()].concat();
    assert!(want.len() > vkernel::MAX_APPEND);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let (flags, p) = rx.recv_timeout(left).expect("the rename's invalidation");
        if flags & vio::INVAL_RENAME != 0 {
            assert_eq!(p.len(), want.len());
            assert!(p == want, "the paths differ");
            break;
        }
    }
    // And back from the other host: the server pulls what did not come
    // appended to the request.
    watcher.rename(&new, &old, 0).unwrap();
    assert!(c.stat(&old).unwrap().is_file());
}
