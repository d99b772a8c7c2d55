//! Unit tests of the engine: one to three engines wired through an in-memory
//! network that delivers every datagram at once and in order (10 µs apart),
//! unless a test drops or forges some. Time only moves when a test says so.

use std::collections::BTreeSet;

use super::*;
use crate::message::{GroupMode, IDEMPOTENT, NO_APPEND};
use crate::segment::SharedBuf;
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
    /// Take bulk chunks by `Engine::send_chunks` (as the runtime does)
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
                let mut out = Vec::new();
                if self.gather {
                    self.e[i].send_chunks(|to, head, data| {
                        out.push(Transmit {
                            to,
                            data: [head, data].concat(),
                        })
                    });
                    self.gathered += out.len();
                }
                while let Some(t) = self.e[i].poll_transmit() {
                    out.push(t);
                }
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
                        let fixed = crate::wire::FIXED_BYTES;
                        let head = t.data.get(..fixed).unwrap_or(&[]);
                        let placed = self.place
                            && match self.e[j].placement(head) {
                                Some(slot) if slot.len() == t.data.len() - fixed => {
                                    slot.copy_from_slice(&t.data[fixed..]);
                                    true
                                }
                                _ => false,
                            };
                        if placed {
                            self.placed += 1;
                            self.e[j].handle_placed(now, addr(i), head);
                        } else {
                            self.e[j].handle_datagram(now, addr(i), &t.data);
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
        .get(&p.local())
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

/// Deterministic non-trivial bytes.
fn pattern(seed: u32, n: usize) -> Vec<u8> {
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

// ------------------------------------------------------------- local IPC

#[test]
fn local_send_receive_reply_in_both_orders() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let s = e.create_process().unwrap();
    let c = e.create_process().unwrap();
    // Send first: the message waits in the sender's descriptor.
    e.send(0, c, s, Message::with_code(3), None).unwrap();
    assert_eq!(
        e.send(0, c, s, Message::zero(), None),
        Err(IpcError::Busy(c))
    );
    let r = e
        .receive(0, s, None, None)
        .unwrap()
        .expect("queued message");
    assert_eq!(
        (r.from, r.forwarder, r.msg.code(), r.seg_bytes),
        (c, c, 3, 0)
    );
    assert!(!woke(e, s), "a receive that returns at once needs no wake");
    assert_eq!(e.take_completion(c), None, "blocked until the reply");
    e.reply(0, s, c, Message::with_code(4), None).unwrap();
    assert!(woke(e, c));
    let rep = reply_of(e, c);
    assert_eq!((rep.msg.code(), rep.from, rep.seg_bytes), (4, s, 0));
    // Receive first: the receiver blocks and is woken by the Send.
    assert_eq!(e.receive(0, s, None, None), Ok(None));
    assert_eq!(
        e.receive(0, s, None, None),
        Err(IpcError::Busy(s)),
        "already blocked"
    );
    e.send(0, c, s, Message::with_code(5), None).unwrap();
    assert!(woke(e, s));
    assert_eq!(received(e, s).msg.code(), 5);
    e.reply(0, s, c, Message::with_code(6), None).unwrap();
    assert_eq!(reply_of(e, c).msg.code(), 6);
    assert_eq!(e.stats().local_exchanges, 2);
    assert!(
        e.poll_transmit().is_none(),
        "local IPC never uses the network"
    );
    // Caller and destination errors leave the caller free.
    let ghost = (2..0x7fff)
        .map(|l| Pid::new(e.host_id().unwrap(), l))
        .find(|p| !e.process_exists(*p))
        .unwrap();
    assert_eq!(
        e.send(0, c, ghost, Message::zero(), None),
        Err(IpcError::NoSuchProcess(ghost))
    );
    assert_eq!(
        e.send(0, ghost, s, Message::zero(), None),
        Err(IpcError::NotAProcess(ghost))
    );
    assert_eq!(
        e.send(0, c, Pid::NONE, Message::zero(), None),
        Err(IpcError::InvalidPid(Pid::NONE))
    );
    // A group with no members: the 1-reply Send waits (for its timeout).
    assert_eq!(
        e.send(0, c, Pid(0x8000_0001), Message::zero(), None),
        Ok(())
    );
    e.cancel(c);
    assert_eq!(
        e.reply(0, s, c, Message::zero(), None),
        Err(IpcError::NotAwaitingReply(c))
    );
    e.send(0, c, s, Message::zero(), None).unwrap();
}

#[test]
fn receive_specific_takes_only_the_named_sender() {
    let mut n = Net::new(2);
    let s = n.e[0].create_process().unwrap();
    let a = n.e[0].create_process().unwrap();
    let b = n.e[0].create_process().unwrap();
    n.e[0].send(0, a, s, Message::with_code(1), None).unwrap();
    n.e[0].send(0, b, s, Message::with_code(2), None).unwrap();
    let r = n.e[0].receive(0, s, Some(b), None).unwrap().unwrap();
    assert_eq!((r.from, r.msg.code()), (b, 2));
    n.e[0].reply(0, s, b, Message::zero(), None).unwrap();
    reply_of(&mut n.e[0], b);
    // Blocked in ReceiveSpecific: other senders stay queued.
    assert_eq!(n.e[0].receive(0, s, Some(b), None), Ok(None));
    let c = n.e[0].create_process().unwrap();
    n.e[0].send(0, c, s, Message::with_code(3), None).unwrap();
    assert_eq!(n.e[0].take_completion(s), None);
    n.e[0].send(0, b, s, Message::with_code(4), None).unwrap();
    assert_eq!(received(&mut n.e[0], s).from, b);
    n.e[0].reply(0, s, b, Message::zero(), None).unwrap();
    // Not a process / not a live local process: "returns 0" as an error.
    let ghost = Pid::new(HostId(1), 0x7fff);
    assert!(!n.e[0].process_exists(ghost));
    assert_eq!(
        n.e[0].receive(0, s, Some(ghost), None),
        Err(IpcError::NoSuchProcess(ghost))
    );
    assert_eq!(
        n.e[0].receive(0, s, Some(Pid::NONE), None),
        Err(IpcError::NoSuchProcess(Pid::NONE))
    );
    // Remote senders: ReceiveSpecific picks one alien among several.
    let x = n.e[1].create_process().unwrap();
    let y = n.e[1].create_process().unwrap();
    n.e[1]
        .send(n.now, x, s, Message::with_code(10), None)
        .unwrap();
    n.e[1]
        .send(n.now, y, s, Message::with_code(11), None)
        .unwrap();
    n.run();
    let r = n.e[0].receive(n.now, s, Some(y), None).unwrap().unwrap();
    assert_eq!((r.from, r.msg.code()), (y, 11));
    n.e[0]
        .reply(n.now, s, y, Message::with_code(12), None)
        .unwrap();
    n.run();
    assert_eq!(reply_of(&mut n.e[1], y).msg.code(), 12);
    // The rest in arrival order: a, c (local), then x (remote).
    let order: Vec<Pid> = (0..3)
        .map(|_| {
            let r = n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
            n.e[0]
                .reply(n.now, s, r.from, Message::zero(), None)
                .unwrap();
            r.from
        })
        .collect();
    assert_eq!(order, vec![a, c, x]);
    n.run();
    reply_of(&mut n.e[1], x);
}

#[test]
fn receive_with_segment_copies_the_first_part() {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[0].create_process().unwrap();
    let data = pattern(1, 3000);
    let seg = SharedBuf::new(data.clone());
    // Local, buffer smaller than the segment.
    let small = SharedBuf::new(vec![0; 1000]);
    n.e[0]
        .send(0, c, s, seg_msg(1, SegAccess::READ), Some(seg.lend()))
        .unwrap();
    let r = n.e[0]
        .receive(0, s, None, Some(small.lend()))
        .unwrap()
        .unwrap();
    assert_eq!((r.seg_bytes, r.msg.seg_len()), (1000, 3000));
    same_bytes(&small.snapshot(), &data[..1000], "small");
    n.e[0].reply(0, s, c, Message::zero(), None).unwrap();
    reply_of(&mut n.e[0], c);
    // Local, buffer larger; write-only and NO_APPEND segments are not copied.
    for (access, no_append, want) in [
        (SegAccess::READ, false, 3000),
        (SegAccess::WRITE, false, 0),
        (SegAccess::READ, true, 0),
    ] {
        let big = SharedBuf::new(vec![0; 5000]);
        let mut m = seg_msg(1, access);
        m.set_flag(NO_APPEND, no_append);
        n.e[0].send(0, c, s, m, Some(seg.lend())).unwrap();
        let r = n.e[0]
            .receive(0, s, None, Some(big.lend()))
            .unwrap()
            .unwrap();
        assert_eq!(r.seg_bytes, want, "{access:?} no_append={no_append}");
        let got = big.snapshot();
        assert_eq!(got[..want], data[..want]);
        assert!(got[want..].iter().all(|&b| b == 0));
        n.e[0].reply(0, s, c, Message::zero(), None).unwrap();
        reply_of(&mut n.e[0], c);
    }
    // Remote: the first part travels in the RemoteSend.
    let rc = n.e[1].create_process().unwrap();
    for no_append in [false, true] {
        let mark = n.sent.len();
        let mut m = seg_msg(1, SegAccess::READ);
        m.set_flag(NO_APPEND, no_append);
        n.e[1].send(n.now, rc, s, m, Some(seg.lend())).unwrap();
        n.run();
        let d = decode(&n.sent[mark].data).unwrap();
        assert_eq!(d.header.ptype, PacketType::RemoteSend);
        assert_eq!(d.header.total_length, 3000);
        assert_eq!(d.data.len(), if no_append { 0 } else { 3000 });
        let buf = SharedBuf::new(vec![0; 1000]);
        let r = n.e[0]
            .receive(n.now, s, None, Some(buf.lend()))
            .unwrap()
            .unwrap();
        assert_eq!(r.msg.seg_len(), 3000);
        assert_eq!(r.msg.seg_access(), SegAccess::READ);
        if no_append {
            assert_eq!(r.seg_bytes, 0);
            // The receiver fetches it instead (three chunks).
            let all = SharedBuf::new(vec![0; 3000]);
            assert_eq!(n.e[0].move_from(n.now, s, rc, 0, all.lend()), Ok(None));
            n.run();
            assert_eq!(moved(&mut n.e[0], s), Ok(3000));
            same_bytes(&all.snapshot(), &data, "all");
        } else {
            assert_eq!(r.seg_bytes, 1000);
            same_bytes(&buf.snapshot(), &data[..1000], "buf");
        }
        n.e[0].reply(n.now, s, rc, Message::zero(), None).unwrap();
        n.run();
        reply_of(&mut n.e[1], rc);
    }
}

#[test]
fn reply_with_segment_writes_into_the_sender_and_checks_rights() {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let other = n.e[0].create_process().unwrap();
    let lc = n.e[0].create_process().unwrap();
    let rc = n.e[1].create_process().unwrap();
    let big = vec![1u8; MAX_APPEND + 1];
    for remote in [false, true] {
        let (h, c) = if remote { (1, rc) } else { (0, lc) };
        // Read-only segment: no reply-with-segment.
        let ro = SharedBuf::new(vec![0; 100]);
        let now = n.now;
        n.e[h]
            .send(now, c, s, seg_msg(1, SegAccess::READ), Some(ro.lend()))
            .unwrap();
        n.run();
        assert_eq!(
            n.e[0].reply(n.now, s, c, Message::zero(), None),
            Err(IpcError::NotAwaitingReply(c)),
            "not received yet"
        );
        n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
        assert_eq!(
            n.e[0].reply(n.now, s, c, Message::zero(), Some((0, b"x"))),
            Err(IpcError::AccessDenied(c))
        );
        assert_eq!(
            n.e[0].reply(n.now, other, c, Message::zero(), None),
            Err(IpcError::NotAwaitingReply(c)),
            "awaiting reply from s, not from other"
        );
        // An empty segment part is a plain reply.
        n.e[0]
            .reply(n.now, s, c, Message::with_code(2), Some((0, b"")))
            .unwrap();
        n.run();
        assert_eq!(reply_of(&mut n.e[h], c).seg_bytes, 0);
        assert!(ro.snapshot().iter().all(|&b| b == 0));
        // Writable segment: bounds, size, then the data at an offset.
        let rw = SharedBuf::new(vec![0; 100]);
        let now = n.now;
        n.e[h]
            .send(now, c, s, seg_msg(1, SegAccess::WRITE), Some(rw.lend()))
            .unwrap();
        n.run();
        n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
        for (off, len) in [(98u32, 5usize), (100, 1), (u32::MAX, 2)] {
            let d = vec![7u8; len];
            assert_eq!(
                n.e[0].reply(n.now, s, c, Message::zero(), Some((off, &d))),
                Err(IpcError::OutOfBounds(c)),
                "off {off} len {len}"
            );
        }
        // More than a datagram: `reply_ahead`'s job, unless the sender is
        // local (then only its segment bounds it).
        let err = if h == 0 {
            IpcError::OutOfBounds(c)
        } else {
            IpcError::SegmentTooLarge { max: MAX_APPEND }
        };
        assert_eq!(
            n.e[0].reply(n.now, s, c, Message::zero(), Some((0, &big))),
            Err(err)
        );
        n.run();
        assert_eq!(
            n.e[h].take_completion(c),
            None,
            "failed replies end nothing"
        );
        n.e[0]
            .reply(n.now, s, c, Message::with_code(3), Some((10, b"hello")))
            .unwrap();
        n.run();
        let rep = reply_of(&mut n.e[h], c);
        assert_eq!((rep.msg.code(), rep.seg_bytes, rep.from), (3, 5, s));
        let mut want = vec![0u8; 100];
        want[10..15].copy_from_slice(b"hello");
        same_bytes(&rw.snapshot(), &want, &format!("remote={remote}"));
    }
}

// -------------------------------------------------------------- Forward

#[test]
fn forward_local_to_local_moves_the_exchange() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let c = e.create_process().unwrap();
    let s1 = e.create_process().unwrap();
    let s2 = e.create_process().unwrap();
    let data = pattern(2, 64);
    let seg = SharedBuf::new(data.clone());
    e.send(
        0,
        c,
        s1,
        seg_msg(5, SegAccess::READ_WRITE),
        Some(seg.lend()),
    )
    .unwrap();
    let ghost = Pid::new(HostId(1), 0x7fff);
    assert_eq!(
        e.forward(0, s1, c, s2, Message::with_code(6)),
        Err(IpcError::NotAwaitingReply(c)),
        "not received yet"
    );
    e.receive(0, s1, None, None).unwrap().unwrap();
    assert_eq!(
        e.forward(0, s2, c, s1, Message::zero()),
        Err(IpcError::NotAwaitingReply(c)),
        "only the process c awaits may forward"
    );
    if !e.process_exists(ghost) {
        assert_eq!(
            e.forward(0, s1, c, ghost, Message::zero()),
            Err(IpcError::NoSuchProcess(ghost))
        );
    }
    assert_eq!(
        e.forward(0, s1, c, Pid::NONE, Message::zero()),
        Err(IpcError::InvalidPid(Pid::NONE))
    );
    e.forward(0, s1, c, s2, Message::with_code(6)).unwrap();
    // The rights moved with the exchange.
    let buf = SharedBuf::new(vec![0; 8]);
    assert_eq!(
        e.move_from(0, s1, c, 0, buf.lend()),
        Err(IpcError::NotAwaitingReply(c))
    );
    let r = e
        .receive(0, s2, None, Some(buf.lend()))
        .unwrap()
        .expect("forwarded message queued");
    assert_eq!((r.from, r.forwarder, r.msg.code()), (c, s1, 6));
    assert_eq!(r.msg.seg_access(), SegAccess::READ_WRITE, "flags kept");
    assert_eq!((r.msg.seg_len(), r.seg_bytes), (64, 8));
    same_bytes(&buf.snapshot(), &data[..8], "buf");
    assert_eq!(e.move_from(0, s2, c, 8, buf.lend()), Ok(Some(8)));
    same_bytes(&buf.snapshot(), &data[8..16], "buf");
    assert_eq!(
        e.reply(0, s1, c, Message::zero(), None),
        Err(IpcError::NotAwaitingReply(c))
    );
    e.reply(0, s2, c, Message::with_code(7), None).unwrap();
    let rep = reply_of(e, c);
    assert_eq!((rep.from, rep.msg.code()), (s2, 7));
}

