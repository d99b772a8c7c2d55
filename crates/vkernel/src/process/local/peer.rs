//! Threads of one program exchange through peer pages, as attached
//! programs do (`crate::peer_exchange`, `attach/peer.rs`): a Send to a
//! process of this host that waits in its inbox is written into it, and
//! the Reply into the sender's reply area, with no engine lock. Here the
//! pages are on the heap. The engine closes an inbox when it queues a
//! message for its owner (`Event::Queued`, `Waiter::queue_state`), so a
//! Send through the engine (remote, with a segment, to a group) is never
//! passed by one through the page.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vkernel_proto::stats::Histogram;
use vkernel_proto::{IpcError, Message, Pid, Stats};

use super::LocalProcess;
use crate::attach::peer::{self, Outcome, Peer};
use crate::deadline::Deadline;
use crate::peer_exchange::{Pages, PeerSend, Side};
use crate::trace::Phase;
use crate::vocab::{Incoming, Reply};

/// One exchange in this many is timed for the latency histogram; the
/// others count in the bucket of the last one timed (the count is exact).
const LATENCY_SAMPLE: u64 = 8;

/// A process's peer page on the heap, and what its Sends through pages
/// counted (read by the host's statistics while it lives).
#[derive(Default)]
pub(crate) struct LocalPeer {
    pub(crate) page: Peer,
    counts: [AtomicU64; 32],
    sums: [AtomicU64; 32],
}

impl LocalPeer {
    /// Counts one exchange (only the owner's thread writes: plain stores,
    /// no locked read-modify-write on the exchange's path).
    fn record(&self, bucket: usize, latency: u64) {
        let b = bucket.min(31);
        let (c, s) = (&self.counts[b], &self.sums[b]);
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        s.store(
            s.load(Ordering::Relaxed).saturating_add(latency),
            Ordering::Relaxed,
        );
    }

    /// Exchanges this process's Sends completed through pages.
    pub(crate) fn exchanges(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Adds what this process's Sends through pages counted to `s`: local
    /// exchanges, and their latencies if the host keeps histograms.
    pub(crate) fn fold_into(&self, s: &mut Stats, metrics: bool) {
        let mut h = Histogram::default();
        for b in 0..32 {
            h.counts[b] = self.counts[b].load(Ordering::Relaxed);
            h.sums[b] = self.sums[b].load(Ordering::Relaxed);
        }
        s.local_exchanges += h.counts.iter().sum::<u64>();
        if metrics {
            for b in 0..32 {
                s.local_latency_us.counts[b] += h.counts[b];
                s.local_latency_us.sums[b] += h.sums[b];
            }
        }
    }
}

/// A process's side of the peer path (boxed in the process: a process
/// without it is no larger).
pub(super) struct PeerSide {
    own: Arc<LocalPeer>,
    /// Other processes' pages (None: not one of this host's threads).
    pages: Pages<Arc<LocalPeer>>,
    /// Senders received through the inbox and not yet answered, with their
    /// exchange sequence.
    rx: RefCell<HashMap<Pid, u32>>,
    seq: Cell<u32>,
    principal: Cell<u32>,
    /// `restrict_senders` is in force: the engine must check senders.
    pub(super) restricted: Cell<bool>,
    /// Exchanges begun, and the last timed latency and its bucket.
    n: Cell<u64>,
    last: Cell<(usize, u64)>,
}

impl LocalProcess {
    /// Gives this process a peer page, if the host allows the path
    /// (`KernelConfig::direct_sends`).
    pub(crate) fn allow_peer(mut self) -> LocalProcess {
        let sh = &self.shared;
        if !sh.direct {
            return self;
        }
        let own = Arc::new(LocalPeer::default());
        own.page.owner.store(self.pid.0, Ordering::Relaxed);
        let principal = sh.with_engine(|e, _| {
            e.watch_queue(self.pid, true);
            e.principal_of(self.pid)
        });
        self.waiter.set_peer(own.clone());
        self.peer = Some(Box::new(PeerSide {
            own,
            pages: Pages::new(),
            rx: RefCell::default(),
            seq: Cell::new(0),
            principal: Cell::new(principal),
            restricted: Cell::new(false),
            n: Cell::new(0),
            last: Cell::new((0, 0)),
        }));
        self
    }

