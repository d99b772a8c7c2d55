//! Seeded simulation of several logical hosts on a bad network.
//!
//! The engines run unchanged against a virtual clock and an in-memory
//! network that loses, duplicates, delays and reorders datagrams, cuts
//! partitions and crashes hosts, all decided by one seeded RNG. Scripted
//! clients send echo, non-idempotent increment, MoveFrom (pull) and MoveTo
//! (push) requests to servers on other hosts. Checked for every seed:
//! - every Send completes (reply or error) within its bound;
//! - with no partition and no crash every Send succeeds;
//! - no non-idempotent request is executed twice;
//! - every successful MoveFrom/MoveTo delivered exactly the bytes.
//!
//! `VKERNEL_SIM_SEEDS=n` sets how many seeds run (default 2000);
//! `VKERNEL_SIM_SEED=s` runs just one (printed on failure).

use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use vkernel_proto::engine::Completion;
use vkernel_proto::message::IDEMPOTENT;
use vkernel_proto::{
    Config, Engine, Event, HostId, IpcError, Message, Micros, Pid, Received, SegAccess, SharedBuf,
};

const ECHO: u32 = 1;
const INCR: u32 = 2;
const PULL: u32 = 3;
const PUSH: u32 = 4;
/// A request the server takes `size` µs to answer (longer than the host
/// timeout, so only replyPending keeps it alive).
const SLOW: u32 = 5;
const HOST_TIMEOUT: Micros = 2_000_000;

fn pattern(id: u32, n: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9e37_79b9) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn checksum(d: &[u8]) -> u32 {
    d.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

#[derive(Clone, Copy, Debug)]
struct Faults {
    loss: f64,
    dup: f64,
    jitter: Micros,
    partition: Option<(Micros, Micros)>,
    crash: Option<(Micros, Micros)>,
}

impl Faults {
    /// Every Send must succeed: no partition, no crash, and loss low enough
    /// that eight lost polls in a row (a host timeout's worth) are
    /// vanishingly rare. Above that a timeout is a correct outcome, and only
    /// the bounds and exactly-once are checked.
    fn must_succeed(&self) -> bool {
        self.partition.is_none() && self.crash.is_none() && self.loss <= 0.05
    }
}

struct Packet {
    at: Micros,
    order: u64,
    to: usize,
    from: SocketAddr,
    data: Vec<u8>,
}

impl PartialEq for Packet {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for Packet {}
impl PartialOrd for Packet {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Packet {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.order).cmp(&(self.at, self.order))
    }
}

#[derive(Clone, Copy, Debug)]
struct Req {
    kind: u32,
    id: u32,
    size: usize,
}

enum ServerState {
    Idle,
    Receiving,
    Busy { until: Micros, r: Received },
    Moving { r: Received, buf: SharedBuf },
}

enum ClientState {
    Ready,
    Sending {
        req: Req,
        started: Micros,
        seg: Option<SharedBuf>,
    },
    Done,
}

enum Role {
    Server(ServerState),
    Client {
        plan: Vec<Req>,
        next: usize,
        state: ClientState,
        server: Pid,
    },
}

struct Proc {
    host: usize,
    pid: Pid,
    role: Role,
    runnable: bool,
}

struct World {
    seed: u64,
    rng: SmallRng,
    now: Micros,
    engines: Vec<Option<Engine>>,
    addrs: Vec<SocketAddr>,
    net: BinaryHeap<Packet>,
    order: u64,
    faults: Faults,
    procs: Vec<Proc>,
    /// (client pid, request id) → executions of non-idempotent requests.
    executions: HashMap<(Pid, u32), u32>,
    /// Completed Sends: (ok, took).
    results: Vec<(bool, Micros)>,
    log: Vec<String>,
    /// Digest of every datagram sent, in order (for the replay check).
    digest: u64,
    /// Total server time of all SLOW requests (queueing allowance).
    slow_total: Micros,
}

fn cfg(host: usize, addrs: &[SocketAddr], seed: u64) -> Config {
    Config {
        host_id: Some(HostId(host as u16 + 1)),
        discovery: addrs
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != host)
            .map(|(_, a)| *a)
            .collect(),
        datagram_size: 1200,
        window: 16 * 1124,
        host_timeout: HOST_TIMEOUT,
        alien_timeout: 2 * HOST_TIMEOUT + 1_000_000,
        seed,
        ..Config::default()
    }
}

