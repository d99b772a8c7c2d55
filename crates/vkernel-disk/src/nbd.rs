//! The NBD gateway: serves a block device (an IPdisk view through a
//! [`Client`], or anything implementing [`BlockDev`]) to today's block
//! clients (qemu, libnbd, fio, the kernel's nbd-client).
//!
//! Protocol: NetworkBlockDevice/nbd doc/proto.md. Fixed newstyle
//! handshake in NOTLS mode; options EXPORT_NAME, ABORT, LIST, INFO and GO
//! (NBD_INFO_EXPORT, _NAME, _DESCRIPTION, _BLOCK_SIZE), every other option
//! answered NBD_REP_ERR_UNSUP; simple replies; commands READ, WRITE (with
//! FUA), DISC, FLUSH, TRIM, WRITE_ZEROES (with NO_HOLE). Requests of one
//! connection are read in batches (everything already buffered) by two
//! pumps, sent to an IPdisk as one command batch, and may complete out of
//! order; several connections (CAN_MULTI_CONN: a flush on one covers
//! writes completed on all), up to [`Limits::max_connections`]. One
//! poller thread holds idle connections; a memory budget over all
//! connections stops reading requests while replies do not drain (see
//! [`Limits`]). A client that breaks the protocol loses its connection;
//! nothing it sends can take the gateway down.