    fn side(&self) -> Side<'_> {
        Side {
            pace: &self.shared.pace,
            spin: &self.spin,
            waits: &self.waits,
            handoffs: Some(&self.shared.net.counters.handoffs),
            // A thread blocked in a page does not read the host's socket:
            // the background thread must look at who does.
            on_block: crate::attach::wait::OnBlock::Nudge(&self.shared.bg_efd),
            block_in_inbox: false,
            tick: Some(&*self.shared),
        }
    }

    /// Why a wait of this process must end.
    fn gone(&self) -> Option<IpcError> {
        if self.shared.stopping() {
            Some(IpcError::Shutdown)
        } else if self.waiter.destroyed.load(Ordering::Acquire) {
            Some(IpcError::Destroyed)
        } else {
            None
        }
    }

    /// The principal this process's Sends through pages carry.
    pub(super) fn peer_principal(&self, principal: u32) {
        if let Some(ps) = &self.peer {
            ps.principal.set(principal);
        }
    }

    /// `pid`'s page, if it is one of this host's threads' processes.
    fn page_of(&self, ps: &PeerSide, pid: Pid) -> Option<Arc<LocalPeer>> {
        ps.pages.get(pid, || self.shared.peer_of(pid))
    }

    /// Sends `msg` through `to`'s inbox, if it waits there.
    pub(super) fn peer_send(
        &self,
        msg: &mut Message,
        to: Pid,
        fwd: Pid,
        deadline: Deadline,
    ) -> PeerSend {
        let Some(ps) = &self.peer else {
            return PeerSend::NotHere;
        };
        let sh = &self.shared;
        if !crate::peer_exchange::reachable(self.pid, sh.host, to) || self.gone().is_some() {
            return PeerSend::NotHere;
        }
        let Some(dest) = self.page_of(ps, to) else {
            return PeerSend::NotHere;
        };
        let n = ps.n.get();
        ps.n.set(n + 1);
        let timed = n.is_multiple_of(LATENCY_SAMPLE);
        let start = if timed { sh.pace.clock.now() } else { 0 };
        let seq = peer::next_seq(ps.seq.get());
        ps.seq.set(seq);
        let sent = crate::peer_exchange::send(
            &self.side(),
            &ps.own.page,
            &dest.page,
            self.pid,
            to,
            seq,
            ps.principal.get(),
            fwd,
            msg,
            deadline,
            || self.gone(),
        );
        let how = match sent.outcome(to, &ps.pages) {
            Ok(how) => how,
            Err(None) => return PeerSend::NotHere,
            Err(Some(e)) => return PeerSend::Done(Err(e)),
        };
        match how {
            Outcome::Replied { from, msg: m } => {
                *msg = m;
                let (b, latency) = if timed {
                    let l = sh.pace.clock.now().saturating_sub(start);
                    let v = (Histogram::bucket(l), l);
                    ps.last.set(v);
                    v
                } else {
                    ps.last.get()
                };
                ps.own.record(b, latency);
                PeerSend::Done(Ok(Reply { from, seg_bytes: 0 }))
            }
            Outcome::Failed(e) => PeerSend::Done(Err(self.gone().unwrap_or(e))),
            Outcome::Forwarded {
                to,
                forwarder,
                msg: m,
            } => {
                *msg = m;
                PeerSend::Forwarded { to, forwarder }
            }
        }
    }

