//! The public IPC API: a [`Process`] handle and its primitives.
//!
//! A process is either one of a logical host whose engine runs in this
//! program ([`local`]) or one of a machine host this program attached to
//! (`crate::attach`): the methods and their meaning are the same.

pub(crate) mod direct;
pub(crate) mod local;

use std::time::Duration;

use vkernel_proto::{IpcError, Message, Pid, Scope};

use crate::attach::program::AttachedProcess;
pub(crate) use local::{LocalPeer, LocalProcess};
// The plain types of the API live in `crate::vocab`; this path stays for
// the modules that name them here.
pub use crate::vocab::{HostLoad, Incoming, Reply, Segment, WaitCounts};

/// A V process: a pid and the IPC primitives. Use it from one thread at a
/// time (it is `Send` but not `Sync`). Dropping it destroys the process.
#[derive(Debug)]
pub struct Process {
    imp: Imp,
}

#[derive(Debug)]
enum Imp {
    Local(LocalProcess),
    Attached(Box<AttachedProcess>),
}

/// Runs `$e` on whichever kind of process this is. A local process first
/// sends the replies it holds (`set_reply_batching`), unless the call is
/// marked `keep` (Receive, Reply, and calls that neither send nor wait).
macro_rules! either {
    ($self:ident, $p:ident => $e:expr) => {
        match &$self.imp {
            Imp::Local($p) => {
                $p.flush_replies();
                $e
            }
            Imp::Attached($p) => $e,
        }
    };
    (keep $self:ident, $p:ident => $e:expr) => {
        match &$self.imp {
            Imp::Local($p) => $e,
            Imp::Attached($p) => $e,
        }
    };
}

impl From<LocalProcess> for Process {
    fn from(p: LocalProcess) -> Process {
        Process { imp: Imp::Local(p) }
    }
}

impl From<AttachedProcess> for Process {
    fn from(p: AttachedProcess) -> Process {
        Process {
            imp: Imp::Attached(Box::new(p)),
        }
    }
}

impl Process {
    /// This process's pid.
    pub fn pid(&self) -> Pid {
        either!(keep self, p => p.pid())
    }

    /// True if this process belongs to a machine host this program
    /// attached to (see `Kernel::attach`).
    pub fn is_attached(&self) -> bool {
        matches!(self.imp, Imp::Attached(_))
    }

    /// Makes this process busy-poll exactly `d` before it blocks when it
    /// waits, whatever happens (zero: always block). By default it follows
    /// the host's `KernelConfig::spin` and `adaptive_spin`.
    pub fn set_spin(&self, d: Duration) {
        either!(keep self, p => p.set_spin(d))
    }

    /// Makes this process busy-poll at most `cap` before it blocks, and
    /// only as long as spinning pays (see `KernelConfig::adaptive_spin`).
    pub fn set_spin_auto(&self, cap: Duration) {
        either!(keep self, p => p.set_spin_auto(cap))
    }

    /// How this process's waits have ended so far.
    pub fn wait_counts(&self) -> WaitCounts {
        either!(keep self, p => p.wait_counts())
    }

    /// Sets the principal this process runs as (the thesis's
    /// `userNumber`): it travels with every Send and services may decide
    /// by it. An attached program that is not root may only claim its own
    /// uid (its principal by default).
    pub fn set_principal(&self, principal: u32) {
        either!(keep self, p => p.set_principal(principal))
    }

    /// Only senders running as one of `principals` may Send to this
    /// process (`None`: anyone); others get [`IpcError::AccessDenied`].
    pub fn restrict_senders(&self, principals: Option<Vec<u32>>) {
        either!(keep self, p => p.restrict_senders(principals))
    }

    /// Whether this process, when blocked, also reads the host's socket
    /// (default true: a waiting process usually reads its own reply). A
    /// process that rarely talks to other hosts can turn it off to avoid
    /// being woken by every datagram.
    pub fn set_socket_reader(&self, on: bool) {
        either!(keep self, p => p.set_socket_reader(on))
    }

    /// Send: delivers `msg` to `to` and blocks until it is received and
    /// replied to; the reply overwrites `msg`.
    pub fn send(&self, msg: &mut Message, to: Pid) -> Result<Reply, IpcError> {
        either!(self, p => p.send(msg, to))
    }

    /// Sets the deadline of this process's Sends (the host's
    /// `KernelConfig::send_deadline` by default): a Send not replied to
    /// within it fails with [`IpcError::Deadline`] and its exchange is
    /// abandoned. `None` waits as long as the server's host answers.
    pub fn set_send_deadline(&self, d: Option<Duration>) {
        either!(keep self, p => p.set_send_deadline(d))
    }

    /// The deadline of this process's Sends.
    pub fn send_deadline(&self) -> Option<Duration> {
        either!(keep self, p => p.send_deadline())
    }