#[test]
fn forward_across_hosts() {
    let mut n = Net::new(3);
    n.introduce();
    let s1 = n.e[0].create_process().unwrap();
    let s2 = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let d = n.e[1].create_process().unwrap();
    let s3 = n.e[2].create_process().unwrap();
    let lc = n.e[0].create_process().unwrap();
    use PacketType::*;
    // (sender host, sender, new destination host, new destination,
    //  datagrams for the whole exchange)
    let cases = [
        (1, c, 0, s2, vec![RemoteSend, RemoteReply]),
        (
            1,
            c,
            2,
            s3,
            vec![RemoteSend, RemoteForward, RemoteSend, RemoteReply],
        ),
        (1, c, 1, d, vec![RemoteSend, RemoteForward]),
        (0, lc, 2, s3, vec![RemoteSend, RemoteReply]),
    ];
    for (k, (sh, sender, th, target, want)) in cases.into_iter().enumerate() {
        let mark = n.sent.len();
        let page = SharedBuf::new(vec![0; 32]);
        let now = n.now;
        n.e[sh]
            .send(
                now,
                sender,
                s1,
                seg_msg(k as u32 + 1, SegAccess::WRITE),
                Some(page.lend()),
            )
            .unwrap();
        n.run();
        let r = n.e[0].receive(n.now, s1, None, None).unwrap().unwrap();
        assert_eq!(r.from, sender);
        n.e[0]
            .forward(
                n.now,
                s1,
                sender,
                target,
                Message::with_code(100 + k as u32),
            )
            .unwrap();
        n.run();
        let r = n.e[th]
            .receive(n.now, target, None, None)
            .unwrap()
            .unwrap_or_else(|| panic!("case {k}: forwarded message not queued"));
        assert_eq!(
            (r.from, r.forwarder, r.msg.code(), r.msg.seg_len()),
            (sender, s1, 100 + k as u32, 32),
            "case {k}"
        );
        n.e[th]
            .reply(
                n.now,
                target,
                sender,
                Message::with_code(7),
                Some((4, b"ok")),
            )
            .unwrap();
        n.run();
        let rep = reply_of(&mut n.e[sh], sender);
        assert_eq!((rep.from, rep.seg_bytes), (target, 2), "case {k}");
        assert_eq!(&page.snapshot()[4..6], b"ok");
        assert_eq!(n.types_since(mark), want, "case {k}");
    }
}

#[test]
fn forwarded_exchange_grants_segment_access_to_the_new_receiver() {
    // For each placement of the new receiver, it may MoveFrom and MoveTo the
    // original sender's segment; the forwarder no longer may.
    let mut n = Net::new(3);
    n.introduce();
    let s1 = n.e[0].create_process().unwrap();
    let s2 = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let d = n.e[1].create_process().unwrap();
    let s3 = n.e[2].create_process().unwrap();
    for (th, target) in [(0, s2), (2, s3), (1, d)] {
        let data = pattern(7, 5000);
        let seg = SharedBuf::new(data.clone());
        let mut m = seg_msg(1, SegAccess::READ_WRITE);
        m.set_flag(NO_APPEND, true);
        n.e[1].send(n.now, c, s1, m, Some(seg.lend())).unwrap();
        n.run();
        n.e[0].receive(n.now, s1, None, None).unwrap().unwrap();
        n.e[0].forward(n.now, s1, c, target, m).unwrap();
        n.run();
        n.e[th].receive(n.now, target, None, None).unwrap().unwrap();
        let back = SharedBuf::new(vec![0; 5000]);
        match n.e[th].move_from(n.now, target, c, 0, back.lend()) {
            Ok(Some(_)) => {}
            Ok(None) => {
                n.run();
                assert_eq!(
                    moved(&mut n.e[th], target),
                    Ok(5000),
                    "MoveFrom by {target}"
                );
            }
            Err(e) => panic!("MoveFrom by {target}: {e}"),
        }
        same_bytes(&back.snapshot(), &data, "MoveFrom after Forward");
        let new = pattern(8, 3000);
        match n.e[th].move_to(n.now, target, c, 1000, SharedBuf::new(new.clone()).lend()) {
            Ok(Some(_)) => {}
            Ok(None) => {
                n.run();
                assert_eq!(moved(&mut n.e[th], target), Ok(3000), "MoveTo by {target}");
            }
            Err(e) => panic!("MoveTo by {target}: {e}"),
        }
        if th != 0 {
            assert_eq!(
                n.e[0].move_from(n.now, s1, c, 0, SharedBuf::new(vec![0; 10]).lend()),
                Err(IpcError::NotAwaitingReply(c)),
                "the forwarder lost access"
            );
        }
        n.e[th]
            .reply(n.now, target, c, Message::zero(), None)
            .unwrap();
        n.run();
        assert_eq!(reply_of(&mut n.e[1], c).from, target);
        let mut want = data.clone();
        want[1000..4000].copy_from_slice(&new);
        same_bytes(&seg.snapshot(), &want, "segment after MoveTo");
    }
}

#[test]
fn lost_remote_forward_is_resent_from_the_saved_copy() {
    let mut n = Net::new(3);
    n.introduce();
    let s1 = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let s3 = n.e[2].create_process().unwrap();
    n.e[1].send(0, c, s1, Message::with_code(1), None).unwrap();
    n.run();
    n.e[0].receive(n.now, s1, None, None).unwrap().unwrap();
    n.drop_next = 1;
    n.e[0]
        .forward(n.now, s1, c, s3, Message::with_code(2))
        .unwrap();
    n.run();
    let base = n.e[2].stats().rx_of(PacketType::RemoteSend);
    assert!(
        n.advance_until(2_000_000, |n| n.e[2].stats().rx_of(PacketType::RemoteSend)
            > base)
    );
    assert_eq!(n.e[0].stats().saved_replies_resent, 1);
    let r = n.e[2].receive(n.now, s3, None, None).unwrap().unwrap();
    assert_eq!((r.from, r.forwarder), (c, s1));
    n.e[2]
        .reply(n.now, s3, c, Message::with_code(3), None)
        .unwrap();
    n.run();
    assert_eq!(reply_of(&mut n.e[1], c).from, s3);
    n.advance(3_000_000);
    assert_eq!(
        n.e[2].receive(n.now, s3, None, None),
        Ok(None),
        "executed once"
    );
}

// ----------------------------------------------------------------- moves

#[test]
fn local_moves_copy_exactly_and_check_rights() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let s = e.create_process().unwrap();
    let t = e.create_process().unwrap();
    let c = e.create_process().unwrap();
    let data = pattern(3, 100);
    let seg = SharedBuf::new(data.clone());
    let buf = |k: usize| SharedBuf::new(vec![0; k]);
    // Not yet received: nobody may touch the segment.
    e.send(0, c, s, seg_msg(1, SegAccess::READ), Some(seg.lend()))
        .unwrap();
    assert_eq!(
        e.move_from(0, s, c, 0, buf(1).lend()),
        Err(IpcError::NotAwaitingReply(c))
    );
    e.receive(0, s, None, None).unwrap().unwrap();
    let b = buf(30);
    assert_eq!(e.move_from(0, s, c, 70, b.lend()), Ok(Some(30)));
    same_bytes(&b.snapshot(), &data[70..], "b");
    assert_eq!(
        e.move_from(0, s, c, 71, buf(30).lend()),
        Err(IpcError::OutOfBounds(c))
    );
    assert_eq!(
        e.move_from(0, s, c, u32::MAX, buf(2).lend()),
        Err(IpcError::OutOfBounds(c))
    );
    assert_eq!(
        e.move_to(0, s, c, 0, buf(1).lend()),
        Err(IpcError::AccessDenied(c)),
        "read-only"
    );
    assert_eq!(
        e.move_from(0, t, c, 0, buf(1).lend()),
        Err(IpcError::NotAwaitingReply(c)),
        "c awaits s, not t"
    );
    e.reply(0, s, c, Message::zero(), None).unwrap();
    reply_of(e, c);
    assert_eq!(
        e.move_from(0, s, c, 0, buf(1).lend()),
        Err(IpcError::NotAwaitingReply(c)),
        "after the reply"
    );
    // Write-only segment.
    let out = SharedBuf::new(vec![0; 100]);
    e.send(0, c, s, seg_msg(1, SegAccess::WRITE), Some(out.lend()))
        .unwrap();
    e.receive(0, s, None, None).unwrap().unwrap();
    assert_eq!(
        e.move_from(0, s, c, 0, buf(1).lend()),
        Err(IpcError::AccessDenied(c))
    );
    assert_eq!(
        e.move_to(0, s, c, 95, SharedBuf::new(vec![1; 6]).lend()),
        Err(IpcError::OutOfBounds(c))
    );
    assert_eq!(
        e.move_to(0, s, c, 40, SharedBuf::new(data[..20].to_vec()).lend()),
        Ok(Some(20))
    );
    e.reply(0, s, c, Message::zero(), None).unwrap();
    reply_of(e, c);
    let mut want = vec![0; 100];
    want[40..60].copy_from_slice(&data[..20]);
    same_bytes(&out.snapshot(), &want, "out");
    // No segment at all.
    e.send(0, c, s, seg_msg(1, SegAccess::READ_WRITE), None)
        .unwrap();
    e.receive(0, s, None, None).unwrap().unwrap();
    assert_eq!(
        e.move_to(0, s, c, 0, buf(1).lend()),
        Err(IpcError::AccessDenied(c))
    );
    assert_eq!(e.stats().bulk_bytes, 50);
}

