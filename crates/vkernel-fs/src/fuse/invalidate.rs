//! The server's reports of other clients' changes: applied to the
//! mount's own caches, then told to the kernel.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::INodeNo;

use super::state::Shared;
use super::{lock_or_recover, renamed};
use crate::vio::{self, Invalidation};

/// What the kernel is told to drop.
pub(super) enum Drop {
    Entry(u64, Vec<u8>),
    Attr(u64),
    Data(u64),
}

/// Applies one of the server's invalidations to the mount's own caches,
/// on the callback process before it answers (so a change is forgotten
/// here before the server acknowledges it to the client that made it).
/// Returns what the kernel must drop: that waits for
/// [`tell_kernel`] on another thread, so the server's worker never waits
/// on this kernel.
pub(super) fn forget_changed(shared: &Shared, inv: &Invalidation, path: &[u8]) -> Vec<Drop> {
    let data = inv.flags & vio::INVAL_DATA != 0;
    let mut drops = Vec::new();
    {
        let mut n = shared.nodes();
        n.reported += 1;
        let target = if inv.flags & vio::INVAL_RENAME != 0 {
            let exchange = inv.flags & vio::INVAL_EXCHANGE != 0;
            renamed::apply(&mut n, path, exchange, &mut drops);
            None
        } else if inv.path_len > 0 {
            match n.resolve(path) {
                Some((parent, name, child)) => {
                    if inv.flags & vio::INVAL_ENTRY != 0 {
                        n.clear_attr(parent);
                        // Its pages: the listing the kernel may keep.
                        drops.push(Drop::Data(parent));
                        drops.push(Drop::Entry(parent, name.clone()));
                        // The name may mean another file now.
                        n.detach(parent, &name);
                        n.absent.remove(&(parent, name.clone()));
                        n.listings.drop_dir(parent);
                    }
                    child
                }
                None => None,
            }
        } else {
            n.by_id.get(&inv.id).copied()
        };
        if let Some(ino) = target {
            n.clear_attr(ino);
            n.clear_xattrs(ino);
            if data {
                if let Some(node) = n.map.get_mut(&ino) {
                    node.pages = false;
                }
                n.contents.remove(ino);
            }
            drops.push(if data {
                Drop::Data(ino)
            } else {
                Drop::Attr(ino)
            });
        }
        if data {
            if let Some(ino) = target {
                let open = lock_or_recover(&shared.open);
                let mut heads = lock_or_recover(&shared.heads);
                for fh in open.get(&ino).into_iter().flatten() {
                    heads.remove(fh);
                }
            }
        }
    }
    drops
}

/// Tells the kernel to drop what an invalidation made stale.
pub(super) fn tell_kernel(shared: &Shared, drops: Vec<Drop>) {
    let Some(k) = shared.notifier.get() else {
        return;
    };
    for d in drops {
        // ENOENT: the kernel does not hold it; nothing to drop.
        let _ = match d {
            Drop::Entry(parent, name) => k.inval_entry(INodeNo(parent), OsStr::from_bytes(&name)),
            Drop::Attr(ino) => k.inval_inode(INodeNo(ino), -1, 0),
            Drop::Data(ino) => k.inval_inode(INodeNo(ino), 0, 0),
        };
    }
}
