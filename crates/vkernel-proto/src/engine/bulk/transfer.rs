//! A remote transfer seen from the mover: MoveTo chunks pumped under the
//! windows, MoveFrom credit requested, the owner's acknowledgements and
//! data taken in, round-trip samples, and the transfer timers (tail-loss
//! probe, retransmission, deadline).

use super::*;

impl Engine {
    /// Sends new MoveTo chunks while the window allows.
    pub(super) fn pump_move_to(&mut self, now: Micros, mover: MoveRef) {
        let win = self.window_chunks(self.cfg.chunk_bytes());
        let half = (win / 2).max(1);
        let mut sends = Vec::new();
        {
            let Some(op) = self.op_mut(mover) else {
                return;
            };
            let nc = op.done.len();
            let sendable = op.sendable();
            let cum = op.done.first_clear_from(0);
            let limit = op.cwnd.limit(win);
            let half = (limit / 2).max(1).min(half);
            let mut inflight = (cum..op.next_new).filter(|&i| !op.done.get(i)).count();
            while op.next_new < sendable && op.next_new < cum + win && inflight < limit {
                let idx = op.next_new;
                op.next_new += 1;
                inflight += 1;
                let ack_now = (idx + 1) % half == 0
                    || idx + 1 == nc
                    || idx + 1 == cum + win
                    || inflight == limit;
                op.tx_counter += 1;
                op.last_tx[idx] = op.tx_counter;
                if ack_now && op.probe.is_none() {
                    op.probe = Some((idx, now));
                }
                sends.push((idx, ack_now));
            }
            if !sends.is_empty() {
                op.timer = op.next_timer(now);
            }
        }
        for (idx, ack_now) in sends {
            self.send_move_to_chunk(mover, idx, ack_now, false);
        }
        if let Some(t) = self.op_mut(mover).map(|op| op.timer) {
            self.arm(t);
        }
    }

    pub(super) fn send_move_to_chunk(&mut self, r: MoveRef, idx: usize, ack_now: bool, retx: bool) {
        let (mover, from) = match r {
            MoveRef::Proc(p) => (p, ChunkSrc::Moving(p)),
            MoveRef::Behind(x) => match self.behind.get(&x) {
                Some(b) => (b.mover, ChunkSrc::Behind(x)),
                None => return,
            },
        };
        let Some(op) = self.op_mut(r) else {
            return;
        };
        let start = idx * op.chunk;
        let end = (start + op.chunk).min(op.total);
        let mut h = Header::new(PacketType::MoveToRequest);
        h.seq = op.xseq;
        h.src = mover;
        h.dst = op.peer;
        h.forwarder = op.on_behalf;
        h.flags = if ack_now { F_ACK_NOW } else { 0 } | if retx { F_RETRANSMIT } else { 0 };
        h.total_length = op.total as u32;
        h.local_addr = start as u32;
        h.remote_addr = op.base.wrapping_add(start as u32);
        let msg = BulkMsg {
            xfer: op.xfer,
            base: op.base,
            chunk: op.chunk as u32,
            ..BulkMsg::default()
        }
        .message();
        let addr = op.addr;
        if retx {
            op.probe = None;
            self.stats.bulk_retransmits += 1;
        }
        // Queued, not encoded: the runtime may send it straight from the
        // lent buffer (see `Engine::send_chunk_batch`).
        self.out.chunk(Chunk {
            to: addr,
            header: h,
            msg,
            from,
            start,
            end,
        });
    }

    /// MoveFrom: asks the owner for chunks `[from, to)`, skipping held ones.
    pub(super) fn request_range(
        &mut self,
        now: Micros,
        mover: Pid,
        from: usize,
        to: usize,
        retx: bool,
    ) {
        let Some(op) = self.move_op(mover) else {
            return;
        };
        let mut h = Header::new(PacketType::MoveFromRequest);
        h.seq = op.xseq;
        h.src = mover;
        h.dst = op.peer;
        h.forwarder = op.on_behalf;
        h.flags = if retx { F_RETRANSMIT } else { 0 };
        h.total_length = op.total as u32;
        let msg = BulkMsg {
            xfer: op.xfer,
            base: op.base,
            chunk: op.chunk as u32,
            first: from as u32,
            end: to as u32,
        }
        .message();
        let map = if retx {
            op.done.pack(from, to)
        } else {
            Vec::new()
        };
        let addr = op.addr;
        op.timer = op.next_timer(now);
        if retx {
            op.probe = None;
        } else if op.probe.is_none() && from < to {
            op.probe = Some((from, now));
        }
        let t = op.timer;
        self.emit(Dest::Addr(addr), &h, &msg, &map);
        self.arm(t);
    }

