//! A remote Send without a segment run by the sending thread itself, on
//! its answer socket, outside the engine (docs/PROTOCOL.md §8g): no engine
//! lock and no engine state for the exchange, so a client's Send costs
//! about what a plain UDP client's request costs.
//!
//! The exchange is `vkernel_proto::direct::DirectSend` (an attached
//! program's direct path runs the same machine, `attach/direct.rs`). The
//! engine reserves the process a block of sequence numbers
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

use vkernel_proto::direct::{DirectSend, Outcome, Timer, Timing};
use vkernel_proto::rtt::Rtt;
use vkernel_proto::wire::PacketType;
use vkernel_proto::{Config, DropReason, Engine, HostId, IpcError, Message, Pid, ReplyInfo, Stats};

/// Sequence numbers a process reserves at a time.
pub(crate) const LEASE: u32 = 1024;

/// Events a process keeps when another holds the host's [`Tally`],
/// before it waits for it.
const TALLY_PENDING: usize = 64;

/// Where a destination host is, and its round-trip state as this process
/// last saw it in [`Peers`] (the engine's, when it was looked up).
#[derive(Clone, Copy)]
struct Dest {
    host: HostId,
    at: SocketAddr,
    rtt: Rtt,
}

/// Slots of [`Peers`].
const PEER_SLOTS: usize = 8;

/// What the host's direct senders know of each peer host, together: its
/// round trips, and which of their Sends it answered lately, so that a
/// sender whose first copy is due while the peer serves older ones waits
/// (as the engine's senders do, sharing its `Rtt`s). A few slots by host
/// id; a host taking another's slot starts from the engine's state.
#[derive(Default)]
pub(crate) struct Peers([Mutex<Option<(HostId, Rtt)>>; PEER_SLOTS]);

impl Peers {
    /// Runs `f` on what is known of `d`'s host.
    fn with<R>(&self, d: &Dest, f: impl FnOnce(&mut Rtt) -> R) -> R {
        let mut g = lock(&self.0[usize::from(d.host.0) % PEER_SLOTS]);
        match &mut *g {
            Some((h, rtt)) if *h == d.host => f(rtt),
            other => {
                let (_, rtt) = other.insert((d.host, d.rtt));
                f(rtt)
            }
        }
    }
}

/// A block of sequence numbers reserved by a host for one process's own
/// Sends (here and in `attach/direct.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seqs {
    next: u32,
    left: u32,
}

impl Seqs {
    /// `n` numbers from `first`.
    pub(crate) fn new(first: u32, n: u32) -> Seqs {
        Seqs {
            next: first,
            left: n,
        }
    }

    /// Numbers are left.
    pub(crate) fn any(&self) -> bool {
        self.left > 0
    }

    /// The next number, if any is left.
    pub(crate) fn take(&mut self) -> Option<u32> {
        if self.left == 0 {
            return None;
        }
        let s = self.next;
        self.next = s.wrapping_add(1);
        self.left -= 1;
        Some(s)
    }

    /// Gives the rest up (the host sends for the process now).
    pub(crate) fn end(&mut self) {
        self.left = 0;
    }
}

/// What a process keeps for its direct Sends (boxed, made by its first).
pub(crate) struct Lease {
    seqs: Seqs,
    principal: u32,
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
    out: Vec<u8>,
}

/// What a direct Send did that the engine's counters show.
#[derive(Clone, Copy, Debug)]
enum Ev {
    /// A datagram sent (`tx`) or received, of `bytes`, to or from `peer`.
    Datagram {
        tx: bool,
        peer: HostId,
        ptype: PacketType,
        bytes: usize,
    },
    /// A Send begun this way.
    Begun,
    /// A RemoteSend sent again.
    Retransmit,
    /// A retransmission found needless.
    Needless,
    /// A datagram read that answered nothing here.
    Ignored(DropReason),
    /// An exchange replied to, after `latency` µs.
    Exchange { latency: u64 },
    /// A Send that failed with `Timeout` (the peer silent) or `Deadline`.
    TimedOut { deadline: bool },
}

/// The counters of the host's direct Sends, as the engine keeps its own:
/// added to the engine's when they are read.
#[derive(Default)]
pub(crate) struct Tally(Mutex<Stats>);

impl Tally {
    /// Adds the counters to `s`, the engine's.
    pub(crate) fn fold_into(&self, s: &mut Stats) {
        s.merge_from(&lock(&self.0));
    }

