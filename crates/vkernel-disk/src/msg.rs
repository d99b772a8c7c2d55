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
/// Request: a batch of SCSI commands executed in order, each with its own
/// status (w1 the number of commands, w2 the offset of the data-in area,
/// w5 the handle). The read-write segment holds [`BATCH_ENTRY`]-byte
/// entries, then the data-out area, then the data-in area; only the
/// entries and data-out travel with the request, and the server writes
/// back the entries (results) and the data-in. Reply: w1 commands
/// executed.
pub const SCSI_BATCH: u32 = 0x1d_5c04;
/// Bytes of one batch entry: CDB (16), data offset (4), data length (4),
/// then, written by the server, result word (4, as reply word 0),
/// transferred (4), sense (18), zero padding.
pub const BATCH_ENTRY: usize = 64;
/// Most commands in one batch.
pub const MAX_BATCH: usize = 64;
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

/// Word of every request but OPEN that carries the handle.
const HANDLE_WORD: usize = 5;

/// An IPdisk request, decoded. [`Request::encode`] and
/// [`Request::decode`] are the only places that know the word layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// [`OPEN`]: DVD `dvd`, presenting `key` (0 = none).
    Open {
        /// The key presented.
        key: u64,
        /// The DVD (0 = the whole device).
        dvd: u32,
    },
    /// [`SCSI`]: one command.
    Scsi {
        /// The CDB, zero-padded.
        cdb: [u8; 16],
        /// The handle.
        handle: u32,
    },
    /// [`SCSI_BATCH`]: `commands` entries, data-in area at `data_in_at`.
    Batch {
        /// Entries in the segment.
        commands: u32,
        /// Offset of the data-in area in the segment.
        data_in_at: u32,
        /// The handle.
        handle: u32,
    },
    /// [`CLOSE`].
    Close {
        /// The handle.
        handle: u32,
    },
    /// [`DVD_SET`]: a record in the read segment.
    DvdSet {
        /// The owner's handle.
        handle: u32,
    },
    /// [`DVD_LIST`]: records into the write segment.
    DvdList {
        /// The owner's handle.
        handle: u32,
    },
    /// [`DVD_REVOKE`].
    DvdRevoke {
        /// The DVD to revoke.
        dvd: u32,
        /// The owner's handle.
        handle: u32,
    },
}

impl Request {
    /// The request message (flags and segment are the sender's to add).
    pub fn encode(&self) -> Message {
        let (code, words): (u32, [u32; 5]) = match *self {
            Request::Open { key, dvd } => (OPEN, [(key >> 32) as u32, key as u32, dvd, 0, 0]),
            Request::Scsi { cdb, handle } => {
                let mut m = Message::with_code(SCSI);
                put_bytes(&mut m, 1, &cdb);
                m.0[HANDLE_WORD] = handle;
                return m;
            }
            Request::Batch {
                commands,
                data_in_at,
                handle,
            } => (SCSI_BATCH, [commands, data_in_at, 0, 0, handle]),
            Request::Close { handle } => (CLOSE, [0, 0, 0, 0, handle]),
            Request::DvdSet { handle } => (DVD_SET, [0, 0, 0, 0, handle]),
            Request::DvdList { handle } => (DVD_LIST, [0, 0, 0, 0, handle]),
            Request::DvdRevoke { dvd, handle } => (DVD_REVOKE, [dvd, 0, 0, 0, handle]),
        };
        let mut m = Message::with_code(code);
        m.0[1..6].copy_from_slice(&words);
        m
    }

    /// Decodes a request; `None` for an unknown code.
    pub fn decode(m: &Message) -> Option<Request> {
        let handle = m.0[HANDLE_WORD];
        Some(match m.code() {
            OPEN => Request::Open {
                key: (u64::from(m.0[1]) << 32) | u64::from(m.0[2]),
                dvd: m.0[3],
            },
            SCSI => Request::Scsi {
                cdb: get_bytes::<16>(m, 1),
                handle,
            },
            SCSI_BATCH => Request::Batch {
                commands: m.0[1],
                data_in_at: m.0[2],
                handle,
            },
            CLOSE => Request::Close { handle },
            DVD_SET => Request::DvdSet { handle },
            DVD_LIST => Request::DvdList { handle },
            DVD_REVOKE => Request::DvdRevoke {
                dvd: m.0[1],
                handle,
            },
            _ => return None,
        })
    }
}