    /// Feeds an RTT sample once the probed chunk is acknowledged (MoveTo) or
    /// received (MoveFrom), and refreshes the transfer's timeout.
    pub(super) fn bulk_sample(&mut self, mover: MoveRef, now: Micros) {
        let Some(op) = self.op_mut(mover) else {
            return;
        };
        let Some((i, t)) = op.probe else { return };
        if !op.done.get(i) {
            return;
        }
        op.probe = None;
        let host = op.peer.host();
        self.rtt.with(host, crate::rtt::Rtt::default, |r| {
            r.sample(now.saturating_sub(t))
        });
        let rto = self.rto_for(host);
        if let Some(op) = self.op_mut(mover) {
            op.rto = rto;
        }
    }

    /// Matches an answer to the transfer it is for (the mover's, or one of
    /// its write-behind MoveTos); a refusal ends the transfer with its
    /// error. `Some` if the answer should be processed.
    pub(super) fn accept_answer(
        &mut self,
        now: Micros,
        pkt: &Packet<'_>,
        dir: Dir,
    ) -> Option<MoveRef> {
        let h = pkt.header;
        let xfer = BulkMsg::read(&pkt.msg).xfer;
        let r = match self.move_op(h.dst) {
            Some(op) if op.dir == dir && op.peer == h.src && op.xfer == xfer && !op.waiting => {
                MoveRef::Proc(h.dst)
            }
            _ => match self.behind.get(&xfer) {
                Some(b) if dir == Dir::To && b.mover == h.dst && b.op.peer == h.src => {
                    MoveRef::Behind(xfer)
                }
                _ => {
                    self.stats.drop(DropReason::NoMatch);
                    return None;
                }
            },
        };
        if h.status != Status::Ok {
            let e = status_error(h.status, h.src);
            match r {
                MoveRef::Proc(p) => self.complete(p, Completion::Move(Err(e))),
                MoveRef::Behind(x) => self.fail_behind(now, x, e),
            }
            return None;
        }
        Some(r)
    }

    pub(in crate::engine) fn on_move_to_reply(&mut self, now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        let host_timeout = self.cfg.host_timeout;
        let rto = self.rto_for(h.src.host());
        let tlp = self.tlp_for(h.src.host());
        let win = self.window_chunks(self.cfg.chunk_bytes());
        let Some(r) = self.accept_answer(now, pkt, Dir::To) else {
            return;
        };
        let Some(op) = self.op_mut(r) else {
            return;
        };
        let nc = op.done.len();
        let bm = BulkMsg::read(&pkt.msg);
        let cum = (bm.first as usize).min(nc);
        let end = (bm.end as usize).min(nc).max(cum);
        let before = op.done.ones();
        for i in op.done.first_clear_from(0)..cum {
            op.done.set(i);
        }
        for i in cum..end {
            if packed_get(pkt.data, i - cum) {
                op.done.set(i);
            }
        }
        let newly = op.done.ones() - before;
        let progressed = newly > 0;
        if progressed {
            op.deadline = now + host_timeout;
            op.rto = rto;
            op.tlp = tlp;
            op.cwnd.acked(newly, win);
        }
        let Some(op) = self.move_answered(now, r, progressed) else {
            return;
        };
        if op.done.full() {
            let n = op.total;
            return self.move_done(now, r, n);
        }
        // Chunks sent before the latest-sent acknowledged one and still
        // missing were lost (the path delivers in order, or nearly so).
        let mut mark = 0;
        for i in cum.saturating_sub(1)..end {
            if op.done.get(i) {
                mark = mark.max(op.last_tx[i]);
            }
        }
        let mut lost = Vec::new();
        let lo = op.done.first_clear_from(0);
        for i in lo..op.next_new.min(lo + win) {
            if !op.done.get(i) && op.last_tx[i] < mark {
                lost.push(i);
            }
        }
        let k = lost.len();
        // A loss cuts the window once per window of data: cut only if the
        // latest-sent lost chunk left after the last cut.
        let newest = lost.iter().map(|&i| op.last_tx[i]).max();
        if let Some(m) = newest {
            if op.cwnd.lost(m, op.tx_counter) {
                self.stats.bulk_cwnd_cuts += 1;
            }
        }
        for (j, &i) in lost.iter().enumerate() {
            if let Some(op) = self.op_mut(r) {
                op.tx_counter += 1;
                op.last_tx[i] = op.tx_counter;
            }
            self.send_move_to_chunk(r, i, j + 1 == k, true);
        }
        self.pump_move_to(now, r);
    }

