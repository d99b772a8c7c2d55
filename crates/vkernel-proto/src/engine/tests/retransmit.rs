//! Retransmission of exchanges: a first Send without a segment asks for
//! its answers at its source and is timed by its own thread; and when not
//! to retransmit (a needless copy raises the peer's floor, a request
//! queued behind older ones waits, one copy probes a stalled host).

use super::*;

#[test]
fn only_a_first_send_without_segment_asks_for_answers_at_its_source() {
    let mut n = Net::with(2, |i, c| c.reply_port = addr(i).port());
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let flags = |t: &Transmit| decode(&t.data).unwrap().header.flags;
    // Armed: the first transmission carries the flag, and the receiver
    // answers the socket it came from, while learning the main socket.
    n.e[1].set_answer_source(true);
    n.e[1]
        .send(n.now, c, s, Message::with_code(1), None)
        .unwrap();
    n.e[1].set_answer_source(false);
    let t = n.e[1].poll_transmit().expect("the RemoteSend");
    assert_eq!(flags(&t) & wire::F_ANSWER_SOURCE, wire::F_ANSWER_SOURCE);
    let own = SocketAddr::from(([127, 0, 0, 1], 40000));
    n.e[0].handle_datagram(n.now, own, &t.data);
    assert_eq!(n.e[0].location_of(HostId(2)), Some(addr(1)));
    assert_eq!(
        n.e[0].receive(n.now, s, None, None).unwrap().unwrap().from,
        c
    );
    n.e[0]
        .reply(n.now, s, c, Message::with_code(2), None)
        .unwrap();
    let r = n.e[0].poll_transmit().expect("the reply");
    assert_eq!(r.to, own, "answered at the source");
    n.e[1].handle_datagram(n.now, addr(0), &r.data);
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 2);
    // A retransmission never carries it, even while armed.
    n.e[1].set_answer_source(true);
    n.e[1]
        .send(n.now, c, s, Message::with_code(3), None)
        .unwrap();
    let first = n.e[1].poll_transmit().expect("the RemoteSend");
    assert_ne!(flags(&first) & wire::F_ANSWER_SOURCE, 0);
    let later = n.now + 1_000_000;
    n.e[1].handle_timeout(later);
    n.e[1].set_answer_source(false);
    let again = n.e[1].poll_transmit().expect("a retransmission");
    assert_eq!(flags(&again) & wire::F_ANSWER_SOURCE, 0);
    assert_ne!(flags(&again) & wire::F_RETRANSMIT, 0);
    n.e[1].cancel(c);
    while n.e[1].poll_transmit().is_some() {}
    // Nor does a Send with a segment (its bulk data goes by the main
    // socket), nor one made while not armed.
    let seg = SharedBuf::new(pattern(1, 100));
    n.e[1].set_answer_source(true);
    n.e[1]
        .send(n.now, c, s, seg_msg(4, SegAccess::READ), Some(seg.lend()))
        .unwrap();
    n.e[1].set_answer_source(false);
    let t = n.e[1].poll_transmit().expect("the RemoteSend");
    assert_eq!(flags(&t) & wire::F_ANSWER_SOURCE, 0);
    n.e[1].cancel(c);
    while n.e[1].poll_transmit().is_some() {}
    n.e[1]
        .send(n.now, c, s, Message::with_code(5), None)
        .unwrap();
    let t = n.e[1].poll_transmit().expect("the RemoteSend");
    assert_eq!(flags(&t) & wire::F_ANSWER_SOURCE, 0);
}

