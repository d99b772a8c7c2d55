//! One remote Send run outside the engine: the sender's side of an
//! exchange whose process sends and receives its own datagrams (a
//! process's direct path, docs/PROTOCOL.md §8f and §8g).
//!
//! Sans-IO like the engine: [`DirectSend::encode`] gives the RemoteSend to
//! transmit, [`DirectSend::on_datagram`] takes what came back and
//! [`DirectSend::on_timer`] says when to retransmit or give up. The rules
//! are the engine's own: both keep a [`Retx`] ([`crate::sender`]) and
//! feed the peer's [`Rtt`] through it. Only Sends without a segment go
//! this way, so no bulk data ever belongs to the exchange. The
//! RemoteSend carries [`wire::F_ANSWER_SOURCE`], so the receiver answers
//! the socket it came from. With a cluster key the driver seals what
//! [`DirectSend::encode`] gives and opens what it reads
//! ([`crate::auth::Sealer`]) before [`DirectSend::on_datagram`] sees it.

use crate::config::{Config, Micros};
use crate::engine::ReplyInfo;
use crate::error::IpcError;
use crate::message::{Message, FLAG_MASK};
use crate::pid::Pid;
use crate::rtt::Rtt;
use crate::sender::{nack_error, Answered, Due, Retx};
use crate::stats::DropReason;
use crate::wire::{self, Header, PacketType, Status};

/// Retransmission timing for one exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// First retransmission timeout.
    pub rto: Micros,
    /// Ceiling of the timeout after backoff.
    pub max_rto: Micros,
    /// The Send fails when the receiver's host is silent this long.
    pub host_timeout: Micros,
    /// The timeout before any sample (`Config::initial_rto`).
    pub initial_rto: Micros,
    /// The least timeout (`Config::min_rto`).
    pub min_rto: Micros,
}

impl Timing {
    /// The engine's timing at `now` for a peer whose round trips `rtt`
    /// measured, under `cfg` (the same clamps as `Engine::max_rto`).
    pub fn new(cfg: &Config, rtt: &Rtt, now: Micros) -> Timing {
        let max_rto = cfg.max_rto.min(cfg.host_timeout / 8).max(cfg.min_rto);
        Timing {
            rto: rtt.send_rto(now, cfg.initial_rto, cfg.min_rto, max_rto),
            max_rto,
            host_timeout: cfg.host_timeout,
            initial_rto: cfg.initial_rto,
            min_rto: cfg.min_rto,
        }
    }

    /// The peer's timeout at `now`, as `rtt` knows it.
    pub fn fresh_rto(&self, rtt: &Rtt, now: Micros) -> Micros {
        rtt.send_rto(now, self.initial_rto, self.min_rto, self.max_rto)
    }
}

/// What a datagram meant for the exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not an answer to this exchange (the reason, for the drop counters).
    Ignored(DropReason),
    /// The receiver's host is alive and holds the request: keep waiting.
    Pending,
    /// The reply, and what it proved of the exchange's copies.
    Replied(ReplyInfo, Answered),
    /// The exchange failed (nAck).
    Failed(IpcError),
    /// The receiver forwarded the message to `to`: send it again there
    /// ([`DirectSend::restart`]), as forwarded by [`DirectSend::forwarder`].
    Forwarded {
        /// The new destination.
        to: Pid,
    },
}

/// What a timer expiry asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// Nothing is due yet.
    Idle,
    /// A first copy was due but waits one more timeout: the peer is
    /// serving older Sends or being probed (counted as deferred).
    Deferred,
    /// Send the RemoteSend again ([`DirectSend::encode`] with `true`).
    Retransmit,
    /// The receiver's host was silent for the host timeout.
    Dead(IpcError),
}

/// The sender's side of one remote exchange. See the module docs.
#[derive(Clone, Debug)]
pub struct DirectSend {
    src: Pid,
    dst: Pid,
    forwarder: Pid,
    principal: u32,
    seq: u32,
    msg: Message,
    reply_port: u16,
    timing: Timing,
    retx: Retx,
    /// The host seals its datagrams: answers must be sealed (and opened
    /// by the caller) too.
    keyed: bool,
}