    pub(in crate::engine) fn on_move_from_reply(&mut self, now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        let reo = self.reorder_window(h.src.host());
        let host_timeout = self.cfg.host_timeout;
        let rto = self.rto_for(h.src.host());
        let tlp = self.tlp_for(h.src.host());
        let win = self.window_chunks(self.cfg.chunk_bytes());
        if self.accept_answer(now, pkt, Dir::From).is_none() {
            return;
        }
        let placed = self.placed;
        let Some(op) = self.move_op(h.dst) else {
            return;
        };
        let off = h.local_addr as usize;
        let idx = off / op.chunk;
        let want = op.chunk.min(op.total.saturating_sub(off));
        if !off.is_multiple_of(op.chunk) || idx >= op.done.len() || pkt.data.len() != want {
            self.stats.drop(DropReason::Malformed);
            return;
        }
        let fresh = op.done.set(idx);
        if fresh {
            if !placed {
                op.buf.mem_mut().write_at(off, pkt.data);
            }
            op.deadline = now + host_timeout;
            op.rto = rto;
            op.tlp = tlp;
            op.cwnd.acked(1, win);
        }
        if !fresh {
            self.stats.bulk_duplicates += 1;
        }
        let Some(op) = self.move_answered(now, MoveRef::Proc(h.dst), fresh) else {
            return;
        };
        if op.done.full() {
            let n = op.total;
            return self.move_done(now, MoveRef::Proc(h.dst), n);
        }
        let nc = op.done.len();
        let outstanding = op.next_new - op.done.ones().min(op.next_new);
        // Chunks are sent in index order: a gap below a newly seen chunk
        // means loss, or reordering. The gap is asked for again once a
        // reordering window has passed (`MoveOp::gap_due`); a loss of the
        // re-requested chunks, or of the last one, falls to the timer.
        let cum = op.done.first_clear_from(0);
        let mut gap = false;
        if idx >= op.max_seen {
            gap = op.done.first_clear_from(op.max_seen) < idx;
            op.max_seen = idx + 1;
        }
        // A copy of the probed chunk (or its original) has come: whatever
        // is still missing below it, earlier resends included, was lost.
        if op.tlp_probe == Some(idx) {
            op.tlp_probe = None;
            gap |= cum < idx;
        }
        let mut arm = None;
        if gap && op.gap_due.is_none() {
            op.gap_due = Some((now + reo, op.max_seen.max(idx)));
            arm = Some(now + reo);
        }
        let limit = op.cwnd.limit(win);
        let mut more = None;
        if outstanding <= limit / 2 && op.next_new < nc && op.next_new < cum + 2 * win {
            let end = nc
                .min(op.next_new + limit.saturating_sub(outstanding).max(1))
                .min(cum + 2 * win);
            more = Some((op.next_new, end));
            op.next_new = end;
        }
        if let Some(t) = arm {
            self.arm(t);
        }
        if let Some((a, b)) = more {
            self.request_range(now, h.dst, a, b, false);
        }
    }

    pub(in crate::engine) fn bulk_pending(&mut self, _now: Micros, _h: &Header) -> bool {
        false
    }