use std::io::{self, BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::client::{BatchIo, Client, ClientError};
use crate::scsi;

/// `NBDMAGIC`.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Option reply magic.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Request magic.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Simple reply magic.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flag: fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: no zero padding after EXPORT_NAME.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: no zeroes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub mod tflag {
    /// Flags field is valid.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// The export is read-only.
    pub const READ_ONLY: u16 = 1 << 1;
    /// FLUSH is supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// FUA is supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// TRIM is supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// WRITE_ZEROES is supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// Several connections see one consistent device.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Options.
pub mod opt {
    /// NBD_OPT_EXPORT_NAME.
    pub const EXPORT_NAME: u32 = 1;
    /// NBD_OPT_ABORT.
    pub const ABORT: u32 = 2;
    /// NBD_OPT_LIST.
    pub const LIST: u32 = 3;
    /// NBD_OPT_INFO.
    pub const INFO: u32 = 6;
    /// NBD_OPT_GO.
    pub const GO: u32 = 7;
}

/// Option reply types.
pub mod rep {
    /// NBD_REP_ACK.
    pub const ACK: u32 = 1;
    /// NBD_REP_SERVER.
    pub const SERVER: u32 = 2;
    /// NBD_REP_INFO.
    pub const INFO: u32 = 3;
    /// NBD_REP_ERR_UNSUP.
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    /// NBD_REP_ERR_INVALID.
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    /// NBD_REP_ERR_UNKNOWN.
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
}

/// Information types.
pub mod info {
    /// NBD_INFO_EXPORT.
    pub const EXPORT: u16 = 0;
    /// NBD_INFO_NAME.
    pub const NAME: u16 = 1;
    /// NBD_INFO_DESCRIPTION.
    pub const DESCRIPTION: u16 = 2;
    /// NBD_INFO_BLOCK_SIZE.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Commands.
pub mod cmd {
    /// NBD_CMD_READ.
    pub const READ: u16 = 0;
    /// NBD_CMD_WRITE.
    pub const WRITE: u16 = 1;
    /// NBD_CMD_DISC.
    pub const DISC: u16 = 2;
    /// NBD_CMD_FLUSH.
    pub const FLUSH: u16 = 3;
    /// NBD_CMD_TRIM.
    pub const TRIM: u16 = 4;
    /// NBD_CMD_WRITE_ZEROES.
    pub const WRITE_ZEROES: u16 = 6;
    /// Command flag FUA.
    pub const FLAG_FUA: u16 = 1 << 0;
    /// Command flag NO_HOLE.
    pub const FLAG_NO_HOLE: u16 = 1 << 1;
}

/// Error values of simple replies.
pub mod errno {
    /// Operation not permitted (write to a read-only export).
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument (range, alignment, flags, unknown command).
    pub const EINVAL: u32 = 22;
    /// No space left.
    pub const ENOSPC: u32 = 28;
    /// Value too large.
    pub const EOVERFLOW: u32 = 75;
    /// Not supported.
    pub const ENOTSUP: u32 = 95;
    /// Server shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// Largest READ/WRITE payload accepted (2^25, the spec's safe maximum).
pub const MAX_PAYLOAD: u32 = 1 << 25;
/// Largest option payload read; a longer one ends the connection.
pub const MAX_OPTION: u32 = 1 << 16;
/// Preferred block size advertised.
pub const PREFERRED_BLOCK: u32 = 4096;

/// A block device the gateway can serve.
pub trait BlockDev: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Minimum block size (alignment) in bytes, a power of two.
    fn block_size(&self) -> u32;
    /// Writes are refused.
    fn read_only(&self) -> bool;
    /// Reads `buf.len()` bytes at `off`: on success every byte of `buf`
    /// has been written (the gateway reuses buffers without zeroing them).
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), u32>;
    /// Writes `data` at `off`; durable on return if `fua`.
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), u32>;
    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), u32>;
    /// Discards `len` bytes at `off` (they may read back as zeros).
    fn trim(&self, off: u64, len: u64) -> Result<(), u32>;
    /// Writes zeros over `len` bytes at `off`, deallocating if `may_trim`.
    fn write_zeroes(&self, off: u64, len: u64, may_trim: bool) -> Result<(), u32>;
    /// Reads and writes that arrived together, in order; one result each.
    /// The default runs them one at a time; an IPdisk [`Client`] sends
    /// them as one batch of SCSI commands (one exchange).
    fn batch(&self, ios: &mut [(u64, BatchIo<'_>)]) -> Vec<Result<(), u32>> {
        ios.iter_mut()
            .map(|(off, io)| match io {
                BatchIo::Read(b) => self.read(*off, b),
                BatchIo::Write(d, fua) => self.write(*off, d, *fua),
            })
            .collect()
    }
}

/// Maps a client error to an NBD error value.
pub fn errno_of(e: &ClientError) -> u32 {
    match e {
        ClientError::Check(s) if s.key == scsi::key::DATA_PROTECT => errno::EPERM,
        ClientError::Check(s) if s.key == scsi::key::ILLEGAL_REQUEST => {
            if (s.asc, s.ascq) == scsi::asc::LBA_OUT_OF_RANGE {
                errno::ENOSPC
            } else {
                errno::EINVAL
            }
        }
        ClientError::Invalid(_) => errno::EINVAL,
        ClientError::Refused(crate::msg::Response::Denied)
        | ClientError::Refused(crate::msg::Response::BadHandle)
        | ClientError::Refused(crate::msg::Response::NoSuchDvd) => errno::EPERM,
        _ => errno::EIO,
    }
}

fn log_err(what: &str, e: &ClientError) -> u32 {
    tracing::debug!("nbd: {what}: {e}");
    errno_of(e)
}

impl BlockDev for Client {
    fn size(&self) -> u64 {
        Client::size(self)
    }
    fn block_size(&self) -> u32 {
        self.geometry().block_size
    }
    fn read_only(&self) -> bool {
        self.geometry().read_only
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), u32> {
        Client::read(self, off, buf).map_err(|e| log_err("read", &e))
    }
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), u32> {
        Client::write(self, off, data, fua).map_err(|e| log_err("write", &e))
    }
    fn flush(&self) -> Result<(), u32> {
        Client::flush(self).map_err(|e| log_err("flush", &e))
    }
    fn trim(&self, off: u64, len: u64) -> Result<(), u32> {
        Client::unmap(self, off, len).map_err(|e| log_err("trim", &e))
    }
    fn write_zeroes(&self, off: u64, len: u64, may_trim: bool) -> Result<(), u32> {
        Client::write_zeroes(self, off, len, may_trim).map_err(|e| log_err("write zeroes", &e))
    }
    fn batch(&self, ios: &mut [(u64, BatchIo<'_>)]) -> Vec<Result<(), u32>> {
        match Client::batch(self, ios) {
            Ok(rs) => rs
                .into_iter()
                .map(|r| r.map_err(|e| log_err("batch", &e)))
                .collect(),
            Err(e) => {
                let x = log_err("batch", &e);
                vec![Err(x); ios.len()]
            }
        }
    }
}

/// An in-memory [`BlockDev`] (tests, fuzzing, local experiments).
#[derive(Debug)]
pub struct MemDev {
    data: Mutex<Vec<u8>>,
    block: u32,
    ro: bool,
    /// FLUSH calls seen.
    pub flushes: AtomicU64,
}

impl MemDev {
    /// A zeroed device of `size` bytes with `block`-byte blocks.
    pub fn new(size: usize, block: u32, read_only: bool) -> MemDev {
        MemDev {
            data: Mutex::new(vec![0; size]),
            block,
            ro: read_only,
            flushes: AtomicU64::new(0),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        match self.data.lock() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    fn span(&self, off: u64, len: u64) -> Result<std::ops::Range<usize>, u32> {
        let size = self.size();
        match off.checked_add(len) {
            Some(end) if end <= size => Ok(off as usize..end as usize),
            _ => Err(errno::EINVAL),
        }
    }
}

impl BlockDev for MemDev {
    fn size(&self) -> u64 {
        self.with(|d| d.len() as u64)
    }
    fn block_size(&self) -> u32 {
        self.block
    }
    fn read_only(&self) -> bool {
        self.ro
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), u32> {
        let r = self.span(off, buf.len() as u64)?;
        self.with(|d| buf.copy_from_slice(&d[r]));
        Ok(())
    }
    fn write(&self, off: u64, data: &[u8], _fua: bool) -> Result<(), u32> {
        let r = self.span(off, data.len() as u64)?;
        self.with(|d| d[r].copy_from_slice(data));
        Ok(())
    }
    fn flush(&self) -> Result<(), u32> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn trim(&self, off: u64, len: u64) -> Result<(), u32> {
        self.write_zeroes(off, len, true)
    }
    fn write_zeroes(&self, off: u64, len: u64, _may_trim: bool) -> Result<(), u32> {
        let r = self.span(off, len)?;
        self.with(|d| d[r].fill(0));
        Ok(())
    }
}

/// One export: a name, a description and the device behind it.
#[derive(Clone)]
pub struct Export {
    /// Export name (the empty name also selects the first export).
    pub name: String,
    /// Free-form description (NBD_INFO_DESCRIPTION).
    pub description: String,
    /// The device.
    pub dev: Arc<dyn BlockDev>,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").field("name", &self.name).finish()
    }
}

impl Export {
    fn flags(&self) -> u16 {
        let mut f = tflag::HAS_FLAGS | tflag::SEND_FLUSH | tflag::SEND_FUA | tflag::CAN_MULTI_CONN;
        if self.dev.read_only() {
            f |= tflag::READ_ONLY;
        } else {
            f |= tflag::SEND_TRIM | tflag::SEND_WRITE_ZEROES;
        }
        f
    }

    /// Export size advertised: the device size rounded down to its block.
    fn size(&self) -> u64 {
        let b = u64::from(self.dev.block_size().max(1));
        self.dev.size() / b * b
    }
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// Socket error or the peer closed the connection.
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    /// The client broke the protocol; the connection was closed.
    #[error("protocol violation: {0}")]
    Protocol(String),
}

fn violation<T>(s: impl Into<String>) -> Result<T, NbdError> {
    Err(NbdError::Protocol(s.into()))
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn option_reply(w: &mut impl Write, option: u32, ty: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&ty.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

/// The outcome of the handshake.
#[derive(Debug)]
pub enum Negotiated {
    /// Transmission begins on this export.
    Go(Export),
    /// The client aborted (or left) during option haggling.
    Aborted,
}

fn find<'a>(exports: &'a [Export], name: &[u8]) -> Option<&'a Export> {
    if name.is_empty() {
        return exports.first();
    }
    exports.iter().find(|e| e.name.as_bytes() == name)
}

/// Runs the fixed newstyle handshake on a stream.
pub fn handshake<S: Read + Write>(s: &mut S, exports: &[Export]) -> Result<Negotiated, NbdError> {
    s.write_all(&hello())?;
    s.flush()?;
    negotiate(s, exports)
}

/// The handshake after the server's hello: the client's flags and options.
fn negotiate<S: Read + Write>(s: &mut S, exports: &[Export]) -> Result<Negotiated, NbdError> {
    let cflags = read_u32(s)?;
    if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return violation(format!("unknown client flags {cflags:#x}"));
    }
    let no_zeroes = cflags & FLAG_C_NO_ZEROES != 0;
    loop {
        let magic = match read_u64(s) {
            Ok(m) => m,
            // Leaving during haggling is allowed (a hard disconnect).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Negotiated::Aborted),
            Err(e) => return Err(e.into()),
        };
        if magic != IHAVEOPT {
            return violation(format!("option magic {magic:#x}"));
        }
        let option = read_u32(s)?;
        let len = read_u32(s)?;
        if len > MAX_OPTION {
            return violation(format!("option of {len} bytes"));
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        match option {
            opt::EXPORT_NAME => {
                let Some(e) = find(exports, &data) else {
                    // No way to report the error: terminate the session.
                    return violation("EXPORT_NAME of an unknown export");
                };
                let mut b = Vec::with_capacity(134);
                b.extend_from_slice(&e.size().to_be_bytes());
                b.extend_from_slice(&e.flags().to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&b)?;
                s.flush()?;
                return Ok(Negotiated::Go(e.clone()));
            }
            opt::ABORT => {
                // The client may already have closed: ignore errors.
                let _ = option_reply(s, option, rep::ACK, &[]);
                let _ = s.flush();
                return Ok(Negotiated::Aborted);
            }
            opt::LIST => {
                if !data.is_empty() {
                    option_reply(s, option, rep::ERR_INVALID, &[])?;
                } else {
                    for e in exports {
                        let mut d = Vec::with_capacity(4 + e.name.len());
                        d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                        d.extend_from_slice(e.name.as_bytes());
                        option_reply(s, option, rep::SERVER, &d)?;
                    }
                    option_reply(s, option, rep::ACK, &[])?;
                }
            }
            opt::INFO | opt::GO => {
                let Some((name, reqs)) = parse_info_request(&data) else {
                    option_reply(s, option, rep::ERR_INVALID, &[])?;
                    s.flush()?;
                    continue;
                };
                let Some(e) = find(exports, name) else {
                    option_reply(s, option, rep::ERR_UNKNOWN, &[])?;
                    s.flush()?;
                    continue;
                };
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&info::EXPORT.to_be_bytes());
                d.extend_from_slice(&e.size().to_be_bytes());
                d.extend_from_slice(&e.flags().to_be_bytes());
                option_reply(s, option, rep::INFO, &d)?;
                // Block size constraints are always sent (the spec allows
                // unrequested information; clients ignore what they skip).
                let mut d = Vec::with_capacity(14);
                d.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
                let min = e.dev.block_size().max(1);
                d.extend_from_slice(&min.to_be_bytes());
                d.extend_from_slice(&PREFERRED_BLOCK.max(min).to_be_bytes());
                d.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
                option_reply(s, option, rep::INFO, &d)?;
                for r in reqs {
                    let (ty, text) = match r {
                        info::NAME => (info::NAME, e.name.as_bytes()),
                        info::DESCRIPTION => (info::DESCRIPTION, e.description.as_bytes()),
                        _ => continue,
                    };
                    let mut d = Vec::with_capacity(2 + text.len());
                    d.extend_from_slice(&ty.to_be_bytes());
                    d.extend_from_slice(text);
                    option_reply(s, option, rep::INFO, &d)?;
                }
                option_reply(s, option, rep::ACK, &[])?;
                s.flush()?;
                if option == opt::GO {
                    return Ok(Negotiated::Go(e.clone()));
                }
            }
            _ => option_reply(s, option, rep::ERR_UNSUP, &[])?,
        }
        s.flush()?;
    }
}

/// Parses INFO/GO data: (name, information requests); `None` if malformed.
pub fn parse_info_request(d: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let n = u32::from_be_bytes(d.get(0..4)?.try_into().ok()?) as usize;
    let name = d.get(4..4usize.checked_add(n)?)?;
    let rest = &d[4 + n..];
    let k = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
    let list = rest.get(2..)?;
    if list.len() != 2 * k {
        return None;
    }
    Some((
        name,
        list.chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
    ))
}

/// A transmission-phase request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Command flags.
    pub flags: u16,
    /// Command type.
    pub ty: u16,
    /// Opaque cookie echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub length: u32,
}

/// Parses a 28-byte request header; `None` if the magic is wrong.
pub fn parse_request(b: &[u8; 28]) -> Option<Request> {
    if u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != REQUEST_MAGIC {
        return None;
    }
    let mut c = [0u8; 8];
    c.copy_from_slice(&b[8..16]);
    let mut o = [0u8; 8];
    o.copy_from_slice(&b[16..24]);
    Some(Request {
        flags: u16::from_be_bytes([b[4], b[5]]),
        ty: u16::from_be_bytes([b[6], b[7]]),
        cookie: u64::from_be_bytes(c),
        offset: u64::from_be_bytes(o),
        length: u32::from_be_bytes([b[24], b[25], b[26], b[27]]),
    })
}

/// Validates a request against the export: the error value to answer, if any.
fn validate(e: &Export, r: &Request) -> Option<u32> {
    let allowed = match r.ty {
        cmd::READ | cmd::FLUSH => 0,
        cmd::WRITE | cmd::TRIM => cmd::FLAG_FUA,
        cmd::WRITE_ZEROES => cmd::FLAG_FUA | cmd::FLAG_NO_HOLE,
        _ => return Some(errno::EINVAL),
    };
    if r.flags & !allowed != 0 {
        return Some(errno::EINVAL);
    }
    if r.ty == cmd::FLUSH {
        return None;
    }
    if r.ty != cmd::READ && e.dev.read_only() {
        return Some(errno::EPERM);
    }
    let b = u64::from(e.dev.block_size().max(1));
    if !r.offset.is_multiple_of(b) || !u64::from(r.length).is_multiple_of(b) {
        return Some(errno::EINVAL);
    }
    match r.offset.checked_add(u64::from(r.length)) {
        Some(end) if end <= e.size() => None,
        // The spec: a write (of data or zeros) past the end is ENOSPC, a
        // read or trim past it EINVAL.
        _ if matches!(r.ty, cmd::WRITE | cmd::WRITE_ZEROES) => Some(errno::ENOSPC),
        _ => Some(errno::EINVAL),
    }
}

/// READ and WRITE buffers whose replies have been written, reused by
/// every connection (see [`read_buf`]). One pool for the gateway, so its
/// size does not grow with the connections or their pumps.
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Spare buffers kept: enough for batches of small reads and a few large
/// ones, at most `SPARE_BYTES` in all (outside the memory budget, see
/// [`Limits::memory`]).
const SPARE_COUNT: usize = 64;
const SPARE_BYTES: usize = 32 << 20;

/// A buffer of `len` bytes for a READ's data, reused from earlier replies
/// when one is big enough. Not zeroed when reused: a READ that succeeds
/// overwrites every byte, and a failed one sends none.
fn read_buf(len: usize) -> Vec<u8> {
    let reused = {
        let mut s = lock(&SPARE);
        // One already that long needs no zeroing; else one with the room.
        s.iter()
            .position(|b| b.len() >= len)
            .or_else(|| s.iter().position(|b| b.capacity() >= len))
            .map(|i| s.swap_remove(i))
    };
    let mut b = reused.unwrap_or_default();
    if b.len() < len {
        b.resize(len, 0);
    }
    b.truncate(len);
    b
}

/// Returns a READ buffer whose reply has been written.
fn give_back(b: Vec<u8>) {
    if b.capacity() == 0 || b.capacity() > SPARE_BYTES / 4 {
        return;
    }
    let mut s = lock(&SPARE);
    let held: usize = s.iter().map(Vec::capacity).sum();
    if s.len() < SPARE_COUNT && held + b.capacity() <= SPARE_BYTES {
        s.push(b);
    }
}

/// Executes a validated request; the error value (0 = success) and the read data.
fn execute(e: &Export, r: &Request, payload: Vec<u8>) -> (u32, Vec<u8>) {
    if let Some(err) = validate(e, r) {
        return (err, Vec::new());
    }
    let fua = r.flags & cmd::FLAG_FUA != 0;
    let dev = &e.dev;
    let res = match r.ty {
        cmd::READ => {
            let mut buf = read_buf(r.length as usize);
            return match dev.read(r.offset, &mut buf) {
                Ok(()) => (0, buf),
                Err(x) => {
                    give_back(buf);
                    (x, Vec::new())
                }
            };
        }
        cmd::WRITE => {
            let res = dev.write(r.offset, data_of(r, &payload), fua);
            give_back(payload);
            res
        }
        cmd::FLUSH => dev.flush(),
        cmd::TRIM => {
            dev.trim(r.offset, u64::from(r.length))
                .and_then(|()| if fua { dev.flush() } else { Ok(()) })
        }
        _ => dev
            .write_zeroes(
                r.offset,
                u64::from(r.length),
                r.flags & cmd::FLAG_NO_HOLE == 0,
            )
            .and_then(|()| if fua { dev.flush() } else { Ok(()) }),
    };
    (res.err().unwrap_or(0), Vec::new())
}

fn lock<W>(w: &Mutex<W>) -> std::sync::MutexGuard<'_, W> {
    match w.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// A simple reply's header.
fn reply_head(cookie: u64, err: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&err.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h
}

fn write_reply(w: &mut impl Write, cookie: u64, err: u32, data: &[u8]) -> io::Result<()> {
    let h = reply_head(cookie, err);
    if data.is_empty() || err != 0 {
        return w.write_all(&h);
    }
    // Header and data in one vectored write: a buffered writer passes a
    // large reply straight to the socket (one syscall, no copy into its
    // buffer) and gathers small ones.
    write_parts(w, &mut [io::IoSlice::new(&h), io::IoSlice::new(data)])
}

/// Writes all of `parts`, vectored.
fn write_parts(w: &mut impl Write, parts: &mut [io::IoSlice<'_>]) -> io::Result<()> {
    let mut rest = parts;
    while !rest.is_empty() {
        match w.write_vectored(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes the replies of a READ run (see [`Replies::Run`]): each header
/// and its part of `data`, in one vectored write where the socket takes
/// it.
fn write_run(w: &mut impl Write, each: &[(u64, usize)], data: &[u8]) -> io::Result<()> {
    let heads: Vec<[u8; 16]> = each
        .iter()
        .map(|&(cookie, _)| reply_head(cookie, 0))
        .collect();
    let mut parts = Vec::with_capacity(2 * each.len());
    let mut at = 0;
    for (h, &(_, len)) in heads.iter().zip(each) {
        let Some(d) = data.get(at..at + len) else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        parts.push(io::IoSlice::new(h));
        parts.push(io::IoSlice::new(d));
        at += len;
    }
    write_parts(w, &mut parts)
}

/// Requests read together: each with its write payload, which may be
/// longer than the request's data (see [`data_of`]).
type Batch = Vec<(Request, Vec<u8>)>;

/// Requests of one connection gathered into one batch at most.
pub const BATCH_REQUESTS: usize = 32;
/// Read/write payload bytes gathered into one batch at most: with its
/// entries a batch then fits one datagram each way (request with its
/// data-out, reply with its data-in), where a larger one would move data
/// by MoveFrom/MoveTo and wait for their acknowledgements. A deeper queue
/// makes more batches, which the connection's pumps run side by side.
pub const BATCH_BYTES: usize = 60 << 10;

/// WRITE payloads up to this size are read into a buffer allocated up
/// front; larger ones as they arrive (a client that only claims a large
/// payload makes the gateway allocate nothing).
const PREALLOC_PAYLOAD: usize = 1 << 20;

/// The reading half of a connection, shared by its pumps.
struct Reader<R> {
    r: io::BufReader<R>,
    /// DISC, end of stream, or an error: no more requests.
    done: bool,
}

/// Payload bytes the gateway holds for a request until its reply is
/// written (a READ past [`MAX_PAYLOAD`] is refused without any).
fn cost(r: &Request) -> usize {
    if r.length > MAX_PAYLOAD {
        0
    } else {
        data_len(r)
    }
}

/// Reads the next request (header and write payload), its payload bytes
/// taken from the budget into `lease`: waiting for them if `pre` is
/// `None`, else `pre` holds them already. `Ok(None)` at DISC or end of
/// stream.
fn read_one<R: Read>(
    r: &mut io::BufReader<R>,
    budget: &Arc<Budget>,
    lease: &mut Lease,
    pre: Option<Lease>,
) -> Result<Option<(Request, Vec<u8>)>, NbdError> {
    let mut hdr = [0u8; 28];
    if let Err(e) = r.read_exact(&mut hdr) {
        // A client that leaves without DISC: a hard disconnect.
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return Ok(None);
        }
        return Err(e.into());
    }
    let Some(req) = parse_request(&hdr) else {
        return violation("bad request magic");
    };
    if req.ty == cmd::DISC {
        return Ok(None);
    }
    // Back-pressure: this connection reads nothing more (the reader is
    // held) until the gateway has room for this request's data.
    lease.join(pre.unwrap_or_else(|| budget.take(cost(&req))));
    let mut payload = Vec::new();
    if req.ty == cmd::WRITE {
        if req.length > MAX_PAYLOAD {
            return violation(format!("write payload of {} bytes", req.length));
        }
        let len = req.length as usize;
        if len <= PREALLOC_PAYLOAD {
            // A pump's buffers are reused unzeroed; a large WRITE's has
            // room for the run it may head (see `extend_write_run`).
            payload = read_buf(if len > BATCH_IO_MAX as usize {
                len.max(MERGE_BYTES)
            } else {
                len
            });
            if let Err(e) = read_payload(r, &mut payload[..len]) {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    return Ok(None); // the client left mid-request
                }
                return Err(e.into());
            }
        } else {
            // Read as it arrives: a client that only claims a large
            // payload makes us allocate nothing up front.
            let n = r.take(u64::from(req.length)).read_to_end(&mut payload)?;
            if n != len {
                return Ok(None); // the client left mid-request
            }
        }
    }
    Ok(Some((req, payload)))
}

/// A WRITE's data: the first `length` bytes of its payload buffer (a
/// reused buffer may be longer).
fn data_of<'a>(r: &Request, payload: &'a [u8]) -> &'a [u8] {
    &payload[..(r.length as usize).min(payload.len())]
}

/// Fills `buf` from `r`: what is buffered first, then a large remainder
/// straight from the stream. (Through the buffer, a payload as large as
/// the buffer would be copied twice, since the buffer is never empty
/// after the request header: kernel to buffer, buffer to payload.) A
/// small remainder still goes through the buffer, which then also picks up
/// the requests behind it for the next batch.
fn read_payload<R: Read>(r: &mut io::BufReader<R>, buf: &mut [u8]) -> io::Result<()> {
    let have = r.buffer().len().min(buf.len());
    buf[..have].copy_from_slice(&r.buffer()[..have]);
    r.consume(have);
    let rest = &mut buf[have..];
    if rest.len() >= DIRECT_PAYLOAD {
        r.get_mut().read_exact(rest)
    } else {
        r.read_exact(rest)
    }
}

/// A WRITE payload remainder at least this large bypasses the read buffer.
const DIRECT_PAYLOAD: usize = 64 << 10;

/// Payload bytes a request moves (a TRIM's or WRITE_ZEROES' length moves
/// none).
fn data_len(r: &Request) -> usize {
    if matches!(r.ty, cmd::READ | cmd::WRITE) {
        r.length as usize
    } else {
        0
    }
}

/// The payload size of the next request if it is already wholly buffered
/// (no waiting) and may join a batch.
fn buffered_request(b: &[u8]) -> Option<usize> {
    let h = b.get(..28)?;
    let mut hdr = [0u8; 28];
    hdr.copy_from_slice(h);
    // A bad magic is reported by the next blocking read.
    let r = parse_request(&hdr)?;
    match r.ty {
        cmd::DISC => None,
        _ if data_len(&r) > BATCH_IO_MAX as usize => None,
        cmd::WRITE if b.len() < 28 + r.length as usize => None,
        _ => Some(data_len(&r)),
    }
}

/// Contiguous large READs (or WRITEs) queued together go to the device as
/// one of at most this many bytes (a block layer's request merging): one
/// IPdisk exchange for up to four of a sequential client's requests.
pub const MERGE_BYTES: usize = 1 << 20;

/// The header at the start of `b`, if wholly there.
fn peek_request(b: &[u8]) -> Option<Request> {
    let mut hdr = [0u8; 28];
    hdr.copy_from_slice(b.get(..28)?);
    parse_request(&hdr)
}

/// True if `r` continues `run` (large requests of one type, contiguous,
/// WRITEs with the same FUA flag) within [`MERGE_BYTES`].
fn joins_run(r: &Request, run: &[(Request, Vec<u8>)]) -> bool {
    let Some((last, _)) = run.last() else {
        return false;
    };
    let total: usize = run.iter().map(|(q, _)| q.length as usize).sum();
    matches!(r.ty, cmd::READ | cmd::WRITE)
        && r.ty == last.ty
        && r.length > BATCH_IO_MAX
        && (r.flags & cmd::FLAG_FUA) == (last.flags & cmd::FLAG_FUA)
        && Some(r.offset) == last.offset.checked_add(u64::from(last.length))
        && total + r.length as usize <= MERGE_BYTES
}

/// A batch of contiguous large requests of type `ty` (see
/// [`MERGE_BYTES`]; a WRITE run's payloads are all in the first entry).
fn is_run(batch: &[(Request, Vec<u8>)], ty: u16) -> bool {
    batch.len() > 1
        && batch
            .iter()
            .all(|(r, _)| r.ty == ty && r.length > BATCH_IO_MAX)
        && batch
            .windows(2)
            .all(|w| Some(w[1].0.offset) == w[0].0.offset.checked_add(u64::from(w[0].0.length)))
}

/// Reads the payloads of WRITEs that continue the large WRITE in
/// `batch[0]` into its payload, while their headers are here already (or
/// readable now: the client has sent them). `Ok(false)`: the stream ended
/// in a payload.
fn extend_write_run<R: Read + Ready>(
    r: &mut io::BufReader<R>,
    batch: &mut Batch,
    budget: &Arc<Budget>,
    lease: &mut Lease,
) -> Result<bool, NbdError> {
    loop {
        // The next header: buffered, or peeked at in the socket (reading
        // it into the buffer would pull the payload behind it through the
        // buffer too: a copy more).
        let mut hdr = [0u8; 28];
        let direct = r.buffer().is_empty();
        let q = if direct {
            if r.get_ref().peek(&mut hdr) < 28 {
                return Ok(true);
            }
            peek_request(&hdr)
        } else {
            peek_request(r.buffer())
        };
        let Some(q) = q.filter(|q| joins_run(q, batch)) else {
            return Ok(true);
        };
        // Only with room to spare: the run ends, the request waits.
        let Some(more) = budget.try_take(cost(&q)) else {
            return Ok(true);
        };
        lease.join(more);
        if direct {
            r.get_mut().read_exact(&mut hdr)?;
        } else {
            r.consume(28);
        }
        let at: usize = batch.iter().map(|(q, _)| q.length as usize).sum();
        let end = at + q.length as usize;
        let payload = &mut batch[0].1;
        if payload.len() < end {
            payload.resize(end, 0);
        }
        if let Err(e) = read_payload(r, &mut payload[at..end]) {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                return Ok(false); // the client left mid-request
            }
            return Err(e.into());
        }
        batch.push((q, Vec::new()));
    }
}

