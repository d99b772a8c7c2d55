//! Retransmission, host timeouts, replyPending and Send deadlines.

use super::*;

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
fn a_shut_down_host_answers_nothing_and_its_clients_time_out() {
    // A server process still running when its host shuts down must not
    // answer for the dead host: its client sees the host go (Timeout),
    // not a reply, a replyPending or a "no such process".
    let mut n = Net::with(2, |_, c| c.host_timeout = 1_000_000);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let c2 = n.e[1].create_process().unwrap();
    n.e[1]
        .send(n.now, c, s, Message::with_code(1), None)
        .unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.e[0].shutdown();
    let mark = n.sent.len();
    let now = n.now;
    let _ = n.e[0].reply(now, s, c, Message::with_code(2), None);
    let ghost = Pid::new(HostId(1), 0x4242);
    n.e[1].send(now, c2, ghost, Message::zero(), None).unwrap();
    let t0 = n.now;
    let done = n.advance_until(5_000_000, |n| {
        completed(&n.e[1], c) && completed(&n.e[1], c2)
    });
    assert!(done);
    assert_eq!(send_err(&mut n.e[1], c), IpcError::Timeout(s));
    assert_eq!(send_err(&mut n.e[1], c2), IpcError::Timeout(ghost));
    assert!(n.now - t0 >= 1_000_000, "timed out after {} µs", n.now - t0);
    let from_dead: Vec<_> = n.sent[mark..].iter().filter(|d| d.to == 1).collect();
    assert_eq!(
        from_dead.len(),
        0,
        "the dead host sent {} datagrams",
        from_dead.len()
    );
    assert!(
        n.sent[mark..].iter().any(|d| d.to == 0),
        "the clients retransmitted"
    );
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

/// One exchange from `c` (host 2) to `s` (host 1) whose server holds the
/// request `hold` µs before replying; returns the client's retransmissions.
fn held_exchange(n: &mut Net, c: Pid, s: Pid, hold: Micros) -> u64 {
    let before = n.e[1].stats().retransmits;
    n.e[1]
        .send(n.now, c, s, Message::with_code(1), None)
        .unwrap();
    n.run();
    n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
    n.advance(hold);
    n.e[0]
        .reply(n.now, s, c, Message::with_code(2), None)
        .unwrap();
    n.run();
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 2);
    n.e[1].stats().retransmits - before
}

/// One exchange from `c` (host 2) to `s` (host 1) whose first request
/// is lost: the retransmission gets through and is answered.
fn lost_request_exchange(n: &mut Net, c: Pid, s: Pid) {
    n.drop_next = 1;
    n.e[1]
        .send(n.now, c, s, Message::with_code(1), None)
        .unwrap();
    n.run();
    assert!(n.e[0].receive(n.now, s, None, None).unwrap().is_none());
    assert!(n.advance_until(1_000_000, |n| completed(&n.e[0], s)));
    assert_eq!(received(&mut n.e[0], s).msg.code(), 1);
    n.e[0]
        .reply(n.now, s, c, Message::with_code(2), None)
        .unwrap();
    n.run();
    assert_eq!(reply_of(&mut n.e[1], c).msg.code(), 2);
}

/// Two hosts (host timeout 10 s), a server `s` on host 1 and a client
/// `c` on host 2 that made 20 quick exchanges: its timeout is the
/// minimum. Returns (net, client, server).
fn taught_a_short_timeout() -> (Net, Pid, Pid) {
    let mut n = Net::with(2, |_, c| c.host_timeout = 10_000_000);
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    for _ in 0..20 {
        held_exchange(&mut n, c, s, 0);
    }
    (n, c, s)
}

