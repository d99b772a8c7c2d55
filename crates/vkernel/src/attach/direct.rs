//! An attached process's remote Sends, sent and answered on a socket of
//! its own (docs/PROTOCOL.md §8f): no thread of the host runs, so a
//! remote exchange costs the program what it costs an embedded one.
//!
//! The host grants it (`ask::DIRECT`) and reserves sequence numbers for
//! the process, so its own exchanges and those the host runs for it (any
//! Send with a segment, a group Send) stay in one increasing order at every
//! receiver. Any Send through the host ends the reservation. The exchange
//! and its driver are `crate::direct`'s, as for an embedded process; this
//! is the attached process's [`Route`] and [`Io`].

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use std::sync::Arc;
use vkernel_proto::direct::Timing;

use vkernel_proto::rtt::{PeerTimes, Rtt};
use vkernel_proto::{Config, HostId, IpcError, Message, Micros, Pid};

use crate::deadline::Deadline;
use crate::direct::{self, Ev, Io, Route, Seqs, LEASE};
use crate::net::{FaultConfig, FaultState, NetCounters};
use crate::process::WaitCounts;
use crate::spin::{Spin, SpinPolicy};

use super::wait::Pace;

/// A location the host did not know is asked for again after this long
/// (µs); meanwhile Sends there go through the host, which finds it.
const UNKNOWN_FOR: u64 = 50_000;

/// The longest a blocked wait lasts before the host's presence is checked.
const SLICE_US: u64 = 512_000;

pub(crate) use crate::direct::Went;

/// Traces a datagram sent (true) or received.
pub(crate) type TraceFn<'a> = dyn Fn(bool, &[u8]) + 'a;

/// What a process's wait on the direct path may use and must report.
pub(crate) struct Waiting<'a> {
    pub(crate) pace: &'a Pace,
    pub(crate) policy: &'a mut SpinPolicy,
    pub(crate) waits: &'a mut WaitCounts,
    /// Why to stop waiting (the host went, the program detached).
    pub(crate) gone: &'a dyn Fn() -> Option<IpcError>,
    /// The Send's deadline, a time of `pace.clock`.
    pub(crate) deadline: Deadline,
    /// Traces each datagram sent (true) or received, if the host traces.
    pub(crate) trace: Option<&'a TraceFn<'a>>,
}

/// A process's socket and what it knows for its direct Sends.
pub(crate) struct DirectPath {
    sock: Arc<UdpSocket>,
    /// The host's fault injector, applied to this socket (its own stream).
    faults: Option<std::sync::Mutex<FaultState>>,
    /// `sock`'s port, which the host wakes (an empty datagram) when it
    /// destroys the process.
    port: u16,
    out: Vec<u8>,
    rx: Vec<u8>,
    /// Its [`Route`].
    known: Known,
}

/// What an attached process knows for its direct Sends: its [`Route`].
struct Known {
    /// The host's main socket port (`reply_port` of every datagram).
    reply_port: u16,
    seqs: Seqs,
    /// Where hosts are (None: the host did not know, as of then).
    locs: HashMap<HostId, (Option<SocketAddr>, u64)>,
    /// What the program knows of peer hosts, shared by its processes.
    rtt: Arc<PeerTimes>,
    cfg: Config,
    /// What its direct Sends did, not yet handed to the program's report.
    events: Vec<Ev>,
    /// The keyed host's keys and counter.
    sealer: Option<vkernel_proto::auth::Sealer>,
    /// How far the host's clock is ahead of this program's (µs), as of
    /// its last answer.
    host_ahead: Option<i64>,
}

impl Known {
    fn location_of(&self, host: HostId) -> Option<SocketAddr> {
        self.locs.get(&host).and_then(|(a, _)| *a)
    }
}

impl DirectPath {
    /// A socket on the host's address (its IP, any port).
    pub(crate) fn new(host_addr: SocketAddr, peers: Arc<PeerTimes>) -> io::Result<DirectPath> {
        let sock = UdpSocket::bind(SocketAddr::new(host_addr.ip(), 0))?;
        let port = sock.local_addr()?.port();
        Ok(DirectPath {
            sock: Arc::new(sock),
            faults: None,
            port,
            out: Vec::with_capacity(256),
            rx: vec![0; vkernel_proto::wire::MAX_DATAGRAM],
            known: Known {
                reply_port: host_addr.port(),
                seqs: Seqs::default(),
                locs: HashMap::new(),
                rtt: peers,
                cfg: Config::default(),
                events: Vec::new(),
                sealer: None,
                host_ahead: None,
            },
        })
    }

    /// The socket's port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Whether the host must be asked before a Send to `host` (its
    /// location is not known, or no sequence numbers are left), and how
    /// many numbers to ask for.
    pub(crate) fn must_ask(&self, host: HostId, now: u64) -> Option<u32> {
        let n = if self.known.seqs.any() { 0 } else { LEASE };
        match self.known.locs.get(&host) {
            // Recently unknown: through the host, which finds it.
            Some((None, at)) if now.saturating_sub(*at) < UNKNOWN_FOR => None,
            Some((Some(_), _)) if n == 0 => None,
            _ => Some(n),
        }
    }

