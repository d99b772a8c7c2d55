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
        let mut attrs = vec![
            KeyValue::new("vkernel.host", format!("{:04x}", sender.host().0)),
            KeyValue::new("vkernel.sender", pid(sender)),
            KeyValue::new("vkernel.receiver", pid(b.peer)),
            KeyValue::new("vkernel.remote", b.peer.host() != sender.host()),
        ];
        if let Some(s) = b.seq {
            attrs.push(KeyValue::new("vkernel.seq", i64::from(s)));
        }
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
        span.end_with_timestamp(SystemTime::now().max(b.at));
    }

    /// `receiver` replied now to the message delivered at `b`.
    pub(crate) fn receive(&self, receiver: Pid, b: Begun) {
        let mut attrs = vec![
            KeyValue::new("vkernel.host", format!("{:04x}", receiver.host().0)),
            KeyValue::new("vkernel.sender", pid(b.peer)),
            KeyValue::new("vkernel.receiver", pid(receiver)),
            KeyValue::new("vkernel.remote", b.peer.host() != receiver.host()),
        ];
        if let Some(s) = b.seq {
            attrs.push(KeyValue::new("vkernel.seq", i64::from(s)));
        }
        let mut span = self
            .tracer
            .span_builder("vkernel.receive")
            .with_kind(SpanKind::Server)
            .with_start_time(b.at)
            .with_attributes(attrs)
            .start(&self.tracer);
        span.end_with_timestamp(SystemTime::now().max(b.at));
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
