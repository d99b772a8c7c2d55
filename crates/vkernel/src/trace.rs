//! Message tracing (`KernelConfig::trace`): every datagram sent and
//! received, and the phases of every exchange (Send, Deliver to the
//! receiver, Reply, Complete at the sender), appended as JSON lines with
//! wall-clock microseconds so traces of several OS processes line up.
//!
//! One line per event:
//! `{"t":µs,"h":"host","ev":"tx|rx|send|deliver|reply|complete",...}`;
//! datagram events add `type`, `src`, `dst`, `seq`, `len`; exchange events
//! add `src` and `dst` pids (`err` on a failed Send).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

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

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Send => "send",
            Phase::Deliver => "deliver",
            Phase::Reply => "reply",
            Phase::Complete => "complete",
        }
    }
}

fn type_name(t: PacketType) -> &'static str {
    match t {
        PacketType::LogicalHostRequest => "LogicalHostRequest",
        PacketType::LogicalHostComplaint => "LogicalHostComplaint",
        PacketType::RemoteSend => "RemoteSend",
        PacketType::RemoteReply => "RemoteReply",
        PacketType::RemoteForward => "RemoteForward",
        PacketType::NAck => "NAck",
        PacketType::ReplyPending => "ReplyPending",
        PacketType::RemoteGetPid => "RemoteGetPid",
        PacketType::RemoteGetPidReply => "RemoteGetPidReply",
        PacketType::MoveToRequest => "MoveToRequest",
        PacketType::MoveToReply => "MoveToReply",
        PacketType::MoveFromRequest => "MoveFromRequest",
        PacketType::MoveFromReply => "MoveFromReply",
    }
}

/// Writes one host's trace.
pub(crate) struct Tracer {
    out: Mutex<BufWriter<File>>,
    host: AtomicU16,
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
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

    fn line(&self, body: std::fmt::Arguments<'_>) {
        let t = now_us();
        let host = self.host.load(Ordering::Relaxed);
        // Formatted straight into the buffered file: no allocation.
        if let Ok(mut w) = self.out.lock() {
            let _ = writeln!(w, "{{\"t\":{t},\"h\":\"{host:04x}\",{body}}}");
        }
    }

    /// A datagram sent (`tx`) or received; its header is read from the
    /// bytes (plaintext even when authenticated).
    pub(crate) fn datagram(&self, tx: bool, d: &[u8]) {
        if d.len() < FIXED_BYTES {
            return;
        }
        let Some(r) = RawHeader::new_checked(d) else {
            return;
        };
        let ty = r.ptype().map_or("?", type_name);
        self.line(format_args!(
            "\"ev\":\"{}\",\"type\":\"{ty}\",\"src\":\"{:08x}\",\"dst\":\"{:08x}\",\"seq\":{},\"len\":{}",
            if tx { "tx" } else { "rx" },
            r.src().0,
            r.dst().0,
            r.seq(),
            d.len()
        ));
    }

    /// A phase of an exchange between `src` (the sender) and `dst`.
    pub(crate) fn phase(&self, p: Phase, src: Pid, dst: Pid, ok: bool) {
        self.line(format_args!(
            "\"ev\":\"{}\",\"src\":\"{:08x}\",\"dst\":\"{:08x}\"{}",
            p.name(),
            src.0,
            dst.0,
            if ok { "" } else { ",\"err\":true" }
        ));
    }

    pub(crate) fn flush(&self) {
        if let Ok(mut w) = self.out.lock() {
            let _ = w.flush();
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.flush();
    }
}
