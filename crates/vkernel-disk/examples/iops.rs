//! 4 KiB random reads from an IPdisk by the native client, from T threads,
//! for profiling the disk path without NBD:
//! `cargo run --release -p vkernel-disk --example iops -- THREADS SECONDS SPIN_US`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkernel::{Kernel, KernelConfig};
use vkernel_disk::backing::{Backing, BackingSpec};
use vkernel_disk::client::Client;
use vkernel_disk::server::{DiskServer, ServerConfig};

fn main() {
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (threads, secs, spin) = (arg(1, 8) as usize, arg(2, 3), arg(3, 0));
    let kc = |peers| KernelConfig {
        peers,
        spin: Duration::from_micros(spin),
        adaptive_spin: false,
        ..Default::default()
    };
    let a = Kernel::start(kc(vec![])).expect("host a");
    let b = Kernel::start(kc(vec![a.local_addr()])).expect("host b");
    a.add_peer(b.local_addr());
    let store = Backing::open(&BackingSpec::Ram(64 << 20)).expect("ram");
    let srv = DiskServer::start(
        &a,
        store,
        ServerConfig {
            owner_key: Some(7),
            ..Default::default()
        },
    )
    .expect("server");
    let c = Arc::new(Client::open(&b, srv.pid(), 0, 7, 32).expect("client"));
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(secs);
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (c, done) = (c.clone(), done.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                while Instant::now() < end {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = (x % (16384 - 1)) * 4096;
                    c.read(off, &mut buf).expect("read");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("thread");
    }
    let n = done.load(Ordering::Relaxed);
    println!(
        "{threads} threads, spin {spin} µs: {} IOPS",
        n / secs.max(1)
    );
}