    pub(in crate::engine) fn bulk_timers(&mut self, now: Micros, next: &mut Micros) {
        let Some(host) = self.host_id() else { return };
        let procs = &self.procs;
        self.moving.retain(|l| {
            procs
                .get(*l)
                .is_some_and(|p| matches!(p.state, PState::Moving(_)))
        });
        let movers: Vec<MoveRef> = self
            .moving
            .iter()
            .map(|l| MoveRef::Proc(Pid::new(host, l)))
            .chain(self.behind.keys().map(|&x| MoveRef::Behind(x)))
            .collect();
        let max_rto = self.max_rto();
        let oldest = self.oldest_behind();
        for m in movers {
            let ahead = match m {
                MoveRef::Proc(p) => self.move_op(p).and_then(|op| {
                    let o = oldest.get(&(p, op.peer.host()))?;
                    (op.dir == Dir::To).then_some(o.1)
                }),
                MoveRef::Behind(x) => self.behind.get(&x).and_then(|b| {
                    let o = oldest.get(&(b.mover, b.op.peer.host()))?;
                    (o.0 < b.order).then_some(o.1)
                }),
            };
            let Some(peer) = self.op_mut(m).map(|op| op.peer.host()) else {
                continue;
            };
            let reo = self.reorder_window(peer);
            let Some(op) = self.op_mut(m) else { continue };
            // An older write-behind MoveTo of the same mover to the same
            // host is unacknowledged: this one's data is queued behind it
            // at the peer, so its silence says nothing yet. It neither
            // probes nor times out while the older one lives.
            if let Some(older_deadline) = ahead {
                op.deadline = op.deadline.max(older_deadline);
                if now >= op.timer {
                    op.timer = op.next_timer(now);
                }
                *next = (*next).min(op.timer).min(op.deadline);
                continue;
            }
            if let Some((_, top)) = op.gap_due.filter(|&(d, _)| now >= d) {
                // Gaps seen since wait a window of their own.
                let later = op.done.first_clear_from(top) < op.max_seen;
                op.gap_due = later.then_some((now + reo, op.max_seen));
                let Some(op) = self.op_mut(m) else { continue };
                let cum = op.done.first_clear_from(0);
                if let (Dir::From, MoveRef::Proc(p), true) = (op.dir, m, cum < top) {
                    // Marks are chunk indices: a gap among chunks asked for
                    // before the last cut is that cut's episode.
                    if op.cwnd.lost(cum as u32 + 1, op.next_new as u32) {
                        self.stats.bulk_cwnd_cuts += 1;
                    }
                    self.request_range(now, p, cum, top, true);
                }
            }
            let Some(op) = self.op_mut(m) else { continue };
            if now >= op.timer && op.open {
                // No MoveTo continued the stream in time: it ends here.
                op.open = false;
                op.timer = op.next_timer(now);
                self.pump_move_to(now, m);
                if let Some(op) = self.op_mut(m) {
                    *next = (*next).min(op.timer).min(op.deadline);
                }
                continue;
            }
            if now >= op.deadline {
                let peer = op.peer;
                self.stats.timeouts += 1;
                let e = IpcError::Timeout(peer);
                match m {
                    MoveRef::Proc(p) => self.complete(p, Completion::Move(Err(e))),
                    MoveRef::Behind(x) => self.fail_behind(now, x, e),
                }
                continue;
            }
            if now >= op.timer {
                let probe = !op.probed && op.tlp > 0 && op.tlp < op.rto;
                if probe {
                    op.probed = true;
                } else {
                    op.rto = (op.rto * 2).min(max_rto);
                    let mark = match op.dir {
                        Dir::To => op.tx_counter,
                        Dir::From => op.next_new as u32,
                    };
                    op.cwnd.timed_out(mark);
                    self.stats.bulk_cwnd_cuts += 1;
                }
                let Some(op) = self.op_mut(m) else { continue };
                let cum = op.done.first_clear_from(0);
                match (op.dir, m) {
                    (Dir::To, _) => {
                        op.timer = op.next_timer(now);
                        op.tx_counter += 1;
                        if cum < op.last_tx.len() {
                            op.last_tx[cum] = op.tx_counter;
                        }
                        self.send_move_to_chunk(m, cum, true, true);
                    }
                    (Dir::From, MoveRef::Proc(p)) => {
                        let end = op.next_new;
                        // A probe asks again for the last chunk outstanding
                        // only: on a clean path the rest are late, not lost.
                        let last = (cum..end).rev().find(|&i| !op.done.get(i));
                        match last.filter(|_| probe) {
                            Some(i) => {
                                op.tlp_probe = Some(i);
                                self.request_range(now, p, i, i + 1, true);
                            }
                            None => {
                                op.tlp_probe = None;
                                self.request_range(now, p, cum, end, true);
                            }
                        }
                    }
                    (Dir::From, MoveRef::Behind(_)) => {}
                }
            }
            if let Some(op) = self.op_mut(m) {
                *next = (*next).min(op.timer).min(op.deadline);
                if let Some((d, _)) = op.gap_due {
                    *next = (*next).min(d);
                }
            }
        }
    }
}
