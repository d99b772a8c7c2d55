//! Process groups over real UDP between logical hosts on loopback (the
//! unicast fan-out path): each reply mode, late-reply discard, membership
//! changes while sends are in flight, a member host crashing, the
//! membership policy, and loss.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use vkernel::{
    FaultConfig, GroupMode, GroupPolicy, IpcError, Kernel, KernelConfig, Message, Pid, Process,
    Segment,
};

const QUERY: u32 = 0x10;
const STOP: u32 = 0x11;

/// `n` logical hosts on loopback, each knowing all the others.
fn hosts(n: usize, policy: impl Fn(usize) -> GroupPolicy, faults: FaultConfig) -> Vec<Kernel> {
    let mut ks: Vec<Kernel> = Vec::new();
    for i in 0..n {
        let k = Kernel::start(KernelConfig {
            peers: ks.iter().map(|k| k.local_addr()).collect(),
            group_policy: policy(i),
            faults: FaultConfig {
                seed: faults.seed.wrapping_add(i as u64),
                ..faults.clone()
            },
            host_timeout: Duration::from_secs(2),
            ..Default::default()
        })
        .expect("start host");
        for o in &ks {
            o.add_peer(k.local_addr());
        }
        ks.push(k);
    }
    ks
}

/// A group member: answers every group query with its pid in word 1 (after
/// `delay`), counts what it received, and stops on a one-to-one STOP.
struct Member {
    pid: Pid,
    received: Arc<AtomicU32>,
    handle: JoinHandle<()>,
}

fn member(k: &Kernel, delay: Duration) -> Member {
    member_with(k, move || thread::sleep(delay))
}

/// A member that calls `before` ahead of answering each query.
fn member_with(k: &Kernel, before: impl Fn() + Send + 'static) -> Member {
    let received = Arc::new(AtomicU32::new(0));
    let r2 = received.clone();
    let (pid, handle) = k
        .spawn("member", move |p: Process| {
            let mut m = Message::zero();
            let mut buf = vec![0u8; 4096];
            while let Ok(i) = p.receive_with_segment(&mut m, &mut buf) {
                if m.code() == STOP {
                    let _ = p.reply(&m, i.from);
                    return;
                }
                before();
                r2.fetch_add(1, Ordering::SeqCst);
                m.0[1] = p.pid().0;
                m.0[2] = i.seg_bytes as u32;
                m.0[3] = buf[..i.seg_bytes]
                    .iter()
                    .map(|&b| b as u32)
                    .fold(0, u32::wrapping_add);
                if m.0[4] == 1 {
                    let _ = p.reply_with_segment(&m, i.from, 0, &[0xabu8; 100]);
                } else {
                    let _ = p.reply(&m, i.from);
                }
            }
        })
        .expect("spawn member");
    Member {
        pid,
        received,
        handle,
    }
}

fn stop(via: &Process, ms: Vec<Member>) {
    for m in ms {
        let mut s = Message::with_code(STOP);
        via.send(&mut s, m.pid).expect("stop member");
        m.handle.join().expect("member thread");
    }
}

/// Gathers queued replies until `want` distinct repliers (counting the
/// first) or `limit` passes.
fn gather(p: &Process, first: Pid, want: usize, limit: Duration) -> HashSet<Pid> {
    let mut seen = HashSet::from([first]);
    let t = Instant::now();
    let mut m = Message::zero();
    while seen.len() < want && t.elapsed() < limit {
        match p.get_reply(&mut m) {
            Some(from) => {
                assert_eq!(Pid(m.0[1]), from, "reply carries the replier's pid");
                assert!(seen.insert(from), "duplicate reply from {from}");
            }
            None => thread::sleep(Duration::from_millis(1)),
        }
    }
    seen
}

fn query(mode: GroupMode) -> Message {
    let mut m = Message::with_code(QUERY);
    m.set_group_mode(mode);
    m
}

