//! Replies: the errno-like status codes and the reply message.

use super::*;

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

/// The status of a reply message.
pub fn status(m: &Message) -> Errno {
    Errno(m.0[0] & CODE_MASK)
}
