//! The client side, a "virtual SCSI adapter": block read, write and flush
//! on an IPdisk (or one of its DVDs) with many commands in flight.
//!
//! A [`Client`] owns a pool of V processes; each command borrows one for
//! its exchange, so as many commands run at once as threads call the
//! client (up to the pool's depth). The caller's buffer is lent to the
//! server as the command's segment: no copy on this side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vkernel::message::IDEMPOTENT;
use vkernel::service::ClientPool;
use vkernel::{IpcError, Kernel, Message, Pid, Process, Scope, Segment};

use crate::dvd::{self, Dvd};
use crate::msg::{self, Response};
use crate::scsi::{self, Sense};

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The IPC failed (server gone, host timeout, ...).
    #[error("IPC: {0}")]
    Ipc(#[from] IpcError),
    /// The server refused the request before executing it.
    #[error("server: {0}")]
    Refused(Response),
    /// The command ended with CHECK CONDITION.
    #[error("CHECK CONDITION: {0}")]
    Check(Sense),
    /// The command ended with an unexpected status.
    #[error("SCSI status {0:#04x}")]
    Status(u8),
    /// The request does not fit the device (unaligned or out of range).
    #[error("{0}")]
    Invalid(String),
    /// An answer could not be decoded.
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The server went away and was not found again within the
    /// rediscovery budget (see [`Client::set_rediscover`]).
    #[error("the disk server is gone ({cause}) and was not found again within {budget:?}")]
    Gone {
        /// What showed it was gone.
        cause: Box<ClientError>,
        /// How long it was looked for.
        budget: Duration,
    },
}

impl ClientError {
    /// The sense data if the command ended with CHECK CONDITION.
    pub fn sense(&self) -> Option<Sense> {
        match self {
            ClientError::Check(s) => Some(*s),
            _ => None,
        }
    }
}

/// Data phase of a command.
pub enum Data<'a> {
    /// No data.
    None,
    /// Data-in: the server fills this buffer.
    In(&'a mut [u8]),
    /// Data-out: the server takes this data.
    Out(&'a [u8]),
}

/// One read or write of a [`Client::batch`].
pub enum BatchIo<'a> {
    /// Read into this buffer.
    Read(&'a mut [u8]),
    /// Write these bytes; with `fua`, durable before the batch returns.
    Write(&'a [u8], bool),
}

/// The outcome of a command that completed with GOOD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    /// Bytes transferred in the data phase.
    pub transferred: usize,
}

/// What OPEN answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Blocks visible through the handle.
    pub blocks: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Writes fail with DATA PROTECT.
    pub read_only: bool,
    /// The handle is the owner's.
    pub owner: bool,
}

/// How a client finds its server again after the server restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rediscover {
    /// The disk service's logical id, looked up with GetPid (any scope).
    pub logical_id: u32,
    /// Give up (and fail the command) after looking this long.
    pub budget: Duration,
}

/// What reopening needs, kept from [`Client::open_as`].
struct Reopen {
    find: Rediscover,
    dvd: u32,
    key: u64,
    /// Serializes rediscovery: one thread looks, the others then retry.
    lock: Mutex<()>,
}

/// The server's pid (high 32 bits) and the handle it gave (low 32), in
/// one word so a command reads a consistent pair without a lock.
fn pack(server: Pid, handle: u32) -> u64 {
    (u64::from(server.0) << 32) | u64::from(handle)
}

fn unpack(s: u64) -> (Pid, u32) {
    (Pid((s >> 32) as u32), s as u32)
}

/// A handle on an IPdisk view, usable from many threads at once.
pub struct Client {
    session: AtomicU64,
    geo: Geometry,
    max_transfer: u64,
    pool: ClientPool,
    /// Segment buffers for batches, reused: a fresh large allocation
    /// per batch would cost an mmap and its page faults each time.
    bufs: Mutex<Vec<Vec<u8>>>,
    reopen: Option<Reopen>,
    dvd: u32,
    key: u64,
    reconnects: AtomicU64,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server())
            .field("geometry", &self.geo)
            .finish()
    }
}

