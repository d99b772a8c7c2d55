//! MoveTo / MoveFrom: local copies, and remote streaming of chunk datagrams
//! with one acknowledgement per half window, selective retransmission from a
//! chunk bitmap, and a credit window for flow control.
//!
//! The message words of bulk packets are [`BulkMsg`] (`wire::bulk_field`).

use std::collections::HashMap;
use std::net::SocketAddr;

use super::aliens::AlienState;
use super::bitset::{packed_get, BitSet};
use super::congestion::Cwnd;
use super::rights::{self, Need};
use super::{Chunk, ChunkSrc, Completion, Dest, Engine, PState};
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
    fn bytes(&self) -> &[u8] {
        match self {
            MoveBuf::Lent(s) => s.bytes(),
            MoveBuf::Owned(v) => v,
            MoveBuf::Shared(s) => s.bytes(),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            MoveBuf::Lent(s) => s.bytes_mut(),
            MoveBuf::Owned(v) => v,
            MoveBuf::Shared(_) => &mut [],
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
    pub(super) fn buffer_of(&self, xseq: u32) -> Option<&[u8]> {
        (self.xseq == xseq).then(|| self.buf.bytes())
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
    pub(super) fn buffer_of(&self, xseq: u32) -> Option<&[u8]> {
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
    fn tlp_for(&self, host: super::HostId) -> Micros {
        self.srtt(host).map_or(0, |s| (2 * s).max(TLP_MIN))
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
        let total = buf.bytes().len();
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
            waiting: false,
            open,
        }
    }

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
            rights::write(o.access, o.seg.as_mut(), dest_off as usize, n)
                .map_err(|e| e.error(target))?
                .copy_from_slice(src.bytes());
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
            head[off..off + k].copy_from_slice(&src.bytes()[..k]);
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
                    v.extend_from_slice(&src.bytes()[taken..]);
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

    /// Is there room for `n` more bytes of `mover`'s write-behind data?
    fn behind_room(&self, mover: Pid, n: usize) -> bool {
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
    fn stream_cap(&self) -> usize {
        self.cfg.write_behind / 4
    }

    /// `mover`'s open stream to `target`'s segment in exchange `xseq` that
    /// ends at `off`, if any.
    fn open_stream(&self, mover: Pid, target: Pid, xseq: u32, off: usize) -> Option<u32> {
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
    fn extend_stream(&mut self, now: Micros, x: u32, src: &dyn SegMem) -> usize {
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
                v.extend_from_slice(&src.bytes()[..take]);
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
    pub(super) fn seal_streams(&mut self, now: Micros, mover: Pid) {
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
    fn behind_overlaps(&self, mover: Pid, target: Pid, xseq: u32, off: usize, n: usize) -> bool {
        self.behind.values().any(|b| {
            let (lo, hi) = (b.op.base as usize, b.op.base as usize + b.op.total);
            b.is_for(mover, target, xseq) && lo < off + n && off < hi
        })
    }

    /// Has `mover` write-behind MoveTos to `peer`'s segment in exchange
    /// `xseq` in flight? (Those of an earlier exchange, run again after
    /// its reply crossed a retransmission, hold nothing of this one.)
    pub(super) fn behind_busy(&self, mover: Pid, peer: Pid, xseq: u32) -> bool {
        self.behind.values().any(|b| b.is_for(mover, peer, xseq))
    }

    /// Holds `by`'s Reply or Forward of alien `i` (from `sender`) until its
    /// write-behind MoveTos to `sender` are acknowledged.
    pub(super) fn hold(&mut self, now: Micros, i: usize, by: Pid, sender: Pid, op: HeldOp) {
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
    fn behind_drained(
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
    fn fail_behind(&mut self, now: Micros, x: u32, e: IpcError) {
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

    /// The transfer `r`, if it is still going.
    fn op_mut(&mut self, r: MoveRef) -> Option<&mut MoveOp> {
        match r {
            MoveRef::Proc(p) => self.move_op(p),
            MoveRef::Behind(x) => self.behind.get_mut(&x).map(|b| &mut b.op),
        }
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
            dest.bytes_mut().copy_from_slice(from);
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
            dest.bytes_mut().copy_from_slice(head);
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
        if n <= MAX_APPEND || self.is_local(to) {
            return self.reply(now, replier, to, msg, Some((off, data.bytes())));
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

    fn move_op(&mut self, pid: Pid) -> Option<&mut MoveOp> {
        match &mut self.proc_mut(pid)?.state {
            PState::Moving(op) => Some(op),
            _ => None,
        }
    }

    /// After an answer to `mover`'s move: feeds the RTT sample and, if the
    /// answer made progress, restarts the retransmission timer.
    #[inline]
    fn move_answered(
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

    /// Sends new MoveTo chunks while the window allows.
    fn pump_move_to(&mut self, now: Micros, mover: MoveRef) {
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

    fn send_move_to_chunk(&mut self, r: MoveRef, idx: usize, ack_now: bool, retx: bool) {
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
        // lent buffer (see `Engine::send_chunks`).
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
    fn request_range(&mut self, now: Micros, mover: Pid, from: usize, to: usize, retx: bool) {
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
    fn bulk_sample(&mut self, mover: MoveRef, now: Micros) {
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

    fn refuse(&mut self, to: SocketAddr, t: PacketType, h: &Header, msg: &Message, st: Status) {
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
    fn validate_owner(&mut self, now: Micros, h: &Header, msg: &Message, write: bool) -> Status {
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

    pub(super) fn on_move_to_request(&mut self, now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
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
                seg.bytes_mut()[base + off..base + off + want].copy_from_slice(pkt.data);
            }
        }
        let b = &mut o.inbound[pos];
        b.highest = b.highest.max(idx + 1);
        let full = b.got.full();
        if ahead || !(h.flags & F_ACK_NOW != 0 || (full && fresh)) {
            return;
        }
        let cum = b.got.first_clear_from(0);
        let end = b.highest.max(cum).min(cum + MAX_ACK_SPAN);
        let map = b.got.pack(cum, end);
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
    pub(super) fn chunk_place(
        &mut self,
        h: &Header,
        msg: &Message,
        len: usize,
    ) -> Option<&mut [u8]> {
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
                let whole = rights::write(o.access, o.seg.as_mut(), base, total).ok()?;
                whole.get_mut(off..off + len)
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
                op.buf.bytes_mut().get_mut(off..off + len)
            }
            _ => None,
        }
    }

    /// Matches an answer to the transfer it is for (the mover's, or one of
    /// its write-behind MoveTos); a refusal ends the transfer with its
    /// error. `Some` if the answer should be processed.
    fn accept_answer(&mut self, now: Micros, pkt: &Packet<'_>, dir: Dir) -> Option<MoveRef> {
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

    pub(super) fn on_move_to_reply(&mut self, now: Micros, pkt: &Packet<'_>) {
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

    pub(super) fn on_move_from_request(&mut self, now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
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
        let todo: Vec<usize> = (lo..hi)
            .filter(|&i| !packed_get(pkt.data, i - lo))
            .take(cap)
            .collect();
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
        let seq = match self.outgoing(h.dst) {
            Some(o) if rights::read(o.access, o.seg.as_ref(), base, total).is_ok() => o.seq,
            _ => return,
        };
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

    pub(super) fn on_move_from_reply(&mut self, now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
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
                op.buf.bytes_mut()[off..off + want].copy_from_slice(pkt.data);
            }
            op.deadline = now + host_timeout;
            op.rto = rto;
            op.tlp = tlp;
            op.cwnd.acked(1, win);
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
        // means loss (or reordering). Re-request the gap at once; a loss of
        // the re-requested chunks, or of the last one, falls to the timer.
        let cum = op.done.first_clear_from(0);
        let mut rereq = None;
        let mut cut = false;
        if idx >= op.max_seen {
            let first = op.done.first_clear_from(op.max_seen);
            if first < idx {
                rereq = Some((first, idx));
                // Marks are chunk indices: a gap among chunks asked for
                // before the last cut is that cut's episode.
                cut = op.cwnd.lost(first as u32 + 1, op.next_new as u32);
            }
            op.max_seen = idx + 1;
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
        if cut {
            self.stats.bulk_cwnd_cuts += 1;
        }
        if let Some((a, b)) = rereq {
            self.request_range(now, h.dst, a, b, true);
        }
        if let Some((a, b)) = more {
            self.request_range(now, h.dst, a, b, false);
        }
    }

    pub(super) fn bulk_pending(&mut self, _now: Micros, _h: &Header) -> bool {
        false
    }

    /// For each (mover, peer host) with write-behind MoveTos in flight:
    /// the oldest one's order and deadline.
    fn oldest_behind(&self) -> HashMap<(Pid, super::HostId), (u64, Micros)> {
        let mut m: HashMap<(Pid, super::HostId), (u64, Micros)> = HashMap::new();
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
    fn restart_next_timer(&mut self, now: Micros, mover: Pid, host: super::HostId) {
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

    pub(super) fn bulk_timers(&mut self, now: Micros, next: &mut Micros) {
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
                        self.request_range(now, p, cum, end, true);
                    }
                    (Dir::From, MoveRef::Behind(_)) => {}
                }
            }
            if let Some(op) = self.op_mut(m) {
                *next = (*next).min(op.timer).min(op.deadline);
            }
        }
    }
}
