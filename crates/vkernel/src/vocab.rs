//! The runtime's shared vocabulary: the plain types that the kernel,
//! `process/`, `attach/` and `aio` all speak (what a Send got back, what a
//! Receive took, a lent segment, wait counts, a host's load, a value on a
//! cache line of its own).
//!
//! A leaf: it imports nothing else of this crate, so the modules that use
//! these types depend on it rather than on each other. The public ones are
//! re-exported at the crate root (`vkernel::Reply`, ...).

use std::time::Duration;

use vkernel_proto::Pid;

/// How a process's waits (for a reply, a message, a move) ended: the
/// answer was there, or came while the process busy-polled, or the process
/// had to block and be woken (which costs tens of µs across CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitCounts {
    /// Waits that ended without blocking.
    pub unblocked: u64,
    /// Waits that blocked.
    pub blocked: u64,
    /// Of the blocked waits, those that did not spin because the CPUs
    /// were taken (as many spinners on the host as CPUs, or more runnable
    /// threads on the machine than CPUs): blocking was the policy's
    /// choice for the machine, not a miss of its own.
    pub blocked_crowded: u64,
}

/// A segment lent with a Send: the receiver may read and/or write it while
/// the sender awaits its reply.
pub enum Segment<'a> {
    /// Receiver may read (MoveFrom; the first part travels with the message).
    Read(&'a [u8]),
    /// Receiver may write (MoveTo; reply-with-segment).
    Write(&'a mut [u8]),
    /// Receiver may read and write.
    ReadWrite(&'a mut [u8]),
}

/// What a Send got back besides the reply message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The process that replied.
    pub from: Pid,
    /// Bytes the replier wrote into the segment with its reply (in the
    /// reply datagram or sent ahead of it; not bytes moved by MoveTo).
    pub seg_bytes: usize,
}

/// A logical host's answer to a host-selection query.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostLoad {
    /// The host's kernel server (its pid names the host).
    pub kernel_server: Pid,
    /// Processes on the logical host.
    pub processes: u32,
    /// The machine's 1-minute load average.
    pub load: f64,
    /// Online CPUs of the machine.
    pub cpus: u32,
    /// When the answer arrived, from the start of the query.
    pub after: Duration,
}

/// A message taken by Receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The sender (reply to it).
    pub from: Pid,
    /// Bytes of the sender's segment copied into the receive buffer.
    pub seg_bytes: usize,
    /// The process that forwarded the message (== `from` if not forwarded).
    pub forwarder: Pid,
    /// The principal the sender runs as (authenticated as far as the
    /// cluster key authenticates its host; 0 = none).
    pub principal: u32,
}

/// A value alone on its cache line.
#[repr(align(64))]
pub(crate) struct CacheLine<T>(pub(crate) T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
