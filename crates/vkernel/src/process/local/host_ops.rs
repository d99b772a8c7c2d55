//! The primitives about names, groups, hosts and processes rather than
//! exchanges: GetPid/SetPid, groups, host statistics and selection, time,
//! existence, destruction.

use super::*;

impl LocalProcess {
    /// SetPid: registers `pid` under `logical` with a scope.
    pub(crate) fn set_pid(&self, logical: u32, pid: Pid, scope: Scope) {
        self.shared
            .with_engine(|e, _| e.set_pid(logical, pid, scope));
    }

    /// GetPid: looks up `logical`; the null pid if nobody answers.
    pub(crate) fn get_pid(&self, logical: u32, scope: Scope) -> Result<Pid, IpcError> {
        let r = self
            .shared
            .with_engine(|e, now| e.get_pid(now, self.pid, logical, scope))?;
        match r {
            Some(p) => Ok(p),
            None => match self.wait(Expect::Remote)? {
                Completion::GetPid(r) => r,
                _ => Err(IpcError::Busy(self.pid)),
            },
        }
    }

    /// AllocateGroupId: a new process group with this process as its first
    /// member. Send to the group id reaches every member on every host;
    /// the reply mode is set in the message ([`Message::set_group_mode`]).
    pub(crate) fn allocate_group_id(&self) -> Result<Pid, IpcError> {
        self.shared
            .with_engine(|e, _| e.allocate_group_id(self.pid))
    }

    /// JoinGroup: makes `pid` a member of `group`. For a process on another
    /// host the request goes to that host's kernel server, whose group
    /// policy may refuse it ([`IpcError::AccessDenied`]).
    pub(crate) fn join_group(&self, group: Pid, pid: Pid) -> Result<(), IpcError> {
        self.group_op(ks::JOIN_GROUP, group, pid)
    }

    /// LeaveGroup: `pid` stops being a member of `group` (not an error if
    /// it was not one).
    pub(crate) fn leave_group(&self, group: Pid, pid: Pid) -> Result<(), IpcError> {
        self.group_op(ks::LEAVE_GROUP, group, pid)
    }

    pub(super) fn group_op(&self, code: u32, group: Pid, pid: Pid) -> Result<(), IpcError> {
        if !group.is_group() {
            return Err(IpcError::InvalidPid(group));
        }
        if !pid.is_process() {
            return Err(IpcError::InvalidPid(pid));
        }
        if pid.host() == self.shared.host {
            let me = self.pid;
            return self.shared.with_engine(|e, _| {
                if code == ks::JOIN_GROUP {
                    e.join_group(group, pid, me)
                } else {
                    e.leave_group(group, pid, me)
                }
            });
        }
        let mut m = Message::with_code(code | IDEMPOTENT);
        m.set_word(ks::field::GROUP, group.0);
        m.set_word(ks::field::MEMBER, pid.0);
        self.send(&mut m, Pid::new(pid.host(), KERNEL_SERVER_LOCAL_ID))?;
        ks::error_of(m.word(ks::field::STATUS), group, pid)
    }

    /// GetReply: the next queued reply to this process's latest
    /// multi-reply group Send (it overwrites `msg`) and who sent it, or
    /// `None` if none is queued.
    pub(crate) fn get_reply(&self, msg: &mut Message) -> Option<Pid> {
        // Replies that arrived since the Send returned may still sit in the
        // socket (no one waits on it then): read them first.
        self.shared.poll_socket(64);
        let (from, m) = self.shared.with_engine(|e, _| e.get_reply(self.pid))?;
        *msg = m;
        Some(from)
    }

