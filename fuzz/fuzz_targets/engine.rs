//! The protocol engine as a sequence of datagrams: whatever arrives, from
//! whichever address and at whatever time, the engine never panics and its
//! alien pool stays bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;
use vkernel_proto::{Config, Engine, HostId, Message, Pid, SegAccess, SharedBuf};

fuzz_target!(|data: &[u8]| {
    let cfg = Config {
        host_id: Some(HostId(1)),
        alien_pool: 8,
        alien_per_host: 4,
        datagram_size: 1200,
        ..Config::default()
    };
    let mut e = Engine::new(cfg, 0);
    let server = e.create_process().expect("process");
    let client = e.create_process().expect("process");
    let _ = e.receive(0, server, None, Some(SharedBuf::new(vec![0; 512]).lend()));
    let mut m = Message::with_code(1);
    m.set_segment(SegAccess::READ_WRITE, 4096);
    // A remote Send whose segment fuzzed bulk packets may try to reach.
    let _ = e.send(
        0,
        client,
        Pid::new(HostId(2), 5),
        m,
        Some(SharedBuf::new(vec![7; 4096]).lend()),
    );
    let mut now = 1;
    // Input: records of [len_hi, len_lo, addr byte, time delta, payload...].
    let mut rest = data;
    while rest.len() >= 4 {
        let len = (u16::from_be_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 4);
        let from: SocketAddr = ([127, 0, 0, rest[2]], 4000).into();
        now += rest[3] as u64 * 1000;
        let mut pkt = rest[4..4 + len].to_vec();
        // Often aim at our host so handlers, not just the decoder, run.
        if pkt.len() >= 20 && rest[2] & 1 == 1 {
            pkt[0] = vkernel_proto::wire::MAGIC;
            pkt[1] = vkernel_proto::wire::VERSION;
            pkt[16..18].copy_from_slice(&1u16.to_be_bytes());
            let l = (pkt.len().saturating_sub(76)) as u32;
            if pkt.len() >= 32 {
                pkt[28..32].copy_from_slice(&l.to_be_bytes());
            }
        }
        e.handle_datagram(now, from, &pkt);
        e.handle_timeout(now);
        while e.poll_transmit().is_some() {}
        while let Some(ev) = e.poll_event() {
            if let vkernel_proto::Event::Wake(p) = ev {
                let _ = e.take_completion(p);
            }
        }
        assert!(e.stats().aliens_in_use <= 8);
        rest = &rest[4 + len..];
    }
});
