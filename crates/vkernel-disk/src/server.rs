//! The IPdisk V service: SCSI commands in V messages, executed against a
//! backing store, through derived virtual devices.
//!
//! The server runs in a [`vkernel::service::WorkerPool`]: one registered
//! pid (the *dispatcher*) receives every request and Forwards it to an
//! idle *worker* process, so several commands are in flight at once
//! (tagged queueing: each command is its own exchange). Small commands
//! run in the dispatcher itself ([`INLINE_BYTES`]). A worker receives the request with the first part of any data-out
//! segment appended, pulls the rest with MoveFrom, executes, and answers
//! with the data-in appended to the reply (small) or by MoveTo (large).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vkernel::service::{Handler, PoolConfig, Request, WorkerPool};
use vkernel::MAX_APPEND;
use vkernel::{IpcError, Kernel, Message, Pid};

use crate::backing::Backing;
use crate::dvd::{AccessError, Dvd, DvdError, View};
use crate::msg::{self, Response};
use crate::scsi::{self, Action, DeviceInfo, Sense};

/// Errors starting a disk server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A process could not be created.
    #[error("creating a server process: {0}")]
    Ipc(#[from] IpcError),
    /// The block size is not a power of two ≥ 512, or the store is smaller than a block.
    #[error("bad geometry: {0}")]
    Geometry(String),
}

/// How a disk server is set up.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Logical id to register the dispatcher under (GetPid), if any.
    pub logical_id: Option<u32>,
    /// Worker processes (commands executed at once).
    pub workers: usize,
    /// Logical block size (a power of two ≥ 512).
    pub block_size: u32,
    /// The owner key (opens DVD 0 and manages DVDs).
    pub owner_key: Option<u64>,
    /// The owner pid (may manage DVDs without a key).
    pub owner_pid: Option<Pid>,
    /// Unit serial number reported in VPD 0x80.
    pub serial: String,
    /// Requests queued at the dispatcher when every worker is busy; beyond
    /// this the dispatcher answers Busy.
    pub queue: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            logical_id: None,
            workers: 8,
            block_size: 512,
            owner_key: None,
            owner_pid: None,
            serial: "VK0000000001".into(),
            queue: 1024,
        }
    }
}

/// Counters of a disk server.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// SCSI commands executed (any status).
    pub commands: AtomicU64,
    /// Commands answered with CHECK CONDITION.
    pub check_conditions: AtomicU64,
    /// Requests refused before execution (handle, policy, malformed).
    pub refused: AtomicU64,
    /// Bytes read from the store for clients.
    pub bytes_read: AtomicU64,
    /// Bytes written to the store for clients.
    pub bytes_written: AtomicU64,
    /// Durability points (SYNCHRONIZE CACHE and FUA writes).
    pub syncs: AtomicU64,
    /// Workers executing a request right now.
    pub busy: AtomicU64,
    /// Most workers ever executing requests at the same time.
    pub peak_busy: AtomicU64,
}

struct Shared {
    backing: Backing,
    access: Mutex<crate::dvd::Access>,
    base: DeviceInfo,
    stats: ServerStats,
}

impl Shared {
    fn access(&self) -> MutexGuard<'_, crate::dvd::Access> {
        match self.access.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn info_for(&self, v: &View) -> DeviceInfo {
        let mut i = self.base.clone();
        i.blocks = v.blocks;
        i.read_only = !v.writable;
        if v.dvd != 0 {
            i.serial = format!("{}-{}", self.base.serial, v.dvd);
            i.naa ^= u64::from(v.dvd) << 8;
        }
        i
    }
}

/// A running disk server. Dropping it does not stop it; the processes end
/// when their logical host shuts down.
pub struct DiskServer {
    pool: WorkerPool,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DiskServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskServer")
            .field("pid", &self.pool.pid())
            .finish()
    }
}