#[test]
fn remote_moves_stream_many_chunks_exactly() {
    moves_stream_many_chunks_exactly(false);
}

#[test]
fn remote_moves_gathered_from_the_lent_buffer_stream_exactly() {
    moves_stream_many_chunks_exactly(true);
}

fn moves_stream_many_chunks_exactly(gather: bool) {
    let mut n = Net::with(2, |_, c| c.window = 4 * CHUNK);
    n.gather = gather;
    // Gathered on the way out, placed on the way in (as the runtime does).
    n.place = gather;
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    for (k, &len) in [1usize, CHUNK, 8 * CHUNK, 40_000, 100_001]
        .iter()
        .enumerate()
    {
        let off = (k * 333) as u32;
        let total = len + off as usize + 17;
        // MoveTo into a write-granted segment at an offset.
        let data = pattern(k as u32, len);
        let dst = SharedBuf::new(vec![0; total]);
        n.e[1]
            .send(n.now, c, s, seg_msg(1, SegAccess::WRITE), Some(dst.lend()))
            .unwrap();
        n.run();
        n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
        let before = n.e[0].stats().tx_of(PacketType::MoveToRequest);
        assert_eq!(
            n.e[0].move_to(n.now, s, c, off, SharedBuf::new(data.clone()).lend()),
            Ok(None)
        );
        n.run();
        assert_eq!(moved(&mut n.e[0], s), Ok(len), "MoveTo of {len}");
        assert_eq!(
            n.e[0].stats().tx_of(PacketType::MoveToRequest) - before,
            len.div_ceil(CHUNK) as u64,
            "one datagram per chunk on a clean network"
        );
        n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
        n.run();
        reply_of(&mut n.e[1], c);
        let got = dst.snapshot();
        same_bytes(
            &got[off as usize..off as usize + len],
            &data,
            "MoveTo target",
        );
        assert!(got[..off as usize].iter().all(|&b| b == 0));
        assert!(got[off as usize + len..].iter().all(|&b| b == 0));
        // MoveFrom out of a read-granted segment (nothing appended).
        let src = pattern(100 + k as u32, total);
        let seg = SharedBuf::new(src.clone());
        let mut m = seg_msg(1, SegAccess::READ);
        m.set_flag(NO_APPEND, true);
        n.e[1].send(n.now, c, s, m, Some(seg.lend())).unwrap();
        n.run();
        n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
        let into = SharedBuf::new(vec![0; len]);
        assert_eq!(n.e[0].move_from(n.now, s, c, off, into.lend()), Ok(None));
        n.run();
        assert_eq!(moved(&mut n.e[0], s), Ok(len), "MoveFrom of {len}");
        same_bytes(
            &into.snapshot(),
            &src[off as usize..off as usize + len],
            "into",
        );
        // Zero bytes, anywhere within the segment, need no network.
        let mark = n.sent.len();
        assert_eq!(
            n.e[0].move_from(n.now, s, c, total as u32, SharedBuf::new(vec![]).lend()),
            Ok(Some(0))
        );
        assert_eq!(
            n.e[0].move_from(n.now, s, c, total as u32 + 1, SharedBuf::new(vec![]).lend()),
            Err(IpcError::OutOfBounds(c))
        );
        assert_eq!(n.sent.len(), mark);
        n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
        n.run();
        reply_of(&mut n.e[1], c);
    }
    // Every chunk (MoveTo's and MoveFrom's) went the way asked for.
    assert_eq!(n.gathered > 0, gather, "{} gathered", n.gathered);
    assert_eq!(n.placed > 0, gather, "{} placed", n.placed);
    for e in &n.e {
        assert_eq!(e.stats().bulk_retransmits, 0);
        assert_eq!(e.stats().retransmits, 0);
    }
}

#[test]
fn remote_moves_survive_loss() {
    for every in [3usize, 5, 11] {
        let mut n = Net::with(2, |_, c| c.window = 6 * CHUNK);
        n.introduce();
        let s = n.e[0].create_process().unwrap();
        let c = n.e[1].create_process().unwrap();
        let mut k = 0usize;
        n.filter = Some(Box::new(move |_, _, d| {
            let t = decode(d).unwrap().header.ptype;
            if matches!(
                t,
                PacketType::MoveToRequest
                    | PacketType::MoveToReply
                    | PacketType::MoveFromRequest
                    | PacketType::MoveFromReply
            ) {
                k += 1;
                !k.is_multiple_of(every)
            } else {
                true
            }
        }));
        let len = 50_000;
        let data = pattern(every as u32, len);
        // MoveTo.
        let dst = SharedBuf::new(vec![0; len]);
        let mut m = seg_msg(1, SegAccess::READ_WRITE);
        m.set_flag(NO_APPEND, true);
        n.e[1].send(n.now, c, s, m, Some(dst.lend())).unwrap();
        n.run();
        n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
        n.e[0]
            .move_to(n.now, s, c, 0, SharedBuf::new(data.clone()).lend())
            .unwrap();
        assert!(n.advance_until(2_000_000, |n| completed(&n.e[0], s)));
        assert_eq!(moved(&mut n.e[0], s), Ok(len), "MoveTo, 1 in {every} lost");
        // MoveFrom of the same segment, now holding the data.
        let back = SharedBuf::new(vec![0; len]);
        n.e[0].move_from(n.now, s, c, 0, back.lend()).unwrap();
        assert!(n.advance_until(2_000_000, |n| completed(&n.e[0], s)));
        assert_eq!(
            moved(&mut n.e[0], s),
            Ok(len),
            "MoveFrom, 1 in {every} lost"
        );
        same_bytes(&back.snapshot(), &data, "back");
        n.filter = None;
        n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
        n.run();
        reply_of(&mut n.e[1], c);
        same_bytes(&dst.snapshot(), &data, "dst");
        assert!(n.e[0].stats().bulk_retransmits + n.e[1].stats().bulk_retransmits > 0);
    }
}

#[test]
fn move_from_after_move_to_reads_the_segment_as_it_is_now() {
    // The first part of the segment arrived with the request; a MoveTo
    // then changes the segment. MoveFrom must see the new bytes, whether it
    // is served from the appended copy or fetched.
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let old = pattern(1, 3000);
    let seg = SharedBuf::new(old.clone());
    n.e[1]
        .send(0, c, s, seg_msg(1, SegAccess::READ_WRITE), Some(seg.lend()))
        .unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    let new = pattern(2, 1000);
    n.e[0]
        .move_to(n.now, s, c, 500, SharedBuf::new(new.clone()).lend())
        .unwrap();
    n.run();
    assert_eq!(moved(&mut n.e[0], s), Ok(1000));
    let mut want = old.clone();
    want[500..1500].copy_from_slice(&new);
    let back = SharedBuf::new(vec![0; 3000]);
    match n.e[0].move_from(n.now, s, c, 0, back.lend()) {
        Ok(Some(3000)) => {}
        Ok(None) => {
            n.run();
            assert_eq!(moved(&mut n.e[0], s), Ok(3000));
        }
        other => panic!("{other:?}"),
    }
    same_bytes(&back.snapshot(), &want, "back");
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    reply_of(&mut n.e[1], c);
    same_bytes(&seg.snapshot(), &want, "seg");
}

#[test]
fn remote_segment_violations_are_typed_errors() {
    let mut n = Net::new(3);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let t = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let seg = SharedBuf::new(pattern(9, 5000));
    let mark = n.sent.len();
    n.e[1]
        .send(0, c, s, seg_msg(1, SegAccess::READ), Some(seg.lend()))
        .unwrap();
    n.run();
    let seq = decode(&n.sent[mark].data).unwrap().header.seq;
    let buf = |k: usize| SharedBuf::new(vec![0; k]).lend();
    assert_eq!(
        n.e[0].move_from(n.now, s, c, 0, buf(10)),
        Err(IpcError::NotAwaitingReply(c)),
        "queued, not received"
    );
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    // The mover's kernel checks what it knows.
    assert_eq!(
        n.e[0].move_to(n.now, s, c, 0, buf(10)),
        Err(IpcError::AccessDenied(c))
    );
    assert_eq!(
        n.e[0].move_from(n.now, s, c, 4000, buf(2000)),
        Err(IpcError::OutOfBounds(c))
    );
    assert_eq!(
        n.e[0].move_from(n.now, t, c, 0, buf(10)),
        Err(IpcError::NotAwaitingReply(c))
    );
    // The owner's kernel checks every bulk datagram itself: forge some.
    let forge = |t: PacketType, src: Pid, seq: u32, base: u32, total: u32, data: &[u8]| {
        let mut h = Header::new(t);
        h.seq = seq;
        h.src = src;
        h.dst = c;
        h.forwarder = src;
        h.total_length = total;
        let m = match t {
            PacketType::MoveFromRequest => Message([0xabc, base, CHUNK as u32, 0, 1, 0, 0, 0]),
            _ => Message([0xabc, base, CHUNK as u32, 0, 0, 0, 0, 0]),
        };
        encode(&h, &m, data)
    };
    let intruder = Pid::new(HostId(3), 0x1234);
    let cases = [
        // (from engine, packet, expected refusal)
        (
            2,
            forge(PacketType::MoveFromRequest, intruder, seq, 0, 100, &[]),
            Status::NotAwaitingReply,
        ),
        (
            0,
            forge(
                PacketType::MoveFromRequest,
                s,
                seq.wrapping_add(1),
                0,
                100,
                &[],
            ),
            Status::NotAwaitingReply,
        ),
        (
            0,
            forge(PacketType::MoveFromRequest, s, seq, 4000, 1001, &[]),
            Status::OutOfBounds,
        ),
        (
            0,
            forge(PacketType::MoveToRequest, s, seq, 0, 3, b"bad"),
            Status::AccessDenied,
        ),
        (
            2,
            forge(PacketType::MoveToRequest, intruder, seq, 0, 3, b"bad"),
            Status::NotAwaitingReply,
        ),
    ];
    for (k, (from, pkt, want)) in cases.into_iter().enumerate() {
        let mark = n.sent.len();
        n.inject(1, from, &pkt);
        n.run();
        assert_eq!(n.sent.len(), mark + 1, "case {k}: one refusal");
        let d = decode(&n.sent[mark].data).unwrap();
        assert_eq!(n.sent[mark].to, from, "case {k}");
        assert_eq!(d.header.status, want, "case {k}");
        assert!(d.data.is_empty(), "case {k}: a refusal carries no data");
    }
    assert_eq!(n.e[1].stats().drops_of(DropReason::SegmentViolation), 5);
    same_bytes(&seg.snapshot(), &pattern(9, 5000), "nothing written");
    assert_eq!(n.e[1].take_completion(c), None, "still waiting");
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    reply_of(&mut n.e[1], c);
    assert_eq!(
        n.e[0].move_from(n.now, s, c, 0, buf(1)),
        Err(IpcError::NotAwaitingReply(c)),
        "after the reply"
    );
}

// ------------------------------------------------------ remote exchanges

#[test]
fn missing_remote_process_is_nacked_at_once() {
    let mut n = Net::new(2);
    n.introduce();
    let c = n.e[1].create_process().unwrap();
    let ghost = Pid::new(HostId(1), 0x4242);
    assert!(!n.e[0].process_exists(ghost));
    let (mark, t0) = (n.sent.len(), n.now);
    n.e[1].send(t0, c, ghost, Message::zero(), None).unwrap();
    n.run();
    assert_eq!(send_err(&mut n.e[1], c), IpcError::NoSuchProcess(ghost));
    assert_eq!(
        n.types_since(mark),
        vec![PacketType::RemoteSend, PacketType::NAck]
    );
    assert!(n.now - t0 < 1_000, "no timer involved");
}

