//! One set of sender's rules: the engine's remote Send and a
//! [`DirectSend`] run outside it, given the same answers at the same
//! times, retransmit at the same times, count the same needless copies
//! and leave the same knowledge of the peer. (On 7c8c577 they differed in
//! busy replyPending, `Rtt::held`, needless counts and replyPending's
//! peer updates: ISSUE 49's divergences 1, 2, 3 and 5.)

use super::*;
use crate::direct::{DirectSend, Outcome, Timer, Timing};
use crate::wire::{Header, Status};

/// An answer from the server's host, at a time.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// replyPending (busy: dropped for lack of buffers).
    Pending { busy: bool },
    /// Nothing this step.
    Silence,
}

fn answer(ptype: PacketType, src: Pid, dst: Pid, seq: u32, flags: u8, status: Status) -> Vec<u8> {
    let mut h = Header::new(ptype);
    h.src = src;
    h.dst = dst;
    h.seq = seq;
    h.flags = flags;
    h.status = status;
    encode(&h, &Message::with_code(7), &[])
}

/// The engine's RemoteSends to `dst` since `mark`, and whether each was a copy.
fn sends_since(n: &Net, mark: usize) -> Vec<bool> {
    n.sent[mark..]
        .iter()
        .filter(|s| s.ptype() == PacketType::RemoteSend)
        .map(|s| decode(&s.data).unwrap().header.flags & wire::F_RETRANSMIT != 0)
        .collect()
}

/// Runs `script` (a step of `dt` µs, then the answer) and a final reply
/// (`to_first`: not flagged a copy) against both, comparing as it goes.
fn twin(script: &[(Micros, Answer)], to_first: bool, warm: &[Micros]) {
    let mut n = Net::new(2);
    // The server's host never sees the requests: the test answers.
    n.filter = Some(Box::new(|_, _, _| false));
    let server = n.e[1].create_process().unwrap();
    let client = n.e[0].create_process().unwrap();
    let host = server.host();
    // Some history of the peer (samples), the same for both.
    for &s in warm {
        n.e[0].rtt.with(host, crate::rtt::Rtt::new, |r| r.sample(s));
    }
    let t0 = n.now;
    let mut peer = n.e[0].rtt_of(t0, host);
    let timing = Timing::new(n.e[0].config(), &peer, t0);
    let mark = n.sent.len();
    n.e[0]
        .send(t0, client, server, Message::with_code(1), None)
        .unwrap();
    n.run();
    let seq = n.e[0].outgoing(client).unwrap().seq;
    let mut d = DirectSend::start(
        t0,
        client,
        server,
        Message::with_code(1),
        seq,
        0,
        client,
        1,
        timing,
    );
    let mut direct_copies = 0;
    let mut now = t0;
    for (i, &(dt, a)) in script.iter().enumerate() {
        // Time passes: both run their timers at every instant the engine does.
        let end = now + dt;
        loop {
            let t = n.e[0].poll_timeout().min(d.next_timer());
            if t > end {
                break;
            }
            now = t.max(now);
            n.now = now;
            if now >= n.e[0].poll_timeout() {
                n.e[0].handle_timeout(now);
                n.run();
            }
            if now >= d.next_timer() {
                match d.on_timer(now, &mut peer) {
                    Timer::Retransmit => direct_copies += 1,
                    Timer::Dead(_) => return,
                    Timer::Idle | Timer::Deferred => {}
                }
            }
            if completed(&n.e[0], client) {
                return; // timed out on both (checked below)
            }
        }
        now = end;
        n.now = now;
        let copies = sends_since(&n, mark).iter().filter(|c| **c).count();
        assert_eq!(
            copies, direct_copies,
            "copies sent by step {i} ({script:?})"
        );
        if let Answer::Pending { busy } = a {
            let status = if busy { Status::Busy } else { Status::Ok };
            let b = answer(PacketType::ReplyPending, server, client, seq, 0, status);
            n.e[0].handle_datagram(now, addr(1), &b);
            assert_eq!(d.on_datagram(now, &b, &mut peer), Outcome::Pending);
            let r = n.e[0].outgoing(client).unwrap().remote.unwrap();
            let key = |r: &crate::sender::Retx| (r.next(), r.rto(), r.deadline(), r.copies());
            assert_eq!(key(&r), key(d.retx()), "after step {i} ({script:?})");
        }
        assert_eq!(
            format!("{:?}", n.e[0].rtt_of(now, host)),
            format!("{peer:?}"),
            "the peer as known after step {i} ({script:?})"
        );
    }
    let flags = if to_first { 0 } else { wire::F_RETRANSMIT };
    let b = answer(
        PacketType::RemoteReply,
        server,
        client,
        seq,
        flags,
        Status::Ok,
    );
    let needless = n.e[0].stats().retransmits_needless;
    n.e[0].handle_datagram(now, addr(1), &b);
    let Outcome::Replied(_, a) = d.on_datagram(now, &b, &mut peer) else {
        panic!("the direct Send took no reply");
    };
    assert!(completed(&n.e[0], client));
    assert_eq!(
        n.e[0].stats().retransmits_needless - needless,
        u64::from(a.needless_copies),
        "needless copies counted alike"
    );
    assert_eq!(
        format!("{:?}", n.e[0].rtt_of(now, host)),
        format!("{peer:?}"),
        "the peer as known after the reply ({script:?})"
    );
}

#[test]
fn a_busy_reply_pending_after_a_copy_is_handled_alike() {
    // Divergence 1: busy replyPending raised the direct Send's timeout.
    twin(
        &[
            (15_000, Answer::Pending { busy: true }),
            (50_000, Answer::Silence),
        ],
        false,
        &[2_000, 3_000],
    );
}

#[test]
fn a_held_request_raises_the_floor_alike() {
    // Divergence 2 and 5: the first non-busy replyPending is `Rtt::held`
    // and tells the peer it was heard, on every path.
    twin(
        &[
            (40_000, Answer::Pending { busy: false }),
            (30_000, Answer::Silence),
        ],
        true,
        &[1_000],
    );
}

#[test]
fn needless_copies_are_counted_alike() {
    // Divergence 3: each needless copy is counted, not one per exchange.
    twin(&[(400_000, Answer::Silence)], true, &[500]);
}

fn step() -> impl Strategy<Value = (Micros, Answer)> {
    (
        1u64..150_000,
        prop_oneof![
            Just(Answer::Silence),
            Just(Answer::Pending { busy: true }),
            Just(Answer::Pending { busy: false })
        ],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn the_engine_and_a_direct_send_follow_one_set_of_rules(
        script in proptest::collection::vec(step(), 0..8),
        to_first in any::<bool>(),
        warm in proptest::collection::vec(100u64..50_000, 0..4),
    ) {
        twin(&script, to_first, &warm);
    }
}