    /// The sequence number the next Send takes, if any is left (its
    /// span's key, as the engine's).
    pub(crate) fn next_seq(&self) -> Option<u32> {
        self.known.seqs.peek()
    }

    /// Whether a Send to `host` goes the direct way now.
    pub(crate) fn can_send(&self, host: HostId) -> bool {
        self.known.seqs.any() && self.known.location_of(host).is_some()
    }

    /// What the host said: where `host` is, and `n` sequence numbers from
    /// `first` (`n` = 0: none new).
    pub(crate) fn learn(
        &mut self,
        host: HostId,
        at: Option<SocketAddr>,
        first: u32,
        n: u32,
        now: u64,
    ) {
        self.known.locs.insert(host, (at, now));
        if n > 0 {
            self.known.seqs = Seqs::new(first, n);
        }
    }

    /// Applies the host's faults (`spec` as `FaultConfig::parse` reads it),
    /// once.
    pub(crate) fn set_faults(&mut self, spec: &str) {
        if self.faults.is_none() {
            if let Ok(f) = FaultConfig::parse(spec) {
                self.faults = FaultState::for_config(f);
            }
        }
    }

    /// The host's clock read `text` (µs) when it answered at about `now`
    /// here: their difference, to move lent timing between the clocks.
    pub(crate) fn set_host_clock(&mut self, text: &str, now: Micros) {
        if let Ok(t) = text.parse::<u64>() {
            self.known.host_ahead =
                Some((t as i128 - now as i128).clamp(i64::MIN.into(), i64::MAX.into()) as i64);
        }
    }

    /// What the host lent of `host`'s timing (`words` as
    /// `Rtt::to_words`, on its clock) joins what this program knows, if
    /// newer.
    pub(crate) fn take_lent(&mut self, host: HostId, words: &str, _now: Micros) {
        let Some(ahead) = self.known.host_ahead else {
            return;
        };
        let w: Vec<u64> = words.split(',').filter_map(|x| x.parse().ok()).collect();
        if let Ok(w) = <[u64; 9]>::try_from(w) {
            let r = Rtt::from_words(w).shifted(-ahead);
            self.known.rtt.merge(host, r);
        }
    }

    /// What this program learned of `host`'s timing, on the host's clock,
    /// to hand back with its next question (`rtt=W0,…,W8`).
    pub(crate) fn lend_back(&self, host: HostId) -> Option<String> {
        let ahead = self.known.host_ahead?;
        let r = self.known.rtt.get(host)?.shifted(ahead);
        let w: Vec<String> = r.to_words().iter().map(u64::to_string).collect();
        Some(format!("rtt={}", w.join(",")))
    }

    /// Seals with the keyed host's keys (None: the host has none).
    pub(crate) fn set_sealer(&mut self, s: Option<vkernel_proto::auth::Sealer>) {
        self.known.sealer = s;
    }

    /// The host's timers, as its answer gives them (µs: host timeout,
    /// least, greatest and first retransmission timeout, the floor for a
    /// peer on this machine); anything else leaves them as they are.
    pub(crate) fn set_timers(&mut self, text: &str) {
        let v: Vec<u64> = text.split(',').filter_map(|t| t.parse().ok()).collect();
        if let [host_timeout, min_rto, max_rto, initial_rto, floor] = v[..] {
            if host_timeout > 0 && min_rto > 0 && min_rto <= max_rto {
                let c = &mut self.known.cfg;
                c.host_timeout = host_timeout;
                c.min_rto = min_rto;
                c.max_rto = max_rto;
                c.initial_rto = initial_rto.max(min_rto);
                c.local_send_floor = floor;
            }
        }
    }

    /// The host is about to send for this process: the reserved numbers
    /// would now be older than its.
    pub(crate) fn end_lease(&mut self) {
        self.known.seqs.end();
    }

    /// What its direct Sends did since this was last asked (for the
    /// host's counters).
    pub(crate) fn events(&mut self) -> &mut Vec<Ev> {
        &mut self.known.events
    }