impl DiskServer {
    /// Starts a disk server on `kernel` over `backing`.
    pub fn start(
        kernel: &Kernel,
        backing: Backing,
        cfg: ServerConfig,
    ) -> Result<DiskServer, ServerError> {
        let bs = cfg.block_size;
        if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
            return Err(ServerError::Geometry(format!(
                "block size {bs} must be a power of two in 512..=65536"
            )));
        }
        let blocks = backing.len() / u64::from(bs);
        if blocks == 0 {
            return Err(ServerError::Geometry(format!(
                "{} bytes is less than one {bs}-byte block",
                backing.len()
            )));
        }
        let mut base = DeviceInfo::new(blocks, bs);
        base.serial = cfg.serial.clone();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 32;
        base.naa = 0x5000_0000_0000_0000 | (seed & 0xffff_ffff);
        let shared = Arc::new(Shared {
            backing,
            access: Mutex::new(crate::dvd::Access::new(
                blocks,
                cfg.owner_key,
                cfg.owner_pid,
                seed,
            )),
            base,
            stats: ServerStats::default(),
        });
        let pool = WorkerPool::start(
            kernel,
            PoolConfig {
                name: "ipdisk".into(),
                workers: cfg.workers,
                queue: cfg.queue,
                idle_code: msg::IDLE,
                inline_upto: INLINE_BYTES,
                logical_id: cfg.logical_id,
                worker_spin: None,
            },
            shared.clone(),
        )?;
        Ok(DiskServer { pool, shared })
    }

    /// The pid clients send to (the dispatcher).
    pub fn pid(&self) -> Pid {
        self.pool.pid()
    }

    /// Blocks of the whole device.
    pub fn blocks(&self) -> u64 {
        self.shared.base.blocks
    }

    /// Block size.
    pub fn block_size(&self) -> u32 {
        self.shared.base.block_size
    }

    /// The backing store's description.
    pub fn backing(&self) -> &str {
        self.shared.backing.describe()
    }

    /// Defines or changes a DVD locally (as the owner would).
    pub fn define_dvd(&self, d: Dvd) -> Result<u32, DvdError> {
        self.shared.access().define(d)
    }

    /// Revokes a DVD locally.
    pub fn revoke_dvd(&self, id: u32) -> Result<(), DvdError> {
        self.shared.access().revoke(id)
    }

    /// The DVDs in force.
    pub fn dvds(&self) -> Vec<Dvd> {
        self.shared.access().list().cloned().collect()
    }

    /// Counters.
    pub fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }

    /// Waits for the server's threads (they end when the host shuts down).
    pub fn join(self) {
        self.pool.join();
    }
}

/// Whether a SCSI request or batch might wait on the device (a sync, a
/// FUA write, a deallocation): such requests go to a worker, so the
/// dispatcher never stalls behind a disk. Unknown means yes.
fn may_wait(info: &DeviceInfo, m: &Message, appended: &[u8]) -> bool {
    let waits = |cdb: &[u8; 16]| {
        matches!(
            scsi::decode(info, cdb),
            Ok(Action::Sync(_)
                | Action::Write { fua: true, .. }
                | Action::Unmap { .. }
                | Action::WriteSame { .. })
        )
    };
    let n = match msg::Request::decode(m) {
        Some(msg::Request::Scsi { cdb, .. }) => return waits(&cdb),
        Some(msg::Request::Batch { commands, .. }) => commands as usize,
        _ => return true,
    };
    if n == 0 || n > msg::MAX_BATCH || appended.len() < n * msg::BATCH_ENTRY {
        return true;
    }
    (0..n).any(|k| {
        msg::BatchEntry::decode(&appended[k * msg::BATCH_ENTRY..]).is_none_or(|e| waits(&e.cdb))
    })
}

impl Handler for Shared {
    type Scratch = Bufs;

    fn handle(&self, r: Request<'_>, bufs: &mut Bufs) -> Result<(), IpcError> {
        let req = Req { r, sh: self };
        let now = self.stats.busy.fetch_add(1, Ordering::AcqRel) + 1;
        self.stats.peak_busy.fetch_max(now, Ordering::AcqRel);
        let res = req.handle(bufs);
        self.stats.busy.fetch_sub(1, Ordering::AcqRel);
        bufs.trim();
        res
    }

