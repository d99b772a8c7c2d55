//! Bulk congestion control on a simulated path: two engines, datagrams in
//! time order, one direction through a bottleneck (a rate and a drop-tail
//! queue), optional random loss both ways. A window-sized burst into a
//! short queue must not turn into mass retransmission, and 1 % random loss
//! must keep at least half the clean throughput.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};

use super::*;

/// A datagram in flight: (arrival, order, to, bytes).
type Flight = (Micros, u64, usize, Vec<u8>);

/// The path between engines 0 and 1.
struct Path {
    e: Vec<Engine>,
    now: Micros,
    flights: BinaryHeap<Reverse<Flight>>,
    order: u64,
    /// The engine whose datagrams cross the bottleneck.
    narrow_from: usize,
    /// Bottleneck rate, bytes per µs.
    rate: u64,
    /// Bottleneck queue, bytes.
    queue: u64,
    /// When the bottleneck has sent everything queued so far.
    busy_until: Micros,
    /// One-way propagation delay, µs.
    delay: Micros,
    /// Random loss, per mille, both directions.
    loss: u32,
    rng: rand::rngs::SmallRng,
    /// Datagrams the queue dropped, and random losses.
    overflows: u64,
    lost: u64,
    /// Extra delay of each datagram, random up to this (µs): reordering.
    jitter: Micros,
    /// Engine 1 stops for `.1` µs every `.0` µs (a descheduled thread):
    /// what arrives meanwhile, and its timers, wait for the end.
    stall: Option<(Micros, Micros)>,
}

/// What one transfer did.
#[derive(Debug)]
struct Run {
    /// Bytes per µs, from the move's start to its completion.
    goodput: f64,
    /// Chunks retransmitted, as a fraction of the chunks.
    retx: f64,
    overflows: u64,
    cuts: u64,
}

const WINDOW: usize = 256 * CHUNK;

impl Path {
    fn new(narrow_from: usize, rate: u64, queue_datagrams: u64, loss: u32, seed: u64) -> Path {
        let e = (0..2)
            .map(|i| {
                let c = Config {
                    host_id: Some(HostId(i as u16 + 1)),
                    discovery: vec![addr(1 - i)],
                    datagram_size: 1200,
                    window: WINDOW,
                    seed: i as u64,
                    ..Config::default()
                };
                Engine::new(c, 0)
            })
            .collect();
        let mut p = Path {
            e,
            now: 0,
            flights: BinaryHeap::new(),
            order: 0,
            narrow_from,
            rate,
            queue: queue_datagrams * 1200,
            busy_until: 0,
            delay: 50,
            loss,
            rng: rand::rngs::SmallRng::seed_from_u64(seed),
            overflows: 0,
            lost: 0,
            jitter: 0,
            stall: None,
        };
        p.run_until(1_000_000, |_| false);
        p
    }

    /// Puts what engine `i` has to send on the path.
    fn settle(&mut self, i: usize) {
        while self.e[i].poll_event().is_some() {}
        let (out, _) = testing::take_output(&mut self.e[i], true);
        for t in out {
            if self.loss > 0 && self.rng.gen_range(0..1000) < self.loss {
                self.lost += 1;
                continue;
            }
            let len = t.data.len() as u64;
            let at = if i == self.narrow_from {
                let backlog = self.busy_until.saturating_sub(self.now) * self.rate;
                // An idle link takes any datagram (a large request).
                if backlog > 0 && backlog + len > self.queue {
                    self.overflows += 1;
                    continue;
                }
                self.busy_until = self.busy_until.max(self.now) + len.div_ceil(self.rate);
                self.busy_until + self.delay
            } else {
                self.now + self.delay
            };
            let at = at
                + if self.jitter > 0 {
                    self.rng.gen_range(0..=self.jitter)
                } else {
                    0
                };
            let at = if i == 0 { self.resumed(at) } else { at };
            self.order += 1;
            self.flights.push(Reverse((at, self.order, 1 - i, t.data)));
        }
    }

    /// When engine 1 is running again at or after `t`.
    fn resumed(&self, t: Micros) -> Micros {
        match self.stall {
            Some((every, long)) if t % every < long => t - t % every + long,
            _ => t,
        }
    }