#[test]
fn silent_host_times_out_after_host_timeout() {
    for known in [false, true] {
        let mut n = Net::with(2, |_, c| c.host_timeout = 1_500_000);
        if known {
            n.introduce();
        }
        let c = n.e[1].create_process().unwrap();
        let s = n.e[0].create_process().unwrap();
        // Host 1 dies: nothing reaches it any more.
        n.filter = Some(Box::new(|_, to, _| to != 0));
        let t0 = n.now;
        n.e[1].send(t0, c, s, Message::zero(), None).unwrap();
        let done = n.advance_until(10_000_000, |n| completed(&n.e[1], c));
        assert!(done);
        assert_eq!(send_err(&mut n.e[1], c), IpcError::Timeout(s));
        let took = n.now - t0;
        assert!(
            (1_500_000..1_501_000).contains(&took),
            "timed out after {took} µs"
        );
        assert!(n.e[1].stats().retransmits >= 5);
        assert_eq!(n.e[1].stats().timeouts, 1);
    }
}

#[test]
fn reply_pending_keeps_a_long_request_alive() {
    let mut n = Net::with(2, |_, c| c.host_timeout = 1_000_000);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    n.e[1].send(0, c, s, Message::with_code(1), None).unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.advance(5_000_000);
    assert_eq!(n.e[1].take_completion(c), None, "alive while the server is");
    assert!(n.e[1].stats().rx_of(PacketType::ReplyPending) >= 8);
    n.e[0]
        .reply(n.now, s, c, Message::with_code(2), None)
        .unwrap();
    n.run();
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 2);
}

#[test]
fn exchange_page_read_and_page_write_are_two_datagrams() {
    let mut n = Net::new(3);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let page = pattern(4, 4096);
    for op in ["exchange", "page read", "page write"] {
        let before: Vec<Stats> = n.e.iter().map(|e| e.stats().clone()).collect();
        let client_seg = SharedBuf::new(if op == "page write" {
            page.clone()
        } else {
            vec![0; 4096]
        });
        let (m, seg) = match op {
            "exchange" => (Message::with_code(1), None),
            "page read" => (seg_msg(2, SegAccess::WRITE), Some(client_seg.lend())),
            _ => (seg_msg(3, SegAccess::READ), Some(client_seg.lend())),
        };
        n.e[1].send(n.now, c, s, m, seg).unwrap();
        n.run();
        let rbuf = SharedBuf::new(vec![0; 4096]);
        let r = n.e[0]
            .receive(n.now, s, None, Some(rbuf.lend()))
            .unwrap()
            .unwrap();
        let rseg = (op == "page read").then_some((0u32, &page[..]));
        n.e[0]
            .reply(n.now, s, c, Message::with_code(9), rseg)
            .unwrap();
        n.run();
        let rep = reply_of(&mut n.e[1], c);
        match op {
            "page read" => {
                assert_eq!(rep.seg_bytes, 4096);
                same_bytes(&client_seg.snapshot(), &page, "client_seg");
            }
            "page write" => {
                assert_eq!(r.seg_bytes, 4096);
                same_bytes(&rbuf.snapshot(), &page, "rbuf");
            }
            _ => {}
        }
        let d = |i: usize| {
            let (t0, r0) = traffic(&before[i]);
            let (t1, r1) = traffic(n.e[i].stats());
            (t1 - t0, r1 - r0)
        };
        assert_eq!(d(1), (1, 1), "{op}: client sent one and received one");
        assert_eq!(d(0), (1, 1), "{op}: server sent one and received one");
        assert_eq!(d(2), (0, 0), "{op}: the third host saw nothing");
        let st = |i: usize, t: PacketType| {
            (
                n.e[i].stats().tx_of(t) - before[i].tx_of(t),
                n.e[i].stats().rx_of(t) - before[i].rx_of(t),
            )
        };
        assert_eq!(st(1, PacketType::RemoteSend), (1, 0), "{op}");
        assert_eq!(st(1, PacketType::RemoteReply), (0, 1), "{op}");
        assert_eq!(st(0, PacketType::RemoteSend), (0, 1), "{op}");
        assert_eq!(st(0, PacketType::RemoteReply), (1, 0), "{op}");
    }
    assert_eq!(n.e[1].stats().remote_exchanges, 3);
}

#[test]
fn duplicates_get_reply_pending_or_the_saved_reply() {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    // Non-idempotent request.
    let mark = n.sent.len();
    n.e[1]
        .send(n.now, c, s, Message::with_code(1), None)
        .unwrap();
    n.run();
    let request = n.sent[mark].data.clone();
    // A duplicate while queued, and once received: replyPending, no new alien.
    for receive in [false, true] {
        if receive {
            n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
        }
        let m = n.sent.len();
        n.inject(0, 1, &request);
        n.run();
        assert_eq!(n.types_since(m), vec![PacketType::ReplyPending]);
        assert_eq!(n.e[0].stats().aliens_in_use, 1);
    }
    assert_eq!(n.e[0].stats().duplicates, 2);
    // The reply is lost; a retransmission gets the saved reply, byte for byte.
    n.drop_next = 1;
    n.e[0]
        .reply(n.now, s, c, Message::with_code(5), None)
        .unwrap();
    n.run();
    let reply = n.last_of(PacketType::RemoteReply).unwrap().data.clone();
    assert_eq!(n.e[0].stats().aliens_in_use, 0, "alien freed at reply");
    let m = n.sent.len();
    n.inject(0, 1, &request);
    n.run();
    assert_eq!(n.sent[m].data, reply);
    assert_eq!(n.e[0].stats().saved_replies_resent, 1);
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 5);
    assert_eq!(
        n.e[0].receive(n.now, s, None, None),
        Ok(None),
        "not re-executed"
    );
    // A later duplicate still gets the saved reply (dropped by the client).
    let no_match = n.e[1].stats().drops_of(DropReason::NoMatch);
    n.inject(0, 1, &request);
    n.run();
    assert_eq!(n.e[0].stats().saved_replies_resent, 2);
    assert_eq!(n.e[1].stats().drops_of(DropReason::NoMatch), no_match + 1);
    assert!(n.e[0].cancel_receive(s));
    // Idempotent request whose reply is lost: executed again.
    let mut m = Message::with_code(2);
    m.set_flag(IDEMPOTENT, true);
    let mark = n.sent.len();
    n.e[1].send(n.now, c, s, m, None).unwrap();
    n.run();
    let request2 = n.sent[mark].data.clone();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.drop_next = 1;
    n.e[0].reply(n.now, s, c, m, None).unwrap();
    n.run();
    let saved_before = n.e[0].stats().saved_replies_resent;
    n.inject(0, 1, &request2);
    n.run();
    assert_eq!(n.e[0].stats().saved_replies_resent, saved_before);
    assert!(
        n.e[0].receive(n.now, s, None, None).unwrap().is_some(),
        "re-executed"
    );
    n.e[0].reply(n.now, s, c, m, None).unwrap();
    n.run();
    reply_of(&mut n.e[1], c);
    // The first request is older than the newest seen: stale.
    n.inject(0, 1, &request);
    n.run();
    assert_eq!(n.e[0].stats().drops_of(DropReason::Stale), 1);
    assert_eq!(n.e[0].receive(n.now, s, None, None), Ok(None));
}

#[test]
fn retransmission_is_answered_by_timer_driven_resend() {
    // The same as above, but the retransmission comes from the client's
    // own timer rather than a forged copy.
    let mut n = Net::new(2);
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    n.e[1].send(0, c, s, Message::with_code(1), None).unwrap();
    n.run();
    n.advance(200_000);
    assert!(n.e[0].stats().duplicates >= 1);
    assert!(n.e[1].stats().rx_of(PacketType::ReplyPending) >= 1);
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.drop_next = 1;
    n.e[0]
        .reply(n.now, s, c, Message::with_code(5), None)
        .unwrap();
    n.run();
    assert!(n.e[1].take_completion(c).is_none());
    assert!(n.advance_until(2_000_000, |n| completed(&n.e[1], c)));
    assert_eq!(n.e[0].stats().saved_replies_resent, 1);
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 5);
}

/// Two hosts whose server (on host 0) has one alien slot, hence room for
/// four saved answers, and `k` clients on host 1.
fn one_slot_server(k: usize) -> (Net, Pid, Vec<Pid>) {
    let mut n = Net::with(2, |_, c| {
        c.alien_pool = 1;
        c.alien_per_host = 1;
    });
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let clients = (0..k).map(|_| n.e[1].create_process().unwrap()).collect();
    (n, s, clients)
}

/// A non-idempotent exchange from `c` to `s` whose reply is lost (so the
/// server keeps it); returns the request datagram, to retransmit.
fn exchange_losing_the_reply(n: &mut Net, s: Pid, c: Pid) -> Vec<u8> {
    let mark = n.sent.len();
    n.e[1]
        .send(n.now, c, s, Message::with_code(1), None)
        .unwrap();
    n.run();
    let request = n.sent[mark].data.clone();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.drop_next = 1;
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    n.now += 1000;
    request
}

#[test]
fn forgotten_saved_reply_does_not_re_execute() {
    // Saved replies are bounded (4 per alien slot): with one slot, the
    // fifth client's saved reply evicts the first's. A retransmission of
    // the first request must then not run the request a second time.
    let (mut n, s, clients) = one_slot_server(5);
    let requests: Vec<Vec<u8>> = clients
        .iter()
        .map(|&c| exchange_losing_the_reply(&mut n, s, c))
        .collect();
    assert_eq!(n.e[0].stats().saved_replies_evicted, 1);
    n.inject(0, 1, &requests[0]);
    n.run();
    assert_eq!(
        n.e[0].receive(n.now, s, None, None),
        Ok(None),
        "a non-idempotent request ran twice"
    );
    // The others still get their saved replies.
    n.inject(0, 1, &requests[4]);
    n.run();
    reply_of(&mut n.e[1], clients[4]);
}

#[test]
fn full_alien_pool_answers_reply_pending_without_growing() {
    let mut n = Net::with(3, |_, c| {
        c.alien_pool = 4;
        c.alien_per_host = 3;
    });
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let slots = n.e[0].aliens.capacity();
    let mut clients: Vec<(usize, Pid)> = Vec::new();
    for h in [1, 1, 1, 1, 1, 1, 2, 2] {
        clients.push((h, n.e[h].create_process().unwrap()));
    }
    let mark = n.sent.len();
    for &(h, c) in &clients {
        n.e[h]
            .send(n.now, c, s, Message::with_code(1), None)
            .unwrap();
    }
    n.run();
    // Host 2 gets its share of three, host 3 gets the fourth slot.
    assert_eq!(n.e[0].stats().aliens_in_use, 4);
    assert_eq!(n.e[0].aliens.capacity(), slots, "the pool never grows");
    assert_eq!(n.e[0].stats().drops_of(DropReason::NoBuffers), 4);
    let pend = n
        .types_since(mark)
        .iter()
        .filter(|t| **t == PacketType::ReplyPending)
        .count();
    assert_eq!(pend, 4);
    // Serve them all; the refused get in on retransmission.
    let mut served = BTreeSet::new();
    let done = n.advance_until(3_000_000, |n| {
        while let Ok(Some(r)) = n.e[0].receive(n.now, s, None, None) {
            n.e[0].reply(n.now, s, r.from, r.msg, None).unwrap();
            assert!(served.insert(r.from), "served twice");
        }
        n.e[0].cancel_receive(s);
        assert!(n.e[0].stats().aliens_in_use <= 4);
        assert_eq!(n.e[0].aliens.capacity(), slots);
        served.len() == clients.len()
    });
    assert!(done, "served {}", served.len());
    n.run();
    for &(h, c) in &clients {
        reply_of(&mut n.e[h], c);
    }
}

