//! The transmission phase: requests read in batches by pumps, executed
//! on the device (merged into runs and device batches where they can be),
//! answered with simple replies.

use super::*;

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
pub(super) fn validate(e: &Export, r: &Request) -> Option<u32> {
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
pub(super) static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Spare buffers kept: enough for batches of small reads and a few large
/// ones, at most `SPARE_BYTES` in all (outside the memory budget, see
/// [`Limits::memory`]).
pub(super) const SPARE_COUNT: usize = 64;
pub(super) const SPARE_BYTES: usize = 32 << 20;

/// A buffer of `len` bytes for a READ's data, reused from earlier replies
/// when one is big enough. Not zeroed when reused: a READ that succeeds
/// overwrites every byte, and a failed one sends none.
pub(super) fn read_buf(len: usize) -> Vec<u8> {
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
pub(super) fn give_back(b: Vec<u8>) {
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
pub(super) fn execute(e: &Export, r: &Request, payload: Vec<u8>) -> (u32, Vec<u8>) {
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

pub(super) fn lock<W>(w: &Mutex<W>) -> std::sync::MutexGuard<'_, W> {
    match w.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// A simple reply's header.
pub(super) fn reply_head(cookie: u64, err: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&err.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h
}

pub(super) fn write_reply(
    w: &mut impl Write,
    cookie: u64,
    err: u32,
    data: &[u8],
) -> io::Result<()> {
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
pub(super) fn write_parts(w: &mut impl Write, parts: &mut [io::IoSlice<'_>]) -> io::Result<()> {
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
pub(super) fn write_run(w: &mut impl Write, each: &[(u64, usize)], data: &[u8]) -> io::Result<()> {
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
pub(super) type Batch = Vec<(Request, Vec<u8>)>;

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
pub(super) const PREALLOC_PAYLOAD: usize = 1 << 20;

/// The reading half of a connection, shared by its pumps.
pub(super) struct Reader<R> {
    r: io::BufReader<R>,
    /// DISC, end of stream, or an error: no more requests.
    done: bool,
}

/// Payload bytes the gateway holds for a request until its reply is
/// written (a READ past [`MAX_PAYLOAD`] is refused without any).
pub(super) fn cost(r: &Request) -> usize {
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
pub(super) fn read_one<R: Read>(
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
pub(super) fn data_of<'a>(r: &Request, payload: &'a [u8]) -> &'a [u8] {
    &payload[..(r.length as usize).min(payload.len())]
}

/// Fills `buf` from `r`: what is buffered first, then a large remainder
/// straight from the stream. (Through the buffer, a payload as large as
/// the buffer would be copied twice, since the buffer is never empty
/// after the request header: kernel to buffer, buffer to payload.) A
/// small remainder still goes through the buffer, which then also picks up
/// the requests behind it for the next batch.
pub(super) fn read_payload<R: Read>(r: &mut io::BufReader<R>, buf: &mut [u8]) -> io::Result<()> {
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
pub(super) const DIRECT_PAYLOAD: usize = 64 << 10;

/// Payload bytes a request moves (a TRIM's or WRITE_ZEROES' length moves
/// none).
pub(super) fn data_len(r: &Request) -> usize {
    if matches!(r.ty, cmd::READ | cmd::WRITE) {
        r.length as usize
    } else {
        0
    }
}

/// The payload size of the next request if it is already wholly buffered
/// (no waiting) and may join a batch.
pub(super) fn buffered_request(b: &[u8]) -> Option<usize> {
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
pub(super) fn peek_request(b: &[u8]) -> Option<Request> {
    let mut hdr = [0u8; 28];
    hdr.copy_from_slice(b.get(..28)?);
    parse_request(&hdr)
}

/// True if `r` continues `run` (large requests of one type, contiguous,
/// WRITEs with the same FUA flag) within [`MERGE_BYTES`].
pub(super) fn joins_run(r: &Request, run: &[(Request, Vec<u8>)]) -> bool {
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
pub(super) fn is_run(batch: &[(Request, Vec<u8>)], ty: u16) -> bool {
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
pub(super) fn extend_write_run<R: Read + Ready>(
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
pub(super) fn read_batch<R: Read + Ready>(
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
pub(super) fn batchable(e: &Export, r: &Request) -> bool {
    matches!(r.ty, cmd::READ | cmd::WRITE) && r.length <= BATCH_IO_MAX && validate(e, r).is_none()
}

/// What a batch's requests get back.
pub(super) enum Replies {
    /// (cookie, error, data) per request, in request order.
    Each(Vec<(u64, u32, Vec<u8>)>),
    /// Contiguous READs read as one: (cookie, length) per request in order,
    /// and their data back to back, or one error for all.
    Run(Vec<(u64, usize)>, Result<Vec<u8>, u32>),
}

/// Executes a batch: runs of small reads and writes go to the device
/// together, a run of contiguous large READs as one read, anything else
/// on its own, in order.
pub(super) fn execute_batch(e: &Export, mut batch: Batch) -> Replies {
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
pub(super) fn execute_each(e: &Export, batch: Batch) -> Vec<(u64, u32, Vec<u8>)> {
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
pub(super) enum Ended {
    /// DISC or end of stream.
    Done,
    /// No request came for a while (the stream's read timeout, at a
    /// request boundary); every request read has been answered.
    Idle,
}

/// [`transmission`] with a memory budget; with `idle`, it also returns
/// (as [`Ended::Idle`]) once a read at a request boundary times out.
pub(super) fn transmit<R, W>(
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

pub(super) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
