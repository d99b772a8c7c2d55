//! Direct Sends: a remote Send without a segment run by the sending
//! thread on a socket of its own, outside the engine (docs/PROTOCOL.md
//! §8f and §8g). "Direct" means this and nothing else.
//!
//! The exchange is `vkernel_proto::direct::DirectSend`, whose rules are
//! the engine's own (`vkernel_proto::sender`). This is its one driver:
//! [`send`] runs it over an [`Io`] (clock, socket, wait) and a [`Route`]
//! (sequence numbers, where hosts are, what is known of them, counters).
//! An embedded process (`process/direct.rs`) and an attached one
//! (`attach/direct.rs`) each implement both; neither has a loop of its own.

use std::net::SocketAddr;

use vkernel_proto::auth::{Reject, Sealer};
use vkernel_proto::direct::{DirectSend, Outcome, Timer, Timing};
use vkernel_proto::rtt::Rtt;
use vkernel_proto::wire::PacketType;
use vkernel_proto::{DropReason, HostId, IpcError, Message, Pid, ReplyInfo, Stats};

use crate::deadline::Deadline;
use crate::spin::Spin;

/// Sequence numbers a process reserves at a time.
pub(crate) const LEASE: u32 = 1024;

/// A block of sequence numbers reserved by a host for one process's own
/// Sends.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seqs {
    next: u32,
    left: u32,
}

impl Seqs {
    /// `n` numbers from `first`.
    pub(crate) fn new(first: u32, n: u32) -> Seqs {
        Seqs {
            next: first,
            left: n,
        }
    }

    /// Numbers are left.
    pub(crate) fn any(&self) -> bool {
        self.left > 0
    }

    /// The number [`Seqs::take`] would give, if any is left.
    pub(crate) fn peek(&self) -> Option<u32> {
        (self.left > 0).then_some(self.next)
    }

    /// The next number, if any is left.
    pub(crate) fn take(&mut self) -> Option<u32> {
        if self.left == 0 {
            return None;
        }
        let s = self.next;
        self.next = s.wrapping_add(1);
        self.left -= 1;
        Some(s)
    }

    /// Gives the rest up (the host sends for the process now).
    pub(crate) fn end(&mut self) {
        self.left = 0;
    }
}

/// What a direct Send did that the engine's counters show.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    /// A datagram sent (`tx`) or received, of `bytes`, to or from `peer`.
    Datagram {
        tx: bool,
        peer: HostId,
        ptype: PacketType,
        bytes: usize,
    },
    /// A Send begun this way.
    Begun,
    /// A RemoteSend sent again.
    Retransmit,
    /// Retransmissions found needless (each copy counts).
    Needless(u32),
    /// A due first copy that waited for a busy or probed peer.
    Deferred,
    /// A datagram read that answered nothing here.
    Ignored(DropReason),
    /// An exchange replied to, after `latency` µs.
    Exchange { latency: u64 },
    /// A Send that failed with `Timeout` (the peer silent) or `Deadline`.
    TimedOut { deadline: bool },
    /// A datagram read that failed authentication.
    AuthReject(Reject),
    /// That many exchanges between two processes of the host that did not
    /// pass through its engine (an attached program's peer pages); their
    /// latencies, if timed, follow as [`Ev::LocalLatency`].
    LocalExchanges(u64),
    /// `count` of those exchanges fell into latency bucket `bucket`
    /// (`Histogram::bucket`), taking `sum` µs in all.
    LocalLatency { bucket: u8, count: u64, sum: u64 },
    /// An exchange's span, for a host that exports them (`otel.rs`).
    Span(SpanEv),
}

