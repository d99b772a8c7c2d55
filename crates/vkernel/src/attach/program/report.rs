//! What a program tells its host of its exchanges outside it: counters
//! (TALLY) and trace lines (TRACE), and the host's keys it borrows; and
//! the host-level questions it asks.

use super::*;

impl Attachment {
    /// The host's keys and its packet counter's page, asked for once
    /// (a keyed host's direct path, docs/PROTOCOL.md §8f).
    pub(super) fn lent_sealer(&self) -> Option<Sealer> {
        let mut g = lock(&self.sealer);
        if let Some(s) = &*g {
            return s.clone();
        }
        let s = self
            .ask([kind::ASK, 0, ask::KEYS, 0, 0, 0, 0, 0], &[], &[])
            .ok()
            .and_then(|r| {
                let cfg = AuthConfig::from_bytes(&r.payload)?;
                let page = CounterPage::adopt(r.fds.first()?).ok()?;
                Some(Sealer::lent(cfg, Arc::new(page), self.pace.clock.now()))
            });
        *g = Some(s.clone());
        s
    }

    /// Traces `kind` at wall-clock time `t` for the host's trace, sent in
    /// batches of 32 KiB (and with each report sent now).
    pub(crate) fn trace(&self, t: u64, kind: trace::Kind) {
        let mut b = lock(&self.traces);
        trace::write_line(&mut *b, t, self.host.0, kind);
        if b.len() >= TRACE_BYTES {
            let lines = std::mem::take(&mut *b);
            drop(b);
            self.send_record(kind::TRACE, &lines);
        }
    }

    pub(super) fn send_record(&self, what: u32, payload: &[u8]) {
        let words = [what, 0, 0, 0, 0, 0, 0, 0];
        let _g = lock(&self.send_lock);
        // (Lost with the host: they go with it.)
        let _ = control::send(&self.sock, &words, payload, &[]);
    }

    /// Returns once the host has taken every record sent before (it takes
    /// a connection's records in order; a question's answer follows them).
    pub(crate) fn synced(&self) {
        let _ = self.question(ask::PROCESS_EXISTS, 0, &[]);
    }

    /// Adds `evs` (emptied) to what is reported to the host, and sends
    /// the report if it has grown large or `now`.
    pub(crate) fn report(&self, evs: &mut Vec<Ev>, now: bool) {
        let mut b = lock(&self.reports);
        for e in evs.drain(..) {
            e.encode(&mut b);
        }
        if !b.is_empty() && (now || b.len() >= REPORT_BYTES) {
            let payload = std::mem::take(&mut *b);
            drop(b);
            self.send_record(kind::TALLY, &payload);
        } else {
            drop(b);
        }
        if now && self.tracing {
            let lines = std::mem::take(&mut *lock(&self.traces));
            if !lines.is_empty() {
                self.send_record(kind::TRACE, &lines);
            }
        }
    }
}

impl AttachedProcess {
    /// Takes `evs` (emptied) into the process's pending events, handing
    /// them to the attachment's report every [`PENDING_EVENTS`].
    pub(super) fn counted(&self, evs: &mut Vec<Ev>) {
        if evs.is_empty() {
            return;
        }
        let mut p = self.pending.borrow_mut();
        p.append(evs);
        if p.len() >= PENDING_EVENTS {
            self.at.report(&mut p, false);
        }
    }

    /// Moves the peer-page exchanges counted so far into `pending`.
    pub(super) fn flush_local(&self) {
        let n = self.local_n.replace(0);
        if n == 0 {
            return;
        }
        let h = std::mem::take(&mut *self.local_hist.borrow_mut());
        let mut evs = vec![Ev::LocalExchanges(n)];
        for (b, (&count, &sum)) in h.counts.iter().zip(&h.sums).enumerate() {
            if count > 0 {
                evs.push(Ev::LocalLatency {
                    bucket: b as u8,
                    count,
                    sum,
                });
            }
        }
        self.counted(&mut evs);
    }

    /// Sends what this process counted to the host now.
    pub(super) fn report_now(&self) {
        self.flush_local();
        self.at.report(&mut self.pending.borrow_mut(), true);
    }
}

/// Kernel-level questions an attached program asks its host.
impl Attachment {
    pub(crate) fn process_exists(&self, pid: Pid) -> bool {
        self.question(ask::PROCESS_EXISTS, pid.0, &[])
            .is_ok_and(|r| r.words[4] != 0)
    }

    pub(crate) fn document(&self, what: u32) -> String {
        self.report(&mut Vec::new(), true);
        self.question(what, 0, &[])
            .ok()
            .and_then(|r| String::from_utf8(r.payload).ok())
            .unwrap_or_default()
    }

    pub(crate) fn srtt(&self, host: HostId) -> Option<Duration> {
        let r = self.question(ask::SRTT, u32::from(host.0), &[]).ok()?;
        (r.words[4] != 0).then(|| Duration::from_micros(u64::from(r.words[5])))
    }

    /// Asks the machine host to add a peer: an address, or a name it then
    /// follows (the text of a [`crate::PeerSpec`]).
    pub(crate) fn add_peer(&self, peer: &str) {
        let _ = self.question(ask::ADD_PEER, 0, peer.as_bytes());
    }
}
