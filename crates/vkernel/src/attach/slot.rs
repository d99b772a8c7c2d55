//! The call slot: one per attached process, in a page shared by the
//! program and the machine host. The program writes a request and bumps
//! `req`; the host's proxy for the process runs it and bumps `done`.
//!
//! Invariants (see docs/PROTOCOL.md, "Attach"):
//! - The program writes the request words only while `done == req` (no
//!   call in flight), then stores `req + 1` (release). The host reads them
//!   after it sees `req` change (acquire) and writes the result words, then
//!   stores `done = req` (release).
//! - Every word is an atomic: a program that breaks the protocol (or
//!   scribbles on the page) makes the host read nonsense, never undefined
//!   behaviour; the host validates every value before it acts on it.
//! - A side about to block on the other's word sets its `*_parked` flag
//!   first and looks again; the other side calls FUTEX_WAKE only when the
//!   flag is set, so a spinning pair never makes a system call.

use std::sync::atomic::{AtomicU32, Ordering};

use vkernel_proto::{IpcError, Message};

/// Bytes of the slot file (one page).
pub(crate) const SLOT_BYTES: usize = 4096;

/// Words of request arguments and of results.
pub(crate) const ARGS: usize = 12;

/// The shared call slot.
#[repr(C, align(64))]
pub(crate) struct Slot {
    /// Sequence of the latest request (written by the program).
    pub(crate) req: AtomicU32,
    /// The program is blocked (or about to block) on `done`.
    pub(crate) prog_parked: AtomicU32,
    _line0: [u32; 14],
    /// Sequence of the latest completed request (written by the host).
    pub(crate) done: AtomicU32,
    /// The host's proxy is blocked (or about to block) on `req`.
    pub(crate) host_parked: AtomicU32,
    /// 0, or the error code (`IpcError::code`) the process ended with:
    /// set by the host when it destroys the process, read by the
    /// program's own remote Sends (`attach/direct.rs`), which the host
    /// does not see.
    pub(crate) ended: AtomicU32,
    _line1: [u32; 13],
    /// The operation ([`Op`]).
    pub(crate) op: AtomicU32,
    /// Its arguments.
    pub(crate) args: [AtomicU32; ARGS],
    /// The message it carries (Send, Reply, Forward).
    pub(crate) msg: [AtomicU32; 8],
    _line2: [u32; 11],
    /// 0, or the error's code (see `IpcError::code`).
    pub(crate) status: AtomicU32,
    /// The error's argument.
    pub(crate) err_arg: AtomicU32,
    /// Results.
    pub(crate) out: [AtomicU32; ARGS],
    /// The message returned (a reply, a received message).
    pub(crate) rmsg: [AtomicU32; 8],
}

const _: () = assert!(std::mem::size_of::<Slot>() <= SLOT_BYTES);
const _: () = assert!(std::mem::offset_of!(Slot, ended) == 72);
const _: () = assert!(std::mem::offset_of!(Slot, op) == 128);

impl Slot {
    /// The slot at the start of a mapping.
    ///
    /// # Safety
    /// `p` must point to at least [`SLOT_BYTES`] of page-aligned memory
    /// that stays mapped while the returned reference lives.
    pub(crate) unsafe fn at<'a>(p: *mut u8) -> &'a Slot {
        // SAFETY: aligned (pages are), large enough (checked at compile
        // time above), and every field is an atomic or padding, so any bit
        // pattern, written by anyone at any time, is a valid `Slot`.
        unsafe { &*(p as *const Slot) }
    }

    pub(crate) fn arg(&self, i: usize) -> u32 {
        self.args[i].load(Ordering::Relaxed)
    }

    pub(crate) fn arg64(&self, i: usize) -> u64 {
        u64::from(self.arg(i)) | (u64::from(self.arg(i + 1)) << 32)
    }

    pub(crate) fn set_arg(&self, i: usize, v: u32) {
        self.args[i].store(v, Ordering::Relaxed);
    }

    pub(crate) fn set_arg64(&self, i: usize, v: u64) {
        self.set_arg(i, v as u32);
        self.set_arg(i + 1, (v >> 32) as u32);
    }

    pub(crate) fn out(&self, i: usize) -> u32 {
        self.out[i].load(Ordering::Relaxed)
    }