    fn failed(&self) -> Message {
        refuse(Response::Failed)
    }

    fn busy(&self) -> Message {
        refuse(Response::Busy)
    }

    /// Small SCSI commands run in the dispatcher: a hand-off to a worker
    /// would cost a wake-up more than the command itself. A client on
    /// this logical host moves its data by memory copies (no datagrams,
    /// no acknowledgements to wait for): with a RAM store its larger
    /// commands run here too. A command that may wait on the device never
    /// does, so the dispatcher does not stall behind a disk.
    fn runs_inline(&self, r: &Request<'_>) -> bool {
        let m = &r.message;
        let limit = if r.from.host() == r.process.pid().host() && self.backing.in_memory() {
            LOCAL_INLINE_BYTES
        } else {
            INLINE_BYTES
        };
        matches!(m.code(), msg::SCSI | msg::SCSI_BATCH)
            && (m.seg_len() as usize) <= limit
            && (self.backing.in_memory() || !may_wait(&self.base, m, r.appended))
    }
}

/// One request being executed, with the server's state.
struct Req<'a> {
    r: Request<'a>,
    sh: &'a Shared,
}

/// SCSI commands and batches whose segment is at most this large run in
/// the dispatcher itself (their data fits a datagram or two each way).
pub const INLINE_BYTES: usize = 128 << 10;

/// The same for clients on the disk's own logical host when the store is
/// in RAM: their data phase is memory copies.
pub const LOCAL_INLINE_BYTES: usize = 1 << 20;

/// Largest segment of one SCSI_BATCH (entries, data-out and data-in).
pub const MAX_BATCH_SEGMENT: usize = 16 << 20;

/// Bounds on one command's data phase.
#[derive(Clone, Copy)]
struct Caps {
    /// Data-out bytes available.
    out: u64,
    /// Data-in bytes the initiator has room for.
    data_in: u64,
}

/// What one SCSI command came to.
enum Outcome {
    /// Not executed (the service response).
    Refused(Response),
    /// CHECK CONDITION.
    Check(Sense),
    /// GOOD; data-in bytes left in the buffer, if the command returns data.
    Good { data_in: Option<usize> },
    /// GOOD; the data-in is the store's `n` bytes at `off`, to be sent from
    /// where they are (a large READ of a mapped RAM store, asked for with
    /// `in_place`).
    GoodInStore { off: u64, n: usize },
}

/// A worker's reusable buffers.
#[derive(Default)]
struct Bufs {
    a: Vec<u8>,
    b: Vec<u8>,
    c: Vec<u8>,
}

impl Bufs {
    /// Lets go of buffers grown by an unusually large command.
    fn trim(&mut self) {
        for v in [&mut self.a, &mut self.b, &mut self.c] {
            if v.capacity() > (16 << 20) {
                *v = Vec::new();
            }
        }
    }
}

fn refuse(resp: Response) -> Message {
    msg::status_reply(resp, 0)
}

fn access_response(e: AccessError) -> Response {
    match e {
        AccessError::BadHandle => Response::BadHandle,
        AccessError::Denied => Response::Denied,
        AccessError::NoSuchDvd => Response::NoSuchDvd,
    }
}

