//! Authenticated datagrams: arbitrary bytes, and genuine sealed datagrams
//! with fuzzed mutations, fed to a keyed engine (MAC, and AEAD with either
//! cipher). It never panics, and nothing unauthentic reaches the protocol.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vkernel_proto::auth::{AuthConfig, Cipher, Key};
use vkernel_proto::{Config, Engine, HostId, Message};

fn keyed(host: u16, encrypt: bool, cipher: Cipher) -> Engine {
    let cfg = Config {
        host_id: Some(HostId(host)),
        discovery: vec![([127, 0, 0, 1], 4000 + host).into()],
        auth: Some(AuthConfig {
            keys: vec![Key {
                id: 1,
                secret: [9; 32],
            }],
            send_key: 1,
            encrypt,
            cipher,
            counter_start: 1 << 40,
            max_skew: 1_000_000,
            salt: host as u32,
        }),
        ..Config::default()
    };
    let mut e = Engine::new(cfg, 0);
    while e.poll_event().is_some() {}
    while e.poll_transmit().is_some() {}
    e
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let encrypt = mode & 1 == 1;
    let cipher = if mode & 2 == 2 {
        Cipher::Aes256Gcm
    } else {
        Cipher::ChaCha20Poly1305
    };
    let mut a = keyed(1, encrypt, cipher);
    let mut b = keyed(2, encrypt, cipher);
    // A genuine sealed request from b to a process of a.
    let s = a.create_process().expect("process");
    let c = b.create_process().expect("process");
    let _ = b.send(0, c, s, Message::with_code(3), None);
    let genuine: Vec<u8> = std::iter::from_fn(|| b.poll_transmit())
        .map(|t| t.data)
        .last()
        .unwrap_or_default();
    assert!(!genuine.is_empty(), "the request went out");
    let from = ([127, 0, 0, 2], 4000).into();
    let before = a.stats().rx;
    // Arbitrary bytes, then the genuine datagram with the input XORed in.
    a.handle_datagram(1, from, rest);
    let mut m = genuine.clone();
    let n = m.len().max(1);
    for (i, &x) in rest.iter().enumerate() {
        if let Some(b) = m.get_mut(i % n) {
            *b ^= x;
        }
    }
    let changed = m != genuine;
    a.handle_datagram(2, from, &m);
    if changed {
        assert_eq!(
            a.stats().rx,
            before,
            "a modified datagram reached the protocol"
        );
    }
});
