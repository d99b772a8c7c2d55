//! Message tracing (`KernelConfig::trace`): every datagram sent and
//! received, and the phases of every exchange (Send, Deliver to the
//! receiver, Reply, Complete at the sender), appended as JSON lines with
//! wall-clock microseconds so traces of several OS processes line up.
//!
//! Each line is one [`Event`], written and read with serde:
//! `{"t":µs,"h":"host","ev":"tx|rx|send|deliver|reply|complete",...}`;
//! datagram events add `type`, `src`, `dst`, `seq`, `len`; exchange events
//! add `src` and `dst` pids (`err` on a failed Send). Hosts and pids are
//! hexadecimal strings, as elsewhere in vkernel's output.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use vkernel_proto::wire::{PacketType, RawHeader, FIXED_BYTES};
use vkernel_proto::Pid;

/// Phases of an exchange as seen by the processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A process called Send.
    Send,
    /// A receiver got the message from Receive.
    Deliver,
    /// A receiver replied.
    Reply,
    /// The sender's Send returned.
    Complete,
}

/// One line of a trace file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Wall-clock microseconds since the Unix epoch.
    pub t: u64,
    /// The logical host that wrote the line (0 before its id is allocated).
    #[serde(rename = "h", with = "hex16")]
    pub host: u16,
    /// What happened.
    #[serde(flatten)]
    pub kind: Kind,
}

/// What an [`Event`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "lowercase")]
pub enum Kind {
    /// A datagram sent.
    Tx(Datagram),
    /// A datagram received.
    Rx(Datagram),
    /// A process called Send.
    Send(Exchange),
    /// A receiver got the message.
    Deliver(Exchange),
    /// A receiver replied.
    Reply(Exchange),
    /// The sender's Send returned.
    Complete(Exchange),
}

/// A datagram's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Datagram {
    /// Packet type.
    #[serde(rename = "type")]
    pub packet: Packet,
    /// Source pid.
    #[serde(with = "hex32")]
    pub src: u32,
    /// Destination pid.
    #[serde(with = "hex32")]
    pub dst: u32,
    /// Sequence number.
    pub seq: u32,
    /// Bytes on the wire.
    pub len: u64,
}

/// The two processes of an exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    /// The sender.
    #[serde(with = "hex32")]
    pub src: u32,
    /// The receiver.
    #[serde(with = "hex32")]
    pub dst: u32,
    /// The Send failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub err: bool,
}

/// Packet types as named in traces ([`PacketType`]'s variants, or `?`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Packet {
    /// [`PacketType::LogicalHostRequest`].
    LogicalHostRequest,
    /// [`PacketType::LogicalHostComplaint`].
    LogicalHostComplaint,
    /// [`PacketType::RemoteSend`].
    RemoteSend,
    /// [`PacketType::RemoteReply`].
    RemoteReply,
    /// [`PacketType::RemoteForward`].
    RemoteForward,
    /// [`PacketType::NAck`].
    NAck,
    /// [`PacketType::ReplyPending`].
    ReplyPending,
    /// [`PacketType::RemoteGetPid`].
    RemoteGetPid,
    /// [`PacketType::RemoteGetPidReply`].
    RemoteGetPidReply,
    /// [`PacketType::MoveToRequest`].
    MoveToRequest,
    /// [`PacketType::MoveToReply`].
    MoveToReply,
    /// [`PacketType::MoveFromRequest`].
    MoveFromRequest,
    /// [`PacketType::MoveFromReply`].
    MoveFromReply,
    /// A type byte this build does not know.
    #[serde(rename = "?")]
    Unknown,
}

impl From<PacketType> for Packet {
    fn from(t: PacketType) -> Packet {
        match t {
            PacketType::LogicalHostRequest => Packet::LogicalHostRequest,
            PacketType::LogicalHostComplaint => Packet::LogicalHostComplaint,
            PacketType::RemoteSend => Packet::RemoteSend,
            PacketType::RemoteReply => Packet::RemoteReply,
            PacketType::RemoteForward => Packet::RemoteForward,
            PacketType::NAck => Packet::NAck,
            PacketType::ReplyPending => Packet::ReplyPending,
            PacketType::RemoteGetPid => Packet::RemoteGetPid,
            PacketType::RemoteGetPidReply => Packet::RemoteGetPidReply,
            PacketType::MoveToRequest => Packet::MoveToRequest,
            PacketType::MoveToReply => Packet::MoveToReply,
            PacketType::MoveFromRequest => Packet::MoveFromRequest,
            PacketType::MoveFromReply => Packet::MoveFromReply,
        }
    }
}

impl Event {
    /// Parses one trace line.
    pub fn parse(line: &str) -> Result<Event, serde_json::Error> {
        serde_json::from_str(line)
    }
}

macro_rules! hex_field {
    ($name:ident, $t:ty, $width:literal) => {
        mod $name {
            use serde::{de::Error, Deserialize, Deserializer, Serializer};

            pub fn serialize<S: Serializer>(v: &$t, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(&format_args!(concat!("{:0", $width, "x}"), v))
            }

            pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                <$t>::from_str_radix(&s, 16).map_err(D::Error::custom)
            }
        }
    };
}
hex_field!(hex16, u16, "4");
hex_field!(hex32, u32, "8");

