//! Datagrams in: authentication, decoding, the checks every packet
//! passes, and the handlers of the one-to-one exchange packets
//! (RemoteSend, RemoteReply, RemoteForward, NAck, ReplyPending). Bulk,
//! naming and group packets are handed to `bulk/`, `naming.rs` and
//! `group.rs`.

use std::net::SocketAddr;

use super::*;

impl Engine {
    /// Processes one received datagram. Malformed or unexpected datagrams are
    /// counted and dropped; this never panics.
    pub fn handle_datagram(&mut self, now: Micros, from: SocketAddr, buf: &[u8]) {
        self.tick(now);
        let Some(mut auth) = self.auth.take() else {
            // A keyed datagram at a host without keys: we cannot check it.
            // (Read from the bytes: a datagram too short to decode counts.)
            let keyed = buf.get(wire::field::KEY_ID).is_some_and(|&k| k != 0);
            if keyed && buf.get(wire::field::MAGIC) == Some(&wire::MAGIC) {
                self.stats.auth_rejects[crate::auth::Reject::UnknownKey as usize] += 1;
                self.notify_auth_failed(now, from, buf);
                return;
            }
            if Self::is_auth_notice(buf) {
                self.stats.auth_refused_by_peer += 1;
                return;
            }
            return self.handle_plain(now, from, buf);
        };
        let mut scratch = std::mem::take(&mut self.open_buf);
        match auth.open(buf, &mut scratch) {
            Ok(inner) => {
                self.auth = Some(auth);
                self.handle_plain(now, from, inner);
            }
            Err(crate::auth::Reject::NoKey) if Self::is_auth_notice(buf) => {
                self.auth = Some(auth);
                self.stats.auth_refused_by_peer += 1;
            }
            Err(r) => {
                self.auth = Some(auth);
                self.stats.auth_rejects[r as usize] += 1;
                if !matches!(r, crate::auth::Reject::Replay | crate::auth::Reject::Stale) {
                    self.notify_auth_failed(now, from, buf);
                }
            }
        }
        self.open_buf = scratch;
    }

    /// Is this an unauthenticated NAck saying our datagram failed
    /// authentication at its sender?
    pub(super) fn is_auth_notice(buf: &[u8]) -> bool {
        wire::decode(buf).is_ok_and(|p| {
            p.header.ptype == PacketType::NAck && p.header.status == Status::AuthFailed
        })
    }

    /// Tells `to` (unauthenticated, rate-limited) that a datagram from it
    /// failed authentication here, so its user learns the keys differ
    /// instead of seeing silence. The receiver only counts it.
    pub(super) fn notify_auth_failed(&mut self, now: Micros, from: SocketAddr, buf: &[u8]) {
        // To the port the datagram names for answers (it may have left
        // from a send-only side socket); unverified, but a notice is
        // only counted, and goes to the sender's own address.
        let mut to = from;
        if let Some(&[a, b]) = buf.get(wire::field::REPLY_PORT) {
            let port = u16::from_be_bytes([a, b]);
            if port != 0 {
                to.set_port(port);
            }
        }
        let mut h = Header::new(PacketType::NAck);
        h.status = Status::AuthFailed;
        let data = wire::encode(&h, &Message::zero(), &[]);
        self.out.notice(now, to, data);
    }

    pub(super) fn handle_plain(&mut self, now: Micros, from: SocketAddr, buf: &[u8]) {
        let pkt = match wire::decode(buf) {
            Ok(p) => p,
            Err(e) => {
                self.stats.decode_error(e);
                return;
            }
        };
        self.handle_packet(now, from, &pkt);
    }

