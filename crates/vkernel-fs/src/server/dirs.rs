//! OPENDIR and READDIR/READDIRPLUS: directory listings.

use super::{path, Answer, Kind, Req};
use crate::confine;
use crate::vio::{Errno, ATTR_LEN};

impl Req<'_> {
    /// OPENDIR: a handle of the directory's listing, taken now.
    pub(super) fn opendir(&self, input: &[u8], path_len: u32) -> Result<Answer, Errno> {
        let sh = self.sh;
        let root = &sh.root;
        let (dir, entries) = root.list_dir(path(input, path_len)?)?;
        let n = entries.len() as u32;
        let h = sh.add_handle(
            self.r.from.host(),
            self.r.principal,
            Kind::Dir { entries, dir },
        )?;
        Ok(Answer::Words(vec![h, n]))
    }

    /// READDIR (READDIRPLUS with `plus`): the listing's entries from `index`
    /// that fit the segment (with their attributes).
    pub(super) fn readdir(&self, handle: u32, index: u32, plus: bool) -> Result<Answer, Errno> {
        let sh = self.sh;
        let h = sh.handle(handle, self.r.from, self.r.principal)?;
        let Kind::Dir { entries, dir } = &h.kind else {
            return Err(Errno::ENOTDIR);
        };
        if !self.r.message.seg_access().write {
            return Err(Errno::EPROTO);
        }
        let room = self.seg_len();
        let mut out = Vec::new();
        let mut i = index as usize;
        let extra = if plus { ATTR_LEN } else { 0 };
        while let Some(e) = entries.get(i) {
            if out.len() + e.len() + extra > room {
                break;
            }
            i += 1;
            if plus {
                // Gone since the listing was taken: zero attributes.
                let a = confine::stat_entry(dir, &e.name).unwrap_or_default();
                if a.ino != 0 {
                    self.sh.watchers.saw(self.r.from, (a.dev, a.ino));
                }
                e.encode_into(&mut out);
                out.extend_from_slice(&a.encode());
            } else {
                e.encode_into(&mut out);
            }
        }
        if i == index as usize && i < entries.len() {
            return Err(Errno::ERANGE);
        }
        let done = u32::from(i >= entries.len());
        let count = (i - (index as usize).min(i)) as u32;
        Ok(Answer::Data(
            vec![out.len() as u32, count, i as u32, done],
            out,
        ))
    }
}
