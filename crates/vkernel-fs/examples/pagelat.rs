//! 4 KiB page read latency through the file server between two logical
//! hosts (for profiling): `cargo run --release -p vkernel-fs --example pagelat -- N`.

use std::time::{Duration, Instant};
use vkernel::{Kernel, KernelConfig};
use vkernel_fs::client::Client;
use vkernel_fs::server::{FileServer, ServerConfig};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let a = Kernel::start(KernelConfig::default()).expect("a");
    let b = Kernel::start(KernelConfig {
        peers: vec![a.local_addr()],
        ..Default::default()
    })
    .expect("b");
    a.add_peer(b.local_addr());
    let dir = std::env::temp_dir().join(format!("pagelat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("f"), vec![7u8; 1 << 20]).expect("file");
    let s = FileServer::start(&a, &dir, ServerConfig::default()).expect("server");
    let c = Client::connect(&b, s.pid(), 2).expect("client");
    let (fh, _) = c.open("f", libc::O_RDWR, 0).expect("open");
    let mut page = vec![0u8; 4096];
    let mut lat: Vec<Duration> = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        c.read(fh, (i * 37 % 256) * 4096, &mut page).expect("read");
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "page read median {:?} p99 {:?}",
        lat[n / 2],
        lat[n * 99 / 100]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
