//! Exchanges between programs of one uid through their peer pages
//! (`attach/peer.rs`), bypassing the host.

use super::*;
use crate::peer_exchange::PeerSend;

/// The shared-memory path (see `peer.rs`).
impl AttachedProcess {
    pub(super) fn own_peer(&self) -> Option<&Peer> {
        // SAFETY: the page mapping is PEER_BYTES long, page-aligned, and
        // lives as long as `self`.
        self.peer.as_ref().map(|p| unsafe { Peer::at(p.as_ptr()) })
    }

    /// `pid`'s peer page, asked of the host once.
    pub(super) fn peer_of(&self, pid: Pid) -> Option<Arc<Shm>> {
        self.peers.get(pid, || self.at.peer_page(pid))
    }

    /// Sends through `to`'s inbox if it waits there.
    pub(super) fn peer_send(
        &self,
        msg: &mut Message,
        to: Pid,
        fwd: Pid,
        deadline: Deadline,
    ) -> PeerSend {
        // (The clock only when the host keeps latency histograms.)
        // One exchange in LATENCY_SAMPLE is timed for the host's
        // histogram (two clock reads are a tenth of a peer-page exchange).
        let timed = self.at.metrics && self.local_n.get().is_multiple_of(LATENCY_SAMPLE);
        let start = if timed { self.at.pace.clock.now() } else { 0 };
        let t0 = if self.at.tracing || self.at.spans {
            trace::wall_us()
        } else {
            0
        };
        let Some(mine) = self.own_peer() else {
            return PeerSend::NotHere;
        };
        if !crate::peer_exchange::reachable(self.pid, self.at.host, to) || self.at.gone().is_some()
        {
            return PeerSend::NotHere;
        }
        let Some(page) = self.peer_of(to) else {
            return PeerSend::NotHere;
        };
        // SAFETY: adopted as exactly PEER_BYTES, page-aligned, held here.
        let p = unsafe { Peer::at(page.as_ptr()) };
        let seq = peer::next_seq(self.peer_seq.get());
        self.peer_seq.set(seq);
        let side = self.side();
        let how = crate::peer_exchange::send(
            &side,
            mine,
            p,
            self.pid,
            to,
            seq,
            self.principal.get(),
            fwd,
            msg,
            deadline,
            || self.at.gone(),
        )
        .outcome(to, &self.peers);
        let how = match how {
            Ok(how) => how,
            Err(None) => return PeerSend::NotHere,
            Err(Some(e)) => return PeerSend::Done(Err(e)),
        };
        match how {
            Outcome::Replied { from, msg: m } => {
                *msg = m;
                self.span_sent(to, seq, t0, true, true);
                // Counted here and reported in a few events per batch
                // (no report, so no host wake-up, per exchange).
                if timed {
                    let latency = self.at.pace.clock.now().saturating_sub(start);
                    // (Standing for the LATENCY_SAMPLE exchanges around it.)
                    let mut h = self.local_hist.borrow_mut();
                    let b = vkernel_proto::stats::Histogram::bucket(latency);
                    h.counts[b] += LATENCY_SAMPLE;
                    h.sums[b] += latency * LATENCY_SAMPLE;
                }
                let n = self.local_n.get() + 1;
                self.local_n.set(n);
                if n >= LOCAL_BATCH {
                    self.flush_local();
                }
                if self.at.tracing {
                    self.at
                        .trace(t0, trace::phase_kind(Phase::Send, self.pid, to, true));
                    let end = trace::wall_us();
                    self.at.trace(
                        end,
                        trace::phase_kind(Phase::Complete, self.pid, from, true),
                    );
                }
                PeerSend::Done(Ok(Reply { from, seg_bytes: 0 }))
            }
            // (The host gone: that is why, whatever the receiver said.)
            Outcome::Failed(e) => {
                self.span_sent(to, seq, t0, false, true);
                PeerSend::Done(Err(self.at.gone().unwrap_or(e)))
            }
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

    /// A plain Receive through the inbox, unless messages wait in the
    /// engine (or the engine must check senders).
    pub(super) fn peer_receive(&self, msg: &mut Message) -> Option<Result<Incoming, IpcError>> {
        let p = self.own_peer()?;
        if self.restricted.get() || p.queued.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let side = self.side();
        let r = crate::peer_exchange::receive(&side, p, || self.at.gone())?;
        Some(r.map(|i: Inbound| {
            let at = self.span_delivered();
            self.peer_rx.borrow_mut().insert(i.from, (i.seq, at));
            *msg = i.msg;
            if self.at.tracing {
                let k = trace::phase_kind(Phase::Deliver, i.from, self.pid, true);
                self.at.trace(trace::wall_us(), k);
            }
            Incoming {
                from: i.from,
                seg_bytes: 0,
                forwarder: i.forwarder,
                principal: i.principal,
            }
        }))
    }

    /// How this process waits, for the peer-page exchange.
    fn side(&self) -> crate::peer_exchange::Side<'_> {
        crate::peer_exchange::Side {
            pace: &self.at.pace,
            spin: &self.spin,
            waits: &self.waits,
            handoffs: None,
            on_block: crate::attach::wait::OnBlock::Block,
            block_in_inbox: true,
            tick: None,
        }
    }

    /// MoveTo/MoveFrom straight between this program's memory and the
    /// other process's window, mapped here, if the host grants it (same
    /// uid, peer pages, the other's Send lending its window now): one copy
    /// instead of two. `None`: not granted; move through the host.
    pub(super) fn granted_move(
        &self,
        other: Pid,
        offset: u32,
        src: &[u8],
    ) -> Option<Result<usize, IpcError>> {
        // The host granted [off, off + n) of the window for the other's
        // outstanding Send, during which it does not touch those bytes
        // (`grant` checked the range against the mapping).
        self.grant(other, offset, src.len(), true)
            .map(|r| r.map(|(w, off)| w.write_at(off, src)))
    }

    pub(super) fn granted_move_from(
        &self,
        other: Pid,
        offset: u32,
        dest: &mut [u8],
    ) -> Option<Result<usize, IpcError>> {
        let n = dest.len();
        // (As in `granted_move`.)
        self.grant(other, offset, n, false)
            .map(|r| r.map(|(w, off)| w.read_at(off, dest)))
    }

    /// Asks the host for a grant; returns the other's window (mapped,
    /// checked to hold the range) and the range's start.
    pub(super) fn grant(
        &self,
        other: Pid,
        offset: u32,
        n: usize,
        write: bool,
    ) -> Option<Result<(Arc<Shm>, usize), IpcError>> {
        if n < GRANT_MIN || self.peer.is_none() || other.host() != self.at.host {
            return None;
        }
        let s = self.slot();
        s.set_arg(0, other.0);
        s.set_arg(1, offset);
        s.set_arg(2, clamp32(n));
        s.set_arg(3, u32::from(write));
        match self.call(Op::MoveGrant) {
            Ok(()) => {}
            Err(IpcError::Refused(_)) => return None,
            Err(e) => return Some(Err(e)),
        }
        let generation = s.out(0);
        let cached = self
            .windows
            .borrow()
            .get(&other)
            .filter(|(g, _)| *g == generation)
            .map(|(_, w)| w.clone());
        let w = match cached {
            Some(w) => w,
            None => {
                let (g, w) = self.at.window_of(other)?;
                let mut m = self.windows.borrow_mut();
                if m.len() >= GRANT_CACHE {
                    m.clear();
                }
                m.insert(other, (g, w.clone()));
                if g != generation {
                    // It grew meanwhile: the host's answer is stale.
                    return None;
                }
                w
            }
        };
        let off = offset as usize;
        if off.checked_add(n).is_none_or(|end| end > w.len()) {
            return Some(Err(IpcError::OutOfBounds(other)));
        }
        Some(Ok((w, off)))
    }

    /// Ends exchange `seq` of `to`, received through the inbox.
    pub(super) fn peer_finish(&self, to: Pid, seq: u32, how: Outcome) -> Result<(), IpcError> {
        let page = self.peer_of(to).ok_or(IpcError::NotAwaitingReply(to))?;
        // SAFETY: adopted as exactly PEER_BYTES, page-aligned, held here.
        let p = unsafe { Peer::at(page.as_ptr()) };
        if p.finish(seq, how) {
            Ok(())
        } else {
            Err(IpcError::NotAwaitingReply(to))
        }
    }
}