/// Puts `handle` into an encoded request (a client re-sending after it
/// found its server again has a new one).
pub fn set_handle(m: &mut Message, handle: u32) {
    m.0[HANDLE_WORD] = handle;
}

/// A reply that carries only word 0: the service response and, for a
/// SCSI command executed, its status.
pub fn status_reply(resp: Response, status: u8) -> Message {
    let mut r = Message::zero();
    r.0[0] = reply_word0(resp, status);
    r
}

/// The service response and SCSI status of a reply.
pub fn reply_status(m: &Message) -> (Response, u8) {
    split_word0(m.0[0])
}

/// A Complete reply with a count in word 1: bytes transferred (SCSI),
/// commands executed (SCSI_BATCH) or the DVD id (DVD_SET).
pub fn count_reply(n: u32) -> Message {
    let mut r = status_reply(Response::Complete, 0);
    r.0[1] = n;
    r
}

/// The count of a [`count_reply`].
pub fn reply_count(m: &Message) -> u32 {
    m.0[1]
}

/// A CHECK CONDITION reply carrying fixed-format sense data.
pub fn check_reply(sense: &[u8; crate::scsi::SENSE_LEN]) -> Message {
    let mut r = status_reply(Response::Complete, crate::scsi::STATUS_CHECK_CONDITION);
    put_bytes(&mut r, 1, sense);
    r
}

/// The sense data of a [`check_reply`].
pub fn reply_sense(m: &Message) -> [u8; crate::scsi::SENSE_LEN] {
    get_bytes(m, 1)
}

/// A DVD_LIST reply: `bytes` of records, `count` of them (with
/// [`Response::Malformed`] the segment was too small for `bytes`).
pub fn list_reply(resp: Response, bytes: u32, count: u32) -> Message {
    let mut r = status_reply(resp, 0);
    r.0[1] = bytes;
    r.0[2] = count;
    r
}

/// The record bytes a [`list_reply`] announces.
pub fn reply_list_bytes(m: &Message) -> u32 {
    m.0[1]
}

/// What an OPEN reply carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The handle for later requests.
    pub handle: u32,
    /// Blocks visible through the handle.
    pub blocks: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Writes fail with DATA PROTECT.
    pub read_only: bool,
    /// The handle is the owner's.
    pub owner: bool,
}

impl Opened {
    /// The Complete reply to OPEN.
    pub fn encode(&self) -> Message {
        let mut r = status_reply(Response::Complete, 0);
        r.0[1] = self.handle;
        r.0[2] = (self.blocks >> 32) as u32;
        r.0[3] = self.blocks as u32;
        r.0[4] = self.block_size;
        r.0[5] = if self.read_only { FLAG_READ_ONLY } else { 0 }
            | if self.owner { FLAG_OWNER } else { 0 };
        r
    }

    /// Decodes a reply to OPEN: `Err` with the service response when it
    /// was refused.
    pub fn decode(m: &Message) -> Result<Opened, Response> {
        match reply_status(m).0 {
            Response::Complete => Ok(Opened {
                handle: m.0[1],
                blocks: (u64::from(m.0[2]) << 32) | u64::from(m.0[3]),
                block_size: m.0[4],
                read_only: m.0[5] & FLAG_READ_ONLY != 0,
                owner: m.0[5] & FLAG_OWNER != 0,
            }),
            r => Err(r),
        }
    }
}

/// Writes bytes into message words `first..`, big-endian, zero-padded.
/// Bytes past word 5 are dropped (words 6–7 belong to the kernel).
fn put_bytes(m: &mut Message, first: usize, bytes: &[u8]) {
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
fn get_bytes<const N: usize>(m: &Message, first: usize) -> [u8; N] {
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
    let mut c = [0u8; 16];
    let n = cdb.len().min(16);
    c[..n].copy_from_slice(&cdb[..n]);
    Request::Scsi { cdb: c, handle }.encode()
}

/// One entry of a [`SCSI_BATCH`] request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchEntry {
    /// The CDB, zero-padded.
    pub cdb: [u8; 16],
    /// Where the command's data lies in the segment.
    pub off: u32,
    /// Bytes of data (0 = none).
    pub len: u32,
    /// Result, as a reply word 0 (written by the server).
    pub result: u32,
    /// Bytes transferred (written by the server).
    pub transferred: u32,
    /// Sense data when the result is CHECK CONDITION.
    pub sense: [u8; crate::scsi::SENSE_LEN],
}

