//! The process table: each local process's state (ready, or blocked in a
//! primitive), its queue of messages, its completion; creating and
//! destroying processes, and who may Send to whom.

use super::*;

pub(super) use crate::sender::Retx;

/// A Send in progress, kept in the sender's descriptor.
pub(super) struct Outgoing {
    /// The sender's principal, carried in every datagram of the exchange.
    pub(super) principal: u32,
    /// When the Send began (latency histograms).
    pub(super) started: Micros,
    pub(super) dst: Pid,
    pub(super) seq: u32,
    pub(super) msg: Message,
    pub(super) seg: Option<Seg>,
    pub(super) access: SegAccess,
    /// At most this many bytes of a read segment travel with the message
    /// (the rest is left for MoveFrom).
    pub(super) append: usize,
    pub(super) forwarder: Pid,
    /// The (local) receiver has taken the message.
    pub(super) received: bool,
    pub(super) remote: Option<Retx>,
    /// MoveTo transfers arriving into our segment from remote movers.
    pub(super) inbound: Vec<InBulk>,
    /// MoveFrom chunks sent from our segment lately: (mover, transfer,
    /// chunk, when). A request for one of them is older than its data,
    /// not a sign of loss (see `Engine::on_move_from_request`).
    pub(super) served: Vec<(Pid, u32, u32, Micros)>,
    /// Reply data sent ahead went missing once: ask for it to be moved.
    pub(super) no_ahead: bool,
    /// The Send fails with [`IpcError::Deadline`] if not replied to by then.
    pub(super) deadline: Option<Micros>,
}

pub(super) enum PState {
    Ready,
    Receiving {
        from: Option<Pid>,
        buf: Option<Seg>,
        /// Copy into `buf` only from segments at most this long.
        upto: usize,
    },
    Sending(Box<Outgoing>),
    Moving(Box<MoveOp>),
    GettingPid {
        qseq: u32,
    },
}

/// A message queued for a receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pending {
    /// From a local sender (the message lives in its descriptor).
    Local(Pid),
    /// From a remote sender (slot, sequence number).
    Alien(usize, u32),
    /// A copy of a group message (copy index, sequence number).
    Group(usize, u32),
}

pub(super) struct Proc {
    pub(super) state: PState,
    pub(super) queue: VecDeque<Pending>,
    pub(super) completion: Option<Completion>,
    /// The principal this process runs as.
    pub(super) principal: u32,
    /// If set, only senders with these principals may Send to it.
    pub(super) admits: Option<Vec<u32>>,
    /// The box of this process's last finished Send, reused by its next
    /// one: a local exchange's box would otherwise be allocated by the
    /// sender's thread and freed by the replier's, every exchange.
    pub(super) spare: Option<Box<Outgoing>>,
    /// Report messages left waiting in `queue` ([`Event::Queued`]).
    pub(super) watch_queue: bool,
}

impl Engine {
    /// Creates a process; its pid's local part comes from a counter.
    pub fn create_process(&mut self) -> Result<Pid, IpcError> {
        let host = self.my_host()?;
        for _ in 0..0x10000 {
            let l = self.next_local;
            self.next_local = self.next_local.wrapping_add(1);
            if l <= KERNEL_SERVER_LOCAL_ID || self.procs.contains_key(l) {
                continue;
            }
            self.procs.insert(l, Box::new(Proc::new()));
            return Ok(Pid::new(host, l));
        }
        Err(IpcError::TableFull)
    }

    /// Creates the kernel-server process (fixed local id 1).
    pub fn create_kernel_server(&mut self) -> Result<Pid, IpcError> {
        let host = self.my_host()?;
        if self.procs.contains_key(KERNEL_SERVER_LOCAL_ID) {
            return Err(IpcError::Busy(Pid::new(host, KERNEL_SERVER_LOCAL_ID)));
        }
        self.procs
            .insert(KERNEL_SERVER_LOCAL_ID, Box::new(Proc::new()));
        let pid = Pid::new(host, KERNEL_SERVER_LOCAL_ID);
        self.join_group(KERNEL_SERVER_GROUP, pid, pid)?;
        Ok(pid)
    }

