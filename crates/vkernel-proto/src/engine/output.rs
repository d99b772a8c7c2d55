//! What the engine hands the runtime: datagrams, bulk chunks and events.
//!
//! Datagrams are encoded into buffers the runtime hands back after sending
//! ([`Output::recycle`]; [`super::Engine::poll_transmit_into`] swaps them in
//! one call), so a steady exchange allocates none. Bulk chunks are queued
//! as a header and a byte range of a lent buffer, not encoded: the runtime
//! may send them straight from that buffer (`Engine::send_chunk_batch`), or
//! `Engine::poll_transmit` encodes them. Authentication-failure notices
//! go out unsealed, at most one per [`NOTICE_GAP`].

use std::collections::VecDeque;
use std::net::SocketAddr;

use super::{Event, Transmit};
use crate::config::Micros;
use crate::message::Message;
use crate::pid::Pid;
use crate::wire::{self, Header};

/// Buffers kept for reuse, and the largest kept: a bulk datagram (with
/// room for the trailer), so a transfer's chunks reuse buffers too.
const SPARE_BUFS: usize = 16;
const SPARE_MAX_BYTES: usize = wire::MAX_DATAGRAM + crate::auth::TRAILER_BYTES;

/// Least time between two authentication-failure notices.
pub(super) const NOTICE_GAP: Micros = 10_000;

/// A bulk datagram queued with its data left in the lent buffer.
pub(super) struct Chunk {
    pub(super) to: SocketAddr,
    pub(super) header: Header,
    pub(super) msg: Message,
    pub(super) from: ChunkSrc,
    /// Byte range of the lent buffer.
    pub(super) start: usize,
    pub(super) end: usize,
}

/// Whose lent buffer a chunk's data is in.
#[derive(Clone, Copy)]
pub(super) enum ChunkSrc {
    /// A MoveTo's source (the mover's buffer).
    Moving(Pid),
    /// A write-behind MoveTo's own copy, by transfer id.
    Behind(u32),
    /// A sender's segment, in the exchange with this sequence number.
    Lent(Pid, u32),
    /// The data of the reply being sent (`Engine::reply_ahead`).
    Reply,
}

/// The engine's output queues. See the module docs.
#[derive(Default)]
pub(super) struct Output {
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    /// Datagram buffers handed back, reused by the next encodes.
    spare: Vec<Vec<u8>>,
    chunks: VecDeque<Chunk>,
    /// A gathered send's header.
    head: Vec<u8>,
    /// Unauthenticated notices, sent as they are (never sealed).
    notices: VecDeque<Transmit>,
    last_notice: Option<Micros>,
    /// The host shut down: nothing more leaves it.
    closed: bool,
}

impl Output {
    /// True if datagrams, chunks or events wait to be taken.
    #[inline]
    pub(super) fn any(&self) -> bool {
        !self.transmits.is_empty()
            || !self.chunks.is_empty()
            || !self.events.is_empty()
            || !self.notices.is_empty()
    }

