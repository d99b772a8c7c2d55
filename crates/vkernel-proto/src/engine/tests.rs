//! Unit tests of the engine: two or three engines wired through an
//! in-memory network that delivers every datagram in order.

use super::*;
use crate::message::IDEMPOTENT;
use crate::segment::SharedBuf;
use proptest::prelude::*;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 5000 + i as u16))
}

struct Net {
    e: Vec<Engine>,
    now: Micros,
    /// Datagrams moved, by sender index.
    moved: Vec<u64>,
    /// Drop the next n datagrams (to model loss where needed).
    drop_next: usize,
}

impl Net {
    fn new(n: usize) -> Net {
        let e = (0..n)
            .map(|i| {
                Engine::new(
                    Config {
                        host_id: Some(HostId(i as u16 + 1)),
                        discovery: (0..n).filter(|&j| j != i).map(addr).collect(),
                        datagram_size: 1200,
                        window: 8 * 1124,
                        alien_pool: 4,
                        alien_per_host: 4,
                        seed: i as u64,
                        ..Config::default()
                    },
                    0,
                )
            })
            .collect();
        Net {
            e,
            now: 0,
            moved: vec![0; n],
            drop_next: 0,
        }
    }

    /// Delivers datagrams until quiet.
    fn run(&mut self) {
        loop {
            let mut any = false;
            for i in 0..self.e.len() {
                while let Some(t) = self.e[i].poll_transmit() {
                    any = true;
                    self.moved[i] += 1;
                    if self.drop_next > 0 {
                        self.drop_next -= 1;
                        continue;
                    }
                    let j = (t.to.port() - 5000) as usize;
                    self.now += 10;
                    let now = self.now;
                    self.e[j].handle_datagram(now, addr(i), &t.data);
                }
            }
            if !any {
                return;
            }
        }
    }

    fn tick(&mut self, dt: Micros) {
        self.now += dt;
        for e in &mut self.e {
            e.handle_timeout(self.now);
        }
        self.run();
    }

    fn total_moved(&self) -> u64 {
        self.moved.iter().sum()
    }
}

fn woke(e: &mut Engine, p: Pid) -> bool {
    let mut found = false;
    while let Some(ev) = e.poll_event() {
        if ev == Event::Wake(p) {
            found = true;
        }
    }
    found
}

#[test]
fn local_exchange_with_segments() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let s = e.create_process().unwrap();
    let c = e.create_process().unwrap();
    let rbuf = SharedBuf::new(vec![0; 8]);
    assert_eq!(e.receive(0, s, None, Some(rbuf.lend())).unwrap(), None);
    let seg = SharedBuf::new(b"0123456789abcdef".to_vec());
    let mut m = Message::with_code(7);
    m.set_segment(SegAccess::READ_WRITE, 16);
    e.send(0, c, s, m, Some(seg.lend())).unwrap();
    assert!(woke(e, s));
    let Some(Completion::Receive(Ok(r))) = e.take_completion(s) else {
        panic!("no receive")
    };
    assert_eq!((r.from, r.seg_bytes, r.msg.code()), (c, 8, 7));
    assert_eq!(rbuf.snapshot(), b"01234567");
    assert_eq!(r.msg.seg_len(), 16);
    let mut small = SharedBuf::new(vec![0; 4]).lend();
    assert_eq!(e.move_from(0, s, c, 12, small).unwrap(), Some(4));
    small = SharedBuf::new(vec![0; 4]).lend();
    assert_eq!(
        e.move_from(0, s, c, 13, small),
        Err(IpcError::OutOfBounds(c))
    );
    e.reply(0, s, c, Message::with_code(9), Some((2, b"XY")))
        .unwrap();
    assert!(woke(e, c));
    let Some(Completion::Send(Ok(rep))) = e.take_completion(c) else {
        panic!("no reply")
    };
    assert_eq!((rep.msg.code(), rep.seg_bytes), (9, 2));
    assert_eq!(seg.snapshot(), b"01XY456789abcdef");
    // After the reply the segment is gone.
    assert_eq!(
        e.reply(0, s, c, m, None),
        Err(IpcError::NotAwaitingReply(c))
    );
}