    /// A Send without a segment through peer pages, while its receivers
    /// wait in their inboxes (following forwards among them): the
    /// exchange's end, or what is left to send through the engine (to,
    /// forwarder, the time left).
    #[allow(clippy::type_complexity)]
    pub(super) fn send_by_pages(
        &self,
        msg: &mut Message,
        to: Pid,
        fwd: Pid,
        deadline: Option<std::time::Duration>,
    ) -> Result<Result<Reply, IpcError>, (Pid, Pid, Option<std::time::Duration>)> {
        if self.peer.is_none() || to.host() != self.shared.host {
            return Err((to, fwd, deadline));
        }
        let clock = &self.shared.pace.clock;
        let at = Deadline::after_now(|| clock.now(), deadline);
        #[cfg(feature = "otel")]
        let t0 = self.shared.otel.is_some().then(std::time::SystemTime::now);
        let (mut to, mut fwd) = (to, fwd);
        loop {
            match self.peer_send(msg, to, fwd, at) {
                PeerSend::Done(r) => {
                    let by = r.as_ref().map_or(to, |r| r.from);
                    #[cfg(feature = "otel")]
                    if let (Some(t0), Some(ps)) = (t0, &self.peer) {
                        let by = r.as_ref().map(|r| r.from).map_err(|e| e.to_string());
                        self.otel_page_send(t0, to, ps.seq.get(), by);
                    }
                    // (Recorded once it is over: a trace event is only
                    // made for an exchange that went this way.)
                    if let Some(t) = &self.shared.tracer {
                        t.phase(Phase::Send, self.pid, to, true);
                        t.phase(Phase::Complete, self.pid, by, r.is_ok());
                    }
                    return Ok(r);
                }
                PeerSend::Forwarded { to: t, forwarder } => (to, fwd) = (t, forwarder),
                PeerSend::NotHere => return Err((to, fwd, at.left(clock.now()))),
            }
        }
    }

    /// A plain Receive through the inbox, unless messages wait in the
    /// engine (or the engine must check senders). None: through the engine.
    pub(super) fn peer_receive(&self, msg: &mut Message) -> Option<Result<Incoming, IpcError>> {
        let ps = self.peer.as_ref()?;
        // (A server of remote clients waits for datagrams: in the engine,
        // reading the socket.)
        if ps.restricted.get()
            || self.last_from_remote.get()
            || ps.own.page.queued.load(Ordering::Relaxed) != 0
        {
            return None;
        }
        // Held replies leave before this process waits (nothing is
        // queued: it would).
        self.flush_replies();
        let r = crate::peer_exchange::receive(&self.side(), &ps.own.page, || self.gone())?;
        Some(match r {
            Ok(i) => {
                ps.rx.borrow_mut().insert(i.from, i.seq);
                *msg = i.msg;
                self.last_from_remote.set(false);
                if let Some(t) = &self.shared.tracer {
                    t.phase(Phase::Deliver, i.from, self.pid, true);
                }
                #[cfg(feature = "otel")]
                self.otel_page_deliver(i.from, i.seq);
                Ok(Incoming {
                    from: i.from,
                    seg_bytes: 0,
                    forwarder: i.forwarder,
                    principal: i.principal,
                })
            }
            Err(e) => Err(self.gone().unwrap_or(e)),
        })
    }

    /// Whether `pid`'s Send came through this process's inbox and awaits
    /// its answer here.
    pub(super) fn peer_holds(&self, pid: Pid) -> bool {
        self.peer
            .as_ref()
            .is_some_and(|ps| ps.rx.borrow().contains_key(&pid))
    }

    /// Reply to `to`, if its Send came through the inbox.
    pub(super) fn peer_reply(&self, msg: &Message, to: Pid) -> Option<Result<(), IpcError>> {
        let how = Outcome::Replied {
            from: self.pid,
            msg: *msg,
        };
        self.peer_answer(to, how)
    }

    /// Forward of `from`'s Send to `to`, if it came through the inbox: the
    /// sender sends it on, as from this process.
    pub(super) fn peer_forward(
        &self,
        msg: &Message,
        from: Pid,
        to: Pid,
    ) -> Option<Result<(), IpcError>> {
        if !self.peer_holds(from) {
            return None;
        }
        if !to.is_process() {
            return Some(Err(IpcError::InvalidPid(to)));
        }
        let how = Outcome::Forwarded {
            to,
            forwarder: self.pid,
            msg: *msg,
        };
        self.peer_answer(from, how)
    }

    /// Ends the exchange of `to`, received through the inbox, `how`; None
    /// if it did not come that way.
    fn peer_answer(&self, to: Pid, how: Outcome) -> Option<Result<(), IpcError>> {
        let ps = self.peer.as_ref()?;
        let seq = ps.rx.borrow_mut().remove(&to)?;
        let page = self.page_of(ps, to);
        Some(match page {
            Some(p) if p.page.finish(seq, how) => {
                self.side().handed_off(&p.page.tx_parked);
                Ok(())
            }
            _ => Err(IpcError::NotAwaitingReply(to)),
        })
    }
}