#[test]
fn a_peer_that_held_a_retransmitted_request_gets_longer_before_the_next() {
    // Twenty quick exchanges keep the round-trip estimate near 100 µs,
    // then one request is held 5 ms by its server. The first such hold
    // is retransmitted (2 ms minimum timeout) and answered with
    // replyPending; from then on the timeout stays above the holds.
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let mut per_round = Vec::new();
    for _ in 0..6 {
        let before = n.e[1].stats().retransmits;
        for i in 0..21 {
            n.e[1]
                .send(n.now, c, s, Message::with_code(1), None)
                .unwrap();
            n.run();
            n.advance(if i == 20 { 5_000 } else { 100 });
            let r = n.e[0].receive(n.now, s, None, None).unwrap();
            assert_eq!(r.map(|r| r.from), Some(c));
            n.e[0]
                .reply(n.now, s, c, Message::with_code(2), None)
                .unwrap();
            n.run();
            assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 2);
        }
        per_round.push(n.e[1].stats().retransmits - before);
    }
    assert!(per_round[0] > 0, "{per_round:?}");
    assert_eq!(per_round[3..], [0, 0, 0], "{per_round:?}");
}

#[test]
fn a_send_that_asked_for_answers_at_its_source_is_timed_by_its_own_thread() {
    let mut n = Net::with(2, |i, c| c.reply_port = addr(i).port());
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    // Not armed: the shared deadline covers the retransmission.
    n.e[1]
        .send(n.now, c, s, Message::with_code(1), None)
        .unwrap();
    assert_eq!(n.e[1].own_deadline(c), None);
    assert!(n.e[1].poll_timeout() < n.now + 1_000_000);
    n.e[1].cancel(c);
    while n.e[1].poll_transmit().is_some() {}
    n.e[1].handle_timeout(n.now);
    // Armed: the sender's thread times it; the engine's deadline leaves
    // it out, and a timer pass at the own deadline retransmits.
    n.e[1].set_answer_source(true);
    n.e[1]
        .send(n.now, c, s, Message::with_code(2), None)
        .unwrap();
    n.e[1].set_answer_source(false);
    let due = n.e[1].own_deadline(c).expect("timed by its thread").at;
    assert!(n.e[1].poll_timeout() > due, "no shared deadline for it");
    while n.e[1].poll_transmit().is_some() {}
    n.e[1].handle_timeout(due);
    let t = n.e[1].poll_transmit().expect("a retransmission");
    let h = decode(&t.data).unwrap().header;
    assert_eq!(h.ptype, PacketType::RemoteSend);
    assert_ne!(h.flags & wire::F_RETRANSMIT, 0);
    assert_eq!(n.e[1].stats().retransmits, 1);
    assert!(n.e[1].own_deadline(c).expect("still its own").at > due);
    assert!(n.e[1].poll_timeout() > due);
    // A deadline before the next retransmission is what the thread waits
    // for, to the microsecond; one after it changes nothing.
    let next = n.e[1].own_deadline(c).unwrap();
    assert!(!next.exact);
    n.e[1].set_send_deadline(c, next.at + 1);
    assert_eq!(n.e[1].own_deadline(c), Some(next));
    n.e[1].set_send_deadline(c, next.at - 1);
    let d = n.e[1].own_deadline(c).unwrap();
    assert_eq!((d.at, d.exact), (next.at - 1, true));
    n.e[1].handle_timeout(next.at - 1);
    assert_eq!(send_err(&mut n.e[1], c), IpcError::Deadline(s));
}

/// Host 0 serves `s`, host 1 sends from `cs`; twenty quick exchanges from
/// the first client bring the timeout to its 2 ms floor.
fn warmed_up(clients: usize) -> (Net, Pid, Vec<Pid>) {
    let mut n = Net::new(2);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let cs: Vec<Pid> = (0..clients)
        .map(|_| n.e[1].create_process().unwrap())
        .collect();
    for _ in 0..20 {
        send_one(&mut n, cs[0], s);
        n.advance(100);
        assert!(n.e[0].receive(n.now, s, None, None).unwrap().is_some());
        n.e[0]
            .reply(n.now, s, cs[0], Message::with_code(2), None)
            .unwrap();
        n.run();
        reply_of(&mut n.e[1], cs[0]);
    }
    (n, s, cs)
}

/// Host 1's `c` sends code 1 to `s`, and the network runs.
fn send_one(n: &mut Net, c: Pid, s: Pid) {
    n.e[1]
        .send(n.now, c, s, Message::with_code(1), None)
        .unwrap();
    n.run();
}

