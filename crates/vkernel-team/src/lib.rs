//! Pipes and the team server, as ordinary V services (see `docs/EXEC.md`).
//!
//! - [`pipe`]: a pipe server per logical host. Write order is kept; a
//!   reader waiting on an empty pipe, and a writer on a full one, are held
//!   by a delayed Reply; the reader sees end-of-file once the write end is
//!   closed (or its holder is gone) and the data drained; ends can be
//!   handed to other processes.
//! - [`team`]: a team server per logical host. It loads a program from a
//!   file server the way V did (a header read, then the image by MoveTo),
//!   runs it as an OS process whose stdin, stdout and stderr travel over
//!   V pipes, returns its exit status, and kills it when the client that
//!   asked is gone.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod msg;
pub mod pipe;
pub mod team;

/// Errno-like status carried in word 0 of a reply (0 = success).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub u32);

impl Status {
    /// Success.
    pub const OK: Status = Status(0);
    /// No such file (program not found on the file server).
    pub const ENOENT: Status = Status(2);
    /// Not an executable format.
    pub const ENOEXEC: Status = Status(8);
    /// Unknown pipe or job, or the caller does not hold that end.
    pub const EBADF: Status = Status(9);
    /// The team server could not start the program.
    pub const ECHILD: Status = Status(10);
    /// Refused by policy (remote request, principal).
    pub const EACCES: Status = Status(13);
    /// Bad request fields.
    pub const EINVAL: Status = Status(22);
    /// Too many pipes or jobs.
    pub const ENFILE: Status = Status(23);
    /// Image larger than the team server accepts.
    pub const EFBIG: Status = Status(27);
    /// The read end is closed.
    pub const EPIPE: Status = Status(32);
    /// Unknown request code.
    pub const ENOSYS: Status = Status(38);

    /// A short name.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "OK",
            2 => "ENOENT",
            8 => "ENOEXEC",
            9 => "EBADF",
            10 => "ECHILD",
            13 => "EACCES",
            22 => "EINVAL",
            23 => "ENFILE",
            27 => "EFBIG",
            32 => "EPIPE",
            38 => "ENOSYS",
            _ => "errno",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}
