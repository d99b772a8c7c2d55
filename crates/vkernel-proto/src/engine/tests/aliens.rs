//! Duplicate filtering, saved replies and the alien pool bounds.

use super::*;

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
    // The reply is lost; a retransmission gets the saved reply, byte for
    // byte but for the flag that marks it a copy.
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
    let mut copy = reply.clone();
    copy[3] |= wire::F_RETRANSMIT;
    assert_eq!(n.sent[m].data, copy);
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
fn a_copy_refused_for_lack_of_buffers_teaches_nothing() {
    // One alien slot, held by host 2's request. Host 3's first copy is
    // lost; its retransmission finds the pool full and is answered
    // replyPending marked Busy: the server never held the request, so the
    // copy was not needless and the server is not slow (no timeout floor).
    let mut n = Net::with(3, |_, c| {
        c.alien_pool = 1;
        c.alien_per_host = 1;
        // (Short, so that a floor from the refused copy would show.)
        c.initial_rto = 2_000;
    });
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let a = n.e[1].create_process().unwrap();
    let b = n.e[2].create_process().unwrap();
    n.e[1]
        .send(n.now, a, s, Message::with_code(1), None)
        .unwrap();
    n.run();
    assert_eq!(n.e[0].stats().aliens_in_use, 1);
    let server = HostId(1);
    let rto = n.e[2].send_rto_for(n.now, server);
    n.drop_next = 1;
    n.e[2]
        .send(n.now, b, s, Message::with_code(2), None)
        .unwrap();
    n.run();
    let mark = n.sent.len();
    // (Host 2's own copies get plain replyPendings: its request is held.)
    let to_b = |n: &Net| {
        n.sent[mark..]
            .iter()
            .filter(|t| t.to == 2 && t.ptype() == PacketType::ReplyPending)
            .map(|t| decode(&t.data).unwrap().header.status)
            .next()
    };
    let refused = n.advance_until(1_000_000, |n| to_b(n).is_some());
    assert!(refused);
    assert_eq!(to_b(&n), Some(Status::Busy));
    assert_eq!(n.e[0].stats().drops_of(DropReason::NoBuffers), 1);
    assert_eq!(n.e[2].send_rto_for(n.now, server), rto, "no timeout floor");
    // Both are served: host 3's request gets in once the slot is free.
    let mut served = BTreeSet::new();
    let done = n.advance_until(3_000_000, |n| {
        while let Ok(Some(r)) = n.e[0].receive(n.now, s, None, None) {
            n.e[0].reply(n.now, s, r.from, r.msg, None).unwrap();
            served.insert(r.from);
        }
        n.e[0].cancel_receive(s);
        served.len() == 2
    });
    assert!(done, "served {}", served.len());
    n.run();
    assert_eq!(reply_of(&mut n.e[1], a).msg.code(), 1);
    assert_eq!(reply_of(&mut n.e[2], b).msg.code(), 2);
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
