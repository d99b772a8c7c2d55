//! MoveTo / MoveFrom: local copies, and remote streaming of chunk datagrams
//! with one acknowledgement per half window, selective retransmission from a
//! chunk bitmap, and a credit window for flow control.
//!
//! The message words of bulk packets are [`BulkMsg`] (`wire::bulk_field`).
//!
//! By concern: this file holds the transfer records (`MoveOp`, `Behind`,
//! `Held`, `InBulk`) and what every path shares; `mover` the primitives a
//! mover calls (MoveTo, MoveFrom, reply data sent ahead, a local grant);
//! `transfer` a remote transfer on the wire from the mover's side (chunks
//! and credit out, acknowledgements and data in, timers); `owner` the
//! owner's side (requests checked against the exchange, data placed or
//! sent); `behind` write-behind MoveTo (streams, replies held until the
//! data is acknowledged).

mod behind;
mod mover;
mod owner;
mod transfer;

use std::collections::HashMap;
use std::net::SocketAddr;

use super::aliens::AlienState;
use super::bitset::{packed_get, BitSet};
use super::congestion::Cwnd;
use super::rights::{self, Need};
use super::{Chunk, ChunkSrc, Completion, Dest, Engine, PState, Place};
use crate::config::{Micros, MAX_APPEND};
use crate::error::IpcError;
use crate::message::Message;
use crate::pid::Pid;
use crate::segment::{Seg, SegMem, SharedSeg};
use crate::stats::DropReason;
use crate::wire::{
    BulkMsg, Header, Packet, PacketType, Status, F_ACK_NOW, F_REPLY_DATA, F_RETRANSMIT,
};

/// Largest bitmap carried in one acknowledgement, in chunks.
const MAX_ACK_SPAN: usize = 8192 * 8;
/// Inbound MoveTo transfers remembered per exchange (a mover may have
/// several write-behind MoveTos in flight).
const MAX_INBOUND: usize = 16;
/// Shortest tail-loss probe delay (see `MoveOp::tlp`).
const TLP_MIN: Micros = 200;
/// Shortest reordering window of a MoveFrom gap (see `MoveOp::gap_due`).
const REORDER_MIN: Micros = 100;
/// How long an owner takes a MoveFrom chunk it sent for still in flight
/// (see `Outgoing::served`): no longer than the shortest reordering
/// window, so that no request for a lost chunk is ever ignored.
const SERVED_FOR: Micros = REORDER_MIN;
/// MoveFrom chunks an owner remembers sending, per exchange.
const MAX_SERVED: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Our buffer → their segment.
    To,
    /// Their segment → our buffer.
    From,
}

/// A remote MoveTo/MoveFrom the mover is blocked in.
pub(crate) struct MoveOp {
    dir: Dir,
    peer: Pid,
    xseq: u32,
    xfer: u32,
    base: u32,
    total: usize,
    chunk: usize,
    buf: MoveBuf,
    /// MoveTo: acknowledged chunks. MoveFrom: received chunks.
    done: BitSet,
    /// MoveTo: next never-sent chunk. MoveFrom: end of the requested range.
    next_new: usize,
    /// MoveTo: transmission counter of each chunk's last send.
    last_tx: Vec<u32>,
    tx_counter: u32,
    rto: Micros,
    timer: Micros,
    deadline: Micros,
    addr: SocketAddr,
    /// The process the owner's kernel believes its sender awaits: the
    /// mover, or the process that forwarded the exchange to it locally.
    on_behalf: Pid,
    /// MoveFrom: one past the highest chunk index received so far.
    max_seen: usize,
    /// RTT probe: (chunk index whose answer is timed, time sent). Only
    /// first transmissions are timed (Karn).
    probe: Option<(usize, Micros)>,
    /// Congestion window: chunks in flight (MoveTo) or credit granted and
    /// not yet received (MoveFrom), within the flow-control window.
    cwnd: Cwnd,
    /// Tail-loss probe delay: two smoothed round trips (0 before any
    /// sample). When nothing has come back for that long the transfer
    /// probes once (the first missing chunk, or the outstanding credit)
    /// without cutting the window, before waiting out the full timeout.
    /// Owners answer bulk at once, so this is far below the exchanges'
    /// 2 ms timeout floor, which allows for a server's work.
    tlp: Micros,
    /// The probe was sent since the last progress.
    probed: bool,
    /// MoveFrom: the chunk a tail-loss probe asked for again (the last
    /// one outstanding). When a copy of it arrives, every chunk still
    /// missing below it was lost (the owner sends in order) and is asked
    /// for again after the reordering window (`gap_due`); until then
    /// nothing is resent, as the rest may only be late (TCP's TLP with
    /// RACK).
    tlp_probe: Option<usize>,
    /// MoveFrom: when the chunks still missing below `.1` (`max_seen`
    /// when the gap was seen) count as lost and are asked for again. A
    /// gap waits a reordering window first: the owner's or this host's
    /// threads may hand chunks over out of order, and a copy of one that
    /// is only late is a needless resend.
    gap_due: Option<(Micros, usize)>,
    /// Not started: it waits for the mover's write-behind MoveTos to the
    /// same process to be acknowledged first (its range overlaps one).
    waiting: bool,
    /// A write-behind stream that may still grow: the mover's next MoveTo,
    /// if it continues where this one ends, is appended to it (see
    /// `Engine::extend_stream`). Its last chunk, while partial, is not
    /// sent: a later MoveTo may fill it.
    open: bool,
}

