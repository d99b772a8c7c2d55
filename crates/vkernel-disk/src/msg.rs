//! The IPdisk request and reply messages (one 32-byte V message each;
//! docs/IPDISK.md has the byte-by-byte layouts).
//!
//! Words are big-endian on the wire (the kernel encodes them). Word 0 holds
//! the request code in its low 24 bits; words 6–7 are the segment
//! descriptor the kernel maintains, so a request has words 1–5 (20 bytes)
//! for its own fields.

use vkernel::Message;

/// Request: open a DVD (w1–w2 key, w3 DVD id). Reply: w1 handle, w2–w3
/// blocks, w4 block size, w5 flags ([`FLAG_READ_ONLY`], [`FLAG_OWNER`]).
pub const OPEN: u32 = 0x1d_5c01;
/// Request: a SCSI command (w1–w4 the CDB, zero-padded to 16 bytes; w5 the
/// handle). Data-out travels in a read segment, data-in in a write segment.
pub const SCSI: u32 = 0x1d_5c02;
/// Request: forget a handle (w5).
pub const CLOSE: u32 = 0x1d_5c03;
/// Owner request: define or change a DVD (a record in a read segment; w5
/// the owner's handle). Reply: w1 the DVD id.
pub const DVD_SET: u32 = 0x1d_5c10;
/// Owner request: list DVDs into a write segment. Reply: w1 bytes of
/// records, w2 count.
pub const DVD_LIST: u32 = 0x1d_5c11;
/// Owner request: revoke DVD w1.
pub const DVD_REVOKE: u32 = 0x1d_5c12;
/// Internal: a worker tells the dispatcher it is idle.
pub const IDLE: u32 = 0x1d_5cff;

/// OPEN reply flag: the view is read-only.
pub const FLAG_READ_ONLY: u32 = 1;
/// OPEN reply flag: the handle is the owner's (the whole device).
pub const FLAG_OWNER: u32 = 2;

/// Service response (reply word 0, bits 8–15): why a request was not
/// executed. SCSI status is bits 0–7 when it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Response {
    /// Executed; for SCSI see the status byte.
    Complete = 0,
    /// The handle is unknown, expired, or not this client's.
    BadHandle = 1,
    /// The policy does not admit this client.
    Denied = 2,
    /// No such DVD (or it was revoked).
    NoSuchDvd = 3,
    /// The request is malformed (unknown code, segment missing or too small).
    Malformed = 4,
    /// The server failed (data movement or internal error).
    Failed = 5,
    /// The server's queue is full; retry.
    Busy = 6,
}

impl Response {
    /// Decodes a service response byte.
    pub fn from_u8(b: u8) -> Response {
        match b {
            0 => Response::Complete,
            1 => Response::BadHandle,
            2 => Response::Denied,
            3 => Response::NoSuchDvd,
            4 => Response::Malformed,
            6 => Response::Busy,
            _ => Response::Failed,
        }
    }
}

impl std::fmt::Display for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Response::Complete => "complete",
            Response::BadHandle => "bad or revoked handle",
            Response::Denied => "not authorised",
            Response::NoSuchDvd => "no such DVD",
            Response::Malformed => "malformed request",
            Response::Failed => "server failure",
            Response::Busy => "server busy",
        })
    }
}

/// Builds a reply word 0.
pub fn reply_word0(resp: Response, status: u8) -> u32 {
    (u32::from(resp as u8) << 8) | u32::from(status)
}

/// Splits a reply word 0 into (service response, SCSI status).
pub fn split_word0(w: u32) -> (Response, u8) {
    (Response::from_u8((w >> 8) as u8), w as u8)
}

/// Writes bytes into message words `first..`, big-endian, zero-padded.
/// Bytes past word 5 are dropped (words 6–7 belong to the kernel).
pub fn put_bytes(m: &mut Message, first: usize, bytes: &[u8]) {
    for (i, w) in m.0.iter_mut().enumerate().take(6).skip(first) {
        let o = (i - first) * 4;
        let mut a = [0u8; 4];
        for (j, x) in a.iter_mut().enumerate() {
            *x = bytes.get(o + j).copied().unwrap_or(0);
        }
        *w = u32::from_be_bytes(a);
    }
}

/// Reads `N` bytes from message words `first..` (big-endian).
pub fn get_bytes<const N: usize>(m: &Message, first: usize) -> [u8; N] {
    let mut out = [0u8; N];
    for (k, b) in out.iter_mut().enumerate() {
        let w = first + k / 4;
        if w < 8 {
            *b = m.0[w].to_be_bytes()[k % 4];
        }
    }
    out
}

/// A SCSI request message for a CDB (at most 16 bytes) and a handle.
pub fn scsi_request(cdb: &[u8], handle: u32) -> Message {
    let mut m = Message::with_code(SCSI);
    put_bytes(&mut m, 1, &cdb[..cdb.len().min(16)]);
    m.0[5] = handle;
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdb_and_sense_pack_into_words() {
        let cdb: Vec<u8> = (1..=16).collect();
        let m = scsi_request(&cdb, 0xabcd);
        assert_eq!(m.0[1], 0x0102_0304);
        assert_eq!(m.0[4], 0x0d0e_0f10);
        assert_eq!(m.0[5], 0xabcd);
        assert_eq!(get_bytes::<16>(&m, 1).to_vec(), cdb);
        let mut r = Message::zero();
        let sense: Vec<u8> = (100..118).collect();
        put_bytes(&mut r, 1, &sense);
        assert_eq!(get_bytes::<18>(&r, 1).to_vec(), sense);
        assert_eq!(r.0[6], 0, "words 6-7 untouched");
        assert_eq!(
            split_word0(reply_word0(Response::Denied, 2)),
            (Response::Denied, 2)
        );
    }
}