    /// True if `pid` is a live process of this host.
    #[inline]
    pub fn process_exists(&self, pid: Pid) -> bool {
        self.is_local(pid) && pid.is_process() && self.procs.contains_key(pid.local())
    }

    /// Sets the principal `pid` runs as (carried with its Sends).
    pub fn set_principal(&mut self, pid: Pid, principal: u32) -> Result<(), IpcError> {
        let p = self.proc_mut(pid).ok_or(IpcError::NotAProcess(pid))?;
        p.principal = principal;
        Ok(())
    }

    /// Restricts who may Send to `pid`: only senders running as one of
    /// `principals` (`None` lifts the restriction). Others get
    /// [`IpcError::AccessDenied`].
    pub fn restrict_senders(
        &mut self,
        pid: Pid,
        principals: Option<Vec<u32>>,
    ) -> Result<(), IpcError> {
        let p = self.proc_mut(pid).ok_or(IpcError::NotAProcess(pid))?;
        p.admits = principals;
        Ok(())
    }

    /// The principal a local process runs as (0 if unknown).
    #[inline]
    pub fn principal_of(&self, pid: Pid) -> u32 {
        if !self.is_local(pid) {
            return 0;
        }
        self.procs.get(pid.local()).map_or(0, |p| p.principal)
    }

    /// True if local process `dst` accepts Sends from `principal`.
    #[inline]
    pub(super) fn admits(&self, dst: Pid, principal: u32) -> bool {
        self.procs
            .get(dst.local())
            .and_then(|p| p.admits.as_ref())
            .is_none_or(|a| a.contains(&principal))
    }

    /// Destroys a local process: its blocked operation fails, senders waiting
    /// on it get `NoSuchProcess`, and remote senders are nAcked.
    pub fn destroy_process(&mut self, now: Micros, pid: Pid) -> Result<(), IpcError> {
        self.tick(now);
        if !self.process_exists(pid) {
            return Err(IpcError::NoSuchProcess(pid));
        }
        let Some(p) = self.procs.remove(pid.local()).map(|b| *b) else {
            return Err(IpcError::NoSuchProcess(pid));
        };
        self.sending.remove(&pid.local());
        if self.caller == Some(pid) {
            self.own = None;
        }
        if let PState::GettingPid { qseq } = p.state {
            self.names.forget_query(qseq);
        }
        self.names.forget_pid(pid);
        self.group_forget(pid);
        for pend in p.queue {
            self.fail_pending(now, pend, pid);
        }
        // Local senders awaiting reply from it (already received).
        let waiting: Vec<Pid> = self
            .sending
            .iter()
            .filter_map(|l| match &self.procs.get(l)?.state {
                PState::Sending(o) if o.dst == pid && o.remote.is_none() => {
                    Some(Pid::new(pid.host(), l))
                }
                _ => None,
            })
            .collect();
        for s in waiting {
            self.complete(s, Completion::Send(Err(IpcError::NoSuchProcess(pid))));
            self.stats.local_exchanges += 1;
        }
        // Aliens it had received: nAck their senders.
        for i in self.aliens.held_by(pid) {
            self.nack_alien(i, Status::NoSuchProcess);
        }
        Ok(())
    }

    pub(super) fn fail_pending(&mut self, _now: Micros, pend: Pending, dead: Pid) {
        match pend {
            Pending::Local(s) => {
                self.complete(s, Completion::Send(Err(IpcError::NoSuchProcess(dead))));
            }
            Pending::Alien(i, seq) => {
                if self.aliens.is(i, seq) {
                    self.nack_alien(i, Status::NoSuchProcess);
                }
            }
            // A member's copy: the group's other members may still answer.
            Pending::Group(..) => {}
        }
    }

