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

use vkernel::message::{CODE_MASK, IDEMPOTENT};
use vkernel::Message;

mod records;

pub use records::*;

/// Longest path a request may carry (bytes, like Linux `PATH_MAX`).
pub const MAX_PATH: usize = 4096;
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

/// An errno-like status: 0 is success, anything else names the failure
/// with its Linux errno value (so the FUSE layer can pass it through).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub u32);

impl Errno {
    /// Success (only ever in a reply's word 0, never as an error).
    pub const OK: Errno = Errno(0);
    /// Operation not permitted.
    pub const EPERM: Errno = Errno(1);
    /// No such file or directory.
    pub const ENOENT: Errno = Errno(2);
    /// I/O error (also: a deferred write failed).
    pub const EIO: Errno = Errno(5);
    /// No such offset: no data or hole past it ([`LSEEK`]).
    pub const ENXIO: Errno = Errno(6);
    /// Bad or unknown handle.
    pub const EBADF: Errno = Errno(9);
    /// Not an executable format (program load).
    pub const ENOEXEC: Errno = Errno(8);
    /// Permission denied.
    pub const EACCES: Errno = Errno(13);
    /// File exists.
    pub const EEXIST: Errno = Errno(17);
    /// The path would leave the exported tree (`..`, absolute path or a
    /// symbolic link pointing outside).
    pub const EXDEV: Errno = Errno(18);
    /// Not a directory.
    pub const ENOTDIR: Errno = Errno(20);
    /// Is a directory.
    pub const EISDIR: Errno = Errno(21);
    /// Invalid argument (NUL byte in a path, bad flags, `.` or `..` as
    /// the name to create or remove).
    pub const EINVAL: Errno = Errno(22);
    /// Too many open handles.
    pub const EMFILE: Errno = Errno(24);
    /// File too large (program load limit).
    pub const EFBIG: Errno = Errno(27);
    /// No space left on device.
    pub const ENOSPC: Errno = Errno(28);
    /// Read-only for this principal.
    pub const EROFS: Errno = Errno(30);
    /// Result too large for the segment lent.
    pub const ERANGE: Errno = Errno(34);
    /// Path or component too long.
    pub const ENAMETOOLONG: Errno = Errno(36);
    /// Unknown request code.
    pub const ENOSYS: Errno = Errno(38);
    /// Directory not empty.
    pub const ENOTEMPTY: Errno = Errno(39);
    /// Too many symbolic links (a loop).
    pub const ELOOP: Errno = Errno(40);
    /// The request is malformed (segment missing, too small, or lengths
    /// that do not add up).
    pub const EPROTO: Errno = Errno(71);
    /// A reply could not be decoded.
    pub const EBADMSG: Errno = Errno(74);
    /// Operation not supported.
    pub const EOPNOTSUPP: Errno = Errno(95);
    /// The server cannot be reached (the client's code for IPC failure).
    pub const ENOTCONN: Errno = Errno(107);
    /// Server busy; try again.
    pub const EAGAIN: Errno = Errno(11);

    /// The errno of an I/O error (EIO when it has none).
    pub fn from_io(e: &std::io::Error) -> Errno {
        match e.raw_os_error() {
            Some(n) if n > 0 => Errno(n as u32),
            _ => Errno::EIO,
        }
    }

    /// The errno of a rustix error.
    pub fn from_rustix(e: rustix::io::Errno) -> Errno {
        let n = e.raw_os_error();
        if n > 0 {
            Errno(n as u32)
        } else {
            Errno::EIO
        }
    }

    /// The value as a C `int` errno.
    pub fn as_i32(self) -> i32 {
        i32::try_from(self.0).unwrap_or(libc::EIO)
    }

    /// A short name, e.g. `ENOENT`.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "OK",
            1 => "EPERM",
            2 => "ENOENT",
            5 => "EIO",
            8 => "ENOEXEC",
            9 => "EBADF",
            11 => "EAGAIN",
            13 => "EACCES",
            17 => "EEXIST",
            18 => "EXDEV",
            20 => "ENOTDIR",
            21 => "EISDIR",
            22 => "EINVAL",
            24 => "EMFILE",
            27 => "EFBIG",
            28 => "ENOSPC",
            30 => "EROFS",
            31 => "EMLINK",
            34 => "ERANGE",
            36 => "ENAMETOOLONG",
            38 => "ENOSYS",
            39 => "ENOTEMPTY",
            40 => "ELOOP",
            71 => "EPROTO",
            74 => "EBADMSG",
            95 => "EOPNOTSUPP",
            107 => "ENOTCONN",
            116 => "ESTALE",
            _ => "errno",
        }
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = std::io::Error::from_raw_os_error(self.as_i32());
        write!(f, "{} ({}): {text}", self.name(), self.0)
    }
}

