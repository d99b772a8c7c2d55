//! The V I/O protocol: request codes, message layouts, records carried in
//! segments, and errno-like status codes (docs/VIO.md has them byte by
//! byte).
//!
//! A request is one 32-byte V message. Word 0 holds the request code in its
//! low 24 bits (the kernel owns the top byte: segment and idempotency
//! flags); words 1–5 carry the request's fields; words 6–7 are the segment
//! descriptor the kernel maintains. Paths and variable records travel in
//! the segment the client lends with its Send, so a path request costs one
//! exchange (2 datagrams): the path rides appended to the request and the
//! answer (an attribute record, a link target) rides appended to the reply.
//!
//! The reply's word 0 is a status: 0 for success, else an errno-like code
//! ([`Errno`]). Numbers are big-endian in records, as in the message words.
//!
//! Decoding never panics and never trusts a length: every decoder here
//! returns an error for short or inconsistent input.
//!
//! This file holds the codes, flags and limits; the submodules (all
//! re-exported here) hold the requests (`request`, `codec`), the status
//! codes and replies (`status`), the INVALIDATE message (`invalidation`)
//! and the records (`records`).

use vkernel::message::{CODE_MASK, IDEMPOTENT};
use vkernel::Message;

mod codec;
mod invalidation;
mod records;
mod request;
mod status;

pub use invalidation::*;
pub use records::*;
pub use request::*;
pub use status::*;

/// Longest path one system call takes (bytes, Linux `PATH_MAX`): the
/// longest symbolic link target a request may carry.
pub const MAX_PATH: usize = 4096;
/// Longest path (from the export root) a request may carry: deeper than
/// [`MAX_PATH`], as a program whose working directory is deep in a tree
/// reaches with short relative paths. The server walks such a path in
/// steps of at most [`MAX_PATH`] (docs/VIO.md, "Long paths").
pub const MAX_REQUEST_PATH: usize = 64 << 10;
/// Longest path component (bytes, like Linux `NAME_MAX`).
pub const MAX_NAME: usize = 255;
/// Most bytes one READ or WRITE moves; larger counts are answered short.
pub const MAX_IO: u32 = 16 << 20;

