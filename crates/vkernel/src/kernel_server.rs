//! The kernel-server process (local id 1 on every logical host).
//!
//! As in V, kernel operations that must be answered for a remote caller are
//! ordinary messages to this process, so they need no special packet types.
//! Request codes (word 0, low 24 bits); the reply's word 0 is 0 on success
//! or an error code. [`field`] names the other words.

use vkernel_proto::{IpcError, Message, Pid};

use crate::kernel::destroy_local;
use crate::process::LocalProcess;

/// GetTime: reply w1 = high, w2 = low 32 bits of the host clock in µs.
pub const GET_TIME: u32 = 0x4b_0001;
/// Process existence: w1 = pid; reply w1 = 1 if it exists, else 0.
pub const PROCESS_EXISTS: u32 = 0x4b_0002;
/// Destroy a process of this host: w1 = pid; reply w0 = 0, `ERR_NO_PROCESS`,
/// or `ERR_DENIED` (the process runs as a principal the requester does not).
pub const DESTROY_PROCESS: u32 = 0x4b_0003;
/// Host info: reply w1 = number of processes, w2 = the machine's 1-minute
/// load average × 100, w3 = online CPUs. Also answered to group queries on
/// the kernel-server group (host selection).
pub const HOST_INFO: u32 = 0x4b_0004;
/// JoinGroup for a process of this host: w1 = group, w2 = pid. The
/// requester is the sender; the host's group policy decides.
pub const JOIN_GROUP: u32 = 0x4b_0005;
/// LeaveGroup for a process of this host: w1 = group, w2 = pid.
pub const LEAVE_GROUP: u32 = 0x4b_0006;
/// The host's counters: the requester lends a write segment; the reply
/// writes the JSON document (see `metrics::StatsDoc`) into it, w1 = its
/// length (0 if the segment is too small: w2 = the length needed).
pub const STATS: u32 = 0x4b_0007;

/// Word indices of kernel-server requests and replies (read and written
/// with [`Message::word`] and [`Message::set_word`]).
pub mod field {
    /// Reply: [`super::OK`] or an error code (the whole word 0).
    pub const STATUS: usize = 0;
    /// Request (PROCESS_EXISTS, DESTROY_PROCESS): the pid asked about.
    pub const PID: usize = 1;
    /// Request (JOIN_GROUP, LEAVE_GROUP): the group.
    pub const GROUP: usize = 1;
    /// Request (JOIN_GROUP, LEAVE_GROUP): the member.
    pub const MEMBER: usize = 2;
    /// Reply (GET_TIME): µs, high word first (words 1 and 2).
    pub const TIME: usize = 1;
    /// Reply (PROCESS_EXISTS): 1 if it exists, else 0.
    pub const EXISTS: usize = 1;
    /// Reply (HOST_INFO): number of processes.
    pub const PROCESSES: usize = 1;
    /// Reply (HOST_INFO): 1-minute load average × 100.
    pub const LOAD: usize = 2;
    /// Reply (HOST_INFO): online CPUs.
    pub const CPUS: usize = 3;
    /// Reply (STATS): length of the document written (0: it did not fit).
    pub const STATS_LEN: usize = 1;
    /// Reply (STATS): the length needed, when it did not fit.
    pub const STATS_NEED: usize = 2;
}

/// Reply code: success.
pub const OK: u32 = 0;
/// Reply code: no such process.
pub const ERR_NO_PROCESS: u32 = 1;
/// Reply code: unknown request.
pub const ERR_UNKNOWN_REQUEST: u32 = 2;
/// Reply code: refused by policy.
pub const ERR_DENIED: u32 = 3;
/// Reply code: not a group id or not a process of this host.
pub const ERR_INVALID: u32 = 4;

/// The reply code for an engine error.
pub(crate) fn code_of(e: IpcError) -> u32 {
    match e {
        IpcError::NoSuchProcess(_) | IpcError::NotAProcess(_) => ERR_NO_PROCESS,
        IpcError::AccessDenied(_) => ERR_DENIED,
        _ => ERR_INVALID,
    }
}

/// The error for a reply code (for the requester's side).
pub(crate) fn error_of(code: u32, group: Pid, pid: Pid) -> Result<(), IpcError> {
    match code {
        OK => Ok(()),
        ERR_NO_PROCESS => Err(IpcError::NoSuchProcess(pid)),
        ERR_DENIED => Err(IpcError::AccessDenied(group)),
        _ => Err(IpcError::InvalidPid(group)),
    }
}

/// Serves kernel requests until the host shuts down.
pub(crate) fn run(p: LocalProcess) {
    // Kernel requests are rare: never burn a CPU waiting for them.
    p.set_spin(std::time::Duration::ZERO);
    p.set_socket_reader(false);
    let mut m = Message::zero();
    loop {
        let (from, principal) = match p.receive(&mut m) {
            Ok(i) => (i.from, i.principal),
            Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
            Err(_) => continue,
        };
        let mut r = Message::zero();
        match m.code() {
            GET_TIME => {
                let t = p.get_time().as_micros() as u64;
                r.set_word_pair(field::TIME, t);
            }
            PROCESS_EXISTS => {
                let pid = Pid(m.word(field::PID));
                let exists = p.process_exists(pid).unwrap_or(false);
                r.set_word(field::EXISTS, u32::from(exists));
            }
            DESTROY_PROCESS => {
                let pid = Pid(m.word(field::PID));
                let owner = p.shared().with_engine(|e, _| e.principal_of(pid));
                let status = if pid == p.pid() {
                    ERR_UNKNOWN_REQUEST
                } else if owner != 0 && owner != principal {
                    // A process with a principal is destroyed only by it.
                    ERR_DENIED
                } else {
                    match destroy_local(p.shared(), pid) {
                        Ok(()) => OK,
                        Err(_) => ERR_NO_PROCESS,
                    }
                };
                r.set_word(field::STATUS, status);
            }
            JOIN_GROUP | LEAVE_GROUP => {
                let (g, pid) = (Pid(m.word(field::GROUP)), Pid(m.word(field::MEMBER)));
                let join = m.code() == JOIN_GROUP;
                let r0 = p.shared().with_engine(|e, _| {
                    if join {
                        e.join_group(g, pid, from)
                    } else {
                        e.leave_group(g, pid, from)
                    }
                });
                r.set_word(field::STATUS, r0.map_or_else(code_of, |()| OK));
            }
            HOST_INFO => {
                let processes = p.shared().with_engine(|e, _| e.process_count());
                r.set_word(field::PROCESSES, processes as u32);
                let load = (crate::sys::load_average() * 100.0).round() as u32;
                r.set_word(field::LOAD, load);
                r.set_word(field::CPUS, crate::sys::online_cpus() as u32);
            }
            _ => r.set_word(field::STATUS, ERR_UNKNOWN_REQUEST),
        }
        if m.code() == STATS {
            let doc = p.shared().snapshot().to_json();
            // Any size the requester lent: more than a datagram travels
            // sent ahead of the reply, or by MoveTo.
            let room = m.seg_len() as usize;
            if m.seg_access().write && doc.len() <= room {
                r.set_word(field::STATS_LEN, doc.len() as u32);
                let _ = p.reply_with_segment(&r, from, 0, doc.as_bytes());
            } else {
                r.set_word(field::STATS_NEED, doc.len() as u32);
                let _ = p.reply(&r, from);
            }
            continue;
        }
        // The requester may have gone; nothing to do then.
        let _ = p.reply(&r, from);
    }
}