impl std::error::Error for Errno {}

/// The calling program's user and group ids, carried in words 4–5 of
/// every request that creates a name (OPEN with `O_CREAT`, MKDIR,
/// SYMLINK, MKNOD). How the server applies them is its policy
/// (docs/VIO.md, "Ownership"): as given for a trusted principal, mapped
/// for others, ignored by a server that cannot change owners. Zero is
/// root, which is also what a client that does not know them sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id (the caller's file-system group).
    pub gid: u32,
}

/// A decoded request (the fields of words 1–5; paths are in the segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// [`OPEN`].
    Open {
        /// [`OPENREAD`]: also read the start of the file.
        prefetch: bool,
        /// Path length in the segment.
        path_len: u32,
        /// Linux open flags.
        flags: u32,
        /// Mode for a created file.
        mode: u32,
        /// Who creates it.
        owner: Owner,
    },
    /// [`CLOSE`].
    Close {
        /// The handle.
        handle: u32,
    },
    /// [`READ`].
    Read {
        /// The handle.
        handle: u32,
        /// Byte offset.
        offset: u64,
        /// Bytes wanted.
        count: u32,
    },
    /// [`WRITE`].
    Write {
        /// The handle.
        handle: u32,
        /// Byte offset.
        offset: u64,
        /// Bytes in the segment.
        count: u32,
        /// [`WRITE_APPEND`], [`WRITE_AT`] or 0.
        flags: u32,
    },
    /// [`STAT`].
    Stat {
        /// Path length in the segment.
        path_len: u32,
        /// Do not follow a final symbolic link.
        nofollow: bool,
    },
    /// [`FSTAT`].
    Fstat {
        /// The handle.
        handle: u32,
    },
    /// [`OPENDIR`].
    Opendir {
        /// Path length in the segment.
        path_len: u32,
    },
    /// [`READDIR`].
    Readdir {
        /// The handle.
        handle: u32,
        /// Index of the first entry wanted.
        index: u32,
    },
    /// [`MKDIR`].
    Mkdir {
        /// Path length in the segment.
        path_len: u32,
        /// Permission bits.
        mode: u32,
        /// Who creates it.
        owner: Owner,
    },
    /// [`RMDIR`].
    Rmdir {
        /// Path length in the segment.
        path_len: u32,
    },
    /// [`UNLINK`].
    Unlink {
        /// Path length in the segment.
        path_len: u32,
    },
    /// [`RENAME`].
    Rename {
        /// Old path length.
        old_len: u32,
        /// New path length.
        new_len: u32,
        /// [`RENAME_NOREPLACE`] / [`RENAME_EXCHANGE`].
        flags: u32,
    },
    /// [`TRUNCATE`].
    Truncate {
        /// Path length in the segment.
        path_len: u32,
        /// New size.
        size: u64,
    },
    /// [`FTRUNCATE`].
    Ftruncate {
        /// The handle.
        handle: u32,
        /// New size.
        size: u64,
    },
    /// [`FSYNC`].
    Fsync {
        /// The handle.
        handle: u32,
        /// Data only (fdatasync).
        datasync: bool,
        /// Only wait for deferred writes and report their errors.
        flush_only: bool,
    },
    /// [`SYMLINK`].
    Symlink {
        /// Target length.
        target_len: u32,
        /// Link path length.
        path_len: u32,
        /// Who creates it.
        owner: Owner,
    },
    /// [`MKNOD`].
    Mknod {
        /// Path length in the segment.
        path_len: u32,
        /// File type and permission bits.
        mode: u32,
        /// Device number (device nodes).
        rdev: u32,
        /// Who creates it.
        owner: Owner,
    },
    /// [`READLINK`].
    Readlink {
        /// Path length in the segment.
        path_len: u32,
    },
    /// [`SETATTR`].
    Setattr {
        /// Path length (after the record) in the segment.
        path_len: u32,
    },
    /// [`FSETATTR`].
    Fsetattr {
        /// The handle.
        handle: u32,
    },
    /// [`LINK`].
    Link {
        /// Existing path length.
        old_len: u32,
        /// New path length.
        new_len: u32,
    },
    /// [`STATFS`].
    Statfs,
    /// [`WATCH`].
    Watch {
        /// The client's callback process.
        callback: u32,
        /// Member pids in the segment.
        members: u32,
        /// [`WATCH_RENAMES`] or 0.
        flags: u32,
    },
    /// [`FALLOCATE`].
    Fallocate {
        /// File handle.
        handle: u32,
        /// [`FALLOC_KEEP_SIZE`], [`FALLOC_PUNCH_HOLE`], [`FALLOC_ZERO_RANGE`].
        mode: u32,
    },
    /// [`LSEEK`].
    Lseek {
        /// File handle.
        handle: u32,
        /// `SEEK_DATA` or `SEEK_HOLE`.
        whence: u32,
        /// Where to start looking.
        offset: u64,
    },
    /// [`LOCK`].
    Lock {
        /// File handle.
        handle: u32,
        /// Kind and flags.
        flags: u32,
        /// The client's lock owner.
        owner: u64,
        /// The locking program's pid.
        pid: u32,
    },
    /// [`GETXATTR`].
    Getxattr {
        /// Path length.
        path_len: u32,
        /// Name length.
        name_len: u32,
        /// Room for the value.
        size: u32,
    },
    /// [`LISTXATTR`].
    Listxattr {
        /// Path length.
        path_len: u32,
        /// Room for the names.
        size: u32,
    },
    /// [`SETXATTR`].
    Setxattr {
        /// Path length.
        path_len: u32,
        /// Name length.
        name_len: u32,
        /// Value length.
        value_len: u32,
        /// [`XATTR_CREATE`] / [`XATTR_REPLACE`].
        flags: u32,
    },
    /// [`REMOVEXATTR`].
    Removexattr {
        /// Path length.
        path_len: u32,
        /// Name length.
        name_len: u32,
    },
    /// [`CLOSEV`].
    Closev {
        /// Handles in the segment.
        count: u32,
    },
    /// [`READDIRPLUS`].
    Readdirplus {
        /// Directory handle.
        handle: u32,
        /// Index of the first entry.
        index: u32,
    },
}

