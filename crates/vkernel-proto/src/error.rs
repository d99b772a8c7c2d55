//! Typed errors returned by IPC operations.

use crate::pid::Pid;

/// Why an IPC operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IpcError {
    /// The named process does not exist (its host said so, or it is local).
    #[error("process {0} does not exist")]
    NoSuchProcess(Pid),
    /// The peer host did not answer within the host timeout.
    #[error("host of process {0} did not answer (timeout)")]
    Timeout(Pid),
    /// Reply/Forward/MoveTo/MoveFrom on a process not awaiting reply from the caller.
    #[error("process {0} is not awaiting reply from the caller")]
    NotAwaitingReply(Pid),
    /// The segment does not grant the access.
    #[error("segment of process {0} does not grant this access")]
    AccessDenied(Pid),
    /// The access falls outside the granted segment.
    #[error("access outside the segment of process {0}")]
    OutOfBounds(Pid),
    /// The data is larger than can travel appended to a message.
    #[error("appended segment larger than {max} bytes")]
    SegmentTooLarge {
        /// The limit.
        max: usize,
    },
    /// The pid cannot name a process (null, group, or bad host).
    #[error("{0} is not a valid process id")]
    InvalidPid(Pid),
    /// The calling pid is not a live process of this host.
    #[error("caller {0} is not a process of this logical host")]
    NotAProcess(Pid),
    /// The caller is already blocked in another operation.
    #[error("process {0} is already blocked in an operation")]
    Busy(Pid),
    /// The logical host has no id yet (announcement in progress).
    #[error("logical host id not yet allocated")]
    NoHostId,
    /// No local id is free.
    #[error("process table full")]
    TableFull,
    /// The runtime could not get the file descriptors a process needs
    /// (EMFILE/ENFILE).
    #[error("out of file descriptors: each process holds 2 (raise `ulimit -n`)")]
    OutOfDescriptors,
    /// The remote kernel refused the request for lack of resources.
    #[error("remote kernel has no resources")]
    NoResources,
    /// The process was destroyed while the operation was pending.
    #[error("process destroyed")]
    Destroyed,
    /// Group ids are not handled by this operation.
    #[error("group ids are not supported by this operation")]
    GroupUnsupported,
    /// The peer kernel refused a request as malformed.
    #[error("the kernel of process {0} refused the request as malformed")]
    Refused(Pid),
    /// No reply came within the Send's deadline: the exchange was
    /// abandoned (a late reply is discarded).
    #[error("no reply from process {0} within the deadline")]
    Deadline(Pid),
    /// The kernel is shutting down.
    #[error("kernel shut down")]
    Shutdown,
}