/// One side of an exchange outside the host's engine, for its span: the
/// Send of `sender` to `receiver` (`receive`: the receiver's handling of
/// it), keyed by `seq` (a peer page's, if `page`; else the RemoteSend's),
/// from `start` for `dur` µs of wall-clock time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpanEv {
    pub(crate) receive: bool,
    pub(crate) ok: bool,
    pub(crate) page: bool,
    pub(crate) sender: Pid,
    pub(crate) receiver: Pid,
    pub(crate) seq: u32,
    /// µs since the Unix epoch.
    pub(crate) start: u64,
    pub(crate) dur: u32,
}

impl Ev {
    /// Adds `evs` to `s` as the engine counts the same things (`metrics`:
    /// the detailed ones too); returns the Sends begun.
    pub(crate) fn apply(s: &mut Stats, evs: &[Ev], metrics: bool) -> u64 {
        let mut sends = 0;
        for e in evs {
            match *e {
                Ev::Datagram {
                    tx,
                    peer,
                    ptype,
                    bytes,
                } => s.count_datagram(tx, peer.0, ptype, bytes, metrics),
                Ev::Begun => {
                    sends += 1;
                    s.direct_sends += 1;
                }
                Ev::Retransmit => s.retransmits += 1,
                Ev::Needless(n) => s.retransmits_needless += u64::from(n),
                Ev::Deferred => s.retransmits_deferred += 1,
                Ev::Ignored(r) => s.drops[r as usize] += 1,
                Ev::Exchange { latency } => {
                    s.remote_exchanges += 1;
                    if metrics {
                        s.remote_latency_us.record(latency);
                    }
                }
                Ev::TimedOut { deadline } => {
                    if deadline {
                        s.deadlines += 1;
                    } else {
                        s.timeouts += 1;
                    }
                }
                Ev::AuthReject(r) => s.auth_rejects[r as usize] += 1,
                Ev::LocalExchanges(n) => s.local_exchanges += n,
                Ev::LocalLatency { bucket, count, sum } => {
                    let b = usize::from(bucket).min(s.local_latency_us.counts.len() - 1);
                    if metrics {
                        s.local_latency_us.counts[b] += count;
                        s.local_latency_us.sums[b] += sum;
                    }
                }
                // (For the host's exporter, not its counters.)
                Ev::Span(_) => {}
            }
        }
        sends
    }

    /// Bytes of one encoded event ([`Ev::encode`]).
    pub(crate) const BYTES: usize = 16;

