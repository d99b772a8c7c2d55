//! MoveTo and MoveFrom (local, remote, lossy, in place) and reply data sent ahead.

use super::*;

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
        let mark = n.sent.len();
        assert_eq!(
            n.e[0].move_to(n.now, s, c, off, SharedBuf::new(data.clone()).lend()),
            Ok(None)
        );
        n.run();
        assert_eq!(moved(&mut n.e[0], s), Ok(len), "MoveTo of {len}");
        let nc = len.div_ceil(CHUNK);
        assert_eq!(
            n.e[0].stats().tx_of(PacketType::MoveToRequest) - before,
            nc as u64,
            "one datagram per chunk on a clean network"
        );
        // As few chunks as fit, of one size: no short tail.
        let sizes: Vec<usize> = n.sent[mark..]
            .iter()
            .filter(|t| t.ptype() == PacketType::MoveToRequest)
            .map(|t| decode(&t.data).expect("valid").data.len())
            .collect();
        let (lo, hi) = (sizes.iter().min(), sizes.iter().max());
        assert!(
            hi.zip(lo).is_some_and(|(h, l)| h - l < nc),
            "chunk sizes {lo:?}..{hi:?} for {len} bytes in {nc} chunks"
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

/// Two engines with write-behind up to `behind` bytes, a server process on
/// engine 0 that has received a Send from a client on engine 1 declaring
/// a `len`-byte segment with `access`, and the segment.
fn behind_exchange(behind: usize, len: usize, access: SegAccess) -> (Net, Pid, Pid, SharedBuf) {
    let mut n = Net::with(2, |_, c| c.write_behind = behind);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let seg = SharedBuf::new(vec![0; len]);
    // Nothing appended: every MoveFrom goes to the sender's host.
    let mut m = seg_msg(1, access);
    m.set_flag(NO_APPEND, true);
    n.e[1].send(n.now, c, s, m, Some(seg.lend())).unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    (n, s, c, seg)
}

/// A filter losing the first copy of the chunk at `off` of a transfer
/// from engine 0 (the last of a two-chunk unit: no acknowledgement comes,
/// so only the transfer's timer recovers it).
fn lose_first_copy_of_chunk_at(off: usize) -> Filter {
    let mut lost = false;
    Box::new(move |from, _, d| {
        let h = decode(d).expect("valid").header;
        let hit = from == 0
            && h.ptype == PacketType::MoveToRequest
            && h.local_addr as usize == off
            && !lost;
        lost |= hit;
        !hit
    })
}

#[test]
fn a_write_behind_move_returns_at_once_and_the_reply_waits_for_its_data() {
    let (mut n, s, c, seg) = behind_exchange(4 * CHUNK, 6 * CHUNK, SegAccess::WRITE);
    n.filter = Some(lose_first_copy_of_chunk_at(CHUNK));
    let a = pattern(1, 2 * CHUNK);
    let b = pattern(2, 2 * CHUNK);
    let now = n.now;
    assert_eq!(
        n.e[0].move_to(now, s, c, 0, SharedBuf::new(a.clone()).lend()),
        Ok(Some(2 * CHUNK)),
        "answered before its acknowledgement"
    );
    assert_eq!(
        n.e[0].move_to(
            now,
            s,
            c,
            2 * CHUNK as u32,
            SharedBuf::new(b.clone()).lend()
        ),
        Ok(Some(2 * CHUNK)),
        "a second unit goes out beside the first"
    );
    // Beyond the write-behind bound: an ordinary blocking MoveTo.
    let c3 = pattern(3, 2 * CHUNK);
    assert_eq!(
        n.e[0].move_to(
            now,
            s,
            c,
            4 * CHUNK as u32,
            SharedBuf::new(c3.clone()).lend()
        ),
        Ok(None)
    );
    n.run();
    assert_eq!(moved(&mut n.e[0], s), Ok(2 * CHUNK));
    assert_eq!(n.e[0].stats().bulk_write_behind, 2);
    // The first unit lost its last chunk: the reply is held meanwhile.
    let mark = n.sent.len();
    n.e[0]
        .reply(n.now, s, c, Message::with_code(7), None)
        .unwrap();
    n.run();
    assert!(!completed(&n.e[1], c), "the sender must not resume yet");
    assert!(!n.types_since(mark).contains(&PacketType::RemoteReply));
    assert!(n.advance_until(1_000_000, |n| completed(&n.e[1], c)));
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 7);
    let types = n.types_since(mark);
    let retx = types.iter().position(|&t| t == PacketType::MoveToRequest);
    let reply = types.iter().position(|&t| t == PacketType::RemoteReply);
    assert!(
        retx.is_some() && retx < reply,
        "the lost chunk went again before the reply: {types:?}"
    );
    let mut want = a;
    want.extend_from_slice(&b);
    want.extend_from_slice(&c3);
    same_bytes(&seg.snapshot(), &want, "segment");
    assert!(n.e[0].behind.is_empty() && n.e[0].held.is_empty());
}