/// Pool depth used by [`Client::open`] callers that do not care.
pub const DEFAULT_DEPTH: usize = 16;

impl Client {
    /// Opens DVD `dvd` (0 = the whole device, owner only) of the disk
    /// server `server`, presenting `key` (0 = none), with `depth` processes
    /// created on `kernel` for commands in flight.
    pub fn open(
        kernel: &Kernel,
        server: Pid,
        dvd: u32,
        key: u64,
        depth: usize,
    ) -> Result<Client, ClientError> {
        Self::open_as(kernel, server, dvd, key, depth, 0)
    }

    /// Like [`Client::open`], with every command sent as V principal
    /// `principal` (DVDs may admit `user:principal`).
    pub fn open_as(
        kernel: &Kernel,
        server: Pid,
        dvd: u32,
        key: u64,
        depth: usize,
        principal: u32,
    ) -> Result<Client, ClientError> {
        let pool = ClientPool::new(kernel, depth, principal)?;
        let p = pool.take();
        let opened = open_handle(&p, server, dvd, key);
        pool.give(p);
        let (handle, geo) = opened?;
        let mut c = Client {
            session: AtomicU64::new(pack(server, handle)),
            geo,
            max_transfer: 1 << 20,
            pool,
            bufs: Mutex::new(Vec::new()),
            reopen: None,
            dvd,
            key,
            reconnects: AtomicU64::new(0),
        };
        // The transfer limit from the Block Limits VPD page.
        let mut b0 = [0u8; 64];
        c.command(&scsi::cdb_inquiry(Some(0xb0), 64), Data::In(&mut b0))?;
        let mtl = u32::from_be_bytes([b0[8], b0[9], b0[10], b0[11]]);
        if mtl > 0 {
            c.max_transfer = u64::from(mtl) * u64::from(geo.block_size);
        }
        Ok(c)
    }

    /// The view's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Size of the view in bytes.
    pub fn size(&self) -> u64 {
        self.geo.blocks * u64::from(self.geo.block_size)
    }

    /// The server's pid (the one found last, after a restart).
    pub fn server(&self) -> Pid {
        unpack(self.session.load(Ordering::Acquire)).0
    }

    /// Finds the server again by name when it goes away (its pid no
    /// longer exists, its host stops answering, or it no longer knows the
    /// handle): the view is reopened with the same DVD and key and the
    /// command re-sent. Block commands are idempotent (a READ, or a WRITE
    /// of the same data to the same blocks, may run twice with the same
    /// result), so every command is retried; after `find.budget` without
    /// finding it the command fails with [`ClientError::Gone`].
    pub fn set_rediscover(&mut self, find: Rediscover) {
        self.reopen = Some(Reopen {
            find,
            dvd: self.dvd,
            key: self.key,
            lock: Mutex::new(()),
        });
    }

    /// How many times the server was found again after going away.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Does this failure of an exchange with `server` mean the server
    /// went away (as opposed to refusing the command)?
    fn gone(e: &IpcError, server: Pid) -> bool {
        matches!(e, IpcError::NoSuchProcess(p) if *p == server) || matches!(e, IpcError::Timeout(_))
    }

