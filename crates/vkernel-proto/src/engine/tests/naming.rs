//! Host-id allocation (announcement–complaint) and GetPid.

use super::*;

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
