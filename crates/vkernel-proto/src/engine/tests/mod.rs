//! Unit tests of the engine, by concern: one to three engines wired through
//! an in-memory network that delivers every datagram at once and in order
//! (10 µs apart), unless a test drops or forges some. Time only moves when
//! a test says so (no wall clock). Datagrams move between engines as in
//! the simulator (`crate::testing`).

mod aliens;
mod auth;
mod bulk;
mod congestion;
mod exchange;
mod groups;
mod naming;
mod retransmit;
mod robustness;
mod scale;
mod sender;
mod timers;

use std::collections::BTreeSet;

use super::*;
use crate::message::{GroupMode, IDEMPOTENT, NO_APPEND};
use crate::segment::SharedBuf;
use crate::testing::{self, pattern};
use crate::wire::{decode, encode};
use proptest::prelude::*;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 5000 + i as u16))
}

/// Bytes of chunk data per bulk datagram with `datagram_size = 1200`.
const CHUNK: usize = 1200 - wire::FIXED_BYTES - crate::auth::TRAILER_BYTES;

/// Decides whether a datagram (from index, to index, bytes) is delivered.
type Filter = Box<dyn FnMut(usize, usize, &[u8]) -> bool>;

/// One datagram an engine emitted (delivered or not).
struct Sent {
    to: usize,
    data: Vec<u8>,
}

impl Sent {
    fn ptype(&self) -> PacketType {
        decode(&self.data)
            .expect("engines emit valid datagrams")
            .header
            .ptype
    }
}

struct Net {
    e: Vec<Engine>,
    now: Micros,
    /// Drop the next n datagrams.
    drop_next: usize,
    filter: Option<Filter>,
    sent: Vec<Sent>,
    /// Take bulk chunks by `Engine::send_chunk_batch` (as the runtime does)
    /// rather than encoded by `poll_transmit`.
    gather: bool,
    /// Datagrams taken that way.
    gathered: usize,
    /// Receive bulk data in place (`Engine::placement`), as the runtime
    /// does, and count the datagrams received so.
    place: bool,
    placed: usize,
}

impl Net {
    fn new(n: usize) -> Net {
        Net::with(n, |_, _| {})
    }

    /// `n` engines with host ids 1..=n, each listing the others as peers;
    /// `f` adjusts each configuration.
    fn with(n: usize, f: impl Fn(usize, &mut Config)) -> Net {
        let e = (0..n)
            .map(|i| {
                let mut c = Config {
                    host_id: Some(HostId(i as u16 + 1)),
                    discovery: (0..n).filter(|&j| j != i).map(addr).collect(),
                    datagram_size: 1200,
                    window: 8 * CHUNK,
                    alien_pool: 4,
                    alien_per_host: 4,
                    seed: i as u64,
                    // MoveTo waits for its acknowledgement, unless a test
                    // turns write-behind on (`tests/bulk.rs`).
                    write_behind: 0,
                    // These hosts sit at loopback addresses but stand for
                    // machines of a network; `timers.rs` turns it on.
                    local_send_floor: 0,
                    ..Config::default()
                };
                f(i, &mut c);
                let mut e = Engine::new(c, 0);
                while e.poll_event().is_some() {}
                e
            })
            .collect();
        let mut net = Net {
            e,
            now: 0,
            drop_next: 0,
            filter: None,
            sent: Vec::new(),
            gather: false,
            gathered: 0,
            place: false,
            placed: 0,
        };
        // Deliver the fixed-id announcements; they are not what tests count.
        net.run();
        net.sent.clear();
        net
    }

    /// Delivers datagrams until no engine has anything to send.
    fn run(&mut self) {
        loop {
            let mut any = false;
            for i in 0..self.e.len() {
                let (out, gathered) = testing::take_output(&mut self.e[i], self.gather);
                self.gathered += gathered;
                for t in out {
                    any = true;
                    let j = usize::from(t.to.port()).wrapping_sub(5000);
                    let mut deliver = j < self.e.len();
                    if self.drop_next > 0 {
                        self.drop_next -= 1;
                        deliver = false;
                    }
                    if deliver {
                        if let Some(f) = self.filter.as_mut() {
                            deliver = f(i, j, &t.data);
                        }
                    }
                    if deliver {
                        self.now += 10;
                        let now = self.now;
                        let e = &mut self.e[j];
                        if testing::deliver(e, now, addr(i), &t.data, self.place) {
                            self.placed += 1;
                        }
                    }
                    self.sent.push(Sent {
                        to: j,
                        data: t.data,
                    });
                }
            }
            if !any {
                return;
            }
        }
    }

