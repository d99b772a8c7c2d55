//! Datagrams out: encoding into the output queues, and handing datagrams
//! and bulk chunks to the runtime (see `output.rs` for the queues).

use std::net::SocketAddr;

use super::*;
use crate::wire;

impl Engine {
    /// Next datagram to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some(t) = self.out.pop_notice() {
            return Some(t);
        }
        if self.out.has_chunks() {
            self.encode_chunks();
        }
        let mut t = self.out.pop()?;
        // Named before sealing: the port is under the MAC.
        if self.cfg.reply_port != 0 {
            if let Some(mut r) = wire::RawHeader::new_checked(&mut t.data[..]) {
                r.set_reply_port(self.cfg.reply_port);
            }
        }
        if self.cfg.metrics && t.data.len() >= wire::FIXED_BYTES {
            let d = &t.data;
            let r = wire::RawHeader::new_checked(&d[..]);
            if let Some((pt, dst)) = r.and_then(|r| Some((r.ptype()?, r.dst()))) {
                let len = d.len();
                self.stats
                    .datagram(true, dst.host().0, pt, len, len - wire::FIXED_BYTES);
            }
        }
        // Sealed here, on the way out, so every transmission (and every
        // re-send of a kept answer) gets a fresh counter.
        if let Some(a) = self.auth.as_mut() {
            a.seal(&mut t.data);
        }
        Some(t)
    }

    /// Hands back a sent datagram's buffer for reuse by a later message
    /// (kept only if small, and only a few).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.out.recycle(buf);
    }

    /// [`Engine::poll_transmit`] into the caller's buffer: the next
    /// datagram replaces `buf`'s contents and its destination is returned;
    /// `buf`'s old allocation is kept for a later datagram (the two are
    /// swapped, nothing is copied).
    pub fn poll_transmit_into(&mut self, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        let t = self.poll_transmit()?;
        let old = std::mem::replace(buf, t.data);
        self.out.recycle(old);
        Some(t.to)
    }

    #[inline]
    pub(super) fn emit(&mut self, dest: Dest, h: &Header, msg: &Message, data: &[u8]) {
        // Encoded into the datagram's own buffer (with room for the
        // authentication trailer), not into a scratch buffer then copied.
        let buf = self.out.encode(h, msg, data);
        match dest {
            Dest::Addr(to) => self.emit_raw(to, h.ptype, buf),
            Dest::Discovery => {
                for to in self.cfg.discovery.clone() {
                    self.emit_raw(to, h.ptype, buf.clone());
                }
            }
        }
    }

    #[inline]
    pub(super) fn emit_raw(&mut self, to: SocketAddr, ptype: PacketType, bytes: Vec<u8>) {
        self.stats.tx_type(ptype, bytes.len());
        self.out.push(to, bytes);
    }

    /// The buffer a queued chunk's bytes are in, if it is still lent.
    pub(super) fn chunk_data(&self, c: &Chunk) -> Option<&dyn SegMem> {
        Some(match c.from {
            ChunkSrc::Moving(p) => match &self.procs.get(p.local())?.state {
                PState::Moving(op) => op.buffer_of(c.header.seq)?,
                _ => return None,
            },
            ChunkSrc::Behind(x) => self.behind.get(&x)?.buffer_of(c.header.seq)?,
            ChunkSrc::Lent(p, seq) => &**self.outgoing(p).filter(|o| o.seq == seq)?.seg.as_ref()?,
            ChunkSrc::Reply => &**self.reply_src.as_ref()?,
        })
    }

    /// Encodes the queued chunks into ordinary datagrams (a copy each).
    pub(super) fn encode_chunks(&mut self) {
        while let Some(c) = self.out.pop_chunk() {
            let mut b = self.out.buffer();
            let lent = self.chunk_data(&c);
            if !lent.is_some_and(|s| encode_lent(&c.header, &c.msg, s, c.start..c.end, &mut b)) {
                self.recycle(b);
                continue;
            }
            self.emit_raw(c.to, c.header.ptype, b);
        }
        // Its chunks are out: the reply's data is no longer needed.
        self.reply_src = None;
    }

    /// Hands every queued bulk chunk to `send`, in order in one slice, as
    /// a header and where its data lies in the lent buffer, so the runtime
    /// sends them with no copy in user space and with one call
    /// (segmentation offload, `sendmmsg`). Must be called under the same
    /// borrow of the engine that queued them (the runtime's engine lock):
    /// the data is lent memory. Without a cluster key only (a sealed
    /// datagram is made whole first); otherwise [`Engine::poll_transmit`]
    /// encodes them.
    pub fn send_chunk_batch(&mut self, send: impl FnOnce(&[Gathered<'_>])) {
        if self.auth.is_some() || !self.out.has_chunks() {
            return;
        }
        let mut chunks = Vec::new();
        while let Some(c) = self.out.pop_chunk() {
            chunks.push(c);
        }
        let mut heads = self.out.take_head();
        heads.clear();
        for c in &chunks {
            crate::wire::encode_head(&c.header, &c.msg, c.end - c.start, &mut heads);
        }
        let fixed = crate::wire::FIXED_BYTES;
        let mut sent = Vec::with_capacity(chunks.len());
        {
            let mut batch = Vec::with_capacity(chunks.len());
            for (k, c) in chunks.iter().enumerate() {
                let g = self
                    .chunk_data(c)
                    .zip(heads.get(k * fixed..(k + 1) * fixed));
                let Some(g) = g.and_then(|(lent, head)| {
                    Gathered::new(c.to, head, lent, c.start..c.end.max(c.start))
                }) else {
                    continue;
                };
                let n = g.data.len();
                sent.push((c.header.ptype, fixed + n, n, c.header.dst));
                batch.push(g);
            }
            send(&batch);
        }
        for (ptype, len, data_len, dst) in sent {
            self.stats.tx_type(ptype, len);
            if self.cfg.metrics {
                self.stats
                    .datagram(true, dst.host().0, ptype, len, data_len);
            }
        }
        self.out.put_head(heads);
        // Its chunks are out: the reply's data is no longer needed.
        self.reply_src = None;
    }
}