    /// Appends the event's 16-byte record (an attached program reports
    /// its events to its host so; docs/PROTOCOL.md §8a, TALLY): kind,
    /// flag, packet type, reason, peer host id (LE), 2 zero bytes, value
    /// (LE).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let (kind, flag, ptype, reason, peer, value) = match *self {
            Ev::Datagram {
                tx,
                peer,
                ptype,
                bytes,
            } => (1, u8::from(tx), ptype as u8, 0, peer.0, bytes as u64),
            Ev::Begun => (2, 0, 0, 0, 0, 0),
            Ev::Retransmit => (3, 0, 0, 0, 0, 0),
            Ev::Needless(n) => (4, 0, 0, 0, 0, u64::from(n)),
            Ev::Deferred => (5, 0, 0, 0, 0, 0),
            Ev::Ignored(r) => (6, 0, 0, r as u8, 0, 0),
            Ev::Exchange { latency } => (7, 0, 0, 0, 0, latency),
            Ev::TimedOut { deadline } => (8, u8::from(deadline), 0, 0, 0, 0),
            Ev::AuthReject(r) => (9, 0, 0, r as u8, 0, 0),
            Ev::LocalExchanges(n) => (11, 0, 0, 0, 0, n),
            // (Two values: the count here, the sum in the peer field's
            // place is too small, so the sum rides in a second record.)
            Ev::LocalLatency { bucket, count, sum } => {
                out.extend_from_slice(&[12, 0, 0, bucket, 0, 0, 0, 0]);
                out.extend_from_slice(&count.to_le_bytes());
                (13, 0, 0, bucket, 0, sum)
            }
            // Two records of their own layout: flags, sender, start; then
            // receiver, sequence number, duration.
            Ev::Span(sp) => {
                let flags = u8::from(sp.receive) | u8::from(!sp.ok) << 1 | u8::from(sp.page) << 2;
                out.extend_from_slice(&[14, flags, 0, 0]);
                out.extend_from_slice(&sp.sender.0.to_le_bytes());
                out.extend_from_slice(&sp.start.to_le_bytes());
                out.extend_from_slice(&[15, 0, 0, 0]);
                out.extend_from_slice(&sp.receiver.0.to_le_bytes());
                out.extend_from_slice(&sp.seq.to_le_bytes());
                out.extend_from_slice(&sp.dur.to_le_bytes());
                return;
            }
        };
        out.extend_from_slice(&[kind, flag, ptype, reason]);
        out.extend_from_slice(&peer.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&value.to_le_bytes());
    }

    /// The events of a run of records (a TALLY record's payload); any
    /// record that is not one is skipped.
    pub(crate) fn decode_all(b: &[u8]) -> Vec<Ev> {
        let recs: Vec<&[u8]> = b.chunks_exact(Ev::BYTES).collect();
        let mut out = Vec::with_capacity(recs.len());
        let mut i = 0;
        while i < recs.len() {
            let r = recs[i];
            if r[0] == 12 {
                if let Some(s) = recs.get(i + 1).filter(|s| s[0] == 13 && s[3] == r[3]) {
                    let v = |x: &[u8]| {
                        x.get(8..16)
                            .and_then(|b| b.try_into().ok())
                            .map(u64::from_le_bytes)
                    };
                    if let (Some(count), Some(sum)) = (v(r), v(s)) {
                        out.push(Ev::LocalLatency {
                            bucket: r[3],
                            count,
                            sum,
                        });
                    }
                    i += 2;
                    continue;
                }
            }
            if r[0] == 14 {
                if let Some(span) = recs.get(i + 1).and_then(|s| span(r, s)) {
                    out.push(Ev::Span(span));
                    i += 2;
                    continue;
                }
            }
            out.extend(Ev::decode(r));
            i += 1;
        }
        out
    }

    /// The event of a 16-byte record; None if it is not one.
    pub(crate) fn decode(b: &[u8]) -> Option<Ev> {
        let b: &[u8; Ev::BYTES] = b.try_into().ok()?;
        let (kind, flag, ptype, reason) = (b[0], b[1], b[2], b[3]);
        let peer = HostId(u16::from_le_bytes([b[4], b[5]]));
        let value = u64::from_le_bytes(b[8..16].try_into().ok()?);
        let n32 = u32::try_from(value).ok();
        Some(match kind {
            1 => Ev::Datagram {
                tx: flag != 0,
                peer,
                ptype: PacketType::from_u8(ptype)?,
                bytes: usize::try_from(value).ok()?,
            },
            2 => Ev::Begun,
            3 => Ev::Retransmit,
            4 => Ev::Needless(n32?),
            5 => Ev::Deferred,
            6 => Ev::Ignored(*DropReason::ALL.get(usize::from(reason))?),
            7 => Ev::Exchange { latency: value },
            8 => Ev::TimedOut {
                deadline: flag != 0,
            },
            9 => Ev::AuthReject(*Reject::ALL.get(usize::from(reason))?),
            11 => Ev::LocalExchanges(value),
            // Halves of a LocalLatency or a Span: see `Ev::decode_all`.
            12..=15 => return None,
            _ => return None,
        })
    }
}

/// The span of a record pair (kinds 14 and 15), if it is one.
fn span(a: &[u8], b: &[u8]) -> Option<SpanEv> {
    let u32_at = |x: &[u8], i: usize| Some(u32::from_le_bytes(x.get(i..i + 4)?.try_into().ok()?));
    if a.first() != Some(&14) || b.first() != Some(&15) || a.get(1)? & !7 != 0 {
        return None;
    }
    let flags = a[1];
    Some(SpanEv {
        receive: flags & 1 != 0,
        ok: flags & 2 == 0,
        page: flags & 4 != 0,
        sender: Pid(u32_at(a, 4)?),
        receiver: Pid(u32_at(b, 4)?),
        seq: u32_at(b, 8)?,
        start: u64::from_le_bytes(a.get(8..16)?.try_into().ok()?),
        dur: u32_at(b, 12)?,
    })
}

