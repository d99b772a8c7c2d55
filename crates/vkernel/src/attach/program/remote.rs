//! An attached process's remote Sends on its own socket: asking the host
//! for a block, its timers, keys and faults, and running `crate::direct`
//! (`attach/direct.rs`, docs/PROTOCOL.md §8f).

use super::*;

impl AttachedProcess {
    /// A remote Send on this process's own socket, if the host allows it
    /// (see `direct.rs`). `None`: through the host, to `to` as forwarded
    /// by `fwd` (changed if the receiver forwarded it meanwhile).
    pub(super) fn direct_send(
        &self,
        msg: &mut Message,
        to: &mut Pid,
        fwd: &mut Pid,
        at: Deadline,
    ) -> Option<Result<Reply, IpcError>> {
        if !to.is_process()
            || to.host() == self.at.host
            || !self.at.direct_on.load(Ordering::Relaxed)
        {
            return None;
        }
        if let Some(e) = self.slot().ended() {
            return Some(Err(e));
        }
        let refuse = || {
            self.at.direct_on.store(false, Ordering::Relaxed);
            None
        };
        let now = self.at.pace.clock.now();
        let mut path = self.direct.borrow_mut();
        if path.is_none() {
            let peers = self.at.peer_times.clone();
            match self.at.host_addr.map(|a| DirectPath::new(a, peers)) {
                Some(Ok(p)) => *path = Some(p),
                _ => return refuse(),
            }
        }
        let path = path.as_mut()?;
        let host = to.host();
        if let Some(n) = path.must_ask(host, now) {
            let words = [
                kind::ASK,
                0,
                ask::DIRECT,
                u32::from(host.0),
                self.pid.0,
                n,
                u32::from(path.port()),
                0,
            ];
            // What it learned of `host` goes back with the question.
            let back = path.lend_back(host).unwrap_or_default();
            match self.at.ask(words, back.as_bytes(), &[]) {
                Ok(r) => {
                    // ADDR;timers=…[;keyed][;faults=SPEC] (PROTOCOL.md §8f)
                    let doc = std::str::from_utf8(&r.payload).unwrap_or_default();
                    let mut parts = doc.split(';');
                    let loc = parts.next().and_then(|a| a.parse().ok());
                    let mut keyed = false;
                    for p in parts {
                        match p.split_once('=') {
                            Some(("timers", t)) => path.set_timers(t),
                            Some(("now", t)) => path.set_host_clock(t, now),
                            Some(("rtt", w)) => path.take_lent(host, w, now),
                            Some(("faults", f)) => path.set_faults(f),
                            None if p == "keyed" => keyed = true,
                            _ => {}
                        }
                    }
                    // A keyed host: its datagrams are sealed with its keys
                    // and its one counter, lent once to the program.
                    let sealer = if keyed { self.at.lent_sealer() } else { None };
                    if keyed && sealer.is_none() {
                        return refuse();
                    }
                    path.set_sealer(sealer);
                    path.learn(host, loc, r.words[4], r.words[5].min(n), now);
                }
                // The call through the host will say so.
                Err(IpcError::HostLost | IpcError::Shutdown) => return None,
                Err(_) => return refuse(),
            }
        }
        if !path.can_send(host) {
            return None;
        }
        let (mut policy, mut waits) = (self.spin.get(), self.waits.get());
        // (The host marks the slot when it destroys the process.)
        let gone = || self.at.gone().or_else(|| self.slot().ended());
        let trace = |tx: bool, d: &[u8]| {
            if let Some(k) = trace::datagram_kind(tx, d) {
                self.at.trace(trace::wall_us(), k);
            }
        };
        let mut w = Waiting {
            pace: &self.at.pace,
            policy: &mut policy,
            waits: &mut waits,
            gone: &gone,
            deadline: at,
            trace: self
                .at
                .tracing
                .then_some(&trace as &crate::attach::direct::TraceFn<'_>),
        };
        let t0 = trace::wall_us();
        let seq = path.next_seq();
        let went = path.send(
            &mut w,
            &self.at.net_counters,
            self.pid,
            *to,
            *fwd,
            *msg,
            self.principal.get(),
        );
        self.counted(path.events());
        if let (Some(seq), Went::Done(r)) = (seq, &went) {
            self.span_sent(*to, seq, t0, r.is_ok(), false);
        }
        self.spin.set(policy);
        self.waits.set(waits);
        if self.at.tracing && !matches!(went, Went::Forwarded { .. }) {
            let by = match &went {
                Went::Done(Ok(info)) => info.from,
                _ => *to,
            };
            let ok = matches!(went, Went::Done(Ok(_)));
            self.at
                .trace(t0, trace::phase_kind(Phase::Send, self.pid, *to, true));
            let end = trace::wall_us();
            self.at
                .trace(end, trace::phase_kind(Phase::Complete, self.pid, by, ok));
        }
        match went {
            Went::Done(r) => Some(r.map(|info| {
                *msg = info.msg;
                Reply {
                    from: info.from,
                    seg_bytes: 0,
                }
            })),
            Went::Forwarded {
                to: t,
                forwarder,
                msg: m,
            } => {
                (*to, *fwd, *msg) = (t, forwarder, m);
                None
            }
        }
    }

    /// The host is about to send for this process (with a number newer
    /// than any reserved): the direct path asks for new ones next time.
    /// Only a Send the host makes to another host or a group carries a
    /// sequence number: one to this host's process does not, unless its
    /// receiver forwards it away (then the caller ends the block after).
    pub(super) fn end_direct_lease(&self, to: Pid) {
        if to.is_process() && to.host() == self.at.host {
            return;
        }
        if let Some(p) = self.direct.borrow_mut().as_mut() {
            p.end_lease();
        }
    }
}
