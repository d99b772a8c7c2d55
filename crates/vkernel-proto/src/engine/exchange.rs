//! Send, Receive, Reply and Forward: the message exchange, local and
//! remote (the sender's side of a remote exchange; the receiver's side is
//! in `remote.rs`).

use super::*;

impl Received {
    /// What a receiver gets for a queued message whose sender went away
    /// between the queue check and the hand-over (nothing).
    fn stale(from: Pid) -> Received {
        Received {
            from,
            msg: Message::zero(),
            seg_bytes: 0,
            forwarder: from,
            principal: 0,
        }
    }
}

impl Engine {
    /// Starts a Send from `src` to `dst`. The sender is blocked until a
    /// [`Completion::Send`] arrives (an immediate error is returned directly).
    /// `seg` is the sender's segment, with rights declared in `msg`.
    pub fn send(
        &mut self,
        now: Micros,
        src: Pid,
        dst: Pid,
        msg: Message,
        seg: Option<Seg>,
    ) -> Result<(), IpcError> {
        self.tick(now);
        self.send_append(now, src, dst, msg, seg, usize::MAX)
    }

    /// [`Engine::send`] with at most `append` bytes of a read segment
    /// travelling with the message (capped at [`MAX_APPEND`]); a sender
    /// whose segment ends in space for the reply's data keeps that space
    /// off the wire.
    pub fn send_append(
        &mut self,
        now: Micros,
        src: Pid,
        dst: Pid,
        msg: Message,
        seg: Option<Seg>,
        append: usize,
    ) -> Result<(), IpcError> {
        self.send_as(now, src, dst, msg, seg, append, src)
    }

    /// [`Engine::send_append`] of a message that `forwarder` forwarded to
    /// `dst` outside this engine (a machine host's shared-memory path):
    /// the receiver sees `forwarder` as for a Forward.
    #[allow(clippy::too_many_arguments)]
    pub fn send_as(
        &mut self,
        now: Micros,
        src: Pid,
        dst: Pid,
        mut msg: Message,
        seg: Option<Seg>,
        append: usize,
        forwarder: Pid,
    ) -> Result<(), IpcError> {
        self.tick(now);
        self.check_ready_caller(src)?;
        if !dst.is_process() && !dst.is_group() {
            return Err(IpcError::InvalidPid(dst));
        }
        let (access, seg) = rights::grant(&mut msg, seg);
        let principal = self.principal_of(src);
        let out = Outgoing {
            principal,
            started: now,
            dst,
            seq: self.new_seq(),
            msg,
            seg,
            access,
            append,
            forwarder,
            received: false,
            remote: None,
            inbound: Vec::new(),
            served: Vec::new(),
            no_ahead: false,
            deadline: None,
        };
        self.group_new_send(src);
        if dst.is_group() {
            let sent = out.msg;
            let mode = self.group_send(now, src, dst, out.msg, out.seg.as_ref(), out.seq)?;
            self.set_sending(src, out);
            self.transmit_send(now, src, false);
            if mode == crate::message::GroupMode::NoReply {
                // A notification: sent once, the sender does not block.
                self.complete(
                    src,
                    Completion::Send(Ok(ReplyInfo {
                        msg: sent,
                        seg_bytes: 0,
                        from: dst,
                    })),
                );
            }
            return Ok(());
        }
        if self.is_local(dst) {
            if !self.process_exists(dst) {
                return Err(IpcError::NoSuchProcess(dst));
            }
            if !self.admits(dst, principal) {
                return Err(IpcError::AccessDenied(dst));
            }
            self.set_sending(src, out);
            self.enqueue(now, dst, Pending::Local(src));
        } else {
            self.set_sending(src, out);
            self.transmit_send(now, src, false);
        }
        Ok(())
    }