/// Reads one request (waiting for it), then every further request
/// already buffered, up to the batch limits: small reads and writes, or
/// large READs that continue a large READ. `Ok(None)`: no more requests.
///
/// The batch's payload bytes are taken from `budget` into `lease`: the
/// first request waits for them; the others join only if there is room.
fn read_batch<R: Read + Ready>(
    r: &mut io::BufReader<R>,
    budget: &Arc<Budget>,
    lease: &mut Lease,
) -> Result<Option<Batch>, NbdError> {
    let Some(first) = read_one(r, budget, lease, None)? else {
        return Ok(None);
    };
    let mut bytes = data_len(&first.0);
    let alone = bytes > BATCH_IO_MAX as usize;
    let mut batch = vec![first];
    if alone && batch[0].0.ty == cmd::WRITE {
        // (A stream that ends in a payload still runs what came whole;
        // the next read sees the end.)
        extend_write_run(r, &mut batch, budget, lease)?;
    }
    // Contiguous READs join a large READ while the budget has room.
    while let Some(more) = peek_request(r.buffer())
        .filter(|q| alone && q.ty == cmd::READ && joins_run(q, &batch))
        .and_then(|q| budget.try_take(cost(&q)))
    {
        match read_one(r, budget, lease, Some(more))? {
            Some(q) => batch.push(q),
            None => break,
        }
    }
    // A large request goes alone, so large requests of one connection
    // run on as many pumps as there are.
    while !alone && batch.len() < BATCH_REQUESTS {
        let more = match buffered_request(r.buffer()) {
            Some(n) if bytes + n <= BATCH_BYTES => budget.try_take(n),
            _ => break,
        };
        let Some(more) = more else {
            break;
        };
        match read_one(r, budget, lease, Some(more))? {
            Some(q) => {
                bytes += data_len(&q.0);
                batch.push(q);
            }
            None => break,
        }
    }
    Ok(Some(batch))
}

