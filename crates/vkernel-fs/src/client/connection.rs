//! The exchange with the server: the pool's processes, rediscovery of a
//! restarted server and reopening the handles it lost, and the handle
//! table that makes it possible.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vkernel::{IpcError, Message, Pid, Scope, Segment};

use super::{lock, Client, ClientError, Fh, Opened};
use crate::vio::{self, Errno, Owner, Request, ATTR_LEN};

impl Client {
    /// Records a handle the server gave for `path`; returns the client's.
    pub(super) fn track(&self, server_fh: u32, path: &[u8], flags: i32, dir: bool) -> Fh {
        let Some(r) = &self.reopen else {
            return Fh(server_fh);
        };
        let mut h = lock(&r.handles);
        let mut id = h.next;
        while id == 0 || h.open.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        h.next = id.wrapping_add(1);
        h.open.insert(
            id,
            Opened {
                server_fh,
                path: path.to_vec(),
                flags: flags & !(libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL),
                dir,
                dirty: false,
                broken: false,
            },
        );
        Fh(id)
    }

    /// One exchange: `m` is the request and becomes the reply; the status
    /// is checked. With rediscovery on, handles are translated and a
    /// server that went away is looked for again.
    pub(super) fn exchange(
        &self,
        m: &mut Message,
        mut seg: Option<Segment<'_>>,
    ) -> Result<usize, ClientError> {
        let Some(r) = &self.reopen else {
            return self.exchange_once(m, seg, self.server());
        };
        let request = *m;
        let code = vio::code(&request);
        let handle = vio::request_handle(&request);
        let retry = Request::decode(&request).is_ok_and(|q| safe_to_resend(&q));
        loop {
            let server = self.server();
            *m = request;
            if let Some(fh) = handle {
                let h = lock(&r.handles);
                match h.open.get(&fh) {
                    Some(o) if o.broken && code != vio::CLOSE => {
                        return Err(ClientError::Server(Errno::EIO))
                    }
                    Some(o) => vio::set_request_handle(m, o.server_fh),
                    None => return Err(ClientError::Server(Errno::EBADF)),
                }
            }
            let res = self.exchange_once(m, seg.as_mut().map(reborrow), server);
            match res {
                Err(ClientError::Ipc(e)) if gone(&e, server) => {
                    self.rediscover(server, e)?;
                    if !retry {
                        tracing::warn!(
                            "file server restarted with a request in flight (code {code:#x}); its outcome is unknown: EIO"
                        );
                        return Err(ClientError::Server(Errno::EIO));
                    }
                }
                res => {
                    if let (true, Some(fh)) = (res.is_ok() || code == vio::CLOSE, handle) {
                        let mut h = lock(&r.handles);
                        match code {
                            vio::CLOSE => {
                                h.open.remove(&fh);
                            }
                            vio::WRITE | vio::FTRUNCATE => {
                                if let Some(o) = h.open.get_mut(&fh) {
                                    o.dirty = true;
                                }
                            }
                            vio::FSYNC => {
                                if let Some(o) = h.open.get_mut(&fh) {
                                    o.dirty = false;
                                }
                            }
                            _ => {}
                        }
                    }
                    return res;
                }
            }
        }
    }

    pub(super) fn exchange_once(
        &self,
        m: &mut Message,
        seg: Option<Segment<'_>>,
        server: Pid,
    ) -> Result<usize, ClientError> {
        // A lock wait lasts as long as the lock is held elsewhere: no
        // deadline (the server's host keeps answering that it is pending).
        let waits = vio::code(m) == vio::LOCK && m.0[2] & vio::LOCK_WAIT != 0;
        // Waits borrow from a pool of their own, so that programs waiting
        // for locks never starve the others of processes.
        let pool = if waits { &self.waits } else { &self.pool };
        let p = pool.take();
        let r = match seg {
            Some(s) if waits => p.send_with_segment_within(m, server, s, usize::MAX, None),
            Some(s) => p.send_with_segment(m, server, s),
            None => p.send(m, server),
        };
        pool.give(p);
        let r = r?;
        match vio::status(m) {
            Errno::OK => Ok(r.seg_bytes),
            e => Err(ClientError::Server(e)),
        }
    }

