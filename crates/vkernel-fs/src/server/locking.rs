//! LOCK, the lock-waiting process that answers the LOCK requests that
//! wait, and the lock checker that frees the locks of clients gone.

use vkernel::{IpcError, Message, Pid};

use super::{lock, Answer, Kind, Req, Shared, LOCKD_WAKE};
use crate::confine;
use crate::locks::{self, Held};
use crate::vio::{self, Errno, Request};

impl Req<'_> {
    /// LOCK: sets, removes or tests a lock; a request that must wait is
    /// forwarded to the lock-waiting process, which answers it later.
    pub(super) fn lock(&self, req: Request, buf: &mut Vec<u8>) -> Result<(), IpcError> {
        let Request::Lock {
            handle,
            flags,
            owner,
            pid,
        } = req
        else {
            return self.send(Err(Errno::EPROTO));
        };
        if let Err(e) = self.gather(buf, vio::LOCK_RANGE_LEN)? {
            return self.send(Err(e));
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i..i + 8]);
            u64::from_be_bytes(b)
        };
        let (start, end) = (word(0), word(8));
        if start > end {
            return self.send(Err(Errno::EINVAL));
        }
        let h = match self.sh.handle(handle, self.r.from, self.r.principal) {
            Ok(h) => h,
            Err(e) => return self.send(Err(e)),
        };
        let file = match &h.kind {
            Kind::File { id, .. } => *id,
            Kind::Dir { dir, .. } => match rustix::fs::fstat(dir) {
                Ok(st) => {
                    let a = confine::attr_of(&st);
                    (a.dev, a.ino)
                }
                Err(e) => return self.send(Err(Errno::from_rustix(e))),
            },
        };
        let kind = match flags & 3 {
            vio::LOCK_READ => Some(locks::Kind::Read),
            vio::LOCK_WRITE => Some(locks::Kind::Write),
            _ => None,
        };
        let owner = (self.r.from.host().0, owner);
        let want = Held {
            owner,
            kind: kind.unwrap_or(locks::Kind::Read),
            start,
            end,
            pid,
        };
        let mut st = lock(&self.sh.locks);
        st.table.client(owner.0, self.r.from.0);
        if flags & vio::LOCK_TEST != 0 {
            let c = kind.and_then(|_| st.table.conflict(file, &want));
            drop(st);
            return match c {
                None => self.send(Ok(Answer::Words(vec![0]))),
                Some(c) => {
                    let k = match c.kind {
                        locks::Kind::Read => vio::LOCK_READ,
                        locks::Kind::Write => vio::LOCK_WRITE,
                    };
                    let mut out = Vec::with_capacity(vio::LOCK_INFO_LEN);
                    out.extend_from_slice(&k.to_be_bytes());
                    out.extend_from_slice(&c.pid.to_be_bytes());
                    out.extend_from_slice(&c.start.to_be_bytes());
                    out.extend_from_slice(&c.end.to_be_bytes());
                    if !self.can_answer(out.len()) {
                        return self.send(Err(Errno::EPROTO));
                    }
                    self.send(Ok(Answer::Data(vec![k], out)))
                }
            };
        }
        if let (Some(_), Some(_)) = (kind, st.table.conflict(file, &want)) {
            if flags & vio::LOCK_WAIT == 0 {
                drop(st);
                return self.send(Err(Errno::EAGAIN));
            }
            let Some(&lockd) = self.sh.lockd.get() else {
                drop(st);
                return self.send(Err(Errno::ENOSYS));
            };
            let slot = st.table.wait(file, want);
            st.expect.insert(slot, self.r.from);
            drop(st);
            let mut m = self.r.message;
            m.0[1] = slot;
            // The client now awaits the lock-waiting process's reply.
            if let Err(e) = self.r.process.forward(&m, self.r.from, lockd) {
                let mut st = lock(&self.sh.locks);
                st.table.cancel(file, owner);
                st.expect.remove(&slot);
                drop(st);
                tracing::warn!("file server: forwarding a lock wait: {e}");
                return self.send(Err(Errno::EIO));
            }
            return Ok(());
        }
        st.table.set(file, owner, kind, (start, end), pid);
        let mut decided = Vec::new();
        if kind.is_none() && start == 0 && end >= i64::MAX as u64 {
            // The whole file unlocked (a close): its waits end too.
            decided.extend(
                st.table
                    .cancel(file, owner)
                    .iter()
                    .map(|w| (w.slot, Errno(libc::EINTR as u32))),
            );
        }
        if st.table.has_waiters() {
            decided.extend(st.table.grantable().iter().map(|w| (w.slot, Errno::OK)));
        }
        let wake = !decided.is_empty();
        st.decided.extend(decided);
        drop(st);
        if wake {
            if let Some(&lockd) = self.sh.lockd.get() {
                let mut m = Message::with_code(LOCKD_WAKE);
                let _ = self.r.process.send(&mut m, lockd);
            }
        }
        self.send(Ok(Answer::Words(vec![])))
    }
}

