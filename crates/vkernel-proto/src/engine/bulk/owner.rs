//! The owner's side of a remote move: every request is checked against
//! the exchange it names (`validate_owner`, the one rights check), MoveTo
//! data is placed in the lent segment (or where `chunk_place` says, for a
//! runtime receiving in place), MoveFrom data is sent from it.

use super::*;

impl Engine {
    pub(super) fn refuse(
        &mut self,
        to: SocketAddr,
        t: PacketType,
        h: &Header,
        msg: &Message,
        st: Status,
    ) {
        let mut r = Header::new(t);
        r.status = st;
        r.seq = h.seq;
        r.src = h.dst;
        r.dst = h.src;
        let m = BulkMsg {
            xfer: BulkMsg::read(msg).xfer,
            ..BulkMsg::default()
        }
        .message();
        self.stats.drop(DropReason::SegmentViolation);
        self.emit(Dest::Addr(to), &r, &m, &[]);
    }

    /// Checks a bulk request against the owner's exchange; returns the error
    /// status, if any. Extends the owner's Send deadline (the peer is alive).
    pub(super) fn validate_owner(
        &mut self,
        now: Micros,
        h: &Header,
        msg: &Message,
        write: bool,
    ) -> Status {
        let host_timeout = self.cfg.host_timeout;
        let b = BulkMsg::read(msg);
        let (base, chunk) = (b.base as usize, b.chunk as usize);
        let total = h.total_length as usize;
        let Some(o) = self.outgoing_mut(h.dst) else {
            return Status::NotAwaitingReply;
        };
        // The mover is the process we await, or one on its host to which
        // that process forwarded the exchange without telling us (the
        // mover's kernel then names it in `forwarder`).
        let awaited = o.dst == h.src || (o.dst == h.forwarder && o.dst.host() == h.src.host());
        if !awaited || o.seq != h.seq || o.remote.is_none() {
            return Status::NotAwaitingReply;
        }
        if let Some(r) = o.remote.as_mut() {
            r.alive(now, host_timeout);
        }
        let need = if write { Need::Write } else { Need::Read };
        let seg_len = o.seg.as_ref().map(|s| s.len());
        if let Err(d) = rights::check(o.access, seg_len, need, base, total) {
            return d.status();
        }
        if chunk == 0 || chunk > MAX_APPEND {
            return Status::BadRequest;
        }
        Status::Ok
    }

    pub(in crate::engine) fn on_move_to_request(
        &mut self,
        now: Micros,
        from: SocketAddr,
        pkt: &Packet<'_>,
    ) {
        let h = pkt.header;
        let msg = pkt.msg;
        // Reply data is never answered, not even refused: its sender
        // keeps no state to match an answer to.
        let ahead = h.flags & F_REPLY_DATA != 0;
        let st = self.validate_owner(now, &h, &msg, true);
        if st != Status::Ok {
            if ahead {
                return self.stats.drop(DropReason::SegmentViolation);
            }
            return self.refuse(from, PacketType::MoveToReply, &h, &msg, st);
        }
        let bm = BulkMsg::read(&msg);
        let (xfer, base, chunk) = (bm.xfer, bm.base as usize, bm.chunk as usize);
        let total = h.total_length as usize;
        let off = h.local_addr as usize;
        let nc = nchunks(total, chunk);
        let idx = off / chunk;
        let want = chunk.min(total.saturating_sub(off));
        let bad = |e: &mut Self| {
            if ahead {
                e.stats.drop(DropReason::Malformed);
            } else {
                e.refuse(from, PacketType::MoveToReply, &h, &msg, Status::BadRequest);
            }
        };
        if !off.is_multiple_of(chunk) || idx >= nc || pkt.data.len() != want {
            return bad(self);
        }
        let placed = self.placed;
        let Some(o) = self.outgoing_mut(h.dst) else {
            return;
        };
        let pos = match o
            .inbound
            .iter()
            .position(|b| b.mover == h.src && b.xfer == xfer)
        {
            Some(p) => p,
            None => {
                if ahead {
                    // A request run again sends its reply's data anew.
                    o.inbound.retain(|b| !(b.ahead && b.mover == h.src));
                }
                if o.inbound.len() >= MAX_INBOUND {
                    o.inbound.remove(0);
                }
                o.inbound
                    .push(InBulk::new((h.src, xfer), ahead, base, total, chunk));
                o.inbound.len() - 1
            }
        };
        let b = &mut o.inbound[pos];
        if b.ahead != ahead || b.base != base || !b.admits(total, chunk, want) {
            return bad(self);
        }
        if total > b.total {
            b.total = total;
            b.got.grow(nc);
        }
        let fresh = o.inbound[pos].got.set(idx);
        if fresh && !placed {
            if let Some(seg) = o.seg.as_mut() {
                seg.write_at(base + off, pkt.data);
            }
        }
        let b = &mut o.inbound[pos];
        b.highest = b.highest.max(idx + 1);
        let full = b.got.full();
        let ack = !ahead && (h.flags & F_ACK_NOW != 0 || (full && fresh));
        let answer = ack.then(|| {
            let cum = b.got.first_clear_from(0);
            let end = b.highest.max(cum).min(cum + MAX_ACK_SPAN);
            (cum, end, b.got.pack(cum, end))
        });
        if !fresh {
            self.stats.bulk_duplicates += 1;
        }
        let Some((cum, end, map)) = answer else {
            return;
        };
        let mut r = Header::new(PacketType::MoveToReply);
        r.seq = h.seq;
        r.src = h.dst;
        r.dst = h.src;
        r.total_length = h.total_length;
        let m = BulkMsg {
            first: cum as u32,
            end: end as u32,
            ..bm
        }
        .message();
        self.emit(Dest::Addr(from), &r, &m, &map);
    }

