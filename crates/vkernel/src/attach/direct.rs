//! An attached process's remote Sends, sent and answered on a socket of
//! its own (docs/PROTOCOL.md §8f): no thread of the host runs, so a
//! remote exchange costs the program what it costs an embedded one.
//!
//! The host grants it (`ask::DIRECT`) and reserves sequence numbers for
//! the process, so its own exchanges and those the host runs for it (any
//! Send with a segment, a group Send) stay in one increasing order at every
//! receiver. Any Send through the host ends the reservation. The exchange
//! itself is `vkernel_proto::direct::DirectSend`; this is its runtime.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use vkernel_proto::direct::{DirectSend, Outcome, Timer, Timing};
use vkernel_proto::rtt::Rtt;
use vkernel_proto::{Config, HostId, IpcError, Message, Micros, Pid};

use crate::process::WaitCounts;
use crate::spin::SpinPolicy;

use super::wait::Pace;

/// Sequence numbers reserved per request to the host.
pub(crate) const LEASE: u32 = 1024;

/// A location the host did not know is asked for again after this long
/// (µs); meanwhile Sends there go through the host, which finds it.
const UNKNOWN_FOR: u64 = 50_000;

/// The longest a blocked wait lasts before the host's presence is checked.
const SLICE_MS: u64 = 512;

use crate::process::direct::Seqs;
pub(crate) use crate::process::direct::Went;

/// What a process's wait on the direct path may use and must report.
pub(crate) struct Waiting<'a> {
    pub(crate) pace: &'a Pace,
    pub(crate) policy: &'a mut SpinPolicy,
    pub(crate) waits: &'a mut WaitCounts,
    /// Why to stop waiting (the host went, the program detached).
    pub(crate) gone: &'a dyn Fn() -> Option<IpcError>,
    /// The Send's deadline, a time of `pace.clock`.
    pub(crate) deadline: Option<u64>,
}

/// A process's socket and what it knows for its direct Sends.
pub(crate) struct DirectPath {
    sock: UdpSocket,
    /// `sock`'s port, which the host wakes (an empty datagram) when it
    /// destroys the process.
    port: u16,
    /// The host's main socket port (`reply_port` of every datagram).
    reply_port: u16,
    read_timeout_ms: u64,
    seqs: Seqs,
    /// Where hosts are (None: the host did not know, as of then).
    locs: HashMap<HostId, (Option<SocketAddr>, u64)>,
    rtt: HashMap<HostId, Rtt>,
    cfg: Config,
    out: Vec<u8>,
    rx: Vec<u8>,
    /// Datagrams read that answered nothing here (stale or garbage).
    pub(crate) ignored: u64,
}

impl DirectPath {
    /// A socket on the host's address (its IP, any port).
    pub(crate) fn new(host_addr: SocketAddr) -> io::Result<DirectPath> {
        let sock = UdpSocket::bind(SocketAddr::new(host_addr.ip(), 0))?;
        let port = sock.local_addr()?.port();
        Ok(DirectPath {
            sock,
            port,
            reply_port: host_addr.port(),
            read_timeout_ms: 0,
            seqs: Seqs::default(),
            locs: HashMap::new(),
            rtt: HashMap::new(),
            cfg: Config::default(),
            out: Vec::with_capacity(256),
            rx: vec![0; vkernel_proto::wire::MAX_DATAGRAM],
            ignored: 0,
        })
    }

    /// The socket's port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Whether the host must be asked before a Send to `host` (its
    /// location is not known, or no sequence numbers are left), and how
    /// many numbers to ask for.
    pub(crate) fn must_ask(&self, host: HostId, now: u64) -> Option<u32> {
        let n = if self.seqs.any() { 0 } else { LEASE };
        match self.locs.get(&host) {
            // Recently unknown: through the host, which finds it.
            Some((None, at)) if now.saturating_sub(*at) < UNKNOWN_FOR => None,
            Some((Some(_), _)) if n == 0 => None,
            _ => Some(n),
        }
    }

    /// Whether a Send to `host` goes the direct way now.
    pub(crate) fn can_send(&self, host: HostId) -> bool {
        self.seqs.any() && self.location(host).is_some()
    }

    /// What the host said: where `host` is, and `n` sequence numbers from
    /// `first` (`n` = 0: none new).
    pub(crate) fn learn(
        &mut self,
        host: HostId,
        at: Option<SocketAddr>,
        first: u32,
        n: u32,
        now: u64,
    ) {
        self.locs.insert(host, (at, now));
        if n > 0 {
            self.seqs = Seqs::new(first, n);
        }
    }

    /// The host is about to send for this process: the reserved numbers
    /// would now be older than its.
    pub(crate) fn end_lease(&mut self) {
        self.seqs.end();
    }

    fn location(&self, host: HostId) -> Option<SocketAddr> {
        self.locs.get(&host).and_then(|(a, _)| *a)
    }

    fn take_seq(&mut self) -> Option<u32> {
        self.seqs.take()
    }

    fn timing(&mut self, host: HostId, now: Micros) -> Timing {
        let rtt = *self.rtt_mut(host, now);
        Timing::new(&self.cfg, &rtt, now)
    }

