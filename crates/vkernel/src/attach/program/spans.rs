//! Spans of a program's exchanges outside its host (peer pages, direct
//! Sends), for a host that exports them (`otel.rs`): reported as TALLY
//! events, which the host turns into the spans the engine would make.

use super::*;
use crate::direct::SpanEv;

impl AttachedProcess {
    /// This process's Send to `to` (exchange `seq`), begun at `start`
    /// (wall-clock µs), ended now.
    pub(super) fn span_sent(&self, to: Pid, seq: u32, start: u64, ok: bool, page: bool) {
        if !self.at.spans {
            return;
        }
        self.span(SpanEv {
            receive: false,
            ok,
            page,
            sender: self.pid,
            receiver: to,
            seq,
            start,
            dur: 0,
        });
    }

    /// When a message received through the inbox came, for its span (0
    /// if the host takes none).
    pub(super) fn span_delivered(&self) -> u64 {
        if self.at.spans {
            trace::wall_us()
        } else {
            0
        }
    }

    /// This process answered (replied to or forwarded) `from`'s exchange
    /// `seq`, received through its inbox at `at`.
    pub(super) fn span_answered(&self, from: Pid, seq: u32, at: u64) {
        if !self.at.spans || at == 0 {
            return;
        }
        self.span(SpanEv {
            receive: true,
            ok: true,
            page: true,
            sender: from,
            receiver: self.pid,
            seq,
            start: at,
            dur: 0,
        });
    }

    /// Ends `sp` (begun at `sp.start`) now and reports it.
    fn span(&self, mut sp: SpanEv) {
        let end = trace::wall_us();
        sp.dur = u32::try_from(end.saturating_sub(sp.start)).unwrap_or(u32::MAX);
        self.counted(&mut vec![Ev::Span(sp)]);
    }
}