#[test]
fn destroyed_process_fails_its_senders() {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let a = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let c2 = n.e[1].create_process().unwrap();
    // One local and one remote sender queued, one remote sender received.
    n.e[1].send(n.now, c2, s, Message::zero(), None).unwrap();
    n.run();
    assert_eq!(
        n.e[0].receive(n.now, s, None, None).unwrap().unwrap().from,
        c2
    );
    n.e[0].send(n.now, a, s, Message::zero(), None).unwrap();
    n.e[1].send(n.now, c, s, Message::zero(), None).unwrap();
    n.run();
    n.e[0].destroy_process(n.now, s).unwrap();
    n.run();
    assert_eq!(send_err(&mut n.e[0], a), IpcError::NoSuchProcess(s));
    assert_eq!(send_err(&mut n.e[1], c), IpcError::NoSuchProcess(s));
    assert_eq!(send_err(&mut n.e[1], c2), IpcError::NoSuchProcess(s));
    assert_eq!(n.e[0].stats().aliens_in_use, 0);
    assert_eq!(
        n.e[0].destroy_process(n.now, s),
        Err(IpcError::NoSuchProcess(s))
    );
    // A local sender already received by the destroyed process.
    let r = n.e[0].create_process().unwrap();
    n.e[0].send(n.now, a, r, Message::zero(), None).unwrap();
    n.e[0].receive(n.now, r, None, None).unwrap().unwrap();
    n.e[0].destroy_process(n.now, r).unwrap();
    assert_eq!(send_err(&mut n.e[0], a), IpcError::NoSuchProcess(r));
    // A destroyed sender's late reply is dropped.
    n.e[1].send(n.now, c, a, Message::zero(), None).unwrap();
    n.run();
    n.e[0].receive(n.now, a, None, None).unwrap().unwrap();
    n.e[1].destroy_process(n.now, c).unwrap();
    let no_match = n.e[1].stats().drops_of(DropReason::NoMatch);
    n.e[0].reply(n.now, a, c, Message::zero(), None).unwrap();
    n.run();
    assert_eq!(n.e[1].stats().drops_of(DropReason::NoMatch), no_match + 1);
}

// ---------------------------------------------------------------- naming

#[test]
fn announcement_complaint_gives_distinct_host_ids() {
    // B starts allocating; A already holds exactly B's first candidate.
    let mut b = Engine::new(
        Config {
            discovery: vec![addr(0)],
            seed: 77,
            ..Config::default()
        },
        0,
    );
    b.handle_timeout(0);
    let first = b.poll_transmit().expect("announcement");
    let candidate = decode(&first.data).unwrap().header.dst.host();
    let mut a = Engine::new(
        Config {
            host_id: Some(candidate),
            discovery: vec![addr(1)],
            seed: 1,
            ..Config::default()
        },
        0,
    );
    while a.poll_transmit().is_some() {}
    a.handle_datagram(0, addr(1), &first.data);
    let mut now = 0;
    while now < 3_000_000 && b.host_id().is_none() {
        while let Some(t) = a.poll_transmit() {
            b.handle_datagram(now, addr(0), &t.data);
        }
        b.handle_timeout(now);
        while let Some(t) = b.poll_transmit() {
            a.handle_datagram(now, addr(1), &t.data);
        }
        now += 10_000;
    }
    assert_eq!(a.stats().tx_of(PacketType::LogicalHostComplaint), 1);
    assert!(
        b.host_id().is_some_and(|h| h != candidate),
        "{:?}",
        b.host_id()
    );
    assert!(events(&mut b).contains(&Event::HostReady(b.host_id().unwrap())));
    // A fixed id that is taken draws a complaint and a conflict event.
    let mut late = Engine::new(
        Config {
            host_id: Some(candidate),
            discovery: vec![addr(0)],
            seed: 9,
            ..Config::default()
        },
        now,
    );
    while let Some(t) = late.poll_transmit() {
        a.handle_datagram(now, addr(2), &t.data);
    }
    while let Some(t) = a.poll_transmit() {
        late.handle_datagram(now, addr(0), &t.data);
    }
    assert!(events(&mut late).contains(&Event::HostIdConflict(candidate)));
    assert!(
        !events(&mut a)
            .iter()
            .any(|e| matches!(e, Event::HostIdConflict(_))),
        "the holder keeps its id"
    );
}

#[test]
fn twins_with_the_same_seed_get_distinct_host_ids() {
    for hosts in [2, 3, 4] {
        let mut n = Net::with(hosts, |_, c| {
            c.host_id = None;
            c.seed = 42;
        });
        let ok = n.advance_until(10_000_000, |n| n.e.iter().all(|e| e.host_id().is_some()));
        assert!(ok, "{hosts} hosts: allocation never ended");
        let ids: BTreeSet<HostId> = n.e.iter().filter_map(|e| e.host_id()).collect();
        assert_eq!(ids.len(), hosts, "{hosts} twins ended with ids {ids:?}");
        // The ids work: an exchange between the first two.
        let s = n.e[0].create_process().unwrap();
        let c = n.e[1].create_process().unwrap();
        n.e[1]
            .send(n.now, c, s, Message::with_code(1), None)
            .unwrap();
        n.run();
        assert_eq!(
            n.e[0].receive(n.now, s, None, None).unwrap().unwrap().from,
            c
        );
    }
}

#[test]
fn allocation_with_broadcast_echo_still_heeds_complaints() {
    // Discovery includes the host itself, as a broadcast address would:
    // every announcement comes back to its sender.
    let all = |c: &mut Config| c.discovery = (0..3).map(addr).collect();
    // Twins still separate.
    let mut n = Net::with(3, |_, c| {
        all(c);
        c.host_id = None;
        c.seed = 5;
    });
    assert!(n.advance_until(10_000_000, |n| n.e.iter().all(|e| e.host_id().is_some())));
    let ids: BTreeSet<HostId> = n.e.iter().filter_map(|e| e.host_id()).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(n.e[0].stats().drops_of(DropReason::OwnEcho) > 0);
    // A holder's complaint still moves an announcer off its id, even though
    // the echo redraws the announcer's nonce before the complaint arrives.
    let mut probe = Engine::new(
        Config {
            discovery: vec![addr(0)],
            seed: 77,
            ..Config::default()
        },
        0,
    );
    probe.handle_timeout(0);
    let first = decode(&probe.poll_transmit().unwrap().data)
        .unwrap()
        .header
        .dst
        .host();
    let mut n = Net::with(3, |i, c| {
        all(c);
        if i == 0 {
            c.host_id = Some(first);
        }
    });
    // The announcer starts after the holder.
    n.e[1] = Engine::new(
        Config {
            host_id: None,
            seed: 77,
            ..n.e[1].config().clone()
        },
        n.now,
    );
    assert!(n.advance_until(10_000_000, |n| n.e[1].host_id().is_some()));
    assert_ne!(n.e[1].host_id(), Some(first));
    assert!(n.e[0].stats().tx_of(PacketType::LogicalHostComplaint) >= 1);
    assert!(!events(&mut n.e[0])
        .iter()
        .any(|e| matches!(e, Event::HostIdConflict(_))));
}

#[test]
fn allocating_host_refuses_work_until_ready() {
    let mut n = Net::with(2, |i, c| {
        if i == 1 {
            c.host_id = None;
        }
    });
    assert_eq!(n.e[1].create_process(), Err(IpcError::NoHostId));
    let s = n.e[0].create_process().unwrap();
    let mut h = Header::new(PacketType::RemoteSend);
    h.src = s;
    h.dst = Pid::new(HostId(9), 2);
    n.inject(1, 0, &encode(&h, &Message::zero(), &[]));
    assert_eq!(n.e[1].stats().drops_of(DropReason::NotReady), 1);
    assert!(n.advance_until(2_000_000, |n| n.e[1].host_id().is_some()));
    assert!(n.e[1].create_process().is_ok());
}

#[test]
fn getpid_scopes_local_remote_any() {
    let mut n = Net::new(3);
    let s = n.e[0].create_process().unwrap();
    let q = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    n.e[0].set_pid(10, s, Scope::Any);
    n.e[0].set_pid(11, s, Scope::Local);
    n.e[0].set_pid(12, s, Scope::Remote);
    // On the registering host: answered at once, no datagram.
    let mark = n.sent.len();
    assert_eq!(n.e[0].get_pid(0, q, 10, Scope::Any), Ok(Some(s)));
    assert_eq!(n.e[0].get_pid(0, q, 11, Scope::Local), Ok(Some(s)));
    assert_eq!(n.e[0].get_pid(0, q, 12, Scope::Local), Ok(Some(Pid::NONE)));
    assert_eq!(n.e[0].get_pid(0, q, 99, Scope::Local), Ok(Some(Pid::NONE)));
    assert_eq!(n.sent.len(), mark);
    // From another host.
    assert_eq!(n.e[1].get_pid(0, c, 10, Scope::Local), Ok(Some(Pid::NONE)));
    for (logical, scope, want) in [
        (10, Scope::Any, s),
        (10, Scope::Remote, s),
        (12, Scope::Any, s),
        (11, Scope::Any, Pid::NONE),
        (99, Scope::Remote, Pid::NONE),
    ] {
        let t0 = n.now;
        assert_eq!(n.e[1].get_pid(t0, c, logical, scope), Ok(None));
        let done = n.advance_until(2_000_000, |n| completed(&n.e[1], c));
        assert!(done);
        assert_eq!(
            n.e[1].take_completion(c),
            Some(Completion::GetPid(Ok(want))),
            "logical {logical} {scope:?}"
        );
        let took = n.now - t0;
        if want.is_none() {
            let limit = n.e[1].config().getpid_timeout;
            assert!((limit..limit + 1_000).contains(&took), "{took}");
        } else {
            assert!(took < 1_000, "answered at once, took {took}");
        }
    }
    // A remote-only lookup skips the local table (and no one else has 12).
    assert_eq!(n.e[0].get_pid(n.now, q, 12, Scope::Remote), Ok(None));
    assert!(n.advance_until(2_000_000, |n| completed(&n.e[0], q)));
    assert_eq!(
        n.e[0].take_completion(q),
        Some(Completion::GetPid(Ok(Pid::NONE)))
    );
    // A dead registrant is not returned; SetPid of the null pid unregisters.
    n.e[0].set_pid(20, q, Scope::Any);
    n.e[0].set_pid(20, Pid::NONE, Scope::Any);
    assert_eq!(
        n.e[0].get_pid(n.now, s, 20, Scope::Local),
        Ok(Some(Pid::NONE))
    );
    n.e[0].destroy_process(n.now, s).unwrap();
    assert_eq!(
        n.e[0].get_pid(n.now, q, 10, Scope::Local),
        Ok(Some(Pid::NONE))
    );
    assert_eq!(n.e[1].get_pid(n.now, c, 10, Scope::Any), Ok(None));
    assert!(n.advance_until(2_000_000, |n| completed(&n.e[1], c)));
    assert_eq!(
        n.e[1].take_completion(c),
        Some(Completion::GetPid(Ok(Pid::NONE)))
    );
    // No peers known at all: answered at once.
    let mut lone = Net::with(1, |_, _| {});
    let p = lone.e[0].create_process().unwrap();
    assert_eq!(lone.e[0].get_pid(0, p, 10, Scope::Any), Ok(Some(Pid::NONE)));
}

// ---------------------------------------------------------- robustness

/// Serves every member that has a message: records (sender, tag) and
/// replies with the tag and its pid, then receives again.
fn serve_members(
    n: &mut Net,
    members: &[(usize, Pid)],
    seen: &mut std::collections::HashMap<Pid, BTreeSet<u32>>,
    seed: u64,
) {
    loop {
        let mut any = false;
        for &(h, p) in members {
            if !completed(&n.e[h], p) {
                continue;
            }
            any = true;
            let r = received(&mut n.e[h], p);
            assert!(
                seen.entry(p).or_default().insert(r.msg.0[1]),
                "seed {seed}: member {p} got message {} twice",
                r.msg.0[1]
            );
            let mut m = r.msg;
            m.0[2] = p.0;
            let now = n.now;
            n.e[h].reply(now, p, r.from, m, None).unwrap();
            if let Some(r) = n.e[h].receive(now, p, None, None).unwrap() {
                // Delivered at once: put it back as a completion to serve.
                let pr = n.e[h].proc_mut(p).unwrap();
                pr.state = PState::Ready;
                pr.completion = Some(Completion::Receive(Ok(r)));
            }
        }
        if !any {
            return;
        }
        n.run();
    }
}

