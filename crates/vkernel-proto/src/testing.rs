//! Test support shared by the engine's unit tests and the simulator
//! (`tests/sim.rs`): moving datagrams between engines the way the runtime
//! does, and deterministic test data. Built for tests and with the
//! `test-support` feature; not part of the engine.

use std::net::SocketAddr;

use crate::config::Micros;
use crate::engine::{Engine, Transmit};
use crate::wire;

/// Takes everything `e` has to send. With `gather`, bulk chunks are taken
/// as the runtime takes them (header and data still in the lent buffer,
/// [`Engine::send_chunk_batch`]) and joined here into one datagram; the rest
/// comes from [`Engine::poll_transmit`]. Also returns how many were
/// gathered.
pub fn take_output(e: &mut Engine, gather: bool) -> (Vec<Transmit>, usize) {
    let mut out = Vec::new();
    if gather {
        e.send_chunk_batch(|batch| {
            for g in batch {
                let mut data = g.head.to_vec();
                if g.copy_data(&mut data) {
                    out.push(Transmit { to: g.to, data });
                }
            }
        });
    }
    let gathered = out.len();
    out.extend(std::iter::from_fn(|| e.poll_transmit()));
    (out, gathered)
}

/// Hands datagram `data` from `from` to `e` at `now`. With `in_place`, a
/// bulk chunk the engine has a place for is received straight there, as
/// the runtime does ([`Engine::placement`], [`Engine::handle_placed`]).
/// Returns whether it was.
pub fn deliver(e: &mut Engine, now: Micros, from: SocketAddr, data: &[u8], in_place: bool) -> bool {
    let fixed = wire::FIXED_BYTES;
    let head = data.get(..fixed).unwrap_or(&[]);
    let placed = in_place
        && e.placement(head)
            .is_some_and(|mut place| place.fill(data.get(fixed..).unwrap_or(&[])));
    if placed {
        e.handle_placed(now, from, head);
    } else {
        e.handle_datagram(now, from, data);
    }
    placed
}

/// Deterministic non-trivial bytes (xorshift from `seed`).
pub fn pattern(seed: u32, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}