#[test]
fn a_write_behind_move_from_a_shared_buffer_keeps_it_instead_of_a_copy() {
    let (mut n, s, c, seg) = behind_exchange(4 * CHUNK, 4 * CHUNK, SegAccess::WRITE);
    let data: std::sync::Arc<[u8]> = pattern(5, 4 * CHUNK).into();
    let unit = |k: usize| {
        let r = k * 2 * CHUNK..(k + 1) * 2 * CHUNK;
        Box::new(crate::SharedSeg::new(data.clone(), r).unwrap())
    };
    let now = n.now;
    assert_eq!(n.e[0].move_to(now, s, c, 0, unit(0)), Ok(Some(2 * CHUNK)));
    assert_eq!(
        std::sync::Arc::strong_count(&data),
        2,
        "the engine holds the caller's buffer, not a copy of it"
    );
    // A lent (changeable) buffer is copied: nothing of it is held.
    let lent = SharedBuf::new(data[2 * CHUNK..].to_vec());
    assert_eq!(
        n.e[0].move_to(now, s, c, 2 * CHUNK as u32, lent.lend()),
        Ok(Some(2 * CHUNK))
    );
    assert_eq!(std::sync::Arc::strong_count(&lent.0), 1);
    n.run();
    assert!(n.e[0].behind.is_empty(), "both acknowledged");
    assert_eq!(std::sync::Arc::strong_count(&data), 1, "and let go");
    n.e[0]
        .reply(n.now, s, c, Message::with_code(7), None)
        .unwrap();
    n.run();
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 7);
    same_bytes(&seg.snapshot(), &data, "segment");
    assert_eq!(n.e[0].stats().bulk_write_behind, 2);
}

#[test]
fn a_move_overlapping_unacknowledged_write_behind_data_waits_for_it() {
    let (mut n, s, c, seg) = behind_exchange(4 * CHUNK, 6 * CHUNK, SegAccess::READ_WRITE);
    // The first copy of the write-behind unit's last chunk is lost, so
    // without the wait the overlapping MoveTo would land first and the
    // retransmitted chunk over it.
    n.filter = Some(lose_first_copy_of_chunk_at(CHUNK));
    let a = pattern(1, 2 * CHUNK);
    let b = pattern(2, 2 * CHUNK);
    let now = n.now;
    let at = 2 * CHUNK as u32;
    assert_eq!(
        n.e[0].move_to(now, s, c, at, SharedBuf::new(a.clone()).lend()),
        Ok(Some(2 * CHUNK))
    );
    assert_eq!(
        n.e[0].move_to(
            now,
            s,
            c,
            at + CHUNK as u32,
            SharedBuf::new(b.clone()).lend()
        ),
        Ok(None),
        "overlaps: waits, then moves"
    );
    n.run();
    assert!(!completed(&n.e[0], s));
    assert!(n.advance_until(1_000_000, |n| completed(&n.e[0], s)));
    assert_eq!(moved(&mut n.e[0], s), Ok(2 * CHUNK));
    // A MoveFrom of what a write-behind MoveTo wrote (its second chunk
    // lost once) reads it.
    n.filter = Some(lose_first_copy_of_chunk_at(CHUNK));
    let now = n.now;
    assert_eq!(
        n.e[0].move_to(now, s, c, 0, SharedBuf::new(b.clone()).lend()),
        Ok(Some(2 * CHUNK))
    );
    let back = SharedBuf::new(vec![0; CHUNK]);
    assert_eq!(
        n.e[0].move_from(now, s, c, CHUNK as u32, back.lend()),
        Ok(None)
    );
    assert!(n.advance_until(1_000_000, |n| completed(&n.e[0], s)));
    assert_eq!(moved(&mut n.e[0], s), Ok(CHUNK));
    same_bytes(&back.snapshot(), &b[CHUNK..], "read after write");
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    reply_of(&mut n.e[1], c);
    let mut want = vec![0; 6 * CHUNK];
    want[..2 * CHUNK].copy_from_slice(&b);
    want[2 * CHUNK..3 * CHUNK].copy_from_slice(&a[..CHUNK]);
    want[3 * CHUNK..5 * CHUNK].copy_from_slice(&b);
    same_bytes(&seg.snapshot(), &want, "the later MoveTo wins");
}