    /// Looks for the server until it answers OPEN again or the budget is
    /// spent. Returns at once if another thread already replaced `old`.
    fn rediscover(&self, old: u64, cause: ClientError) -> Result<(), ClientError> {
        let Some(r) = &self.reopen else {
            return Err(cause);
        };
        let _one = match r.lock.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if self.session.load(Ordering::Acquire) != old {
            return Ok(());
        }
        tracing::warn!(
            "disk server {} is gone ({cause}); looking for it again",
            unpack(old).0
        );
        let t0 = Instant::now();
        let mut pause = Duration::from_millis(20);
        let p = self.pool.take();
        let found = loop {
            let attempt = p
                .get_pid(r.find.logical_id, Scope::Any)
                .map_err(ClientError::from)
                .and_then(|pid| {
                    if pid.is_none() {
                        return Err(ClientError::Ipc(IpcError::NoSuchProcess(pid)));
                    }
                    open_handle(&p, pid, r.dvd, r.key).map(|(h, g)| (pid, h, g))
                });
            match attempt {
                Ok((pid, h, g))
                    if g.blocks == self.geo.blocks && g.block_size == self.geo.block_size =>
                {
                    break Ok((pid, h))
                }
                Ok((pid, _, g)) => {
                    break Err(ClientError::Malformed(format!(
                        "the disk found again as {pid} has {} blocks of {} bytes, not {} of {}",
                        g.blocks, g.block_size, self.geo.blocks, self.geo.block_size
                    )))
                }
                // Found but refused: the policy changed; looking on won't help.
                Err(e @ ClientError::Refused(_)) => break Err(e),
                Err(_) if t0.elapsed() < r.find.budget => {
                    std::thread::sleep(pause.min(r.find.budget.saturating_sub(t0.elapsed())));
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(_) => {
                    break Err(ClientError::Gone {
                        cause: Box::new(cause),
                        budget: r.find.budget,
                    })
                }
            }
        };
        self.pool.give(p);
        let (pid, h) = found?;
        self.session.store(pack(pid, h), Ordering::Release);
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "disk server found again as {pid} after {:.0} ms; retrying",
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// Largest transfer of one command in bytes.
    pub fn max_transfer(&self) -> u64 {
        self.max_transfer
    }

    /// Sends `m` (whose word 5 is set to the handle) to the server with
    /// `seg` (the first `append` bytes travelling with it if given),
    /// finding the server again and re-sending if it went away.
    fn exchange(
        &self,
        m: &mut Message,
        mut seg: Option<Segment<'_>>,
        append: Option<usize>,
    ) -> Result<(), ClientError> {
        let request = *m;
        loop {
            let s = self.session.load(Ordering::Acquire);
            let (server, handle) = unpack(s);
            *m = request;
            msg::set_handle(m, handle);
            let p = self.pool.take();
            let r = match (&mut seg, append) {
                (Some(sg), Some(n)) => p.send_with_segment_append(m, server, reborrow(sg), n),
                (Some(sg), None) => p.send_with_segment(m, server, reborrow(sg)),
                (None, _) => p.send(m, server),
            };
            self.pool.give(p);
            let bad_handle =
                r.is_ok() && msg::reply_status(m).0 == Response::BadHandle && self.reopen.is_some();
            match r {
                Err(e) if self.reopen.is_some() && Self::gone(&e, server) => {
                    self.rediscover(s, e.into())?
                }
                // A server restarted under the same pid knows no handles.
                Ok(_) if bad_handle => {
                    self.rediscover(s, ClientError::Refused(Response::BadHandle))?
                }
                r => {
                    r?;
                    return Ok(());
                }
            }
        }
    }

    /// Executes one SCSI command (CDB of at most 16 bytes).
    pub fn command(&self, cdb: &[u8], data: Data<'_>) -> Result<Done, ClientError> {
        let mut m = msg::scsi_request(cdb, 0);
        let idempotent = !matches!(data, Data::Out(_))
            && !matches!(
                cdb.first(),
                Some(&scsi::op::WRITE_SAME_16) | Some(&scsi::op::UNMAP)
            );
        if idempotent {
            m.set_flag(IDEMPOTENT, true);
        }
        // Data-out larger than one datagram travels only by the server's
        // MoveFrom, which lands it straight in place: a first part
        // appended to the request would be copied four times more on the
        // way (into the datagram, the alien, the worker's buffer, the store).
        if matches!(data, Data::Out(b) if b.len() > vkernel::MAX_APPEND) {
            m.set_flag(vkernel::message::NO_APPEND, true);
        }
        let seg = match data {
            Data::None => None,
            Data::In([]) | Data::Out([]) => None,
            Data::In(b) => Some(Segment::Write(b)),
            Data::Out(b) => Some(Segment::Read(b)),
        };
        self.exchange(&mut m, seg, None)?;
        let (resp, status) = msg::reply_status(&m);
        if resp != Response::Complete {
            return Err(ClientError::Refused(resp));
        }
        match status {
            scsi::STATUS_GOOD => Ok(Done {
                transferred: msg::reply_count(&m) as usize,
            }),
            scsi::STATUS_CHECK_CONDITION => {
                let b = msg::reply_sense(&m);
                Sense::from_bytes(&b)
                    .map(|s| Err(ClientError::Check(s)))
                    .unwrap_or_else(|| Err(ClientError::Malformed("sense data".into())))
            }
            s => Err(ClientError::Status(s)),
        }
    }

    /// Runs reads and writes (each at a block-aligned byte offset) as
    /// batches of SCSI commands, [`msg::MAX_BATCH`] commands and at most
    /// the transfer limit of data per exchange, executed in order. The
    /// outer error means an exchange failed (its commands' outcomes are
    /// unknown); otherwise each command has its own result.
    pub fn batch(
        &self,
        ios: &mut [(u64, BatchIo<'_>)],
    ) -> Result<Vec<Result<(), ClientError>>, ClientError> {
        let mut results = Vec::with_capacity(ios.len());
        let limit = self.chunk_bytes().min(crate::server::MAX_BATCH_SEGMENT / 2);
        let mut i = 0;
        while i < ios.len() {
            // As many commands as fit one exchange (at least one).
            let mut j = i;
            let mut bytes = 0usize;
            while j < ios.len() && j - i < msg::MAX_BATCH {
                let n = match &ios[j].1 {
                    BatchIo::Read(b) => b.len(),
                    BatchIo::Write(d, _) => d.len(),
                };
                if j > i && bytes + n > limit {
                    break;
                }
                bytes += n;
                j += 1;
            }
            if j == i + 1 {
                // A lone command lends its own buffer: no copy into a
                // batch segment.
                let (off, io) = &mut ios[i];
                results.push(match io {
                    BatchIo::Read(b) => self.read(*off, b),
                    BatchIo::Write(d, fua) => self.write(*off, d, *fua),
                });
            } else {
                self.batch_once(&mut ios[i..j], &mut results)?;
            }
            i = j;
        }
        Ok(results)
    }

    fn batch_once(
        &self,
        ios: &mut [(u64, BatchIo<'_>)],
        results: &mut Vec<Result<(), ClientError>>,
    ) -> Result<(), ClientError> {
        let n = ios.len();
        let table = n * msg::BATCH_ENTRY;
        let mut out_len = 0usize;
        let mut in_len = 0usize;
        let mut cdbs = Vec::with_capacity(n);
        let mut valid = Vec::with_capacity(n);
        for (off, io) in ios.iter() {
            let (write, len, fua) = match io {
                BatchIo::Read(b) => (false, b.len(), false),
                BatchIo::Write(d, fua) => (true, d.len(), *fua),
            };
            match self.blocks_of(*off, len) {
                Ok((lba, blocks)) if len as u64 <= self.max_transfer => {
                    cdbs.push(scsi::cdb_rw16(write, lba, blocks as u32, fua));
                    valid.push(None);
                    if write {
                        out_len += len;
                    } else {
                        in_len += len;
                    }
                }
                Ok(_) => {
                    cdbs.push([0u8; 16]);
                    valid.push(Some(ClientError::Invalid(format!(
                        "{len} bytes exceed the {}-byte transfer limit",
                        self.max_transfer
                    ))));
                }
                Err(e) => {
                    cdbs.push([0u8; 16]);
                    valid.push(Some(e));
                }
            }
        }
        let din_at = table + out_len;
        let mut seg = self.take_buf();
        seg.clear();
        seg.resize(din_at + in_len, 0);
        let (mut o, mut d) = (table, din_at);
        let mut idempotent = true;
        for (k, (_, io)) in ios.iter().enumerate() {
            if valid[k].is_some() {
                // An invalid command goes as a TEST UNIT READY slot with no
                // data, whose result is ignored.
                msg::BatchEntry::new(&[0u8; 6], 0, 0).encode(&mut seg[k * msg::BATCH_ENTRY..]);
                continue;
            }
            let e = match io {
                BatchIo::Read(b) => {
                    let e = msg::BatchEntry::new(&cdbs[k], d as u32, b.len() as u32);
                    d += b.len();
                    e
                }
                BatchIo::Write(data, _) => {
                    seg[o..o + data.len()].copy_from_slice(data);
                    let e = msg::BatchEntry::new(&cdbs[k], o as u32, data.len() as u32);
                    o += data.len();
                    idempotent = false;
                    e
                }
            };
            e.encode(&mut seg[k * msg::BATCH_ENTRY..]);
        }
        let mut m = msg::Request::Batch {
            commands: n as u32,
            data_in_at: din_at as u32,
            handle: 0,
        }
        .encode();
        if idempotent {
            m.set_flag(IDEMPOTENT, true);
        }
        let r = self.exchange(&mut m, Some(Segment::ReadWrite(&mut seg)), Some(din_at));
        if let Err(e) = r {
            self.give_buf(seg);
            return Err(e);
        }
        let (resp, _) = msg::reply_status(&m);
        if resp != Response::Complete {
            self.give_buf(seg);
            return Err(ClientError::Refused(resp));
        }
        for (k, (_, io)) in ios.iter_mut().enumerate() {
            if let Some(e) = valid[k].take() {
                results.push(Err(e));
                continue;
            }
            let Some(e) = msg::BatchEntry::decode(&seg[k * msg::BATCH_ENTRY..]) else {
                results.push(Err(ClientError::Malformed("batch entry".into())));
                continue;
            };
            let (resp, status) = msg::split_word0(e.result);
            let r = if resp != Response::Complete {
                Err(ClientError::Refused(resp))
            } else if status == scsi::STATUS_CHECK_CONDITION {
                Err(Sense::from_bytes(&e.sense)
                    .map(ClientError::Check)
                    .unwrap_or_else(|| ClientError::Malformed("sense data".into())))
            } else if status != scsi::STATUS_GOOD {
                Err(ClientError::Status(status))
            } else {
                if let BatchIo::Read(b) = io {
                    let at = e.off as usize;
                    match seg.get(at..at + b.len()) {
                        Some(src) if e.transferred as usize == b.len() => b.copy_from_slice(src),
                        _ => {
                            results.push(Err(ClientError::Malformed("short batch read".into())));
                            continue;
                        }
                    }
                }
                Ok(())
            };
            results.push(r);
        }
        self.give_buf(seg);
        Ok(())
    }

    fn take_buf(&self) -> Vec<u8> {
        match self.bufs.lock() {
            Ok(mut g) => g.pop(),
            Err(p) => p.into_inner().pop(),
        }
        .unwrap_or_default()
    }

    fn give_buf(&self, b: Vec<u8>) {
        if b.capacity() > (32 << 20) {
            return;
        }
        match self.bufs.lock() {
            Ok(mut g) => g.push(b),
            Err(p) => p.into_inner().push(b),
        }
    }

    fn blocks_of(&self, off: u64, len: usize) -> Result<(u64, u64), ClientError> {
        let bs = u64::from(self.geo.block_size);
        if !off.is_multiple_of(bs) || !(len as u64).is_multiple_of(bs) {
            return Err(ClientError::Invalid(format!(
                "offset {off} and length {len} must be multiples of the {bs}-byte block"
            )));
        }
        Ok((off / bs, len as u64 / bs))
    }

    fn chunk_bytes(&self) -> usize {
        self.max_transfer.min(u64::from(u32::MAX)) as usize
    }

    /// Reads `buf.len()` bytes at byte offset `off` (block-aligned),
    /// split into commands of at most the transfer limit.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), ClientError> {
        let (mut lba, _) = self.blocks_of(off, buf.len())?;
        let bs = u64::from(self.geo.block_size);
        for chunk in buf.chunks_mut(self.chunk_bytes()) {
            let n = (chunk.len() as u64 / bs) as u32;
            let want = chunk.len();
            let done = self.command(&scsi::cdb_rw16(false, lba, n, false), Data::In(chunk))?;
            // Every byte must have come: callers may reuse buffers unzeroed.
            if done.transferred != want {
                return Err(ClientError::Malformed(format!(
                    "READ of {want} bytes transferred {}",
                    done.transferred
                )));
            }
            lba += u64::from(n);
        }
        Ok(())
    }

    /// Writes `data` at byte offset `off` (block-aligned); with `fua`, the
    /// data is durable when this returns.
    pub fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), ClientError> {
        let (mut lba, _) = self.blocks_of(off, data.len())?;
        let bs = u64::from(self.geo.block_size);
        for chunk in data.chunks(self.chunk_bytes()) {
            let n = (chunk.len() as u64 / bs) as u32;
            self.command(&scsi::cdb_rw16(true, lba, n, fua), Data::Out(chunk))?;
            lba += u64::from(n);
        }
        Ok(())
    }

    /// SYNCHRONIZE CACHE over the whole view: every completed write is durable.
    pub fn flush(&self) -> Result<(), ClientError> {
        self.command(&scsi::cdb_sync16(0, 0), Data::None)
            .map(|_| ())
    }

    /// Deallocates `len` bytes at `off` (UNMAP); they read back as zeros.
    pub fn unmap(&self, off: u64, len: u64) -> Result<(), ClientError> {
        let (lba, blocks) = self.blocks_of(off, usize::try_from(len).unwrap_or(usize::MAX))?;
        let per = u64::from(scsi::MAX_UNMAP_BLOCKS);
        let mut ranges = Vec::new();
        let mut at = lba;
        let end = lba + blocks;
        while at < end {
            let n = per.min(end - at);
            ranges.push((at, n as u32));
            at += n;
        }
        for group in ranges.chunks(scsi::MAX_UNMAP_DESCRIPTORS as usize) {
            let (cdb, params) = scsi::unmap_request(group);
            self.command(&cdb, Data::Out(&params))?;
        }
        Ok(())
    }

    /// Writes zeros over `len` bytes at `off` (WRITE SAME(16), no data
    /// buffer), deallocating if `unmap`.
    pub fn write_zeroes(&self, off: u64, len: u64, unmap: bool) -> Result<(), ClientError> {
        let (lba, blocks) = self.blocks_of(off, usize::try_from(len).unwrap_or(usize::MAX))?;
        let per = (1u64 << 30) / u64::from(self.geo.block_size);
        let mut at = lba;
        let end = lba + blocks;
        while at < end {
            let n = per.min(end - at);
            self.command(
                &scsi::cdb_write_same16(at, n as u32, unmap, true),
                Data::None,
            )?;
            at += n;
        }
        Ok(())
    }

    /// Standard INQUIRY data: (vendor, product, revision).
    pub fn inquiry(&self) -> Result<(String, String, String), ClientError> {
        let mut d = [0u8; 36];
        self.command(&scsi::cdb_inquiry(None, 36), Data::In(&mut d))?;
        let s = |r: &[u8]| String::from_utf8_lossy(r).trim_end().to_string();
        Ok((s(&d[8..16]), s(&d[16..32]), s(&d[32..36])))
    }

    /// The unit serial number (VPD page 0x80).
    pub fn serial(&self) -> Result<String, ClientError> {
        let mut d = [0u8; 128];
        let done = self.command(&scsi::cdb_inquiry(Some(0x80), 128), Data::In(&mut d))?;
        let n = (u16::from_be_bytes([d[2], d[3]]) as usize + 4).min(done.transferred);
        Ok(String::from_utf8_lossy(d.get(4..n).unwrap_or(&[])).into_owned())
    }

    /// READ CAPACITY(16): (blocks, block size).
    pub fn capacity(&self) -> Result<(u64, u32), ClientError> {
        let mut d = [0u8; 32];
        self.command(&scsi::cdb_read_capacity16(), Data::In(&mut d))?;
        let mut last = [0u8; 8];
        last.copy_from_slice(&d[0..8]);
        Ok((
            u64::from_be_bytes(last) + 1,
            u32::from_be_bytes([d[8], d[9], d[10], d[11]]),
        ))
    }

    fn manage(&self, m: &mut Message, seg: Option<Segment<'_>>) -> Result<(), ClientError> {
        self.exchange(m, seg, None)?;
        match msg::reply_status(m).0 {
            Response::Complete => Ok(()),
            r => Err(ClientError::Refused(r)),
        }
    }

    /// Owner: defines (id 0) or changes a DVD; returns its id.
    pub fn set_dvd(&self, d: &Dvd) -> Result<u32, ClientError> {
        let rec = d.encode();
        let mut m = msg::Request::DvdSet { handle: 0 }.encode();
        self.manage(&mut m, Some(Segment::Read(&rec)))?;
        Ok(msg::reply_count(&m))
    }

    /// Owner: revokes a DVD.
    pub fn revoke_dvd(&self, id: u32) -> Result<(), ClientError> {
        let mut m = msg::Request::DvdRevoke { dvd: id, handle: 0 }.encode();
        self.manage(&mut m, None)
    }

    /// Owner: the DVDs in force.
    pub fn list_dvds(&self) -> Result<Vec<Dvd>, ClientError> {
        let mut size = 64 << 10;
        loop {
            let mut buf = vec![0u8; size];
            let mut m = msg::Request::DvdList { handle: 0 }.encode();
            m.set_flag(IDEMPOTENT, true);
            let r = self.manage(&mut m, Some(Segment::Write(&mut buf)));
            let need = msg::reply_list_bytes(&m) as usize;
            match r {
                Ok(()) => {
                    return dvd::decode_list(buf.get(..need).unwrap_or(&[]))
                        .map_err(|e| ClientError::Malformed(e.to_string()))
                }
                Err(ClientError::Refused(Response::Malformed)) if need > size => size = need,
                Err(e) => return Err(e),
            }
        }
    }

    /// Forgets the handle at the server.
    pub fn close(self) -> Result<(), ClientError> {
        let mut m = msg::Request::Close { handle: 0 }.encode();
        self.manage(&mut m, None)
    }
}

/// A shorter-lived view of a segment, for a re-send.
fn reborrow<'b>(s: &'b mut Segment<'_>) -> Segment<'b> {
    match s {
        Segment::Read(b) => Segment::Read(b),
        Segment::Write(b) => Segment::Write(b),
        Segment::ReadWrite(b) => Segment::ReadWrite(b),
    }
}

/// OPEN: the handle and geometry of DVD `dvd` of `server`.
fn open_handle(
    p: &Process,
    server: Pid,
    dvd: u32,
    key: u64,
) -> Result<(u32, Geometry), ClientError> {
    let mut m = msg::Request::Open { key, dvd }.encode();
    p.send(&mut m, server)?;
    let o = msg::Opened::decode(&m).map_err(ClientError::Refused)?;
    let geo = Geometry {
        blocks: o.blocks,
        block_size: o.block_size,
        read_only: o.read_only,
        owner: o.owner,
    };
    if !geo.block_size.is_power_of_two() || geo.block_size < 512 {
        return Err(ClientError::Malformed(format!(
            "block size {}",
            geo.block_size
        )));
    }
    Ok((o.handle, geo))
}
