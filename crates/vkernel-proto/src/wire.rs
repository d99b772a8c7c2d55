//! Byte-exact interkernel packet format (see `docs/PROTOCOL.md`).
//!
//! Every datagram is a 76-byte fixed part (44-byte header + the 32-byte
//! message) followed by `length` bytes of data. All integers are big-endian.
//! Decoding never panics: anything malformed is a [`DecodeError`], which the
//! engine counts and drops.

use crate::message::{Message, MSG_BYTES};
use crate::pid::Pid;

/// Where each field of the fixed part lies (`docs/PROTOCOL.md` §1): the
/// one statement of the byte layout; everything else reads and writes
/// datagrams through [`decode`], [`encode_into`] or [`RawHeader`].
pub mod field {
    use std::ops::{Range, RangeFrom};

    /// Magic byte ([`super::MAGIC`]).
    pub const MAGIC: usize = 0;
    /// Wire version ([`super::VERSION`]).
    pub const VERSION: usize = 1;
    /// Packet type ([`super::PacketType`]).
    pub const PTYPE: usize = 2;
    /// `F_*` flag bits.
    pub const FLAGS: usize = 3;
    /// Status ([`super::Status`]).
    pub const STATUS: usize = 4;
    /// Key id of the authentication trailer (0: none).
    pub const KEY_ID: usize = 5;
    /// Port of the sender's main socket (0: the source port).
    pub const REPLY_PORT: Range<usize> = 6..8;
    /// Sequence number.
    pub const SEQ: Range<usize> = 8..12;
    /// Source pid.
    pub const SRC: Range<usize> = 12..16;
    /// Destination pid.
    pub const DST: Range<usize> = 16..20;
    /// Forwarder pid (or logical id).
    pub const FORWARDER: Range<usize> = 20..24;
    /// Principal of the source process.
    pub const USER: Range<usize> = 24..28;
    /// Length of the data part.
    pub const LENGTH: Range<usize> = 28..32;
    /// Total length of the segment or transfer.
    pub const TOTAL_LENGTH: Range<usize> = 32..36;
    /// Offset of the data in the originating buffer.
    pub const LOCAL_ADDR: Range<usize> = 36..40;
    /// Offset of the data in the destination segment.
    pub const REMOTE_ADDR: Range<usize> = 40..44;
    /// The 32-byte message.
    pub const MESSAGE: Range<usize> = 44..76;
    /// The data part.
    pub const DATA: RangeFrom<usize> = 76..;
}

/// First byte of every vkernel datagram ('V').
pub const MAGIC: u8 = 0x56;
/// Wire format version this build speaks.
pub const VERSION: u8 = 3;
/// Bytes before the message.
pub const HEADER_BYTES: usize = field::MESSAGE.start;
/// Header plus message: the smallest valid datagram.
pub const FIXED_BYTES: usize = field::MESSAGE.end;
/// Largest UDP payload over IPv4 (65535 − 20 − 8).
pub const MAX_DATAGRAM: usize = 65_507;

/// Header flag: this datagram is a retransmission (not used for RTT samples).
pub const F_RETRANSMIT: u8 = 1 << 0;
/// Header flag (bulk data): this chunk is the last of the current burst; the
/// receiver should acknowledge now.
pub const F_ACK_NOW: u8 = 1 << 1;
/// Header flag: reply data. On a MoveToRequest: a chunk of a reply's
/// segment data that the RemoteReply follows (never acknowledged). On a
/// RemoteReply: its first `local_addr` bytes of segment data came ahead
/// as such chunks. On a RemoteSend: do not send reply data ahead (some
/// went missing before); move it.
pub const F_REPLY_DATA: u8 = 1 << 2;
/// Header flag (RemoteSend only): answer this exchange (reply,
/// replyPending, nAck, forward) at the datagram's source address, not at
/// the sender's main socket. Set by a process that sends its own
/// datagrams from a socket of its own (an attached program's direct
/// remote Send, docs/PROTOCOL.md §8f); `reply_port` still names the main
/// socket, which is what the location cache learns.
pub const F_ANSWER_SOURCE: u8 = 1 << 3;