    pub(super) fn nack_alien(&mut self, i: usize, status: Status) {
        let Some(a) = self.aliens.get(i) else {
            return;
        };
        let mut h = Header::new(PacketType::NAck);
        h.status = status;
        h.seq = a.seq;
        h.src = a.receiver;
        h.dst = a.src;
        let to = a.addr;
        self.emit(Dest::Addr(to), &h, &Message::zero(), &[]);
        self.free_alien(i);
    }

    #[inline]
    pub(super) fn check_ready_caller(&self, pid: Pid) -> Result<(), IpcError> {
        self.my_host()?;
        match self.procs.get(pid.local()) {
            Some(p) if self.is_local(pid) => match p.state {
                PState::Ready => Ok(()),
                _ => Err(IpcError::Busy(pid)),
            },
            _ => Err(IpcError::NotAProcess(pid)),
        }
    }

    #[inline]
    pub(super) fn set_sending(&mut self, pid: Pid, out: Outgoing) {
        if let Some(p) = self.proc_mut(pid) {
            let b = p.boxed(out);
            p.set_state(PState::Sending(b));
            p.completion = None;
            self.sending.insert(pid.local());
        }
    }

    #[inline]
    pub(super) fn set_state(&mut self, pid: Pid, st: PState) {
        if let Some(p) = self.proc_mut(pid) {
            p.set_state(st);
            p.completion = None;
            self.sending.remove(&pid.local());
        }
    }

    #[inline]
    pub(super) fn outgoing(&self, pid: Pid) -> Option<&Outgoing> {
        if !self.is_local(pid) {
            return None;
        }
        match &self.procs.get(pid.local())?.state {
            PState::Sending(o) => Some(o),
            _ => None,
        }
    }

    #[inline]
    pub(super) fn outgoing_mut(&mut self, pid: Pid) -> Option<&mut Outgoing> {
        match &mut self.proc_mut(pid)?.state {
            PState::Sending(o) => Some(o),
            _ => None,
        }
    }

    /// Abandons whatever `pid` is blocked in, releasing every lent buffer.
    /// Used by the runtime when it must return without a completion.
    pub fn cancel(&mut self, pid: Pid) {
        if self.caller == Some(pid) {
            self.own = None;
        }
        self.sending.remove(&pid.local());
        if let Some(p) = self.proc_mut(pid) {
            let old = p.set_state(PState::Ready);
            p.completion = None;
            if let PState::GettingPid { qseq } = old {
                self.names.forget_query(qseq);
            }
        }
    }

    /// Abandons a blocked Receive (e.g. the caller's wait timed out).
    pub fn cancel_receive(&mut self, pid: Pid) -> bool {
        if let Some(p) = self.proc_mut(pid) {
            if let PState::Receiving { .. } = p.state {
                p.state = PState::Ready;
                return true;
            }
        }
        false
    }
}

impl Proc {
    pub(super) fn new() -> Proc {
        Proc {
            state: PState::Ready,
            queue: VecDeque::new(),
            completion: None,
            principal: 0,
            admits: None,
            spare: None,
            watch_queue: false,
        }
    }

    /// Replaces the state and returns the old one, except that a finished
    /// Send's box is kept for the next Send (`Ready` is returned for it).
    /// Its lent segment and inbound transfers are dropped now: the lease on
    /// the caller's buffer ends with the state.
    pub(super) fn set_state(&mut self, st: PState) -> PState {
        match std::mem::replace(&mut self.state, st) {
            PState::Sending(mut b) => {
                b.seg = None;
                b.inbound = Vec::new();
                b.served = Vec::new();
                self.spare = Some(b);
                PState::Ready
            }
            old => old,
        }
    }

    /// A box holding `out`: the spare one if there is one.
    pub(super) fn boxed(&mut self, out: Outgoing) -> Box<Outgoing> {
        match self.spare.take() {
            Some(mut b) => {
                *b = out;
                b
            }
            None => Box::new(out),
        }
    }
}
