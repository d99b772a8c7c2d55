//! An IPdisk (RAM) on one logical host and an NBD gateway on another, in
//! one program: `cargo run --release --example gateway -- 127.0.0.1:10809 64M 60`
//! (listen address, disk size, seconds to run). For informal measurements
//! with qemu-img, nbdcopy or fio against `nbd://ADDR`.

use std::sync::Arc;
use std::time::Duration;

use vkernel::{Kernel, KernelConfig};
use vkernel_disk::backing::{parse_size, Backing, BackingSpec};
use vkernel_disk::client::Client;
use vkernel_disk::nbd::{Export, Gateway, ListenAddr};
use vkernel_disk::server::{DiskServer, ServerConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let listen: ListenAddr = args
        .get(1)
        .map_or("127.0.0.1:10809", String::as_str)
        .parse()?;
    let size = parse_size(args.get(2).map_or("64M", String::as_str))?;
    let secs: u64 = args.get(3).map_or(Ok(60), |s| s.parse())?;
    // VK_SPIN_US: a fixed busy-poll before blocking (default: adaptive).
    let spin = std::env::var("VK_SPIN_US")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_micros);
    let a = Kernel::start(KernelConfig {
        spin: spin.unwrap_or(KernelConfig::default().spin),
        adaptive_spin: spin.is_none(),
        ..Default::default()
    })?;
    let b = Kernel::start(KernelConfig {
        peers: vec![a.local_addr()],
        spin: spin.unwrap_or(KernelConfig::default().spin),
        adaptive_spin: spin.is_none(),
        ..Default::default()
    })?;
    a.add_peer(b.local_addr());
    let srv = DiskServer::start(
        &a,
        Backing::open(&BackingSpec::Ram(size))?,
        ServerConfig {
            owner_key: Some(1),
            ..Default::default()
        },
    )?;
    let c = Client::open(
        // SAME_HOST=1: the gateway's client on the disk's own host.
        if std::env::var("SAME_HOST").is_ok_and(|v| v == "1") {
            &a
        } else {
            &b
        },
        srv.pid(),
        0,
        1,
        32,
    )?;
    let gw = Gateway::start(
        &listen,
        vec![Export {
            name: "ipdisk".into(),
            description: "example".into(),
            dev: Arc::new(c),
        }],
    )?;
    println!("serving {size} bytes on {}", gw.addr());
    std::thread::sleep(Duration::from_secs(secs));
    for (name, k) in [("disk host", &a), ("gateway host", &b)] {
        let s = k.stats();
        println!(
            "{name}: {} retransmits, {} bulk retransmits, {} duplicates, {} saved replies resent, {} timeouts",
            s.retransmits, s.bulk_retransmits, s.duplicates, s.saved_replies_resent, s.timeouts
        );
    }
    Ok(())
}
