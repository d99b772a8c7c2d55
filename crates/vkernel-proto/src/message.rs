//! The fixed 32-byte V message: 8 × 32-bit words.
//!
//! Word 0 carries the request code in its low 24 bits and kernel-legislated
//! flags in its high byte. Words 6 and 7 describe the segment, if any.
//! Words 1–5 are the user's; [`field`] names every word the kernel reads.

/// Message size in bytes (8 words).
pub const MSG_BYTES: usize = 32;

/// Flag (word 0): a segment is described by words 6 and 7.
pub const SEGMENT: u32 = 1 << 31;
/// Flag (word 0): the receiver may read the segment (MoveFrom, appended data).
pub const SEG_READ: u32 = 1 << 30;
/// Flag (word 0): the receiver may write the segment (MoveTo, reply-with-segment).
pub const SEG_WRITE: u32 = 1 << 29;
/// Flag (word 0): the request is idempotent; the kernel need not keep its reply.
pub const IDEMPOTENT: u32 = 1 << 28;
/// Two bits (word 0) reserved for the group reply mode (0-, 1-, multi-reply).
pub const GROUP_MODE_MASK: u32 = 0b11 << 26;
/// Shift of the group reply mode bits.
pub const GROUP_MODE_SHIFT: u32 = 26;
/// Flag (word 0): do not append the first part of a read-granted segment
/// to the request; the receiver will fetch it with MoveFrom (Thoth style).
pub const NO_APPEND: u32 = 1 << 25;
/// All kernel-owned flag bits of word 0 (the top byte).
pub const FLAG_MASK: u32 = 0xff00_0000;
/// The user request code part of word 0.
pub const CODE_MASK: u32 = 0x00ff_ffff;

/// Word indices of the message fields the kernel itself reads or writes
/// (byte offset = 4 × index, big-endian on the wire).
pub mod field {
    /// Flags (high byte) and request code (low 24 bits).
    pub const WORD0: usize = 0;
    /// Segment start (offset in the lender's segment; the kernel sets 0).
    pub const SEG_ADDR: usize = 6;
    /// Segment length in bytes.
    pub const SEG_LEN: usize = 7;
}

/// A 32-byte V message.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Message(pub [u32; 8]);

impl Message {
    /// An all-zero message.
    pub const fn zero() -> Message {
        Message([0; 8])
    }

    /// A message with the given request code (low 24 bits) and flags (high byte).
    pub fn with_code(code: u32) -> Message {
        let mut m = Message::zero();
        m.set_word0(code);
        m
    }

    /// Word `i` (0..8).
    ///
    /// # Panics
    /// If `i` is 8 or more.
    pub fn word(&self, i: usize) -> u32 {
        self.0[i]
    }

    /// Sets word `i` (0..8).
    ///
    /// # Panics
    /// If `i` is 8 or more.
    pub fn set_word(&mut self, i: usize, v: u32) {
        self.0[i] = v;
    }

    /// Words `i` and `i + 1` as one 64-bit value (high word first).
    ///
    /// # Panics
    /// If `i` is 7 or more.
    pub fn word_pair(&self, i: usize) -> u64 {
        (u64::from(self.0[i]) << 32) | u64::from(self.0[i + 1])
    }

    /// Sets words `i` and `i + 1` to a 64-bit value (high word first).
    ///
    /// # Panics
    /// If `i` is 7 or more.
    pub fn set_word_pair(&mut self, i: usize, v: u64) {
        self.0[i] = (v >> 32) as u32;
        self.0[i + 1] = v as u32;
    }

    /// Word 0: flags and request code.
    pub fn word0(&self) -> u32 {
        self.0[field::WORD0]
    }

    /// Sets word 0 whole (flags and request code).
    pub fn set_word0(&mut self, w: u32) {
        self.0[field::WORD0] = w;
    }

    /// The request code (low 24 bits of word 0).
    pub fn code(&self) -> u32 {
        self.word0() & CODE_MASK
    }

    /// Sets the request code, keeping the flag bits.
    pub fn set_code(&mut self, code: u32) {
        self.set_word0((self.word0() & FLAG_MASK) | (code & CODE_MASK));
    }

    /// True if the flag bit(s) `f` are all set in word 0.
    pub fn has(&self, f: u32) -> bool {
        self.word0() & f == f
    }

    /// Sets or clears flag bit(s) in word 0.
    pub fn set_flag(&mut self, f: u32, on: bool) {
        let w = self.word0();
        self.set_word0(if on { w | f } else { w & !f });
    }

    /// The group reply mode (bits 26–27 of word 0); `None` for the
    /// reserved value 3.
    pub fn group_mode(&self) -> Option<GroupMode> {
        match (self.word0() & GROUP_MODE_MASK) >> GROUP_MODE_SHIFT {
            0 => Some(GroupMode::One),
            1 => Some(GroupMode::NoReply),
            2 => Some(GroupMode::Many),
            _ => None,
        }
    }

    /// Sets the group reply mode bits.
    pub fn set_group_mode(&mut self, m: GroupMode) {
        self.set_word0((self.word0() & !GROUP_MODE_MASK) | ((m as u32) << GROUP_MODE_SHIFT));
    }

    /// True if the request is marked idempotent.
    pub fn idempotent(&self) -> bool {
        self.has(IDEMPOTENT)
    }

