//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;
use vkernel::{FaultConfig, Kernel, KernelConfig};

/// Two logical hosts on loopback that know each other as peers.
pub fn two_hosts() -> (Kernel, Kernel) {
    two_hosts_with(FaultConfig::default(), Duration::from_secs(3))
}

/// Two logical hosts with fault injection on both.
pub fn two_hosts_with(faults: FaultConfig, host_timeout: Duration) -> (Kernel, Kernel) {
    let a = Kernel::start(KernelConfig {
        faults: faults.clone(),
        host_timeout,
        ..Default::default()
    })
    .expect("start a");
    let b = Kernel::start(KernelConfig {
        peers: vec![a.local_addr()],
        faults: FaultConfig {
            seed: faults.seed.wrapping_add(1),
            ..faults
        },
        host_timeout,
        ..Default::default()
    })
    .expect("start b");
    a.add_peer(b.local_addr());
    assert_ne!(a.host_id(), b.host_id());
    (a, b)
}

/// Deterministic test pattern.
pub fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_be_bytes()[0] ^ salt)
        .collect()
}

/// Polls `cond` every few milliseconds until it gives a value; panics
/// with `what` after `limit`. A hang guard, never a speed check.
#[allow(dead_code)] // not every test binary uses it
pub fn wait_for<T>(limit: Duration, what: &str, mut cond: impl FnMut() -> Option<T>) -> T {
    let end = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(std::time::Instant::now() < end, "{what} (waited {limit:?})");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// UDP datagrams this machine dropped because a socket's receive buffer
/// was full (`RcvbufErrors` in /proc/net/snmp), so far.
pub fn udp_rcvbuf_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}