/// The server at host 0 takes its next request and replies to it.
fn serve_one(n: &mut Net, s: Pid) -> Pid {
    let from = n.e[0].receive(n.now, s, None, None).unwrap().unwrap().from;
    n.e[0]
        .reply(n.now, s, from, Message::with_code(2), None)
        .unwrap();
    n.run();
    from
}

/// Is `d` a RemoteSend flagged as a retransmission?
fn is_resend(d: &[u8]) -> bool {
    decode(d).is_ok_and(|p| {
        p.header.ptype == PacketType::RemoteSend && p.header.flags & wire::F_RETRANSMIT != 0
    })
}

#[test]
fn a_reply_to_the_first_copy_shows_its_retransmission_was_needless() {
    let (mut n, s, cs) = warmed_up(1);
    let c = cs[0];
    // The request waits at the server past the timeout; the copy is lost,
    // so the reply that comes is the first copy's (not flagged).
    n.filter = Some(Box::new(|_, _, d: &[u8]| !is_resend(d)));
    send_one(&mut n, c, s);
    n.advance(3_000);
    assert_eq!(n.e[1].stats().retransmits, 1);
    serve_one(&mut n, s);
    reply_of(&mut n.e[1], c);
    assert_eq!(n.e[1].stats().retransmits_needless, 1);
    // The peer is slow: the next requests may wait as long without a copy.
    for _ in 0..5 {
        send_one(&mut n, c, s);
        n.advance(3_000);
        serve_one(&mut n, s);
        reply_of(&mut n.e[1], c);
    }
    assert_eq!(n.e[1].stats().retransmits, 1, "no copy after it");
}

#[test]
fn a_reply_to_a_copy_is_flagged_and_does_not_raise_the_timeout() {
    for idempotent in [true, false] {
        let (mut n, s, cs) = warmed_up(1);
        let c = cs[0];
        let mut m = Message::with_code(1);
        m.set_flag(crate::message::IDEMPOTENT, idempotent);
        // First: the first copy is lost. Then: the reply is lost, and the
        // copy gets the saved reply (or the request runs again).
        for lose in [PacketType::RemoteSend, PacketType::RemoteReply] {
            let mut dropped = false;
            n.filter = Some(Box::new(move |_, _, d: &[u8]| {
                let first = decode(d).is_ok_and(|p| p.header.ptype == lose);
                let keep = dropped || !first;
                dropped |= first;
                keep
            }));
            n.e[1].send(n.now, c, s, m, None).unwrap();
            n.run();
            if lose == PacketType::RemoteReply {
                serve_one(&mut n, s);
            }
            n.advance(2_500);
            if n.e[0].receive(n.now, s, None, None).unwrap().is_some() {
                n.e[0]
                    .reply(n.now, s, c, Message::with_code(2), None)
                    .unwrap();
            }
            n.run();
            let r = n.last_of(PacketType::RemoteReply).unwrap();
            let h = decode(&r.data).unwrap().header;
            assert_ne!(h.flags & wire::F_RETRANSMIT, 0, "{lose:?} lost");
            reply_of(&mut n.e[1], c);
            assert_eq!(n.e[1].stats().retransmits_needless, 0, "{lose:?} lost");
        }
        assert_eq!(n.e[1].stats().retransmits, 2);
        // The timeout stayed at its floor: a 3 ms wait is retransmitted.
        n.filter = None;
        n.e[1].send(n.now, c, s, m, None).unwrap();
        n.run();
        n.advance(3_000);
        assert_eq!(n.e[1].stats().retransmits, 3, "idempotent: {idempotent}");
    }
}