    /// The segment rights declared by the message.
    pub fn seg_access(&self) -> SegAccess {
        if !self.has(SEGMENT) {
            return SegAccess::NONE;
        }
        SegAccess {
            read: self.has(SEG_READ),
            write: self.has(SEG_WRITE),
        }
    }

    /// Word 6: segment start address (offset in the lender's segment; the kernel sets 0).
    pub fn seg_addr(&self) -> u32 {
        self.0[field::SEG_ADDR]
    }

    /// Sets word 6, the segment start.
    pub fn set_seg_addr(&mut self, a: u32) {
        self.0[field::SEG_ADDR] = a;
    }

    /// Word 7: segment length in bytes.
    pub fn seg_len(&self) -> u32 {
        self.0[field::SEG_LEN]
    }

    /// Sets word 7, the segment length.
    pub fn set_seg_len(&mut self, len: u32) {
        self.0[field::SEG_LEN] = len;
    }

    /// Declares a segment of `len` bytes with the given rights (words 0, 6, 7).
    pub fn set_segment(&mut self, access: SegAccess, len: u32) {
        self.set_flag(SEGMENT, access.read || access.write);
        self.set_flag(SEG_READ, access.read);
        self.set_flag(SEG_WRITE, access.write);
        self.set_seg_addr(0);
        self.set_seg_len(if access.any() { len } else { 0 });
    }

    /// Encodes into 32 big-endian bytes.
    pub fn to_bytes(&self) -> [u8; MSG_BYTES] {
        let mut b = [0u8; MSG_BYTES];
        for (i, w) in self.0.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
        }
        b
    }

    /// Decodes 32 big-endian bytes.
    pub fn from_bytes(b: &[u8; MSG_BYTES]) -> Message {
        let mut m = [0u32; 8];
        for (i, w) in m.iter_mut().enumerate() {
            *w = u32::from_be_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]]);
        }
        Message(m)
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Message[")?;
        for (i, w) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, " ")?;
            }
            write!(f, "{w:08x}")?;
        }
        write!(f, "]")
    }
}

/// How many replies a Send to a process group waits for (thesis ch. 6).
/// Encoded in the two group-mode bits of word 0; a plain message is
/// [`GroupMode::One`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupMode {
    /// 1-reply: block until the first reply (retransmitting as usual);
    /// later replies are discarded.
    One = 0,
    /// 0-reply: an unreliable notification; the sender does not block and
    /// members' replies cause no traffic.
    NoReply = 1,
    /// Multi-reply: the first reply unblocks the sender; later ones queue
    /// for `GetReply` until its next Send.
    Many = 2,
}

/// Rights a sender grants on its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SegAccess {
    /// Receiver may read (MoveFrom; first part appended to the request).
    pub read: bool,
    /// Receiver may write (MoveTo; reply-with-segment).
    pub write: bool,
}

impl SegAccess {
    /// No segment.
    pub const NONE: SegAccess = SegAccess {
        read: false,
        write: false,
    };
    /// Read-only.
    pub const READ: SegAccess = SegAccess {
        read: true,
        write: false,
    };
    /// Write-only.
    pub const WRITE: SegAccess = SegAccess {
        read: false,
        write: true,
    };
    /// Read and write.
    pub const READ_WRITE: SegAccess = SegAccess {
        read: true,
        write: true,
    };

    /// True if any right is granted.
    pub fn any(self) -> bool {
        self.read || self.write
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_mode_bits() {
        let mut m = Message::with_code(5);
        assert_eq!(m.group_mode(), Some(GroupMode::One));
        for g in [GroupMode::NoReply, GroupMode::Many, GroupMode::One] {
            m.set_group_mode(g);
            assert_eq!(m.group_mode(), Some(g));
            assert_eq!(m.code(), 5);
        }
        m.set_word0(m.word0() | GROUP_MODE_MASK);
        assert_eq!(m.group_mode(), None);
    }

    #[test]
    fn words_and_pairs() {
        let mut m = Message::zero();
        m.set_word_pair(1, 0x0102_0304_0506_0708);
        assert_eq!((m.word(1), m.word(2)), (0x0102_0304, 0x0506_0708));
        assert_eq!(m.word_pair(1), 0x0102_0304_0506_0708);
        m.set_word(5, 9);
        assert_eq!(m.0[5], 9);
    }

    #[test]
    fn bytes_roundtrip() {
        let m = Message([1, 2, 3, 0xdead_beef, 5, 6, 7, 0xffff_ffff]);
        assert_eq!(Message::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn flags_and_code_are_separate() {
        let mut m = Message::with_code(0x123456);
        m.set_segment(SegAccess::READ_WRITE, 4096);
        m.set_flag(IDEMPOTENT, true);
        assert_eq!(m.code(), 0x123456);
        assert_eq!(m.seg_access(), SegAccess::READ_WRITE);
        assert_eq!(m.seg_len(), 4096);
        assert!(m.idempotent());
        m.set_code(7);
        assert_eq!(m.code(), 7);
        assert!(m.idempotent());
        m.set_segment(SegAccess::NONE, 99);
        assert_eq!(m.seg_access(), SegAccess::NONE);
        assert_eq!(m.seg_len(), 0);
    }
}