    /// What is known of `host`'s round trips (`Rtt::for_peer` at first).
    fn rtt_mut(&mut self, host: HostId, now: Micros) -> &mut Rtt {
        let at = self.location(host);
        let floor = self.cfg.local_send_floor;
        self.rtt
            .entry(host)
            .or_insert_with(|| Rtt::for_peer(now, at, floor))
    }

    fn transmit(&mut self, d: &DirectSend, retransmission: bool) {
        d.encode(retransmission, &mut self.out);
        let Some(to) = self.location(d.dst().host()) else {
            return;
        };
        // A send that fails is as a datagram lost: retransmission and the
        // host timeout deal with it.
        let _ = rustix::net::sendto(&self.sock, &self.out, rustix::net::SendFlags::empty(), &to);
    }

    /// Reads one datagram, without blocking or for at most `block_ms`.
    fn recv(&mut self, block_ms: Option<u64>) -> Option<usize> {
        let flags = match block_ms {
            None => rustix::net::RecvFlags::DONTWAIT,
            Some(ms) => {
                if ms != self.read_timeout_ms {
                    let t = Some(Duration::from_millis(ms));
                    if self.sock.set_read_timeout(t).is_ok() {
                        self.read_timeout_ms = ms;
                    }
                }
                rustix::net::RecvFlags::empty()
            }
        };
        loop {
            // Answers may come from any socket of the peer host (its side
            // sockets too), so this socket is not connected; what is read
            // is checked by its header.
            match rustix::net::recv(&self.sock, &mut self.rx, flags) {
                // (Empty: the host's wake-up; the caller looks at its flags.)
                Ok((0, _)) => return None,
                Ok((n, _)) => return Some(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Runs `src`'s Send of `msg` to `to` (as forwarded by `fwd`) on this
    /// socket until it is answered, fails or is forwarded out of reach.
    /// Call only when [`DirectPath::can_send`] says so.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        w: &mut Waiting<'_>,
        me: HostId,
        src: Pid,
        to: Pid,
        fwd: Pid,
        msg: Message,
        principal: u32,
    ) -> Went {
        let clock = &w.pace.clock;
        let Some(seq) = self.take_seq() else {
            return Went::Forwarded {
                to,
                forwarder: fwd,
                msg,
            };
        };
        let start = clock.now();
        let timing = self.timing(to.host(), start);
        let mut d = DirectSend::start(
            start,
            src,
            to,
            msg,
            seq,
            principal,
            fwd,
            self.reply_port,
            timing,
        );
        self.transmit(&d, false);
        let spin_us = if w.policy.is_adaptive() || w.policy.wants_to_spin() {
            let busy = w.policy.is_adaptive() && w.pace.run_queue.contended(start, w.pace.cpus);
            w.policy.budget_us(0, w.pace.cpus, busy)
        } else {
            0
        };
        // Told never to spin: block at once (no empty read first).
        let mut blocked = spin_us == 0 && !w.policy.is_adaptive();
        let done = loop {
            let block_ms = blocked.then(|| {
                let now = clock.now();
                let until = w.deadline.unwrap_or(u64::MAX).min(d.next_timer());
                let ms = until.saturating_sub(now) / 1000;
                // A power of two (rounded down, at least 1 ms): the socket's
                // timeout is set again only when it changes.
                if ms <= 1 {
                    1
                } else {
                    (1u64 << (63 - ms.leading_zeros())).min(SLICE_MS)
                }
            });
            if let Some(n) = self.recv(block_ms) {
                let now = clock.now();
                match d.on_datagram(now, &self.rx[..n]) {
                    Outcome::Replied(info) => {
                        let rtt = self.rtt_mut(d.dst().host(), now);
                        d.note_answer(now, rtt, true);
                        break Went::Done(Ok(info));
                    }
                    Outcome::Failed(e) => break Went::Done(Err(e)),
                    Outcome::Forwarded { to } => {
                        let (host, forwarder, msg) = (to.host(), d.forwarder(), d.msg());
                        if host == me || !self.can_send(host) {
                            break Went::Forwarded { to, forwarder, msg };
                        }
                        let Some(seq) = self.take_seq() else {
                            break Went::Forwarded { to, forwarder, msg };
                        };
                        let timing = self.timing(host, now);
                        d.restart(now, to, seq, timing);
                        self.transmit(&d, false);
                    }
                    Outcome::Pending => {}
                    Outcome::Ignored(_) => self.ignored += 1,
                }
            }
            let now = clock.now();
            if w.deadline.is_some_and(|dl| now >= dl) {
                break Went::Done(Err(IpcError::Deadline(d.dst())));
            }
            if now >= d.next_timer() {
                match d.on_timer(now) {
                    Timer::Retransmit => self.transmit(&d, true),
                    Timer::Dead(e) => {
                        // Perhaps it moved: ask the host next time.
                        self.locs.remove(&d.dst().host());
                        break Went::Done(Err(e));
                    }
                    Timer::Idle => {}
                }
            }
            if !blocked && now.saturating_sub(start) >= spin_us {
                blocked = true;
            }
            if blocked {
                if let Some(e) = (w.gone)() {
                    break Went::Done(Err(e));
                }
            }
        };
        w.policy.record(clock.now().saturating_sub(start));
        if blocked {
            w.waits.blocked += 1;
        } else {
            w.waits.unblocked += 1;
        }
        done
    }
}