    /// Runs timers and the network until `done` holds or `limit` µs pass.
    /// Returns whether `done` held.
    fn advance_until(&mut self, limit: Micros, mut done: impl FnMut(&mut Net) -> bool) -> bool {
        let end = self.now + limit;
        let mut same_time = 0;
        loop {
            self.run();
            if done(self) {
                return true;
            }
            let t = self
                .e
                .iter()
                .map(|e| e.poll_timeout())
                .min()
                .unwrap_or(Micros::MAX);
            if t > end {
                self.now = self.now.max(end);
                return done(self);
            }
            if t <= self.now {
                same_time += 1;
                assert!(same_time < 1000, "a timer stays due at t={}", self.now);
            } else {
                same_time = 0;
                self.now = t;
            }
            let now = self.now;
            for e in &mut self.e {
                if now >= e.poll_timeout() {
                    e.handle_timeout(now);
                }
            }
        }
    }

    /// Lets `dt` µs pass.
    fn advance(&mut self, dt: Micros) {
        self.advance_until(dt, |_| false);
    }

    /// Hands a forged datagram to engine `to` as if engine `from` sent it.
    fn inject(&mut self, to: usize, from: usize, data: &[u8]) {
        self.now += 10;
        let now = self.now;
        self.e[to].handle_datagram(now, addr(from), data);
    }

    /// Types of the datagrams sent since `mark` (an index into `sent`).
    fn types_since(&self, mark: usize) -> Vec<PacketType> {
        self.sent[mark..].iter().map(Sent::ptype).collect()
    }

    /// The last datagram of type `t` sent, if any.
    fn last_of(&self, t: PacketType) -> Option<&Sent> {
        self.sent.iter().rev().find(|s| s.ptype() == t)
    }

    /// Makes every host learn every other host's address, so that no
    /// later datagram is fanned out (a Send to a missing process, nAcked).
    fn introduce(&mut self) {
        for i in 0..self.e.len() {
            for j in 0..self.e.len() {
                if i == j {
                    continue;
                }
                let tmp = self.e[i].create_process().unwrap();
                let ghost = Pid::new(HostId(j as u16 + 1), 0x7fff);
                assert!(!self.e[j].process_exists(ghost));
                let now = self.now;
                self.e[i]
                    .send(now, tmp, ghost, Message::zero(), None)
                    .unwrap();
                self.run();
                assert_eq!(
                    self.e[i].take_completion(tmp),
                    Some(Completion::Send(Err(IpcError::NoSuchProcess(ghost))))
                );
                self.e[i].destroy_process(now, tmp).unwrap();
            }
        }
        for e in &mut self.e {
            while e.poll_event().is_some() {}
        }
    }
}

/// True if `p`'s blocked operation has a completion waiting.
fn completed(e: &Engine, p: Pid) -> bool {
    e.procs
        .get(p.local())
        .is_some_and(|x| x.completion.is_some())
}

fn events(e: &mut Engine) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

fn woke(e: &mut Engine, p: Pid) -> bool {
    events(e).contains(&Event::Wake(p))
}

#[track_caller]
fn reply_of(e: &mut Engine, p: Pid) -> ReplyInfo {
    match e.take_completion(p) {
        Some(Completion::Send(Ok(r))) => r,
        other => panic!("{p}: expected a reply, got {other:?}"),
    }
}

#[track_caller]
fn send_err(e: &mut Engine, p: Pid) -> IpcError {
    match e.take_completion(p) {
        Some(Completion::Send(Err(err))) => err,
        other => panic!("{p}: expected a failed Send, got {other:?}"),
    }
}

#[track_caller]
fn received(e: &mut Engine, p: Pid) -> Received {
    match e.take_completion(p) {
        Some(Completion::Receive(Ok(r))) => r,
        other => panic!("{p}: expected a message, got {other:?}"),
    }
}

#[track_caller]
fn moved(e: &mut Engine, p: Pid) -> Result<usize, IpcError> {
    match e.take_completion(p) {
        Some(Completion::Move(r)) => r,
        other => panic!("{p}: expected a move completion, got {other:?}"),
    }
}

/// A message with code `code` declaring a segment with `access`.
fn seg_msg(code: u32, access: SegAccess) -> Message {
    let mut m = Message::with_code(code);
    m.set_segment(access, 0);
    m
}

/// Asserts two byte strings are equal, reporting the first difference
/// rather than both strings.
#[track_caller]
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes, want {}; first difference at {at:?}",
            got.len(),
            want.len()
        );
    }
}

/// (datagrams sent, datagrams received) by an engine.
fn traffic(s: &Stats) -> (u64, u64) {
    (s.tx.iter().sum(), s.rx.iter().sum())
}