impl World {
    fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(20).collect();
        panic!(
            "simulation seed {} failed at t={}µs: {what}\nfaults: {:?}\nrecent: {:#?}\nrerun: VKERNEL_SIM_SEED={} cargo test -p vkernel-proto --test simulation",
            self.seed, self.now, self.faults, tail, self.seed
        );
    }

    fn partitioned(&self, a: usize, b: usize) -> bool {
        match self.faults.partition {
            // Host 0 is cut off from everyone during the window.
            Some((t0, t1)) => (a == 0) != (b == 0) && self.now >= t0 && self.now < t1,
            None => false,
        }
    }

    fn host_of(&self, addr: SocketAddr) -> usize {
        self.addrs
            .iter()
            .position(|a| *a == addr)
            .unwrap_or(usize::MAX)
    }

    fn pump(&mut self, h: usize) {
        let Some(e) = self.engines[h].as_mut() else {
            return;
        };
        let mut out = Vec::new();
        while let Some(t) = e.poll_transmit() {
            out.push(t);
        }
        let mut wakes = Vec::new();
        while let Some(ev) = e.poll_event() {
            if let Event::Wake(p) = ev {
                wakes.push(p);
            }
        }
        for p in self.procs.iter_mut() {
            if p.host == h && wakes.contains(&p.pid) {
                p.runnable = true;
            }
        }
        let trace = std::env::var("VKERNEL_SIM_TRACE").is_ok();
        for t in out {
            for &b in &t.data {
                self.digest = (self.digest ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
            let to = self.host_of(t.to);
            if trace {
                if let Ok(p) = vkernel_proto::wire::decode(&t.data) {
                    eprintln!(
                        "{:>9} {h}->{to} {:?} seq {:08x} {} -> {} len {}",
                        self.now,
                        p.header.ptype,
                        p.header.seq,
                        p.header.src,
                        p.header.dst,
                        p.data.len()
                    );
                }
            }
            if to == usize::MAX || self.partitioned(h, to) {
                continue;
            }
            if self.rng.gen_bool(self.faults.loss) {
                continue;
            }
            let copies = if self.rng.gen_bool(self.faults.dup) {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let delay = 30 + self.rng.gen_range(0..=self.faults.jitter);
                self.order += 1;
                self.net.push(Packet {
                    at: self.now + delay,
                    order: self.order,
                    to,
                    from: self.addrs[h],
                    data: t.data.clone(),
                });
            }
        }
    }

    fn run_server(&mut self, i: usize) {
        let now = self.now;
        let (h, pid) = (self.procs[i].host, self.procs[i].pid);
        loop {
            let Some(e) = self.engines[h].as_mut() else {
                return;
            };
            let Role::Server(st) = &mut self.procs[i].role else {
                return;
            };
            let got = match std::mem::replace(st, ServerState::Idle) {
                ServerState::Idle => match e.receive(now, pid, None, None) {
                    Ok(Some(r)) => r,
                    Ok(None) => {
                        *st = ServerState::Receiving;
                        return;
                    }
                    Err(err) => self.fail(format!("server receive: {err}")),
                },
                ServerState::Receiving => match e.take_completion(pid) {
                    Some(Completion::Receive(Ok(r))) => r,
                    Some(c) => self.fail(format!("server: unexpected {c:?}")),
                    None => {
                        *st = ServerState::Receiving;
                        return;
                    }
                },
                ServerState::Busy { until, r } => {
                    if now < until {
                        *st = ServerState::Busy { until, r };
                        return;
                    }
                    let mut m = r.msg;
                    m.0[1] = m.0[1].wrapping_add(1);
                    let _ = e.reply(now, pid, r.from, m, None);
                    continue;
                }
                ServerState::Moving { r, buf } => {
                    let res = match e.take_completion(pid) {
                        Some(Completion::Move(res)) => res,
                        Some(c) => self.fail(format!("server: unexpected {c:?}")),
                        None => {
                            *st = ServerState::Moving { r, buf };
                            return;
                        }
                    };
                    self.finish_move(i, r, buf, res);
                    continue;
                }
            };
            self.handle(i, got);
            if !matches!(self.procs[i].role, Role::Server(ServerState::Idle)) {
                return;
            }
        }
    }

    fn handle(&mut self, i: usize, r: Received) {
        let now = self.now;
        let (h, pid) = (self.procs[i].host, self.procs[i].pid);
        let Some(e) = self.engines[h].as_mut() else {
            return;
        };
        let mut m = r.msg;
        match r.msg.code() {
            SLOW => {
                let until = now + r.msg.0[3] as Micros;
                self.procs[i].role = Role::Server(ServerState::Busy { until, r });
                return;
            }
            ECHO => {
                m.0[1] = m.0[1].wrapping_add(1);
            }
            INCR => {
                let key = (r.from, r.msg.0[2]);
                let n = {
                    let c = self.executions.entry(key).or_insert(0);
                    *c += 1;
                    *c
                };
                if n > 1 {
                    self.fail(format!("non-idempotent request {key:?} executed {n} times"));
                }
                m.0[1] = n;
            }
            PULL | PUSH => {
                let n = r.msg.seg_len() as usize;
                let buf = if r.msg.code() == PULL {
                    SharedBuf::new(vec![0; n])
                } else {
                    SharedBuf::new(pattern(r.msg.0[2], n))
                };
                let res = if r.msg.code() == PULL {
                    e.move_from(now, pid, r.from, 0, buf.lend())
                } else {
                    e.move_to(now, pid, r.from, 0, buf.lend())
                };
                match res {
                    Ok(None) => {
                        self.procs[i].role = Role::Server(ServerState::Moving { r, buf });
                        return;
                    }
                    Ok(Some(n)) => return self.finish_move(i, r, buf, Ok(n)),
                    Err(err) => return self.finish_move(i, r, buf, Err(err)),
                }
            }
            c => self.fail(format!("server got unknown code {c}")),
        }
        // The client may be gone (timed out): a failed reply is fine.
        let _ = e.reply(now, pid, r.from, m, None);
        self.procs[i].role = Role::Server(ServerState::Idle);
    }

    fn finish_move(&mut self, i: usize, r: Received, buf: SharedBuf, res: Result<usize, IpcError>) {
        let now = self.now;
        let (h, pid) = (self.procs[i].host, self.procs[i].pid);
        let mut m = r.msg;
        match res {
            Ok(n) => {
                m.0[1] = n as u32;
                m.0[3] = checksum(&buf.snapshot());
            }
            Err(_) => m.0[1] = u32::MAX,
        }
        self.procs[i].role = Role::Server(ServerState::Idle);
        if let Some(e) = self.engines[h].as_mut() {
            let _ = e.reply(now, pid, r.from, m, None);
        }
    }

    fn run_client(&mut self, i: usize) {
        let now = self.now;
        let (h, pid) = (self.procs[i].host, self.procs[i].pid);
        loop {
            let Some(e) = self.engines[h].as_mut() else {
                return;
            };
            let Role::Client {
                plan,
                next,
                state,
                server,
            } = &mut self.procs[i].role
            else {
                return;
            };
            match std::mem::replace(state, ClientState::Ready) {
                ClientState::Done => {
                    *state = ClientState::Done;
                    return;
                }
                ClientState::Ready => {
                    if *next >= plan.len() {
                        *state = ClientState::Done;
                        return;
                    }
                    let req = plan[*next];
                    *next += 1;
                    let mut m = Message::with_code(req.kind);
                    m.0[1] = req.id;
                    m.0[2] = req.id;
                    m.0[3] = req.size as u32;
                    if req.kind != INCR && req.kind != SLOW {
                        m.set_flag(IDEMPOTENT, true);
                    }
                    let seg = match req.kind {
                        PULL => {
                            m.set_segment(SegAccess::READ, req.size as u32);
                            Some(SharedBuf::new(pattern(req.id, req.size)))
                        }
                        PUSH => {
                            m.set_segment(SegAccess::WRITE, req.size as u32);
                            Some(SharedBuf::new(vec![0; req.size]))
                        }
                        _ => None,
                    };
                    let server = *server;
                    match e.send(now, pid, server, m, seg.as_ref().map(|s| s.lend())) {
                        Ok(()) => {
                            *state = ClientState::Sending {
                                req,
                                started: now,
                                seg,
                            };
                            return;
                        }
                        Err(err) => {
                            self.log.push(format!(
                                "{now} client {pid} send #{} failed at once: {err}",
                                req.id
                            ));
                            self.results.push((false, 0));
                        }
                    }
                }
                ClientState::Sending { req, started, seg } => {
                    let Some(c) = e.take_completion(pid) else {
                        *state = ClientState::Sending { req, started, seg };
                        return;
                    };
                    let took = now - started;
                    let Completion::Send(res) = c else {
                        self.fail(format!("client: unexpected {c:?}"));
                    };
                    let ok = match res {
                        Ok(rep) => {
                            self.check_reply(req, rep.msg, seg);
                            true
                        }
                        Err(err) => {
                            self.log.push(format!(
                                "{now} client {pid} #{} kind {} failed after {took}µs: {err}",
                                req.id, req.kind
                            ));
                            false
                        }
                    };
                    self.results.push((ok, took));
                    self.check_bound(req, started, took);
                }
            }
        }
    }

    fn check_reply(&mut self, req: Req, reply: Message, seg: Option<SharedBuf>) {
        match req.kind {
            ECHO | SLOW if reply.0[1] != req.id.wrapping_add(1) => {
                self.fail(format!("echo #{} got {}", req.id, reply.0[1]))
            }
            INCR if reply.0[1] != 1 => self.fail(format!(
                "increment #{} saw {} executions",
                req.id, reply.0[1]
            )),
            PULL if reply.0[1] != u32::MAX
                && (reply.0[1] as usize != req.size
                    || reply.0[3] != checksum(&pattern(req.id, req.size))) =>
            {
                self.fail(format!("MoveFrom #{} delivered wrong bytes", req.id))
            }
            PUSH if reply.0[1] != u32::MAX => {
                let got = seg.map(|s| s.snapshot()).unwrap_or_default();
                if got != pattern(req.id, req.size) {
                    self.fail(format!("MoveTo #{} delivered wrong bytes", req.id));
                }
            }
            _ => {}
        }
        // A failed move (u32::MAX) is only allowed when the network broke.
        if (req.kind == PULL || req.kind == PUSH)
            && reply.0[1] == u32::MAX
            && self.faults.must_succeed()
        {
            self.fail(format!(
                "move #{} failed on a network without partitions or crashes",
                req.id
            ));
        }
    }

    fn check_bound(&mut self, req: Req, started: Micros, took: Micros) {
        // Base bound: one host timeout of silence per phase (send, move,
        // reply), plus the time the network was cut.
        // A request may also wait behind every slow request at its server.
        let mut bound = 3 * HOST_TIMEOUT + 2_000_000 + self.slow_total;
        if let Some((t0, t1)) = self.faults.partition {
            if t1 > started {
                bound += t1 - t0;
            }
        }
        if let Some((t0, t1)) = self.faults.crash {
            if t1 > started {
                bound += t1 - t0;
            }
        }
        if took > bound {
            self.fail(format!(
                "send #{} kind {} took {took}µs > bound {bound}µs",
                req.id, req.kind
            ));
        }
    }

    fn crash_and_restart(&mut self) {
        let Some((t0, t1)) = self.faults.crash else {
            return;
        };
        // Host 0 (a server host) dies at t0 and comes back at t1 with a new
        // incarnation: new processes, same logical host id.
        if self.now >= t0 && self.now < t1 && self.engines[0].is_some() {
            self.log.push(format!("{} crash host 0", self.now));
            self.engines[0] = None;
            self.net.retain(|p| p.to != 0);
        }
        if self.now >= t1 && self.engines[0].is_none() {
            self.log.push(format!("{} restart host 0", self.now));
            let seed = self.rng.gen();
            let mut e = Engine::new(cfg(0, &self.addrs, seed), self.now);
            let mut new_pids = HashMap::new();
            for p in self.procs.iter_mut().filter(|p| p.host == 0) {
                let np = e
                    .create_process()
                    .unwrap_or_else(|err| panic!("restart: {err}"));
                new_pids.insert(p.pid, np);
                p.pid = np;
                p.runnable = true;
                match &mut p.role {
                    Role::Server(st) => *st = ServerState::Idle,
                    // A client that died with the host does not come back.
                    Role::Client { state, .. } => *state = ClientState::Done,
                }
            }
            self.engines[0] = Some(e);
            // Clients learn the new pids the way a real client would (GetPid);
            // the test just tells them for the next request.
            for p in self.procs.iter_mut() {
                if let Role::Client { server, .. } = &mut p.role {
                    if let Some(n) = new_pids.get(server) {
                        *server = *n;
                    }
                }
            }
        }
    }

    fn all_done(&self) -> bool {
        self.procs.iter().all(|p| match &p.role {
            Role::Client { state, .. } => {
                matches!(state, ClientState::Done) || (self.engines[p.host].is_none())
            }
            Role::Server(_) => true,
        })
    }

    fn next_time(&self) -> Micros {
        let mut t = Micros::MAX;
        if let Some(p) = self.net.peek() {
            t = t.min(p.at);
        }
        for e in self.engines.iter().flatten() {
            t = t.min(e.poll_timeout());
        }
        for p in &self.procs {
            if let Role::Server(ServerState::Busy { until, .. }) = p.role {
                t = t.min(until);
            }
        }
        for (a, b) in [self.faults.partition, self.faults.crash]
            .into_iter()
            .flatten()
        {
            for x in [a, b] {
                if x > self.now {
                    t = t.min(x);
                }
            }
        }
        t.max(self.now + 1)
    }

    fn step(&mut self) {
        self.crash_and_restart();
        let now = self.now;
        for p in self.procs.iter_mut() {
            if let Role::Server(ServerState::Busy { until, .. }) = p.role {
                if until <= now {
                    p.runnable = true;
                }
            }
        }
        while let Some(p) = self.net.peek() {
            if p.at > self.now {
                break;
            }
            let Some(p) = self.net.pop() else { break };
            if std::env::var("VKERNEL_SIM_TRACE").is_ok() {
                if let Ok(d) = vkernel_proto::wire::decode(&p.data) {
                    eprintln!(
                        "{:>9} deliver to {} {:?} seq {:08x} {} -> {}",
                        self.now, p.to, d.header.ptype, d.header.seq, d.header.src, d.header.dst
                    );
                }
            }
            if let Some(e) = self.engines[p.to].as_mut() {
                e.handle_datagram(self.now, p.from, &p.data);
            }
            self.pump(p.to);
        }
        for h in 0..self.engines.len() {
            if let Some(e) = self.engines[h].as_mut() {
                if self.now >= e.poll_timeout() {
                    e.handle_timeout(self.now);
                }
            }
            self.pump(h);
        }
        for _ in 0..64 {
            let Some(i) = self.procs.iter().position(|p| p.runnable) else {
                break;
            };
            self.procs[i].runnable = false;
            if matches!(self.procs[i].role, Role::Server(_)) {
                self.run_server(i);
            } else {
                self.run_client(i);
            }
            let h = self.procs[i].host;
            self.pump(h);
        }
    }
}

fn scenario(seed: u64) -> (usize, usize, u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let hosts = rng.gen_range(2..=4);
    let addrs: Vec<SocketAddr> = (0..hosts)
        .map(|i| SocketAddr::from(([10, 0, 0, i as u8 + 1], 7000)))
        .collect();
    let profile = rng.gen_range(0..5);
    let faults = Faults {
        loss: if profile == 0 {
            0.0
        } else {
            rng.gen_range(0.0..0.12)
        },
        dup: if profile >= 2 {
            rng.gen_range(0.0..0.1)
        } else {
            0.0
        },
        jitter: if profile >= 2 {
            rng.gen_range(0..3000)
        } else {
            20
        },
        partition: (profile == 3).then(|| {
            let t0 = rng.gen_range(0..3_000_000);
            (t0, t0 + rng.gen_range(100_000..5_000_000))
        }),
        crash: (profile == 4).then(|| {
            let t0 = rng.gen_range(0..3_000_000);
            (t0, t0 + rng.gen_range(100_000..3_000_000))
        }),
    };
    let mut w = World {
        seed,
        rng: SmallRng::seed_from_u64(seed ^ 0xabcdef),
        now: 0,
        engines: (0..hosts)
            .map(|h| Some(Engine::new(cfg(h, &addrs, seed + h as u64), 0)))
            .collect(),
        addrs,
        net: BinaryHeap::new(),
        order: 0,
        faults,
        procs: Vec::new(),
        executions: HashMap::new(),
        results: Vec::new(),
        log: Vec::new(),
        digest: 0xcbf2_9ce4_8422_2325,
        slow_total: 0,
    };
    // Servers on host 0 (and host 1 when there are more than two hosts).
    let server_hosts: Vec<usize> = if hosts > 2 { vec![0, 1] } else { vec![0] };
    let mut servers = Vec::new();
    for &h in &server_hosts {
        for _ in 0..2 {
            let Some(e) = w.engines[h].as_mut() else {
                continue;
            };
            let pid = e
                .create_process()
                .unwrap_or_else(|err| panic!("create: {err}"));
            servers.push(pid);
            w.procs.push(Proc {
                host: h,
                pid,
                role: Role::Server(ServerState::Idle),
                runnable: true,
            });
        }
    }
    let mut id = 0u32;
    for h in 0..hosts {
        for _ in 0..rng.gen_range(1..=2) {
            let Some(e) = w.engines[h].as_mut() else {
                continue;
            };
            let pid = e
                .create_process()
                .unwrap_or_else(|err| panic!("create: {err}"));
            let server = servers[rng.gen_range(0..servers.len())];
            let plan: Vec<Req> = (0..rng.gen_range(5..25))
                .map(|_| {
                    id += 1;
                    let kind =
                        [ECHO, INCR, PULL, PUSH, ECHO, INCR, PULL, PUSH, SLOW][rng.gen_range(0..9)];
                    let size = match kind {
                        PULL | PUSH => rng.gen_range(1..40_000),
                        SLOW => rng.gen_range(0..(5 * HOST_TIMEOUT / 2) as usize),
                        _ => 0,
                    };
                    Req { kind, id, size }
                })
                .collect();
            w.slow_total += plan
                .iter()
                .filter(|r| r.kind == SLOW)
                .map(|r| r.size as Micros)
                .sum::<Micros>();
            w.procs.push(Proc {
                host: h,
                pid,
                role: Role::Client {
                    plan,
                    next: 0,
                    state: ClientState::Ready,
                    server,
                },
                runnable: true,
            });
        }
    }
    let limit: Micros = 120_000_000;
    while !w.all_done() {
        w.step();
        if w.all_done() {
            break;
        }
        let t = w.next_time();
        if t > limit || t == Micros::MAX {
            let stuck: Vec<String> = w
                .procs
                .iter()
                .filter(|p| {
                    matches!(
                        &p.role,
                        Role::Client {
                            state: ClientState::Sending { .. },
                            ..
                        }
                    )
                })
                .map(|p| format!("{}", p.pid))
                .collect();
            w.fail(format!("clients never finished: {stuck:?}"));
        }
        w.now = t;
    }
    let ok = w.results.iter().filter(|r| r.0).count();
    if w.faults.must_succeed() && ok != w.results.len() {
        w.fail(format!(
            "{} of {} sends failed on a network without partitions or crashes",
            w.results.len() - ok,
            w.results.len()
        ));
    }
    (ok, w.results.len(), w.digest ^ w.now)
}

#[test]
fn seeded_simulation() {
    let seeds: Vec<u64> = match std::env::var("VKERNEL_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("VKERNEL_SIM_SEED must be an integer")],
        Err(_) => {
            let n: u64 = std::env::var("VKERNEL_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(2000);
            (1..=n).collect()
        }
    };
    let mut by_outcome: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut ok, mut all) = (0, 0);
    for s in &seeds {
        let (o, a, _) = scenario(*s);
        ok += o;
        all += a;
        *by_outcome
            .entry(if o == a { "all ok" } else { "some failed" })
            .or_default() += 1;
    }
    eprintln!(
        "simulated {} seeds: {ok}/{all} sends succeeded; scenarios {by_outcome:?}",
        seeds.len()
    );
    assert!(all > 0);
}

#[test]
fn same_seed_same_run() {
    for seed in [3, 17, 99, 1234] {
        assert_eq!(
            scenario(seed),
            scenario(seed),
            "seed {seed} is not reproducible"
        );
    }
}
