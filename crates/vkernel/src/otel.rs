//! OpenTelemetry spans of exchanges (feature `otel`, `KernelConfig::otel`).
//!
//! Each Send of a process of this host is a `vkernel.send` span (kind
//! Client) from the call to its return; each message a process of this
//! host receives is a `vkernel.receive` span (kind Server) from its
//! delivery to the reply. Spans go to the global tracer provider
//! (`opentelemetry::global`), which the program sets up with the SDK and
//! an exporter; without one they cost little and go nowhere.
//!
//! The span context does not travel with the message (docs/PROTOCOL.md,
//! "Trace context"): both spans carry the exchange's key instead, the
//! sender's pid and the sequence number its datagrams carry
//! (`vkernel.sender`, `vkernel.seq`), by which a collector joins them.
//! An exchange through peer pages (threads of one host) is keyed by the
//! pages' sequence number and marked `vkernel.page`.

use std::time::SystemTime;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{Span, SpanKind, Status, Tracer};
use opentelemetry::KeyValue;
use vkernel_proto::Pid;

/// The name of the instrumentation scope.
pub const SCOPE: &str = "vkernel";

/// The spans of one logical host.
pub(crate) struct Spans {
    tracer: BoxedTracer,
}

/// A span begun: when, with whom, and the exchange's sequence number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Begun {
    pub(crate) at: SystemTime,
    pub(crate) peer: Pid,
    pub(crate) seq: Option<u32>,
    /// Through peer pages (the sequence number is then the pages', not
    /// a datagram's).
    pub(crate) page: bool,
}

/// A process's spans in progress: its Send, and the messages it has
/// received and not yet replied to (a few; the oldest are forgotten).
#[derive(Debug, Default)]
pub(crate) struct InProgress {
    pub(crate) send: Option<Begun>,
    pub(crate) received: Vec<Begun>,
}

/// At most this many unreplied messages are remembered per process.
const MAX_RECEIVED: usize = 64;

impl InProgress {
    /// Remembers a delivered message (forgetting the oldest beyond the cap).
    pub(crate) fn delivered(&mut self, b: Begun) {
        self.received.retain(|r| r.peer != b.peer);
        if self.received.len() >= MAX_RECEIVED {
            self.received.remove(0);
        }
        self.received.push(b);
    }

    /// Takes the delivery the reply to `to` ends.
    pub(crate) fn replied(&mut self, to: Pid) -> Option<Begun> {
        let i = self.received.iter().position(|r| r.peer == to)?;
        Some(self.received.remove(i))
    }
}

impl Begun {
    /// The exchange's key attributes: its sequence number, and whether it
    /// went through peer pages (`vkernel.page`; the two kinds of number
    /// are counted apart).
    fn keys(&self, attrs: &mut Vec<KeyValue>) {
        if let Some(s) = self.seq {
            attrs.push(KeyValue::new("vkernel.seq", i64::from(s)));
        }
        if self.page {
            attrs.push(KeyValue::new("vkernel.page", true));
        }
    }
}

fn pid(p: Pid) -> String {
    format!("{:08x}", p.0)
}

impl Spans {
    pub(crate) fn new() -> Spans {
        Spans {
            tracer: opentelemetry::global::tracer(SCOPE),
        }
    }

    /// A Send of `sender` begun at `b` ended now, replied to by `replier`
    /// (`Err`: the Send failed).
    pub(crate) fn send(&self, sender: Pid, b: Begun, replier: Result<Pid, String>) {
        self.send_until(sender, b, replier, SystemTime::now());
    }

    /// The span an attached program reported of an exchange outside the
    /// engine (a peer page's, or a direct Send's).
    pub(crate) fn reported(&self, sp: &crate::direct::SpanEv) {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(sp.start);
        let end = at + std::time::Duration::from_micros(u64::from(sp.dur));
        let b = |peer| Begun {
            at,
            peer,
            seq: Some(sp.seq),
            page: sp.page,
        };
        if sp.receive {
            self.receive_until(sp.receiver, b(sp.sender), end);
        } else {
            let by = match sp.ok {
                true => Ok(sp.receiver),
                false => Err("the Send failed".to_string()),
            };
            self.send_until(sp.sender, b(sp.receiver), by, end);
        }
    }

    fn send_until(&self, sender: Pid, b: Begun, replier: Result<Pid, String>, end: SystemTime) {
        let mut attrs = vec![
            KeyValue::new("vkernel.host", format!("{:04x}", sender.host().0)),
            KeyValue::new("vkernel.sender", pid(sender)),
            KeyValue::new("vkernel.receiver", pid(b.peer)),
            KeyValue::new("vkernel.remote", b.peer.host() != sender.host()),
        ];
        b.keys(&mut attrs);
        if let Ok(r) = &replier {
            if *r != b.peer {
                attrs.push(KeyValue::new("vkernel.replier", pid(*r)));
            }
        }
        let mut span = self
            .tracer
            .span_builder("vkernel.send")
            .with_kind(SpanKind::Client)
            .with_start_time(b.at)
            .with_attributes(attrs)
            .start(&self.tracer);
        if let Err(e) = replier {
            span.set_status(Status::error(e));
        }
        span.end_with_timestamp(end.max(b.at));
    }

    /// `receiver` replied now to the message delivered at `b`.
    pub(crate) fn receive(&self, receiver: Pid, b: Begun) {
        self.receive_until(receiver, b, SystemTime::now());
    }

    fn receive_until(&self, receiver: Pid, b: Begun, end: SystemTime) {
        let mut attrs = vec![
            KeyValue::new("vkernel.host", format!("{:04x}", receiver.host().0)),
            KeyValue::new("vkernel.sender", pid(b.peer)),
            KeyValue::new("vkernel.receiver", pid(receiver)),
            KeyValue::new("vkernel.remote", b.peer.host() != receiver.host()),
        ];
        b.keys(&mut attrs);
        let mut span = self
            .tracer
            .span_builder("vkernel.receive")
            .with_kind(SpanKind::Server)
            .with_start_time(b.at)
            .with_attributes(attrs)
            .start(&self.tracer);
        span.end_with_timestamp(end.max(b.at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreplied_deliveries_are_bounded_and_matched_by_sender() {
        let b = |p: u32| Begun {
            at: SystemTime::now(),
            peer: Pid(p),
            seq: Some(p),
            page: false,
        };
        let mut ip = InProgress::default();
        for p in 0..200 {
            ip.delivered(b(p));
        }
        assert_eq!(ip.received.len(), MAX_RECEIVED);
        assert!(ip.replied(Pid(0)).is_none(), "the oldest were forgotten");
        assert_eq!(ip.replied(Pid(199)).map(|r| r.seq), Some(Some(199)));
        assert!(ip.replied(Pid(199)).is_none());
    }
}
