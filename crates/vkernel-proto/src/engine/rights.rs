//! Segment rights: the one place a segment is granted and every access to
//! it is checked.
//!
//! A Send grants rights on its segment ([`grant`]); a Forward keeps them
//! ([`carry`]). Every read or write of a sender's segment by someone else —
//! reply-with-segment, MoveTo, MoveFrom, a bulk chunk arriving or asked
//! for, a group member's reply data — goes through [`check`] first, with
//! the rights and length of the segment as the engine knows them: a local
//! sender's lent buffer, or a remote sender's declared length.

use std::ops::Range;

use crate::error::IpcError;
use crate::message::{Message, SegAccess, FLAG_MASK, NO_APPEND};
use crate::pid::Pid;
use crate::segment::{Seg, SegMem};
use crate::wire::Status;

/// The right an access needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Reading the segment (MoveFrom, appended data).
    Read,
    /// Writing the segment (MoveTo, reply-with-segment).
    Write,
}

/// Why an access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// The segment does not grant the right (or there is none).
    Access,
    /// The bytes fall outside the segment.
    Bounds,
}

impl Denied {
    /// The error a local caller gets; `peer` is the segment's owner.
    #[inline]
    pub(crate) fn error(self, peer: Pid) -> IpcError {
        match self {
            Denied::Access => IpcError::AccessDenied(peer),
            Denied::Bounds => IpcError::OutOfBounds(peer),
        }
    }

    /// The status a remote mover gets.
    #[inline]
    pub(crate) fn status(self) -> Status {
        match self {
            Denied::Access => Status::AccessDenied,
            Denied::Bounds => Status::OutOfBounds,
        }
    }
}

/// Checks an access to bytes `off..off + len` of a segment granting
/// `access`, `seg_len` bytes long (`None`: no segment is lent). Returns
/// the byte range on success.
#[inline]
pub(crate) fn check(
    access: SegAccess,
    seg_len: Option<usize>,
    need: Need,
    off: usize,
    len: usize,
) -> Result<Range<usize>, Denied> {
    let granted = match need {
        Need::Read => access.read,
        Need::Write => access.write,
    };
    let seg_len = seg_len.filter(|_| granted).ok_or(Denied::Access)?;
    match off.checked_add(len) {
        Some(end) if end <= seg_len => Ok(off..end),
        _ => Err(Denied::Bounds),
    }
}

/// The lent segment, if `access` allows reading its bytes
/// `off..off + len` (see [`check`]); the caller copies them out.
#[inline]
pub(crate) fn read(
    access: SegAccess,
    seg: Option<&Seg>,
    off: usize,
    len: usize,
) -> Result<&dyn SegMem, Denied> {
    check(access, seg.map(|s| s.len()), Need::Read, off, len)?;
    seg.map(|s| &**s as &dyn SegMem).ok_or(Denied::Access)
}

/// The lent segment, if `access` allows writing its bytes
/// `off..off + len` (see [`check`]); the caller copies them in.
#[inline]
pub(crate) fn write(
    access: SegAccess,
    seg: Option<&mut Seg>,
    off: usize,
    len: usize,
) -> Result<&mut dyn SegMem, Denied> {
    let seg_len = seg.as_ref().map(|s| s.len());
    check(access, seg_len, Need::Write, off, len)?;
    seg.map(|s| &mut **s as &mut dyn SegMem)
        .ok_or(Denied::Access)
}

/// True if the first part of a read-granted segment travels with the
/// message (unless the sender asked for [`NO_APPEND`]).
#[inline]
pub(crate) fn appends(access: SegAccess, msg: &Message) -> bool {
    access.read && !msg.has(NO_APPEND)
}

/// Grants the rights `msg` declares on `seg` (none without a segment) and
/// writes the segment words of `msg` (words 6 and 7): what a Send lends.
#[inline]
pub(crate) fn grant(msg: &mut Message, seg: Option<Seg>) -> (SegAccess, Option<Seg>) {
    let access = if seg.is_some() {
        msg.seg_access()
    } else {
        SegAccess::NONE
    };
    let len = seg.as_ref().map_or(0, |s| s.len());
    msg.set_segment(access, len as u32);
    (access, if access.any() { seg } else { None })
}

/// The message `new` with the kernel-owned flags and segment words of
/// `old`, for a segment of `seg_len` bytes: a Forward changes the message,
/// never the rights its sender granted.
#[inline]
pub(crate) fn carry(old: &Message, new: Message, seg_len: u32) -> Message {
    let mut m = new;
    m.set_word0((new.word0() & !FLAG_MASK) | (old.word0() & FLAG_MASK));
    m.set_seg_addr(0);
    m.set_seg_len(seg_len);
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::SEGMENT;
    use crate::segment::SharedBuf;

    #[test]
    fn check_needs_the_right_and_the_bounds() {
        let rw = SegAccess::READ_WRITE;
        assert_eq!(check(rw, Some(10), Need::Read, 2, 8), Ok(2..10));
        assert_eq!(check(rw, Some(10), Need::Write, 0, 0), Ok(0..0));
        assert_eq!(check(rw, Some(10), Need::Write, 3, 8), Err(Denied::Bounds));
        assert_eq!(
            check(rw, Some(10), Need::Read, usize::MAX, 2),
            Err(Denied::Bounds)
        );
        assert_eq!(
            check(SegAccess::READ, Some(10), Need::Write, 0, 1),
            Err(Denied::Access)
        );
        assert_eq!(
            check(SegAccess::WRITE, Some(10), Need::Read, 0, 1),
            Err(Denied::Access)
        );
        // Rights without a lent segment grant nothing.
        assert_eq!(check(rw, None, Need::Read, 0, 0), Err(Denied::Access));
    }

    #[test]
    fn grant_declares_only_a_lent_segment() {
        let mut m = Message::with_code(7);
        m.set_segment(SegAccess::READ, 0);
        let (a, s) = grant(&mut m, Some(SharedBuf::new(vec![0; 5]).lend()));
        assert_eq!((a, s.map(|s| s.len())), (SegAccess::READ, Some(5)));
        assert_eq!((m.seg_access(), m.seg_len()), (SegAccess::READ, 5));

        let (a, s) = grant(&mut m, None);
        assert_eq!((a, s.is_none()), (SegAccess::NONE, true));
        assert!(!m.has(SEGMENT));
        assert_eq!(m.seg_len(), 0);
    }

    #[test]
    fn carry_keeps_the_granted_rights() {
        let mut old = Message::with_code(1);
        old.set_segment(SegAccess::WRITE, 64);
        let mut new = Message::with_code(2);
        new.set_segment(SegAccess::READ_WRITE, 999);
        new.set_word(3, 33);
        let m = carry(&old, new, 64);
        assert_eq!(m.code(), 2);
        assert_eq!(m.word(3), 33);
        assert_eq!(
            (m.seg_access(), m.seg_addr(), m.seg_len()),
            (SegAccess::WRITE, 0, 64)
        );
    }
}
