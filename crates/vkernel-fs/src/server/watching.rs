//! WATCH, and the invalidations a successful request sends the clients
//! that watch.

use vkernel::Pid;

use super::{Answer, Kind, Req};
use crate::vio::{self, Attr, Errno, Request, SETATTR_LEN};
use crate::watch::{self, Change};

impl Req<'_> {
    /// WATCH: the client (its callback process, and the members in `input`) is
    /// told of changes from now on.
    pub(super) fn watch(
        &self,
        input: &[u8],
        callback: u32,
        members: u32,
        flags: u32,
    ) -> Result<Answer, Errno> {
        let sh = self.sh;
        let m = input.get(..members as usize * 4).ok_or(Errno::EPROTO)?;
        let renames = flags & vio::WATCH_RENAMES != 0;
        sh.watchers.add(Pid(callback), watch::members(m), renames)?;
        // A mount's first request: the file server's "connection".
        tracing::info!(
            "file server: a client (callback {}) mounted; {} mounts watch",
            Pid(callback),
            sh.watchers.len()
        );
        Ok(Answer::Words(vec![]))
    }

    /// UNWATCH: the client whose callback is `callback` (and which
    /// sends from this request's process) is told nothing more.
    pub(super) fn unwatch(&self, callback: u32) -> Result<Answer, Errno> {
        let sh = self.sh;
        if sh.watchers.remove(Pid(callback), self.r.from) {
            tracing::info!(
                "file server: a client (callback {}) unmounted; {} mounts watch",
                Pid(callback),
                sh.watchers.len()
            );
        }
        Ok(Answer::Words(vec![]))
    }

    /// Tells watching clients what a successful request changed, before
    /// its client gets the reply.
    pub(super) fn report(&self, req: &Request, input: &[u8], r: &Result<Answer, Errno>) {
        if self.sh.watchers.len() == 0 {
            return;
        }
        let seg = |a: usize, n: u32| input.get(a..a + n as usize).unwrap_or_default();
        let attr_id = || match r {
            Ok(Answer::Data(_, d)) => Attr::decode(d).ok().map(|a| (a.dev, a.ino)),
            _ => None,
        };
        let (entry, attr, data) = (vio::INVAL_ENTRY, vio::INVAL_ATTR, vio::INVAL_DATA);
        let mut changes = Vec::new();
        match *req {
            Request::Open {
                path_len, flags, ..
            } => {
                let p = seg(0, path_len);
                if flags & libc::O_CREAT as u32 != 0 {
                    changes.push(Change::Path(p, entry | attr | data));
                } else if flags & libc::O_TRUNC as u32 != 0 {
                    changes.push(Change::Path(p, attr | data));
                }
            }
            Request::Mkdir { path_len, .. }
            | Request::Mknod { path_len, .. }
            | Request::Rmdir { path_len }
            | Request::Unlink { path_len } => changes.push(Change::Path(seg(0, path_len), entry)),
            Request::Symlink {
                target_len,
                path_len,
                ..
            } => changes.push(Change::Path(seg(target_len as usize, path_len), entry)),
            Request::Rename {
                old_len,
                new_len,
                flags,
            } => {
                let (old, new) = (seg(0, old_len), seg(old_len as usize, new_len));
                let exchange = flags & vio::RENAME_EXCHANGE != 0;
                changes.push(Change::Rename(old, new, exchange));
            }
            Request::Link { old_len, new_len } => {
                changes.push(Change::Path(seg(old_len as usize, new_len), entry));
                if let Some(id) = attr_id() {
                    changes.push(Change::Id(id, attr));
                }
            }
            Request::Truncate { path_len, .. } => {
                changes.push(Change::Path(seg(0, path_len), attr | data));
            }
            Request::Setattr { path_len } => {
                changes.push(Change::Path(seg(SETATTR_LEN, path_len), attr | data));
            }
            Request::Setxattr { path_len, .. } | Request::Removexattr { path_len, .. } => {
                changes.push(Change::Path(seg(0, path_len), attr));
            }
            Request::Ftruncate { handle, .. }
            | Request::Fsetattr { handle }
            | Request::Fallocate { handle, .. } => {
                if let Ok(h) = self.sh.handle(handle, self.r.from, self.r.principal) {
                    if let Kind::File { id, .. } = h.kind {
                        changes.push(Change::Id(id, attr | data));
                    }
                }
            }
            _ => {}
        }
        self.sh
            .watchers
            .notify(self.r.process, self.r.from, &changes);
    }
}