/// The data a remote move sends or fills.
enum MoveBuf {
    /// The caller's lent buffer, or a write-behind MoveTo's stable source.
    Lent(Seg),
    /// A write-behind MoveTo's own copy, which later contiguous MoveTos
    /// may extend.
    Owned(Vec<u8>),
    /// A write-behind MoveTo's shared source, kept: later MoveTos from
    /// the range that follows may extend it.
    Shared(SharedSeg),
}

impl MoveBuf {
    /// The buffer, to copy from.
    fn mem(&self) -> &dyn SegMem {
        match self {
            MoveBuf::Lent(s) => &**s,
            MoveBuf::Owned(v) => v,
            MoveBuf::Shared(s) => s,
        }
    }

    /// The buffer, to copy into (a shared source refuses writes).
    fn mem_mut(&mut self) -> &mut dyn SegMem {
        match self {
            MoveBuf::Lent(s) => &mut **s,
            MoveBuf::Owned(v) => v,
            MoveBuf::Shared(s) => s,
        }
    }
}

impl MoveOp {
    /// When the timer should next fire, from `now`.
    fn next_timer(&self, now: Micros) -> Micros {
        let wait = if self.probed || self.tlp == 0 {
            self.rto
        } else {
            self.tlp.min(self.rto)
        };
        now + wait
    }
}

impl MoveOp {
    /// The mover's buffer, if this transfer is of exchange `xseq`.
    pub(super) fn buffer_of(&self, xseq: u32) -> Option<&dyn SegMem> {
        (self.xseq == xseq).then(|| self.buf.mem())
    }

    /// Chunks that may be sent now: all but an open stream's partial last
    /// one.
    fn sendable(&self) -> usize {
        let nc = self.done.len();
        if self.open && !self.total.is_multiple_of(self.chunk) {
            nc.saturating_sub(1)
        } else {
            nc
        }
    }
}

/// A write-behind MoveTo: answered at once, its data copied and then sent
/// and acknowledged while the mover goes on.
pub(crate) struct Behind {
    mover: Pid,
    /// Order of starting among the engine's write-behind MoveTos (older
    /// first): only a mover's oldest transfer to a host keeps a timer.
    order: u64,
    op: MoveOp,
}

impl Behind {
    fn is_for(&self, mover: Pid, peer: Pid, xseq: u32) -> bool {
        self.mover == mover && self.op.peer == peer && self.op.xseq == xseq
    }

    /// The copy being sent, if this transfer is of exchange `xseq`.
    pub(super) fn buffer_of(&self, xseq: u32) -> Option<&dyn SegMem> {
        self.op.buffer_of(xseq)
    }
}

/// A Reply or Forward held until the replier's write-behind MoveTos to
/// the sender are acknowledged, so that the sender never resumes before
/// its segment holds all the data moved to it.
pub(crate) struct Held {
    by: Pid,
    sender: Pid,
    seq: u32,
    op: HeldOp,
}

/// What is held.
pub(super) enum HeldOp {
    Reply {
        msg: Message,
        seg: Option<(u32, Vec<u8>)>,
    },
    Forward {
        to: Pid,
        msg: Message,
    },
}

/// Which transfer: the one a process is blocked in, or a write-behind
/// MoveTo (by transfer id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MoveRef {
    Proc(Pid),
    Behind(u32),
}

/// A MoveTo arriving into a local process's segment (owner side).
#[derive(Clone)]
pub(crate) struct InBulk {
    pub(super) mover: Pid,
    xfer: u32,
    pub(super) got: BitSet,
    highest: usize,
    /// Data of a reply that follows ([`F_REPLY_DATA`]): never
    /// acknowledged; the reply checks it is whole.
    pub(super) ahead: bool,
    /// Where the transfer starts in the segment, and its length (the
    /// largest any of its chunks named: a write-behind stream grows).
    pub(super) base: usize,
    pub(super) total: usize,
    chunk: usize,
}

impl InBulk {
    /// Transfer `xfer` of `mover`: `total` bytes at `base`, in `chunk`-byte
    /// chunks, none received yet.
    pub(super) fn new(
        (mover, xfer): (Pid, u32),
        ahead: bool,
        base: usize,
        total: usize,
        chunk: usize,
    ) -> InBulk {
        InBulk {
            mover,
            xfer,
            got: BitSet::new(nchunks(total, chunk)),
            highest: 0,
            ahead,
            base,
            total,
            chunk,
        }
    }