#[test]
fn remote_exchange_is_two_datagrams_and_page_ops_too() {
    let mut n = Net::new(2);
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    // Teach host 2 where host 1 is, so nothing is fanned out.
    n.e[0]
        .send(0, s, Pid::new(HostId(2), 0x7777), Message::zero(), None)
        .unwrap();
    n.run();
    assert!(matches!(
        n.e[0].take_completion(s),
        Some(Completion::Send(Err(_)))
    ));
    let before = n.total_moved();
    for op in 0..3 {
        let buf = SharedBuf::new(vec![0; 4096]);
        n.e[0].receive(n.now, s, None, Some(buf.lend())).unwrap();
        let page = SharedBuf::new(if op == 2 {
            vec![5; 4096]
        } else {
            vec![0; 4096]
        });
        let mut m = Message::with_code(1);
        m.set_segment(
            match op {
                0 => SegAccess::NONE,
                1 => SegAccess::WRITE,
                _ => SegAccess::READ,
            },
            4096,
        );
        let seg = (op > 0).then(|| page.lend());
        n.e[1].send(n.now, c, s, m, seg).unwrap();
        n.run();
        let Some(Completion::Receive(Ok(r))) = n.e[0].take_completion(s) else {
            panic!("not received")
        };
        if op == 2 {
            assert_eq!(r.seg_bytes, 4096);
            assert!(buf.snapshot().iter().all(|&b| b == 5));
        }
        let data = [9u8; 4096];
        let seg = (op == 1).then_some((0u32, &data[..]));
        n.e[0]
            .reply(n.now, s, c, Message::with_code(2), seg)
            .unwrap();
        n.run();
        let Some(Completion::Send(Ok(rep))) = n.e[1].take_completion(c) else {
            panic!("no reply")
        };
        if op == 1 {
            assert_eq!(rep.seg_bytes, 4096);
            assert!(page.snapshot().iter().all(|&b| b == 9));
        }
    }
    assert_eq!(
        n.total_moved() - before,
        6,
        "three exchanges, two datagrams each"
    );
}

#[test]
fn duplicates_get_reply_pending_and_saved_replies() {
    let mut n = Net::new(2);
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    // Non-idempotent request; the reply is lost.
    n.e[1].send(0, c, s, Message::with_code(1), None).unwrap();
    n.run();
    // Retransmission before the server received it: replyPending.
    n.tick(200_000);
    assert_eq!(n.e[0].stats().duplicates, 1);
    assert_eq!(n.e[1].stats().rx_of(PacketType::ReplyPending), 1);
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.drop_next = 1;
    n.e[0]
        .reply(n.now, s, c, Message::with_code(5), None)
        .unwrap();
    n.run();
    assert!(n.e[1].take_completion(c).is_none());
    // The retransmission is answered with the saved reply, not re-executed.
    n.tick(1_100_000);
    assert_eq!(n.e[0].stats().saved_replies_resent, 1);
    let Some(Completion::Send(Ok(rep))) = n.e[1].take_completion(c) else {
        panic!("no reply")
    };
    assert_eq!(rep.msg.code(), 5);
    // Idempotent request whose reply is lost: executed again.
    let mut m = Message::with_code(2);
    m.set_flag(IDEMPOTENT, true);
    n.e[1].send(n.now, c, s, m, None).unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.drop_next = 1;
    n.e[0].reply(n.now, s, c, m, None).unwrap();
    n.run();
    n.tick(1_100_000);
    assert!(
        n.e[0].receive(n.now, s, None, None).unwrap().is_some(),
        "re-executed"
    );
}

#[test]
fn full_alien_pool_answers_reply_pending_without_growing() {
    let mut n = Net::new(2);
    let s = n.e[0].create_process().unwrap();
    let clients: Vec<Pid> = (0..6).map(|_| n.e[1].create_process().unwrap()).collect();
    for &c in &clients {
        n.e[1].send(0, c, s, Message::with_code(1), None).unwrap();
    }
    n.run();
    assert_eq!(n.e[0].stats().aliens_in_use, 4);
    assert_eq!(n.e[0].stats().drops_of(DropReason::NoBuffers), 2);
    // Serve them all; the two refused get in on retransmission.
    let mut served = 0;
    for _ in 0..50 {
        while let Ok(Some(r)) = n.e[0].receive(n.now, s, None, None) {
            let mut m = r.msg;
            m.set_flag(IDEMPOTENT, true);
            n.e[0].reply(n.now, s, r.from, m, None).unwrap();
            served += 1;
        }
        n.e[0].cancel_receive(s);
        n.tick(50_000);
    }
    assert_eq!(served, 6);
    for &c in &clients {
        assert!(matches!(
            n.e[1].take_completion(c),
            Some(Completion::Send(Ok(_)))
        ));
    }
}

#[test]
fn send_to_missing_process_is_nacked_and_dead_host_times_out() {
    let mut n = Net::new(2);
    let c = n.e[1].create_process().unwrap();
    let ghost = Pid::new(HostId(1), 0x4242);
    n.e[1].send(0, c, ghost, Message::zero(), None).unwrap();
    n.run();
    assert_eq!(
        n.e[1].take_completion(c),
        Some(Completion::Send(Err(IpcError::NoSuchProcess(ghost))))
    );
    let nowhere = Pid::new(HostId(9), 3);
    n.e[1]
        .send(n.now, c, nowhere, Message::zero(), None)
        .unwrap();
    let t0 = n.now;
    while n.e[1].take_completion(c).is_none() {
        n.tick(100_000);
        assert!(n.now - t0 < 4_000_000, "no timeout");
    }
    assert!(n.now - t0 >= n.e[1].config().host_timeout);
}