/// How a direct Send ended.
pub(crate) enum Went {
    /// Replied to, or failed.
    Done(Result<ReplyInfo, IpcError>),
    /// Forwarded where this path does not follow (a host it does not
    /// know, or its own): send `msg` to `to` through the host, as
    /// forwarded by `forwarder`.
    Forwarded {
        to: Pid,
        forwarder: Pid,
        msg: Message,
    },
}

/// What the sending thread provides: its clock, its socket, and how it
/// waits.
pub(crate) trait Io {
    /// The engine's clock (µs).
    fn now(&self) -> u64;
    /// Sends `data` to `to` (a failure is as a loss).
    fn send(&mut self, to: SocketAddr, data: &[u8]);
    /// Reads one datagram into `buf`: at once if `wait_us` is 0, else
    /// waiting at most about that long (`exact`: not longer, as for the
    /// caller's deadline). None: nothing came.
    fn recv(&mut self, buf: &mut [u8], wait_us: u64, exact: bool) -> Option<usize>;
    /// Why to stop waiting (the process was destroyed, the host went).
    fn gone(&self) -> Option<IpcError>;
    /// Whether more threads are runnable than CPUs at `now` (a spinning
    /// wait then blocks: other threads wait for the CPU, the server say).
    fn contended(&mut self, now: u64) -> bool;
}

/// What the sending process's host provides for its direct Sends.
pub(crate) trait Route {
    /// The next reserved sequence number, if any is left.
    fn take_seq(&mut self) -> Option<u32>;
    /// Where `host` is, if Sends there may go this way now.
    fn location(&self, host: HostId) -> Option<SocketAddr>;
    /// The engine's timing of a Send to `host` at `now`.
    fn timing(&mut self, host: HostId, now: u64) -> Timing;
    /// Runs `f` on what this host knows of `host` (shared by every path
    /// of the host that keeps it).
    fn with_peer<T>(&mut self, host: HostId, now: u64, f: impl FnOnce(&mut Rtt) -> T) -> T;
    /// Counts `e`.
    fn count(&mut self, e: Ev);
    /// Makes what was counted visible now (after a retransmission).
    fn publish(&mut self) {}
    /// `host` was silent for the host timeout: ask where it is next time.
    fn forget(&mut self, host: HostId);
    /// The main socket's port of this host (`reply_port`).
    fn reply_port(&self) -> u16;
    /// The host's keys, if it has any: every datagram is sealed and every
    /// answer opened with them.
    fn sealer(&self) -> Option<&Sealer>;
}

/// One direct Send: what [`send`] runs.
pub(crate) struct Call {
    /// The sender.
    pub(crate) me: Pid,
    /// The receiver.
    pub(crate) to: Pid,
    /// Whom the receiver sees as the forwarder (`me` unless forwarded).
    pub(crate) forwarder: Pid,
    /// The message.
    pub(crate) msg: Message,
    /// The sender's principal.
    pub(crate) principal: u32,
    /// When it fails with `Deadline` (engine time).
    pub(crate) deadline: Deadline,
    /// How long to read without waiting before blocking, and how.
    pub(crate) spin: Spin,
    /// Block at once, with no empty read first.
    pub(crate) block_at_once: bool,
}