/// What an [`INVALIDATE`] message says changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalidation {
    /// [`INVAL_ATTR`] | [`INVAL_DATA`] | [`INVAL_ENTRY`].
    pub flags: u32,
    /// The file's (device, inode), when the server names it so.
    pub id: (u32, u64),
    /// Length of the path in the segment (0: none).
    pub path_len: u32,
}

impl Invalidation {
    /// The message (the path goes in the Send's segment).
    pub fn encode(&self) -> Message {
        let mut m = Message::zero();
        let (hi, lo) = split64(self.id.1);
        m.0[..6].copy_from_slice(&[INVALIDATE, self.flags, self.id.0, hi, lo, self.path_len]);
        m
    }

    /// Decodes an [`INVALIDATE`] message (`EPROTO` for another code,
    /// unknown flags or a path over [`MAX_PATH`], two with
    /// [`INVAL_RENAME`]).
    pub fn decode(m: &Message) -> Result<Invalidation, Errno> {
        let w = &m.0;
        let known = INVAL_ATTR | INVAL_DATA | INVAL_ENTRY | INVAL_RENAME | INVAL_EXCHANGE;
        let most = if w[1] & INVAL_RENAME != 0 {
            2 * MAX_PATH + 1
        } else {
            MAX_PATH
        };
        if w[0] & CODE_MASK != INVALIDATE || w[1] & !known != 0 || w[5] as usize > most {
            return Err(Errno::EPROTO);
        }
        Ok(Invalidation {
            flags: w[1],
            id: (w[2], join64(w[3], w[4])),
            path_len: w[5],
        })
    }
}

