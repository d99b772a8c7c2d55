//! A remote Send without a segment run by the sending thread itself, on
//! its answer socket, outside the engine (docs/PROTOCOL.md §8g): no engine
//! lock and no engine state for the exchange, so a client's Send costs
//! about what a plain UDP client's request costs.
//!
//! The exchange and its one driver are `crate::direct` (an attached
//! program's direct path runs the same, `attach/direct.rs`); this is the
//! embedded host's [`crate::direct::Route`]. The engine reserves the process a block of sequence numbers
//! ([`LEASE`]) from its own counter and says where the destination host
//! is; any Send the engine makes for the process ends the block, so that
//! every receiver sees one increasing order per sender.
//!
//! What the engine does not see is counted as it would count it, in a
//! `Stats` of the host's ([`Tally`]) that joins the engine's whenever the
//! host's counters are read: each Send's datagrams and its exchange, as
//! the Send ends (or at once, for a retransmission).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use vkernel_proto::direct::Timing;
use vkernel_proto::rtt::{PeerTimes, Rtt};
use vkernel_proto::{Config, Engine, HostId, Pid, Stats};

use crate::direct::{Ev, Route, Seqs, LEASE};

/// Events a process keeps when another holds the host's [`Tally`],
/// before it waits for it.
const TALLY_PENDING: usize = 64;

/// Where a destination host is, and what the engine knew of it when it
/// was looked up (the start of its entry in [`Peers`], if it had none).
#[derive(Clone, Copy)]
struct Dest {
    host: HostId,
    at: SocketAddr,
    rtt: Rtt,
}

/// What the host knows of each peer host's round trips: the engine's own
/// store (`Engine::peer_times`), one per logical host, which its direct
/// senders share with it, so that a sender whose first copy is due while
/// the peer serves older Sends — of either — waits, and every sample and
/// needless copy teaches both. Taken from the engine at the first lease.
#[derive(Default)]
pub(crate) struct Peers(std::sync::OnceLock<std::sync::Arc<PeerTimes>>);

impl Peers {
    /// Takes the engine's store (once).
    pub(crate) fn adopt(&self, e: &Engine) {
        self.0.get_or_init(|| e.peer_times());
    }

    /// Runs `f` on what is known of `d`'s host.
    fn with<R>(&self, d: &Dest, f: impl FnOnce(&mut Rtt) -> R) -> R {
        match self.0.get() {
            Some(t) => t.with(d.host, || d.rtt, f),
            // (Not reached: a lease is made under the engine lock first.)
            None => {
                let mut r = d.rtt;
                f(&mut r)
            }
        }
    }
}

/// What a process keeps for its direct Sends (boxed, made by its first).
pub(crate) struct Lease {
    seqs: Seqs,
    /// The process's principal (its Sends carry it).
    pub(crate) principal: u32,
    reply_port: u16,
    /// The engine's settings (its timers).
    cfg: Config,
    /// The last destination (one: a client mostly talks to one server).
    dest: Option<Dest>,
    /// Counted here, not yet in the host's counters.
    events: Vec<Ev>,
    /// The host keeps detailed metrics (`Config::metrics`).
    metrics: bool,
    /// The datagram being sent.
    pub(crate) out: Vec<u8>,
    /// The host's keys (as of the lease).
    sealer: Option<vkernel_proto::auth::Sealer>,
}

/// The counters of the host's direct Sends, as the engine keeps its own:
/// added to the engine's when they are read.
#[derive(Default)]
pub(crate) struct Tally(Mutex<Stats>);

impl Tally {
    /// Adds the events an attached program reported (`payload`, 16-byte
    /// records; any that are not events are skipped) as the host's own
    /// direct Sends' are added; its spans go to the host's exporter.
    pub(crate) fn report(&self, sh: &crate::kernel::Shared, payload: &[u8], metrics: bool) {
        let evs = Ev::decode_all(payload);
        let n = Ev::apply(&mut lock(&self.0), &evs, metrics);
        sh.net.counters.direct_sends.fetch_add(n, Ordering::Relaxed);
        #[cfg(feature = "otel")]
        if let Some(spans) = &sh.otel {
            for e in &evs {
                if let Ev::Span(sp) = e {
                    spans.reported(sp);
                }
            }
        }
    }

    /// Keeps what a destroyed process's peer page counted.
    pub(crate) fn fold_peer(&self, p: &crate::process::LocalPeer, metrics: bool) {
        p.fold_into(&mut lock(&self.0), metrics);
    }

    /// Adds the counters to `s`, the engine's.
    pub(crate) fn fold_into(&self, s: &mut Stats) {
        s.merge_from(&lock(&self.0));
    }