impl BatchEntry {
    /// An entry for `cdb` (at most 16 bytes) with data at `off..off+len`.
    pub fn new(cdb: &[u8], off: u32, len: u32) -> BatchEntry {
        let mut c = [0u8; 16];
        let n = cdb.len().min(16);
        c[..n].copy_from_slice(&cdb[..n]);
        BatchEntry {
            cdb: c,
            off,
            len,
            result: reply_word0(Response::Failed, 0),
            transferred: 0,
            sense: [0; crate::scsi::SENSE_LEN],
        }
    }

    /// Writes the entry into `out` (at least [`BATCH_ENTRY`] bytes).
    pub fn encode(&self, out: &mut [u8]) {
        let Some(o) = out.get_mut(..BATCH_ENTRY) else {
            return;
        };
        o[..16].copy_from_slice(&self.cdb);
        o[16..20].copy_from_slice(&self.off.to_be_bytes());
        o[20..24].copy_from_slice(&self.len.to_be_bytes());
        o[24..28].copy_from_slice(&self.result.to_be_bytes());
        o[28..32].copy_from_slice(&self.transferred.to_be_bytes());
        o[32..32 + crate::scsi::SENSE_LEN].copy_from_slice(&self.sense);
        o[32 + crate::scsi::SENSE_LEN..].fill(0);
    }

    /// Reads an entry; `None` if `b` is shorter than [`BATCH_ENTRY`].
    pub fn decode(b: &[u8]) -> Option<BatchEntry> {
        let b = b.get(..BATCH_ENTRY)?;
        let w = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut e = BatchEntry::new(&b[..16], w(16), w(20));
        e.result = w(24);
        e.transferred = w(28);
        e.sense.copy_from_slice(&b[32..32 + crate::scsi::SENSE_LEN]);
        Some(e)
    }
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
        let mut sense = [0u8; 18];
        for (k, b) in sense.iter_mut().enumerate() {
            *b = 100 + k as u8;
        }
        let r = check_reply(&sense);
        assert_eq!(reply_sense(&r), sense);
        assert_eq!(r.0[6], 0, "words 6-7 untouched");
        assert_eq!(
            split_word0(reply_word0(Response::Denied, 2)),
            (Response::Denied, 2)
        );
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let reqs = [
            Request::Open {
                key: 0x0123_4567_89ab_cdef,
                dvd: 7,
            },
            Request::Scsi {
                cdb: [9; 16],
                handle: 3,
            },
            Request::Batch {
                commands: 4,
                data_in_at: 256,
                handle: 3,
            },
            Request::Close { handle: 3 },
            Request::DvdSet { handle: 3 },
            Request::DvdList { handle: 3 },
            Request::DvdRevoke { dvd: 2, handle: 3 },
        ];
        for r in reqs {
            assert_eq!(Request::decode(&r.encode()), Some(r));
        }
        assert_eq!(Request::decode(&Message::with_code(IDLE)), None);
        let o = Opened {
            handle: 5,
            blocks: 1 << 40,
            block_size: 4096,
            read_only: true,
            owner: false,
        };
        assert_eq!(Opened::decode(&o.encode()), Ok(o));
        assert_eq!(
            Opened::decode(&status_reply(Response::Denied, 0)),
            Err(Response::Denied)
        );
        assert_eq!(reply_count(&count_reply(9)), 9);
        assert_eq!(
            reply_list_bytes(&list_reply(Response::Malformed, 77, 2)),
            77
        );
    }

    #[test]
    fn batch_entries_round_trip() {
        let mut e = BatchEntry::new(&[0x88, 1, 2, 3], 4096, 512);
        e.result = reply_word0(Response::Complete, 2);
        e.transferred = 7;
        e.sense[0] = 0x70;
        let mut b = [0xffu8; BATCH_ENTRY];
        e.encode(&mut b);
        assert_eq!(BatchEntry::decode(&b), Some(e));
        assert_eq!(BatchEntry::decode(&b[..BATCH_ENTRY - 1]), None);
        assert_eq!(&b[50..], &[0u8; 14], "padding is zero");
    }
}