    /// Bounds `pid`'s current Send: unless replied to by `at`, it
    /// completes with [`IpcError::Deadline`] and the exchange is abandoned
    /// (segment released, inbound bulk dropped, a late reply discarded).
    /// No effect if `pid` is not blocked in a Send.
    pub fn set_send_deadline(&mut self, pid: Pid, at: Micros) {
        if let Some(o) = self.outgoing_mut(pid) {
            o.deadline = Some(at);
            self.arm(at);
        }
    }

    /// (Re)transmits the RemoteSend of `src`'s current exchange.
    pub(super) fn transmit_send(&mut self, now: Micros, src: Pid, retransmission: bool) {
        let Some((dst, bytes)) = self.encode_send(src, retransmission) else {
            return;
        };
        if dst.is_group() {
            for to in self.group_dests(dst) {
                self.emit_raw(to, PacketType::RemoteSend, bytes.clone());
            }
        } else {
            self.emit_send(dst, bytes);
        }
        let rto = self.send_rto_for(now, dst.host());
        let host_timeout = self.cfg.host_timeout;
        let max_rto = self.max_rto();
        // The first copy asked for its answers at the sending thread's own
        // socket: that thread times the exchange itself.
        let self_timed = self.answer_source && !retransmission;
        let group = dst.is_group();
        // What is known of the peer (a copy marks it probed).
        let mut peer = (retransmission && !group).then(|| self.rtt_of(now, dst.host()));
        let Some(o) = self.outgoing_mut(src) else {
            return;
        };
        let self_timed = self_timed && o.seg.is_none() && !dst.is_group();
        let r = match &mut o.remote {
            Some(r) if retransmission => {
                r.copy_sent(now, max_rto, peer.as_mut());
                *r
            }
            _ => *o
                .remote
                .insert(Retx::start(now, rto, host_timeout, self_timed)),
        };
        let (next, shared) = (r.next(), !r.self_timed());
        if retransmission {
            self.stats.retransmits += 1;
        }
        if let Some(p) = peer {
            self.rtt.set(dst.host(), p);
        }
        if shared {
            self.arm(next);
        }
    }

    /// The RemoteSend datagram of `src`'s current exchange, and its
    /// destination.
    pub(crate) fn encode_send(&mut self, src: Pid, retransmission: bool) -> Option<(Pid, Vec<u8>)> {
        let mut bytes = self.out.buffer();
        let Some(o) = self.outgoing(src) else {
            self.recycle(bytes);
            return None;
        };
        let dst = o.dst;
        let mut h = Header::new(PacketType::RemoteSend);
        h.seq = o.seq;
        h.src = src;
        h.dst = dst;
        h.forwarder = o.forwarder;
        h.user = o.principal;
        let answer_source =
            self.answer_source && !retransmission && o.seg.is_none() && !dst.is_group();
        h.flags = if retransmission { F_RETRANSMIT } else { 0 }
            | if o.no_ahead { wire::F_REPLY_DATA } else { 0 }
            | if answer_source {
                wire::F_ANSWER_SOURCE
            } else {
                0
            };
        let msg = o.msg;
        let append = rights::appends(o.access, &o.msg);
        let (n, total) = match (&o.seg, append) {
            (Some(s), true) => (s.len().min(MAX_APPEND).min(o.append), s.len() as u32),
            (Some(s), false) => (0, s.len() as u32),
            _ => (0, 0),
        };
        h.total_length = total;
        match &o.seg {
            Some(s) if !encode_lent(&h, &msg, &**s, 0..n, &mut bytes) => {
                self.recycle(bytes);
                return None;
            }
            Some(_) => {}
            None => wire::encode_into(&h, &msg, &[], &mut bytes),
        }
        Some((dst, bytes))
    }

    pub(super) fn emit_send(&mut self, dst: Pid, bytes: Vec<u8>) {
        match self.lookup(dst.host()) {
            Some(a) => self.emit_raw(a, PacketType::RemoteSend, bytes),
            // Location unknown: fan out; the answer teaches where it is.
            None => {
                for to in self.cfg.discovery.clone() {
                    self.emit_raw(to, PacketType::RemoteSend, bytes.clone());
                }
            }
        }
    }