    /// The place in a lent buffer of a bulk chunk not yet received, as the
    /// handlers would copy it there (same checks, no side effects).
    pub(in crate::engine) fn chunk_place(
        &mut self,
        h: &Header,
        msg: &Message,
        len: usize,
    ) -> Option<Place<'_>> {
        match h.ptype {
            PacketType::MoveToRequest => {
                if h.status != Status::Ok || !self.is_local(h.dst) {
                    return None;
                }
                let bm = BulkMsg::read(msg);
                let (xfer, base, chunk) = (bm.xfer, bm.base as usize, bm.chunk as usize);
                let total = h.total_length as usize;
                let off = h.local_addr as usize;
                if chunk == 0 || chunk > MAX_APPEND || !off.is_multiple_of(chunk) {
                    return None;
                }
                let nc = nchunks(total, chunk);
                let idx = off / chunk;
                if idx >= nc || len != chunk.min(total.saturating_sub(off)) {
                    return None;
                }
                let o = self.outgoing_mut(h.dst)?;
                let awaited =
                    o.dst == h.src || (o.dst == h.forwarder && o.dst.host() == h.src.host());
                if !awaited || o.seq != h.seq || o.remote.is_none() {
                    return None;
                }
                let have = o
                    .inbound
                    .iter()
                    .find(|b| b.mover == h.src && b.xfer == xfer)
                    .is_some_and(|b| !b.admits(total, chunk, len) || b.got.get(idx));
                if have {
                    return None;
                }
                let lent = rights::write(o.access, o.seg.as_mut(), base, total).ok()?;
                (base + off + len <= lent.len()).then_some(Place {
                    lent,
                    off: base + off,
                    len,
                })
            }
            PacketType::MoveFromReply => {
                if h.status != Status::Ok {
                    return None;
                }
                let op = self.move_op(h.dst)?;
                if op.dir != Dir::From || op.peer != h.src || op.xfer != BulkMsg::read(msg).xfer {
                    return None;
                }
                let off = h.local_addr as usize;
                if !off.is_multiple_of(op.chunk) {
                    return None;
                }
                let idx = off / op.chunk;
                if idx >= op.done.len()
                    || len != op.chunk.min(op.total.saturating_sub(off))
                    || op.done.get(idx)
                {
                    return None;
                }
                let lent = op.buf.mem_mut();
                (off + len <= lent.len()).then_some(Place { lent, off, len })
            }
            _ => None,
        }
    }

    pub(in crate::engine) fn on_move_from_request(
        &mut self,
        now: Micros,
        from: SocketAddr,
        pkt: &Packet<'_>,
    ) {
        let h = pkt.header;
        let msg = pkt.msg;
        let st = self.validate_owner(now, &h, &msg, false);
        if st != Status::Ok {
            return self.refuse(from, PacketType::MoveFromReply, &h, &msg, st);
        }
        let bm = BulkMsg::read(&msg);
        let (base, chunk) = (bm.base as usize, bm.chunk as usize);
        let total = h.total_length as usize;
        let nc = nchunks(total, chunk);
        let (lo, hi) = (bm.first as usize, bm.end as usize);
        if lo > hi || hi > nc {
            return self.refuse(
                from,
                PacketType::MoveFromReply,
                &h,
                &msg,
                Status::BadRequest,
            );
        }
        // Serve at most two of our windows per request, so no request can
        // make us burst more than that.
        let cap = 2 * self.window_chunks(chunk);
        let retx = h.flags & F_RETRANSMIT != 0;
        let mut r = Header::new(PacketType::MoveFromReply);
        r.seq = h.seq;
        r.src = h.dst;
        r.dst = h.src;
        r.total_length = h.total_length;
        let m = BulkMsg {
            first: 0,
            end: 0,
            ..bm
        }
        .message();
        let Some(o) = self.outgoing_mut(h.dst) else {
            return;
        };
        if rights::read(o.access, o.seg.as_ref(), base, total).is_err() {
            return;
        }
        let seq = o.seq;
        // A chunk sent less than `SERVED_FOR` ago is still on its way: a
        // request for it was sent before it could arrive (it overtook the
        // request that had it sent, or it was a probe queued behind that
        // request here), so it is not sent again. A mover asks again for
        // a lost chunk only a reordering window (at least as long) plus a
        // round trip after it left.
        o.served
            .retain(|&(_, _, _, t)| now.saturating_sub(t) < SERVED_FOR);
        // (A short list: what left in the last 100 µs.)
        let recent = |i: usize| {
            o.served
                .iter()
                .any(|&(p, x, c, _)| c as usize == i && p == h.src && x == bm.xfer)
        };
        let todo: Vec<usize> = (lo..hi)
            .filter(|&i| !packed_get(pkt.data, i - lo) && !recent(i))
            .take(cap)
            .collect();
        if o.served.len() + todo.len() > MAX_SERVED {
            let k = (o.served.len() + todo.len() - MAX_SERVED).min(o.served.len());
            o.served.drain(..k);
        }
        o.served
            .extend(todo.iter().map(|&i| (h.src, bm.xfer, i as u32, now)));
        for (j, &i) in todo.iter().enumerate() {
            let start = i * chunk;
            let end = (start + chunk).min(total);
            r.local_addr = start as u32;
            r.remote_addr = (base + start) as u32;
            r.flags = if j + 1 == todo.len() { F_ACK_NOW } else { 0 };
            self.out.chunk(Chunk {
                to: from,
                header: r,
                msg: m,
                from: ChunkSrc::Lent(h.dst, seq),
                start: base + start,
                end: base + end,
            });
        }
        if retx {
            self.stats.bulk_retransmits += todo.len() as u64;
        }
    }
}