/// The lock-waiting process: receives the LOCK requests workers forward
/// to it (each waiting for a lock) and answers each once a worker decided
/// it (granted, or cancelled) and woke it.
pub(super) fn lock_waiter(p: &vkernel::Process, sh: &Shared) {
    let mut m = Message::zero();
    loop {
        let i = match p.receive(&mut m) {
            Ok(i) => i,
            Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
            Err(_) => continue,
        };
        match vio::code(&m) {
            vio::LOCK => {
                let slot = m.0[1];
                let mut st = lock(&sh.locks);
                if st.expect.get(&slot) != Some(&i.from) {
                    drop(st);
                    let _ = p.reply(&vio::reply(Errno::EPROTO, &[]), i.from);
                    continue;
                }
                st.arrived.insert(slot, i.from);
            }
            LOCKD_WAKE if i.from.host() == p.pid().host() => {
                let _ = p.reply(&vio::reply(Errno::OK, &[]), i.from);
            }
            _ => {
                let _ = p.reply(&vio::reply(Errno::EPROTO, &[]), i.from);
                continue;
            }
        }
        let ready: Vec<(Pid, Errno)> = {
            let mut st = lock(&sh.locks);
            let slots: Vec<u32> = st
                .decided
                .keys()
                .filter(|s| st.arrived.contains_key(s))
                .copied()
                .collect();
            slots
                .into_iter()
                .filter_map(|s| {
                    st.expect.remove(&s);
                    Some((st.arrived.remove(&s)?, st.decided.remove(&s)?))
                })
                .collect()
        };
        for (client, e) in ready {
            let _ = p.reply(&vio::reply(e, &[]), client);
        }
    }
}

/// How often the lock checker asks whether lock holders still exist.
const LOCK_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// The lock checker: every [`LOCK_CHECK`], asks whether each client that
/// holds or waits for locks still exists; a client found gone (no such
/// process, or its host unreachable at two checks in a row) loses its
/// locks and waits, so a crashed client never blocks the others for
/// good. Ends when the host shuts down.
pub(super) fn lock_checker(p: &vkernel::Process, sh: &Shared) {
    let mut suspects: std::collections::HashSet<u16> = Default::default();
    loop {
        std::thread::sleep(LOCK_CHECK);
        if let Err(IpcError::Shutdown) | Err(IpcError::Destroyed) = p.process_exists(p.pid()) {
            return;
        }
        let clients = lock(&sh.locks).table.clients();
        for (host, pid) in clients {
            let gone = match p.process_exists(Pid(pid)) {
                Ok(true) => {
                    suspects.remove(&host);
                    false
                }
                Ok(false) => true,
                Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
                // Unreachable: gone at the second check in a row.
                Err(_) => !suspects.insert(host),
            };
            if !gone {
                continue;
            }
            suspects.remove(&host);
            tracing::warn!(
                "file server: lock holder host {host:04x} is gone; its locks are released"
            );
            let woke = {
                let mut st = lock(&sh.locks);
                let dropped = st.table.forget_host(host);
                let intr = Errno(libc::EINTR as u32);
                let mut decided: Vec<(u32, Errno)> =
                    dropped.iter().map(|w| (w.slot, intr)).collect();
                decided.extend(st.table.grantable().iter().map(|w| (w.slot, Errno::OK)));
                let any = !decided.is_empty();
                st.decided.extend(decided);
                any
            };
            if let (true, Some(&lockd)) = (woke, sh.lockd.get()) {
                let mut m = Message::with_code(LOCKD_WAKE);
                let _ = p.send(&mut m, lockd);
            }
        }
    }
}