/// Writes one host's trace.
pub(crate) struct Tracer {
    out: Mutex<BufWriter<File>>,
    host: AtomicU16,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Tracer {
    /// Creates (truncates) the trace file.
    pub(crate) fn create(path: &Path) -> std::io::Result<Tracer> {
        Ok(Tracer {
            out: Mutex::new(BufWriter::with_capacity(1 << 16, File::create(path)?)),
            host: AtomicU16::new(0),
        })
    }

    pub(crate) fn set_host(&self, h: u16) {
        self.host.store(h, Ordering::Relaxed);
    }

    fn line(&self, kind: Kind) {
        // Serialized straight into the buffered file: no allocation.
        if let Ok(mut w) = self.out.lock() {
            write_line(&mut *w, now_us(), self.host.load(Ordering::Relaxed), kind);
        }
    }

    /// A datagram sent (`tx`) or received; its header is read from the
    /// bytes (plaintext even when authenticated).
    pub(crate) fn datagram(&self, tx: bool, d: &[u8]) {
        if let Some(k) = datagram_kind(tx, d) {
            self.line(k);
        }
    }

    /// A phase of an exchange between `src` (the sender) and `dst`.
    pub(crate) fn phase(&self, p: Phase, src: Pid, dst: Pid, ok: bool) {
        self.line(phase_kind(p, src, dst, ok));
    }

    /// Appends the lines an attached program traced for this host (its
    /// exchanges outside the host: direct Sends, peer pages): each must be
    /// an [`Event`] of this host's; the others are dropped. Returns how
    /// many were kept.
    pub(crate) fn append_reported(&self, lines: &[u8]) -> usize {
        let host = self.host.load(Ordering::Relaxed);
        let Ok(mut w) = self.out.lock() else {
            return 0;
        };
        let mut kept = 0;
        for line in lines.split(|&b| b == b'\n') {
            let Ok(text) = std::str::from_utf8(line) else {
                continue;
            };
            if Event::parse(text).is_ok_and(|e| e.host == host) {
                let _ = w.write_all(line);
                let _ = w.write_all(b"\n");
                kept += 1;
            }
        }
        kept
    }

    pub(crate) fn flush(&self) {
        if let Ok(mut w) = self.out.lock() {
            let _ = w.flush();
        }
    }
}

/// Writes one trace line (an [`Event`] and a newline) to `w`.
pub(crate) fn write_line(w: &mut impl Write, t: u64, host: u16, kind: Kind) {
    let e = Event { t, host, kind };
    if serde_json::to_writer(&mut *w, &e).is_ok() {
        let _ = w.write_all(b"\n");
    }
}

/// Wall-clock microseconds now (an [`Event`]'s time).
pub(crate) fn wall_us() -> u64 {
    now_us()
}

/// What a datagram sent (`tx`) or received is in a trace (None: not a
/// protocol datagram).
pub(crate) fn datagram_kind(tx: bool, d: &[u8]) -> Option<Kind> {
    if d.len() < FIXED_BYTES {
        return None;
    }
    let r = RawHeader::new_checked(d)?;
    let g = Datagram {
        packet: r.ptype().map_or(Packet::Unknown, Packet::from),
        src: r.src().0,
        dst: r.dst().0,
        seq: r.seq(),
        len: d.len() as u64,
    };
    Some(if tx { Kind::Tx(g) } else { Kind::Rx(g) })
}

/// A phase of an exchange between `src` (the sender) and `dst`.
pub(crate) fn phase_kind(p: Phase, src: Pid, dst: Pid, ok: bool) -> Kind {
    let x = Exchange {
        src: src.0,
        dst: dst.0,
        err: !ok,
    };
    match p {
        Phase::Send => Kind::Send(x),
        Phase::Deliver => Kind::Deliver(x),
        Phase::Reply => Kind::Reply(x),
        Phase::Complete => Kind::Complete(x),
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        for kind in [
            Kind::Tx(Datagram {
                packet: Packet::RemoteSend,
                src: 0x0001_0002,
                dst: 0x0003_0004,
                seq: 7,
                len: 108,
            }),
            Kind::Complete(Exchange {
                src: 1,
                dst: 2,
                err: true,
            }),
            Kind::Deliver(Exchange {
                src: 1,
                dst: 2,
                err: false,
            }),
        ] {
            let e = Event {
                t: 1_700_000_000_000_000,
                host: 0x2a,
                kind,
            };
            let line = serde_json::to_string(&e).unwrap();
            assert!(line.contains("\"h\":\"002a\""), "{line}");
            assert_eq!(Event::parse(&line).unwrap(), e, "{line}");
        }
        let old = r#"{"t":5,"h":"0001","ev":"rx","type":"?","src":"00010001","dst":"00020001","seq":3,"len":40}"#;
        let e = Event::parse(old).unwrap();
        assert!(matches!(
            e.kind,
            Kind::Rx(Datagram {
                packet: Packet::Unknown,
                len: 40,
                ..
            })
        ));
    }
}