    /// The counters of logical host `host` as JSON, read by message from
    /// its kernel server (this host's too).
    pub(crate) fn host_stats(&self, host: vkernel_proto::HostId) -> Result<String, IpcError> {
        let ks = Pid::new(host, KERNEL_SERVER_LOCAL_ID);
        // One datagram's worth first; a larger document says its size and
        // is asked for again with room for it (it may have grown meanwhile).
        let mut size = vkernel_proto::MAX_APPEND;
        for _ in 0..4 {
            let mut buf = vec![0u8; size];
            let mut m = Message::with_code(ks::STATS | IDEMPOTENT);
            self.send_with_segment(&mut m, ks, Segment::Write(&mut buf))?;
            // The length the kernel server wrote: as reply data, or (when
            // that could not go ahead of the reply) moved into the buffer
            // before the reply, which then counts no segment bytes.
            let n = (m.word(ks::field::STATS_LEN) as usize).min(buf.len());
            if n > 0 {
                buf.truncate(n);
                return String::from_utf8(buf).map_err(|_| IpcError::Refused(ks));
            }
            let need = m.word(ks::field::STATS_NEED) as usize;
            if need <= size || need > MAX_STATS {
                break;
            }
            size = need + need / 4;
        }
        Err(IpcError::SegmentTooLarge { max: size })
    }

    /// Host selection (thesis §6): a multi-reply HOST_INFO query to every
    /// host's kernel server. Gathers answers until one comes from an idle
    /// host (load below `idle_load`), `max` have arrived, or `limit` passes;
    /// returns them least loaded first.
    pub(crate) fn select_hosts(
        &self,
        max: usize,
        limit: Duration,
        idle_load: f64,
    ) -> Result<Vec<HostLoad>, IpcError> {
        let mut m = Message::with_code(ks::HOST_INFO | IDEMPOTENT);
        m.set_group_mode(vkernel_proto::GroupMode::Many);
        let t = Instant::now();
        let r = self.send(&mut m, vkernel_proto::engine::KERNEL_SERVER_GROUP)?;
        let load = |m: &Message, from: Pid| HostLoad {
            kernel_server: from,
            processes: m.word(ks::field::PROCESSES),
            load: f64::from(m.word(ks::field::LOAD)) / 100.0,
            cpus: m.word(ks::field::CPUS),
            after: t.elapsed(),
        };
        let mut out = vec![load(&m, r.from)];
        while out.len() < max.max(1)
            && t.elapsed() < limit
            && out.iter().all(|h| h.load >= idle_load)
        {
            match self.get_reply(&mut m) {
                Some(from) => out.push(load(&m, from)),
                None => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        out.sort_by(|a, b| {
            a.load
                .total_cmp(&b.load)
                .then(a.processes.cmp(&b.processes))
        });
        Ok(out)
    }

    /// GetTime: the null kernel operation (enter the kernel, read its clock).
    pub(crate) fn get_time(&self) -> Duration {
        Duration::from_micros(self.shared.with_engine(|_, now| now))
    }

    /// True if `pid` names a live process; remote pids are asked of their
    /// host's kernel server.
    pub(crate) fn process_exists(&self, pid: Pid) -> Result<bool, IpcError> {
        if !pid.is_process() {
            return Ok(false);
        }
        if pid.host() == self.shared.host {
            return Ok(self.shared.with_engine(|e, _| e.process_exists(pid)));
        }
        let mut m = Message::with_code(ks::PROCESS_EXISTS | IDEMPOTENT);
        m.set_word(ks::field::PID, pid.0);
        match self.send(&mut m, Pid::new(pid.host(), KERNEL_SERVER_LOCAL_ID)) {
            Ok(_) => Ok(m.word(ks::field::EXISTS) != 0),
            Err(IpcError::NoSuchProcess(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Destroys a process, local or (through its kernel server) remote.
    pub(crate) fn destroy(&self, pid: Pid) -> Result<(), IpcError> {
        if pid == self.pid {
            return Err(IpcError::Busy(pid));
        }
        if pid.host() == self.shared.host {
            return destroy_local(&self.shared, pid);
        }
        let mut m = Message::with_code(ks::DESTROY_PROCESS);
        m.set_word(ks::field::PID, pid.0);
        self.send(&mut m, Pid::new(pid.host(), KERNEL_SERVER_LOCAL_ID))?;
        match m.word(ks::field::STATUS) {
            ks::OK => Ok(()),
            ks::ERR_DENIED => Err(IpcError::AccessDenied(pid)),
            _ => Err(IpcError::NoSuchProcess(pid)),
        }
    }
}