impl Req<'_> {
    fn reply(&self, r: &Message) -> Result<(), IpcError> {
        self.r.process.reply(r, self.r.from)
    }

    /// Delivers `data` into the sender's write segment and replies (a
    /// large READ's data goes ahead of the reply, with no wait for an
    /// acknowledgement: READs are idempotent).
    fn reply_data(&self, r: &Message, data: &[u8]) -> Result<(), IpcError> {
        if data.is_empty() {
            self.r.process.reply(r, self.r.from)
        } else {
            self.r.process.reply_with_segment(r, self.r.from, 0, data)
        }
    }

    /// Gathers `n` bytes of the sender's read segment: the appended part,
    /// then the rest by MoveFrom.
    fn gather(&self, buf: &mut Vec<u8>, n: usize) -> Result<(), IpcError> {
        // Not zeroed first: every byte is overwritten below (a MoveFrom
        // moves all it is asked for or fails, and a short one is refused),
        // so no earlier request's data can remain.
        if buf.len() < n {
            buf.resize(n, 0);
        }
        buf.truncate(n);
        self.gather_into(buf)
    }

    /// Fills `dst` with the first `dst.len()` bytes of the sender's
    /// segment: the appended part, then MoveFrom for the rest.
    fn gather_into(&self, dst: &mut [u8]) -> Result<(), IpcError> {
        let n = dst.len();
        let have = self.r.appended.len().min(n);
        dst[..have].copy_from_slice(&self.r.appended[..have]);
        if have < n
            && self
                .r
                .process
                .move_from(self.r.from, have as u32, &mut dst[have..])?
                != n - have
        {
            return Err(IpcError::OutOfBounds(self.r.from));
        }
        Ok(())
    }

    fn handle(&self, bufs: &mut Bufs) -> Result<(), IpcError> {
        let st = &self.sh.stats;
        let scratch = &mut bufs.a;
        let Some(req) = msg::Request::decode(&self.r.message) else {
            st.refused.fetch_add(1, Ordering::Relaxed);
            return self.reply(&refuse(Response::Malformed));
        };
        match req {
            msg::Request::Scsi { cdb, handle } => self.scsi(&cdb, handle, scratch),
            msg::Request::Batch {
                commands,
                data_in_at,
                handle,
            } => self.batch(commands as usize, data_in_at as usize, handle, bufs),
            msg::Request::Open { key, dvd } => {
                let r = self
                    .sh
                    .access()
                    .open_as(self.r.from, self.r.principal, dvd, key);
                match r {
                    Ok((handle, v)) => {
                        tracing::info!(
                            "ipdisk: {} opened DVD {dvd} (handle {handle:#x}, {} blocks{})",
                            self.r.from,
                            v.blocks,
                            if v.writable { "" } else { ", read-only" }
                        );
                        self.reply(
                            &msg::Opened {
                                handle,
                                blocks: v.blocks,
                                block_size: self.sh.base.block_size,
                                read_only: !v.writable,
                                owner: v.owner,
                            }
                            .encode(),
                        )
                    }
                    Err(e) => {
                        st.refused.fetch_add(1, Ordering::Relaxed);
                        tracing::info!("ipdisk: {} may not open DVD {dvd}: {e}", self.r.from);
                        self.reply(&refuse(access_response(e)))
                    }
                }
            }
            msg::Request::Close { handle } => {
                let r = self.sh.access().close(self.r.from, handle);
                if r.is_ok() {
                    tracing::info!("ipdisk: {} closed handle {handle:#x}", self.r.from);
                }
                self.reply(&refuse(match r {
                    Ok(()) => Response::Complete,
                    Err(e) => access_response(e),
                }))
            }
            msg::Request::DvdSet { handle }
            | msg::Request::DvdList { handle }
            | msg::Request::DvdRevoke { handle, .. } => self.manage(req, handle, scratch),
        }
    }

    fn manage(
        &self,
        req: msg::Request,
        handle: u32,
        scratch: &mut Vec<u8>,
    ) -> Result<(), IpcError> {
        let owner = match self
            .sh
            .access()
            .check_as(self.r.from, self.r.principal, handle)
        {
            Ok(v) => v.owner,
            Err(_) => false,
        };
        if !owner {
            self.sh.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                "ipdisk: {} may not manage DVDs (not the owner)",
                self.r.from
            );
            return self.reply(&refuse(Response::Denied));
        }
        let seg = self.r.message.seg_access();
        let seg_len = self.r.message.seg_len() as usize;
        match req {
            msg::Request::DvdSet { .. } => {
                let max =
                    crate::dvd::RECORD_HEAD + crate::dvd::MAX_ALLOW * crate::dvd::RECORD_ENTRY;
                if !seg.read || seg_len > max {
                    return self.reply(&refuse(Response::Malformed));
                }
                self.gather(scratch, seg_len)?;
                let d = match crate::dvd::Dvd::decode(scratch) {
                    Ok((d, _)) => d,
                    Err(_) => return self.reply(&refuse(Response::Malformed)),
                };
                self.reply(&match self.sh.access().define(d) {
                    Ok(id) => {
                        tracing::info!("ipdisk: the owner {} set DVD {id}", self.r.from);
                        msg::count_reply(id)
                    }
                    Err(DvdError::NoSuchDvd(_)) => refuse(Response::NoSuchDvd),
                    Err(_) => refuse(Response::Malformed),
                })
            }
            msg::Request::DvdList { .. } => {
                let (bytes, n) = {
                    let a = self.sh.access();
                    let mut b = Vec::new();
                    let mut n = 0u32;
                    for d in a.list() {
                        b.extend(d.encode());
                        n += 1;
                    }
                    (b, n)
                };
                if !seg.write || seg_len < bytes.len() {
                    let r = msg::list_reply(Response::Malformed, bytes.len() as u32, n);
                    return self.reply(&r);
                }
                let r = msg::list_reply(Response::Complete, bytes.len() as u32, n);
                self.reply_data(&r, &bytes)
            }
            msg::Request::DvdRevoke { dvd, .. } => {
                self.reply(&refuse(match self.sh.access().revoke(dvd) {
                    Ok(()) => {
                        tracing::info!("ipdisk: the owner {} revoked DVD {dvd}", self.r.from);
                        Response::Complete
                    }
                    Err(DvdError::NoSuchDvd(_)) => Response::NoSuchDvd,
                    Err(_) => Response::Malformed,
                }))
            }
            _ => self.reply(&refuse(Response::Malformed)),
        }
    }

    fn view(&self, handle: u32) -> Result<View, Response> {
        self.sh
            .access()
            .check_as(self.r.from, self.r.principal, handle)
            .map_err(|e| {
                self.sh.stats.refused.fetch_add(1, Ordering::Relaxed);
                access_response(e)
            })
    }

    fn scsi(&self, cdb: &[u8; 16], handle: u32, buf: &mut Vec<u8>) -> Result<(), IpcError> {
        let view = match self.view(handle) {
            Ok(v) => v,
            Err(r) => return self.reply(&refuse(r)),
        };
        let seg = self.r.message.seg_access();
        let seg_len = u64::from(self.r.message.seg_len());
        let caps = Caps {
            out: if seg.read { seg_len } else { 0 },
            data_in: if seg.write { seg_len } else { 0 },
        };
        let o = self.run_cdb(&view, cdb, caps, None, buf, true)?;
        match o {
            Outcome::Refused(r) => self.reply(&refuse(r)),
            Outcome::Check(s) => self.check(s),
            Outcome::GoodInStore { off, n } => {
                let good = msg::count_reply(n as u32);
                // Straight from the store into the datagrams (or, on this
                // host, the client's buffer): one copy fewer.
                match self
                    .sh
                    .backing
                    .with_slice(off, n, |d| self.reply_data(&good, d))
                {
                    Some(Ok(r)) => {
                        self.sh
                            .stats
                            .bytes_read
                            .fetch_add(n as u64, Ordering::Relaxed);
                        r
                    }
                    // (Cannot happen: run_cdb checked the range, and
                    // asks for this only of a mapped store.)
                    _ => {
                        self.sh
                            .stats
                            .check_conditions
                            .fetch_add(1, Ordering::Relaxed);
                        self.check(Sense::read_error())
                    }
                }
            }
            Outcome::Good { data_in } => {
                let good = msg::count_reply(data_in.unwrap_or(0) as u32);
                match data_in {
                    Some(n) => self.reply_data(&good, &buf[..n]),
                    None => self.reply(&good),
                }
            }
        }
    }

    /// Executes one CDB through `view`. Data-out comes from `out` if given
    /// (a batch's gathered data-out area), else from the sender's segment;
    /// data-in is left in `buf`. `caps` bounds both.
    fn run_cdb(
        &self,
        view: &View,
        cdb: &[u8; 16],
        caps: Caps,
        out: Option<&[u8]>,
        buf: &mut Vec<u8>,
        in_place: bool,
    ) -> Result<Outcome, IpcError> {
        let st = &self.sh.stats;
        st.commands.fetch_add(1, Ordering::Relaxed);
        let info = self.sh.info_for(view);
        let action = match scsi::decode(&info, cdb) {
            Ok(a) => a,
            Err(s) => return Ok(self.checked(s)),
        };
        let out_len = action.data_out_len(&info);
        if out_len > caps.out {
            st.refused.fetch_add(1, Ordering::Relaxed);
            return Ok(Outcome::Refused(Response::Malformed));
        }
        // The data-out bytes, gathered only when the command takes some.
        let data_out = |n: usize, buf: &mut Vec<u8>| -> Result<(), IpcError> {
            match out {
                Some(o) => {
                    buf.clear();
                    buf.extend_from_slice(&o[..n.min(o.len())]);
                    Ok(())
                }
                None => self.gather(buf, n),
            }
        };
        let bs = u64::from(info.block_size);
        let at = |lba: u64| (view.base + lba) * bs;
        let be = &self.sh.backing;
        let good = Outcome::Good { data_in: None };
        Ok(match action {
            Action::Good => good,
            Action::DataIn(d) => {
                let n = d.len().min(caps.data_in as usize);
                buf.clear();
                buf.extend_from_slice(&d[..n]);
                Outcome::Good { data_in: Some(n) }
            }
            Action::Read { range, .. } => {
                let n = (range.blocks * bs) as usize;
                if n as u64 > caps.data_in {
                    st.refused.fetch_add(1, Ordering::Relaxed);
                    return Ok(Outcome::Refused(Response::Malformed));
                }
                // Too large to travel with the reply: sent by MoveTo,
                // which can read the (mapped) store itself.
                if in_place && n > MAX_APPEND && be.is_mapped() {
                    return Ok(Outcome::GoodInStore {
                        off: at(range.lba),
                        n,
                    });
                }
                // Grown (zeroed) once, then overwritten in place: the read
                // fills exactly the `n` bytes the caller sends on.
                if buf.len() < n {
                    buf.resize(n, 0);
                }
                if let Err(e) = be.read_at(at(range.lba), &mut buf[..n]) {
                    tracing::warn!("ipdisk: read error: {e}");
                    return Ok(self.checked(Sense::read_error()));
                }
                st.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                Outcome::Good { data_in: Some(n) }
            }
            Action::Write { range, fua } => {
                let n = (range.blocks * bs) as usize;
                let r = match out {
                    // A batch's data is written in place, without a copy.
                    Some(o) => match o.get(..n) {
                        Some(d) => be.write_at(at(range.lba), d, fua),
                        None => return Ok(Outcome::Refused(Response::Malformed)),
                    },
                    // Too large to travel with the request: moved by
                    // MoveFrom straight into the (mapped) store, one copy
                    // fewer. A move that fails part way leaves part of the
                    // new data, as a failed SCSI WRITE may.
                    None if in_place && n > MAX_APPEND && be.is_mapped() => {
                        match be.with_slice_mut(at(range.lba), n, |d| self.gather_into(d)) {
                            Some(Ok(moved)) => {
                                moved?;
                                if fua {
                                    be.sync()
                                } else {
                                    Ok(())
                                }
                            }
                            Some(Err(e)) => Err(e),
                            None => return Ok(Outcome::Refused(Response::Malformed)),
                        }
                    }
                    None => {
                        data_out(n, buf)?;
                        be.write_at(at(range.lba), buf, fua)
                    }
                };
                if let Err(e) = r {
                    tracing::warn!("ipdisk: write error: {e}");
                    return Ok(self.checked(Sense::write_error()));
                }
                if fua {
                    st.syncs.fetch_add(1, Ordering::Relaxed);
                }
                st.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
                good
            }
            Action::Sync(_) => {
                if let Err(e) = be.sync() {
                    tracing::warn!("ipdisk: sync error: {e}");
                    return Ok(self.checked(Sense::write_error()));
                }
                st.syncs.fetch_add(1, Ordering::Relaxed);
                good
            }
            Action::Unmap { param_len } => {
                data_out(usize::from(param_len), buf)?;
                let ranges = match scsi::decode_unmap(&info, buf) {
                    Ok(r) => r,
                    Err(s) => return Ok(self.checked(s)),
                };
                for r in ranges {
                    if let Err(e) = be.zero(at(r.lba), r.blocks * bs, true) {
                        tracing::warn!("ipdisk: unmap error: {e}");
                        return Ok(self.checked(Sense::write_error()));
                    }
                }
                good
            }
            Action::WriteSame { range, unmap, ndob } => {
                buf.clear();
                if !ndob {
                    data_out(bs as usize, buf)?;
                }
                let zero = ndob || buf.iter().all(|&b| b == 0);
                let r = if zero {
                    be.zero(at(range.lba), range.blocks * bs, unmap)
                } else {
                    write_pattern(be, at(range.lba), range.blocks, buf)
                };
                if let Err(e) = r {
                    tracing::warn!("ipdisk: write same error: {e}");
                    return Ok(self.checked(Sense::write_error()));
                }
                st.bytes_written
                    .fetch_add(range.blocks * bs, Ordering::Relaxed);
                good
            }
        })
    }

    /// A SCSI_BATCH: every command in order against one view, one exchange.
    fn batch(&self, n: usize, din_at: usize, handle: u32, bufs: &mut Bufs) -> Result<(), IpcError> {
        let view = match self.view(handle) {
            Ok(v) => v,
            Err(r) => return self.reply(&refuse(r)),
        };
        let seg = self.r.message.seg_access();
        let seg_len = self.r.message.seg_len() as usize;
        let table = n * msg::BATCH_ENTRY;
        if n == 0
            || n > msg::MAX_BATCH
            || !seg.read
            || !seg.write
            || din_at < table
            || din_at > seg_len
            || seg_len > MAX_BATCH_SEGMENT
        {
            self.sh.stats.refused.fetch_add(1, Ordering::Relaxed);
            return self.reply(&refuse(Response::Malformed));
        }
        // Entries and data-out: appended, the rest by MoveFrom.
        let Bufs {
            a: req,
            b: wb,
            c: one,
        } = bufs;
        self.gather(req, din_at)?;
        // Write-back image: the entries, then the data-in area.
        let din_len = seg_len - din_at;
        wb.clear();
        wb.resize(table + din_len, 0);
        let mut used_in = 0usize;
        for k in 0..n {
            let Some(mut e) = msg::BatchEntry::decode(&req[k * msg::BATCH_ENTRY..]) else {
                break;
            };
            let (off, len) = (e.off as usize, e.len as usize);
            let end = off.saturating_add(len);
            let mut caps = Caps { out: 0, data_in: 0 };
            let mut out: &[u8] = &[];
            if len > 0 && off >= table && end <= din_at {
                caps.out = len as u64;
                out = &req[off..end];
            } else if len > 0 && off >= din_at && end <= seg_len {
                caps.data_in = len as u64;
            } else if len > 0 {
                e.result = msg::reply_word0(Response::Malformed, 0);
                e.encode(&mut wb[k * msg::BATCH_ENTRY..]);
                continue;
            }
            let o = self.run_cdb(&view, &e.cdb, caps, Some(out), one, false)?;
            e.transferred = 0;
            e.result = match o {
                Outcome::Refused(r) => msg::reply_word0(r, 0),
                Outcome::Check(s) => {
                    e.sense = s.to_bytes();
                    msg::reply_word0(Response::Complete, scsi::STATUS_CHECK_CONDITION)
                }
                // Never produced here: batches do not ask for `in_place`.
                Outcome::GoodInStore { .. } => msg::reply_word0(Response::Failed, 0),
                Outcome::Good { data_in } => {
                    if let Some(got) = data_in {
                        let at = table + (off - din_at);
                        wb[at..at + got].copy_from_slice(&one[..got]);
                        used_in = used_in.max(off - din_at + got);
                        e.transferred = got as u32;
                    } else if caps.out > 0 {
                        e.transferred = len as u32;
                    }
                    msg::reply_word0(Response::Complete, scsi::STATUS_GOOD)
                }
            };
            e.encode(&mut wb[k * msg::BATCH_ENTRY..]);
        }
        let good = msg::count_reply(n as u32);
        if din_at == table && table + used_in <= MAX_APPEND {
            // Entries and data-in are contiguous: one reply carries both.
            return self.r.process.reply_with_segment(
                &good,
                self.r.from,
                0,
                &wb[..table + used_in],
            );
        }
        if used_in > 0 {
            self.r
                .process
                .move_to(self.r.from, din_at as u32, &wb[table..table + used_in])?;
        }
        self.r
            .process
            .reply_with_segment(&good, self.r.from, 0, &wb[..table])
    }

    fn checked(&self, s: Sense) -> Outcome {
        self.sh
            .stats
            .check_conditions
            .fetch_add(1, Ordering::Relaxed);
        Outcome::Check(s)
    }

    fn check(&self, s: Sense) -> Result<(), IpcError> {
        self.reply(&msg::check_reply(&s.to_bytes()))
    }
}