#[test]
fn one_reply_returns_first_and_discards_the_rest() {
    let ks = hosts(3, |_| GroupPolicy::default(), FaultConfig::default());
    let a0 = member(&ks[0], Duration::ZERO);
    let b0 = member(&ks[1], Duration::ZERO);
    let b1 = member(&ks[1], Duration::ZERO);
    let client = ks[2].create_process().unwrap();
    // AllocateGroupId on one host; joins for remote processes go to their
    // hosts' kernel servers.
    let owner = ks[0].create_process().unwrap();
    let g = owner.allocate_group_id().unwrap();
    assert!(g.is_group() && !g.is_well_known_group());
    owner.leave_group(g, owner.pid()).unwrap();
    for m in [&a0, &b0, &b1] {
        client.join_group(g, m.pid).unwrap();
    }
    let pids: HashSet<Pid> = [a0.pid, b0.pid, b1.pid].into();
    for round in 0..20 {
        let mut m = query(GroupMode::One);
        let r = client.send(&mut m, g).unwrap();
        assert!(
            pids.contains(&r.from),
            "round {round}: reply from {}",
            r.from
        );
        assert_eq!(Pid(m.0[1]), r.from);
    }
    // Later replies of 1-reply sends are never queued.
    thread::sleep(Duration::from_millis(50));
    assert!(client.get_reply(&mut Message::zero()).is_none());
    for m in [&a0, &b0, &b1] {
        // Members run on their own threads: on a loaded machine the last
        // copy may still be on its way to a member when the sender is done.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while m.received.load(Ordering::SeqCst) < 20 && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            m.received.load(Ordering::SeqCst),
            20,
            "every member got every send"
        );
    }
    let late: u64 = ks
        .iter()
        .map(|k| k.stats().drops_of(vkernel::DropReason::LateReply))
        .sum();
    assert_eq!(late, 40, "two discarded replies per send");
    stop(&client, vec![a0, b0, b1]);
}

#[test]
fn multi_reply_queues_later_replies_until_next_send() {
    let ks = hosts(3, |_| GroupPolicy::default(), FaultConfig::default());
    let ms: Vec<Member> = (0..4).map(|i| member(&ks[i % 2], Duration::ZERO)).collect();
    let client = ks[2].create_process().unwrap();
    let g = Pid::well_known_group(0x77);
    for m in &ms {
        client.join_group(g, m.pid).unwrap();
    }
    let all: HashSet<Pid> = ms.iter().map(|m| m.pid).collect();
    for _ in 0..10 {
        let mut m = query(GroupMode::Many);
        let r = client.send(&mut m, g).unwrap();
        let got = gather(&client, r.from, 4, Duration::from_secs(2));
        assert_eq!(got, all, "one reply from every member");
    }
    stop(&client, ms);
}