    /// Where the data of the bulk datagram whose fixed part is `head`
    /// belongs, if it is a chunk not yet received of a transfer into a
    /// buffer lent here (and no cluster key is in use: a MAC must be
    /// checked before data lands). The runtime may then receive the
    /// datagram's data straight there and call [`Engine::handle_placed`]
    /// while it still holds this borrow's lock.
    pub fn placement(&mut self, head: &[u8]) -> Option<Place<'_>> {
        if self.auth.is_some() {
            return None;
        }
        let (h, msg, len) = wire::decode_fixed(head).ok()?;
        self.chunk_place(&h, &msg, len)
    }

    /// Handles a bulk datagram whose data the runtime received straight
    /// into the place [`Engine::placement`] gave for its fixed part `head`.
    pub fn handle_placed(&mut self, now: Micros, from: SocketAddr, head: &[u8]) {
        self.tick(now);
        let Ok((header, msg, len)) = wire::decode_fixed(head) else {
            return;
        };
        // The handlers see a stand-in of the data's length and copy
        // nothing while `placed` is set.
        static STAND_IN: [u8; wire::MAX_DATAGRAM] = [0; wire::MAX_DATAGRAM];
        let Some(data) = STAND_IN.get(..len) else {
            return;
        };
        self.placed = true;
        self.handle_packet(now, from, &Packet { header, msg, data });
        self.placed = false;
    }

    pub(super) fn handle_packet(&mut self, now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
        let pkt = *pkt;
        let source = from;
        // Answers go to the sender's main socket, which need not be the
        // socket this datagram left from (see `Header::reply_port`).
        let from = match pkt.header.reply_port {
            0 => from,
            port => SocketAddr::new(from.ip(), port),
        };
        let len = wire::FIXED_BYTES + pkt.data.len();
        self.stats.rx_type(pkt.header.ptype, len);
        let h = pkt.header;
        if self.cfg.metrics {
            self.stats
                .datagram(false, h.src.host().0, h.ptype, len, pkt.data.len());
        }
        match h.ptype {
            PacketType::LogicalHostRequest | PacketType::LogicalHostComplaint => {
                return self.on_host_alloc(now, from, &pkt);
            }
            _ => {}
        }
        let Some(me) = self.host_id() else {
            self.stats.drop(DropReason::NotReady);
            return;
        };
        if h.src.host() == me {
            self.stats.drop(DropReason::OwnEcho);
            return;
        }
        let to_group = h.ptype == PacketType::RemoteSend && h.dst.is_group();
        if h.ptype != PacketType::RemoteGetPid && !to_group && h.dst.host() != me {
            self.stats.drop(DropReason::NotForUs);
            return;
        }
        if !h.src.is_process() {
            self.stats.drop(DropReason::Malformed);
            return;
        }
        self.learn(h.src.host(), from);
        match h.ptype {
            // A sender with a socket of its own asks for its answers there
            // (the cache above still learns the main socket).
            PacketType::RemoteSend if h.flags & wire::F_ANSWER_SOURCE != 0 => {
                self.on_remote_send(now, source, &pkt)
            }
            PacketType::RemoteSend => self.on_remote_send(now, from, &pkt),
            PacketType::RemoteReply => self.on_remote_reply(now, &pkt),
            PacketType::RemoteForward => self.on_remote_forward(now, &pkt),
            PacketType::NAck => self.on_nack(now, &pkt),
            PacketType::ReplyPending => self.on_reply_pending(now, &pkt),
            PacketType::RemoteGetPid => self.on_getpid(now, from, &pkt),
            PacketType::RemoteGetPidReply => self.on_getpid_reply(now, &pkt),
            PacketType::MoveToRequest => self.on_move_to_request(now, from, &pkt),
            PacketType::MoveToReply => self.on_move_to_reply(now, &pkt),
            PacketType::MoveFromRequest => self.on_move_from_request(now, from, &pkt),
            PacketType::MoveFromReply => self.on_move_from_reply(now, &pkt),
            PacketType::LogicalHostRequest | PacketType::LogicalHostComplaint => {}
        }
    }

    pub(super) fn reply_pending(&mut self, to: SocketAddr, src: Pid, dst: Pid, seq: u32) {
        self.reply_pending_status(to, src, dst, seq, Status::Ok);
    }

    /// A replyPending with `status`: `Busy` says the request was dropped
    /// for lack of buffers (send it again later), not held.
    fn reply_pending_status(
        &mut self,
        to: SocketAddr,
        src: Pid,
        dst: Pid,
        seq: u32,
        status: Status,
    ) {
        let mut h = Header::new(PacketType::ReplyPending);
        h.seq = seq;
        h.src = dst;
        h.dst = src;
        h.status = status;
        self.emit(Dest::Addr(to), &h, &Message::zero(), &[]);
    }

    pub(super) fn on_remote_send(&mut self, now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
        let h = pkt.header;
        if h.dst.is_group() {
            return self.on_group_send(now, from, pkt);
        }
        let Some(me) = self.host_id() else { return };
        // What is known of this sender (one lookup: every remote request
        // takes this path).
        let (had_saved, prev_alien, last) =
            match self.aliens.known(h.src, h.seq, now, &mut self.stats) {
                // Retransmission of a finished non-idempotent exchange.
                Known::Answer(t, b) => return self.emit_raw(from, t, b),
                Known::Sender {
                    had_saved,
                    alien,
                    last,
                } => (had_saved, alien, last),
            };
        // Duplicate of an exchange in progress?
        if let Some(i) = prev_alien {
            if self.aliens.is(i, h.seq) {
                self.stats.duplicates += 1;
                if let Some(a) = self.aliens.get_mut(i) {
                    a.last_heard = now;
                    a.addr = from;
                    a.no_ahead |= h.flags & wire::F_REPLY_DATA != 0;
                }
                self.reply_pending(from, h.src, h.dst, h.seq);
                return;
            }
        }
        // The same seq with no alien left is an idempotent request whose
        // reply was lost: execute it again. Older ones are stale.
        if last.is_some_and(|last| seq_older(h.seq, last)) {
            self.stats.drop(DropReason::Stale);
            return;
        }
        let refusal = match self.procs.get(h.dst.local()) {
            Some(p) if h.dst.is_process() && h.dst.host() == me => {
                let admitted = p.admits.as_ref().is_none_or(|a| a.contains(&h.user));
                (!admitted).then_some(Status::AccessDenied)
            }
            _ => Some(Status::NoSuchProcess),
        };
        if let Some(status) = refusal {
            let mut n = Header::new(PacketType::NAck);
            n.status = status;
            n.seq = h.seq;
            n.src = h.dst;
            n.dst = h.src;
            self.emit(Dest::Addr(from), &n, &Message::zero(), &[]);
            return;
        }
        // The newest seq again, with neither an alien nor a saved answer:
        // the request ran and its answer is gone (evicted from the bounded
        // table, or expired). Only an idempotent request may run again; a
        // non-idempotent one is dropped and its sender times out.
        if last == Some(h.seq) && !pkt.msg.idempotent() {
            self.stats.drop(DropReason::Stale);
            return;
        }
        // A new message from this sender acknowledges its previous exchange.
        if had_saved {
            self.aliens.forget_saved(h.src);
        }
        if let Some(old) = prev_alien {
            self.free_alien(old);
        }
        let access = pkt.msg.seg_access();
        let mut msg = pkt.msg;
        msg.set_seg_addr(0);
        msg.set_seg_len(h.total_length);
        let alien = Alien {
            src: h.src,
            principal: h.user,
            seq: h.seq,
            receiver: h.dst,
            addressed: h.dst,
            forwarder: h.forwarder,
            msg,
            access,
            seg_total: h.total_length,
            idempotent: pkt.msg.idempotent(),
            no_ahead: h.flags & wire::F_REPLY_DATA != 0,
            state: AlienState::Queued,
            retransmitted: h.flags & F_RETRANSMIT != 0,
            last_heard: now,
            addr: from,
        };
        let Some(i) = self.aliens.admit(alien, pkt.data, now, &mut self.stats) else {
            self.stats.drop(DropReason::NoBuffers);
            self.reply_pending_status(from, h.src, h.dst, h.seq, Status::Busy);
            return;
        };
        self.arm(now + self.cfg.alien_timeout);
        self.enqueue(now, h.dst, Pending::Alien(i, h.seq));
    }

    #[inline]
    pub(super) fn free_alien(&mut self, i: usize) {
        self.aliens.free(i, &mut self.stats);
    }

    /// The local process awaiting a remote reply with this sequence number.
    #[inline]
    pub(super) fn remote_waiter(&mut self, pid: Pid, seq: u32) -> Option<&mut Outgoing> {
        let o = self.outgoing_mut(pid)?;
        (o.seq == seq && o.remote.is_some()).then_some(o)
    }

    pub(super) fn on_remote_reply(&mut self, now: Micros, pkt: &Packet<'_>) {
        if self.on_group_reply(now, pkt) {
            return;
        }
        let h = pkt.header;
        let Some(o) = self.remote_waiter(h.dst, h.seq) else {
            self.stats.drop(DropReason::NoMatch);
            return;
        };
        // Segment data sent ahead of the reply must all be here; if not,
        // ask again at once (the request is idempotent, it runs again).
        let ahead = if h.flags & wire::F_REPLY_DATA != 0 {
            h.local_addr as usize
        } else {
            0
        };
        if ahead > 0 {
            let base = (h.remote_addr as usize).checked_sub(ahead);
            let whole = o.inbound.iter().any(|b| {
                b.ahead
                    && b.mover == h.src
                    && Some(b.base) == base
                    && b.total == ahead
                    && b.got.full()
            });
            if !whole {
                // Once: the request goes again, asking for the data to be
                // moved (MoveTo retransmits selectively; sending ahead
                // again could lose a piece every time on a lossy path).
                o.no_ahead = true;
                self.stats.drop(DropReason::ReplyDataMissing);
                self.transmit_send(now, h.dst, true);
                return;
            }
        }
        let mut n = ahead;
        let mut violation = false;
        if !pkt.data.is_empty() {
            let off = h.remote_addr as usize;
            match rights::write(o.access, o.seg.as_mut(), off, pkt.data.len()) {
                Ok(seg) => match seg.write_at(off, pkt.data) {
                    true => n += pkt.data.len(),
                    false => violation = true,
                },
                Err(_) => violation = true,
            }
        }
        let retx = o.remote;
        if violation {
            self.stats.drop(DropReason::SegmentViolation);
        }
        // A reply not flagged RETRANSMIT answers the first copy
        // (`Retx::on_reply` says what that proves).
        let whole = retx.map(|r| {
            let host = h.src.host();
            let mut peer = self.rtt_of(now, host);
            let a = r.on_reply(now, h.flags & F_RETRANSMIT == 0, &mut peer);
            self.rtt.set(host, peer);
            self.stats.retransmits_needless += u64::from(a.needless_copies);
            a.waited
        });
        self.stats.remote_exchanges += 1;
        if let (Some(l), true) = (whole, self.cfg.metrics) {
            self.stats.remote_latency_us.record(l);
        }
        self.complete(
            h.dst,
            Completion::Send(Ok(ReplyInfo {
                msg: pkt.msg,
                seg_bytes: n,
                from: h.src,
            })),
        );
    }

    pub(super) fn on_remote_forward(&mut self, now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        let new_dst = h.forwarder;
        let seq = self.new_seq();
        let Some(o) = self.remote_waiter(h.dst, h.seq) else {
            self.stats.drop(DropReason::NoMatch);
            return;
        };
        if !new_dst.is_process() {
            self.stats.drop(DropReason::Malformed);
            return;
        }
        let seg_len = o.seg.as_ref().map_or(0, |s| s.len() as u32);
        o.msg = rights::carry(&o.msg, pkt.msg, seg_len);
        o.dst = new_dst;
        o.forwarder = h.src;
        o.seq = seq;
        o.remote = None;
        o.received = false;
        o.inbound.clear();
        o.served.clear();
        let principal = o.principal;
        if self.is_local(new_dst) {
            if !self.admits(new_dst, principal) {
                self.complete(
                    h.dst,
                    Completion::Send(Err(IpcError::AccessDenied(new_dst))),
                );
            } else if self.process_exists(new_dst) {
                self.enqueue(now, new_dst, Pending::Local(h.dst));
            } else {
                self.complete(
                    h.dst,
                    Completion::Send(Err(IpcError::NoSuchProcess(new_dst))),
                );
            }
        } else {
            self.transmit_send(now, h.dst, false);
        }
    }

    pub(super) fn on_nack(&mut self, _now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        if self.remote_waiter(h.dst, h.seq).is_some() {
            let err = crate::sender::nack_error(h.status, h.src);
            self.complete(h.dst, Completion::Send(Err(err)));
            return;
        }
        self.stats.drop(DropReason::NoMatch);
    }

    pub(super) fn on_reply_pending(&mut self, now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        let host_timeout = self.cfg.host_timeout;
        let host = h.src.host();
        let rto = self.send_rto_for(now, host);
        // What is known of the peer (`Retx::on_reply_pending` updates it).
        let fresh = self.rtt_of(now, host);
        if let Some(o) = self.remote_waiter(h.dst, h.seq) {
            if let Some(r) = o.remote.as_mut() {
                let busy = h.status == Status::Busy;
                let mut peer = fresh;
                r.on_reply_pending(now, busy, rto, host_timeout, &mut peer);
                let (next, shared) = (r.next(), !r.self_timed());
                if !busy {
                    self.rtt.set(host, peer);
                }
                if shared {
                    self.arm(next);
                }
            }
            return;
        }
        if self.bulk_pending(now, &h) {
            return;
        }
        self.stats.drop(DropReason::NoMatch);
    }
}