/// Runs `c` on `io` until it is answered, fails, its deadline passes, or
/// it is forwarded out of reach; `buf` is where datagrams are read.
/// Whether it blocked, too, and whether a copy was sent. Call only when `route` has a sequence number
/// and the destination's location.
pub(crate) fn send<R: Route>(
    route: &mut R,
    io: &mut dyn Io,
    buf: &mut [u8],
    out: &mut Vec<u8>,
    c: &Call,
) -> (Went, bool, bool) {
    let (me, to) = (c.me, c.to);
    let (Some(at), Some(seq)) = (route.location(to.host()), route.take_seq()) else {
        return (
            Went::Forwarded {
                to,
                forwarder: c.forwarder,
                msg: c.msg,
            },
            false,
            false,
        );
    };
    let mut dest = (to.host(), at);
    let start = io.now();
    let timing = route.timing(to.host(), start);
    let sealer = route.sealer().cloned();
    let mut d = DirectSend::start(
        start,
        me,
        to,
        c.msg,
        seq,
        c.principal,
        c.forwarder,
        route.reply_port(),
        timing,
    )
    .keyed(sealer.is_some());
    // Where an encrypted answer is decrypted.
    let mut scratch = Vec::new();
    let encode = |d: &DirectSend, retransmission: bool, out: &mut Vec<u8>, now: u64| {
        d.encode(retransmission, out);
        if let Some(s) = &sealer {
            s.seal(now, out);
        }
    };
    encode(&d, false, out, start);
    io.send(dest.1, out);
    route.count(Ev::Begun);
    route.count(datagram(true, dest.0, PacketType::RemoteSend, out.len()));
    let mut blocked = c.block_at_once;
    let mut spin = c.spin.costly_turns(8);
    let went = loop {
        let now = io.now();
        let due = now >= d.next_timer();
        let until = c.deadline.at().unwrap_or(u64::MAX).min(d.next_timer());
        let wait_us = if blocked && !due {
            until.saturating_sub(now).max(1)
        } else {
            0
        };
        // The caller's deadline is kept on time; a timer may run late.
        let exact = c.deadline.is_at(until);
        // (When a timer is due, one more look first: the answer may have
        // come while this thread waited for a CPU; that is no loss.)
        if let Some(n) = io.recv(buf, wait_us, exact) {
            let now = io.now();
            let data = buf.get(..n).unwrap_or_default();
            let data = match &sealer {
                Some(s) => match s.open_answer(data, &mut scratch) {
                    Ok(inner) => inner,
                    Err(r) => {
                        route.count(Ev::AuthReject(r));
                        continue;
                    }
                },
                None => data,
            };
            let outcome = route.with_peer(dest.0, now, |r| d.on_datagram(now, data, r));
            let ptype = match &outcome {
                Outcome::Ignored(r) => {
                    route.count(Ev::Ignored(*r));
                    None
                }
                Outcome::Pending => Some(PacketType::ReplyPending),
                Outcome::Replied(..) => Some(PacketType::RemoteReply),
                Outcome::Failed(_) => Some(PacketType::NAck),
                Outcome::Forwarded { .. } => Some(PacketType::RemoteForward),
            };
            if let Some(t) = ptype {
                route.count(datagram(false, dest.0, t, n));
            }
            match outcome {
                Outcome::Replied(info, a) => {
                    if a.needless_copies > 0 {
                        route.count(Ev::Needless(a.needless_copies));
                    }
                    route.count(Ev::Exchange {
                        latency: now.saturating_sub(start),
                    });
                    break Went::Done(Ok(info));
                }
                Outcome::Failed(e) => break Went::Done(Err(e)),
                Outcome::Forwarded { to } => {
                    let (forwarder, msg) = (d.forwarder(), d.msg());
                    // Followed here to another host this path knows.
                    let next = (to.host() != me.host())
                        .then(|| route.location(to.host()))
                        .flatten()
                        .and_then(|at| Some((at, route.take_seq()?)));
                    let Some((at, seq)) = next else {
                        break Went::Forwarded { to, forwarder, msg };
                    };
                    dest = (to.host(), at);
                    let timing = route.timing(to.host(), now);
                    d.restart(now, to, seq, timing);
                    encode(&d, false, out, now);
                    io.send(dest.1, out);
                    route.count(datagram(true, dest.0, PacketType::RemoteSend, out.len()));
                }
                Outcome::Pending | Outcome::Ignored(_) => {}
            }
            continue;
        }
        let now = io.now();
        if c.deadline.passed(now) {
            route.count(Ev::TimedOut { deadline: true });
            break Went::Done(Err(IpcError::Deadline(d.dst())));
        }
        if now >= d.next_timer() {
            match route.with_peer(dest.0, now, |r| d.on_timer(now, r)) {
                Timer::Retransmit => {
                    encode(&d, true, out, now);
                    io.send(dest.1, out);
                    route.count(datagram(true, dest.0, PacketType::RemoteSend, out.len()));
                    route.count(Ev::Retransmit);
                    route.publish();
                }
                Timer::Dead(e) => {
                    // Perhaps it moved: ask the host next time.
                    route.forget(dest.0);
                    route.count(Ev::TimedOut { deadline: false });
                    break Went::Done(Err(e));
                }
                Timer::Deferred => route.count(Ev::Deferred),
                Timer::Idle => {}
            }
        }
        if !blocked {
            blocked = !spin.again(|| now, |t| io.contended(t));
        } else if let Some(e) = io.gone() {
            break Went::Done(Err(e));
        }
    };
    // (Whether a copy went: the wait then includes a retransmission
    // timeout, which says nothing of how long to spin.)
    (went, blocked, d.retx().retransmitted())
}