#[test]
fn a_failed_write_behind_move_never_lets_the_sender_resume() {
    let (mut n, s, c, _seg) = behind_exchange(4 * CHUNK, 2 * CHUNK, SegAccess::WRITE);
    // Every chunk to the sender's host is lost; everything else passes, so
    // the sender's kernel hears replyPending and would wait for ever for
    // a reply that must not come.
    n.filter = Some(Box::new(|from, _, d| {
        from != 0 || decode(d).expect("valid").header.ptype != PacketType::MoveToRequest
    }));
    let now = n.now;
    let data = SharedBuf::new(pattern(1, 2 * CHUNK)).lend();
    assert_eq!(n.e[0].move_to(now, s, c, 0, data), Ok(Some(2 * CHUNK)));
    n.e[0].reply(now, s, c, Message::zero(), None).unwrap();
    let limit = 3 * Config::default().host_timeout;
    assert!(n.advance_until(limit, |n| completed(&n.e[1], c)));
    assert!(
        matches!(send_err(&mut n.e[1], c), IpcError::Timeout(_)),
        "the Send fails rather than returning on a partial segment"
    );
    assert!(n.e[0].behind.is_empty() && n.e[0].held.is_empty());
}

/// Several write-behind MoveTos queued at a slow peer: only the oldest
/// probes while its acknowledgement is late (the younger ones' data waits
/// behind it at the peer, so their silence says nothing), and all of them
/// complete once the peer catches up.
#[test]
fn write_behind_moves_queued_at_a_slow_peer_probe_one_at_a_time() {
    let (mut n, s, c, seg) = behind_exchange(8 * CHUNK, 8 * CHUNK, SegAccess::WRITE);
    // A round-trip sample first, so the transfers get a tail-loss probe
    // (two round trips, at least 200 µs) shorter than their timeout.
    let (p0, p1) = (
        n.e[0].create_process().unwrap(),
        n.e[1].create_process().unwrap(),
    );
    n.e[0]
        .send(n.now, p0, p1, Message::with_code(1), None)
        .unwrap();
    n.run();
    n.e[1].receive(n.now, p1, None, None).unwrap().unwrap();
    n.e[1]
        .reply(n.now, p1, p0, Message::with_code(2), None)
        .unwrap();
    n.run();
    reply_of(&mut n.e[0], p0);
    assert!(n.e[0].srtt(HostId(2)).is_some());
    // The peer takes in nothing of the transfers for 1.5 ms (less than
    // the 2 ms timeout, several probe delays).
    n.filter = Some(Box::new(|from, _, d| {
        from != 0 || decode(d).expect("valid").header.ptype != PacketType::MoveToRequest
    }));
    let mark = n.sent.len();
    let units: Vec<Vec<u8>> = (0..4).map(|i| pattern(i + 1, 2 * CHUNK)).collect();
    for (i, u) in units.iter().enumerate() {
        let at = (i * 2 * CHUNK) as u32;
        assert_eq!(
            n.e[0].move_to(n.now, s, c, at, SharedBuf::new(u.clone()).lend()),
            Ok(Some(2 * CHUNK)),
            "unit {i} goes write-behind"
        );
    }
    n.run();
    let r0 = n.e[0].stats().bulk_retransmits;
    n.advance(1_500);
    assert_eq!(
        n.e[0].stats().bulk_retransmits - r0,
        1,
        "only the oldest transfer probes"
    );
    // The peer catches up with the first unit: the next in line starts
    // its probe delay now, not from when its data went out.
    let held: Vec<Vec<u8>> = n.sent[mark..]
        .iter()
        .filter(|t| t.to == 1 && t.ptype() == PacketType::MoveToRequest)
        .map(|t| t.data.clone())
        .collect();
    let first_unit =
        |d: &Vec<u8>| (decode(d).expect("valid").header.remote_addr as usize) < 2 * CHUNK;
    for d in held.iter().filter(|d| first_unit(d)) {
        n.inject(1, 0, d);
    }
    n.run();
    assert_eq!(n.e[0].behind.len(), 3, "the oldest unit is acknowledged");
    let r1 = n.e[0].stats().bulk_retransmits;
    n.advance(150);
    assert_eq!(
        n.e[0].stats().bulk_retransmits,
        r1,
        "no probe sooner than 200 µs after becoming the oldest"
    );
    // Then with the rest, in order.
    n.filter = None;
    for d in held.iter().filter(|d| !first_unit(d)) {
        n.inject(1, 0, d);
    }
    assert!(n.advance_until(100_000, |n| n.e[0].behind.is_empty()));
    n.e[0]
        .reply(n.now, s, c, Message::with_code(7), None)
        .unwrap();
    assert!(n.advance_until(100_000, |n| completed(&n.e[1], c)));
    same_bytes(&seg.snapshot(), &units.concat(), "segment");
}