#[test]
fn group_sends_on_a_lossy_network_deliver_once_and_complete() {
    use rand::{Rng, SeedableRng};
    let g = Pid::well_known_group(9);
    let mut timeouts = 0;
    let (mut retx, mut dups) = (0, 0);
    for seed in 0..150u64 {
        let loss = [0.0, 0.1, 0.3][seed as usize % 3];
        let mut n = Net::with(3, |_, c| {
            c.alien_pool = 16;
            c.alien_per_host = 16;
            c.host_timeout = 400_000;
        });
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        n.filter = Some(Box::new(move |_, _, _| rng.gen::<f64>() >= loss));
        let mut members = Vec::new();
        for h in [0, 0, 1, 1] {
            let p = n.e[h].create_process().unwrap();
            n.e[h].join_group(g, p, p).unwrap();
            assert_eq!(n.e[h].receive(0, p, None, None).unwrap(), None);
            members.push((h, p));
        }
        let pids: BTreeSet<Pid> = members.iter().map(|m| m.1).collect();
        let s = n.e[2].create_process().unwrap();
        let mut seen = std::collections::HashMap::new();
        for k in 0..8u32 {
            let mode = [GroupMode::Many, GroupMode::One][k as usize % 2];
            let mut m = Message::with_code(7);
            m.set_group_mode(mode);
            m.0[1] = k;
            let now = n.now;
            n.e[2].send(now, s, g, m, None).unwrap();
            let start = n.now;
            let done = n.advance_until(2_000_000, |net| {
                serve_members(net, &members, &mut seen, seed);
                completed(&net.e[2], s)
            });
            assert!(done, "seed {seed}: group send {k} never completed");
            match n.e[2].take_completion(s) {
                Some(Completion::Send(Ok(r))) => {
                    assert_eq!(r.msg.0[1], k, "seed {seed}: a reply to an older send");
                    assert!(pids.contains(&r.from) && r.msg.0[2] == r.from.0);
                }
                Some(Completion::Send(Err(IpcError::Timeout(t)))) => {
                    assert_eq!(t, g);
                    assert!(loss > 0.0, "seed {seed}: timeout on a perfect network");
                    // Bounded: the host timeout after the last sign of life.
                    assert!(n.now - start <= 1_500_000, "seed {seed}: late timeout");
                    timeouts += 1;
                }
                other => panic!("seed {seed}: {other:?}"),
            }
            // Let stragglers arrive, then every queued reply is this send's,
            // from distinct members, and only in multi-reply mode.
            n.advance_until(50_000, |net| {
                serve_members(net, &members, &mut seen, seed);
                false
            });
            let mut from = BTreeSet::new();
            while let Some((p, m)) = n.e[2].get_reply(s) {
                assert_eq!(mode, GroupMode::Many, "seed {seed}: queued 1-reply answers");
                assert_eq!(m.0[1], k, "seed {seed}: late reply surfaced");
                assert!(from.insert(p), "seed {seed}: duplicate reply from {p}");
            }
            if loss == 0.0 && mode == GroupMode::Many {
                assert_eq!(from.len(), 3, "seed {seed}: every other member's reply");
            }
        }
        if loss == 0.0 {
            for p in &pids {
                assert_eq!(seen[p].len(), 8, "seed {seed}: {p} missed a send");
            }
        }
        retx += n.e[2].stats().retransmits;
        dups += n.e[0].stats().duplicates + n.e[1].stats().duplicates;
    }
    // The lossy seeds did exercise retransmission and duplicate filtering.
    assert!(
        retx > 20 && dups > 5,
        "retransmits {retx}, duplicates {dups}"
    );
    eprintln!(
        "group sends: {timeouts} of {} timed out; {retx} retransmissions, {dups} duplicates filtered",
        150 * 8
    );
    assert!(timeouts < 150 * 8 / 4, "{timeouts} timeouts");
}

fn keyed(id: u8, secret: u8, encrypt: bool) -> crate::auth::AuthConfig {
    crate::auth::AuthConfig {
        keys: vec![crate::auth::Key {
            id,
            secret: [secret; 32],
        }],
        send_key: id,
        encrypt,
        counter_start: 1 << 40,
        max_skew: 1_000_000,
        salt: secret as u32,
    }
}

#[test]
fn keyed_hosts_talk_and_reject_replays_forgeries_and_strangers() {
    use crate::auth::Reject;
    for encrypt in [false, true] {
        let mut n = Net::with(3, |i, c| {
            c.auth = match i {
                0 | 1 => Some(keyed(1, 0x11, encrypt)),
                _ => Some(keyed(1, 0x22, encrypt)), // same id, other secret
            }
        });
        let s = n.e[0].create_process().unwrap();
        let c = n.e[1].create_process().unwrap();
        let page = pattern(3, 3000);
        n.e[1]
            .send(
                n.now,
                c,
                s,
                seg_msg(5, SegAccess::READ),
                Some(SharedBuf::new(page.clone()).lend()),
            )
            .unwrap();
        let mark = n.sent.len();
        n.run();
        let req = n.sent[mark].data.clone();
        let buf = SharedBuf::new(vec![0u8; 4096]);
        let r = n.e[0]
            .receive(n.now, s, None, Some(buf.lend()))
            .unwrap()
            .unwrap();
        assert_eq!((r.from, r.seg_bytes), (c, 3000));
        same_bytes(&buf.snapshot()[..3000], &page, "appended page through auth");
        if encrypt {
            assert!(
                !req.windows(64).any(|w| w == &page[..64]),
                "page travels encrypted"
            );
        }
        // The captured request replayed: rejected before the protocol.
        let dups = n.e[0].stats().duplicates;
        n.inject(0, 1, &req);
        assert_eq!(n.e[0].stats().auth_rejects_of(Reject::Replay), 1);
        assert_eq!(n.e[0].stats().duplicates, dups);
        let before = n.e[0].stats().clone();
        // Bit flips anywhere, truncation, no key, unknown key.
        for k in [3usize, 9, 14, 30, 60, req.len() / 2, req.len() - 1] {
            let mut f = req.clone();
            f[k] ^= 1;
            n.inject(0, 1, &f);
        }
        n.inject(0, 1, &req[..70]);
        let mut plain = req.clone();
        plain[5] = 0;
        n.inject(0, 1, &plain);
        let mut other = req.clone();
        other[5] = 9;
        n.inject(0, 1, &other);
        let st = n.e[0].stats();
        let rejected: u64 =
            st.auth_rejects.iter().sum::<u64>() - before.auth_rejects.iter().sum::<u64>();
        // The replay was counted before `before` was taken.
        assert_eq!(rejected, 7 + 3, "{:?}", st.auth_rejects);
        let delta = |r: Reject| st.auth_rejects_of(r) - before.auth_rejects_of(r);
        assert_eq!(delta(Reject::NoKey), 1);
        assert_eq!(delta(Reject::UnknownKey), 1);
        assert_eq!(delta(Reject::Truncated), 1);
        assert_eq!(st.rx, before.rx, "nothing rejected reached the protocol");
        // The exchange still completes.
        n.e[0]
            .reply(n.now, s, c, Message::with_code(6), None)
            .unwrap();
        n.run();
        assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 6);
        // A host with another secret under the same id is not heard.
        let x = n.e[2].create_process().unwrap();
        n.e[2]
            .send(n.now, x, s, Message::with_code(7), None)
            .unwrap();
        n.run();
        assert!(n.e[0].stats().auth_rejects_of(Reject::BadTag) >= 1);
        assert!(!completed(&n.e[0], s));
        n.advance(4_000_000);
        assert!(matches!(send_err(&mut n.e[2], x), IpcError::Timeout(_)));
    }
}

/// Every datagram type the engines emit, recorded from a scenario that
/// touches each protocol path.
fn corpus() -> &'static [Vec<u8>] {
    static CORPUS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    CORPUS.get_or_init(|| {
        let mut n = Net::with(3, |i, c| {
            c.window = 2 * CHUNK;
            if i == 2 {
                c.host_id = None;
            }
        });
        n.advance_until(2_000_000, |n| n.e[2].host_id().is_some());
        let s = n.e[0].create_process().unwrap();
        let c = n.e[1].create_process().unwrap();
        let d = n.e[2].create_process().unwrap();
        n.e[0].set_pid(1, s, Scope::Any);
        n.e[1].get_pid(n.now, c, 1, Scope::Remote).unwrap();
        n.advance(1_000_000);
        let seg = SharedBuf::new(pattern(5, 6000));
        let mut m = seg_msg(1, SegAccess::READ_WRITE);
        m.set_flag(NO_APPEND, true);
        n.e[1].send(n.now, c, s, m, Some(seg.lend())).unwrap();
        n.advance(300_000);
        n.e[0].receive(n.now, s, None, None).unwrap();
        n.e[0]
            .move_from(n.now, s, c, 0, SharedBuf::new(vec![0; 6000]).lend())
            .unwrap();
        n.run();
        n.e[0]
            .move_to(n.now, s, c, 0, SharedBuf::new(vec![1; 6000]).lend())
            .unwrap();
        n.run();
        n.e[0].forward(n.now, s, c, d, Message::zero()).unwrap();
        n.run();
        n.e[2].receive(n.now, d, None, None).unwrap();
        n.e[2]
            .reply(n.now, d, c, Message::zero(), Some((0, b"abc")))
            .unwrap();
        n.run();
        n.e[1]
            .send(n.now, c, Pid::new(HostId(1), 0x7fff), Message::zero(), None)
            .unwrap();
        n.run();
        let mut all: Vec<Vec<u8>> = n.sent.iter().map(|s| s.data.clone()).collect();
        let kinds: BTreeSet<u8> = all.iter().map(|d| d[2]).collect();
        assert_eq!(kinds.len(), 12, "kinds in corpus: {kinds:?}");
        // Complaints are rare; add one by hand.
        let mut h = Header::new(PacketType::LogicalHostComplaint);
        h.dst = Pid::new(HostId(1), 0);
        all.push(encode(&h, &Message::zero(), &[]));
        all
    })
}

/// Two engines in the middle of several operations: a queued and a
/// received remote request, a blocked Send, a MoveFrom and a GetPid.
fn busy_net() -> (Net, Vec<Pid>) {
    let mut n = Net::with(2, |_, c| c.window = 2 * CHUNK);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let s2 = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let c2 = n.e[1].create_process().unwrap();
    let g = n.e[1].create_process().unwrap();
    let mut m = seg_msg(1, SegAccess::READ_WRITE);
    m.set_flag(NO_APPEND, true);
    n.e[1]
        .send(0, c, s, m, Some(SharedBuf::new(pattern(1, 9000)).lend()))
        .unwrap();
    n.e[1].send(0, c2, s2, Message::with_code(2), None).unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap();
    n.e[0].set_pid(5, s2, Scope::Any);
    n.drop_next = 2;
    n.e[0]
        .move_from(n.now, s, c, 0, SharedBuf::new(vec![0; 9000]).lend())
        .unwrap();
    n.e[1].get_pid(n.now, g, 77, Scope::Remote).unwrap();
    // Keep the in-flight datagrams in the engines' queues.
    (n, vec![s, s2, c, c2, g])
}

