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
    /// The machine host this program attached to has gone (killed,
    /// stopped or restarted): its processes are no more; attach again.
    #[error("the machine host this program attached to has gone (attach again)")]
    HostLost,
}

impl IpcError {
    /// A stable numeric form: (code, argument). Codes start at 1 (0 is
    /// success where a code travels in place of a result).
    pub fn code(&self) -> (u32, u32) {
        use IpcError::*;
        match *self {
            NoSuchProcess(p) => (1, p.0),
            Timeout(p) => (2, p.0),
            NotAwaitingReply(p) => (3, p.0),
            AccessDenied(p) => (4, p.0),
            OutOfBounds(p) => (5, p.0),
            SegmentTooLarge { max } => (6, u32::try_from(max).unwrap_or(u32::MAX)),
            InvalidPid(p) => (7, p.0),
            NotAProcess(p) => (8, p.0),
            Busy(p) => (9, p.0),
            NoHostId => (10, 0),
            TableFull => (11, 0),
            OutOfDescriptors => (12, 0),
            NoResources => (13, 0),
            Destroyed => (14, 0),
            GroupUnsupported => (15, 0),
            Refused(p) => (16, p.0),
            Deadline(p) => (17, p.0),
            Shutdown => (18, 0),
            HostLost => (19, 0),
        }
    }

    /// The error a [`IpcError::code`] pair names; an unknown code (from a
    /// newer peer, or a corrupted one) reads as `Refused(arg)`.
    pub fn from_code(code: u32, arg: u32) -> IpcError {
        use IpcError::*;
        let p = Pid(arg);
        match code {
            1 => NoSuchProcess(p),
            2 => Timeout(p),
            3 => NotAwaitingReply(p),
            4 => AccessDenied(p),
            5 => OutOfBounds(p),
            6 => SegmentTooLarge { max: arg as usize },
            7 => InvalidPid(p),
            8 => NotAProcess(p),
            9 => Busy(p),
            10 => NoHostId,
            11 => TableFull,
            12 => OutOfDescriptors,
            13 => NoResources,
            14 => Destroyed,
            15 => GroupUnsupported,
            17 => Deadline(p),
            18 => Shutdown,
            19 => HostLost,
            _ => Refused(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_round_trips_through_its_code() {
        let p = Pid(0x0001_0002);
        let all = [
            IpcError::NoSuchProcess(p),
            IpcError::Timeout(p),
            IpcError::NotAwaitingReply(p),
            IpcError::AccessDenied(p),
            IpcError::OutOfBounds(p),
            IpcError::SegmentTooLarge { max: 1400 },
            IpcError::InvalidPid(p),
            IpcError::NotAProcess(p),
            IpcError::Busy(p),
            IpcError::NoHostId,
            IpcError::TableFull,
            IpcError::OutOfDescriptors,
            IpcError::NoResources,
            IpcError::Destroyed,
            IpcError::GroupUnsupported,
            IpcError::Refused(p),
            IpcError::Deadline(p),
            IpcError::Shutdown,
            IpcError::HostLost,
        ];
        for e in all {
            let (c, a) = e.code();
            assert_eq!(IpcError::from_code(c, a), e);
        }
        assert_eq!(IpcError::from_code(999, 7), IpcError::Refused(Pid(7)));
    }
}