/// Packet types: the thesis's thirteen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PacketType {
    /// Announcement of a candidate logical host id.
    LogicalHostRequest = 1,
    /// "That id is mine": answer to a request for an id in use.
    LogicalHostComplaint = 2,
    /// A Send to a process on the receiving host.
    RemoteSend = 3,
    /// The Reply (and acknowledgement) of a RemoteSend.
    RemoteReply = 4,
    /// Forward: the original sender's kernel re-sends to a new destination.
    RemoteForward = 5,
    /// Negative acknowledgement: destination does not exist, or a request was refused.
    NAck = 6,
    /// The request is alive but not yet answered (or was dropped for buffers).
    ReplyPending = 7,
    /// GetPid query (logical id in `forwarder`).
    RemoteGetPid = 8,
    /// Answer to a GetPid query.
    RemoteGetPidReply = 9,
    /// MoveTo data chunk.
    MoveToRequest = 10,
    /// MoveTo acknowledgement (cumulative offset + bitmap) or refusal.
    MoveToReply = 11,
    /// MoveFrom request / credit / selective re-request.
    MoveFromRequest = 12,
    /// MoveFrom data chunk (or refusal).
    MoveFromReply = 13,
}

impl PacketType {
    /// True for the types that carry bulk data into a lent buffer:
    /// MoveTo data, and MoveFrom data coming back.
    pub fn is_bulk(self) -> bool {
        matches!(self, PacketType::MoveToRequest | PacketType::MoveFromReply)
    }

    /// Decodes a type byte.
    pub fn from_u8(b: u8) -> Option<PacketType> {
        use PacketType::*;
        Some(match b {
            1 => LogicalHostRequest,
            2 => LogicalHostComplaint,
            3 => RemoteSend,
            4 => RemoteReply,
            5 => RemoteForward,
            6 => NAck,
            7 => ReplyPending,
            8 => RemoteGetPid,
            9 => RemoteGetPidReply,
            10 => MoveToRequest,
            11 => MoveToReply,
            12 => MoveFromRequest,
            13 => MoveFromReply,
            _ => return None,
        })
    }

    /// All packet types, in wire order.
    pub const ALL: [PacketType; 13] = [
        PacketType::LogicalHostRequest,
        PacketType::LogicalHostComplaint,
        PacketType::RemoteSend,
        PacketType::RemoteReply,
        PacketType::RemoteForward,
        PacketType::NAck,
        PacketType::ReplyPending,
        PacketType::RemoteGetPid,
        PacketType::RemoteGetPidReply,
        PacketType::MoveToRequest,
        PacketType::MoveToReply,
        PacketType::MoveFromRequest,
        PacketType::MoveFromReply,
    ];
}

/// Status codes carried in the header's `status` byte (nAck, bulk replies,
/// and replyPending: `Busy` when the request was dropped for lack of
/// buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The destination process does not exist (host is up).
    NoSuchProcess = 1,
    /// The named process is not awaiting reply from the requester.
    NotAwaitingReply = 2,
    /// The segment does not grant the needed right.
    AccessDenied = 3,
    /// The access falls outside the granted segment.
    OutOfBounds = 4,
    /// The receiving kernel has no resources for the request now.
    Busy = 5,
    /// Malformed request.
    BadRequest = 6,
    /// In an unauthenticated NAck from a keyed host (or to one): a datagram
    /// from the addressee failed authentication here. Only ever counted.
    AuthFailed = 7,
}

impl Status {
    /// Decodes a status byte (unknown values map to `BadRequest`).
    pub fn from_u8(b: u8) -> Status {
        match b {
            0 => Status::Ok,
            1 => Status::NoSuchProcess,
            2 => Status::NotAwaitingReply,
            3 => Status::AccessDenied,
            4 => Status::OutOfBounds,
            5 => Status::Busy,
            7 => Status::AuthFailed,
            _ => Status::BadRequest,
        }
    }
}

