//! Process groups on lossy and reordering networks.

use super::*;

/// Serves every member that has a message: records (sender, tag) and
/// replies with the tag and its pid, then receives again.
pub(super) fn serve_members(
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