    pub(super) fn enqueue(&mut self, now: Micros, dst: Pid, pend: Pending) {
        let Some(p) = self.proc_mut(dst) else { return };
        p.queue.push_back(pend);
        if let PState::Receiving { .. } = p.state {
            self.try_deliver(now, dst);
        }
        if let Some(p) = self.proc_mut(dst) {
            if p.watch_queue && !p.queue.is_empty() {
                self.out.event(Event::Queued(dst));
            }
        }
    }

    /// Whether a message may be queued for `pid` (entries whose sender has
    /// since gone count until a Receive drops them).
    pub fn has_queued(&self, pid: Pid) -> bool {
        self.proc_ref(pid).is_some_and(|p| !p.queue.is_empty())
    }

    /// How many messages wait in `pid`'s queue (stale entries, of senders
    /// gone since, included): a hint of how busy it is.
    pub fn queue_len(&self, pid: Pid) -> usize {
        self.proc_ref(pid).map_or(0, |p| p.queue.len())
    }

    /// Asks for [`Event::Queued`] whenever a message is queued for `pid`
    /// and left waiting.
    pub fn watch_queue(&mut self, pid: Pid, on: bool) {
        if let Some(p) = self.proc_mut(pid) {
            p.watch_queue = on;
        }
    }

    /// The sender of a queued message, or `None` if the entry went stale
    /// (sender cancelled, destroyed, re-sent elsewhere, or alien freed).
    pub(super) fn pending_sender(&self, pend: Pending, receiver: Pid) -> Option<Pid> {
        match pend {
            Pending::Local(s) => self
                .outgoing(s)
                .filter(|o| o.dst == receiver && !o.received && o.remote.is_none())
                .map(|_| s),
            Pending::Alien(i, seq) => self
                .aliens
                .get(i)
                .filter(|a| a.seq == seq && a.receiver == receiver && a.state == AlienState::Queued)
                .map(|a| a.src),
            Pending::Group(i, seq) => self.groups.pending_sender(i, seq, receiver),
        }
    }

    /// If `pid` is receiving and a matching message is queued, deliver it.
    pub(super) fn try_deliver(&mut self, _now: Micros, pid: Pid) -> bool {
        let Some(p) = self.proc_mut(pid) else {
            return false;
        };
        let PState::Receiving { from, .. } = &p.state else {
            return false;
        };
        let from = *from;
        let Some(pend) = self.take_queued(pid, from) else {
            return false;
        };
        let Some(p) = self.proc_mut(pid) else {
            return false;
        };
        let PState::Receiving { mut buf, upto, .. } =
            std::mem::replace(&mut p.state, PState::Ready)
        else {
            return false;
        };
        let r = self.deliver(
            pid,
            pend,
            buf.as_deref_mut().map(|b| b as &mut dyn SegMem),
            upto,
        );
        self.complete(pid, Completion::Receive(Ok(r)));
        true
    }

    /// Takes the first message queued for `pid` (from `from`, if given),
    /// dropping stale entries on the way.
    fn take_queued(&mut self, pid: Pid, from: Option<Pid>) -> Option<Pending> {
        // Scan the queue without allocating: take it out, look, put it back.
        let mut queue = std::mem::take(&mut self.proc_mut(pid)?.queue);
        let mut chosen = None;
        let mut i = 0;
        // (Mostly the first entry goes: `pop_front` is far cheaper than
        // `remove(0)`.)
        let take = |q: &mut std::collections::VecDeque<Pending>, i: usize| {
            if i == 0 {
                q.pop_front()
            } else {
                q.remove(i)
            }
        };
        while i < queue.len() {
            match self.pending_sender(queue[i], pid) {
                // Stale entry (sender cancelled or gone): drop it.
                None => {
                    take(&mut queue, i);
                }
                Some(s) if from.is_none_or(|f| f == s) => {
                    chosen = take(&mut queue, i);
                    break;
                }
                Some(_) => i += 1,
            }
        }
        if let Some(p) = self.proc_mut(pid) {
            p.queue = queue;
        }
        chosen
    }