/// The protocol fields of a packet (everything but the message and data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Operation.
    pub ptype: PacketType,
    /// `F_*` bits.
    pub flags: u8,
    /// Status (nAck / bulk replies), else 0.
    pub status: Status,
    /// Key id for authenticated packets (0 = none); reserved for the security work.
    pub key_id: u8,
    /// Exchange (or transfer, or query) sequence number.
    pub seq: u32,
    /// Process that executed the operation.
    pub src: Pid,
    /// Destination process (0 for GetPid queries and host allocation).
    pub dst: Pid,
    /// Forwarder (== src for a plain Send); the logical id for GetPid.
    pub forwarder: Pid,
    /// Principal of the source process (0 = anonymous).
    pub user: u32,
    /// Total length of the segment / transfer this packet belongs to.
    pub total_length: u32,
    /// Offset of the data in the originating buffer (or the transfer).
    pub local_addr: u32,
    /// Offset of the data in the destination segment.
    pub remote_addr: u32,
    /// The port of the sending host's main socket, named so that the
    /// datagram may leave from another of its sockets (0: the source port
    /// is that port). Answers go there. Written by the engine as it hands
    /// the datagram out (`Config::reply_port`), not in each header made.
    pub reply_port: u16,
}

impl Header {
    /// A header of type `ptype` with every other field zero.
    pub fn new(ptype: PacketType) -> Header {
        Header {
            ptype,
            flags: 0,
            status: Status::Ok,
            key_id: 0,
            seq: 0,
            src: Pid::NONE,
            dst: Pid::NONE,
            forwarder: Pid::NONE,
            user: 0,
            total_length: 0,
            local_addr: 0,
            remote_addr: 0,
            reply_port: 0,
        }
    }
}

/// Word indices of the message in bulk packets (MoveToRequest/Reply,
/// MoveFromRequest/Reply; `docs/PROTOCOL.md`).
pub mod bulk_field {
    /// Transfer id (chosen by the mover).
    pub const XFER: usize = 0;
    /// Base offset of the transfer in the lent segment.
    pub const BASE: usize = 1;
    /// Chunk size in bytes.
    pub const CHUNK: usize = 2;
    /// First chunk (range start, or cumulative acknowledgement).
    pub const FIRST: usize = 3;
    /// End chunk (exclusive).
    pub const END: usize = 4;
}

/// The message of a bulk packet, by field (see [`bulk_field`]); the other
/// words are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BulkMsg {
    /// Transfer id.
    pub xfer: u32,
    /// Base offset in the lent segment.
    pub base: u32,
    /// Chunk size in bytes.
    pub chunk: u32,
    /// First chunk, or cumulative acknowledgement.
    pub first: u32,
    /// End chunk (exclusive).
    pub end: u32,
}

impl BulkMsg {
    /// Reads the bulk fields of `m`.
    pub fn read(m: &Message) -> BulkMsg {
        BulkMsg {
            xfer: m.word(bulk_field::XFER),
            base: m.word(bulk_field::BASE),
            chunk: m.word(bulk_field::CHUNK),
            first: m.word(bulk_field::FIRST),
            end: m.word(bulk_field::END),
        }
    }

    /// The message carrying these fields.
    pub fn message(&self) -> Message {
        let mut m = Message::zero();
        m.set_word(bulk_field::XFER, self.xfer);
        m.set_word(bulk_field::BASE, self.base);
        m.set_word(bulk_field::CHUNK, self.chunk);
        m.set_word(bulk_field::FIRST, self.first);
        m.set_word(bulk_field::END, self.end);
        m
    }
}