#[test]
fn bulk_moves_many_chunks_both_ways_and_checks_rights() {
    let mut n = Net::new(2);
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    // Larger than what travels with the request, so MoveFrom must stream.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    let seg = SharedBuf::new(data.clone());
    let mut m = Message::with_code(1);
    m.set_segment(SegAccess::READ, data.len() as u32);
    n.e[1].send(0, c, s, m, Some(seg.lend())).unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    let dst = SharedBuf::new(vec![0; 200_000]);
    assert_eq!(n.e[0].move_from(n.now, s, c, 0, dst.lend()), Ok(None));
    n.run();
    assert_eq!(
        n.e[0].take_completion(s),
        Some(Completion::Move(Ok(200_000)))
    );
    // The part that came with the request is served without the network.
    let head = SharedBuf::new(vec![0; 1000]);
    let sent = n.total_moved();
    assert_eq!(
        n.e[0].move_from(n.now, s, c, 500, head.lend()),
        Ok(Some(1000))
    );
    assert_eq!(n.total_moved(), sent);
    assert_eq!(head.snapshot(), data[500..1500]);
    assert_eq!(dst.snapshot(), data);
    // Read-only segment: MoveTo refused locally (and by the owner).
    let src = SharedBuf::new(vec![1; 10]);
    assert_eq!(
        n.e[0].move_to(n.now, s, c, 0, src.lend()),
        Err(IpcError::AccessDenied(c))
    );
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    // Writable segment: MoveTo of many chunks.
    let out = SharedBuf::new(vec![0; 30_000]);
    let mut m = Message::with_code(1);
    m.set_segment(SegAccess::WRITE, 30_000);
    n.e[1].send(n.now, c, s, m, Some(out.lend())).unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    let src = SharedBuf::new(data[..30_000].to_vec());
    assert_eq!(n.e[0].move_to(n.now, s, c, 0, src.lend()), Ok(None));
    n.run();
    assert_eq!(
        n.e[0].take_completion(s),
        Some(Completion::Move(Ok(30_000)))
    );
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    assert!(matches!(
        n.e[1].take_completion(c),
        Some(Completion::Send(Ok(_)))
    ));
    assert_eq!(out.snapshot(), data[..30_000]);
}

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
    let candidate = wire::decode(&first.data).unwrap().header.dst.host();
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
    let mut conflict = false;
    while let Some(ev) = late.poll_event() {
        conflict |= matches!(ev, Event::HostIdConflict(_));
    }
    assert!(conflict);
}

#[test]
fn getpid_scopes() {
    let mut n = Net::new(2);
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    n.e[0].set_pid(10, s, Scope::Any);
    n.e[0].set_pid(11, s, Scope::Local);
    assert_eq!(n.e[1].get_pid(0, c, 10, Scope::Local), Ok(Some(Pid::NONE)));
    assert_eq!(n.e[1].get_pid(0, c, 10, Scope::Any), Ok(None));
    n.run();
    assert_eq!(n.e[1].take_completion(c), Some(Completion::GetPid(Ok(s))));
    assert_eq!(n.e[1].get_pid(n.now, c, 11, Scope::Remote), Ok(None));
    n.run();
    for _ in 0..10 {
        n.tick(100_000);
    }
    assert_eq!(
        n.e[1].take_completion(c),
        Some(Completion::GetPid(Ok(Pid::NONE))),
        "local-scope names are invisible remotely"
    );
}

proptest! {
    #[test]
    fn arbitrary_datagrams_never_panic_and_are_counted(
        dgrams in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..40)
    ) {
        let mut n = Net::new(1);
        let s = n.e[0].create_process().unwrap();
        n.e[0].receive(0, s, None, None).unwrap();
        for d in &dgrams {
            n.e[0].handle_datagram(1, addr(3), d);
        }
        let st = n.e[0].stats();
        let accepted: u64 = st.rx.iter().sum();
        prop_assert_eq!(accepted + st.malformed(), dgrams.len() as u64);
        prop_assert!(st.aliens_in_use <= 4);
    }

    #[test]
    fn mutated_valid_packets_never_panic(flip in 0usize..76, val: u8, t in 1u8..=13) {
        let mut n = Net::new(1);
        let s = n.e[0].create_process().unwrap();
        let mut h = Header::new(PacketType::from_u8(t).unwrap());
        h.src = Pid::new(HostId(2), 5);
        h.dst = s;
        let mut b = wire::encode(&h, &Message::zero(), &[1, 2, 3]);
        b[flip] = val;
        n.e[0].handle_datagram(1, addr(3), &b);
        n.e[0].handle_timeout(10_000_000);
    }
}