/// Request: open or create a file. w1 path length, w2 Linux open flags,
/// w3 mode (for `O_CREAT`). Segment read+write: the path in, the file's
/// [`Attr`] out. Reply: w1 handle.
pub const OPEN: u32 = 0x56_0001;
/// Request: forget a handle (w1). Reports a deferred write error, if any.
pub const CLOSE: u32 = 0x56_0002;
/// Request: read. w1 handle, w2–w3 offset, w4 count; segment write-granted
/// (at least count bytes). Reply: w1 bytes read (fewer than asked only at
/// end of file or when count exceeded [`MAX_IO`]). Small reads come back
/// appended to the reply; large ones by MoveTo first.
pub const READ: u32 = 0x56_0003;
/// Request: write. w1 handle, w2–w3 offset, w4 count, w5 flags
/// ([`WRITE_APPEND`]; 0 from older clients); segment
/// read-granted holding the data. Reply: w1 bytes accepted. If the
/// segment is also write-granted with room for an [`Attr`] after the
/// data, the data is written before the reply (not behind it) and the
/// file's attributes after the write come back at segment offset count.
pub const WRITE: u32 = 0x56_0004;
/// [`WRITE`] flag: write at the end of the file (the offset is ignored),
/// found and written under the server's lock of the file, so appends
/// from any number of clients land whole, one after another.
pub const WRITE_APPEND: u32 = 1;
/// [`WRITE`] flag: write at the offset even on a handle opened with
/// `O_APPEND` (whose plain writes are appended): a page the client's
/// page cache writes back (a shared mapping of such a file).
pub const WRITE_AT: u32 = 2;
/// Request: attributes by path. w1 path length, w2 flags ([`STAT_NOFOLLOW`]).
/// Segment read+write: path in, [`Attr`] out.
pub const STAT: u32 = 0x56_0005;
/// Request: attributes of an open handle (w1). Segment write: [`Attr`].
pub const FSTAT: u32 = 0x56_0006;
/// Request: open a directory for listing. w1 path length; segment read:
/// the path. Reply: w1 handle, w2 entries (a snapshot taken now).
pub const OPENDIR: u32 = 0x56_0007;
/// Request: list directory entries. w1 handle, w2 index of the first
/// entry; segment write: packed [`Dirent`]s. Reply: w1 bytes, w2 entries,
/// w3 next index, w4 1 if the listing is complete.
pub const READDIR: u32 = 0x56_0008;
/// Request: make a directory. w1 path length, w2 mode. Segment read+write:
/// path in, [`Attr`] out.
pub const MKDIR: u32 = 0x56_0009;
/// Request: remove an empty directory. w1 path length; segment read: path.
pub const RMDIR: u32 = 0x56_000a;
/// Request: remove a name (not a directory). w1 path length; segment read.
pub const UNLINK: u32 = 0x56_000b;
/// Request: rename. w1 old path length, w2 new path length, w3 flags
/// ([`RENAME_NOREPLACE`], [`RENAME_EXCHANGE`]); segment read: old ++ new.
pub const RENAME: u32 = 0x56_000c;
/// Request: set a file's size by path. w1 path length, w2–w3 size.
pub const TRUNCATE: u32 = 0x56_000d;
/// Request: set an open file's size. w1 handle, w2–w3 size.
pub const FTRUNCATE: u32 = 0x56_000e;
/// Request: make an open file durable. w1 handle, w2 flags
/// ([`FSYNC_DATASYNC`], [`FSYNC_FLUSH_ONLY`]). Reports a deferred write
/// error, if any.
pub const FSYNC: u32 = 0x56_000f;
/// Request: make a symbolic link. w1 target length, w2 link path length;
/// segment read+write: target ++ path in, the link's [`Attr`] out.
pub const SYMLINK: u32 = 0x56_0010;
/// Request: read a symbolic link. w1 path length; segment read+write: path
/// in, target out. Reply: w1 target length (`ERANGE` with w1 = length when
/// the segment is too small).
pub const READLINK: u32 = 0x56_0011;
/// Request: change attributes. w1 path length; segment read+write: a
/// [`SetAttr`] record ++ path in, [`Attr`] out. The last component is not
/// followed (lchown/utimensat semantics; mode on a symlink is refused).
pub const SETATTR: u32 = 0x56_0012;
/// Request: make a hard link. w1 existing path length, w2 new path
/// length; segment read+write: existing ++ new in, [`Attr`] out.
pub const LINK: u32 = 0x56_0013;
/// Request: file-system statistics. Segment write: [`StatFs`].
pub const STATFS: u32 = 0x56_0014;
/// Request: make a special file (FIFO, socket, device node) or an empty
/// regular file. w1 path length, w2 mode (file type and permission bits),
/// w3 device number (`makedev`, device nodes only), w4–w5 [`Owner`];
/// segment read+write: path in, [`Attr`] out.
pub const MKNOD: u32 = 0x56_0015;
/// Request: change attributes of an open file by its handle (fchmod,
/// fchown, futimens, ftruncate), which works after its names are gone. w1
/// handle; segment read+write: [`SetAttr`] record in, [`Attr`] out.
pub const FSETATTR: u32 = 0x56_0016;
/// Request: tell me when another client changes a file. w1 the pid of the
/// client's *callback process*, w2 how many member pids follow in the
/// segment (read: u32 each, big-endian; at most [`MAX_WATCH_MEMBERS`]):
/// the processes the client sends its requests from, whose own changes
/// are not reported back to it; w3 flags ([`WATCH_RENAMES`], 0 from older
/// clients). The server then Sends [`INVALIDATE`]
/// messages to the callback process before it replies to a change made
/// by any other client (docs/VIO.md, "Cache invalidation").
pub const WATCH: u32 = 0x56_0017;
/// Request: [`READDIR`] with attributes: each packed [`Dirent`] is
/// followed by the entry's [`Attr`] (not following a symbolic link), all
/// zero for an entry removed since the listing was taken.
pub const READDIRPLUS: u32 = 0x56_0018;
/// Request: [`OPEN`], and read the start of the file. Words as for OPEN;
/// segment read+write: the path in, the file's [`Attr`] out, then as many
/// bytes of the file from offset 0 as the segment has room for after the
/// attributes (none for a file not opened for reading or not regular).
/// Reply: w1 handle, w2 bytes of data after the attributes.
pub const OPENREAD: u32 = 0x56_0019;
/// Request: forget several handles. w1 how many (at most
/// [`MAX_CLOSEV`]); segment read: the handles (u32 each, big-endian).
/// Reply: w1 handles closed; the status of the first that failed (a
/// deferred write error, EBADF), the rest are closed all the same.
pub const CLOSEV: u32 = 0x56_001a;
/// Request: an advisory lock on the file of an open handle (fcntl locks;
/// the mount sends flock as a whole-file lock). w1 handle, w2 flags (the
/// kind in bits 0–1: [`LOCK_UNLOCK`], [`LOCK_READ`], [`LOCK_WRITE`]; and
/// [`LOCK_WAIT`], [`LOCK_TEST`]), w3–w4 the client's lock owner, w5 the
/// locking program's pid. Segment read+write: first and last byte (u64
/// each, big-endian) in; with [`LOCK_TEST`] the conflicting lock out
/// (kind u32, pid u32, first u64, last u64). Reply: OK (set, removed, or
/// with TEST w1 = the conflicting lock's kind, 0 for none); EAGAIN for a
/// conflict without WAIT. With WAIT the reply comes when the lock is set
/// (EINTR if the owner unlocked the whole file meanwhile).
pub const LOCK: u32 = 0x56_001b;
/// [`LOCK`] kind: remove the owner's locks over the range.
pub const LOCK_UNLOCK: u32 = 0;
/// [`LOCK`] kind: shared.
pub const LOCK_READ: u32 = 1;
/// [`LOCK`] kind: exclusive.
pub const LOCK_WRITE: u32 = 2;
/// [`LOCK`] flag: wait for a conflicting lock to go.
pub const LOCK_WAIT: u32 = 0x100;
/// [`LOCK`] flag: only say whether the lock could be set, and what
/// conflicts (`F_GETLK`).
pub const LOCK_TEST: u32 = 0x200;
/// Bytes of a [`LOCK`] range in the segment.
pub const LOCK_RANGE_LEN: usize = 16;
/// Bytes of a [`LOCK_TEST`] answer.
pub const LOCK_INFO_LEN: usize = 24;
/// Request: an extended attribute's value. w1 path length, w2 name
/// length, w3 room for the value (0: only its length). Segment read+write:
/// path ++ name in, the value out. Reply: w1 the value's length
/// (`ERANGE` when the room is too small; `ENODATA`: none). Names:
/// `user.*`; `trusted.*` and `security.*` for principal 0 only (EPERM);
/// others `EOPNOTSUPP`.
pub const GETXATTR: u32 = 0x56_001c;
/// Request: the names of a file's extended attributes. w1 path length,
/// w2 room (0: only the length). Segment read+write: path in, the names
/// out (each NUL-terminated). Reply: w1 the list's length.
pub const LISTXATTR: u32 = 0x56_001d;
/// Request: set an extended attribute. w1 path length, w2 name length,
/// w3 value length, w4 flags ([`XATTR_CREATE`], [`XATTR_REPLACE`]).
/// Segment read: path ++ name ++ value.
pub const SETXATTR: u32 = 0x56_001e;
/// Request: remove an extended attribute. w1 path length, w2 name
/// length; segment read: path ++ name.
pub const REMOVEXATTR: u32 = 0x56_001f;
/// Request: allocate, or free, a range of an open file (fallocate(2)).
/// w1 handle, w2 mode (0, [`FALLOC_KEEP_SIZE`], [`FALLOC_PUNCH_HOLE`] |
/// [`FALLOC_KEEP_SIZE`], [`FALLOC_ZERO_RANGE`] with or without
/// [`FALLOC_KEEP_SIZE`]; other bits `EOPNOTSUPP`). Segment read+write:
/// offset and length (u64 each, big-endian) in; with room for an
/// [`Attr`] after them, the file's attributes after the change out (at
/// offset 0). Done by the server's fallocate(2) on the file.
pub const FALLOCATE: u32 = 0x56_0020;
/// Request: the next data or hole of an open file at or after an offset
/// (lseek(2) `SEEK_DATA` = 3, `SEEK_HOLE` = 4; other whence `EINVAL`).
/// w1 handle, w2 whence, w3–w4 offset. Reply: w1–w2 the offset found;
/// `ENXIO` when there is none (at or past the end).
pub const LSEEK: u32 = 0x56_0021;
/// Request: several UNLINKs and RMDIRs, done in order. w1 how many (at
/// most [`MAX_REMOVEV`]), w2 the segment's length (at most
/// [`MAX_REMOVEV_BYTES`]); segment read: per removal, its kind (u32
/// big-endian: [`REMOVE_UNLINK`] or [`REMOVE_RMDIR`]), its path's length
/// (u32 big-endian) and the path. Each is done and reported to watching
/// clients as its own UNLINK or RMDIR would be; the first that fails
/// ends the batch. A segment that does not hold `count` whole records
/// (EPROTO) or has an unknown kind (EINVAL) is refused before any is
/// done. Reply: w1 removals done; the status of the one that failed (the
/// rest are not tried).
pub const REMOVEV: u32 = 0x56_0022;
/// Request: stop telling me of changes (a client that unmounts). w1 the
/// callback pid its [`WATCH`] named; the request must come from one of
/// that WATCH's members. Reply: OK, also when no such client watches
/// (already dropped, or the server restarted), so it is safe to repeat.
/// Older servers answer ENOSYS; they keep Sending until the callback
/// cannot be reached.
pub const UNWATCH: u32 = 0x56_0023;
/// [`REMOVEV`] kind: UNLINK.
pub const REMOVE_UNLINK: u32 = 0;
/// [`REMOVEV`] kind: RMDIR.
pub const REMOVE_RMDIR: u32 = 1;
/// [`FALLOCATE`] mode: do not change the file's size.
pub const FALLOC_KEEP_SIZE: u32 = 1;
/// [`FALLOCATE`] mode: free the range (with [`FALLOC_KEEP_SIZE`]).
pub const FALLOC_PUNCH_HOLE: u32 = 2;
/// [`FALLOCATE`] mode: make the range read as zeros, allocated.
pub const FALLOC_ZERO_RANGE: u32 = 0x10;
/// Bytes of a [`FALLOCATE`] range in the segment.
pub const FALLOC_RANGE_LEN: usize = 16;
/// [`SETXATTR`] flag: fail with `EEXIST` if it exists.
pub const XATTR_CREATE: u32 = 1;
/// [`SETXATTR`] flag: fail with `ENODATA` unless it exists.
pub const XATTR_REPLACE: u32 = 2;
/// Longest extended attribute value.
pub const MAX_XATTR_VALUE: u32 = 64 << 10;
/// Most handles in one [`CLOSEV`].
pub const MAX_CLOSEV: u32 = 1024;
/// Most removals in one [`REMOVEV`].
pub const MAX_REMOVEV: u32 = 256;
/// Longest [`REMOVEV`] segment.
pub const MAX_REMOVEV_BYTES: u32 = 64 << 10;
/// Message from a server to a client's callback process (see [`WATCH`]):
/// w1 flags ([`INVAL_ATTR`], [`INVAL_DATA`], [`INVAL_ENTRY`]), w2 device,
/// w3–w4 inode (with [`INVAL_ATTR`]/[`INVAL_DATA`] and no path), w5 path
/// length; segment read: the path of the changed name (with
/// [`INVAL_ENTRY`]). The callback process replies at once (status only).
pub const INVALIDATE: u32 = 0x56_0080;