    pub(crate) fn out64(&self, i: usize) -> u64 {
        u64::from(self.out(i)) | (u64::from(self.out(i + 1)) << 32)
    }

    pub(crate) fn set_out(&self, i: usize, v: u32) {
        self.out[i].store(v, Ordering::Relaxed);
    }

    pub(crate) fn set_out64(&self, i: usize, v: u64) {
        self.set_out(i, v as u32);
        self.set_out(i + 1, (v >> 32) as u32);
    }

    pub(crate) fn msg(&self) -> Message {
        Message(std::array::from_fn(|i| self.msg[i].load(Ordering::Relaxed)))
    }

    pub(crate) fn set_msg(&self, m: &Message) {
        for (w, v) in self.msg.iter().zip(m.0) {
            w.store(v, Ordering::Relaxed);
        }
    }

    pub(crate) fn rmsg(&self) -> Message {
        Message(std::array::from_fn(|i| {
            self.rmsg[i].load(Ordering::Relaxed)
        }))
    }

    pub(crate) fn set_rmsg(&self, m: &Message) {
        for (w, v) in self.rmsg.iter().zip(m.0) {
            w.store(v, Ordering::Relaxed);
        }
    }

    /// The result's error, if any.
    pub(crate) fn result(&self) -> Result<(), IpcError> {
        match self.status.load(Ordering::Relaxed) {
            0 => Ok(()),
            c => Err(IpcError::from_code(c, self.err_arg.load(Ordering::Relaxed))),
        }
    }

    /// Notes that the host ended the process with `e` (host side).
    pub(crate) fn set_ended(&self, e: &IpcError) {
        self.ended.store(e.code().0, Ordering::SeqCst);
    }

    /// Why the host ended the process, if it did (program side).
    pub(crate) fn ended(&self) -> Option<IpcError> {
        match self.ended.load(Ordering::SeqCst) {
            0 => None,
            c => Some(IpcError::from_code(c, 0)),
        }
    }

    pub(crate) fn set_result(&self, r: Result<(), &IpcError>) {
        let (c, a) = match r {
            Ok(()) => (0, 0),
            Err(e) => e.code(),
        };
        self.status.store(c, Ordering::Relaxed);
        self.err_arg.store(a, Ordering::Relaxed);
    }
}

/// What a request asks the host to do: one per `Process` method that the
/// host must run (see `program.rs` for the arguments of each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Op {
    Send = 1,
    SendSegment = 2,
    Receive = 3,
    Reply = 4,
    ReplySegment = 5,
    Forward = 6,
    MoveTo = 7,
    MoveFrom = 8,
    SetPid = 9,
    GetPid = 10,
    AllocateGroup = 11,
    JoinGroup = 12,
    LeaveGroup = 13,
    GetReply = 14,
    HostStats = 15,
    SelectHosts = 16,
    GetTime = 17,
    ProcessExists = 18,
    Destroy = 19,
    SetPrincipal = 20,
    RestrictSenders = 21,
    SetSpin = 22,
    SetSocketReader = 23,
    AdoptWindow = 24,
    Exit = 25,
    /// May this process copy straight into (or out of) a sender's window?
    MoveGrant = 26,
}

impl Op {
    /// The operation a word names, if any.
    pub(crate) fn from_u32(v: u32) -> Option<Op> {
        use Op::*;
        const ALL: [Op; 26] = [
            Send,
            SendSegment,
            Receive,
            Reply,
            ReplySegment,
            Forward,
            MoveTo,
            MoveFrom,
            SetPid,
            GetPid,
            AllocateGroup,
            JoinGroup,
            LeaveGroup,
            GetReply,
            HostStats,
            SelectHosts,
            GetTime,
            ProcessExists,
            Destroy,
            SetPrincipal,
            RestrictSenders,
            SetSpin,
            SetSocketReader,
            AdoptWindow,
            Exit,
            MoveGrant,
        ];
        ALL.into_iter().find(|o| *o as u32 == v)
    }
}

/// "No deadline" / "no limit" in a 64-bit argument.
pub(crate) const NONE64: u64 = u64::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_round_trips_and_others_are_refused() {
        for v in 0..64 {
            match Op::from_u32(v) {
                Some(o) => assert_eq!(o as u32, v),
                None => assert!(v == 0 || v > 26),
            }
        }
    }
}
