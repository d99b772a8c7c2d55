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

mod budget;
mod gateway;
mod handshake;
mod transmission;

pub use budget::*;
pub use gateway::*;
pub use handshake::*;
pub use transmission::*;

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