    /// Runs datagrams and timers in time order until `done` holds or
    /// `limit` µs pass; whether `done` held.
    fn run_until(&mut self, limit: Micros, mut done: impl FnMut(&mut Path) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            self.settle(0);
            self.settle(1);
            if done(self) {
                return true;
            }
            let f = self.flights.peek().map(|r| r.0 .0);
            let t = [
                self.e[0].poll_timeout(),
                self.resumed(self.e[1].poll_timeout()),
            ]
            .into_iter()
            .min();
            let Some(next) = f.into_iter().chain(t).min().filter(|&n| n <= end) else {
                self.now = self.now.max(end);
                return done(self);
            };
            self.now = self.now.max(next);
            let now = self.now;
            if f == Some(next) {
                if let Some(Reverse((_, _, to, data))) = self.flights.pop() {
                    testing::deliver(&mut self.e[to], now, addr(1 - to), &data, true);
                }
            } else {
                for i in 0..2 {
                    let due = self.e[i].poll_timeout();
                    if now >= due && (i == 0 || self.resumed(now) == now) {
                        self.e[i].handle_timeout(now);
                    }
                }
            }
        }
    }

    /// Moves `len` bytes between a server on engine 0 and a client on
    /// engine 1 that sent it a segment: by MoveTo (0 → 1) or MoveFrom
    /// (1 → 0). Checks the bytes.
    fn transfer(&mut self, to: bool, len: usize) -> Run {
        let s = self.e[0].create_process().unwrap();
        let c = self.e[1].create_process().unwrap();
        let data = pattern(len as u32, len);
        let (access, seg) = if to {
            (SegAccess::WRITE, SharedBuf::new(vec![0; len]))
        } else {
            (SegAccess::READ, SharedBuf::new(data.clone()))
        };
        let now = self.now;
        self.e[1]
            .send(now, c, s, seg_msg(1, access), Some(seg.lend()))
            .unwrap();
        let now = self.now;
        if self.e[0].receive(now, s, None, None).unwrap().is_none() {
            assert!(self.run_until(1_000_000, |p| completed(&p.e[0], s)));
            received(&mut self.e[0], s);
        }
        let (retx0, cuts0) = {
            let st = self.e[0].stats();
            let su = self.e[1].stats();
            (
                st.bulk_retransmits + su.bulk_retransmits,
                st.bulk_cwnd_cuts + su.bulk_cwnd_cuts,
            )
        };
        let over0 = self.overflows;
        let start = self.now;
        let mine = SharedBuf::new(if to { data.clone() } else { vec![0; len] });
        let now = self.now;
        let r = if to {
            self.e[0].move_to(now, s, c, 0, mine.lend())
        } else {
            self.e[0].move_from(now, s, c, 0, mine.lend())
        };
        assert_eq!(r, Ok(None));
        assert!(
            self.run_until(20_000_000, |p| completed(&p.e[0], s)),
            "the move did not finish"
        );
        assert_eq!(moved(&mut self.e[0], s), Ok(len));
        let took = self.now - start;
        let now = self.now;
        self.e[0].reply(now, s, c, Message::zero(), None).unwrap();
        assert!(self.run_until(1_000_000, |p| completed(&p.e[1], c)));
        reply_of(&mut self.e[1], c);
        let got = if to { seg.snapshot() } else { mine.snapshot() };
        same_bytes(&got, &data, "moved bytes");
        let st = self.e[0].stats();
        let su = self.e[1].stats();
        Run {
            goodput: len as f64 / took.max(1) as f64,
            retx: (st.bulk_retransmits + su.bulk_retransmits - retx0) as f64
                / len.div_ceil(CHUNK) as f64,
            overflows: self.overflows - over0,
            cuts: st.bulk_cwnd_cuts + su.bulk_cwnd_cuts - cuts0,
        }
    }
}

#[test]
fn a_window_burst_into_a_short_queue_settles_without_mass_retransmission() {
    // 100 MB/s, 100 µs round trip (~9 chunks in flight), a 32-datagram
    // queue; the flow-control window is 256 chunks.
    for to in [true, false] {
        let narrow = if to { 0 } else { 1 };
        let mut p = Path::new(narrow, 100, 32, 0, 1);
        let r = p.transfer(to, 4 << 20);
        println!(
            "{} through the bottleneck: {r:?}",
            if to { "MoveTo" } else { "MoveFrom" }
        );
        assert!(
            r.overflows > 0 && r.cuts > 0,
            "{r:?}: the queue overflows, the window is cut"
        );
        assert!(r.retx < 0.05, "{r:?}: at most 5 % of chunks sent twice");
        assert!(
            r.goodput > 0.7 * 100.0,
            "{r:?}: at least 70 % of the bottleneck"
        );
        // A second transfer starts from the window the first ended with.
        let again = p.transfer(to, 1 << 20);
        println!("  again: {again:?}");
        assert!(again.retx < 0.05, "{again:?}");
    }
}