/// Reads and writes larger than this run on their own: their buffers are
/// lent to the device as they are, where a batch would copy them.
pub const BATCH_IO_MAX: u32 = 64 << 10;

/// A request that joins the device batch: a valid READ or WRITE of at
/// most [`BATCH_IO_MAX`].
fn batchable(e: &Export, r: &Request) -> bool {
    matches!(r.ty, cmd::READ | cmd::WRITE) && r.length <= BATCH_IO_MAX && validate(e, r).is_none()
}

/// What a batch's requests get back.
enum Replies {
    /// (cookie, error, data) per request, in request order.
    Each(Vec<(u64, u32, Vec<u8>)>),
    /// Contiguous READs read as one: (cookie, length) per request in order,
    /// and their data back to back, or one error for all.
    Run(Vec<(u64, usize)>, Result<Vec<u8>, u32>),
}

/// Executes a batch: runs of small reads and writes go to the device
/// together, a run of contiguous large READs as one read, anything else
/// on its own, in order.
fn execute_batch(e: &Export, mut batch: Batch) -> Replies {
    if is_run(&batch, cmd::WRITE) {
        let payload = std::mem::take(&mut batch[0].1);
        let total = batch.iter().map(|(r, _)| r.length as usize).sum();
        let data = payload.get(..total).unwrap_or_default();
        let fua = batch[0].0.flags & cmd::FLAG_FUA != 0;
        let res = if batch.iter().all(|(r, _)| validate(e, r).is_none()) {
            let x = e.dev.write(batch[0].0.offset, data, fua).err().unwrap_or(0);
            batch
                .iter()
                .map(|(r, _)| (r.cookie, x, Vec::new()))
                .collect()
        } else {
            // One is refused: the others go on their own.
            let mut at = 0;
            batch
                .iter()
                .map(|(r, _)| {
                    let part = data.get(at..at + r.length as usize).unwrap_or_default();
                    at += r.length as usize;
                    let x = match validate(e, r) {
                        Some(x) => x,
                        None => e.dev.write(r.offset, part, fua).err().unwrap_or(0),
                    };
                    (r.cookie, x, Vec::new())
                })
                .collect()
        };
        give_back(payload);
        return Replies::Each(res);
    }
    if is_run(&batch, cmd::READ) && batch.iter().all(|(r, _)| validate(e, r).is_none()) {
        let total = batch.iter().map(|(r, _)| r.length as usize).sum();
        let mut buf = read_buf(total);
        let res = match e.dev.read(batch[0].0.offset, &mut buf) {
            Ok(()) => Ok(buf),
            Err(x) => {
                give_back(buf);
                Err(x)
            }
        };
        let each = batch
            .iter()
            .map(|(r, _)| (r.cookie, r.length as usize))
            .collect();
        return Replies::Run(each, res);
    }
    Replies::Each(execute_each(e, batch))
}

