//! The bulk primitives a mover calls: MoveTo, MoveFrom, reply data sent
//! ahead of a reply (`reply_ahead`), and the host's grant of a move
//! between two of its own programs (`grant_move`).

use super::*;

impl Engine {
    /// MoveTo: copies `src` into `target`'s write-granted segment at
    /// `dest_off`. `target` must be awaiting reply from `mover`. Returns the
    /// byte count at once for a local target, or for a remote one sent
    /// write-behind ([`crate::Config::write_behind`]: the data copied, or
    /// kept if `src` is stable ([`crate::SegMem::is_stable`]), the mover's Reply
    /// held until it is acknowledged); else `None` (blocked until a
    /// [`Completion::Move`]).
    pub fn move_to(
        &mut self,
        now: Micros,
        mover: Pid,
        target: Pid,
        dest_off: u32,
        src: Seg,
    ) -> Result<Option<usize>, IpcError> {
        self.tick(now);
        self.check_ready_caller(mover)?;
        let n = src.len();
        if self.is_local(target) {
            let Some(o) = self.outgoing_mut(target) else {
                return Err(IpcError::NotAwaitingReply(target));
            };
            if o.dst != mover || !o.received || o.remote.is_some() {
                return Err(IpcError::NotAwaitingReply(target));
            }
            let dest = rights::write(o.access, o.seg.as_mut(), dest_off as usize, n)
                .map_err(|e| e.error(target))?;
            if !dest.copy_from(dest_off as usize, &*src, 0, n) {
                return Err(IpcError::OutOfBounds(target));
            }
            self.count_move(n);
            return Ok(Some(n));
        }
        let i = self.aliens.received(target, mover)?;
        let Some(a) = self.aliens.get(i) else {
            return Err(IpcError::NotAwaitingReply(target));
        };
        a.check(Need::Write, dest_off as usize, n)
            .map_err(|e| e.error(target))?;
        if n == 0 {
            return Ok(Some(0));
        }
        let (xseq, addr, on_behalf) = (a.seq, a.addr, a.addressed);
        // The first part of the segment that came with the request answers
        // later MoveFroms without the network: keep it equal to the segment.
        let off = dest_off as usize;
        if let Some((_, head)) = self.aliens.with_data(i).filter(|(_, h)| off < h.len()) {
            let k = (head.len() - off).min(n);
            src.read_at(0, &mut head[off..off + k]);
        }
        let ex = (xseq, addr, on_behalf);
        let overlaps = self.behind_overlaps(mover, target, xseq, off, n);
        if !overlaps && self.behind_room(mover, n) {
            // Data continuing the mover's open stream is appended to it:
            // its chunks then span MoveTos.
            let taken = match self.open_stream(mover, target, xseq, off) {
                Some(x) => self.extend_stream(now, x, &*src),
                None => 0,
            };
            self.stats.bulk_write_behind += 1;
            if taken == n {
                return Ok(Some(n));
            }
            self.seal_streams(now, mover);
            // The data must outlive this call unchanged: kept if the
            // caller cannot change it, else copied. Less than a chunk
            // starts a stream that later MoveTos may join; a chunk or more
            // goes out whole at once (holding back its last piece would
            // delay a Reply that follows).
            let rest = n - taken;
            let open = rest < self.cfg.chunk_bytes();
            let buf = match src.as_shared() {
                Some(sh) => (MoveBuf::Shared(sh.skip(taken)), open),
                // (Nothing of it was taken: only shared and copied data
                // join streams.)
                None if src.is_stable() => (MoveBuf::Lent(src), false),
                None => {
                    // (Room for a few chunks: a stream under a large
                    // write-behind bound grows as a Vec does.)
                    let chunk = self.cfg.chunk_bytes();
                    let room = if open {
                        self.stream_cap().min(4 * chunk) + chunk
                    } else {
                        rest
                    };
                    let mut v = Vec::with_capacity(room);
                    src.append_to(taken, rest, &mut v);
                    (MoveBuf::Owned(v), open)
                }
            };
            let at = dest_off.wrapping_add(taken as u32);
            let mut op = self.new_move(now, Dir::To, target, at, buf, ex);
            while self.behind.contains_key(&op.xfer) {
                op.xfer = self.random_u32();
            }
            op.last_tx = vec![0; op.done.len()];
            // (An open stream with nothing to send yet still needs its
            // timer: it closes the stream if no MoveTo follows.)
            op.timer = op.next_timer(now);
            let x = op.xfer;
            self.behind_order += 1;
            let order = self.behind_order;
            self.behind.insert(x, Behind { mover, order, op });
            self.pump_move_to(now, MoveRef::Behind(x));
            return Ok(Some(n));
        }
        self.seal_streams(now, mover);
        let mut op = self.new_move(
            now,
            Dir::To,
            target,
            dest_off,
            (MoveBuf::Lent(src), false),
            ex,
        );
        op.last_tx = vec![0; op.done.len()];
        op.waiting = overlaps;
        if overlaps {
            (op.timer, op.deadline) = (Micros::MAX, Micros::MAX);
        }
        self.set_state(mover, PState::Moving(Box::new(op)));
        self.moving.insert(mover.local());
        if !overlaps {
            self.pump_move_to(now, MoveRef::Proc(mover));
        }
        Ok(None)
    }