#[test]
fn one_percent_random_loss_keeps_half_the_clean_throughput() {
    for to in [true, false] {
        let narrow = if to { 0 } else { 1 };
        // A queue longer than the window: no congestion loss at all.
        let clean = Path::new(narrow, 100, 512, 0, 2).transfer(to, 4 << 20);
        let lossy = Path::new(narrow, 100, 512, 10, 2).transfer(to, 4 << 20);
        println!(
            "{}: clean {clean:?}, 1 % loss {lossy:?}: {:.2}×",
            if to { "MoveTo" } else { "MoveFrom" },
            lossy.goodput / clean.goodput
        );
        assert_eq!((clean.cuts, clean.overflows), (0, 0), "{clean:?}");
        assert!(lossy.cuts > 0, "{lossy:?}");
        assert!(
            lossy.goodput >= 0.5 * clean.goodput,
            "{lossy:?} against {clean:?}"
        );
    }
}

/// A transfer whose last chunk (MoveTo) or last credit answer (MoveFrom)
/// is lost recovers after two round trips (the tail-loss probe, 200 µs
/// at least), not after the 2 ms retransmission floor, and without
/// cutting its window.
#[test]
fn a_lost_tail_is_probed_for_after_two_round_trips() {
    for to in [true, false] {
        let mut n = Net::with(2, |_, c| c.window = 64 * CHUNK);
        n.introduce();
        let s = n.e[0].create_process().unwrap();
        let c = n.e[1].create_process().unwrap();
        let len = 8 * CHUNK;
        let data = pattern(9, len);
        let seg = SharedBuf::new(if to { vec![0; len] } else { data.clone() });
        let mut m = seg_msg(1, SegAccess::READ_WRITE);
        m.set_flag(NO_APPEND, true);
        n.e[1].send(n.now, c, s, m, Some(seg.lend())).unwrap();
        n.run();
        n.e[0].receive(n.now, s, None, None).unwrap().unwrap();
        let mut took = Vec::new();
        for round in 0..2 {
            // Round 0 teaches the round trip; round 1 loses its tail once.
            let last = (len - 1) / CHUNK * CHUNK;
            let data_type = if to {
                PacketType::MoveToRequest
            } else {
                PacketType::MoveFromReply
            };
            let mut dropped = false;
            n.filter = Some(Box::new(move |_, _, d| {
                let p = decode(d).unwrap();
                let tail = p.header.ptype == data_type && p.header.local_addr as usize == last;
                if round == 1 && tail && !dropped {
                    dropped = true;
                    return false;
                }
                true
            }));
            let mine = SharedBuf::new(if to { data.clone() } else { vec![0; len] });
            let start = n.now;
            let r = if to {
                n.e[0].move_to(n.now, s, c, 0, mine.lend())
            } else {
                n.e[0].move_from(n.now, s, c, 0, mine.lend())
            };
            assert_eq!(r, Ok(None));
            assert!(n.advance_until(1_000_000, |n| completed(&n.e[0], s)));
            assert_eq!(moved(&mut n.e[0], s), Ok(len));
            took.push(n.now - start);
            if !to {
                same_bytes(&mine.snapshot(), &data, "moved from");
            }
        }
        let cuts = n.e[0].stats().bulk_cwnd_cuts;
        println!(
            "{}: clean {} µs, tail lost {} µs",
            if to { "MoveTo" } else { "MoveFrom" },
            took[0],
            took[1]
        );
        assert!(
            took[1] < 1_000,
            "{took:?}: probed well before the 2 ms floor"
        );
        assert!(
            took[1] > took[0] + 150,
            "{took:?}: the probe waits two round trips"
        );
        assert_eq!(cuts, 0, "a probe is not a timeout");
        n.filter = None;
        n.e[0].reply(n.now, s, c, Message::zero(), None).unwrap();
        n.run();
        reply_of(&mut n.e[1], c);
        if to {
            same_bytes(&seg.snapshot(), &data, "moved to");
        }
    }
}

/// On a path that loses nothing no bulk chunk is sent twice: not when
/// datagrams overtake each other (by up to 40 µs), nor, for MoveFrom,
/// when the owner stops for 0.8 ms every 2 ms, long enough for the
/// mover's tail-loss probe to fire while its requests wait unread.
#[test]
fn a_path_that_loses_nothing_resends_nothing() {
    for (to, jitter, stall) in [
        (true, 0, None),
        (false, 0, None),
        (false, 40, None),
        (false, 40, Some((2_000, 800))),
    ] {
        let mut p = Path::new(if to { 0 } else { 1 }, 1_000, 4096, 0, 3);
        p.jitter = jitter;
        p.stall = stall;
        let r = p.transfer(to, 16 << 20);
        let dups = p.e[0].stats().bulk_duplicates + p.e[1].stats().bulk_duplicates;
        println!(
            "{} jitter {jitter} µs, stalls {stall:?}: {r:?}, {dups} duplicates",
            if to { "MoveTo" } else { "MoveFrom" }
        );
        assert_eq!(r.overflows, 0, "{r:?}");
        assert_eq!((r.retx, dups), (0.0, 0), "{r:?}: nothing was lost");
    }
}
