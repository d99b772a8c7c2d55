//! Write-behind MoveTo (docs/PROTOCOL.md §4): a small remote MoveTo
//! returns once its data is copied; streams that append a mover's next
//! MoveTos; the Reply or Forward held until the exchange's transfers
//! drain; one live timer per mover and host.

use super::*;

impl Engine {
    /// Is there room for `n` more bytes of `mover`'s write-behind data?
    pub(super) fn behind_room(&self, mover: Pid, n: usize) -> bool {
        let cap = self.cfg.write_behind;
        if n > cap {
            return false;
        }
        let held: usize = self
            .behind
            .values()
            .filter(|b| b.mover == mover)
            .map(|b| b.op.total)
            .sum();
        held + n <= cap
    }

    /// Longest write-behind stream: a quarter of the write-behind bound,
    /// so that the mover goes on with the next while earlier ones are
    /// acknowledged.
    pub(super) fn stream_cap(&self) -> usize {
        self.cfg.write_behind / 4
    }

    /// `mover`'s open stream to `target`'s segment in exchange `xseq` that
    /// ends at `off`, if any.
    pub(super) fn open_stream(
        &self,
        mover: Pid,
        target: Pid,
        xseq: u32,
        off: usize,
    ) -> Option<u32> {
        self.behind
            .iter()
            .find(|(_, b)| {
                b.op.open && b.is_for(mover, target, xseq) && b.op.base as usize + b.op.total == off
            })
            .map(|(&x, _)| x)
    }

    /// Appends what fits of `data` to open stream `x` and sends the chunks
    /// it completes; returns how many bytes it took. Past the stream's cap
    /// it takes only what fills its partial last chunk, and closes: a
    /// stream ends on a chunk boundary unless something closes it early.
    pub(super) fn extend_stream(&mut self, now: Micros, x: u32, src: &dyn SegMem) -> usize {
        let cap = self.stream_cap();
        let Some(op) = self.behind.get_mut(&x).map(|b| &mut b.op) else {
            return 0;
        };
        let n = src.len();
        let fill = (op.chunk - op.total % op.chunk) % op.chunk;
        let take = if op.total + n <= cap { n } else { fill.min(n) };
        // Copies join copies; a shared range joins the range it follows.
        match (&mut op.buf, src.as_shared()) {
            (MoveBuf::Owned(v), None) if !src.is_stable() => {
                if !src.append_to(0, take, v) {
                    return 0;
                }
            }
            (MoveBuf::Shared(s), Some(next)) if s.is_followed_by(next) => s.grow(take),
            _ => return 0,
        }
        op.total += take;
        let nc = nchunks(op.total, op.chunk);
        op.done.grow(nc);
        op.last_tx.resize(nc, 0);
        if take < n || (op.total >= cap && op.total.is_multiple_of(op.chunk)) {
            op.open = false;
        }
        self.pump_move_to(now, MoveRef::Behind(x));
        take
    }

    /// Closes `mover`'s open streams, sending their last chunks: before any
    /// other move of the mover's, and before its Reply or Forward is held
    /// for them.
    pub(in crate::engine) fn seal_streams(&mut self, now: Micros, mover: Pid) {
        let open: Vec<u32> = self
            .behind
            .iter()
            .filter(|(_, b)| b.mover == mover && b.op.open)
            .map(|(&x, _)| x)
            .collect();
        for x in open {
            if let Some(b) = self.behind.get_mut(&x) {
                b.op.open = false;
            }
            self.pump_move_to(now, MoveRef::Behind(x));
        }
    }

    /// Does `[off, off + n)` of `target`'s segment in exchange `xseq`
    /// overlap a write-behind MoveTo of `mover`'s still in flight? (Then a
    /// lost chunk of the earlier one, retransmitted, could land after the
    /// later data.)
    pub(super) fn behind_overlaps(
        &self,
        mover: Pid,
        target: Pid,
        xseq: u32,
        off: usize,
        n: usize,
    ) -> bool {
        self.behind.values().any(|b| {
            let (lo, hi) = (b.op.base as usize, b.op.base as usize + b.op.total);
            b.is_for(mover, target, xseq) && lo < off + n && off < hi
        })
    }

    /// Has `mover` write-behind MoveTos to `peer`'s segment in exchange
    /// `xseq` in flight? (Those of an earlier exchange, run again after
    /// its reply crossed a retransmission, hold nothing of this one.)
    pub(in crate::engine) fn behind_busy(&self, mover: Pid, peer: Pid, xseq: u32) -> bool {
        self.behind.values().any(|b| b.is_for(mover, peer, xseq))
    }

    /// Holds `by`'s Reply or Forward of alien `i` (from `sender`) until its
    /// write-behind MoveTos to `sender` are acknowledged.
    pub(in crate::engine) fn hold(
        &mut self,
        now: Micros,
        i: usize,
        by: Pid,
        sender: Pid,
        op: HeldOp,
    ) {
        self.seal_streams(now, by);
        let Some(a) = self.aliens.get_mut(i) else {
            return;
        };
        a.state = AlienState::Replied;
        let seq = a.seq;
        self.held.push(Held {
            by,
            sender,
            seq,
            op,
        });
    }