    /// MoveFrom: copies from `source`'s read-granted segment at `src_off`
    /// into `dest`. `source` must be awaiting reply from `mover`.
    pub fn move_from(
        &mut self,
        now: Micros,
        mover: Pid,
        source: Pid,
        src_off: u32,
        mut dest: Seg,
    ) -> Result<Option<usize>, IpcError> {
        self.tick(now);
        self.check_ready_caller(mover)?;
        let n = dest.len();
        let off = src_off as usize;
        if self.is_local(source) {
            let Some(o) = self.outgoing(source) else {
                return Err(IpcError::NotAwaitingReply(source));
            };
            if o.dst != mover || !o.received || o.remote.is_some() {
                return Err(IpcError::NotAwaitingReply(source));
            }
            let from =
                rights::read(o.access, o.seg.as_ref(), off, n).map_err(|e| e.error(source))?;
            if !dest.copy_from(0, from, off, n) {
                return Err(IpcError::OutOfBounds(source));
            }
            self.count_move(n);
            return Ok(Some(n));
        }
        let i = self.aliens.received(source, mover)?;
        let Some(a) = self.aliens.get(i) else {
            return Err(IpcError::NotAwaitingReply(source));
        };
        a.check(Need::Read, off, n).map_err(|e| e.error(source))?;
        if n == 0 {
            return Ok(Some(0));
        }
        // Already here with the request (receive-with-segment data)?
        let (xseq, addr, on_behalf) = (a.seq, a.addr, a.addressed);
        if let Some(head) = self.aliens.data(i).get(off..off + n) {
            dest.write_at(0, head);
            self.count_move(n);
            return Ok(Some(n));
        }
        self.seal_streams(now, mover);
        let mut op = self.new_move(
            now,
            Dir::From,
            source,
            src_off,
            (MoveBuf::Lent(dest), false),
            (xseq, addr, on_behalf),
        );
        if self.behind_overlaps(mover, source, xseq, off, n) {
            // Read what was written: after the written data is acknowledged.
            op.waiting = true;
            (op.timer, op.deadline) = (Micros::MAX, Micros::MAX);
            self.set_state(mover, PState::Moving(Box::new(op)));
            self.moving.insert(mover.local());
            return Ok(None);
        }
        let first = op
            .done
            .len()
            .min(op.cwnd.limit(self.window_chunks(op.chunk)));
        op.next_new = first;
        self.set_state(mover, PState::Moving(Box::new(op)));
        self.moving.insert(mover.local());
        self.request_range(now, mover, 0, first, false);
        Ok(None)
    }

