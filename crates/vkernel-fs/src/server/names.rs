//! The namespace: MKDIR, MKNOD, RMDIR, UNLINK, RENAME, SYMLINK, LINK and
//! READLINK, and the owner a new name is given.

use super::{path, two, Answer, Owners, Req};
use crate::confine;
use crate::vio::{self, Attr, Errno, Owner, Request, ATTR_LEN};

impl Req<'_> {
    /// MKDIR: a new directory.
    pub(super) fn mkdir(
        &self,
        input: &[u8],
        path_len: u32,
        mode: u32,
        owner: Owner,
    ) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let p = path(input, path_len)?;
        let a = root.mkdir(p, mode)?;
        let a = self.give(p, owner)?.unwrap_or(a);
        Ok(self.with_parent(self.attr_answer(vec![], a), p, 0))
    }

    /// MKNOD: a new special file (a device only for a root mount of a server
    /// that allows devices).
    pub(super) fn mknod(
        &self,
        input: &[u8],
        path_len: u32,
        mode: u32,
        rdev: u32,
        owner: Owner,
    ) -> Result<Answer, Errno> {
        let sh = self.sh;
        let root = &sh.root;
        let device = matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK);
        if device && (!sh.cfg.devices || self.r.principal != 0) {
            return Err(Errno(libc::EPERM as u32));
        }
        let p = path(input, path_len)?;
        // The wire's device number is Linux's 32-bit encoding,
        // which is also the low half of a dev_t.
        let a = root.mknod(p, mode, u64::from(rdev))?;
        let a = self.give(p, owner)?.unwrap_or(a);
        Ok(self.attr_answer(vec![], a))
    }

    /// RMDIR: removes an empty directory.
    pub(super) fn rmdir(&self, input: &[u8], path_len: u32) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let p = path(input, path_len)?;
        root.rmdir(p)?;
        Ok(self.with_parent(Answer::Words(vec![]), p, 0))
    }

    /// REMOVEV: each removal as its own UNLINK or RMDIR request (executed
    /// and reported to watchers alike), in order, until one fails. A
    /// batch that does not parse whole is refused before any is done.
    pub(super) fn removev(&self, input: &[u8], count: u32) -> Result<Answer, Errno> {
        let word = |b: &[u8], at: usize| -> Result<u32, Errno> {
            let w = b.get(at..at + 4).ok_or(Errno::EPROTO)?;
            Ok(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
        };
        let mut subs = Vec::with_capacity(count as usize);
        let mut rest = input;
        for _ in 0..count {
            let (kind, len) = (word(rest, 0)?, word(rest, 4)?);
            let p = rest.get(8..8 + len as usize).ok_or(Errno::EPROTO)?;
            subs.push(match kind {
                vio::REMOVE_UNLINK => (Request::Unlink { path_len: len }, p),
                vio::REMOVE_RMDIR => (Request::Rmdir { path_len: len }, p),
                _ => return Err(Errno::EINVAL),
            });
            rest = &rest[8 + len as usize..];
        }
        for (done, (sub, p)) in subs.into_iter().enumerate() {
            let r = self.execute(sub, p);
            match r {
                Ok(_) => self.report(&sub, p, &r),
                Err(e) => return Ok(Answer::Fail(e, vec![done as u32])),
            }
        }
        Ok(Answer::Words(vec![count]))
    }

    /// UNLINK: removes a name.
    pub(super) fn unlink(&self, input: &[u8], path_len: u32) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let p = path(input, path_len)?;
        root.unlink(p)?;
        Ok(self.with_parent(Answer::Words(vec![]), p, 0))
    }

    /// RENAME: moves (or exchanges) a name.
    pub(super) fn rename(
        &self,
        input: &[u8],
        old_len: u32,
        new_len: u32,
        flags: u32,
    ) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let (a, b) = two(input, old_len, new_len)?;
        root.rename(a, b, flags)?;
        Ok(Answer::Words(vec![]))
    }

    /// SYMLINK: a new symbolic link.
    pub(super) fn symlink(
        &self,
        input: &[u8],
        target_len: u32,
        path_len: u32,
        owner: Owner,
    ) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let (t, p) = two(input, target_len, path_len)?;
        let a = root.symlink(t, p)?;
        let a = self.give(p, owner)?.unwrap_or(a);
        Ok(self.attr_answer(vec![], a))
    }

    /// READLINK: a symbolic link's target.
    pub(super) fn readlink(&self, input: &[u8], path_len: u32) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let t = root.readlink(path(input, path_len)?)?;
        if !self.can_answer(t.len()) {
            // The client learns the size it needs.
            return Ok(Answer::Fail(Errno::ERANGE, vec![t.len() as u32]));
        }
        Ok(Answer::Data(vec![t.len() as u32], t))
    }

    /// LINK: a new name for a file.
    pub(super) fn link(&self, input: &[u8], old_len: u32, new_len: u32) -> Result<Answer, Errno> {
        let root = &self.sh.root;
        let (a, b) = two(input, old_len, new_len)?;
        let at = root.link(a, b)?;
        Ok(self.attr_answer(vec![], at))
    }

    /// Gives the name `path`, just created, to whom the server's policy
    /// says (see [`Owners`]); `None` if it stays the server's.
    pub(super) fn give(&self, path: &[u8], owner: Owner) -> Result<Option<Attr>, Errno> {
        if self.sh.cfg.owners == Owners::Server || !self.sh.root_user {
            return Ok(None);
        }
        let (uid, gid) = match self.r.principal {
            0 => (owner.uid, owner.gid),
            p => (p, p),
        };
        if (uid, gid) == (0, 0) {
            return Ok(None);
        }
        self.sh.root.give(path, uid, gid).map(Some)
    }

    /// Adds the attributes of `path`'s directory (after the change) to an
    /// answer, after what it carries, when the client lent room for them;
    /// reply word `flag_word` (index into the words) + 1 says so.
    pub(super) fn with_parent(&self, a: Answer, path: &[u8], flag_word: usize) -> Answer {
        let (mut words, mut data) = match a {
            Answer::Words(w) => (w, Vec::new()),
            Answer::Data(w, d) => (w, d),
            other => return other,
        };
        let parent = confine::split_last(path)
            .ok()
            .filter(|_| self.can_answer(data.len() + ATTR_LEN))
            .and_then(|(dir, _)| self.sh.root.stat(dir, false).ok());
        let Some((pa, _)) = parent else {
            return if data.is_empty() {
                Answer::Words(words)
            } else {
                Answer::Data(words, data)
            };
        };
        if words.len() <= flag_word {
            words.resize(flag_word + 1, 0);
        }
        words[flag_word] = 1;
        self.sh.watchers.saw(self.r.from, (pa.dev, pa.ino));
        data.extend_from_slice(&pa.encode());
        Answer::Data(words, data)
    }
}