    /// `mover`'s last write-behind MoveTo to `peer` in exchange `xseq`
    /// ended (`failed`: with that error): sends what was held for it, or
    /// starts the move that waited for it.
    pub(super) fn behind_drained(
        &mut self,
        now: Micros,
        (mover, peer, xseq): (Pid, Pid, u32),
        failed: Option<IpcError>,
    ) {
        let mut mine = Vec::new();
        let mut k = 0;
        while k < self.held.len() {
            let h = &self.held[k];
            if h.by == mover && h.sender == peer && h.seq == xseq {
                mine.push(self.held.remove(k));
            } else {
                k += 1;
            }
        }
        for h in mine {
            // Gone (freed after a failure, or expired): nothing to send.
            let Some(i) = self.aliens.of(h.sender, h.seq) else {
                continue;
            };
            match self.aliens.get_mut(i) {
                Some(a) if a.state == AlienState::Replied => {
                    a.state = AlienState::Received;
                }
                _ => continue,
            }
            // Checked when held; what fails now (the target of a Forward
            // destroyed since) ends the exchange as it would have then.
            let r = match h.op {
                HeldOp::Reply { msg, seg } => {
                    let seg = seg.as_ref().map(|(o, d)| (*o, &d[..]));
                    self.reply_alien(now, h.by, h.sender, i, msg, seg)
                }
                HeldOp::Forward { to, msg } => self.forward_alien(now, h.by, h.sender, i, to, msg),
            };
            if r.is_err() {
                self.free_alien(i);
            }
        }
        let waiting = self
            .move_op(mover)
            .is_some_and(|op| op.waiting && op.peer == peer && op.xseq == xseq);
        if !waiting {
            return;
        }
        let gone = self.aliens.received(peer, mover).is_err();
        if let Some(e) = failed.or(gone.then_some(IpcError::NotAwaitingReply(peer))) {
            return self.complete(mover, Completion::Move(Err(e)));
        }
        let host_timeout = self.cfg.host_timeout;
        let win = self.window_chunks(self.cfg.chunk_bytes());
        let Some(op) = self.move_op(mover) else {
            return;
        };
        op.waiting = false;
        op.deadline = now + host_timeout;
        op.timer = 0;
        match op.dir {
            Dir::To => self.pump_move_to(now, MoveRef::Proc(mover)),
            Dir::From => {
                let first = op.done.len().min(op.cwnd.limit(win));
                op.next_new = first;
                self.request_range(now, mover, 0, first, false);
            }
        }
    }

    /// Ends write-behind MoveTo `x` with error `e`. The exchange it wrote
    /// for is broken (the sender's segment misses data): its alien is
    /// freed, so a held reply is never sent and the sender times out
    /// rather than resuming on partial data.
    pub(super) fn fail_behind(&mut self, now: Micros, x: u32, e: IpcError) {
        let Some(b) = self.behind.remove(&x) else {
            return;
        };
        if let Some(i) = self.aliens.of(b.op.peer, b.op.xseq) {
            self.free_alien(i);
        }
        let ex = (b.mover, b.op.peer, b.op.xseq);
        if !self.behind_busy(ex.0, ex.1, ex.2) {
            self.behind_drained(now, ex, Some(e));
        }
    }

    /// For each (mover, peer host) with write-behind MoveTos in flight:
    /// the oldest one's order and deadline.
    pub(super) fn oldest_behind(&self) -> HashMap<(Pid, crate::pid::HostId), (u64, Micros)> {
        let mut m: HashMap<(Pid, crate::pid::HostId), (u64, Micros)> = HashMap::new();
        for b in self.behind.values() {
            let e = m
                .entry((b.mover, b.op.peer.host()))
                .or_insert((b.order, b.op.deadline));
            if b.order < e.0 {
                *e = (b.order, b.op.deadline);
            }
        }
        m
    }

    /// `mover`'s oldest write-behind MoveTo to `host` ended: the transfer
    /// next in line (the next oldest, else the one the mover is blocked
    /// in) starts its probe delay now, not from when it was sent.
    pub(super) fn restart_next_timer(&mut self, now: Micros, mover: Pid, host: crate::pid::HostId) {
        let next = self
            .behind
            .iter()
            .filter(|(_, b)| b.mover == mover && b.op.peer.host() == host)
            .min_by_key(|(_, b)| b.order)
            .map(|(&x, _)| MoveRef::Behind(x));
        let r = next.unwrap_or(MoveRef::Proc(mover));
        if let Some(op) = self.op_mut(r) {
            if op.peer.host() == host && op.dir == Dir::To && op.next_new > 0 {
                op.timer = op.timer.max(op.next_timer(now));
            }
        }
    }
}