/// [`execute_batch`] request by request (small reads and writes as one
/// device batch). Returns (cookie, error, data) per request, in order.
fn execute_each(e: &Export, batch: Batch) -> Vec<(u64, u32, Vec<u8>)> {
    let mut out = Vec::with_capacity(batch.len());
    let mut run: Vec<(Request, Vec<u8>)> = Vec::new();
    let flush_run = |run: &mut Vec<(Request, Vec<u8>)>, out: &mut Vec<(u64, u32, Vec<u8>)>| {
        if run.is_empty() {
            return;
        }
        let mut bufs: Vec<Vec<u8>> = run
            .iter()
            .map(|(r, _)| {
                if r.ty == cmd::READ {
                    read_buf(r.length as usize)
                } else {
                    Vec::new()
                }
            })
            .collect();
        let mut ios: Vec<(u64, BatchIo<'_>)> = run
            .iter()
            .zip(bufs.iter_mut())
            .map(|((r, payload), b)| {
                let io = if r.ty == cmd::READ {
                    BatchIo::Read(b.as_mut_slice())
                } else {
                    BatchIo::Write(data_of(r, payload), r.flags & cmd::FLAG_FUA != 0)
                };
                (r.offset, io)
            })
            .collect();
        let res = e.dev.batch(&mut ios);
        drop(ios);
        for (k, ((r, payload), b)) in run.drain(..).zip(bufs).enumerate() {
            give_back(payload);
            match res.get(k).copied().unwrap_or(Err(errno::EIO)) {
                Ok(()) => out.push((r.cookie, 0, if r.ty == cmd::READ { b } else { Vec::new() })),
                Err(x) => {
                    give_back(b);
                    out.push((r.cookie, x, Vec::new()));
                }
            }
        }
    };
    for (r, payload) in batch {
        if batchable(e, &r) {
            run.push((r, payload));
            continue;
        }
        flush_run(&mut run, &mut out);
        if r.ty == cmd::READ && r.length > MAX_PAYLOAD {
            out.push((r.cookie, errno::EINVAL, Vec::new()));
            continue;
        }
        let (err, data) = execute(e, &r, payload);
        out.push((r.cookie, err, data));
    }
    flush_run(&mut run, &mut out);
    out
}

/// The gateway's memory budget: payload bytes of requests read and not yet
/// answered (WRITE data, READ buffers), over every connection. A request
/// waits for its bytes before its payload is read, in arrival order; one
/// larger than the whole budget waits for all of it (so it still runs,
/// alone).
pub struct Budget {
    total: usize,
    state: Mutex<BudgetState>,
    freed: std::sync::Condvar,
    stats: Arc<GatewayStats>,
}

#[derive(Default)]
struct BudgetState {
    used: usize,
    /// Tickets: waiters get their bytes in the order they asked.
    next: u64,
    serving: u64,
    /// Threads waiting (a release wakes them only if there are any).
    waiting: usize,
}

impl Budget {
    /// A budget of `total` bytes counted into `stats`.
    pub fn new(total: usize, stats: Arc<GatewayStats>) -> Arc<Budget> {
        Arc::new(Budget {
            total: total.max(1),
            state: Mutex::new(BudgetState::default()),
            freed: std::sync::Condvar::new(),
            stats,
        })
    }

    fn grant(self: &Arc<Self>, st: &mut BudgetState, n: usize) -> Lease {
        st.used += n;
        self.stats
            .memory_peak
            .fetch_max(st.used as u64, Ordering::Relaxed);
        Lease {
            budget: Some(self.clone()),
            n,
        }
    }

    /// Takes `n` bytes (at most the whole budget), waiting for them.
    fn take(self: &Arc<Self>, n: usize) -> Lease {
        if n == 0 {
            return Lease::none();
        }
        let n = n.min(self.total);
        let mut st = lock(&self.state);
        let me = st.next;
        st.next += 1;
        if st.serving != me || st.used + n > self.total {
            self.stats.memory_waits.fetch_add(1, Ordering::Relaxed);
            st.waiting += 1;
            while st.serving != me || st.used + n > self.total {
                st = match self.freed.wait(st) {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
            }
            st.waiting -= 1;
        }
        st.serving += 1;
        let l = self.grant(&mut st, n);
        let others = st.waiting > 0;
        drop(st);
        if others {
            // The next ticket may fit too.
            self.freed.notify_all();
        }
        l
    }

    /// Takes `n` bytes if they are free and nobody waits.
    fn try_take(self: &Arc<Self>, n: usize) -> Option<Lease> {
        if n == 0 {
            return Some(Lease::none());
        }
        let mut st = lock(&self.state);
        if st.serving != st.next || st.used + n > self.total {
            return None;
        }
        Some(self.grant(&mut st, n))
    }
}

/// Bytes held from a [`Budget`], given back on drop.
struct Lease {
    budget: Option<Arc<Budget>>,
    n: usize,
}

impl Lease {
    fn none() -> Lease {
        Lease { budget: None, n: 0 }
    }

    /// Adds `other`'s bytes to this lease (both from one budget).
    fn join(&mut self, mut other: Lease) {
        if other.n == 0 {
            return;
        }
        if self.budget.is_none() {
            self.budget = other.budget.take();
        }
        self.n += std::mem::take(&mut other.n);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let (Some(b), true) = (&self.budget, self.n > 0) {
            let mut st = lock(&b.state);
            st.used -= self.n;
            if st.waiting > 0 {
                drop(st);
                b.freed.notify_all();
            }
        }
    }
}

/// Limits of a gateway (see docs/IPDISK.md, "Limits").
#[derive(Clone, Debug)]
pub struct Limits {
    /// Payload bytes held for requests not yet answered, over every
    /// connection; at the limit the gateway stops reading requests until
    /// replies drain.
    pub memory: usize,
    /// Connections open at once; one more is closed at once (logged).
    pub max_connections: usize,
    /// A connection that has not finished negotiating after this long is
    /// closed.
    pub handshake_timeout: Duration,
    /// A connection with no request for this long gives back its threads
    /// (it waits on the gateway's poller).
    pub idle_after: Duration,
}

/// Default memory budget: 256 MiB (eight maximum-size requests).
pub const DEFAULT_MEMORY: usize = 256 << 20;
/// Default connection limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default handshake timeout (qemu-nbd's `--handshake-limit` default).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory: DEFAULT_MEMORY,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_after: Duration::from_secs(2),
        }
    }
}