fn check_counted(n: &Net, before: &[(u64, u64)], injected: &[u64]) {
    for (i, e) in n.e.iter().enumerate() {
        let st = e.stats();
        let rx: u64 = st.rx.iter().sum::<u64>()
            + st.auth_rejects.iter().sum::<u64>()
            + st.auth_refused_by_peer;
        assert_eq!(
            rx + st.malformed() - (before[i].0 + before[i].1),
            injected[i],
            "engine {i}: every datagram counted once"
        );
        assert!(st.aliens_in_use <= e.cfg.alien_pool as u64);
        assert_eq!(e.aliens.capacity(), e.cfg.alien_pool);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn arbitrary_bytes_never_panic_and_are_counted(
        dgrams in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..40)
    ) {
        let (mut n, _) = busy_net();
        let before: Vec<(u64, u64)> = n.e.iter().map(|e| (e.stats().rx.iter().sum(), e.stats().malformed())).collect();
        for d in &dgrams {
            n.inject(0, 1, d);
        }
        check_counted(&n, &before, &[dgrams.len() as u64, 0]);
        // A keyed datagram at an unkeyed host is an auth reject, not malformed.
        let keyed = |d: &Vec<u8>| d.len() > 5 && d[0] == wire::MAGIC && d[5] != 0;
        let bad = dgrams.iter().filter(|d| !keyed(d) && decode(d).is_err()).count() as u64;
        prop_assert_eq!(n.e[0].stats().malformed(), before[0].1 + bad);
        n.advance(3_000_000);
    }

    #[test]
    fn mutated_valid_datagrams_never_panic(
        picks in proptest::collection::vec((any::<prop::sample::Index>(), proptest::collection::vec((0usize..96, any::<u8>()), 0..4), 0usize..3, any::<bool>()), 1..30)
    ) {
        let (mut n, _) = busy_net();
        let before: Vec<(u64, u64)> = n.e.iter().map(|e| (e.stats().rx.iter().sum(), e.stats().malformed())).collect();
        let corpus = corpus();
        let mut injected = [0u64; 2];
        for (pick, flips, cut, to_second) in &picks {
            let mut d = pick.get(corpus).clone();
            for &(at, v) in flips {
                if at < d.len() {
                    d[at] = v;
                }
            }
            d.truncate(d.len().saturating_sub(*cut));
            let to = usize::from(*to_second);
            n.inject(to, 1 - to, &d);
            injected[to] += 1;
        }
        check_counted(&n, &before, &injected);
        n.advance(3_000_000);
    }

    #[test]
    fn forged_headers_never_panic(
        pkts in proptest::collection::vec((1u8..=13, 0u8..8, any::<u8>(), 0usize..6, 0usize..6, any::<u32>(), any::<[u32; 4]>(), any::<[u32; 8]>(), proptest::collection::vec(any::<u8>(), 0..1300), 0u32..3), 1..30)
    ) {
        // Well-formed datagrams with plausible pids and arbitrary fields,
        // aimed at the protocol paths behind decoding.
        let (mut n, pids) = busy_net();
        let mut plausible = pids.clone();
        plausible.push(Pid::new(HostId(1), 0x7fff));
        let before: Vec<(u64, u64)> = n.e.iter().map(|e| (e.stats().rx.iter().sum(), e.stats().malformed())).collect();
        let mut injected = [0u64; 2];
        for (t, status, flags, src, dst, seq, addrs, words, data, seqpick) in &pkts {
            let mut h = Header::new(PacketType::from_u8(*t).unwrap());
            h.status = Status::from_u8(*status);
            h.flags = *flags;
            h.src = plausible[*src];
            h.dst = plausible[*dst];
            h.forwarder = plausible[(*src + 1) % plausible.len()];
            // Mostly real sequence numbers, sometimes arbitrary ones.
            h.seq = if *seqpick == 0 { *seq } else { n.e[1].next_seq.wrapping_sub(*seqpick - 1) };
            h.total_length = addrs[0] % 20_000;
            h.local_addr = addrs[1] % 20_000;
            h.remote_addr = addrs[2];
            let mut m = Message(*words);
            if addrs[3] % 2 == 0 {
                m.0[2] = CHUNK as u32;
                m.0[3] %= 16;
                m.0[4] %= 16;
            }
            let to = if h.dst.host() == HostId(2) { 1 } else { 0 };
            n.inject(to, 1 - to, &encode(&h, &m, data));
            injected[to] += 1;
        }
        check_counted(&n, &before, &injected);
        n.advance(3_000_000);
    }
}

#[test]
fn a_recycled_buffer_carries_the_next_datagram_whole() {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    // A spent buffer full of junk, longer than a message datagram.
    let junk = vec![0xEE; 600];
    let ptr = junk.as_ptr();
    n.e[1].recycle(junk);
    n.e[1]
        .send(n.now, c, s, Message::with_code(7), None)
        .unwrap();
    let t = n.e[1].poll_transmit().unwrap();
    assert_eq!(t.data.as_ptr(), ptr, "the spare buffer was reused");
    assert_eq!(
        t.data.len(),
        crate::wire::FIXED_BYTES,
        "no junk left behind"
    );
    n.e[0].handle_datagram(n.now, addr(1), &t.data);
    let r = n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    assert_eq!(r.msg.code(), 7);
    // Buffers larger than any datagram are not kept.
    n.e[0].recycle(vec![0; 1 << 20]);
    n.e[0]
        .reply(n.now, s, c, Message::with_code(8), None)
        .unwrap();
    let t = n.e[0].poll_transmit().unwrap();
    assert!(t.data.capacity() < 1 << 20);
}

#[test]
fn a_multi_reply_group_send_gathers_a_reply_lost_after_the_first() {
    let g = Pid::well_known_group(9);
    let mut n = Net::new(3);
    let mut members = Vec::new();
    for h in [0, 1] {
        let p = n.e[h].create_process().unwrap();
        n.e[h].join_group(g, p, p).unwrap();
        assert_eq!(n.e[h].receive(0, p, None, None).unwrap(), None);
        members.push((h, p));
    }
    let s = n.e[2].create_process().unwrap();
    // Engine 1's first reply is lost; engine 0's answers the Send.
    let mut lost = 0;
    n.filter = Some(Box::new(move |from, _, d| {
        let drop = from == 1 && d[2] == PacketType::RemoteReply as u8 && lost == 0;
        lost += usize::from(drop);
        !drop
    }));
    let mut m = Message::with_code(7);
    m.set_group_mode(GroupMode::Many);
    let now = n.now;
    n.e[2].send(now, s, g, m, None).unwrap();
    let mut seen = std::collections::HashMap::new();
    assert!(n.advance_until(1_000_000, |net| {
        serve_members(net, &members, &mut seen, 0);
        completed(&net.e[2], s)
    }));
    assert_eq!(reply_of(&mut n.e[2], s).from, members[0].1);
    // The sender keeps gathering: a later copy of its Send makes engine 1
    // answer again with the reply it already sent.
    n.advance_until(1_000_000, |net| {
        serve_members(net, &members, &mut seen, 0);
        false
    });
    assert_eq!(n.e[2].get_reply(s).map(|r| r.0), Some(members[1].1));
    assert_eq!(n.e[2].get_reply(s), None);
    assert_eq!(seen[&members[1].1].len(), 1, "the member ran it once");
}

#[test]
fn a_saved_reply_re_sent_is_evicted_after_the_unused_ones() {
    // Four saved answers fit (one alien slot). Client 0's is re-sent, so
    // the fifth client's answer evicts client 1's, the oldest unused.
    let (mut n, s, clients) = one_slot_server(5);
    let mut requests: Vec<Vec<u8>> = Vec::new();
    for (k, &c) in clients.iter().enumerate() {
        if k == 4 {
            n.inject(0, 1, &requests[0]);
            n.run();
            assert_eq!(n.e[0].stats().saved_replies_resent, 1);
        }
        requests.push(exchange_losing_the_reply(&mut n, s, c));
    }
    assert_eq!(n.e[0].stats().saved_replies_evicted, 1);
    n.inject(0, 1, &requests[0]);
    n.run();
    assert_eq!(n.e[0].stats().saved_replies_resent, 2, "client 0's kept");
    n.inject(0, 1, &requests[1]);
    n.run();
    assert_eq!(n.e[0].stats().saved_replies_resent, 2, "client 1's evicted");
    assert_eq!(
        n.e[0].receive(n.now, s, None, None),
        Ok(None),
        "a non-idempotent request ran twice"
    );
}

#[test]
fn group_messages_handled_out_of_order_are_each_delivered_once() {
    // The receiving host's reader threads may take a sender's group
    // messages in either order: 0-reply ones (the sender does not wait),
    // or a 1-reply Send answered first by another host.
    for mode in [GroupMode::NoReply, GroupMode::One] {
        let g = Pid::well_known_group(9);
        let mut n = Net::new(2);
        let p = n.e[0].create_process().unwrap();
        n.e[0].join_group(g, p, p).unwrap();
        let s = n.e[1].create_process().unwrap();
        n.filter = Some(Box::new(|from, _, d| {
            !(from == 1 && d[2] == PacketType::RemoteSend as u8)
        }));
        let mark = n.sent.len();
        for code in [1, 2, 3] {
            let mut m = Message::with_code(code);
            m.set_group_mode(mode);
            let now = n.now;
            n.e[1].send(now, s, g, m, None).unwrap();
            n.run();
            // (As if another host had answered the 1-reply Send.)
            n.e[1].cancel(s);
        }
        let sends: Vec<Vec<u8>> = n.sent[mark..]
            .iter()
            .filter(|x| x.to == 0 && x.ptype() == PacketType::RemoteSend)
            .map(|x| x.data.clone())
            .collect();
        let sends: Vec<&Vec<u8>> = sends.iter().fold(Vec::new(), |mut v, d| {
            if !v.contains(&d) {
                v.push(d);
            }
            v
        });
        assert_eq!(sends.len(), 3, "{mode:?}");
        for k in [2, 0, 1, 0, 2] {
            n.inject(0, 1, sends[k]);
        }
        let mut codes = Vec::new();
        while let Ok(Some(r)) = n.e[0].receive(n.now, p, None, None) {
            codes.push(r.msg.code());
            let _ = n.e[0].reply(n.now, p, r.from, Message::zero(), None);
        }
        assert_eq!(
            codes,
            vec![3, 1, 2],
            "{mode:?}: each once, in the order handled"
        );
        assert_eq!(n.e[0].stats().duplicates, 1, "{mode:?}: the newest again");
        assert_eq!(
            n.e[0].stats().drops_of(DropReason::Stale),
            1,
            "{mode:?}: an older one again"
        );
    }
}

#[test]
fn the_callers_own_completion_is_kept_for_it_without_a_wake() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let s = e.create_process().unwrap();
    let c = e.create_process().unwrap();
    assert_eq!(e.receive(0, s, None, None).unwrap(), None);
    events(e);
    // The receiver's own thread makes the call that completes it.
    e.set_caller(Some(s));
    e.send(0, c, s, Message::with_code(3), None).unwrap();
    assert!(!woke(e, s), "no wake for the caller");
    match e.take_own() {
        Some(Completion::Receive(Ok(r))) => assert_eq!(r.msg.code(), 3),
        other => panic!("{other:?}"),
    }
    e.set_caller(None);
    // Not taken before the caller changes: handed over the usual way.
    e.set_caller(Some(c));
    e.reply(0, s, c, Message::with_code(4), None).unwrap();
    e.set_caller(None);
    assert!(woke(e, c));
    assert_eq!(reply_of(e, c).msg.code(), 4);
    assert_eq!(e.take_own(), None);
}

#[test]
fn answers_go_to_the_reply_port_a_datagram_names() {
    // A datagram that left from a host's side socket names its main
    // socket's port: the answer goes there, and the location is learned so.
    let mut n = Net::new(2);
    let s = n.e[0].create_process().unwrap();
    assert_eq!(n.e[0].receive(0, s, None, None).unwrap(), None);
    let client = Pid::new(n.e[1].host_id().unwrap(), 0x1234);
    let mut h = Header::new(PacketType::RemoteSend);
    (h.seq, h.src, h.dst, h.forwarder, h.reply_port) = (77, client, s, client, 4321);
    let side = SocketAddr::from(([127, 0, 0, 1], 40000));
    let main = SocketAddr::from(([127, 0, 0, 1], 4321));
    n.e[0].handle_datagram(1, side, &encode(&h, &Message::with_code(5), &[]));
    assert_eq!(received(&mut n.e[0], s).msg.code(), 5);
    assert_eq!(n.e[0].location_of(client.host()), Some(main));
    n.e[0]
        .reply(2, s, client, Message::with_code(6), None)
        .unwrap();
    let t = n.e[0].poll_transmit().expect("the reply");
    assert_eq!(t.to, main);
    let p = decode(&t.data).unwrap();
    assert_eq!(
        (p.header.ptype, p.header.reply_port),
        (PacketType::RemoteReply, 0)
    );
}

#[test]
fn every_datagram_names_the_reply_port_under_the_mac() {
    // The runtime may send from a side socket: the engine names its main
    // port in every datagram, before sealing, so keyed hosts still talk.
    for auth in [false, true] {
        let mut n = Net::with(2, |i, c| {
            c.reply_port = addr(i).port();
            if auth {
                c.auth = Some(keyed(1, 0x11, false));
            }
        });
        let s = n.e[0].create_process().unwrap();
        let c = n.e[1].create_process().unwrap();
        assert_eq!(n.e[0].receive(n.now, s, None, None).unwrap(), None);
        let mark = n.sent.len();
        n.e[1]
            .send(n.now, c, s, Message::with_code(3), None)
            .unwrap();
        n.run();
        let r = received(&mut n.e[0], s);
        n.e[0]
            .reply(n.now, s, r.from, Message::with_code(4), None)
            .unwrap();
        n.run();
        assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 4, "auth {auth}");
        let named: Vec<u16> = n.sent[mark..]
            .iter()
            .map(|x| u16::from_be_bytes([x.data[6], x.data[7]]))
            .collect();
        assert_eq!(named, vec![addr(1).port(), addr(0).port()], "auth {auth}");
        assert_eq!(n.e[0].stats().auth_rejects.iter().sum::<u64>(), 0);
    }
}

// ------------------------------------------------- reply data sent ahead

