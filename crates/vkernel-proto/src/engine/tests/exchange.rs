//! Send, Receive, Reply and Forward, local and remote.

use super::*;

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
fn poll_transmit_into_swaps_the_callers_buffer_in() {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let mut buf = vec![0xEE; 600];
    let mine = buf.as_ptr();
    n.e[1]
        .send(n.now, c, s, Message::with_code(7), None)
        .unwrap();
    assert_eq!(n.e[1].poll_transmit_into(&mut buf), Some(addr(0)));
    assert_eq!(buf.len(), crate::wire::FIXED_BYTES);
    assert_eq!(decode(&buf).map(|p| p.msg.code()), Ok(7));
    assert!(n.e[1].poll_transmit_into(&mut buf).is_none());
    // The caller's old buffer carries the engine's next datagram.
    n.e[0].handle_datagram(n.now, addr(1), &buf);
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.e[0]
        .reply(n.now, s, c, Message::with_code(8), None)
        .unwrap();
    let t = n.e[0].poll_transmit().unwrap();
    n.e[1].handle_datagram(n.now, addr(0), &t.data);
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 8);
    n.e[1]
        .send(n.now, c, s, Message::with_code(9), None)
        .unwrap();
    let mut other = Vec::new();
    n.e[1].poll_transmit_into(&mut other).unwrap();
    assert_eq!(other.as_ptr(), mine, "the swapped-out buffer was reused");
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
fn receive_upto_copies_only_from_segments_within_the_limit() {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let local = n.e[0].create_process().unwrap();
    let remote = n.e[1].create_process().unwrap();
    let cases = [(1000usize, 999usize, false), (1000, 1000, true)];
    // Each twice: into a lent buffer, and (`receive_queued`, the message
    // being queued) into a plain slice.
    for (k, (len, upto, copied)) in cases.into_iter().chain(cases).enumerate() {
        let plain = k >= cases.len();
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
            let mut slice = vec![0; 2000];
            let r = if plain {
                n.e[0].receive_queued(s, Some(from), Some(&mut slice), upto)
            } else {
                n.e[0].receive_upto(n.now, s, Some(from), Some(buf.lend()), upto)
            };
            let r = r.unwrap().unwrap();
            let got = if plain { slice } else { buf.snapshot() };
            let want = if copied { len } else { 0 };
            assert_eq!(r.seg_bytes, want, "{from}, segment {len}, upto {upto}");
            assert_eq!(r.from, from);
            same_bytes(&got[..want], &data[..want], "copied part");
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
fn receive_queued_changes_nothing_when_nothing_is_queued() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let s = e.create_process().unwrap();
    let c = e.create_process().unwrap();
    let mut b = [0u8; 8];
    assert_eq!(
        e.receive_queued(s, None, Some(&mut b), usize::MAX),
        Ok(None)
    );
    assert_eq!(e.receive_queued(s, Some(c), None, usize::MAX), Ok(None));
    let gone = Pid::new(e.host_id().unwrap(), 999);
    assert_eq!(
        e.receive_queued(s, Some(gone), None, usize::MAX),
        Err(IpcError::NoSuchProcess(gone))
    );
    // Still ready: a Send queues, and the next one takes it.
    assert_eq!(e.send(0, c, s, Message::with_code(4), None), Ok(()));
    let r = e
        .receive_queued(s, Some(c), None, usize::MAX)
        .unwrap()
        .unwrap();
    assert_eq!((r.from, r.msg.code()), (c, 4));
    assert_eq!(e.receive_queued(s, None, None, usize::MAX), Ok(None));
    e.reply(0, s, c, Message::with_code(5), None).unwrap();
    assert_eq!(
        e.take_completion(c)
            .map(|c| matches!(c, Completion::Send(Ok(_)))),
        Some(true)
    );
}

#[test]
fn a_watched_process_hears_of_messages_left_queued_for_it() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let s = e.create_process().unwrap();
    let c1 = e.create_process().unwrap();
    let c2 = e.create_process().unwrap();
    let queued = |e: &mut Engine| {
        events(e)
            .into_iter()
            .filter(|ev| matches!(ev, Event::Queued(p) if *p == s))
            .count()
    };
    // Unwatched: no event (embedded programs pay nothing).
    e.send(0, c1, s, Message::with_code(1), None).unwrap();
    assert_eq!(queued(e), 0);
    assert!(e.has_queued(s));
    e.receive(0, s, None, None).unwrap().unwrap();
    assert!(!e.has_queued(s));
    e.reply(0, s, c1, Message::zero(), None).unwrap();
    e.watch_queue(s, true);
    e.send(0, c1, s, Message::with_code(2), None).unwrap();
    assert_eq!(queued(e), 1, "left waiting: reported");
    let r = e.receive(0, s, None, None).unwrap().unwrap();
    assert_eq!((r.from, r.msg.code()), (c1, 2));
    e.reply(0, s, c1, Message::zero(), None).unwrap();
    // Taken at once by a waiting Receive: nothing to report.
    assert_eq!(e.receive(0, s, None, None).unwrap(), None);
    e.send(0, c2, s, Message::with_code(3), None).unwrap();
    assert_eq!(queued(e), 0, "delivered to the waiting receiver");
    assert!(!e.has_queued(s));
}

#[test]
fn a_send_made_on_behalf_of_a_forwarder_says_so() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let c = e.create_process().unwrap();
    let f = e.create_process().unwrap();
    let s = e.create_process().unwrap();
    e.send_as(0, c, s, Message::with_code(9), None, usize::MAX, f)
        .unwrap();
    let r = e.receive(0, s, None, None).unwrap().unwrap();
    assert_eq!((r.from, r.forwarder, r.msg.code()), (c, f, 9));
    e.reply(0, s, c, Message::with_code(10), None).unwrap();
    assert_eq!(reply_of(e, c).from, s);
}

#[test]
fn a_granted_move_is_checked_as_a_move_is() {
    let mut n = Net::new(1);
    let e = &mut n.e[0];
    let c = e.create_process().unwrap();
    let s = e.create_process().unwrap();
    let other = e.create_process().unwrap();
    let seg = SharedBuf::new(vec![0; 100]);
    e.send(0, c, s, seg_msg(1, SegAccess::WRITE), Some(seg.lend()))
        .unwrap();
    assert_eq!(
        e.grant_move(0, s, c, 0, 10, true),
        Err(IpcError::NotAwaitingReply(c)),
        "not received yet"
    );
    e.receive(0, s, None, None).unwrap().unwrap();
    assert_eq!(e.grant_move(0, s, c, 90, 10, true), Ok(100));
    assert_eq!(
        e.grant_move(0, s, c, 91, 10, true),
        Err(IpcError::OutOfBounds(c))
    );
    assert_eq!(
        e.grant_move(0, s, c, 0, 10, false),
        Err(IpcError::AccessDenied(c)),
        "write only"
    );
    assert_eq!(
        e.grant_move(0, other, c, 0, 10, true),
        Err(IpcError::NotAwaitingReply(c)),
        "only the receiver"
    );
    e.reply(0, s, c, Message::zero(), None).unwrap();
    assert_eq!(
        e.grant_move(0, s, c, 0, 10, true),
        Err(IpcError::NotAwaitingReply(c)),
        "only while the Send is outstanding"
    );
}