/// Runs the transmission phase until DISC or the connection ends.
///
/// `workers` *pumps* share the connection: a pump takes the reading half,
/// reads one request and every further one already buffered (a batch),
/// lets go, executes the batch (reads and writes as one device batch:
/// one IPdisk exchange), and writes the replies together. While one pump
/// waits on the device the next reads, so requests stay in flight and
/// replies may come out of order. `workers` = 0 runs one pump inline
/// (deterministic: fuzzing).
pub fn transmission<R, W>(
    r: R,
    w: Arc<Mutex<W>>,
    export: &Export,
    workers: usize,
) -> Result<(), NbdError>
where
    R: Read + Ready + Send,
    W: Write + Send,
{
    let budget = Budget::new(usize::MAX, Arc::default());
    transmit(r, w, export, workers, &budget, false).map(|_| ())
}

/// How a run of [`transmit`] ended without error.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// DISC or end of stream.
    Done,
    /// No request came for a while (the stream's read timeout, at a
    /// request boundary); every request read has been answered.
    Idle,
}

/// [`transmission`] with a memory budget; with `idle`, it also returns
/// (as [`Ended::Idle`]) once a read at a request boundary times out.
fn transmit<R, W>(
    r: R,
    w: Arc<Mutex<W>>,
    export: &Export,
    workers: usize,
    budget: &Arc<Budget>,
    idle: bool,
) -> Result<Ended, NbdError>
where
    R: Read + Ready + Send,
    W: Write + Send,
{
    let reader = Mutex::new(Reader {
        r: io::BufReader::with_capacity(256 << 10, r),
        done: false,
    });
    let went_idle = AtomicBool::new(false);
    let first_error: Mutex<Option<NbdError>> = Mutex::new(None);
    // Whether the client is sending large requests: the extra pumps (see
    // [`LARGE_PUMPS`]) take part only then.
    let large = (Mutex::new(false), std::sync::Condvar::new());
    // The connection is done (the reader's flag, seen without its lock: a
    // parked pump holds the `large` lock, and a reading pump the reader's).
    let finished = AtomicBool::new(false);
    let set_large = |on: bool| {
        let mut g = lock(&large.0);
        if *g != on {
            *g = on;
            large.1.notify_all();
        }
    };
    // No more requests: parked pumps leave. (Set under the `large` lock, so
    // a pump about to park sees it or is woken.)
    let finish = || {
        {
            let _g = lock(&large.0);
            finished.store(true, Ordering::Release);
        }
        large.1.notify_all();
    };
    let pump = |extra: bool| loop {
        if extra {
            // Park until large requests come (or the connection ends).
            let mut g = lock(&large.0);
            while !*g && !finished.load(Ordering::Acquire) {
                g = match large.1.wait_timeout(g, Duration::from_millis(100)) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            }
            drop(g);
            if finished.load(Ordering::Acquire) {
                return;
            }
        }
        let mut lease = Lease::none();
        let batch = {
            let mut g = lock(&reader);
            if g.done {
                return;
            }
            if idle && g.r.buffer().is_empty() {
                // At a request boundary: a read that times out here means
                // an idle client (a timeout inside a request is retried).
                g.r.get_mut().boundary(true);
                let res = g.r.fill_buf().map(|b| b.is_empty());
                g.r.get_mut().boundary(false);
                match res {
                    Err(e) if is_timeout(&e) => {
                        g.done = true;
                        drop(g);
                        went_idle.store(true, Ordering::Release);
                        finish();
                        return;
                    }
                    // Data, end of stream, or an error: the read below sees it.
                    _ => {}
                }
            }
            match read_batch(&mut g.r, budget, &mut lease) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    g.done = true;
                    drop(g);
                    finish();
                    return;
                }
                Err(e) => {
                    g.done = true;
                    drop(g);
                    lock(&first_error).get_or_insert(e);
                    finish();
                    return;
                }
            }
        };
        set_large(data_len(&batch[0].0) > BATCH_IO_MAX as usize);
        let replies = execute_batch(export, batch);
        let res = (|| -> io::Result<()> {
            let mut g = lock(&w);
            match &replies {
                Replies::Each(each) => {
                    for (cookie, err, data) in each {
                        write_reply(&mut *g, *cookie, *err, data)?;
                    }
                }
                Replies::Run(each, Ok(data)) => write_run(&mut *g, each, data)?,
                Replies::Run(each, Err(err)) => {
                    for &(cookie, _) in each {
                        write_reply(&mut *g, cookie, *err, &[])?;
                    }
                }
            }
            g.flush()
        })();
        match replies {
            Replies::Each(each) => each.into_iter().for_each(|(_, _, d)| give_back(d)),
            Replies::Run(_, Ok(d)) => give_back(d),
            Replies::Run(_, Err(_)) => {}
        }
        // The replies are out (or failed): their bytes are free again.
        drop(lease);
        if let Err(e) = res {
            lock(&reader).done = true;
            lock(&first_error).get_or_insert(NbdError::Io(e));
            finish();
            return;
        }
    };
    if workers == 0 {
        pump(false);
    } else {
        std::thread::scope(|s| {
            // Pump 0 is this thread (one thread fewer to start when an
            // idle connection wakes).
            for i in 1..workers + LARGE_PUMPS {
                let extra = i >= workers;
                let spawned = std::thread::Builder::new()
                    .name(format!("nbd-pump{i}"))
                    .spawn_scoped(s, move || pump(extra));
                if let Err(e) = spawned {
                    // Fewer pumps still serve the connection.
                    tracing::warn!("nbd: cannot start a pump: {e}");
                    break;
                }
            }
            pump(false);
        });
    }
    // DISC, end or idle: every pump has finished its batch and replied.
    let e = lock(&first_error).take();
    match e {
        Some(e) => Err(e),
        None if went_idle.load(Ordering::Acquire) => Ok(Ended::Idle),
        None => Ok(Ended::Done),
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Where the gateway listens: a TCP address or `unix:PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// TCP.
    Tcp(SocketAddr),
    /// A Unix-domain socket path.
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a path".into());
            }
            return Ok(ListenAddr::Unix(p.into()));
        }
        s.parse()
            .map(ListenAddr::Tcp)
            .map_err(|_| format!("`{s}` is neither HOST:PORT nor unix:PATH"))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l) => l.as_fd(),
        }
    }

    /// Accepts one connection: its reading half, its writing half, a
    /// handle to close it.
    fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => l.accept().and_then(|(s, _)| {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                let w = s.try_clone()?;
                let c = s.try_clone()?;
                Ok((Box::new(s) as _, Box::new(w) as _, Conn::Tcp(c)))
            }),
            Listener::Unix(l) => l.accept().and_then(|(s, _)| {
                s.set_nonblocking(false)?;
                let w = s.try_clone()?;
                let c = s.try_clone()?;
                Ok((Box::new(s) as _, Box::new(w) as _, Conn::Unix(c)))
            }),
        }
    }
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn shutdown(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// Counters of a gateway.
#[derive(Debug, Default)]
pub struct GatewayStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections closed for a protocol violation or I/O error.
    pub errors: AtomicU64,
    /// Connections refused (closed at once) over the connection limit.
    pub refused: AtomicU64,
    /// Connections closed for not finishing the handshake in time.
    pub handshake_timeouts: AtomicU64,
    /// Times a connection's reading stopped until the memory budget had
    /// room for its next request.
    pub memory_waits: AtomicU64,
    /// Most budget bytes held at once (see [`Limits::memory`]).
    pub memory_peak: AtomicU64,
    /// Times an idle connection gave back its threads.
    pub parked: AtomicU64,
}

/// A connection the gateway tracks (for stop, the limit and the
/// handshake deadline).
struct Tracked {
    conn: Conn,
    /// Negotiation is over (the deadline no longer applies).
    negotiated: bool,
    /// Closed for its deadline (once).
    expired: bool,
    deadline: std::time::Instant,
}

/// A connection no thread serves: waiting on the poller for its client.
struct Idle {
    id: u64,
    rs: Box<dyn ReadWrite>,
    ws: Box<dyn Write + Send>,
    /// The export once negotiated; before that, the hello has been sent.
    export: Option<Export>,
}

/// What the poller and the connections' workers share.
struct Shared {
    exports: Vec<Export>,
    limits: Limits,
    budget: Arc<Budget>,
    stats: Arc<GatewayStats>,
    stop: AtomicBool,
    /// Wakes the poller to see `stop`.
    wake: Wake,
    epoll: std::os::fd::OwnedFd,
    conns: Mutex<std::collections::HashMap<u64, Tracked>>,
    idle: Mutex<std::collections::HashMap<u64, Idle>>,
}

/// An eventfd that wakes the poller.
struct Wake(std::os::fd::OwnedFd);

impl Wake {
    fn new() -> rustix::io::Result<Wake> {
        use rustix::event::{eventfd, EventfdFlags};
        eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).map(Wake)
    }

    /// Makes the eventfd readable. A failure (counter overflow) still
    /// leaves it readable.
    fn signal(&self) {
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// Makes the eventfd unreadable again.
    fn drain(&self) {
        let _ = rustix::io::read(&self.0, &mut [0u8; 8]);
    }

    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.0)
    }
}

/// Epoll keys: the listener, the wake eventfd, then connection ids.
const KEY_LISTENER: u64 = 0;
const KEY_WAKE: u64 = 1;

impl Shared {
    /// Hands a connection to the poller until its client sends something.
    fn park(&self, c: Idle) {
        use rustix::event::epoll;
        if self.stop.load(Ordering::Acquire) {
            self.close(c.id);
            return;
        }
        let id = c.id;
        // Locked first: the poller, woken at once by a client that has
        // sent already, waits here until the connection is in the map.
        let mut idle = lock(&self.idle);
        let added = epoll::add(
            &self.epoll,
            &c.rs,
            epoll::EventData::new_u64(id),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT,
        );
        match added {
            Ok(()) => {
                idle.insert(id, c);
            }
            Err(e) => {
                drop(idle);
                tracing::warn!("nbd: cannot watch a connection: {e}");
                self.close(id);
            }
        }
    }

    /// Closes a tracked connection for its client.
    fn close(&self, id: u64) {
        if let Some(t) = lock(&self.conns).remove(&id) {
            t.conn.shutdown();
        }
    }

    /// Serves a connection whose client has sent something, on a new
    /// thread, until it is idle again or ends.
    fn serve(self: &Arc<Self>, c: Idle) {
        let sh = self.clone();
        let id = c.id;
        let spawned = std::thread::Builder::new()
            .name("nbd-conn".into())
            .spawn(move || {
                let id = c.id;
                match sh.serve_some(c) {
                    Ok(Some(c)) => return sh.park(c),
                    Ok(None) => {}
                    Err(e) => {
                        sh.stats.errors.fetch_add(1, Ordering::Relaxed);
                        tracing::info!("nbd: connection closed: {e}");
                    }
                }
                sh.close(id);
            });
        if let Err(e) = spawned {
            tracing::warn!("nbd: cannot start a connection thread: {e}");
            self.close(id);
        }
    }

    /// Negotiates (if not yet) and transmits until idle (`Some`: park it)
    /// or the end (`None`).
    fn serve_some(&self, mut c: Idle) -> Result<Option<Idle>, NbdError> {
        if c.export.is_none() {
            let e = match negotiate(&mut c.rs, &self.exports)? {
                Negotiated::Go(e) => e,
                Negotiated::Aborted => return Ok(None),
            };
            {
                let mut conns = lock(&self.conns);
                match conns.get_mut(&c.id) {
                    Some(t) if !t.expired => t.negotiated = true,
                    _ => return Ok(None),
                }
            }
            // From now on a read that waits this long at a request
            // boundary lets the connection go idle.
            rustix::net::sockopt::set_socket_timeout(
                &c.rs,
                rustix::net::sockopt::Timeout::Recv,
                Some(self.limits.idle_after.max(Duration::from_millis(1))),
            )
            .map_err(io::Error::from)?;
            c.export = Some(e);
        }
        let Idle { rs, ws, export, .. } = &mut c;
        let Some(e) = export.as_ref() else {
            return Ok(None);
        };
        // A batch of small replies (fio: 32 × 4 KiB) goes out in one write;
        // replies as large as the buffer bypass it (see `write_reply`).
        let w = Arc::new(Mutex::new(io::BufWriter::with_capacity(256 << 10, ws)));
        let r = Timed {
            s: rs,
            boundary: false,
        };
        match transmit(r, w, e, WORKERS_PER_CONN, &self.budget, true)? {
            Ended::Done => Ok(None),
            Ended::Idle => {
                self.stats.parked.fetch_add(1, Ordering::Relaxed);
                Ok(Some(c))
            }
        }
    }
}

/// A connection's reading half with a read timeout set (see
/// [`Limits::idle_after`]): a read that times out is retried, except at a
/// request boundary, where it reports the idle connection.
struct Timed<'a> {
    s: &'a mut Box<dyn ReadWrite>,
    boundary: bool,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.s.read(buf) {
                Err(e) if is_timeout(&e) && !self.boundary => continue,
                r => return r,
            }
        }
    }
}

impl Ready for Timed<'_> {
    fn peek(&self, buf: &mut [u8]) -> usize {
        self.s.peek(buf)
    }
    fn boundary(&mut self, on: bool) {
        self.boundary = on;
    }
}

/// A running NBD gateway.
pub struct Gateway {
    addr: ListenAddr,
    shared: Arc<Shared>,
    poller: Option<JoinHandle<()>>,
}

/// Pumps per connection. Two keep a batch in flight while the next is
/// read; more split the client's queue into smaller batches, which costs
/// more wake-ups per request than it gains in overlap (measured: fio 4 KiB
/// random at depth 32 fell from ~110k to ~65k IOPS with four).
pub const WORKERS_PER_CONN: usize = 2;

/// Further pumps per connection that run only while the client sends
/// large requests (more than [`BATCH_IO_MAX`], each alone in its batch):
/// then each pump carries one request, and two leave the connection
/// unread while both wait on the device (nbdcopy's 256 KiB writes: +10-15 %
/// with four). Small requests keep them parked, since they would only
/// split batches (see [`WORKERS_PER_CONN`]).
pub const LARGE_PUMPS: usize = 2;

impl Gateway {
    /// Binds `addr` and serves `exports` with the default [`Limits`].
    pub fn start(addr: &ListenAddr, exports: Vec<Export>) -> io::Result<Gateway> {
        Gateway::start_with(addr, exports, Limits::default())
    }

    /// Binds `addr` and serves `exports` within `limits`: one poller
    /// thread accepts connections and watches idle ones; a connection
    /// with requests to serve gets threads until it is idle again.
    pub fn start_with(
        addr: &ListenAddr,
        exports: Vec<Export>,
        limits: Limits,
    ) -> io::Result<Gateway> {
        use rustix::event::epoll;
        let (listener, bound) = match addr {
            ListenAddr::Tcp(a) => {
                let l = TcpListener::bind(a)?;
                let b = ListenAddr::Tcp(l.local_addr()?);
                l.set_nonblocking(true)?;
                (Listener::Tcp(l), b)
            }
            ListenAddr::Unix(p) => {
                // Replace a stale socket left by an earlier run, nothing else.
                use std::os::unix::fs::FileTypeExt;
                if let Ok(md) = std::fs::symlink_metadata(p) {
                    if md.file_type().is_socket() {
                        std::fs::remove_file(p)?;
                    }
                }
                let l = UnixListener::bind(p)?;
                l.set_nonblocking(true)?;
                (Listener::Unix(l), addr.clone())
            }
        };
        let stats = Arc::new(GatewayStats::default());
        let shared = Arc::new(Shared {
            exports,
            budget: Budget::new(limits.memory, stats.clone()),
            limits,
            stats,
            stop: AtomicBool::new(false),
            wake: Wake::new()?,
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            conns: Mutex::new(std::collections::HashMap::new()),
            idle: Mutex::new(std::collections::HashMap::new()),
        });
        epoll::add(
            &shared.epoll,
            listener.as_fd(),
            epoll::EventData::new_u64(KEY_LISTENER),
            epoll::EventFlags::IN,
        )?;
        epoll::add(
            &shared.epoll,
            shared.wake.as_fd(),
            epoll::EventData::new_u64(KEY_WAKE),
            epoll::EventFlags::IN,
        )?;
        let poller = {
            let sh = shared.clone();
            std::thread::Builder::new()
                .name("nbd-poll".into())
                .spawn(move || poll_loop(listener, sh))?
        };
        Ok(Gateway {
            addr: bound,
            shared,
            poller: Some(poller),
        })
    }

    /// The address actually bound (the port chosen for port 0).
    pub fn addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// Counters.
    pub fn stats(&self) -> &GatewayStats {
        &self.shared.stats
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }

    /// Stops accepting and closes every connection.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.signal();
        if let Some(h) = self.poller.take() {
            let _ = h.join();
        }
        lock(&self.shared.idle).clear();
        lock(&self.shared.conns)
            .values()
            .for_each(|t| t.conn.shutdown());
        if let ListenAddr::Unix(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A new connection: its reading half, its writing half, a handle to close it.
type Accepted = (Box<dyn ReadWrite>, Box<dyn Write + Send>, Conn);

/// The hello that opens the fixed newstyle handshake.
fn hello() -> [u8; 18] {
    let mut h = [0u8; 18];
    h[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    h[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    h[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    h
}

/// The gateway's one thread that waits: accepts connections, hands idle
/// ones whose client sent something to a worker, and closes those whose
/// handshake is late.
fn poll_loop(l: Listener, sh: Arc<Shared>) {
    use rustix::event::epoll;
    let mut next_id = KEY_WAKE + 1;
    let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
    let tick = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    while !sh.stop.load(Ordering::Acquire) {
        events.clear();
        if let Err(e) = epoll::wait(
            &sh.epoll,
            rustix::buffer::spare_capacity(&mut events),
            Some(&tick),
        ) {
            if e != rustix::io::Errno::INTR {
                tracing::warn!("nbd: epoll: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for ev in &events {
            match ev.data.u64() {
                KEY_LISTENER => accept_all(&l, &sh, &mut next_id),
                KEY_WAKE => sh.wake.drain(),
                id => {
                    let c = lock(&sh.idle).remove(&id);
                    if let Some(c) = c {
                        let _ = epoll::delete(&sh.epoll, &c.rs);
                        sh.serve(c);
                    }
                }
            }
        }
        expire_handshakes(&sh);
    }
}

/// Accepts every pending connection, refusing those over the limit.
fn accept_all(l: &Listener, sh: &Arc<Shared>, next_id: &mut u64) {
    loop {
        let (mut rs, ws, conn) = match l.accept() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                // Out of descriptors, say: the connection waits in the
                // backlog for a later turn.
                tracing::warn!("nbd: accept: {e}");
                return;
            }
        };
        let open = lock(&sh.conns).len();
        if open >= sh.limits.max_connections {
            sh.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("nbd: connection refused: {open} open, the limit");
            conn.shutdown();
            continue;
        }
        sh.stats.connections.fetch_add(1, Ordering::Relaxed);
        // The server speaks first; 18 bytes fit any new socket's buffer.
        if let Err(e) = rs.write_all(&hello()) {
            tracing::info!("nbd: connection closed: {e}");
            continue;
        }
        let id = *next_id;
        *next_id += 1;
        lock(&sh.conns).insert(
            id,
            Tracked {
                conn,
                negotiated: false,
                expired: false,
                deadline: std::time::Instant::now() + sh.limits.handshake_timeout,
            },
        );
        sh.park(Idle {
            id,
            rs,
            ws,
            export: None,
        });
    }
}

/// Closes connections whose handshake outlived its deadline: an idle one
/// here, one in negotiation by shutting its socket (its worker then ends).
fn expire_handshakes(sh: &Shared) {
    let now = std::time::Instant::now();
    let late: Vec<u64> = {
        let mut conns = lock(&sh.conns);
        conns
            .iter_mut()
            .filter(|(_, t)| !t.negotiated && !t.expired && now >= t.deadline)
            .map(|(&id, t)| {
                t.expired = true;
                t.conn.shutdown();
                id
            })
            .collect()
    };
    for id in late {
        sh.stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            "nbd: connection closed: no handshake within {:?}",
            sh.limits.handshake_timeout
        );
        let c = lock(&sh.idle).remove(&id);
        if let Some(c) = c {
            let _ = rustix::event::epoll::delete(&sh.epoll, &c.rs);
            sh.close(id);
        }
    }
}

/// A stream whose next bytes can be looked at without waiting.
pub trait Ready {
    /// Copies the next bytes into `buf` without consuming them, if they
    /// have arrived; how many (0 if none have).
    fn peek(&self, buf: &mut [u8]) -> usize;
    /// Marks reads from now on as at a request boundary (`on`) or inside
    /// a request: a stream with a read timeout reports a timeout only at a
    /// boundary (see [`Limits::idle_after`]).
    fn boundary(&mut self, _on: bool) {}
}

fn peek_now(fd: impl std::os::fd::AsFd, buf: &mut [u8]) -> usize {
    use rustix::net::RecvFlags;
    rustix::net::recv(fd, buf, RecvFlags::PEEK | RecvFlags::DONTWAIT).map_or(0, |(n, _)| n)
}

impl Ready for TcpStream {
    fn peek(&self, buf: &mut [u8]) -> usize {
        peek_now(self, buf)
    }
}

impl Ready for UnixStream {
    fn peek(&self, buf: &mut [u8]) -> usize {
        peek_now(self, buf)
    }
}

/// A socket readable and writable (TCP or Unix).
pub trait ReadWrite: Read + Write + Ready + Send + std::os::fd::AsFd {}
impl<T: Read + Write + Ready + Send + std::os::fd::AsFd> ReadWrite for T {}

impl Ready for Box<dyn ReadWrite> {
    fn peek(&self, buf: &mut [u8]) -> usize {
        (**self).peek(buf)
    }
}

/// An in-memory duplex stream for fuzzing: reads come from a byte slice,
/// writes are discarded.
struct FuzzStream<'a> {
    input: &'a [u8],
}

impl Read for FuzzStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Ready for FuzzStream<'_> {
    fn peek(&self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        n
    }
}

impl Write for FuzzStream<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Fuzzing entry point: feeds arbitrary bytes to the handshake and then the
/// transmission phase against a small in-memory export (inline execution).
/// Must never panic or hang; errors are the expected outcome.
pub fn fuzz_stream(data: &[u8]) {
    let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(64 << 10, 512, false));
    let exports = [Export {
        name: "fuzz".into(),
        description: String::new(),
        dev,
    }];
    let mut s = FuzzStream { input: data };
    if let Ok(Negotiated::Go(e)) = handshake(&mut s, &exports) {
        let w = Arc::new(Mutex::new(io::sink()));
        let _ = transmission(s, w, &e, 0);
    }
}