    /// Hands a queued message to `receiver`, copying the segment's first
    /// part (of a segment at most `upto` bytes long).
    pub(super) fn deliver(
        &mut self,
        receiver: Pid,
        pend: Pending,
        mut buf: Option<&mut dyn SegMem>,
        upto: usize,
    ) -> Received {
        match pend {
            Pending::Local(s) => {
                let Some(o) = self.outgoing_mut(s) else {
                    return Received::stale(s);
                };
                o.received = true;
                let mut n = 0;
                let append = rights::appends(o.access, &o.msg);
                let seg = o.seg.as_ref().filter(|s| s.len() <= upto);
                if let (Some(b), Some(seg), true) = (buf.as_mut(), seg, append) {
                    n = b.len().min(seg.len()).min(o.append);
                    if !b.copy_from(0, &**seg, 0, n) {
                        n = 0;
                    }
                }
                let _ = receiver;
                Received {
                    from: s,
                    msg: o.msg,
                    seg_bytes: n,
                    forwarder: o.forwarder,
                    principal: o.principal,
                }
            }
            Pending::Group(i, _) => {
                let Some((src, msg, data, principal)) = self.groups.take(i) else {
                    return Received::stale(Pid::NONE);
                };
                let mut n = 0;
                if let Some(b) = buf.as_mut() {
                    n = b.len().min(data.len());
                    if !b.write_at(0, &data[..n]) {
                        n = 0;
                    }
                }
                Received {
                    from: src,
                    msg,
                    seg_bytes: n,
                    forwarder: src,
                    principal,
                }
            }
            Pending::Alien(i, _) => {
                let Some((a, data)) = self.aliens.with_data(i) else {
                    return Received::stale(Pid::NONE);
                };
                a.state = AlienState::Received;
                let mut n = 0;
                if let Some(b) = buf.as_mut().filter(|_| a.seg_total as usize <= upto) {
                    n = b.len().min(data.len());
                    if !b.write_at(0, &data[..n]) {
                        n = 0;
                    }
                }
                Received {
                    from: a.src,
                    msg: a.msg,
                    seg_bytes: n,
                    forwarder: a.forwarder,
                    principal: a.principal,
                }
            }
        }
    }

    /// Receive (or ReceiveSpecific with `from`). Returns the message at once
    /// if one is queued; otherwise the process blocks until a
    /// [`Completion::Receive`]. `buf` receives the first part of a
    /// read-granted segment.
    pub fn receive(
        &mut self,
        now: Micros,
        pid: Pid,
        from: Option<Pid>,
        buf: Option<Seg>,
    ) -> Result<Option<Received>, IpcError> {
        self.receive_upto(now, pid, from, buf, usize::MAX)
    }

    /// [`Engine::receive`] that copies into `buf` only from a segment at
    /// most `upto` bytes long (a dispatcher that hands large requests on
    /// need not copy their first part).
    pub fn receive_upto(
        &mut self,
        now: Micros,
        pid: Pid,
        from: Option<Pid>,
        buf: Option<Seg>,
        upto: usize,
    ) -> Result<Option<Received>, IpcError> {
        self.check_receive(pid, from)?;
        self.set_state(pid, PState::Receiving { from, buf, upto });
        if self.try_deliver(now, pid) {
            if let Some(Completion::Receive(r)) = self.take_completion(pid) {
                // Delivered synchronously: no wake needed.
                self.out.forget_wake(pid);
                return r.map(Some);
            }
        }
        Ok(None)
    }

    /// [`Engine::receive_upto`] of a message already queued, into `buf`
    /// (nothing lent to the engine): `Ok(None)`, with nothing changed, if
    /// none is queued (then call `receive_upto`).
    pub fn receive_queued(
        &mut self,
        pid: Pid,
        from: Option<Pid>,
        buf: Option<&mut [u8]>,
        upto: usize,
    ) -> Result<Option<Received>, IpcError> {
        let mut lent = buf.map(SliceMut);
        let buf = lent.as_mut().map(|b| b as &mut dyn SegMem);
        self.receive_queued_into(pid, from, buf, upto)
    }