    /// May chunk `idx` (`want` bytes) of a transfer said to be `total`
    /// bytes in `chunk`-byte chunks belong to this one? A stream's mover
    /// sends every chunk whole but the last, so earlier chunks name
    /// smaller totals, and a larger total is a stream that grew: its old
    /// last chunk must not have come partial.
    pub(super) fn admits(&self, total: usize, chunk: usize, want: usize) -> bool {
        if chunk != self.chunk {
            return false;
        }
        match total.cmp(&self.total) {
            std::cmp::Ordering::Equal => true,
            std::cmp::Ordering::Less => want == chunk,
            std::cmp::Ordering::Greater => {
                self.total.is_multiple_of(chunk) || !self.got.get(self.total / chunk)
            }
        }
    }
}

fn status_error(s: Status, peer: Pid) -> IpcError {
    match s {
        Status::NoSuchProcess => IpcError::NoSuchProcess(peer),
        Status::AccessDenied => IpcError::AccessDenied(peer),
        Status::OutOfBounds => IpcError::OutOfBounds(peer),
        Status::Busy => IpcError::NoResources,
        Status::NotAwaitingReply => IpcError::NotAwaitingReply(peer),
        _ => IpcError::Refused(peer),
    }
}

fn nchunks(total: usize, chunk: usize) -> usize {
    total.div_ceil(chunk.max(1))
}

impl Engine {
    /// Tail-loss probe delay for a transfer to `host`.
    fn tlp_for(&self, host: crate::pid::HostId) -> Micros {
        self.srtt(host).map_or(0, |s| (2 * s).max(TLP_MIN))
    }

    /// How long a MoveFrom gap may be reordering, not loss: half a
    /// smoothed round trip.
    fn reorder_window(&self, host: crate::pid::HostId) -> Micros {
        self.srtt(host)
            .map_or(REORDER_MIN, |s| (s / 2).max(REORDER_MIN))
    }

    fn window_chunks(&self, chunk: usize) -> usize {
        (self.cfg.window / chunk.max(1)).max(1)
    }

    /// A remote move of `buf` at `base` in `peer`'s segment, for the
    /// exchange `(xseq, addr, on_behalf)`: nothing sent or received yet.
    fn new_move(
        &mut self,
        now: Micros,
        dir: Dir,
        peer: Pid,
        base: u32,
        (buf, open): (MoveBuf, bool),
        (xseq, addr, on_behalf): (u32, SocketAddr, Pid),
    ) -> MoveOp {
        // As many chunks as the largest datagram needs, of equal size: a
        // 64 KiB unit goes as two halves, not as a full datagram and a
        // 133-byte tail (which costs a send and a receive of its own, and
        // is too small for the owner to receive in place). A stream that
        // may grow has chunks of the largest size: a later MoveTo fills
        // its tail.
        let max = self.cfg.chunk_bytes();
        let total = buf.mem().len();
        let nc = nchunks(total, max);
        let chunk = if nc > 1 && !open {
            total.div_ceil(nc)
        } else {
            max
        };
        let cwnd = match self.cwnds.get(&peer.host()) {
            Some(c) => c.carried(),
            None => Cwnd::new(self.window_chunks(chunk)),
        };
        MoveOp {
            dir,
            peer,
            xseq,
            xfer: self.random_u32(),
            base,
            total,
            chunk,
            buf,
            done: BitSet::new(nc),
            next_new: 0,
            last_tx: Vec::new(),
            tx_counter: 0,
            rto: self.rto_for(peer.host()),
            timer: 0,
            deadline: now + self.cfg.host_timeout,
            addr,
            on_behalf,
            max_seen: 0,
            probe: None,
            cwnd,
            tlp: self.tlp_for(peer.host()),
            probed: false,
            tlp_probe: None,
            gap_due: None,
            waiting: false,
            open,
        }
    }

    /// The transfer `r`, if it is still going.
    fn op_mut(&mut self, r: MoveRef) -> Option<&mut MoveOp> {
        match r {
            MoveRef::Proc(p) => self.move_op(p),
            MoveRef::Behind(x) => self.behind.get_mut(&x).map(|b| &mut b.op),
        }
    }

    fn move_op(&mut self, pid: Pid) -> Option<&mut MoveOp> {
        match &mut self.proc_mut(pid)?.state {
            PState::Moving(op) => Some(op),
            _ => None,
        }
    }

    fn count_move(&mut self, n: usize) {
        self.stats.bulk_bytes += n as u64;
        self.stats.bulk_moves += 1;
    }

    /// Completes remote move `r`, all `n` bytes of it done.
    #[inline]
    fn move_done(&mut self, now: Micros, r: MoveRef, n: usize) {
        if let Some(op) = self.op_mut(r) {
            let (host, c) = (op.peer.host(), op.cwnd.carried());
            self.cwnds.insert(host, c);
        }
        self.count_move(n);
        match r {
            MoveRef::Proc(mover) => self.complete(mover, Completion::Move(Ok(n))),
            MoveRef::Behind(x) => {
                let Some(b) = self.behind.remove(&x) else {
                    return;
                };
                self.restart_next_timer(now, b.mover, b.op.peer.host());
                let ex = (b.mover, b.op.peer, b.op.xseq);
                if !self.behind_busy(ex.0, ex.1, ex.2) {
                    self.behind_drained(now, ex, None);
                }
            }
        }
    }
}
