//! Byte-exact interkernel packet format (see `docs/PROTOCOL.md`).
//!
//! Every datagram is a 76-byte fixed part (44-byte header + the 32-byte
//! message) followed by `length` bytes of data. All integers are big-endian.
//! Decoding never panics: anything malformed is a [`DecodeError`], which the
//! engine counts and drops.

use crate::message::{Message, MSG_BYTES};
use crate::pid::Pid;

/// First byte of every vkernel datagram ('V').
pub const MAGIC: u8 = 0x56;
/// Wire format version this build speaks.
pub const VERSION: u8 = 3;
/// Bytes before the message.
pub const HEADER_BYTES: usize = 44;
/// Header plus message: the smallest valid datagram.
pub const FIXED_BYTES: usize = HEADER_BYTES + MSG_BYTES;
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

/// Status codes carried in the header's `status` byte (nAck and bulk replies).
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

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
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
        data: &buf[FIXED_BYTES..],
    })
}

/// Decodes the fixed part of a datagram (the first [`FIXED_BYTES`] of
/// `buf`; the rest is not looked at): its header, message and the length
/// its data part claims. Never panics.
pub fn decode_fixed(buf: &[u8]) -> Result<(Header, Message, usize), DecodeError> {
    if buf.len() < FIXED_BYTES {
        return Err(DecodeError::Truncated);
    }
    if buf[0] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if buf[1] != VERSION {
        return Err(DecodeError::BadVersion);
    }
    let ptype = PacketType::from_u8(buf[2]).ok_or(DecodeError::BadType)?;
    let length = be32(buf, 28) as usize;
    if length > MAX_DATAGRAM - FIXED_BYTES {
        return Err(DecodeError::BadLength);
    }
    let header = Header {
        ptype,
        flags: buf[3],
        status: Status::from_u8(buf[4]),
        key_id: buf[5],
        seq: be32(buf, 8),
        src: Pid(be32(buf, 12)),
        dst: Pid(be32(buf, 16)),
        forwarder: Pid(be32(buf, 20)),
        user: be32(buf, 24),
        total_length: be32(buf, 32),
        local_addr: be32(buf, 36),
        remote_addr: be32(buf, 40),
        reply_port: u16::from_be_bytes([buf[6], buf[7]]),
    };
    let mut mb = [0u8; MSG_BYTES];
    mb.copy_from_slice(&buf[HEADER_BYTES..FIXED_BYTES]);
    Ok((header, Message::from_bytes(&mb), length))
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
    out.extend_from_slice(&[
        MAGIC,
        VERSION,
        h.ptype as u8,
        h.flags,
        h.status as u8,
        h.key_id,
    ]);
    out.extend_from_slice(&h.reply_port.to_be_bytes());
    for w in [
        h.seq,
        h.src.0,
        h.dst.0,
        h.forwarder.0,
        h.user,
        data_len as u32,
        h.total_length,
        h.local_addr,
        h.remote_addr,
    ] {
        out.extend_from_slice(&w.to_be_bytes());
    }
    out.extend_from_slice(&msg.to_bytes());
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