    /// Drops the counters of a peer host found gone.
    pub(crate) fn forget_peer(&self, peer: u16) {
        lock(&self.0).forget_peer(peer);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Lease {
    /// A process's first lease: `e` reserves the numbers, under the
    /// engine lock.
    pub(crate) fn new(e: &mut Engine, me: Pid) -> Lease {
        let cfg = e.config().clone();
        let (reply_port, metrics) = (cfg.reply_port, cfg.metrics);
        Lease {
            seqs: Seqs::new(e.reserve_seqs(LEASE), LEASE),
            principal: e.principal_of(me),
            reply_port,
            cfg,
            dest: None,
            events: Vec::with_capacity(8),
            metrics,
            out: Vec::with_capacity(128),
            sealer: e.sealer(),
        }
    }

    /// The sequence number the next direct Send will carry, if any is
    /// left.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn next_seq(&self) -> Option<u32> {
        self.seqs.peek()
    }

    /// Whether a Send to `host` may go now without the engine: numbers
    /// left, and the host's location known.
    pub(crate) fn ready_for(&self, host: HostId) -> bool {
        self.seqs.any() && self.dest.is_some_and(|d| d.host == host)
    }

    /// Under the engine lock: new numbers if none are left, and where
    /// `host` is (false: the engine does not know; the Send goes through
    /// it, which finds the host).
    pub(crate) fn renew(&mut self, e: &mut Engine, now: u64, host: HostId) -> bool {
        if !self.seqs.any() {
            self.seqs = Seqs::new(e.reserve_seqs(LEASE), LEASE);
        }
        if self.dest.is_some_and(|d| d.host == host) {
            return true;
        }
        match e.location_of(host) {
            Some(at) => {
                self.dest = Some(Dest {
                    host,
                    at,
                    rtt: e.rtt_of(now, host),
                });
                true
            }
            None => false,
        }
    }

    /// The engine is about to send for the process: these numbers would
    /// now be older than its.
    pub(crate) fn end(&mut self) {
        self.seqs.end();
    }

    /// Hands what was counted here to the host's `t`, and the Sends begun
    /// to `sends` (unless another process holds `t` and `wait` is false:
    /// then later, up to [`TALLY_PENDING`] events).
    pub(crate) fn flush(&mut self, t: &Tally, sends: &AtomicU64, wait: bool) {
        if self.events.is_empty() {
            return;
        }
        let g = if wait || self.events.len() >= TALLY_PENDING {
            Some(lock(&t.0))
        } else {
            t.0.try_lock().ok()
        };
        if let Some(mut g) = g {
            let n = Ev::apply(&mut g, &self.events, self.metrics);
            drop(g);
            sends.fetch_add(n, Ordering::Relaxed);
            self.events.clear();
        }
    }
}

/// The host's side of direct Sends: what they share.
pub(crate) struct Host<'a> {
    /// What is known of peer hosts.
    pub(crate) peers: &'a Peers,
    /// The counters.
    pub(crate) tally: &'a Tally,
    /// The count of direct Sends (`NetCounters::direct_sends`).
    pub(crate) sends: &'a AtomicU64,
}

/// An embedded process's [`Route`]: its [`Lease`] and its host's shares.
pub(crate) struct Embedded<'a> {
    pub(crate) lease: &'a mut Lease,
    pub(crate) host: &'a Host<'a>,
}

impl Route for Embedded<'_> {
    fn take_seq(&mut self) -> Option<u32> {
        self.lease.seqs.take()
    }

    fn location(&self, host: HostId) -> Option<SocketAddr> {
        self.lease.dest.filter(|d| d.host == host).map(|d| d.at)
    }

    fn timing(&mut self, host: HostId, now: u64) -> Timing {
        let cfg = &self.lease.cfg;
        match self.lease.dest.filter(|d| d.host == host) {
            Some(d) => self.host.peers.with(&d, |r| Timing::new(cfg, r, now)),
            None => Timing::new(cfg, &Rtt::new(), now),
        }
    }

    fn with_peer<T>(&mut self, host: HostId, now: u64, f: impl FnOnce(&mut Rtt) -> T) -> T {
        match self.lease.dest.filter(|d| d.host == host) {
            Some(d) => self.host.peers.with(&d, f),
            // (Not reached: Sends go only to the lease's destination.)
            None => f(&mut Rtt::for_peer(
                now,
                None,
                self.lease.cfg.local_send_floor,
            )),
        }
    }

    fn count(&mut self, e: Ev) {
        self.lease.events.push(e);
    }

    fn publish(&mut self) {
        self.lease.flush(self.host.tally, self.host.sends, true);
    }

    fn forget(&mut self, _host: HostId) {
        self.lease.dest = None;
    }

    fn reply_port(&self) -> u16 {
        self.lease.reply_port
    }

    fn sealer(&self) -> Option<&vkernel_proto::auth::Sealer> {
        self.lease.sealer.as_ref()
    }
}
