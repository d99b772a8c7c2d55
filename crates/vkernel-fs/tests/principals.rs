//! The file server's access policy by principal, between two logical hosts
//! that share a cluster key (so the principal a request carries is
//! authenticated): unknown principals refused, read-only ones kept from
//! writing, and handles usable only by the principal that opened them.

use std::collections::HashMap;
use std::time::Duration;

use vkernel::auth::Key;
use vkernel::{Kernel, KernelConfig};
use vkernel_fs::client::{Client, ClientError};
use vkernel_fs::server::{Access, AccessPolicy, FileServer, ServerConfig};
use vkernel_fs::vio::Errno;

fn keyed(peers: Vec<std::net::SocketAddr>) -> Kernel {
    Kernel::start(KernelConfig {
        peers,
        keys: vec![Key {
            id: 1,
            secret: [0x5a; 32],
        }],
        host_timeout: Duration::from_secs(3),
        ..Default::default()
    })
    .expect("host")
}

fn err(r: Result<impl std::fmt::Debug, ClientError>) -> Errno {
    match r {
        Err(ClientError::Server(e)) => e,
        other => panic!("expected a server error, got {other:?}"),
    }
}

/// A client on `k` whose processes run as `principal`.
fn client_as(k: &Kernel, server: vkernel::Pid, principal: u32) -> Client {
    Client::connect_as(k, server, 2, principal).expect("client")
}

#[test]
fn the_file_server_maps_principals_to_access() {
    let a = keyed(vec![]);
    let b = keyed(vec![a.local_addr()]);
    a.add_peer(b.local_addr());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shared.txt"), b"for everyone").unwrap();
    let mut principals = HashMap::new();
    principals.insert(10, Access::ReadWrite);
    principals.insert(20, Access::ReadOnly);
    let srv = FileServer::start(
        &a,
        dir.path(),
        ServerConfig {
            access: AccessPolicy {
                default: Access::None,
                principals,
            },
            ..Default::default()
        },
    )
    .unwrap();
    // Unknown principal (and the default principal 0): refused outright.
    let stranger = Client::connect_as(&b, srv.pid(), 1, 99);
    assert!(
        matches!(stranger, Err(ClientError::Server(Errno::EACCES))),
        "{stranger:?}"
    );
    // Read-only: reads work, every kind of write is refused.
    let ro = client_as(&b, srv.pid(), 20);
    assert_eq!(ro.read_file("shared.txt").unwrap(), b"for everyone");
    assert_eq!(err(ro.write_file("new.txt", b"x", false)), Errno::EROFS);
    assert_eq!(err(ro.mkdir("d", 0o755)), Errno::EROFS);
    assert_eq!(err(ro.unlink("shared.txt")), Errno::EROFS);
    assert_eq!(err(ro.rename("shared.txt", "moved", 0)), Errno::EROFS);
    assert_eq!(err(ro.truncate("shared.txt", 0)), Errno::EROFS);
    assert_eq!(err(ro.open("shared.txt", libc::O_WRONLY, 0)), Errno::EROFS);
    assert!(dir.path().join("shared.txt").exists());
    // Read-write principal.
    let rw = client_as(&b, srv.pid(), 10);
    rw.write_file("new.txt", b"written", true).unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("new.txt")).unwrap(),
        b"written"
    );
    // A handle opened by principal 10 is useless to principal 20, even on
    // the same host.
    let (fh, _) = rw.open("new.txt", libc::O_RDONLY, 0).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(err(ro.read(fh, 0, &mut buf)), Errno::EBADF);
    assert_eq!(rw.read(fh, 0, &mut buf).unwrap(), 7);
    rw.close(fh).unwrap();
}