/// Units of `unit` bytes moved write-behind to `UNITS * unit` bytes of a
/// sender's segment, each from its own buffer (copied) or from one shared
/// buffer, the network run after each; then a Reply. Checks the segment
/// and returns the MoveTo datagrams the mover sent.
fn move_in_units(unit: usize, shared: bool) -> u64 {
    const UNITS: usize = 40;
    let (mut n, s, c, seg) = behind_exchange(32 * CHUNK, UNITS * unit, SegAccess::WRITE);
    let data: std::sync::Arc<[u8]> = pattern(3, UNITS * unit).into();
    let sent0 = n.e[0].stats().tx_of(PacketType::MoveToRequest);
    for k in 0..UNITS {
        let now = n.now;
        let r = k * unit..(k + 1) * unit;
        let src: crate::Seg = if shared {
            Box::new(crate::SharedSeg::new(data.clone(), r.clone()).unwrap())
        } else {
            SharedBuf::new(data[r.clone()].to_vec()).lend()
        };
        assert_eq!(
            n.e[0].move_to(now, s, c, r.start as u32, src),
            Ok(Some(unit)),
            "unit {k} goes write-behind"
        );
        n.run();
    }
    n.e[0]
        .reply(n.now, s, c, Message::with_code(9), None)
        .unwrap();
    n.run();
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 9);
    same_bytes(&seg.snapshot(), &data, "segment");
    assert!(n.e[0].behind.is_empty());
    if shared {
        assert_eq!(std::sync::Arc::strong_count(&data), 1, "let go");
    }
    n.e[0].stats().tx_of(PacketType::MoveToRequest) - sent0
}

#[test]
fn small_contiguous_write_behind_moves_share_chunks() {
    // 40 units of a quarter chunk and a bit: alone, a datagram each.
    let unit = CHUNK / 4 + 3;
    let whole = (40 * unit).div_ceil(CHUNK) as u64;
    for shared in [false, true] {
        let sent = move_in_units(unit, shared);
        assert!(
            sent <= whole + 1,
            "shared {shared}: {sent} chunks for 40 units; {whole} would carry them"
        );
    }
    // A unit of a chunk or more goes out at once, as before.
    assert_eq!(move_in_units(CHUNK + 7, false), 80);
}

#[test]
fn an_open_stream_goes_out_when_no_move_follows() {
    let (mut n, s, c, seg) = behind_exchange(32 * CHUNK, 4 * CHUNK, SegAccess::WRITE);
    let a = pattern(5, 100);
    let now = n.now;
    assert_eq!(
        n.e[0].move_to(now, s, c, 0, SharedBuf::new(a.clone()).lend()),
        Ok(Some(100))
    );
    n.run();
    assert_eq!(
        n.e[0].stats().tx_of(PacketType::MoveToRequest),
        0,
        "held for a MoveTo that may follow"
    );
    // No Reply and no other move: the stream's timer sends it.
    assert!(n.advance_until(1_000_000, |n| n.e[0].behind.is_empty()));
    assert_eq!(n.e[0].stats().tx_of(PacketType::MoveToRequest), 1);
    assert_eq!(n.e[0].stats().bulk_retransmits, 0, "sent, not probed");
    // Acknowledged already: the Reply goes at once.
    n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
    n.run();
    reply_of(&mut n.e[1], c);
    same_bytes(&seg.snapshot()[..100], &a, "the data");
}

#[test]
fn a_grown_stream_is_refused_where_its_old_last_chunk_came_partial() {
    let b = InBulk::new((Pid(1), 1), false, 0, 1500, 1000);
    let mut partial = b.clone();
    partial.got.set(1);
    // Same total; an earlier (smaller) total for a whole chunk only.
    assert!(b.admits(1500, 1000, 500));
    assert!(b.admits(1000, 1000, 1000));
    assert!(!b.admits(900, 1000, 900));
    // Growth: fine unless the old partial last chunk was taken.
    assert!(b.admits(2500, 1000, 500));
    assert!(!partial.admits(2500, 1000, 500));
    // Another chunk size is another transfer.
    assert!(!b.admits(1500, 500, 500));
}