#[test]
fn a_request_queued_behind_older_ones_is_not_retransmitted() {
    let (mut n, s, cs) = warmed_up(3);
    // c0 sends, then c1 500 µs later. The server answers c0 at 1.9 ms and
    // c1 at 3 ms: when c1's 2 ms timeout passes (2.5 ms) the server is
    // answering only Sends older than c1's, so c1 is queued, not lost.
    let t0 = n.now;
    send_one(&mut n, cs[0], s);
    n.advance(500);
    send_one(&mut n, cs[1], s);
    n.advance(t0 + 1_900 - n.now);
    assert_eq!(serve_one(&mut n, s), cs[0]);
    reply_of(&mut n.e[1], cs[0]);
    n.advance(t0 + 3_000 - n.now);
    assert_eq!(n.e[1].stats().retransmits, 0);
    assert_eq!(n.e[1].stats().retransmits_deferred, 1);
    assert_eq!(serve_one(&mut n, s), cs[1]);
    reply_of(&mut n.e[1], cs[1]);

    // The same, but c1's request is lost and c2 sends after it (by more
    // than a round trip): c2's answer shows the server is past c1's, so
    // c1 retransmits at once.
    let t0 = n.now;
    send_one(&mut n, cs[0], s);
    n.advance(200);
    n.drop_next = 1;
    send_one(&mut n, cs[1], s);
    n.advance(1_500);
    send_one(&mut n, cs[2], s);
    n.advance(t0 + 1_900 - n.now);
    assert_eq!(serve_one(&mut n, s), cs[0]);
    assert_eq!(serve_one(&mut n, s), cs[2]);
    reply_of(&mut n.e[1], cs[0]);
    reply_of(&mut n.e[1], cs[2]);
    let srtt = n.e[1].srtt(HostId(1)).unwrap();
    assert!(
        srtt < 1_400,
        "c2 went more than a round trip after c1: {srtt}"
    );
    // At c1's first timeout, not one later.
    let due = n.e[1]
        .outgoing(cs[1])
        .unwrap()
        .remote
        .as_ref()
        .unwrap()
        .next();
    let deferred = n.e[1].stats().retransmits_deferred;
    let mark = n.sent.len();
    n.advance(due - n.now);
    assert_eq!(n.e[1].stats().retransmits, 1);
    assert_eq!(n.e[1].stats().retransmits_deferred, deferred);
    assert!(n.sent[mark..].iter().any(|d| is_resend(&d.data)));
    assert_eq!(serve_one(&mut n, s), cs[1]);
    reply_of(&mut n.e[1], cs[1]);
}

/// The same when the late exchanges fall due in one timer pass (sent at
/// once, as many blocked threads' Sends are under load): the probe is
/// recorded only when it goes out, so the pass itself must hold the
/// others back.
#[test]
fn exchanges_late_in_the_same_timer_pass_send_one_probe() {
    let (mut n, s, cs) = warmed_up(4);
    let now = n.now;
    for &c in &cs {
        n.e[1].send(now, c, s, Message::with_code(1), None).unwrap();
    }
    n.run();
    n.advance(3_000);
    assert_eq!(n.e[1].stats().retransmits, 1, "one probe");
    assert!(n.e[1].stats().retransmits_deferred >= 3);
    for _ in &cs {
        let c = serve_one(&mut n, s);
        reply_of(&mut n.e[1], c);
    }
    assert_eq!(n.e[1].stats().retransmits, 1);
}

#[test]
fn when_a_stalled_server_makes_every_exchange_late_one_copy_probes() {
    let (mut n, s, cs) = warmed_up(3);
    // Three requests 100 µs apart; the server stalls (its replies come
    // only at 4 ms). The first to expire is sent again; the others wait
    // for that copy's answer, and then for the needless one's window.
    for &c in &cs {
        send_one(&mut n, c, s);
        n.advance(100);
    }
    n.advance(3_000);
    assert_eq!(n.e[1].stats().retransmits, 1, "one probe");
    assert!(n.e[1].stats().retransmits_deferred >= 2);
    for &c in &cs {
        assert_eq!(serve_one(&mut n, s), c);
        reply_of(&mut n.e[1], c);
    }
    assert_eq!(n.e[1].stats().retransmits, 1);
    // The probe's answer came: the server had the first copy.
    assert_eq!(n.e[1].stats().retransmits_needless, 1);
}