/// Why a datagram was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the fixed part.
    #[error("datagram shorter than the {FIXED_BYTES}-byte fixed part")]
    Truncated,
    /// Not a vkernel datagram.
    #[error("bad magic byte")]
    BadMagic,
    /// A version this build does not speak.
    #[error("unsupported wire version")]
    BadVersion,
    /// Unknown packet type.
    #[error("unknown packet type")]
    BadType,
    /// `length` disagrees with the datagram size, or exceeds `total_length`.
    #[error("length field disagrees with datagram")]
    BadLength,
    /// Larger than any valid datagram.
    #[error("oversized datagram")]
    Oversized,
}

/// A decoded packet borrowing its data from the datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Protocol fields.
    pub header: Header,
    /// The 32-byte message.
    pub msg: Message,
    /// The variable data part (`length` bytes).
    pub data: &'a [u8],
}

/// The header of a datagram read and written in place, before (or
/// without) decoding it: for the runtime's peeks, the trace, and the
/// fields written as a datagram leaves (reply port, key id).
#[derive(Clone, Copy, Debug)]
pub struct RawHeader<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> RawHeader<T> {
    /// A view of `buf` if it holds at least a header ([`HEADER_BYTES`]);
    /// the getters then never panic.
    pub fn new_checked(buf: T) -> Option<RawHeader<T>> {
        (buf.as_ref().len() >= HEADER_BYTES).then_some(RawHeader { buf })
    }

