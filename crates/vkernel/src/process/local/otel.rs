//! Exchange spans (OpenTelemetry, feature `otel`) of an embedded host's
//! process: begun and ended at the phases its tracer records.

use super::*;

impl LocalProcess {
    /// Begins or ends an exchange span (Send and Complete are the
    /// sender's, Deliver and Reply the receiver's; `src` is the sender).
    pub(super) fn otel_phase(&self, p: Phase, src: Pid, dst: Pid, ok: bool) {
        use crate::otel::Begun;
        let Some(spans) = &self.shared.otel else {
            return;
        };
        let at = std::time::SystemTime::now();
        match p {
            Phase::Send => {
                self.otel.borrow_mut().send = Some(Begun {
                    at,
                    peer: dst,
                    seq: None,
                    page: false,
                });
            }
            Phase::Deliver => {
                let seq = self.shared.with_engine(|e, _| e.exchange_seq(src));
                self.otel.borrow_mut().delivered(Begun {
                    at,
                    peer: src,
                    seq,
                    page: false,
                });
            }
            Phase::Reply => {
                let b = self.otel.borrow_mut().replied(src);
                if let Some(b) = b {
                    spans.receive(self.pid, b);
                }
            }
            // An async Send's end (a blocking one's span has ended in
            // `finish_send`, with the error's text).
            Phase::Complete => {
                let b = self.otel.borrow_mut().send.take();
                if let Some(b) = b {
                    let by = if ok {
                        Ok(dst)
                    } else {
                        Err("the Send failed".to_string())
                    };
                    spans.send(self.pid, b, by);
                }
            }
        }
    }

    /// The Send has gone to the engine: note its sequence number (under
    /// the engine's lock, before a reply can end the exchange). A sink
    /// that completes it (an attached program's call slot) takes the
    /// span, to end it then.
    pub(crate) fn otel_sent(&self, e: &vkernel_proto::Engine) {
        if self.shared.otel.is_some() {
            let mut ip = self.otel.borrow_mut();
            if let Some(b) = ip.send.as_mut() {
                b.seq = e.exchange_seq(self.pid);
            }
            if let (Some(sink), Some(b)) = (self.waiter.sink(), ip.send) {
                if self.waiter.is_armed() {
                    ip.send = sink.send_begun(b);
                }
            }
        }
    }

    /// The Send returned: replied to by `by`, or failed.
    pub(super) fn otel_complete(&self, by: Result<Pid, String>) {
        if let Some(spans) = &self.shared.otel {
            let b = self.otel.borrow_mut().send.take();
            if let Some(b) = b {
                spans.send(self.pid, b, by);
            }
        }
    }

    /// A Send through peer pages begun at `at` (exchange `seq` with `to`)
    /// returned: its span, as [`LocalProcess::otel_complete`] ends one.
    pub(super) fn otel_page_send(
        &self,
        at: std::time::SystemTime,
        to: Pid,
        seq: u32,
        by: Result<Pid, String>,
    ) {
        if let Some(spans) = &self.shared.otel {
            let b = crate::otel::Begun {
                at,
                peer: to,
                seq: Some(seq),
                page: true,
            };
            spans.send(self.pid, b, by);
        }
    }

    /// A message from `from` (its exchange `seq`) taken from the inbox:
    /// its span begins (the Reply ends it, as for the engine's).
    pub(super) fn otel_page_deliver(&self, from: Pid, seq: u32) {
        if self.shared.otel.is_some() {
            self.otel.borrow_mut().delivered(crate::otel::Begun {
                at: std::time::SystemTime::now(),
                peer: from,
                seq: Some(seq),
                page: true,
            });
        }
    }
}
