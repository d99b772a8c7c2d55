//! A rename reported by the server ([`vio::INVAL_RENAME`]) applied to the
//! node table as a rename made here would be: the moved node keeps its
//! inode number and gets the new name, so a directory that is a working
//! directory or holds open files on this mount stays usable.

use super::invalidate::Drop;
use super::nodes::Nodes;

/// Applies the rename in `joined` (old path, NUL, new path) to `n`, and
/// adds to `drops` what the kernel must forget.
pub(super) fn apply(n: &mut Nodes, joined: &[u8], exchange: bool, drops: &mut Vec<Drop>) {
    let Some(i) = joined.iter().position(|&b| b == 0) else {
        return;
    };
    let (from, to) = (n.resolve(&joined[..i]), n.resolve(&joined[i + 1..]));
    for (parent, name, child) in [&from, &to].into_iter().flatten() {
        n.clear_attr(*parent);
        n.absent.remove(&(*parent, name.clone()));
        n.listings.drop_dir(*parent);
        // Its pages: the listing the kernel may keep.
        drops.push(Drop::Data(*parent));
        drops.push(Drop::Entry(*parent, name.clone()));
        // A rename changes the file's ctime.
        if let Some(c) = child {
            n.clear_attr(*c);
            drops.push(Drop::Attr(*c));
        }
    }
    match (from, to) {
        (Some((op, on, _)), Some((np, nn, _))) => n.rename(op, &on, np, &nn, exchange),
        // The other end is not known here: the known name now means
        // another file, or none.
        (Some((p, name, _)), None) | (None, Some((p, name, _))) => n.detach(p, &name),
        (None, None) => {}
    }
}