    /// [`Process::send`] with this call's own deadline (`None`: none).
    pub fn send_within(
        &self,
        msg: &mut Message,
        to: Pid,
        deadline: Option<Duration>,
    ) -> Result<Reply, IpcError> {
        either!(self, p => p.send_within(msg, to, deadline))
    }

    /// Send with a segment the receiver may access while this process awaits
    /// its reply. The segment's rights are set in `msg` from `seg`.
    pub fn send_with_segment(
        &self,
        msg: &mut Message,
        to: Pid,
        seg: Segment<'_>,
    ) -> Result<Reply, IpcError> {
        self.send_with_segment_append(msg, to, seg, usize::MAX)
    }

    /// [`Process::send_with_segment`] with at most `append` bytes of a
    /// readable segment travelling with the message (the receiver gets
    /// them by receive-with-segment and may MoveFrom the rest). A segment
    /// laid out as data-out followed by room for data-in keeps the room
    /// off the wire by appending only the data-out part.
    pub fn send_with_segment_append(
        &self,
        msg: &mut Message,
        to: Pid,
        seg: Segment<'_>,
        append: usize,
    ) -> Result<Reply, IpcError> {
        self.send_with_segment_within(msg, to, seg, append, self.send_deadline())
    }

    /// [`Process::send_with_segment_append`] with this call's own deadline
    /// (`None`: none); see [`Process::set_send_deadline`].
    pub fn send_with_segment_within(
        &self,
        msg: &mut Message,
        to: Pid,
        seg: Segment<'_>,
        append: usize,
        deadline: Option<Duration>,
    ) -> Result<Reply, IpcError> {
        either!(self, p => p.send_with_segment_within(msg, to, seg, append, deadline))
    }

    /// Receive: blocks until a message arrives (first come, first served).
    pub fn receive(&self, msg: &mut Message) -> Result<Incoming, IpcError> {
        either!(keep self, p => p.receive(msg))
    }

    /// Receive-with-segment: also copies the first part of a read-granted
    /// segment into `buf` (`Incoming::seg_bytes` says how much).
    pub fn receive_with_segment(
        &self,
        msg: &mut Message,
        buf: &mut [u8],
    ) -> Result<Incoming, IpcError> {
        self.receive_with_segment_upto(msg, buf, usize::MAX)
    }

    /// [`Process::receive_with_segment`] that copies only from a segment
    /// at most `upto` bytes long (`Incoming::seg_bytes` is 0 otherwise): a
    /// dispatcher that hands large requests to workers, which receive them
    /// again, need not copy their first part.
    pub fn receive_with_segment_upto(
        &self,
        msg: &mut Message,
        buf: &mut [u8],
        upto: usize,
    ) -> Result<Incoming, IpcError> {
        either!(keep self, p => p.receive_with_segment_upto(msg, buf, upto))
    }

    /// ReceiveSpecific: waits for a message from `from` only. Returns
    /// `Ok(None)` if `from` does not exist (the V convention of returning 0).
    pub fn receive_specific(
        &self,
        msg: &mut Message,
        from: Pid,
    ) -> Result<Option<Incoming>, IpcError> {
        either!(keep self, p => p.receive_specific(msg, from))
    }

    /// Makes this process hold its replies to other hosts while more
    /// requests are queued for it, and send them together in one system
    /// call (`sendmmsg`): a server answering many clients' small requests
    /// spends less per exchange. A held reply leaves when no request is
    /// queued any more, when 16 are held, when the first has waited 50 µs
    /// (checked at each Receive and Reply), before any other operation,
    /// and before the process waits. So only work the process does
    /// between a Reply and its next Receive or Reply, outside vkernel,
    /// delays them: leave it off (the default) if a request can take long
    /// to serve. Turning it off sends what is held. False for a process of
    /// a program attached to a machine host, which sends each reply at
    /// once.
    pub fn set_reply_batching(&self, on: bool) -> bool {
        match &self.imp {
            Imp::Local(p) => {
                p.set_reply_batching(on);
                true
            }
            Imp::Attached(_) => false,
        }
    }

    /// Reply: `to` must be awaiting reply from this process. Does not block.
    pub fn reply(&self, msg: &Message, to: Pid) -> Result<(), IpcError> {
        either!(keep self, p => p.reply(msg, to))
    }

    /// Reply-with-segment: also writes `data` at `offset` in `to`'s
    /// write-granted segment. Up to one datagram's worth travels in the
    /// reply. More goes ahead of the reply in bulk chunks when the request
    /// is idempotent (nothing waits for an acknowledgement; a lost chunk
    /// makes the request run again), and otherwise by MoveTo before the
    /// reply (blocking until acknowledged; the sender's
    /// [`Reply::seg_bytes`] then does not count them).
    pub fn reply_with_segment(
        &self,
        msg: &Message,
        to: Pid,
        offset: u32,
        data: &[u8],
    ) -> Result<(), IpcError> {
        either!(self, p => p.reply_with_segment(msg, to, offset, data))
    }

