//! Peers by name (`KernelConfig::named_peers`, `Kernel::add_peer_spec`)
//! with `localhost`, which the hosts file resolves: given at start, added
//! at run time to an embedded host, and added through an attached
//! program, whose machine host then follows the name. (Several addresses
//! per name and names changing over time: vkernel-cli/tests/dns_peers.rs,
//! in a network namespace with its own hosts file.)

use std::time::Duration;

mod common;

use common::wait_for;
use vkernel::{Kernel, KernelConfig, PeerSpec, Pid, Process, Scope};

const NAME: u32 = 0x0d15;

/// True once `p` finds the process registered as NAME on another host.
fn finds(p: &Process, want: Pid) -> Option<()> {
    (p.get_pid(NAME, Scope::Remote).ok()? == want).then_some(())
}

#[test]
fn hosts_find_peers_by_name_embedded_and_attached() {
    let b = Kernel::start(KernelConfig::default()).expect("start b");
    let server = b.create_process().expect("server");
    server.set_pid(NAME, server.pid(), Scope::Any);
    let name = PeerSpec::parse(&format!("localhost:{}", b.local_addr().port())).expect("spec");
    assert!(name.addr().is_none(), "a name, not an address");
    let limit = Duration::from_secs(20);

    // Given as the host starts.
    let a = Kernel::start(KernelConfig {
        named_peers: vec![name.clone()],
        ..Default::default()
    })
    .expect("start a");
    let p = a.create_process().expect("process");
    wait_for(limit, "a host did not find its named peer", || {
        finds(&p, server.pid())
    });

    // Added to a running host.
    let c = Kernel::start(KernelConfig::default()).expect("start c");
    let q = c.create_process().expect("process");
    assert!(q.get_pid(NAME, Scope::Remote).expect("get_pid").is_none());
    c.add_peer_spec(&name).expect("add name");
    wait_for(
        limit,
        "a named peer added at run time was not found",
        || finds(&q, server.pid()),
    );

    // Added by an attached program: the machine host follows the name.
    let dir = std::env::temp_dir().join(format!("vk-discover-{}", std::process::id()));
    let path = dir.join("host.sock");
    let m = Kernel::start(KernelConfig::default()).expect("start machine host");
    let _srv = m.serve_attach(&path, 0o600).expect("serve attach");
    let at = Kernel::attach(&path).expect("attach");
    let r = at.create_process().expect("process");
    at.add_peer_spec(&name).expect("add name");
    wait_for(limit, "the machine host did not follow the name", || {
        finds(&r, server.pid())
    });
    drop(r);
    drop(at);
    let _ = std::fs::remove_dir_all(&dir);
}