    fn apply(s: &mut Stats, evs: &[Ev], metrics: bool) -> u64 {
        let mut sends = 0;
        for e in evs {
            match *e {
                Ev::Datagram {
                    tx,
                    peer,
                    ptype,
                    bytes,
                } => s.count_datagram(tx, peer.0, ptype, bytes, metrics),
                Ev::Begun => sends += 1,
                Ev::Retransmit => s.retransmits += 1,
                Ev::Needless => s.retransmits_needless += 1,
                Ev::Ignored(r) => s.drops[r as usize] += 1,
                Ev::Exchange { latency } => {
                    s.remote_exchanges += 1;
                    if metrics {
                        s.remote_latency_us.record(latency);
                    }
                }
                Ev::TimedOut { deadline } => {
                    if deadline {
                        s.deadlines += 1;
                    } else {
                        s.timeouts += 1;
                    }
                }
            }
        }
        sends
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
        }
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
            let n = Tally::apply(&mut g, &self.events, self.metrics);
            drop(g);
            sends.fetch_add(n, Ordering::Relaxed);
            self.events.clear();
        }
    }

    fn count(&mut self, e: Ev) {
        self.events.push(e);
    }

    fn datagram(&mut self, tx: bool, peer: HostId, ptype: PacketType, bytes: usize) {
        self.count(Ev::Datagram {
            tx,
            peer,
            ptype,
            bytes,
        });
    }

    fn take_seq(&mut self) -> Option<u32> {
        self.seqs.take()
    }
}

/// How a direct Send ended (here and in `attach/direct.rs`).
pub(crate) enum Went {
    /// Replied to, or failed.
    Done(Result<ReplyInfo, IpcError>),
    /// Forwarded where this path does not follow (a host it does not
    /// know, or its own): send `msg` to `to` through the host, as
    /// forwarded by `forwarder`.
    Forwarded {
        to: Pid,
        forwarder: Pid,
        msg: Message,
    },
}