    /// Looks for the server until it answers again or the budget is
    /// spent, then reopens every tracked handle. Returns at once if
    /// another thread already found it.
    fn rediscover(&self, old: Pid, cause: IpcError) -> Result<(), ClientError> {
        let Some(r) = &self.reopen else {
            return Err(cause.into());
        };
        let _one = lock(&r.lock);
        if self.server() != old {
            return Ok(());
        }
        tracing::warn!("file server {old} is gone ({cause}); looking for it again");
        let t0 = Instant::now();
        let mut pause = Duration::from_millis(20);
        let budget = if r.gave_up.load(Ordering::Relaxed) {
            Duration::ZERO
        } else {
            r.find.budget
        };
        let p = self.pool.take();
        let found = loop {
            match p.get_pid(r.find.logical_id, Scope::Any) {
                Ok(pid) if !pid.is_none() && pid != old => break Some(pid),
                _ if t0.elapsed() < budget => {
                    std::thread::sleep(pause.min(budget.saturating_sub(t0.elapsed())));
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                _ => break None,
            }
        };
        let Some(pid) = found else {
            self.pool.give(p);
            if !r.gave_up.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "file server not found again within {budget:?}; calls fail with ENOTCONN (each looks once more)"
                );
            }
            return Err(cause.into());
        };
        r.gave_up.store(false, Ordering::Relaxed);
        // Reopen what was open, by path, at the new server.
        let mut h = lock(&r.handles);
        let (mut reopened, mut broken) = (0, 0);
        for o in h.open.values_mut() {
            if o.broken {
                continue;
            }
            let len = o.path.len() as u32;
            let req = if o.dir {
                Request::Opendir { path_len: len }
            } else {
                Request::Open {
                    prefetch: false,
                    path_len: len,
                    flags: o.flags as u32,
                    mode: 0,
                    owner: Owner::default(),
                }
            };
            let mut m = req.encode();
            let mut out = vec![0u8; ATTR_LEN];
            let mut seg = [o.path.as_slice(), &out].concat();
            let sent = p.send_with_segment(&mut m, pid, Segment::ReadWrite(&mut seg));
            out.clear();
            match sent {
                Ok(_) if vio::status(&m) == Errno::OK && !o.dirty => {
                    o.server_fh = vio::reply_words(&m)[0];
                    reopened += 1;
                }
                _ => {
                    tracing::warn!(
                        "after the file server's restart, {:?} {}: EIO from now on",
                        String::from_utf8_lossy(&o.path),
                        if o.dirty {
                            "had writes since its last fsync that may be lost"
                        } else {
                            "could not be reopened"
                        }
                    );
                    o.broken = true;
                    broken += 1;
                }
            }
        }
        drop(h);
        let cb = *lock(&self.callback);
        if let Some(cb) = cb {
            // The new server knows nothing of this client's caches.
            if let Err(e) = self.send_watch(&p, pid, cb) {
                tracing::warn!("the restarted file server refused WATCH ({e}); cached names and attributes may be stale for up to the mount's TTL");
            }
        }
        self.pool.give(p);
        self.server.store(pid.0, Ordering::Release);
        tracing::warn!(
            "file server found again as {pid} after {:.0} ms; {reopened} handles reopened, {broken} failed",
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }
}

/// Does this failure of an exchange with `server` mean it went away?
pub(super) fn gone(e: &IpcError, server: Pid) -> bool {
    matches!(e, IpcError::NoSuchProcess(p) if *p == server) || matches!(e, IpcError::Timeout(_))
}

/// A shorter-lived view of a segment, for a re-send.
fn reborrow<'b>(s: &'b mut Segment<'_>) -> Segment<'b> {
    match s {
        Segment::Read(b) => Segment::Read(b),
        Segment::Write(b) => Segment::Write(b),
        Segment::ReadWrite(b) => Segment::ReadWrite(b),
    }
}

/// May `q` be sent again to a restarted server when its first sending's
/// outcome is unknown? Yes if doing it twice leaves the same result as
/// once: reads and lookups, a WRITE at an offset (same bytes, same place;
/// not an append, which would add them twice), setting
/// absolute attributes or sizes, and opening (the old server's handle died
/// with it) unless the open must create the file (`O_EXCL`). Not mkdir,
/// unlink, rename, link or symlink: the second would fail where the first
/// succeeded.
fn safe_to_resend(q: &Request) -> bool {
    match q {
        Request::Open { flags, .. } => *flags as i32 & libc::O_EXCL == 0,
        Request::Write { flags, .. } => flags & vio::WRITE_APPEND == 0,
        Request::Opendir { .. }
        | Request::Setattr { .. }
        | Request::Truncate { .. }
        | Request::Ftruncate { .. } => true,
        q => q.idempotent(),
    }
}
