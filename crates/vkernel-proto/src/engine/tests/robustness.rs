//! Arbitrary, mutated and forged datagrams never panic and are counted.

use super::*;

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
