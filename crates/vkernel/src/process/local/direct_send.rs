//! A remote Send without a segment on the thread's answer socket, outside
//! the engine: this process's `Route` and `Io` for `crate::direct`
//! (`process/direct.rs`, docs/PROTOCOL.md §8g).

use super::*;

impl LocalProcess {
    /// A remote Send without a segment on this thread's answer socket,
    /// outside the engine (`process/direct.rs`), if it may go that way:
    /// None sends it through the engine.
    pub(super) fn try_direct(
        &self,
        msg: &mut Message,
        to: Pid,
        deadline: Option<Duration>,
    ) -> Option<Result<Reply, IpcError>> {
        use crate::direct::{self, Went};
        use crate::process::direct::{Embedded, Host, Lease};
        let sh = &self.shared;
        if !self.direct_ok.get() || !to.is_process() || to.host() == sh.host {
            return None;
        }
        let ip = sh.answers?;
        let mut slot = self.lease.take();
        if !slot.as_ref().is_some_and(|l| l.ready_for(to.host())) {
            let ok = sh.with_engine(|e, now| {
                sh.direct_peers.adopt(e);
                slot.get_or_insert_with(|| Box::new(Lease::new(e, self.pid)))
                    .renew(e, now, to.host())
            });
            if !ok {
                self.lease.set(slot);
                return None;
            }
        }
        let Some((sock, port)) = crate::waiter::answer_socket(sh.net.serial(), ip) else {
            self.lease.set(slot);
            return None;
        };
        let mut lease = slot?;
        let start = sh.now();
        let policy = self.spin.get();
        let spinners = if policy.wants_to_spin() {
            sh.spinning()
        } else {
            0
        };
        let spin = Spin::begin(&policy, start, spinners, sh.cpus, || {
            sh.run_queue.contended(start, sh.cpus)
        });
        let due = Deadline::after(start, deadline);
        let mut io = ThreadIo {
            sh,
            sock: &sock,
            w: &self.waiter,
        };
        let call = direct::Call {
            me: self.pid,
            to,
            forwarder: self.pid,
            msg: *msg,
            principal: lease.principal,
            deadline: due,
            spin,
            block_at_once: spin.budget_us() == 0,
        };
        self.trace(Phase::Send, self.pid, to, true);
        // The span's key is the sequence number the RemoteSend carries.
        #[cfg(feature = "otel")]
        if let Some(b) = self.otel.borrow_mut().send.as_mut() {
            b.seq = lease.next_seq();
        }
        // (So that destruction or shutdown wakes it: it is not parked.)
        self.waiter.set_answer_port(port);
        let (went, blocked, resent) = ANSWER_BUF.with(|b| {
            let mut b = b.borrow_mut();
            let host = Host {
                peers: &sh.direct_peers,
                tally: &sh.direct_tally,
                sends: &sh.net.counters.direct_sends,
            };
            let mut out = std::mem::take(&mut lease.out);
            let mut route = Embedded {
                lease: &mut lease,
                host: &host,
            };
            let r = direct::send(&mut route, &mut io, &mut b[..], &mut out, &call);
            lease.out = out;
            r
        });
        self.waiter.set_answer_port(0);
        // (A wait that ran through a retransmission timeout says nothing
        // of how long an answer takes: the policy does not learn from it.)
        if resent {
            let mut n = self.waits.get();
            if blocked {
                n.blocked += 1;
            } else {
                n.unblocked += 1;
            }
            self.waits.set(n);
        } else {
            self.waited(policy, start, blocked, false);
        }
        lease.flush(&sh.direct_tally, &sh.net.counters.direct_sends, false);
        if matches!(went, Went::Forwarded { .. }) {
            lease.end();
        }
        self.lease.set(Some(lease));
        match went {
            Went::Done(Ok(r)) => {
                self.trace(Phase::Complete, self.pid, r.from, true);
                *msg = r.msg;
                Some(Ok(Reply {
                    from: r.from,
                    seg_bytes: r.seg_bytes,
                }))
            }
            Went::Done(Err(e)) => {
                self.trace(Phase::Complete, self.pid, to, false);
                Some(Err(e))
            }
            Went::Forwarded {
                to,
                forwarder,
                msg: m,
            } => {
                *msg = m;
                msg.set_flag(SEGMENT | SEG_READ | SEG_WRITE, false);
                Some(self.send_through_engine(msg, to, due.left(sh.now()), forwarder))
            }
        }
    }
}

thread_local! {
    /// Where a thread blocked in its answer socket receives (an answer is
    /// a small datagram; a larger one is truncated and dropped as such).
    pub(super) static ANSWER_BUF: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(vec![0u8; vkernel_proto::wire::MAX_DATAGRAM]);
}

/// A thread's side of a direct Send (`process/direct.rs`): its answer
/// socket, the host's clock, the process's flags.
struct ThreadIo<'a> {
    sh: &'a Shared,
    sock: &'a Arc<std::net::UdpSocket>,
    w: &'a Waiter,
}

impl crate::direct::Io for ThreadIo<'_> {
    fn now(&self) -> u64 {
        self.sh.now()
    }

    fn send(&mut self, to: std::net::SocketAddr, data: &[u8]) {
        if let Some(t) = &self.sh.tracer {
            t.datagram(true, data);
        }
        self.sh.net.send_from(self.sock, to, data);
    }

    fn recv(&mut self, buf: &mut [u8], wait_us: u64, exact: bool) -> Option<usize> {
        let n = if wait_us == 0 {
            self.sh.net.recv_answer(self.sock, buf).map(|(n, _)| n)
        } else if self.gone().is_some() {
            // (Set before the port was noted: nobody wakes this wait.)
            None
        } else {
            let wait = Duration::from_micros(wait_us);
            match crate::waiter::recv_answer_within(self.sock, buf, wait, exact) {
                // (Empty: a wake-up meant for an earlier wait.)
                Ok((n, _, _)) if n > 0 => {
                    self.sh.net.count_answer();
                    Some(n)
                }
                _ => None,
            }
        };
        if let (Some(t), Some(n)) = (&self.sh.tracer, n) {
            t.datagram(false, buf.get(..n).unwrap_or_default());
        }
        n
    }

    fn contended(&mut self, now: u64) -> bool {
        self.sh.run_queue.contended(now, self.sh.cpus)
    }

    fn gone(&self) -> Option<IpcError> {
        if self.w.destroyed.load(Ordering::Acquire) {
            Some(IpcError::Destroyed)
        } else if self.sh.stopping() {
            Some(IpcError::Shutdown)
        } else {
            None
        }
    }
}