    /// Reply-with-segment for data of any size. Up to one datagram it is
    /// [`Engine::reply`]. More, to a remote sender of an idempotent
    /// request, goes *ahead* of the reply: MoveToRequest chunks flagged
    /// [`F_REPLY_DATA`], never acknowledged, then the RemoteReply with the
    /// last piece. Nothing is kept and nobody waits: if a chunk is lost the
    /// sender's kernel drops the reply and retransmits the request, which
    /// runs again (idempotent), its data then moved by MoveTo. `data` stays lent until the runtime has
    /// sent or encoded the queued chunks (the same engine borrow).
    ///
    /// `SegmentTooLarge` where this does not apply (a non-idempotent
    /// request, more than one window of data, or a sender whose kernel
    /// asks for moved data because data sent ahead went missing before):
    /// the caller moves the data by MoveTo first, then replies.
    pub fn reply_ahead(
        &mut self,
        now: Micros,
        replier: Pid,
        to: Pid,
        msg: Message,
        off: u32,
        data: Seg,
    ) -> Result<(), IpcError> {
        self.tick(now);
        let n = data.len();
        if self.is_local(to) {
            return self.reply_lent(now, replier, to, msg, off, &*data);
        }
        if n <= MAX_APPEND {
            let v = crate::segment::to_vec(&*data);
            return self.reply(now, replier, to, msg, Some((off, &v)));
        }
        self.check_ready_caller(replier)?;
        let too_large = IpcError::SegmentTooLarge { max: MAX_APPEND };
        let Ok(i) = self.aliens.received(to, replier) else {
            return Err(too_large);
        };
        let Some(a) = self.aliens.get(i) else {
            return Err(too_large);
        };
        let chunk = self.cfg.chunk_bytes();
        // (Not while write-behind data to the sender is unacknowledged:
        // the caller's MoveTo then Reply is held behind it.)
        if !a.idempotent
            || a.no_ahead
            || n > self.cfg.window.max(chunk)
            || self.behind_busy(replier, to, a.seq)
        {
            return Err(too_large);
        }
        a.check(Need::Write, off as usize, n)
            .map_err(|e| e.error(to))?;
        let (src, seq, addr, on_behalf) = (a.src, a.seq, a.addr, a.addressed);
        let retx = if a.retransmitted { F_RETRANSMIT } else { 0 };
        // Chunks queued earlier name `reply_src` too: out with them first.
        if self.out.has_chunks() {
            self.encode_chunks();
        }
        let lead = (n - 1) / chunk * chunk;
        let xfer = self.random_u32();
        let m = BulkMsg {
            xfer,
            base: off,
            chunk: chunk as u32,
            ..BulkMsg::default()
        }
        .message();
        for start in (0..lead).step_by(chunk) {
            let mut h = Header::new(PacketType::MoveToRequest);
            h.seq = seq;
            h.src = replier;
            h.dst = src;
            h.forwarder = on_behalf;
            h.flags = F_REPLY_DATA;
            h.total_length = lead as u32;
            h.local_addr = start as u32;
            h.remote_addr = off.wrapping_add(start as u32);
            self.out.chunk(Chunk {
                to: addr,
                header: h,
                msg: m,
                from: ChunkSrc::Reply,
                start,
                end: (start + chunk).min(lead),
            });
        }
        let mut h = Header::new(PacketType::RemoteReply);
        h.seq = seq;
        h.src = replier;
        h.dst = src;
        h.forwarder = replier;
        h.flags = F_REPLY_DATA | retx;
        h.local_addr = lead as u32;
        h.remote_addr = off.wrapping_add(lead as u32);
        h.total_length = (n - lead) as u32;
        // The reply is queued behind its chunks, so it leaves after them.
        self.out.chunk(Chunk {
            to: addr,
            header: h,
            msg,
            from: ChunkSrc::Reply,
            start: lead,
            end: n,
        });
        self.reply_src = Some(data);
        self.stats.bulk_bytes += lead as u64;
        self.free_alien(i);
        Ok(())
    }

    /// After an answer to `mover`'s move: feeds the RTT sample and, if the
    /// answer made progress, restarts the retransmission timer.
    #[inline]
    pub(super) fn move_answered(
        &mut self,
        now: Micros,
        mover: MoveRef,
        progressed: bool,
    ) -> Option<&mut MoveOp> {
        self.bulk_sample(mover, now);
        let op = self.op_mut(mover)?;
        if progressed {
            op.probed = false;
            op.timer = op.next_timer(now);
        }
        Some(op)
    }

    /// Counts a finished move of `n` bytes in the statistics.
    #[inline]
    /// Checks that `mover` may move `n` bytes at `off` into (`write`) or
    /// out of the segment of the local process `target`, exactly as
    /// [`Engine::move_to`] / [`Engine::move_from`] would, and counts the
    /// move, without copying: for a machine host whose programs copy
    /// between their own mappings of the segment. Returns the segment's
    /// length.
    #[allow(clippy::too_many_arguments)]
    pub fn grant_move(
        &mut self,
        now: Micros,
        mover: Pid,
        target: Pid,
        off: u32,
        n: usize,
        write: bool,
    ) -> Result<usize, IpcError> {
        self.tick(now);
        self.check_ready_caller(mover)?;
        if !self.is_local(target) {
            return Err(IpcError::NotAwaitingReply(target));
        }
        let Some(o) = self.outgoing(target) else {
            return Err(IpcError::NotAwaitingReply(target));
        };
        if o.dst != mover || !o.received || o.remote.is_some() {
            return Err(IpcError::NotAwaitingReply(target));
        }
        let need = if write { Need::Write } else { Need::Read };
        let seg_len = o.seg.as_ref().map(|s| s.len());
        rights::check(o.access, seg_len, need, off as usize, n).map_err(|e| e.error(target))?;
        self.count_move(n);
        Ok(seg_len.unwrap_or(0))
    }
}