impl DirectSend {
    /// Starts `src`'s Send of `msg` (no segment) to `dst` with sequence
    /// number `seq`, at `now`. `forwarder` is `src` unless the message was
    /// forwarded; `reply_port` is the main socket's port of `src`'s host.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        now: Micros,
        src: Pid,
        dst: Pid,
        mut msg: Message,
        seq: u32,
        principal: u32,
        forwarder: Pid,
        reply_port: u16,
        timing: Timing,
    ) -> DirectSend {
        // No segment travels this way: the receiver must see none.
        msg.set_word0(
            msg.word0()
                & !(crate::message::SEGMENT | crate::message::SEG_READ | crate::message::SEG_WRITE),
        );
        msg.set_seg_addr(0);
        msg.set_seg_len(0);
        DirectSend {
            src,
            dst,
            forwarder,
            principal,
            seq,
            msg,
            reply_port,
            timing,
            retx: Retx::start(now, timing.rto, timing.host_timeout, true),
            keyed: false,
        }
    }

    /// Marks the exchange as one whose datagrams are sealed with the
    /// host's key: [`DirectSend::on_datagram`] then takes only answers
    /// that carried a key (opened by the caller), and no others.
    pub fn keyed(mut self, on: bool) -> DirectSend {
        self.keyed = on;
        self
    }

    /// Sends again from the start: to `dst` with the new sequence number
    /// `seq` (after [`Outcome::Forwarded`]).
    pub fn restart(&mut self, now: Micros, dst: Pid, seq: u32, timing: Timing) {
        self.dst = dst;
        self.seq = seq;
        self.timing = timing;
        self.retx = Retx::start(now, timing.rto, timing.host_timeout, true);
    }

    /// The destination (changed by a forward).
    pub fn dst(&self) -> Pid {
        self.dst
    }

    /// Whom the receiver sees as the forwarder.
    pub fn forwarder(&self) -> Pid {
        self.forwarder
    }

    /// The message as it is now (a forward may have changed it).
    pub fn msg(&self) -> Message {
        self.msg
    }

    /// The exchange's sequence number.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// The retransmission state (the engine's own type).
    pub fn retx(&self) -> &Retx {
        &self.retx
    }

    /// The RemoteSend datagram, into `out`.
    pub fn encode(&self, retransmission: bool, out: &mut Vec<u8>) {
        let mut h = Header::new(PacketType::RemoteSend);
        h.seq = self.seq;
        h.src = self.src;
        h.dst = self.dst;
        h.forwarder = self.forwarder;
        h.user = self.principal;
        h.reply_port = self.reply_port;
        h.flags = wire::F_ANSWER_SOURCE
            | if retransmission {
                wire::F_RETRANSMIT
            } else {
                0
            };
        wire::encode_into(&h, &self.msg, &[], out);
    }

    /// When [`DirectSend::on_timer`] has something to do next.
    pub fn next_timer(&self) -> Micros {
        self.retx.next_timer()
    }

    /// Runs the timers due at `now`, by what this host knows of the peer
    /// (`peer`, shared by every sender of the host): [`Retx::due`].
    pub fn on_timer(&mut self, now: Micros, peer: &mut Rtt) -> Timer {
        let max_rto = self.timing.max_rto;
        match self.retx.due(now, false, max_rto, Some(peer)) {
            Due::Idle => Timer::Idle,
            Due::Dead => Timer::Dead(IpcError::Timeout(self.dst)),
            Due::Defer => {
                self.retx.defer(now);
                Timer::Deferred
            }
            Due::Retransmit => {
                self.retx.copy_sent(now, max_rto, Some(peer));
                Timer::Retransmit
            }
        }
    }

    /// What the datagram `buf`, read from this exchange's socket at
    /// `now`, means; `peer` (what the host knows of the destination's
    /// host) learns from it as the engine's would. Anything malformed,
    /// about another exchange, or keyed otherwise than the exchange is
    /// ignored (a keyed exchange's caller has opened `buf` already).
    pub fn on_datagram(&mut self, now: Micros, buf: &[u8], peer: &mut Rtt) -> Outcome {
        let Ok(pkt) = wire::decode(buf) else {
            return Outcome::Ignored(DropReason::Malformed);
        };
        let h = pkt.header;
        if (h.key_id != 0) != self.keyed {
            return Outcome::Ignored(DropReason::Untrusted);
        }
        if h.dst != self.src || h.seq != self.seq || h.src.host() != self.dst.host() {
            return Outcome::Ignored(DropReason::NoMatch);
        }
        match h.ptype {
            PacketType::RemoteReply => {
                let to_first = h.flags & wire::F_RETRANSMIT == 0;
                let a = self.retx.on_reply(now, to_first, peer);
                Outcome::Replied(
                    ReplyInfo {
                        msg: pkt.msg,
                        // Data with a reply to a Send without a segment has
                        // nowhere to go (the engine counts a violation, too).
                        seg_bytes: 0,
                        from: h.src,
                    },
                    a,
                )
            }
            PacketType::NAck => Outcome::Failed(nack_error(h.status, h.src)),
            PacketType::ReplyPending => {
                let fresh = self.timing.fresh_rto(peer, now);
                let busy = h.status == Status::Busy;
                let host_timeout = self.timing.host_timeout;
                self.retx
                    .on_reply_pending(now, busy, fresh, host_timeout, peer);
                Outcome::Pending
            }
            PacketType::RemoteForward => {
                let to = h.forwarder;
                if !to.is_process() {
                    return Outcome::Ignored(DropReason::Malformed);
                }
                // The forwarder's message, with the sender's flags (as
                // `rights::carry` does for a segment-less exchange).
                let mut m = pkt.msg;
                m.set_word0((pkt.msg.word0() & !FLAG_MASK) | (self.msg.word0() & FLAG_MASK));
                m.set_seg_addr(0);
                m.set_seg_len(0);
                self.msg = m;
                self.forwarder = h.src;
                self.dst = to;
                Outcome::Forwarded { to }
            }
            _ => Outcome::Ignored(DropReason::NoMatch),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::engine::{Completion, Engine};
    use crate::pid::HostId;
    use crate::testing;

    const ME: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7000);
    const MINE: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7100);

    fn engine(host: u16) -> Engine {
        Engine::new(
            Config {
                host_id: Some(HostId(host)),
                ..Config::default()
            },
            0,
        )
    }

    fn timing() -> Timing {
        Timing::new(&Config::default(), &Rtt::new(), 0)
    }

    /// The receiving engine (host 2) with a process in Receive, and a
    /// direct Send to it from host 1's process `src`.
    fn setup(msg: Message) -> (Engine, Pid, Pid, DirectSend) {
        let mut e = engine(2);
        let server = e.create_process().unwrap();
        assert!(e.receive(0, server, None, None).unwrap().is_none());
        let src = Pid::new(HostId(1), 5);
        let d = DirectSend::start(0, src, server, msg, 77, 0, src, ME.port(), timing());
        (e, server, src, d)
    }

    /// Hands the direct Send's datagram to `e` (from the program's own
    /// socket) and returns what `e` sent back, with where.
    fn exchange(
        e: &mut Engine,
        d: &DirectSend,
        now: Micros,
        retx: bool,
    ) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut b = Vec::new();
        d.encode(retx, &mut b);
        e.handle_datagram(now, MINE, &b);
        testing::take_output(e, false)
            .0
            .into_iter()
            .map(|t| (t.to, t.data))
            .collect()
    }

    #[test]
    fn the_reply_comes_to_the_source_socket_and_the_main_one_is_learned() {
        let (mut e, server, src, mut d) = setup(Message::with_code(9));
        assert!(exchange(&mut e, &d, 10, false).is_empty());
        // The receiver got it as from `src`, and knows host 1 at its main
        // socket (reply_port), not at the program's socket.
        let Some(Completion::Receive(Ok(r))) = e.take_completion(server) else {
            panic!("the server received nothing");
        };
        assert_eq!((r.from, r.msg.code()), (src, 9));
        assert_eq!(e.location_of(HostId(1)), Some(ME));
        let mut m = Message::with_code(10);
        m.set_word(3, 42);
        e.reply(20, server, src, m, None).unwrap();
        let out = testing::take_output(&mut e, false).0;
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].to, MINE);
        let Outcome::Replied(info, a) = d.on_datagram(30, &out[0].data, &mut Rtt::new()) else {
            panic!("not a reply");
        };
        assert_eq!((info.from, info.msg.word(3)), (server, 42));
        assert_eq!(a.sample, Some(30));
    }

    #[test]
    fn a_lost_reply_is_answered_again_from_the_saved_reply() {
        let (mut e, server, src, mut d) = setup(Message::with_code(1));
        exchange(&mut e, &d, 10, false);
        e.take_completion(server);
        e.reply(20, server, src, Message::with_code(2), None)
            .unwrap();
        let _lost = testing::take_output(&mut e, false);
        // A busy peer had earned a floor.
        let t = d.next_timer();
        let mut peer = Rtt::new();
        peer.held(t, 4_000);
        let rto = |p: &Rtt| p.send_rto(t + 5, 1_000, 1_000, 100_000);
        let earned = rto(&peer);
        assert!((7_900..=8_000).contains(&earned), "{earned}");
        assert_eq!(d.on_timer(t - 1, &mut peer), Timer::Idle);
        assert_eq!(d.on_timer(t, &mut peer), Timer::Retransmit);
        assert!(d.next_timer() > t, "backs off");
        let out = exchange(&mut e, &d, t, true);
        assert_eq!(out.len(), 1, "the saved reply, once");
        assert_eq!(out[0].0, MINE);
        let Outcome::Replied(_, a) = d.on_datagram(t + 5, &out[0].1, &mut peer) else {
            panic!("not a reply");
        };
        assert_eq!(a.sample, None, "no sample after a retransmission");
        assert_eq!(a.needless_copies, 0, "the reply was lost: a needed copy");
        // A needed copy halves the floor.
        assert!(rto(&peer) <= earned / 2 + 1, "{} of {earned}", rto(&peer));
    }

    #[test]
    fn a_due_first_copy_waits_while_the_peer_serves_older_sends() {
        // Two senders of one host share what they know of the server.
        let mut peer = Rtt::new();
        let (src, dst) = (Pid::new(HostId(1), 5), Pid::new(HostId(2), 9));
        let start = |at, seq| {
            DirectSend::start(
                at,
                src,
                dst,
                Message::with_code(1),
                seq,
                0,
                src,
                7000,
                timing(),
            )
        };
        let mut d = start(500, 2);
        let t = d.next_timer();
        // The server answered an older Send (sent at 0) just before `d`
        // fell due.
        peer.answered(t - 100, 0);
        assert_eq!(
            d.on_timer(t, &mut peer),
            Timer::Deferred,
            "queued, not lost"
        );
        assert!(d.next_timer() > t, "waits one more timeout");
        // Nothing answered since: the next turn retransmits, and marks
        // the peer probed, so a third sender's due copy waits.
        let t2 = d.next_timer();
        assert_eq!(d.on_timer(t2, &mut peer), Timer::Retransmit);
        let mut third = start(t2 - timing().rto + 1, 3);
        let t3 = third.next_timer();
        assert_eq!(third.on_timer(t3, &mut peer), Timer::Deferred, "one probe");
        // With no answers known a due copy goes at once.
        let mut lone = start(0, 4);
        let tl = lone.next_timer();
        assert_eq!(lone.on_timer(tl, &mut Rtt::new()), Timer::Retransmit);
    }

    #[test]
    fn a_reply_to_the_first_copy_makes_its_retransmission_needless() {
        let (mut e, server, src, mut d) = setup(Message::with_code(1));
        exchange(&mut e, &d, 10, false);
        e.take_completion(server);
        let t = d.next_timer();
        assert_eq!(d.on_timer(t, &mut Rtt::new()), Timer::Retransmit);
        // The copy is lost; the server replies to the first.
        e.reply(t + 50, server, src, Message::with_code(2), None)
            .unwrap();
        let out = testing::take_output(&mut e, false).0;
        let Outcome::Replied(_, a) = d.on_datagram(t + 60, &out[0].data, &mut Rtt::new()) else {
            panic!("not a reply");
        };
        assert_eq!(a.needless_copies, 1);
        assert_eq!(a.sample, Some(t + 60), "a true sample");
    }

    #[test]
    fn a_retransmission_before_the_reply_gets_reply_pending() {
        let (mut e, server, _src, mut d) = setup(Message::with_code(1));
        exchange(&mut e, &d, 10, false);
        e.take_completion(server);
        let t = d.next_timer();
        let mut peer = Rtt::new();
        assert_eq!(d.on_timer(t, &mut peer), Timer::Retransmit);
        let out = exchange(&mut e, &d, t, true);
        assert_eq!(out.len(), 1);
        let before = peer.send_rto(t + 1, 1_000, 1_000, 1_000_000);
        assert_eq!(d.on_datagram(t + 1, &out[0].1, &mut peer), Outcome::Pending);
        assert!(
            peer.send_rto(t + 1, 1_000, 1_000, 1_000_000) > before,
            "the server held it: the peer's floor rises"
        );
        // The host timeout starts again from the replyPending.
        let host_timeout = Config::default().host_timeout;
        assert!(d.next_timer() <= t + 1 + host_timeout);
        assert!(!matches!(
            d.on_timer(host_timeout, &mut peer),
            Timer::Dead(_)
        ));
        assert!(matches!(
            d.on_timer(t + 1 + host_timeout, &mut peer),
            Timer::Dead(IpcError::Timeout(p)) if p == server
        ));
    }

    #[test]
    fn no_such_process_is_a_nack() {
        let mut e = engine(2);
        let src = Pid::new(HostId(1), 5);
        let ghost = Pid::new(HostId(2), 999);
        let mut d = DirectSend::start(
            0,
            src,
            ghost,
            Message::zero(),
            3,
            0,
            src,
            ME.port(),
            timing(),
        );
        let out = exchange(&mut e, &d, 1, false);
        assert_eq!(out[0].0, MINE);
        assert_eq!(
            d.on_datagram(2, &out[0].1, &mut Rtt::new()),
            Outcome::Failed(IpcError::NoSuchProcess(ghost))
        );
    }

    #[test]
    fn a_forward_to_another_host_redirects_the_send() {
        let (mut e, server, src, mut d) = setup(Message::with_code(4));
        exchange(&mut e, &d, 10, false);
        e.take_completion(server);
        let elsewhere = Pid::new(HostId(3), 8);
        let mut m = Message::with_code(5);
        m.set_word(2, 6);
        e.forward(20, server, src, elsewhere, m).unwrap();
        let out = testing::take_output(&mut e, false).0;
        assert_eq!(out[0].to, MINE);
        assert_eq!(
            d.on_datagram(30, &out[0].data, &mut Rtt::new()),
            Outcome::Forwarded { to: elsewhere }
        );
        assert_eq!(
            (d.forwarder(), d.msg().code(), d.msg().word(2)),
            (server, 5, 6)
        );
        d.restart(30, elsewhere, 78, timing());
        let mut b = Vec::new();
        d.encode(false, &mut b);
        let p = wire::decode(&b).unwrap();
        assert_eq!(
            (p.header.dst, p.header.forwarder, p.header.seq),
            (elsewhere, server, 78)
        );
    }

    #[test]
    fn datagrams_of_other_exchanges_and_garbage_are_ignored() {
        let (mut e, server, src, mut d) = setup(Message::zero());
        exchange(&mut e, &d, 10, false);
        e.take_completion(server);
        e.reply(20, server, src, Message::zero(), None).unwrap();
        let out = testing::take_output(&mut e, false).0;
        let mut other = out[0].data.clone();
        other[wire::field::SEQ][3] ^= 1;
        assert_eq!(
            d.on_datagram(21, &other, &mut Rtt::new()),
            Outcome::Ignored(DropReason::NoMatch)
        );
        assert_eq!(
            d.on_datagram(21, &[0x56, 3], &mut Rtt::new()),
            Outcome::Ignored(DropReason::Malformed)
        );
        let mut keyed = out[0].data.clone();
        keyed[wire::field::KEY_ID] = 1;
        assert!(matches!(
            d.on_datagram(21, &keyed, &mut Rtt::new()),
            Outcome::Ignored(_)
        ));
        assert!(matches!(
            d.on_datagram(22, &out[0].data, &mut Rtt::new()),
            Outcome::Replied(..)
        ));
    }

    #[test]
    fn a_segment_never_travels_on_the_direct_path() {
        let mut m = Message::with_code(1);
        m.set_segment(crate::message::SegAccess::READ_WRITE, 4096);
        let d = DirectSend::start(
            0,
            Pid(0x0001_0005),
            Pid(0x0002_0006),
            m,
            1,
            0,
            Pid(0x0001_0005),
            1,
            timing(),
        );
        let mut b = Vec::new();
        d.encode(false, &mut b);
        let p = wire::decode(&b).unwrap();
        assert!(!p.msg.has(crate::message::SEGMENT));
        assert_eq!((p.header.total_length, p.data.len()), (0, 0));
        assert_ne!(p.header.flags & wire::F_ANSWER_SOURCE, 0);
    }
}