fn datagram(tx: bool, peer: HostId, ptype: PacketType, bytes: usize) -> Ev {
    Ev::Datagram {
        tx,
        peer,
        ptype,
        bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_their_records_and_garbage_is_refused() {
        let evs = [
            datagram(true, HostId(7), PacketType::RemoteSend, 60),
            datagram(false, HostId(65535), PacketType::NAck, 1),
            Ev::Begun,
            Ev::Retransmit,
            Ev::Needless(3),
            Ev::Deferred,
            Ev::Ignored(DropReason::ReplyDataMissing),
            Ev::Exchange { latency: 12 },
            Ev::TimedOut { deadline: true },
            Ev::AuthReject(Reject::Stale),
            Ev::LocalExchanges(9),
            Ev::LocalLatency {
                bucket: 4,
                count: 9,
                sum: 70,
            },
            Ev::Span(SpanEv {
                receive: true,
                ok: false,
                page: true,
                sender: Pid(0x0001_0002),
                receiver: Pid(0x0001_0003),
                seq: 77,
                start: 1_800_000_000_000_000,
                dur: 12,
            }),
        ];
        let mut b = Vec::new();
        for e in &evs {
            e.encode(&mut b);
        }
        assert_eq!(
            b.len(),
            (evs.len() + 2) * Ev::BYTES,
            "a latency, a span take two"
        );
        assert_eq!(format!("{evs:?}"), format!("{:?}", Ev::decode_all(&b)));
        assert!(Ev::decode(&[0; 16]).is_none());
        assert!(Ev::decode(&[1, 0, 99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_none());
        assert!(Ev::decode(&[6, 0, 0, 200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_none());
        assert!(Ev::decode(&[2; 15]).is_none());
        // A span's first half alone, or with bad flags, is skipped.
        let mut half = vec![14, 0, 0, 0];
        half.extend_from_slice(&[0; 12]);
        assert!(Ev::decode_all(&half).is_empty());
        let mut bad = b[b.len() - 2 * Ev::BYTES..].to_vec();
        bad[1] = 0x80;
        assert!(Ev::decode_all(&bad).is_empty());
        let mut s = Stats::default();
        assert_eq!(Ev::apply(&mut s, &evs, true), 1);
        assert_eq!(
            (
                s.local_exchanges,
                s.remote_exchanges,
                s.retransmits_needless
            ),
            (9, 1, 3)
        );
    }
}
