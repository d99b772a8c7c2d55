//! REMOVEV, several UNLINKs and RMDIRs in one request, end to end across
//! two hosts on loopback UDP: done in order, stopped at the first
//! failure, told to watching clients as single removals are, and
//! malformed batches refused without harm.

use std::path::Path;
use std::time::Duration;

use vkernel::{Kernel, KernelConfig, Segment};
use vkernel_fs::client::{Client, ClientError};
use vkernel_fs::server::{FileServer, ServerConfig};
use vkernel_fs::vio::{self, Errno, Request};

fn two_hosts() -> (Kernel, Kernel) {
    let host = |peers| {
        Kernel::start(KernelConfig {
            peers,
            host_timeout: Duration::from_secs(3),
            ..Default::default()
        })
        .expect("start host")
    };
    let a = host(vec![]);
    let b = host(vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    (a, b)
}

fn server(k: &Kernel, root: &Path) -> FileServer {
    FileServer::start(k, root, ServerConfig::default()).expect("file server")
}

const U: u32 = vio::REMOVE_UNLINK;
const R: u32 = vio::REMOVE_RMDIR;

#[test]
fn removals_are_done_in_order_until_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in ["a", "b", "c"] {
        std::fs::create_dir(root.join(d)).unwrap();
    }
    for f in ["a/x", "a/y", "b/z"] {
        std::fs::write(root.join(f), f).unwrap();
    }
    let (ka, kb) = two_hosts();
    let srv = server(&ka, root);
    let c = Client::connect(&kb, srv.pid(), 2).unwrap();

    // The files of a, then a; b is not empty, so c is not tried.
    let items: [(u32, &[u8]); 5] = [(U, b"a/x"), (U, b"a/y"), (R, b"a"), (R, b"b"), (R, b"c")];
    let (done, err) = c.remove_many(&items);
    assert_eq!(done, 3);
    assert!(
        matches!(err, Some(ClientError::Server(Errno::ENOTEMPTY))),
        "{err:?}"
    );
    assert!(!root.join("a").exists());
    assert!(root.join("b/z").exists() && root.join("c").exists());

    // Many: more than one batch holds.
    std::fs::create_dir(root.join("m")).unwrap();
    let names: Vec<String> = (0..600).map(|i| format!("m/f{i:04}")).collect();
    for n in &names {
        std::fs::write(root.join(n), b"").unwrap();
    }
    let mut items: Vec<(u32, &[u8])> = names.iter().map(|n| (U, n.as_bytes())).collect();
    items.push((R, b"m"));
    let (done, err) = c.remove_many(&items);
    assert_eq!((done, err.is_none()), (601, true), "{err:?}");
    assert!(!root.join("m").exists());

    // An empty list, and a failure at the very first.
    assert_eq!(c.remove_many(&[]).0, 0);
    let (done, err) = c.remove_many(&[(U, b"nope"), (R, b"c")]);
    assert_eq!(done, 0);
    assert!(matches!(err, Some(ClientError::Server(Errno::ENOENT))));
    assert!(root.join("c").exists());
}

#[test]
fn malformed_batches_are_refused_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"data").unwrap();
    std::fs::write(dir.path().join("g"), b"data").unwrap();
    let (ka, kb) = two_hosts();
    let srv = server(&ka, dir.path());
    let p = kb.create_process().unwrap();
    // (status, removals done) of a REMOVEV of `count` over `seg`.
    let ask = |count: u32, seg: &[u8]| {
        let mut m = Request::Removev {
            count,
            len: seg.len() as u32,
        }
        .encode();
        p.send_with_segment(&mut m, srv.pid(), Segment::Read(seg))
            .expect("exchange");
        (vio::status(&m), vio::reply_words(&m)[0])
    };
    let rec = |kind: u32, path: &[u8]| {
        let mut v = kind.to_be_bytes().to_vec();
        v.extend_from_slice(&(path.len() as u32).to_be_bytes());
        v.extend_from_slice(path);
        v
    };
    // Over the limits: refused before anything is done.
    let mut m = Request::Removev { count: 1, len: 0 }.encode();
    m.0[1] = vio::MAX_REMOVEV + 1;
    p.send(&mut m, srv.pid()).unwrap();
    assert_eq!(vio::status(&m), Errno::EINVAL);
    // A count the segment does not hold: EPROTO, nothing done.
    assert_eq!(ask(2, &rec(U, b"f")), (Errno::EPROTO, 0));
    assert!(dir.path().join("f").exists());
    // An unknown kind: EINVAL, nothing done, even after a good record.
    let mut two = rec(U, b"f");
    two.extend(rec(7, b"g"));
    assert_eq!(ask(2, &two), (Errno::EINVAL, 0));
    assert!(dir.path().join("f").exists());
    // A path escaping the root is refused as UNLINK's would be.
    assert_ne!(ask(1, &rec(U, b"../outside")).0, Errno::OK);
    // Still serving.
    let c = Client::connect(&kb, srv.pid(), 1).unwrap();
    assert_eq!(c.read_file("g").unwrap(), b"data");
}
