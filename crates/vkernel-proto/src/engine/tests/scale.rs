//! A thousand logical hosts on one simulated LAN (every datagram 100–300 µs
//! in flight, in time order; a seeded generator draws the delays): host
//! ids allocated by announcement–complaint with engines sharing seeds (so
//! first choices collide), a group Send answered by every member, a small
//! location cache churned by Sends to many hosts, and a partition that
//! heals. The figures it prints are the ones docs/SCALING.md quotes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rand::{Rng, SeedableRng};

use super::*;

/// Hosts simulated (`VKERNEL_SIM_HOSTS` overrides, for the figures in
/// docs/SCALING.md).
fn hosts() -> usize {
    std::env::var("VKERNEL_SIM_HOSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// A datagram in flight: (arrival, order, to, from, bytes).
type Flight = (Micros, u64, usize, usize, Vec<u8>);

/// The simulated LAN and its hosts.
struct Lan {
    e: Vec<Engine>,
    n: usize,
    now: Micros,
    /// (arrival, order, to, from, datagram).
    flights: BinaryHeap<Reverse<Flight>>,
    /// (due, engine): an engine's timer, pushed whenever it may change.
    timers: BinaryHeap<Reverse<(Micros, usize)>>,
    order: u64,
    rng: rand::rngs::SmallRng,
    /// Hosts below this index cannot reach the others (and back).
    cut: Option<usize>,
    sent: HashMap<PacketType, u64>,
}

impl Lan {
    fn new(f: impl Fn(usize, &mut Config)) -> Lan {
        let n = hosts();
        let e: Vec<Engine> = (0..n)
            .map(|i| {
                let mut c = Config {
                    host_id: None,
                    discovery: (0..n).filter(|&j| j != i).map(addr).collect(),
                    seed: i as u64,
                    ..Config::default()
                };
                f(i, &mut c);
                Engine::new(c, 0)
            })
            .collect();
        let mut lan = Lan {
            e,
            n,
            now: 0,
            flights: BinaryHeap::new(),
            timers: BinaryHeap::new(),
            order: 0,
            rng: rand::rngs::SmallRng::seed_from_u64(7),
            cut: None,
            sent: HashMap::new(),
        };
        for i in 0..n {
            lan.settle(i);
        }
        lan
    }

    /// Sends what engine `i` has queued and notes its next timer.
    fn settle(&mut self, i: usize) {
        while self.e[i].poll_event().is_some() {}
        let (out, _) = testing::take_output(&mut self.e[i], false);
        for t in out {
            if let Ok(p) = decode(&t.data) {
                *self.sent.entry(p.header.ptype).or_default() += 1;
            }
            let j = usize::from(t.to.port()).wrapping_sub(5000);
            let cut = self.cut.is_some_and(|c| (i < c) != (j < c));
            if j < self.n && !cut {
                self.order += 1;
                let at = self.now + self.rng.gen_range(100..300);
                self.flights.push(Reverse((at, self.order, j, i, t.data)));
            }
        }
        let t = self.e[i].poll_timeout();
        if t != Micros::MAX {
            self.timers.push(Reverse((t, i)));
        }
    }

    /// Runs datagrams and timers in time order until `done` holds or
    /// `limit` µs pass; whether `done` held.
    fn run_until(&mut self, limit: Micros, mut done: impl FnMut(&mut Lan) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            let f = self.flights.peek().map(|r| r.0 .0);
            let t = self.timers.peek().map(|r| r.0 .0);
            let next = f.into_iter().chain(t).min();
            let Some(next) = next.filter(|&n| n <= end) else {
                self.now = self.now.max(end);
                return done(self);
            };
            self.now = self.now.max(next);
            if f == Some(next) {
                let Some(Reverse((_, _, to, from, data))) = self.flights.pop() else {
                    continue;
                };
                let now = self.now;
                testing::deliver(&mut self.e[to], now, addr(from), &data, false);
                self.settle(to);
            } else {
                let Some(Reverse((_, i))) = self.timers.pop() else {
                    continue;
                };
                // Stale entries (the engine's timer moved) are skipped.
                if self.e[i].poll_timeout() <= self.now {
                    let now = self.now;
                    self.e[i].handle_timeout(now);
                    self.settle(i);
                }
            }
        }
    }

    fn count(&self, t: PacketType) -> u64 {
        self.sent.get(&t).copied().unwrap_or(0)
    }

    fn total(&self) -> u64 {
        self.sent.values().sum()
    }

    /// Answers every message waiting for the members (echoing it), then
    /// has them receive again.
    fn serve(&mut self, members: &[(usize, Pid)]) {
        for &(h, p) in members {
            if let Some(Completion::Receive(Ok(r))) = self.e[h].take_completion(p) {
                let now = self.now;
                self.e[h].reply(now, p, r.from, r.msg, None).unwrap();
                self.listen(h, p);
            }
        }
    }

    /// Puts member `p` of host `h` in Receive (a message already queued
    /// becomes its completion, served by the next [`Lan::serve`]).
    fn listen(&mut self, h: usize, p: Pid) {
        let now = self.now;
        if let Some(r) = self.e[h].receive(now, p, None, None).unwrap() {
            let pr = self.e[h].proc_mut(p).unwrap();
            pr.state = PState::Ready;
            pr.completion = Some(Completion::Receive(Ok(r)));
        }
        self.settle(h);
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "about 35 s in a release build; CI runs it")]
fn a_thousand_hosts_allocate_ids_answer_a_group_and_survive_a_partition() {
    let wall = std::time::Instant::now();
    let hosts = hosts();
    let mut n = Lan::new(|i, c| {
        // Four engines to a seed: they draw the same first ids.
        c.seed = (i / 4) as u64;
        c.alien_pool = 256;
        c.alien_per_host = 16;
        c.location_cache = 64;
        c.host_timeout = 2_000_000;
    });
    let alloc = n.run_until(60_000_000, |n| n.e.iter().all(|e| e.host_id().is_some()));
    assert!(alloc, "hosts without an id after 60 s");
    n.run_until(1_000_000, |_| false);
    let alloc_at = n.now;
    let ids: BTreeSet<HostId> = n.e.iter().filter_map(Engine::host_id).collect();
    assert_eq!(ids.len(), hosts, "two hosts took one id");
    let (requests, complaints) = (
        n.count(PacketType::LogicalHostRequest),
        n.count(PacketType::LogicalHostComplaint),
    );
    assert!(complaints > 0, "shared seeds drew no colliding ids");
    let alloc_datagrams = n.total();
    n.sent.clear();

    // One member on every host; a multi-reply group Send from host 0.
    let g = Pid::well_known_group(11);
    let mut members = Vec::new();
    for h in 0..hosts {
        let p = n.e[h].create_process().unwrap();
        n.e[h].join_group(g, p, p).unwrap();
        n.listen(h, p);
        members.push((h, p));
    }
    let s = n.e[0].create_process().unwrap();
    let mut m = Message::with_code(7);
    m.set_group_mode(GroupMode::Many);
    let t0 = n.now;
    n.e[0].send(t0, s, g, m, None).unwrap();
    n.settle(0);
    let mut replies = 0;
    let done = n.run_until(2_000_000, |net| {
        net.serve(&members);
        if replies == 0 {
            match net.e[0].take_completion(s) {
                Some(Completion::Send(Ok(_))) => replies = 1,
                Some(other) => panic!("group Send: {other:?}"),
                None => return false,
            }
        }
        while net.e[0].get_reply(s).is_some() {
            replies += 1;
        }
        replies == hosts
    });
    assert!(done, "{replies} of {hosts} replies gathered");
    let all_replies = n.now - t0;
    let group_datagrams = n.total();
    n.sent.clear();

    // Location-cache churn: host 0 (a 64-entry cache) Sends to 300
    // members in turn; each Send finds its host again.
    let c = n.e[0].create_process().unwrap();
    for k in 0..300 {
        let (_, to) = members[1 + (k * 7) % (hosts - 1)];
        let now = n.now;
        n.e[0]
            .send(now, c, to, Message::with_code(1), None)
            .unwrap();
        n.settle(0);
        let done = n.run_until(3_000_000, |net| {
            net.serve(&members);
            completed(&net.e[0], c)
        });
        assert!(done, "Send {k} to {to} not answered");
        assert!(matches!(
            n.e[0].take_completion(c),
            Some(Completion::Send(Ok(_)))
        ));
    }
    let churn_datagrams = n.total();
    n.sent.clear();

    // A partition between the halves: a Send across it fails within the
    // host timeout; healed, the next one is answered.
    n.cut = Some(hosts / 2);
    let far = members[hosts - 1].1;
    let t0 = n.now;
    n.e[0]
        .send(t0, c, far, Message::with_code(1), None)
        .unwrap();
    n.settle(0);
    assert!(n.run_until(10_000_000, |net| completed(&net.e[0], c)));
    assert!(matches!(
        n.e[0].take_completion(c),
        Some(Completion::Send(Err(IpcError::Timeout(_))))
    ));
    let cut_for = n.now - t0;
    assert!(cut_for <= 2_000_000 + 50_000, "failed after {cut_for} µs");
    n.cut = None;
    let now = n.now;
    n.e[0]
        .send(now, c, far, Message::with_code(1), None)
        .unwrap();
    n.settle(0);
    let done = n.run_until(3_000_000, |net| {
        net.serve(&members);
        completed(&net.e[0], c)
    });
    assert!(done && matches!(n.e[0].take_completion(c), Some(Completion::Send(Ok(_)))));
    eprintln!(
        "{hosts} hosts: ids allocated by {:.2} s (virtual) with {requests} announcement \
         datagrams and {complaints} complaints ({alloc_datagrams} datagrams in all); a group \
         Send to {hosts} members: all {replies} replies after {:.2} ms, \
         {group_datagrams} datagrams; 300 Sends through a 64-entry location cache: \
         {churn_datagrams} datagrams; a Send across a partition failed after {:.2} s and \
         succeeded once healed; {:.1} s of wall time",
        alloc_at as f64 / 1e6,
        all_replies as f64 / 1e3,
        cut_for as f64 / 1e6,
        wall.elapsed().as_secs_f64()
    );
}