#[test]
fn zero_reply_notifies_without_blocking_or_reply_traffic() {
    let ks = hosts(2, |_| GroupPolicy::default(), FaultConfig::default());
    // The second member handles nothing until the gate opens: the sends
    // below finish while it holds every message, so they did not wait.
    let (open, gate) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    let ms = vec![
        member(&ks[0], Duration::ZERO),
        member_with(&ks[1], move || {
            let _ = gate.lock().map(|g| g.recv());
        }),
    ];
    let client = ks[1].create_process().unwrap();
    let g = Pid::well_known_group(0x78);
    for m in &ms {
        client.join_group(g, m.pid).unwrap();
    }
    let replies_before = ks[0].stats().tx_of(vkernel_proto_type());
    for i in 0..5 {
        let mut m = query(GroupMode::NoReply);
        m.0[5] = i;
        let r = client.send(&mut m, g).unwrap();
        assert_eq!(r.from, g, "a 0-reply send returns the group id");
        assert_eq!(m.0[5], i, "and leaves the message as it was");
    }
    assert_eq!(ms[1].received.load(Ordering::SeqCst), 0, "gate held");
    for _ in 0..5 {
        open.send(()).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while ms.iter().any(|m| m.received.load(Ordering::SeqCst) < 5) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    for m in &ms {
        assert_eq!(m.received.load(Ordering::SeqCst), 5);
    }
    assert_eq!(
        ks[0].stats().tx_of(vkernel_proto_type()),
        replies_before,
        "members' replies to 0-reply sends cause no traffic"
    );
    stop(&client, ms);
}

fn vkernel_proto_type() -> vkernel_proto::wire::PacketType {
    vkernel_proto::wire::PacketType::RemoteReply
}

#[test]
fn late_replies_are_discarded_after_the_next_send() {
    let ks = hosts(2, |_| GroupPolicy::default(), FaultConfig::default());
    let fast = member(&ks[0], Duration::ZERO);
    let slow = member(&ks[0], Duration::from_millis(300));
    let client = ks[1].create_process().unwrap();
    let g = Pid::well_known_group(0x79);
    client.join_group(g, fast.pid).unwrap();
    client.join_group(g, slow.pid).unwrap();
    let mut m = query(GroupMode::Many);
    let r = client.send(&mut m, g).unwrap();
    assert_eq!(r.from, fast.pid);
    // A new Send (one-to-one) before the slow reply arrives.
    let other = member(&ks[1], Duration::ZERO);
    let mut m2 = Message::with_code(QUERY);
    client.send(&mut m2, other.pid).unwrap();
    thread::sleep(Duration::from_millis(500));
    assert!(
        client.get_reply(&mut Message::zero()).is_none(),
        "the slow member's reply belongs to the previous send"
    );
    assert!(ks[1].stats().drops_of(vkernel::DropReason::LateReply) >= 1);
    stop(&client, vec![fast, slow, other]);
}

#[test]
fn members_join_and_leave_while_sends_are_in_flight() {
    let ks = hosts(3, |_| GroupPolicy::default(), FaultConfig::default());
    let g = Pid::well_known_group(0x7a);
    let ms: Vec<Member> = (0..4).map(|i| member(&ks[i % 2], Duration::ZERO)).collect();
    let pids: Vec<Pid> = ms.iter().map(|m| m.pid).collect();
    let admin = ks[2].create_process().unwrap();
    admin.join_group(g, pids[0]).unwrap();
    let k2 = &ks[2];
    let (ok, failed) = thread::scope(|s| {
        let sender = s.spawn(|| {
            let c = k2.create_process().unwrap();
            let (mut ok, mut failed) = (0, 0);
            for _ in 0..200 {
                let mut m = query(GroupMode::Many);
                match c.send(&mut m, g) {
                    Ok(r) => {
                        assert!(pids.contains(&r.from));
                        ok += 1;
                    }
                    Err(IpcError::Timeout(p)) => {
                        assert_eq!(p, g);
                        failed += 1;
                    }
                    Err(e) => panic!("group send: {e}"),
                }
            }
            (ok, failed)
        });
        for round in 0..40 {
            let p = pids[1 + round % 3];
            if round % 2 == 0 {
                admin.join_group(g, p).unwrap();
            } else {
                admin.leave_group(g, p).unwrap();
            }
            thread::sleep(Duration::from_millis(2));
        }
        sender.join().unwrap()
    });
    // pids[0] stayed a member throughout: every send got a reply.
    assert_eq!((ok, failed), (200, 0));
    stop(&admin, ms);
}

#[test]
fn multi_reply_completes_when_a_member_host_crashes() {
    let mut ks = hosts(3, |_| GroupPolicy::default(), FaultConfig::default());
    let g = Pid::well_known_group(0x7b);
    let survivor = member(&ks[0], Duration::from_millis(30));
    let doomed_host = ks.remove(1);
    let doomed = member(&doomed_host, Duration::ZERO);
    let client = ks[1].create_process().unwrap();
    client.join_group(g, survivor.pid).unwrap();
    client.join_group(g, doomed.pid).unwrap();
    let mut m = query(GroupMode::Many);
    let r = client.send(&mut m, g).unwrap();
    let got = gather(&client, r.from, 2, Duration::from_secs(1));
    assert_eq!(got.len(), 2);
    // The member host dies; the query still completes with the replies
    // that arrive.
    drop(doomed_host);
    let _ = doomed.handle.join();
    let mut m = query(GroupMode::Many);
    let r = client.send(&mut m, g).unwrap();
    // The survivor's reply ends the Send; the dead host is not waited for.
    assert_eq!(r.from, survivor.pid);
    assert!(client.get_reply(&mut Message::zero()).is_none());
    stop(&client, vec![survivor]);
}

#[test]
fn membership_policy_refuses_untrusted_hosts() {
    // Host 0 trusts no other host with its groups.
    let ks = hosts(
        3,
        |i| {
            if i == 0 {
                GroupPolicy {
                    trusted_hosts: Some(vec![]),
                    refuse_remote_joins: false,
                }
            } else {
                GroupPolicy::default()
            }
        },
        FaultConfig::default(),
    );
    let m0 = member(&ks[0], Duration::ZERO);
    let g = Pid::well_known_group(0x7c);
    let outsider = ks[2].create_process().unwrap();
    assert_eq!(
        outsider.join_group(g, m0.pid),
        Err(IpcError::AccessDenied(g)),
        "a remote join from an untrusted host is refused"
    );
    // A local join is the host's own business.
    let local = ks[0].create_process().unwrap();
    local.join_group(g, m0.pid).unwrap();
    // Group messages from untrusted hosts are dropped: no member answers.
    let mut m = query(GroupMode::One);
    assert_eq!(outsider.send(&mut m, g), Err(IpcError::Timeout(g)));
    assert_eq!(m0.received.load(Ordering::SeqCst), 0);
    assert!(ks[0].stats().drops_of(vkernel::DropReason::Untrusted) >= 1);
    // A local sender still reaches the member.
    let mut m = query(GroupMode::One);
    assert_eq!(local.send(&mut m, g).unwrap().from, m0.pid);
    stop(&local, vec![m0]);
}

#[test]
fn a_policy_naming_trusted_hosts_admits_them() {
    // Fixed host ids so the policy can name them before they start.
    let mk = |id: u16, peers: Vec<std::net::SocketAddr>, trusted: Option<Vec<u16>>| {
        Kernel::start(KernelConfig {
            host_id: Some(id),
            peers,
            group_policy: GroupPolicy {
                trusted_hosts: trusted.map(|v| v.into_iter().map(vkernel::HostId).collect()),
                refuse_remote_joins: false,
            },
            host_timeout: Duration::from_secs(1),
            ..Default::default()
        })
        .expect("start")
    };
    let a = mk(0x2101, vec![], Some(vec![0x2102]));
    let b = mk(0x2102, vec![a.local_addr()], None);
    let c = mk(0x2103, vec![a.local_addr()], None);
    a.add_peer(b.local_addr());
    a.add_peer(c.local_addr());
    let m0 = member(&a, Duration::ZERO);
    let g = Pid::well_known_group(0x7d);
    let pb = b.create_process().unwrap();
    let pc = c.create_process().unwrap();
    pb.join_group(g, m0.pid).unwrap();
    assert_eq!(pc.join_group(g, m0.pid), Err(IpcError::AccessDenied(g)));
    let mut m = query(GroupMode::One);
    assert_eq!(pb.send(&mut m, g).unwrap().from, m0.pid);
    let mut m = query(GroupMode::One);
    assert_eq!(pc.send(&mut m, g), Err(IpcError::Timeout(g)));
    stop(&pb, vec![m0]);
}

#[test]
fn one_reply_with_no_members_times_out() {
    let ks = hosts(2, |_| GroupPolicy::default(), FaultConfig::default());
    let c = ks[0].create_process().unwrap();
    let g = Pid::well_known_group(0x7e);
    let t = Instant::now();
    let mut m = query(GroupMode::One);
    assert_eq!(c.send(&mut m, g), Err(IpcError::Timeout(g)));
    assert!(t.elapsed() >= Duration::from_millis(1900));
    // Bad uses get typed errors.
    assert_eq!(
        c.join_group(Pid(5), c.pid()),
        Err(IpcError::InvalidPid(Pid(5)))
    );
    assert_eq!(
        c.join_group(g, Pid::NONE),
        Err(IpcError::InvalidPid(Pid::NONE))
    );
    let mut bad = Message::with_code(QUERY);
    bad.0[0] |= vkernel::message::GROUP_MODE_MASK;
    assert!(c.send(&mut bad, g).is_err(), "reserved reply mode");
}

#[test]
fn segments_are_read_by_all_and_written_by_the_first_replier() {
    let ks = hosts(2, |_| GroupPolicy::default(), FaultConfig::default());
    let ms = vec![
        member(&ks[0], Duration::ZERO),
        member(&ks[1], Duration::ZERO),
    ];
    let client = ks[1].create_process().unwrap();
    let g = Pid::well_known_group(0x7f);
    for m in &ms {
        client.join_group(g, m.pid).unwrap();
    }
    let page: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let sum = page.iter().map(|&b| b as u32).fold(0, u32::wrapping_add);
    let mut m = query(GroupMode::Many);
    let r = client
        .send_with_segment(&mut m, g, Segment::Read(&page))
        .unwrap();
    assert_eq!((m.0[2], m.0[3]), (1000, sum), "first replier read the page");
    let got = gather(&client, r.from, 2, Duration::from_secs(1));
    assert_eq!(got.len(), 2);
    // Write access: only the first reply's data lands.
    let mut buf = vec![0u8; 100];
    let mut m = query(GroupMode::Many);
    m.0[4] = 1;
    let r = client
        .send_with_segment(&mut m, g, Segment::Write(&mut buf))
        .unwrap();
    assert_eq!(r.seg_bytes, 100);
    assert!(buf.iter().all(|&b| b == 0xab));
    stop(&client, ms);
}

#[test]
fn lossy_network_each_member_sees_each_send_once() {
    let faults = FaultConfig {
        loss: 0.2,
        duplicate: 0.1,
        seed: 42,
        ..Default::default()
    };
    let ks = hosts(3, |_| GroupPolicy::default(), faults);
    let ms: Vec<Member> = (0..4).map(|i| member(&ks[i % 2], Duration::ZERO)).collect();
    let client = ks[2].create_process().unwrap();
    let g = Pid::well_known_group(0x80);
    for m in &ms {
        // Joins are ordinary exchanges with retransmission.
        client.join_group(g, m.pid).unwrap();
    }
    let n = 50;
    for _ in 0..n {
        let mut m = query(GroupMode::One);
        client.send(&mut m, g).unwrap();
    }
    thread::sleep(Duration::from_millis(100));
    for m in &ms {
        let r = m.received.load(Ordering::SeqCst);
        // Lost multicast copies are not retried once a reply came, but no
        // member ever sees a send twice.
        assert!(r <= n, "member saw {r} > {n} deliveries");
    }
    let total: u32 = ms.iter().map(|m| m.received.load(Ordering::SeqCst)).sum();
    assert!(total >= n, "every send reached at least one member");
    assert!(ks.iter().map(|k| k.stats().duplicates).sum::<u64>() > 0);
    stop(&client, ms);
}

#[test]
fn host_selection_queries_every_kernel_server() {
    let ks = hosts(3, |_| GroupPolicy::default(), FaultConfig::default());
    let p = ks[0].create_process().unwrap();
    // Never idle: gather every host's answer.
    let all = p
        .select_hosts(10, Duration::from_millis(500), f64::NEG_INFINITY)
        .unwrap();
    let got: HashSet<Pid> = all.iter().map(|h| h.kernel_server).collect();
    let want: HashSet<Pid> = ks.iter().map(|k| k.kernel_server()).collect();
    assert_eq!(got, want, "one answer per logical host, its own included");
    assert!(all.iter().all(|h| h.cpus >= 1 && h.processes >= 1));
    assert!(all.windows(2).all(|w| w[0].load <= w[1].load));
    // The first idle host ends the query at once.
    let first = p
        .select_hosts(10, Duration::from_millis(500), f64::INFINITY)
        .unwrap();
    assert_eq!(first.len(), 1);
    // Remote GetPid travels on the same transport and still works.
    let s = member(&ks[2], Duration::ZERO);
    p.set_pid(0x1234, Pid::NONE, vkernel::Scope::Any);
    let reg = ks[2].create_process().unwrap();
    reg.set_pid(0x1234, s.pid, vkernel::Scope::Any);
    assert_eq!(p.get_pid(0x1234, vkernel::Scope::Remote).unwrap(), s.pid);
    assert_eq!(
        p.get_pid(0x4321, vkernel::Scope::Remote).unwrap(),
        Pid::NONE
    );
    stop(&p, vec![s]);
}