    /// A buffer to encode into (a spare one if any).
    #[inline]
    pub(super) fn buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// Keeps a sent datagram's buffer for reuse (only if small, and only
    /// a few).
    #[inline]
    pub(super) fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < SPARE_BUFS && buf.capacity() <= SPARE_MAX_BYTES {
            self.spare.push(buf);
        }
    }

    /// Encodes a datagram into a reused buffer if one is spare.
    #[inline]
    pub(super) fn encode(&mut self, h: &Header, msg: &Message, data: &[u8]) -> Vec<u8> {
        let mut b = self.buffer();
        wire::encode_into(h, msg, data, &mut b);
        b
    }

    /// Queues a datagram.
    #[inline]
    pub(super) fn push(&mut self, to: SocketAddr, data: Vec<u8>) {
        if !self.closed {
            self.transmits.push_back(Transmit { to, data });
        }
    }

    /// Drops everything queued and queues nothing from now on: a host
    /// that shut down must look dead to its peers, not answer a request
    /// with what a process still running on it says after the shutdown.
    pub(super) fn close(&mut self) {
        self.closed = true;
        self.transmits.clear();
        self.chunks.clear();
        self.notices.clear();
    }

    /// The next notice, else the next datagram.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<Transmit> {
        self.pop_notice().or_else(|| self.transmits.pop_front())
    }

    /// The next notice (sent unsealed).
    #[inline]
    pub(super) fn pop_notice(&mut self) -> Option<Transmit> {
        self.notices.pop_front()
    }

    /// Queues an unauthenticated notice unless one went out less than
    /// [`NOTICE_GAP`] ago.
    pub(super) fn notice(&mut self, now: Micros, to: SocketAddr, data: Vec<u8>) {
        if self.closed
            || self
                .last_notice
                .is_some_and(|t| now.saturating_sub(t) < NOTICE_GAP)
        {
            return;
        }
        self.last_notice = Some(now);
        self.notices.push_back(Transmit { to, data });
    }

    /// Queues a bulk chunk.
    #[inline]
    pub(super) fn chunk(&mut self, c: Chunk) {
        if !self.closed {
            self.chunks.push_back(c);
        }
    }

    /// The next queued chunk.
    #[inline]
    pub(super) fn pop_chunk(&mut self) -> Option<Chunk> {
        self.chunks.pop_front()
    }

    /// True if chunks are queued.
    #[inline]
    pub(super) fn has_chunks(&self) -> bool {
        !self.chunks.is_empty()
    }

    /// The header buffer of gathered sends (put back with
    /// [`Output::put_head`]).
    pub(super) fn take_head(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.head)
    }

    /// Returns the header buffer.
    pub(super) fn put_head(&mut self, head: Vec<u8>) {
        self.head = head;
    }

    /// Queues an event.
    #[inline]
    pub(super) fn event(&mut self, e: Event) {
        self.events.push_back(e);
    }

    /// The next event.
    #[inline]
    pub(super) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Withdraws a wake of `pid` (its completion was returned directly).
    pub(super) fn forget_wake(&mut self, pid: Pid) {
        self.events.retain(|e| *e != Event::Wake(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::PacketType;

    fn to() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9))
    }

    #[test]
    fn buffers_handed_back_carry_the_next_datagram() {
        let mut o = Output::default();
        let mut b = Vec::with_capacity(4096);
        b.extend_from_slice(&[7; 100]);
        let p = b.as_ptr();
        o.recycle(b);
        let h = Header::new(PacketType::RemoteSend);
        let d = o.encode(&h, &Message::zero(), b"x");
        assert_eq!(d.as_ptr(), p, "the spare buffer is reused");
        assert_eq!(d, wire::encode(&h, &Message::zero(), b"x"));
        o.recycle(Vec::with_capacity(SPARE_MAX_BYTES + 1));
        assert!(o.spare.is_empty(), "a large buffer is not kept");
    }

    #[test]
    fn notices_come_first_and_are_rate_limited() {
        let mut o = Output::default();
        o.push(to(), vec![1]);
        o.notice(0, to(), vec![2]);
        o.notice(NOTICE_GAP - 1, to(), vec![3]);
        assert_eq!(o.pop().map(|t| t.data), Some(vec![2]));
        assert_eq!(o.pop().map(|t| t.data), Some(vec![1]));
        assert!(o.pop().is_none());
        o.notice(NOTICE_GAP, to(), vec![4]);
        assert_eq!(o.pop().map(|t| t.data), Some(vec![4]));
    }

    #[test]
    fn a_withdrawn_wake_is_not_reported() {
        let mut o = Output::default();
        let (a, b) = (Pid(0x10002), Pid(0x10003));
        o.event(Event::Wake(a));
        o.event(Event::Wake(b));
        o.forget_wake(a);
        assert!(o.any());
        assert_eq!(o.poll_event(), Some(Event::Wake(b)));
        assert!(!o.any());
    }
}