    /// Runs `src`'s Send of `msg` to `to` (as forwarded by `fwd`) on this
    /// socket until it is answered, fails or is forwarded out of reach.
    /// Call only when [`DirectPath::can_send`] says so.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        w: &mut Waiting<'_>,
        counters: &NetCounters,
        src: Pid,
        to: Pid,
        fwd: Pid,
        msg: Message,
        principal: u32,
    ) -> Went {
        let start = w.pace.clock.now();
        let adaptive = w.policy.is_adaptive();
        let spin = Spin::begin(&*w.policy, start, 0, w.pace.cpus, || {
            w.pace.run_queue.contended(start, w.pace.cpus)
        });
        let call = direct::Call {
            me: src,
            to,
            forwarder: fwd,
            msg,
            principal,
            deadline: w.deadline,
            spin,
            // Told never to spin: block at once (no empty read first).
            block_at_once: spin.budget_us() == 0 && !adaptive,
        };
        let mut io = SocketIo {
            sock: &self.sock,
            faults: self.faults.as_ref(),
            counters,
            trace: w.trace,
            pace: w.pace,
            gone: w.gone,
        };
        let (went, blocked, resent) =
            direct::send(&mut self.known, &mut io, &mut self.rx, &mut self.out, &call);
        // (A wait that ran through a retransmission timeout says nothing
        // of how long an answer takes: the policy does not learn from it.)
        if !resent {
            spin.end(w.policy, w.pace.clock.now());
        }
        if blocked {
            w.waits.blocked += 1;
        } else {
            w.waits.unblocked += 1;
        }
        went
    }
}

impl Route for Known {
    fn take_seq(&mut self) -> Option<u32> {
        self.seqs.take()
    }

    fn location(&self, host: HostId) -> Option<SocketAddr> {
        self.seqs.any().then(|| self.location_of(host)).flatten()
    }

    fn timing(&mut self, host: HostId, now: u64) -> Timing {
        let cfg = self.cfg.clone();
        self.with_peer(host, now, |r| Timing::new(&cfg, r, now))
    }

    fn with_peer<T>(&mut self, host: HostId, now: Micros, f: impl FnOnce(&mut Rtt) -> T) -> T {
        let at = self.location_of(host);
        let floor = self.cfg.local_send_floor;
        self.rtt.with(host, || Rtt::for_peer(now, at, floor), f)
    }

    fn count(&mut self, e: Ev) {
        self.events.push(e);
    }

    fn forget(&mut self, host: HostId) {
        self.locs.remove(&host);
    }

    fn reply_port(&self) -> u16 {
        self.reply_port
    }

    fn sealer(&self) -> Option<&vkernel_proto::auth::Sealer> {
        self.sealer.as_ref()
    }
}

/// An attached process's thread on its direct socket.
struct SocketIo<'a> {
    sock: &'a Arc<UdpSocket>,
    faults: Option<&'a std::sync::Mutex<FaultState>>,
    counters: &'a NetCounters,
    trace: Option<&'a TraceFn<'a>>,
    pace: &'a Pace,
    gone: &'a dyn Fn() -> Option<IpcError>,
}

impl Io for SocketIo<'_> {
    fn now(&self) -> u64 {
        self.pace.clock.now()
    }

    fn send(&mut self, to: SocketAddr, data: &[u8]) {
        if let Some(t) = self.trace {
            t(true, data);
        }
        // A send that fails is as a datagram lost: retransmission and the
        // host timeout deal with it.
        let send = |_: Option<&Arc<UdpSocket>>, to: SocketAddr, d: &[u8]| {
            let _ = rustix::net::sendto(&**self.sock, d, rustix::net::SendFlags::empty(), &to);
        };
        match self.faults {
            Some(f) => {
                FaultState::inject(f, self.counters, None, to, data.to_vec(), send);
            }
            None => send(None, to, data),
        }
    }

    fn recv(&mut self, buf: &mut [u8], mut wait_us: u64, mut exact: bool) -> Option<usize> {
        // Datagrams the faults kept back leave when due.
        if let Some(f) = self.faults {
            let next = FaultState::flush(f, |_, to, d| {
                let _ = rustix::net::sendto(&**self.sock, d, rustix::net::SendFlags::empty(), &to);
            });
            let until = next.saturating_duration_since(std::time::Instant::now());
            let until = u64::try_from(until.as_micros()).unwrap_or(u64::MAX).max(1);
            if wait_us > until {
                (wait_us, exact) = (until, false);
            }
        }
        // Answers may come from any socket of the peer host (its side
        // sockets too), so this socket is not connected; what is read
        // is checked by its header.
        let r = if wait_us == 0 {
            loop {
                match rustix::net::recv(self.sock, &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
                    Err(rustix::io::Errno::INTR) => continue,
                    r => break r.map(|(n, _)| n),
                }
            }
        } else {
            // At most a slice, so that the host's presence is checked.
            let exact = exact && wait_us <= SLICE_US;
            let wait = Duration::from_micros(wait_us.min(SLICE_US));
            crate::waiter::recv_answer_within(self.sock, buf, wait, exact).map(|(n, _, _)| n)
        };
        match r {
            // (Empty: the host's wake-up; the driver looks at `gone`.)
            Ok(n) if n > 0 => {
                if let Some(t) = self.trace {
                    t(false, buf.get(..n).unwrap_or_default());
                }
                Some(n)
            }
            _ => None,
        }
    }

    fn gone(&self) -> Option<IpcError> {
        (self.gone)()
    }

    fn contended(&mut self, now: u64) -> bool {
        self.pace.run_queue.contended(now, self.pace.cpus)
    }
}