    fn u32_at(&self, r: std::ops::Range<usize>) -> u32 {
        let b = &self.buf.as_ref()[r];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// True if the magic byte and version are this build's.
    pub fn is_ours(&self) -> bool {
        let b = self.buf.as_ref();
        b[field::MAGIC] == MAGIC && b[field::VERSION] == VERSION
    }

    /// The magic byte.
    pub fn magic(&self) -> u8 {
        self.buf.as_ref()[field::MAGIC]
    }

    /// The packet type, if known.
    pub fn ptype(&self) -> Option<PacketType> {
        PacketType::from_u8(self.buf.as_ref()[field::PTYPE])
    }

    /// The `F_*` flag bits.
    pub fn flags(&self) -> u8 {
        self.buf.as_ref()[field::FLAGS]
    }

    /// The status byte.
    pub fn status(&self) -> Status {
        Status::from_u8(self.buf.as_ref()[field::STATUS])
    }

    /// The key id (0: not authenticated).
    pub fn key_id(&self) -> u8 {
        self.buf.as_ref()[field::KEY_ID]
    }

    /// The reply port (0: the source port).
    pub fn reply_port(&self) -> u16 {
        let b = &self.buf.as_ref()[field::REPLY_PORT];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The sequence number.
    pub fn seq(&self) -> u32 {
        self.u32_at(field::SEQ)
    }

    /// The source pid.
    pub fn src(&self) -> Pid {
        Pid(self.u32_at(field::SRC))
    }

    /// The destination pid.
    pub fn dst(&self) -> Pid {
        Pid(self.u32_at(field::DST))
    }

    /// The forwarder pid.
    pub fn forwarder(&self) -> Pid {
        Pid(self.u32_at(field::FORWARDER))
    }

    /// The principal.
    pub fn user(&self) -> u32 {
        self.u32_at(field::USER)
    }

    /// The length the data part claims.
    pub fn length(&self) -> u32 {
        self.u32_at(field::LENGTH)
    }

    /// The total length.
    pub fn total_length(&self) -> u32 {
        self.u32_at(field::TOTAL_LENGTH)
    }

    /// The local address.
    pub fn local_addr(&self) -> u32 {
        self.u32_at(field::LOCAL_ADDR)
    }

    /// The remote address.
    pub fn remote_addr(&self) -> u32 {
        self.u32_at(field::REMOTE_ADDR)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RawHeader<T> {
    /// Sets the key id.
    pub fn set_key_id(&mut self, id: u8) {
        self.buf.as_mut()[field::KEY_ID] = id;
    }

    /// Sets the reply port.
    pub fn set_reply_port(&mut self, port: u16) {
        self.buf.as_mut()[field::REPLY_PORT].copy_from_slice(&port.to_be_bytes());
    }
}

/// Decodes one datagram. Never panics.
pub fn decode(buf: &[u8]) -> Result<Packet<'_>, DecodeError> {
    if buf.len() > MAX_DATAGRAM {
        return Err(DecodeError::Oversized);
    }
    let (header, msg, length) = decode_fixed(buf)?;
    if length != buf.len() - FIXED_BYTES {
        return Err(DecodeError::BadLength);
    }
    Ok(Packet {
        header,
        msg,
        data: &buf[field::DATA],
    })
}

/// Decodes the fixed part of a datagram (the first [`FIXED_BYTES`] of
/// `buf`; the rest is not looked at): its header, message and the length
/// its data part claims. Never panics.
pub fn decode_fixed(buf: &[u8]) -> Result<(Header, Message, usize), DecodeError> {
    let (Some(r), Some(mb)) = (RawHeader::new_checked(buf), buf.get(field::MESSAGE)) else {
        return Err(DecodeError::Truncated);
    };
    if r.magic() != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if buf[field::VERSION] != VERSION {
        return Err(DecodeError::BadVersion);
    }
    let ptype = r.ptype().ok_or(DecodeError::BadType)?;
    let length = r.length() as usize;
    if length > MAX_DATAGRAM - FIXED_BYTES {
        return Err(DecodeError::BadLength);
    }
    let header = Header {
        ptype,
        flags: r.flags(),
        status: r.status(),
        key_id: r.key_id(),
        seq: r.seq(),
        src: r.src(),
        dst: r.dst(),
        forwarder: r.forwarder(),
        user: r.user(),
        total_length: r.total_length(),
        local_addr: r.local_addr(),
        remote_addr: r.remote_addr(),
        reply_port: r.reply_port(),
    };
    let mut m = [0u8; MSG_BYTES];
    m.copy_from_slice(mb);
    Ok((header, Message::from_bytes(&m), length))
}

/// Encodes a packet, appending to `out` (which is cleared first).
pub fn encode_into(h: &Header, msg: &Message, data: &[u8], out: &mut Vec<u8>) {
    out.clear();
    // Room for the authentication trailer too: sealing never reallocates.
    out.reserve(FIXED_BYTES + data.len() + crate::auth::TRAILER_BYTES);
    encode_head(h, msg, data.len(), out);
    out.extend_from_slice(data);
}

/// Appends the fixed part of a packet whose data (`data_len` bytes) is
/// sent from elsewhere (a gathered send).
pub fn encode_head(h: &Header, msg: &Message, data_len: usize, out: &mut Vec<u8>) {
    let mut b = [0u8; FIXED_BYTES];
    b[field::MAGIC] = MAGIC;
    b[field::VERSION] = VERSION;
    b[field::PTYPE] = h.ptype as u8;
    b[field::FLAGS] = h.flags;
    b[field::STATUS] = h.status as u8;
    b[field::KEY_ID] = h.key_id;
    b[field::REPLY_PORT].copy_from_slice(&h.reply_port.to_be_bytes());
    for (r, w) in [
        (field::SEQ, h.seq),
        (field::SRC, h.src.0),
        (field::DST, h.dst.0),
        (field::FORWARDER, h.forwarder.0),
        (field::USER, h.user),
        (field::LENGTH, data_len as u32),
        (field::TOTAL_LENGTH, h.total_length),
        (field::LOCAL_ADDR, h.local_addr),
        (field::REMOTE_ADDR, h.remote_addr),
    ] {
        b[r].copy_from_slice(&w.to_be_bytes());
    }
    b[field::MESSAGE].copy_from_slice(&msg.to_bytes());
    out.extend_from_slice(&b);
}

/// Encodes a packet into a fresh vector.
pub fn encode(h: &Header, msg: &Message, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    encode_into(h, msg, data, &mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Header {
        Header {
            ptype: PacketType::RemoteSend,
            flags: F_RETRANSMIT,
            status: Status::Ok,
            key_id: 0,
            seq: 0x0102_0304,
            src: Pid(0x0001_0002),
            dst: Pid(0x0003_0004),
            forwarder: Pid(0x0001_0002),
            user: 7,
            total_length: 3,
            local_addr: 0,
            remote_addr: 9,
            reply_port: 0x1234,
        }
    }

    #[test]
    fn byte_layout_is_as_documented() {
        let b = encode(&sample(), &Message([0xa0, 0, 0, 0, 0, 0, 0, 3]), b"xyz");
        assert_eq!(b.len(), FIXED_BYTES + 3);
        assert_eq!(&b[0..8], &[0x56, 3, 3, 1, 0, 0, 0x12, 0x34]);
        assert_eq!(&b[8..12], &[1, 2, 3, 4]);
        assert_eq!(&b[12..16], &[0, 1, 0, 2]);
        assert_eq!(&b[28..32], &[0, 0, 0, 3]);
        assert_eq!(&b[44..48], &[0, 0, 0, 0xa0]);
        assert_eq!(&b[76..], b"xyz");
    }

    #[test]
    fn raw_header_reads_what_decode_reads() {
        let mut b = encode(&sample(), &Message::zero(), b"xyz");
        let r = RawHeader::new_checked(&b[..]).unwrap();
        let h = sample();
        assert!(r.is_ours());
        assert_eq!(r.ptype(), Some(h.ptype));
        assert_eq!(
            (r.flags(), r.status(), r.key_id()),
            (h.flags, h.status, h.key_id)
        );
        assert_eq!(
            (r.seq(), r.src(), r.dst(), r.forwarder()),
            (h.seq, h.src, h.dst, h.forwarder)
        );
        assert_eq!(
            (r.user(), r.length(), r.total_length()),
            (h.user, 3, h.total_length)
        );
        assert_eq!(
            (r.local_addr(), r.remote_addr(), r.reply_port()),
            (0, 9, 0x1234)
        );
        let mut w = RawHeader::new_checked(&mut b[..]).unwrap();
        w.set_reply_port(7);
        w.set_key_id(2);
        let p = decode(&b).unwrap();
        assert_eq!((p.header.reply_port, p.header.key_id), (7, 2));
        assert!(RawHeader::new_checked(&b[..HEADER_BYTES - 1]).is_none());
    }

    #[test]
    fn rejects_bad_input() {
        let good = encode(&sample(), &Message::zero(), b"xyz");
        assert_eq!(decode(&good[..10]), Err(DecodeError::Truncated));
        let mut b = good.clone();
        b[0] = 0;
        assert_eq!(decode(&b), Err(DecodeError::BadMagic));
        let mut b = good.clone();
        b[1] = 1;
        assert_eq!(decode(&b), Err(DecodeError::BadVersion));
        let mut b = good.clone();
        b[2] = 99;
        assert_eq!(decode(&b), Err(DecodeError::BadType));
        let mut b = good.clone();
        b.push(0);
        assert_eq!(decode(&b), Err(DecodeError::BadLength));
        assert_eq!(
            decode(&vec![0u8; MAX_DATAGRAM + 1]),
            Err(DecodeError::Oversized)
        );
    }

    proptest! {
        #[test]
        fn roundtrip(seq: u32, src: u32, dst: u32, fw: u32, user: u32, tl: u32, la: u32, ra: u32, rp: u16,
                     t in 1u8..=13, flags: u8, words: [u32; 8], data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let h = Header { ptype: PacketType::from_u8(t).unwrap(), flags, status: Status::Ok, key_id: 0,
                seq, src: Pid(src), dst: Pid(dst), forwarder: Pid(fw), user, total_length: tl, local_addr: la, remote_addr: ra, reply_port: rp };
            let b = encode(&h, &Message(words), &data);
            let p = decode(&b).unwrap();
            prop_assert_eq!(p.header, h);
            prop_assert_eq!(p.msg, Message(words));
            prop_assert_eq!(p.data, &data[..]);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }
    }
}