/// What the sending thread provides: its clock, its socket, and how it
/// waits.
pub(crate) trait Io {
    /// The engine's clock (µs).
    fn now(&self) -> u64;
    /// Sends `data` to `to` (a failure is as a loss).
    fn send(&mut self, to: SocketAddr, data: &[u8]);
    /// Reads one datagram into `buf`: at once if `wait_us` is 0, else
    /// waiting at most about that long (`exact`: not longer, as for the
    /// caller's deadline). None: nothing came.
    fn recv(&mut self, buf: &mut [u8], wait_us: u64, exact: bool) -> Option<usize>;
    /// Why to stop waiting (the process was destroyed, the host stops).
    fn gone(&self) -> Option<IpcError>;
    /// After a spinning wait's `turn`-th empty look: whether to block
    /// now, as other threads wait for the CPU (the server, say). (A
    /// thread that yields is usually followed by another spinner, not by
    /// the thread it waits for.)
    fn crowded(&mut self, turn: u32) -> bool;
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

/// One direct Send: what [`send`] runs.
pub(crate) struct Call {
    /// The sender.
    pub(crate) me: Pid,
    /// The receiver.
    pub(crate) to: Pid,
    /// The message.
    pub(crate) msg: Message,
    /// When it fails with `Deadline` (engine time), if ever.
    pub(crate) deadline: Option<u64>,
    /// How long to read without waiting before blocking (µs).
    pub(crate) spin_us: u64,
}

/// Runs `c` on `io` until it is answered, fails, its deadline passes, or
/// it is forwarded out of reach; `host` is what the host's direct senders
/// share, `buf` where datagrams are read. Whether it blocked, too. A
/// retransmission is counted in the host's counters at once. Call only
/// when [`Lease::ready_for`] the destination's host.
pub(crate) fn send(
    lease: &mut Lease,
    host: &Host<'_>,
    io: &mut dyn Io,
    buf: &mut [u8],
    c: &Call,
) -> (Went, bool) {
    let (me, to) = (c.me, c.to);
    let (Some(seq), Some(dest)) = (lease.take_seq(), lease.dest) else {
        return (
            Went::Forwarded {
                to,
                forwarder: me,
                msg: c.msg,
            },
            false,
        );
    };
    let start = io.now();
    let timing = Timing::new(&lease.cfg, &dest.rtt, start);
    let mut d = DirectSend::start(
        start,
        me,
        to,
        c.msg,
        seq,
        lease.principal,
        me,
        lease.reply_port,
        timing,
    );
    let mut out = std::mem::take(&mut lease.out);
    d.encode(false, &mut out);
    io.send(dest.at, &out);
    lease.count(Ev::Begun);
    lease.datagram(true, dest.host, PacketType::RemoteSend, out.len());
    // Told not to spin: block at once (no empty read first).
    let mut blocked = c.spin_us == 0;
    let mut turn: u32 = 0;
    let went = loop {
        let now = io.now();
        let due = now >= d.next_timer();
        let until = c.deadline.unwrap_or(u64::MAX).min(d.next_timer());
        let wait_us = if blocked && !due {
            until.saturating_sub(now).max(1)
        } else {
            0
        };
        // The caller's deadline is kept on time; a timer may run late.
        let exact = c.deadline == Some(until);
        // (When a timer is due, one more look first: the answer may have
        // come while this thread waited for a CPU; that is no loss.)
        if let Some(n) = io.recv(buf, wait_us, exact) {
            let now = io.now();
            let data = buf.get(..n).unwrap_or_default();
            let outcome = d.on_datagram(now, data);
            let ptype = match &outcome {
                Outcome::Ignored(r) => {
                    lease.count(Ev::Ignored(*r));
                    None
                }
                Outcome::Pending => Some(PacketType::ReplyPending),
                Outcome::Replied(_) => Some(PacketType::RemoteReply),
                Outcome::Failed(_) => Some(PacketType::NAck),
                Outcome::Forwarded { .. } => Some(PacketType::RemoteForward),
            };
            if let Some(t) = ptype {
                lease.datagram(false, d.dst().host(), t, n);
            }
            match outcome {
                Outcome::Replied(info) => {
                    if d.needless().is_some() {
                        lease.count(Ev::Needless);
                    }
                    lease.count(Ev::Exchange {
                        latency: now.saturating_sub(start),
                    });
                    if d.dst().host() == dest.host {
                        // (Waited for, not tried: a due Send decides by
                        // how recently the peer answered others.)
                        let seen = host.peers.with(&dest, |r| {
                            d.note_answer(now, r, true);
                            *r
                        });
                        if let Some(dd) = lease.dest.as_mut() {
                            dd.rtt = seen;
                        }
                    }
                    break Went::Done(Ok(info));
                }
                Outcome::Failed(e) => break Went::Done(Err(e)),
                Outcome::Forwarded { to } => {
                    let (forwarder, msg) = (d.forwarder(), d.msg());
                    // Followed here only within the host it knows.
                    let seq = (to.host() == dest.host && to.host() != me.host())
                        .then(|| lease.take_seq())
                        .flatten();
                    let Some(seq) = seq else {
                        break Went::Forwarded { to, forwarder, msg };
                    };
                    let timing = Timing::new(&lease.cfg, &dest.rtt, now);
                    d.restart(now, to, seq, timing);
                    d.encode(false, &mut out);
                    io.send(dest.at, &out);
                    lease.datagram(true, dest.host, PacketType::RemoteSend, out.len());
                }
                Outcome::Pending => {
                    host.peers.with(&dest, |r| d.note_answer(now, r, false));
                }
                Outcome::Ignored(_) => {}
            }
            continue;
        }
        let now = io.now();
        if c.deadline.is_some_and(|dl| now >= dl) {
            lease.count(Ev::TimedOut { deadline: true });
            break Went::Done(Err(IpcError::Deadline(d.dst())));
        }
        if now >= d.next_timer() {
            match host.peers.with(&dest, |r| d.on_timer_seen(now, r)) {
                Timer::Retransmit => {
                    d.encode(true, &mut out);
                    io.send(dest.at, &out);
                    lease.datagram(true, dest.host, PacketType::RemoteSend, out.len());
                    lease.count(Ev::Retransmit);
                    lease.flush(host.tally, host.sends, true);
                }
                Timer::Dead(e) => {
                    // Perhaps it moved: ask the engine next time.
                    lease.dest = None;
                    lease.count(Ev::TimedOut { deadline: false });
                    break Went::Done(Err(e));
                }
                Timer::Idle => {}
            }
        }
        if !blocked && now.saturating_sub(start) >= c.spin_us {
            blocked = true;
        }
        if !blocked {
            turn = turn.wrapping_add(1);
            blocked = io.crowded(turn);
        } else {
            if let Some(e) = io.gone() {
                break Went::Done(Err(e));
            }
        }
    };
    lease.out = out;
    (went, blocked)
}