    /// [`Engine::receive_queued`] into any lent memory (a window of
    /// another program's, which is only copied into).
    pub fn receive_queued_into(
        &mut self,
        pid: Pid,
        from: Option<Pid>,
        buf: Option<&mut dyn SegMem>,
        upto: usize,
    ) -> Result<Option<Received>, IpcError> {
        self.check_receive(pid, from)?;
        let Some(pend) = self.take_queued(pid, from) else {
            return Ok(None);
        };
        // (As `receive_upto` would leave it: ready, no old completion.)
        self.set_state(pid, PState::Ready);
        Ok(Some(self.deliver(pid, pend, buf, upto)))
    }

    /// Whether `pid` may Receive (from `from`).
    fn check_receive(&self, pid: Pid, from: Option<Pid>) -> Result<(), IpcError> {
        self.check_ready_caller(pid)?;
        match from {
            Some(f) if !f.is_process() || (self.is_local(f) && !self.process_exists(f)) => {
                Err(IpcError::NoSuchProcess(f))
            }
            _ => Ok(()),
        }
    }

    /// Replies to `to`, which must be awaiting reply from `replier`. With
    /// `seg = Some((offset, data))` the data is written into the sender's
    /// write-granted segment at `offset` (reply-with-segment).
    pub fn reply(
        &mut self,
        now: Micros,
        replier: Pid,
        to: Pid,
        msg: Message,
        seg: Option<(u32, &[u8])>,
    ) -> Result<(), IpcError> {
        self.tick(now);
        self.check_ready_caller(replier)?;
        // More than one datagram: `reply_ahead` (a local sender's segment
        // takes any size, by copy).
        if seg.is_some_and(|(_, d)| d.len() > MAX_APPEND) && !self.is_local(to) {
            return Err(IpcError::SegmentTooLarge { max: MAX_APPEND });
        }
        // A remote sender's alien, looked up once for both uses below.
        let alien = if self.is_local(to) {
            None
        } else {
            self.aliens.received(to, replier).ok()
        };
        let one_to_one = match alien {
            Some(_) => true,
            None => self.in_exchange_with(to, replier),
        };
        if !one_to_one {
            if let Some(r) = self.group_reply(now, replier, to, msg, seg) {
                return r;
            }
        }
        if self.is_local(to) {
            let data = seg.map(|(off, d)| (off, Slice(d)));
            let data = data.as_ref().map(|(off, d)| (*off, d as &dyn SegMem));
            return self.reply_local(now, replier, to, msg, data);
        }
        let i = match alien {
            Some(i) => i,
            None => self.aliens.received(to, replier)?,
        };
        if self
            .aliens
            .get(i)
            .is_some_and(|a| self.behind_busy(replier, to, a.seq))
        {
            if let (Some(a), Some((off, d))) = (self.aliens.get(i), seg) {
                if !d.is_empty() {
                    a.check(Need::Write, off as usize, d.len())
                        .map_err(|e| e.error(to))?;
                }
            }
            let seg = seg.map(|(o, d)| (o, d.to_vec()));
            self.hold(now, i, replier, to, HeldOp::Reply { msg, seg });
            return Ok(());
        }
        self.reply_alien(now, replier, to, i, msg, seg)
    }