    /// Forward: passes `from`'s request (as `msg`) to `to` as if `from` had
    /// sent it; `from` must be awaiting reply from this process.
    pub fn forward(&self, msg: &Message, from: Pid, to: Pid) -> Result<(), IpcError> {
        either!(self, p => p.forward(msg, from, to))
    }

    /// MoveTo: copies `src` into `to`'s write-granted segment at `offset`.
    pub fn move_to(&self, to: Pid, offset: u32, src: &[u8]) -> Result<usize, IpcError> {
        either!(self, p => p.move_to(to, offset, src))
    }

    /// MoveTo from a buffer the caller shares and cannot change:
    /// `data[range]` into `to`'s write-granted segment at `offset`. The
    /// same as [`Process::move_to`], except that a write-behind MoveTo
    /// (one that returns before its data is acknowledged) keeps a
    /// reference to `data` instead of copying it: a server moving a large
    /// reply in units out of its cache copies nothing on its side. A range
    /// outside `data` is [`IpcError::OutOfBounds`] (naming this process).
    pub fn move_to_shared(
        &self,
        to: Pid,
        offset: u32,
        data: &std::sync::Arc<[u8]>,
        range: std::ops::Range<usize>,
    ) -> Result<usize, IpcError> {
        match &self.imp {
            Imp::Local(p) => {
                p.flush_replies();
                p.move_to_shared(to, offset, data, range)
            }
            Imp::Attached(p) => {
                let src = data.get(range).ok_or(IpcError::OutOfBounds(self.pid()))?;
                p.move_to(to, offset, src)
            }
        }
    }

    /// MoveFrom: copies from `from`'s read-granted segment at `offset` into `dest`.
    pub fn move_from(&self, from: Pid, offset: u32, dest: &mut [u8]) -> Result<usize, IpcError> {
        either!(self, p => p.move_from(from, offset, dest))
    }

    /// SetPid: registers `pid` under `logical` with a scope.
    pub fn set_pid(&self, logical: u32, pid: Pid, scope: Scope) {
        either!(self, p => p.set_pid(logical, pid, scope))
    }

    /// GetPid: looks up `logical`; the null pid if nobody answers.
    pub fn get_pid(&self, logical: u32, scope: Scope) -> Result<Pid, IpcError> {
        either!(self, p => p.get_pid(logical, scope))
    }

    /// AllocateGroupId: a new process group with this process as its first
    /// member. Send to the group id reaches every member on every host;
    /// the reply mode is set in the message ([`Message::set_group_mode`]).
    pub fn allocate_group_id(&self) -> Result<Pid, IpcError> {
        either!(self, p => p.allocate_group_id())
    }

    /// JoinGroup: makes `pid` a member of `group`. For a process on another
    /// host the request goes to that host's kernel server, whose group
    /// policy may refuse it ([`IpcError::AccessDenied`]).
    pub fn join_group(&self, group: Pid, pid: Pid) -> Result<(), IpcError> {
        either!(self, p => p.join_group(group, pid))
    }

    /// LeaveGroup: `pid` stops being a member of `group` (not an error if
    /// it was not one).
    pub fn leave_group(&self, group: Pid, pid: Pid) -> Result<(), IpcError> {
        either!(self, p => p.leave_group(group, pid))
    }

    /// GetReply: the next queued reply to this process's latest
    /// multi-reply group Send (it overwrites `msg`) and who sent it, or
    /// `None` if none is queued.
    pub fn get_reply(&self, msg: &mut Message) -> Option<Pid> {
        either!(keep self, p => p.get_reply(msg))
    }

    /// The counters of logical host `host` as JSON, read by message from
    /// its kernel server (this host's too).
    pub fn host_stats(&self, host: vkernel_proto::HostId) -> Result<String, IpcError> {
        either!(self, p => p.host_stats(host))
    }

    /// Host selection (thesis §6): a multi-reply HOST_INFO query to every
    /// host's kernel server. Gathers answers until one comes from an idle
    /// host (load below `idle_load`), `max` have arrived, or `limit` passes;
    /// returns them least loaded first.
    pub fn select_hosts(
        &self,
        max: usize,
        limit: Duration,
        idle_load: f64,
    ) -> Result<Vec<HostLoad>, IpcError> {
        either!(self, p => p.select_hosts(max, limit, idle_load))
    }

    /// GetTime: the null kernel operation (enter the kernel, read its clock).
    pub fn get_time(&self) -> Duration {
        either!(self, p => p.get_time())
    }

    /// True if `pid` names a live process; remote pids are asked of their
    /// host's kernel server.
    pub fn process_exists(&self, pid: Pid) -> Result<bool, IpcError> {
        either!(self, p => p.process_exists(pid))
    }

    /// Destroys a process, local or (through its kernel server) remote.
    pub fn destroy(&self, pid: Pid) -> Result<(), IpcError> {
        either!(self, p => p.destroy(pid))
    }
}