/// Writes one block repeatedly over `blocks` blocks, 1 MiB at a time.
fn write_pattern(be: &Backing, off: u64, blocks: u64, block: &[u8]) -> std::io::Result<()> {
    let bs = block.len() as u64;
    let per = ((1u64 << 20) / bs).max(1);
    let buf: Vec<u8> = block
        .iter()
        .copied()
        .cycle()
        .take((per.min(blocks) * bs) as usize)
        .collect();
    let mut done = 0u64;
    while done < blocks {
        let k = per.min(blocks - done);
        be.write_at(off + done * bs, &buf[..(k * bs) as usize], false)?;
        done += k;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch_of(cdbs: &[[u8; 16]]) -> (Message, Vec<u8>) {
        let m = msg::Request::Batch {
            commands: cdbs.len() as u32,
            data_in_at: 0,
            handle: 0,
        }
        .encode();
        let mut b = vec![0u8; cdbs.len() * msg::BATCH_ENTRY];
        for (k, c) in cdbs.iter().enumerate() {
            msg::BatchEntry::new(c, 0, 0).encode(&mut b[k * msg::BATCH_ENTRY..]);
        }
        (m, b)
    }

    #[test]
    fn only_commands_that_cannot_wait_run_in_the_dispatcher() {
        let info = DeviceInfo::new(1024, 512);
        let read = scsi::cdb_rw16(false, 0, 8, false);
        let write = scsi::cdb_rw16(true, 0, 8, false);
        let fua = scsi::cdb_rw16(true, 0, 8, true);
        let sync = scsi::cdb_sync16(0, 0);
        let one = |c: &[u8; 16]| may_wait(&info, &msg::scsi_request(c, 1), &[]);
        assert!(!one(&read));
        assert!(!one(&write));
        assert!(one(&fua));
        assert!(one(&sync));
        let (m, b) = batch_of(&[read, write, read]);
        assert!(!may_wait(&info, &m, &b));
        let (m, b) = batch_of(&[read, fua]);
        assert!(may_wait(&info, &m, &b));
        // Entries that did not all arrive with the request: assume it waits.
        let (m, b) = batch_of(&[read, read]);
        assert!(may_wait(&info, &m, &b[..msg::BATCH_ENTRY]));
    }
}