    /// The reply to a local sender awaiting `replier`, its data (if any)
    /// copied once into the sender's write-granted segment.
    fn reply_local(
        &mut self,
        now: Micros,
        replier: Pid,
        to: Pid,
        msg: Message,
        seg: Option<(u32, &dyn SegMem)>,
    ) -> Result<(), IpcError> {
        let Some(o) = self.outgoing_mut(to) else {
            return Err(IpcError::NotAwaitingReply(to));
        };
        if o.dst != replier || !o.received || o.remote.is_some() {
            return Err(IpcError::NotAwaitingReply(to));
        }
        let mut n = 0;
        if let Some((off, d)) = seg.filter(|(_, d)| !d.is_empty()) {
            let seg = rights::write(o.access, o.seg.as_mut(), off as usize, d.len())
                .map_err(|e| e.error(to))?;
            if !seg.copy_from(off as usize, d, 0, d.len()) {
                return Err(IpcError::OutOfBounds(to));
            }
            n = d.len();
        }
        let started = o.started;
        self.stats.local_exchanges += 1;
        if self.cfg.metrics {
            self.stats
                .local_latency_us
                .record(now.saturating_sub(started));
        }
        self.complete(
            to,
            Completion::Send(Ok(ReplyInfo {
                msg,
                seg_bytes: n,
                from: replier,
            })),
        );
        Ok(())
    }

    /// [`Engine::reply`] to a local sender with data from lent memory (of
    /// any size), copied once into the sender's segment.
    pub(super) fn reply_lent(
        &mut self,
        now: Micros,
        replier: Pid,
        to: Pid,
        msg: Message,
        off: u32,
        data: &dyn SegMem,
    ) -> Result<(), IpcError> {
        self.check_ready_caller(replier)?;
        if self.in_exchange_with(to, replier) {
            return self.reply_local(now, replier, to, msg, Some((off, data)));
        }
        // (A group's sender: its replies' data is copied anyway.)
        let v = crate::segment::to_vec(data);
        self.reply(now, replier, to, msg, Some((off, &v)))
    }

    /// Replies to the remote sender `to` of alien `i`, received by
    /// `replier` (see [`Engine::reply`]).
    pub(super) fn reply_alien(
        &mut self,
        now: Micros,
        replier: Pid,
        to: Pid,
        i: usize,
        msg: Message,
        seg: Option<(u32, &[u8])>,
    ) -> Result<(), IpcError> {
        let (src, seq, addr, idem, retx) = {
            let Some(a) = self.aliens.get(i) else {
                return Err(IpcError::NotAwaitingReply(to));
            };
            if let Some((off, d)) = seg.filter(|(_, d)| !d.is_empty()) {
                a.check(Need::Write, off as usize, d.len())
                    .map_err(|e| e.error(to))?;
            }
            (a.src, a.seq, a.addr, a.idempotent, a.retransmitted)
        };
        let mut h = Header::new(PacketType::RemoteReply);
        h.flags = if retx { F_RETRANSMIT } else { 0 };
        h.seq = seq;
        h.src = replier;
        h.dst = src;
        h.forwarder = replier;
        let data: &[u8] = match seg {
            Some((off, d)) if !d.is_empty() => {
                h.remote_addr = off;
                h.total_length = d.len() as u32;
                d
            }
            _ => &[],
        };
        let bytes = self.out.encode(&h, &msg, data);
        self.emit_raw(addr, PacketType::RemoteReply, bytes);
        if !idem {
            self.save(now, src, h, msg, data);
        }
        self.free_alien(i);
        Ok(())
    }

    /// True if `to` awaits a reply from `replier` in a one-to-one exchange.
    pub(super) fn in_exchange_with(&self, to: Pid, replier: Pid) -> bool {
        if self.is_local(to) {
            self.outgoing(to)
                .is_some_and(|o| o.dst == replier && o.received && o.remote.is_none())
        } else {
            self.aliens.received(to, replier).is_ok()
        }
    }

    /// Keeps a finished exchange's answer to re-send to retransmissions.
    pub(super) fn save(
        &mut self,
        now: Micros,
        src: Pid,
        header: Header,
        msg: Message,
        data: &[u8],
    ) {
        let stats = &mut self.stats;
        self.aliens.save(now, src, header, msg, data, stats);
        self.arm(now + self.cfg.alien_timeout / 4);
    }