#[test]
fn a_busy_server_stops_drawing_needless_copies() {
    // A server host that holds each request 10 ms (a queue behind other
    // clients) on a clean network: the first exchange draws copies, which
    // it answers with replyPending, so its time from the first copy is a
    // sample; from then on the client's timeout stays above the time the
    // host holds requests, and no copy is sent.
    let (mut n, c, s) = taught_a_short_timeout();
    let first = held_exchange(&mut n, c, s, 10_000);
    assert!(first >= 1, "the fast exchanges taught a short timeout");
    let later: u64 = (0..30).map(|_| held_exchange(&mut n, c, s, 10_000)).sum();
    assert_eq!(later, 0, "copies sent to a host known to hold requests");
    // Quick answers bring the timeout back down: a held request draws
    // copies again (a host that stopped being busy is not waited on).
    for _ in 0..40 {
        held_exchange(&mut n, c, s, 0);
    }
    assert!(held_exchange(&mut n, c, s, 10_000) >= 1);
}

#[test]
fn a_needless_copy_keeps_the_timeout_up_for_seconds_and_a_loss_halves_it() {
    // The server's machine stalls now and then (busy-polling clients take
    // its CPUs): between stalls a busy client makes tens of thousands of
    // quick exchanges a second. Those do not wear down the floor that the
    // first stall's needless copy raised, so the next stall draws none.
    let (mut n, c, s) = taught_a_short_timeout();
    let host = s.host();
    let base = n.e[1].send_rto_for(n.now, host);
    assert!(held_exchange(&mut n, c, s, 10_000) >= 1);
    let t0 = n.now;
    for _ in 0..20_000 {
        held_exchange(&mut n, c, s, 0);
    }
    assert!(n.now - t0 < 1_000_000, "quick: {} µs", n.now - t0);
    let kept = n.e[1].send_rto_for(n.now, host);
    assert!(kept > base + base / 2, "{kept} µs against {base}");
    assert_eq!(held_exchange(&mut n, c, s, kept - 200), 0);
    // A lost request: the copy is answered as a retransmission (needed),
    // and the floor halves.
    // (Quick exchanges first, so that the held one's sample is not what
    // sets the timeout.)
    for _ in 0..200 {
        held_exchange(&mut n, c, s, 0);
    }
    let before = n.e[1].send_rto_for(n.now, host);
    assert!(before > base + base / 2, "{before} µs against {base}");
    lost_request_exchange(&mut n, c, s);
    let after = n.e[1].send_rto_for(n.now, host);
    assert!(
        after <= (before / 2 + 100).max(base),
        "{after} µs after a loss, {before} before"
    );
    // And time brings it down to the round trip's own.
    n.advance(60_000_000);
    assert_eq!(n.e[1].send_rto_for(n.now, host), base);
}

#[test]
fn a_peer_on_this_machine_starts_with_a_floor_that_a_loss_halves() {
    // Two hosts at loopback addresses, as hosts of one machine are: a
    // server held up a few ms (a scheduler's delay) draws no copy, even
    // from a client that has taught itself a short timeout.
    let mut n = Net::with(2, |_, c| {
        c.host_timeout = 10_000_000;
        c.local_send_floor = 10_000;
    });
    n.introduce();
    let s = n.e[0].create_process().unwrap();
    let c = n.e[1].create_process().unwrap();
    let host = s.host();
    for _ in 0..20 {
        held_exchange(&mut n, c, s, 0);
    }
    let rto = n.e[1].send_rto_for(n.now, host);
    assert!((9_900..=10_000).contains(&rto), "{rto} µs");
    assert_eq!(held_exchange(&mut n, c, s, 5_000), 0, "no needless copy");
    // A lost request: the copy that got through halves the floor.
    for _ in 0..200 {
        held_exchange(&mut n, c, s, 0);
    }
    lost_request_exchange(&mut n, c, s);
    let after = n.e[1].send_rto_for(n.now, host);
    assert!((4_000..=5_000).contains(&after), "{after} µs after a loss");
    // Without the setting, the same hold draws a copy.
    let mut m = Net::new(2);
    m.introduce();
    let s = m.e[0].create_process().unwrap();
    let c = m.e[1].create_process().unwrap();
    for _ in 0..20 {
        held_exchange(&mut m, c, s, 0);
    }
    assert!(held_exchange(&mut m, c, s, 5_000) >= 1);
}