/// Most member pids in a [`WATCH`] request.
pub const MAX_WATCH_MEMBERS: u32 = 256;
/// [`WATCH`] flag: report a rename as one [`INVAL_RENAME`] message (the
/// client can move its names, so a directory in use stays usable), not as
/// two unrelated [`INVAL_ENTRY`] ones.
pub const WATCH_RENAMES: u32 = 1;
/// [`INVALIDATE`] flag: the file's attributes changed.
pub const INVAL_ATTR: u32 = 1;
/// [`INVALIDATE`] flag: the file's data changed.
pub const INVAL_DATA: u32 = 2;
/// [`INVALIDATE`] flag: the name at the path was made, removed or now
/// means another file; its directory's attributes changed too.
pub const INVAL_ENTRY: u32 = 4;
/// [`INVALIDATE`] flag (with [`INVAL_ENTRY`], only to clients that asked
/// with [`WATCH_RENAMES`]): the name at the old path was renamed to the
/// new one; the segment is old path, NUL, new path.
pub const INVAL_RENAME: u32 = 8;
/// [`INVALIDATE`] flag (with [`INVAL_RENAME`]): the two names were
/// exchanged (`RENAME_EXCHANGE`).
pub const INVAL_EXCHANGE: u32 = 16;

/// STAT flag: do not follow a symbolic link in the last component.
pub const STAT_NOFOLLOW: u32 = 1;
/// FSYNC flag: data only (fdatasync).
pub const FSYNC_DATASYNC: u32 = 1;
/// FSYNC flag: only wait for deferred writes and report their errors (the
/// close-time flush), without forcing data to stable storage.
pub const FSYNC_FLUSH_ONLY: u32 = 2;
/// RENAME flag: fail with `EEXIST` instead of replacing.
pub const RENAME_NOREPLACE: u32 = 1;
/// RENAME flag: exchange the two names atomically.
pub const RENAME_EXCHANGE: u32 = 2;

fn split64(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

fn join64(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

#[cfg(test)]
mod tests;