    /// Forwards `from`'s message (now `msg`) to `to`, as if `from` had sent
    /// it. `from` must be awaiting reply from `forwarder`.
    pub fn forward(
        &mut self,
        now: Micros,
        forwarder: Pid,
        from: Pid,
        to: Pid,
        msg: Message,
    ) -> Result<(), IpcError> {
        self.tick(now);
        self.check_ready_caller(forwarder)?;
        if !to.is_process() {
            return Err(IpcError::InvalidPid(to));
        }
        if self.is_local(from) {
            let seq = self.new_seq();
            let to_local = self.is_local(to);
            if to_local && !self.process_exists(to) {
                return Err(IpcError::NoSuchProcess(to));
            }
            let p = self.outgoing(from).map_or(0, |o| o.principal);
            if to_local && !self.admits(to, p) {
                return Err(IpcError::AccessDenied(to));
            }
            let Some(o) = self.outgoing_mut(from) else {
                return Err(IpcError::NotAwaitingReply(from));
            };
            if o.dst != forwarder || !o.received || o.remote.is_some() {
                return Err(IpcError::NotAwaitingReply(from));
            }
            let seg_len = o.seg.as_ref().map_or(0, |s| s.len() as u32);
            o.msg = rights::carry(&o.msg, msg, seg_len);
            o.dst = to;
            o.forwarder = forwarder;
            o.received = false;
            o.seq = seq;
            o.inbound.clear();
            o.served.clear();
            if to_local {
                self.enqueue(now, to, Pending::Local(from));
            } else {
                self.transmit_send(now, from, false);
            }
            return Ok(());
        }
        let i = self.aliens.received(from, forwarder)?;
        if self
            .aliens
            .get(i)
            .is_some_and(|a| self.behind_busy(forwarder, from, a.seq))
        {
            self.forward_check(i, to)?;
            self.hold(now, i, forwarder, from, HeldOp::Forward { to, msg });
            return Ok(());
        }
        self.forward_alien(now, forwarder, from, i, to, msg)
    }

    /// Can alien `i` be forwarded to `to`?
    fn forward_check(&self, i: usize, to: Pid) -> Result<(), IpcError> {
        if self.is_local(to) {
            if !self.process_exists(to) {
                return Err(IpcError::NoSuchProcess(to));
            }
            let p = self.aliens.get(i).map_or(0, |a| a.principal);
            if !self.admits(to, p) {
                return Err(IpcError::AccessDenied(to));
            }
        }
        Ok(())
    }

    /// Forwards alien `i`, from the remote sender `from`, to `to` (see
    /// [`Engine::forward`]).
    pub(super) fn forward_alien(
        &mut self,
        now: Micros,
        forwarder: Pid,
        from: Pid,
        i: usize,
        to: Pid,
        msg: Message,
    ) -> Result<(), IpcError> {
        self.forward_check(i, to)?;
        if self.is_local(to) {
            let seq = {
                let Some(a) = self.aliens.get_mut(i) else {
                    return Err(IpcError::NotAwaitingReply(from));
                };
                a.msg = rights::carry(&a.msg, msg, a.seg_total);
                a.receiver = to;
                a.forwarder = forwarder;
                a.state = AlienState::Queued;
                a.seq
            };
            self.enqueue(now, to, Pending::Alien(i, seq));
            return Ok(());
        }
        // Remote to remote: ask the sender's kernel to re-send.
        let (seq, addr) = {
            let Some(a) = self.aliens.get(i) else {
                return Err(IpcError::NotAwaitingReply(from));
            };
            (a.seq, a.addr)
        };
        let mut h = Header::new(PacketType::RemoteForward);
        h.seq = seq;
        h.src = forwarder;
        h.dst = from;
        h.forwarder = to;
        let bytes = wire::encode(&h, &msg, &[]);
        self.emit_raw(addr, PacketType::RemoteForward, bytes);
        self.save(now, from, h, msg, &[]);
        self.free_alien(i);
        Ok(())
    }
}