/// Two hosts whose window fits a 100 KB reply; a client on host 2 has an
/// idempotent request with a write segment of `seg` bytes received by a
/// server on host 1. Returns (net, server, client, segment).
fn awaiting_large_reply(seg: usize, idempotent: bool) -> (Net, Pid, Pid, SharedBuf) {
    let mut n = Net::with(2, |_, c| c.window = 128 * CHUNK);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let dst = SharedBuf::new(vec![0; seg]);
    let mut m = seg_msg(1, SegAccess::WRITE);
    m.set_flag(IDEMPOTENT, idempotent);
    n.e[1].send(n.now, c, s, m, Some(dst.lend())).unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    (n, s, c, dst)
}

#[test]
fn a_large_idempotent_reply_goes_ahead_in_chunks_with_no_acknowledgement() {
    for gather in [false, true] {
        let (len, off) = (100_001, 7);
        let (mut n, s, c, dst) = awaiting_large_reply(len + off + 20, true);
        n.gather = gather;
        n.place = gather;
        let data = pattern(5, len);
        let mark = n.sent.len();
        let mut r = Message::zero();
        r.0[1] = 0xfeed;
        n.e[0]
            .reply_ahead(
                n.now,
                s,
                c,
                r,
                off as u32,
                SharedBuf::new(data.clone()).lend(),
            )
            .unwrap();
        n.run();
        let got = reply_of(&mut n.e[1], c);
        assert_eq!((got.seg_bytes, got.msg.0[1]), (len, 0xfeed));
        let seg = dst.snapshot();
        same_bytes(&seg[off..off + len], &data, "reply data");
        assert!(seg[..off].iter().all(|&b| b == 0) && seg[off + len..].iter().all(|&b| b == 0));
        // Chunks, then the reply with the last piece; nothing comes back.
        let types = n.types_since(mark);
        assert_eq!(types.len(), len.div_ceil(CHUNK), "{types:?}");
        let (last, chunks) = types.split_last().unwrap();
        assert_eq!(*last, PacketType::RemoteReply);
        assert!(chunks.iter().all(|&t| t == PacketType::MoveToRequest));
        assert_eq!(n.gathered > 0, gather);
        assert_eq!(n.placed > 0, gather);
        // Nothing was kept: the server's alien is free for the next request.
        n.e[1].send(n.now, c, s, Message::zero(), None).unwrap();
        n.run();
        assert!(n.e[0].receive(n.now, s, None, None).unwrap().is_some());
    }
}

#[test]
fn a_reply_missing_data_sent_ahead_is_dropped_and_the_request_runs_again() {
    let len = 90_000;
    let (mut n, s, c, dst) = awaiting_large_reply(len, true);
    let mut k = 0;
    n.filter = Some(Box::new(move |_, _, d| {
        if decode(d).unwrap().header.ptype == PacketType::MoveToRequest {
            k += 1;
            return k != 3;
        }
        true
    }));
    let first = pattern(1, len);
    n.e[0]
        .reply_ahead(
            n.now,
            s,
            c,
            Message::zero(),
            0,
            SharedBuf::new(first).lend(),
        )
        .unwrap();
    n.run();
    assert!(!completed(&n.e[1], c), "a reply with a hole is not taken");
    let st = n.e[1].stats();
    assert_eq!(st.drops_of(DropReason::ReplyDataMissing), 1);
    assert_eq!(st.retransmits, 1, "the request goes again at once");
    assert_eq!(n.e[0].stats().tx_of(PacketType::MoveToReply), 0);
    // The retransmission reached the server, which runs it again; this
    // time its data must be moved (selective retransmission), not sent
    // ahead, which on a lossy path could miss a piece every time.
    let again = n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    assert_eq!(again.from, c);
    let second = SharedBuf::new(pattern(2, len));
    assert_eq!(
        n.e[0].reply_ahead(n.now, s, c, Message::zero(), 0, second.lend()),
        Err(IpcError::SegmentTooLarge { max: MAX_APPEND })
    );
    n.e[0].move_to(n.now, s, c, 0, second.lend()).unwrap();
    assert!(n.advance_until(1_000_000, |n| completed(&n.e[0], s)));
    assert_eq!(moved(&mut n.e[0], s), Ok(len));
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    reply_of(&mut n.e[1], c);
    same_bytes(&dst.snapshot(), &second.snapshot(), "the second run's data");
}

#[test]
fn reply_data_ahead_applies_to_idempotent_remote_requests_within_a_window() {
    // Not idempotent: the caller must MoveTo first (nothing is refused
    // on the way, the exchange is intact).
    let len = 70_000;
    let (mut n, s, c, dst) = awaiting_large_reply(len, false);
    let data = pattern(3, len);
    let big = SharedBuf::new(data.clone());
    assert_eq!(
        n.e[0].reply_ahead(n.now, s, c, Message::zero(), 0, big.lend()),
        Err(IpcError::SegmentTooLarge { max: MAX_APPEND })
    );
    assert_eq!(n.e[0].move_to(n.now, s, c, 0, big.lend()), Ok(None));
    n.run();
    assert_eq!(moved(&mut n.e[0], s), Ok(len));
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    reply_of(&mut n.e[1], c);
    same_bytes(&dst.snapshot(), &data, "moved");
    // More than a window, or past the segment's end.
    let (mut n, s, c, _) = awaiting_large_reply(200_000, true);
    let over = SharedBuf::new(vec![1; 128 * CHUNK + 1]);
    assert_eq!(
        n.e[0].reply_ahead(n.now, s, c, Message::zero(), 0, over.lend()),
        Err(IpcError::SegmentTooLarge { max: MAX_APPEND })
    );
    let past = SharedBuf::new(vec![1; 70_000]);
    assert_eq!(
        n.e[0].reply_ahead(n.now, s, c, Message::zero(), 130_001, past.lend()),
        Err(IpcError::OutOfBounds(c))
    );
    // A local sender's segment takes any size, by copy.
    let l = n.e[0].create_process().unwrap();
    let seg = SharedBuf::new(vec![0; 100_000]);
    n.e[0]
        .send(n.now, l, s, seg_msg(1, SegAccess::WRITE), Some(seg.lend()))
        .unwrap();
    n.e[0].receive(n.now, s, Some(l), None).unwrap().unwrap();
    let data = pattern(4, 100_000);
    n.e[0]
        .reply_ahead(
            n.now,
            s,
            l,
            Message::zero(),
            0,
            SharedBuf::new(data.clone()).lend(),
        )
        .unwrap();
    assert_eq!(reply_of(&mut n.e[0], l).seg_bytes, 100_000);
    same_bytes(&seg.snapshot(), &data, "local");
}

#[test]
fn stray_reply_data_is_dropped_without_an_answer() {
    let (mut n, s, c, _) = awaiting_large_reply(80_000, true);
    // Reply data for an exchange that is over: counted, never answered.
    n.e[0]
        .reply_ahead(
            n.now,
            s,
            c,
            Message::zero(),
            0,
            SharedBuf::new(vec![5; 80_000]).lend(),
        )
        .unwrap();
    let chunks: Vec<Vec<u8>> = {
        let mut v = Vec::new();
        while let Some(t) = n.e[0].poll_transmit() {
            v.push(t.data);
        }
        v
    };
    for d in &chunks {
        n.inject(1, 0, d);
    }
    reply_of(&mut n.e[1], c);
    let before = n.e[1].stats().drops_of(DropReason::SegmentViolation);
    let mark = n.e[1].stats().tx.iter().sum::<u64>();
    for d in &chunks[..chunks.len() - 1] {
        n.inject(1, 0, d);
    }
    let st = n.e[1].stats();
    assert_eq!(
        st.drops_of(DropReason::SegmentViolation) - before,
        chunks.len() as u64 - 1
    );
    assert_eq!(
        st.tx.iter().sum::<u64>(),
        mark,
        "no refusal, no acknowledgement"
    );
}

#[test]
fn receive_upto_copies_only_from_segments_within_the_limit() {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let local = n.e[0].create_process().unwrap();
    let remote = n.e[1].create_process().unwrap();
    for (len, upto, copied) in [(1000usize, 999usize, false), (1000, 1000, true)] {
        let data = pattern(len as u32, len);
        n.e[0]
            .send(
                n.now,
                local,
                s,
                seg_msg(1, SegAccess::READ),
                Some(SharedBuf::new(data.clone()).lend()),
            )
            .unwrap();
        n.e[1]
            .send(
                n.now,
                remote,
                s,
                seg_msg(1, SegAccess::READ),
                Some(SharedBuf::new(data.clone()).lend()),
            )
            .unwrap();
        n.run();
        for from in [local, remote] {
            let buf = SharedBuf::new(vec![0; 2000]);
            let r = n.e[0]
                .receive_upto(n.now, s, Some(from), Some(buf.lend()), upto)
                .unwrap()
                .unwrap();
            let want = if copied { len } else { 0 };
            assert_eq!(r.seg_bytes, want, "{from}, segment {len}, upto {upto}");
            same_bytes(&buf.snapshot()[..want], &data[..want], "copied part");
            // The whole segment is still there to MoveFrom.
            let back = SharedBuf::new(vec![0; len]);
            let got = n.e[0].move_from(n.now, s, from, 0, back.lend()).unwrap();
            if got.is_none() {
                n.run();
                assert_eq!(moved(&mut n.e[0], s), Ok(len));
            }
            same_bytes(&back.snapshot(), &data, "moved");
            n.e[0].reply(n.now, s, from, Message::zero(), None).unwrap();
            n.run();
        }
        reply_of(&mut n.e[0], local);
        reply_of(&mut n.e[1], remote);
    }
}

#[test]
fn send_deadline_ends_a_send_the_server_never_answers() {
    // The server's host is alive (it answers replyPending) but its process
    // never replies: without a deadline the Send would wait forever.
    let mut n = Net::with(2, |_, c| c.host_timeout = 1_000_000);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let seg = SharedBuf::new(vec![0; 3000]);
    let t0 = n.now;
    n.e[1]
        .send(t0, c, s, seg_msg(1, SegAccess::WRITE), Some(seg.lend()))
        .unwrap();
    n.e[1].set_send_deadline(c, t0 + 2_500_000);
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    let done = n.advance_until(10_000_000, |n| completed(&n.e[1], c));
    assert!(done, "the Send ended");
    assert_eq!(send_err(&mut n.e[1], c), IpcError::Deadline(s));
    let took = n.now - t0;
    assert!(
        (2_500_000..2_501_000).contains(&took),
        "ended after {took} µs"
    );
    assert!(n.e[1].stats().rx_of(PacketType::ReplyPending) >= 8);
    assert_eq!(n.e[1].stats().deadlines, 1);
    assert_eq!(n.e[1].stats().timeouts, 0);
    assert_eq!(std::sync::Arc::strong_count(&seg.0), 1, "segment released");
    // The late reply is discarded; the client's next exchange works.
    let late = [7u8; 100];
    let _ = n.e[0].reply(n.now, s, c, Message::with_code(9), Some((0, &late[..])));
    n.advance(3_000_000);
    assert_eq!(n.e[1].take_completion(c), None);
    assert!(seg.snapshot().iter().all(|&b| b == 0));
    n.e[1]
        .send(n.now, c, s, Message::with_code(2), None)
        .unwrap();
    n.run();
    let r = n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    assert_eq!(r.msg.code(), 2);
    n.e[0]
        .reply(n.now, s, c, Message::with_code(3), None)
        .unwrap();
    n.run();
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 3);
}

#[test]
fn send_deadline_bounds_a_local_send() {
    let mut n = Net::new(1);
    let s = n.e[0].create_process().unwrap();
    let c = n.e[0].create_process().unwrap();
    let t0 = n.now;
    n.e[0].send(t0, c, s, Message::with_code(1), None).unwrap();
    n.e[0].set_send_deadline(c, t0 + 700_000);
    n.e[0].receive(t0, s, None, None).unwrap().unwrap();
    assert!(n.advance_until(5_000_000, |n| completed(&n.e[0], c)));
    assert_eq!(send_err(&mut n.e[0], c), IpcError::Deadline(s));
    assert_eq!(n.now - t0, 700_000);
    // The receiver's late Reply finds no sender waiting.
    assert!(n.e[0].reply(n.now, s, c, Message::zero(), None).is_err());
    // A deadline that is not reached changes nothing.
    n.e[0]
        .send(n.now, c, s, Message::with_code(2), None)
        .unwrap();
    n.e[0].set_send_deadline(c, n.now + 700_000);
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.e[0]
        .reply(n.now, s, c, Message::with_code(3), None)
        .unwrap();
    assert_eq!(reply_of(&mut n.e[0], c).msg.code(), 3);
    n.advance(2_000_000);
    assert_eq!(n.e[0].stats().deadlines, 1);
}