fn split64(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

fn join64(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

impl Request {
    /// True for requests that may change the exported tree (or open a file
    /// for writing): a read-only principal is refused them.
    pub fn modifies(&self) -> bool {
        match self {
            Request::Open { flags, .. } => {
                let f = *flags as i32;
                f & libc::O_ACCMODE != libc::O_RDONLY
                    || f & (libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) != 0
            }
            Request::Write { .. }
            | Request::Mkdir { .. }
            | Request::Rmdir { .. }
            | Request::Unlink { .. }
            | Request::Rename { .. }
            | Request::Truncate { .. }
            | Request::Ftruncate { .. }
            | Request::Symlink { .. }
            | Request::Mknod { .. }
            | Request::Setattr { .. }
            | Request::Fsetattr { .. }
            | Request::Setxattr { .. }
            | Request::Removexattr { .. }
            | Request::Fallocate { .. }
            | Request::Link { .. } => true,
            Request::Close { .. }
            | Request::Read { .. }
            | Request::Stat { .. }
            | Request::Fstat { .. }
            | Request::Opendir { .. }
            | Request::Readdir { .. }
            | Request::Fsync { .. }
            | Request::Readlink { .. }
            | Request::Statfs
            | Request::Watch { .. }
            | Request::Closev { .. }
            | Request::Lock { .. }
            | Request::Getxattr { .. }
            | Request::Listxattr { .. }
            | Request::Lseek { .. }
            | Request::Readdirplus { .. } => false,
        }
    }

    /// True for requests that change nothing, so a retransmitted one may be
    /// executed again (the kernel then need not keep the reply).
    pub fn idempotent(&self) -> bool {
        matches!(
            self,
            Request::Read { .. }
                | Request::Stat { .. }
                | Request::Fstat { .. }
                | Request::Readdir { .. }
                | Request::Readdirplus { .. }
                | Request::Readlink { .. }
                | Request::Getxattr { .. }
                | Request::Listxattr { .. }
                | Request::Lseek { .. }
                | Request::Statfs
        )
    }

    /// Bytes of the segment taken by the request's paths and records.
    pub fn seg_input_len(&self) -> usize {
        match *self {
            Request::Open { path_len, .. }
            | Request::Stat { path_len, .. }
            | Request::Opendir { path_len }
            | Request::Mkdir { path_len, .. }
            | Request::Mknod { path_len, .. }
            | Request::Rmdir { path_len }
            | Request::Unlink { path_len }
            | Request::Truncate { path_len, .. }
            | Request::Readlink { path_len } => path_len as usize,
            Request::Setattr { path_len } => SETATTR_LEN + path_len as usize,
            Request::Fsetattr { .. } => SETATTR_LEN,
            Request::Rename {
                old_len, new_len, ..
            }
            | Request::Link { old_len, new_len } => old_len as usize + new_len as usize,
            Request::Symlink {
                target_len,
                path_len,
                ..
            } => target_len as usize + path_len as usize,
            Request::Write { count, .. } => count as usize,
            Request::Watch { members, .. } => members as usize * 4,
            Request::Closev { count } => count as usize * 4,
            Request::Lock { .. } => LOCK_RANGE_LEN,
            Request::Fallocate { .. } => FALLOC_RANGE_LEN,
            Request::Getxattr {
                path_len, name_len, ..
            }
            | Request::Removexattr { path_len, name_len } => (path_len + name_len) as usize,
            Request::Listxattr { path_len, .. } => path_len as usize,
            Request::Setxattr {
                path_len,
                name_len,
                value_len,
                ..
            } => (path_len + name_len + value_len) as usize,
            _ => 0,
        }
    }

    /// The request message (code, fields, and the idempotent flag when it
    /// applies). The segment is declared by the kernel on Send.
    pub fn encode(&self) -> Message {
        let mut m = Message::zero();
        let w = &mut m.0;
        let code = match *self {
            Request::Open {
                prefetch,
                path_len,
                flags,
                mode,
                owner,
            } => {
                (w[1], w[2], w[3]) = (path_len, flags, mode);
                (w[4], w[5]) = (owner.uid, owner.gid);
                if prefetch {
                    OPENREAD
                } else {
                    OPEN
                }
            }
            Request::Close { handle } => {
                w[1] = handle;
                CLOSE
            }
            Request::Read {
                handle,
                offset,
                count,
            } => {
                w[1] = handle;
                (w[2], w[3]) = split64(offset);
                w[4] = count;
                READ
            }
            Request::Write {
                handle,
                offset,
                count,
                flags,
            } => {
                w[1] = handle;
                (w[2], w[3]) = split64(offset);
                (w[4], w[5]) = (count, flags);
                WRITE
            }
            Request::Stat { path_len, nofollow } => {
                w[1] = path_len;
                w[2] = if nofollow { STAT_NOFOLLOW } else { 0 };
                STAT
            }
            Request::Fstat { handle } => {
                w[1] = handle;
                FSTAT
            }
            Request::Opendir { path_len } => {
                w[1] = path_len;
                OPENDIR
            }
            Request::Readdir { handle, index } => {
                (w[1], w[2]) = (handle, index);
                READDIR
            }
            Request::Mkdir {
                path_len,
                mode,
                owner,
            } => {
                (w[1], w[2]) = (path_len, mode);
                (w[4], w[5]) = (owner.uid, owner.gid);
                MKDIR
            }
            Request::Rmdir { path_len } => {
                w[1] = path_len;
                RMDIR
            }
            Request::Unlink { path_len } => {
                w[1] = path_len;
                UNLINK
            }
            Request::Rename {
                old_len,
                new_len,
                flags,
            } => {
                (w[1], w[2], w[3]) = (old_len, new_len, flags);
                RENAME
            }
            Request::Truncate { path_len, size } => {
                w[1] = path_len;
                (w[2], w[3]) = split64(size);
                TRUNCATE
            }
            Request::Ftruncate { handle, size } => {
                w[1] = handle;
                (w[2], w[3]) = split64(size);
                FTRUNCATE
            }
            Request::Fsync {
                handle,
                datasync,
                flush_only,
            } => {
                w[1] = handle;
                w[2] = if datasync { FSYNC_DATASYNC } else { 0 }
                    | if flush_only { FSYNC_FLUSH_ONLY } else { 0 };
                FSYNC
            }
            Request::Symlink {
                target_len,
                path_len,
                owner,
            } => {
                (w[1], w[2]) = (target_len, path_len);
                (w[4], w[5]) = (owner.uid, owner.gid);
                SYMLINK
            }
            Request::Mknod {
                path_len,
                mode,
                rdev,
                owner,
            } => {
                (w[1], w[2], w[3]) = (path_len, mode, rdev);
                (w[4], w[5]) = (owner.uid, owner.gid);
                MKNOD
            }
            Request::Readlink { path_len } => {
                w[1] = path_len;
                READLINK
            }
            Request::Setattr { path_len } => {
                w[1] = path_len;
                SETATTR
            }
            Request::Fsetattr { handle } => {
                w[1] = handle;
                FSETATTR
            }
            Request::Link { old_len, new_len } => {
                (w[1], w[2]) = (old_len, new_len);
                LINK
            }
            Request::Statfs => STATFS,
            Request::Watch {
                callback,
                members,
                flags,
            } => {
                (w[1], w[2], w[3]) = (callback, members, flags);
                WATCH
            }
            Request::Readdirplus { handle, index } => {
                (w[1], w[2]) = (handle, index);
                READDIRPLUS
            }
            Request::Closev { count } => {
                w[1] = count;
                CLOSEV
            }
            Request::Lock {
                handle,
                flags,
                owner,
                pid,
            } => {
                (w[1], w[2]) = (handle, flags);
                (w[3], w[4]) = split64(owner);
                w[5] = pid;
                LOCK
            }
            Request::Getxattr {
                path_len,
                name_len,
                size,
            } => {
                (w[1], w[2], w[3]) = (path_len, name_len, size);
                GETXATTR
            }
            Request::Listxattr { path_len, size } => {
                (w[1], w[2]) = (path_len, size);
                LISTXATTR
            }
            Request::Setxattr {
                path_len,
                name_len,
                value_len,
                flags,
            } => {
                (w[1], w[2], w[3], w[4]) = (path_len, name_len, value_len, flags);
                SETXATTR
            }
            Request::Removexattr { path_len, name_len } => {
                (w[1], w[2]) = (path_len, name_len);
                REMOVEXATTR
            }
            Request::Fallocate { handle, mode } => {
                (w[1], w[2]) = (handle, mode);
                FALLOCATE
            }
            Request::Lseek {
                handle,
                whence,
                offset,
            } => {
                (w[1], w[2]) = (handle, whence);
                (w[3], w[4]) = split64(offset);
                LSEEK
            }
        };
        w[0] = code;
        if self.idempotent() {
            m.set_flag(IDEMPOTENT, true);
        }
        m
    }

    /// Decodes a request message: `ENOSYS` for an unknown code,
    /// `ENAMETOOLONG` for a path length over [`MAX_PATH`], `EINVAL` for
    /// bad flag values.
    pub fn decode(m: &Message) -> Result<Request, Errno> {
        let w = &m.0;
        let path = |n: u32| -> Result<u32, Errno> {
            if n as usize > MAX_PATH {
                Err(Errno::ENAMETOOLONG)
            } else {
                Ok(n)
            }
        };
        let owner = Owner {
            uid: w[4],
            gid: w[5],
        };
        let xname = |n: u32| -> Result<u32, Errno> {
            match n {
                0 => Err(Errno::EINVAL),
                n if n as usize > MAX_NAME => Err(Errno(libc::ERANGE as u32)),
                n => Ok(n),
            }
        };
        // -1 is chown's "leave it", never an owner.
        let creates = matches!(w[0] & CODE_MASK, OPEN | OPENREAD | MKDIR | SYMLINK | MKNOD);
        if creates && (owner.uid == u32::MAX || owner.gid == u32::MAX) {
            return Err(Errno::EINVAL);
        }
        let r = match w[0] & CODE_MASK {
            OPEN | OPENREAD => Request::Open {
                prefetch: w[0] & CODE_MASK == OPENREAD,
                path_len: path(w[1])?,
                flags: w[2],
                mode: w[3],
                owner,
            },
            CLOSE => Request::Close { handle: w[1] },
            READ => Request::Read {
                handle: w[1],
                offset: join64(w[2], w[3]),
                count: w[4],
            },
            WRITE => {
                if w[5] & !(WRITE_APPEND | WRITE_AT) != 0 || w[5] == WRITE_APPEND | WRITE_AT {
                    return Err(Errno::EINVAL);
                }
                Request::Write {
                    handle: w[1],
                    offset: join64(w[2], w[3]),
                    count: w[4],
                    flags: w[5],
                }
            }
            STAT => {
                if w[2] & !STAT_NOFOLLOW != 0 {
                    return Err(Errno::EINVAL);
                }
                Request::Stat {
                    path_len: path(w[1])?,
                    nofollow: w[2] & STAT_NOFOLLOW != 0,
                }
            }
            FSTAT => Request::Fstat { handle: w[1] },
            OPENDIR => Request::Opendir {
                path_len: path(w[1])?,
            },
            READDIR => Request::Readdir {
                handle: w[1],
                index: w[2],
            },
            MKDIR => Request::Mkdir {
                path_len: path(w[1])?,
                mode: w[2],
                owner,
            },
            RMDIR => Request::Rmdir {
                path_len: path(w[1])?,
            },
            UNLINK => Request::Unlink {
                path_len: path(w[1])?,
            },
            RENAME => {
                if w[3] & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
                    || w[3] == RENAME_NOREPLACE | RENAME_EXCHANGE
                {
                    return Err(Errno::EINVAL);
                }
                Request::Rename {
                    old_len: path(w[1])?,
                    new_len: path(w[2])?,
                    flags: w[3],
                }
            }
            TRUNCATE => Request::Truncate {
                path_len: path(w[1])?,
                size: join64(w[2], w[3]),
            },
            FTRUNCATE => Request::Ftruncate {
                handle: w[1],
                size: join64(w[2], w[3]),
            },
            FSYNC => {
                if w[2] & !(FSYNC_DATASYNC | FSYNC_FLUSH_ONLY) != 0 {
                    return Err(Errno::EINVAL);
                }
                Request::Fsync {
                    handle: w[1],
                    datasync: w[2] & FSYNC_DATASYNC != 0,
                    flush_only: w[2] & FSYNC_FLUSH_ONLY != 0,
                }
            }
            SYMLINK => Request::Symlink {
                target_len: path(w[1])?,
                path_len: path(w[2])?,
                owner,
            },
            MKNOD => Request::Mknod {
                path_len: path(w[1])?,
                mode: w[2],
                rdev: w[3],
                owner,
            },
            READLINK => Request::Readlink {
                path_len: path(w[1])?,
            },
            SETATTR => Request::Setattr {
                path_len: path(w[1])?,
            },
            FSETATTR => Request::Fsetattr { handle: w[1] },
            LINK => Request::Link {
                old_len: path(w[1])?,
                new_len: path(w[2])?,
            },
            STATFS => Request::Statfs,
            WATCH => {
                if w[2] > MAX_WATCH_MEMBERS {
                    return Err(Errno::EINVAL);
                }
                Request::Watch {
                    callback: w[1],
                    members: w[2],
                    // Unknown bits are ignored: a newer client's wishes.
                    flags: w[3] & WATCH_RENAMES,
                }
            }
            READDIRPLUS => Request::Readdirplus {
                handle: w[1],
                index: w[2],
            },
            GETXATTR => Request::Getxattr {
                path_len: path(w[1])?,
                name_len: xname(w[2])?,
                size: w[3].min(MAX_XATTR_VALUE),
            },
            LISTXATTR => Request::Listxattr {
                path_len: path(w[1])?,
                size: w[2].min(MAX_XATTR_VALUE),
            },
            SETXATTR => {
                if w[3] > MAX_XATTR_VALUE {
                    return Err(Errno(libc::E2BIG as u32));
                }
                if w[4] & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
                    return Err(Errno::EINVAL);
                }
                Request::Setxattr {
                    path_len: path(w[1])?,
                    name_len: xname(w[2])?,
                    value_len: w[3],
                    flags: w[4],
                }
            }
            REMOVEXATTR => Request::Removexattr {
                path_len: path(w[1])?,
                name_len: xname(w[2])?,
            },
            FALLOCATE => {
                if w[2] & !(FALLOC_KEEP_SIZE | FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0 {
                    return Err(Errno::EOPNOTSUPP);
                }
                Request::Fallocate {
                    handle: w[1],
                    mode: w[2],
                }
            }
            LSEEK => {
                if w[2] != libc::SEEK_DATA as u32 && w[2] != libc::SEEK_HOLE as u32 {
                    return Err(Errno::EINVAL);
                }
                Request::Lseek {
                    handle: w[1],
                    whence: w[2],
                    offset: join64(w[3], w[4]),
                }
            }
            LOCK => {
                if w[2] & !(3 | LOCK_WAIT | LOCK_TEST) != 0 || w[2] & 3 == 3 {
                    return Err(Errno::EINVAL);
                }
                Request::Lock {
                    handle: w[1],
                    flags: w[2],
                    owner: join64(w[3], w[4]),
                    pid: w[5],
                }
            }
            CLOSEV => {
                if w[1] > MAX_CLOSEV {
                    return Err(Errno::EINVAL);
                }
                Request::Closev { count: w[1] }
            }
            _ => return Err(Errno::ENOSYS),
        };
        Ok(r)
    }
}

/// A reply message: word 0 the status, `words` in words 1–5.
pub fn reply(status: Errno, words: &[u32]) -> Message {
    let mut m = Message::zero();
    m.0[0] = status.0 & CODE_MASK;
    for (i, &v) in words.iter().take(5).enumerate() {
        m.0[1 + i] = v;
    }
    m
}

/// Words 1–5 of a reply (what each request answers there: the request
/// table in docs/VIO.md).
pub fn reply_words(m: &Message) -> [u32; 5] {
    [m.0[1], m.0[2], m.0[3], m.0[4], m.0[5]]
}

/// The request code of a message (word 0 without the kernel's flags).
pub fn code(m: &Message) -> u32 {
    m.0[0] & CODE_MASK
}

/// Whether requests with this code carry a handle in word 1.
pub fn carries_handle(code: u32) -> bool {
    matches!(
        code,
        CLOSE
            | READ
            | WRITE
            | FSTAT
            | READDIR
            | READDIRPLUS
            | FTRUNCATE
            | FSYNC
            | FSETATTR
            | LOCK
            | FALLOCATE
            | LSEEK
    )
}

/// The handle of a request that carries one.
pub fn request_handle(m: &Message) -> Option<u32> {
    carries_handle(code(m)).then_some(m.0[1])
}

/// Replaces the handle of a request that carries one (a client maps its
/// own handle numbers to the server's).
pub fn set_request_handle(m: &mut Message, handle: u32) {
    if carries_handle(code(m)) {
        m.0[1] = handle;
    }
}

/// The status of a reply message.
pub fn status(m: &Message) -> Errno {
    Errno(m.0[0] & CODE_MASK)
}

#[cfg(test)]
mod tests;
