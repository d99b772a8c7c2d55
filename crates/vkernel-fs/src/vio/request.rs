//! The requests: the decoded [`Request`], what each may do (modify,
//! repeat, read from the segment), and the request message's code and
//! handle words.

use super::*;

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
    /// [`UNWATCH`].
    Unwatch {
        /// The callback process its WATCH named.
        callback: u32,
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
    /// [`REMOVEV`].
    Removev {
        /// Removals in the segment.
        count: u32,
        /// The segment's length.
        len: u32,
    },
    /// [`READDIRPLUS`].
    Readdirplus {
        /// Directory handle.
        handle: u32,
        /// Index of the first entry.
        index: u32,
    },
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
            | Request::Removev { .. }
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
            | Request::Unwatch { .. }
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
            Request::Removev { len, .. } => len as usize,
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
