//! Who may do what to whom on a machine host shared by several users: the
//! checks a proxy makes before it runs a call for its program
//! (docs/SECURITY.md, "A machine host shared by several users"). Root's
//! programs (uid 0, principal 0) pass every check; anyone else acts only
//! on processes of their own principal (their uid). Which names and group
//! memberships a principal holds is the engine's rule
//! (`Engine::set_pid_as`, `Engine::join_group`), so that an embedded
//! program and the kernel server follow it too.

use vkernel_proto::engine::{KERNEL_SERVER_GROUP, KERNEL_SERVER_LOCAL_ID};
use vkernel_proto::{IpcError, Message, Pid, Scope};

use crate::kernel_server::{field, DESTROY_PROCESS};

use super::Ctx;

impl Ctx {
    /// SetPid: the engine decides, as this process's principal, whether
    /// the name is free to it.
    pub(super) fn set_pid(&self, logical: u32, pid: Pid, scope: Scope) -> Result<(), IpcError> {
        let me = self.p.pid();
        self.p
            .shared()
            .with_engine(|e, _| e.set_pid_as(me, logical, pid, scope))
    }

    /// A program may end only its own principal's processes here, unless
    /// it is root (on other hosts, their kernel servers decide).
    pub(super) fn may_destroy(&self, target: Pid) -> Result<(), IpcError> {
        if self.uid == 0 || target.host() != self.p.pid().host() {
            return Ok(());
        }
        let owner = self.p.shared().with_engine(|e, _| e.principal_of(target));
        if owner != self.principal {
            return Err(IpcError::AccessDenied(target));
        }
        Ok(())
    }

    /// Only root may run as a principal other than its uid.
    pub(super) fn may_run_as(&self, want: u32) -> Result<(), IpcError> {
        if self.uid != 0 && want != self.principal {
            return Err(IpcError::AccessDenied(self.p.pid()));
        }
        Ok(())
    }

    /// A request to this host's kernel server (to it, or to the kernel
    /// servers' group), sent by this process (`from` is itself) or
    /// forwarded from `from`: the kernel server acts as the principal of
    /// the original sender, and lets anyone end a process of principal 0.
    /// So a program other than root may forward there only requests of
    /// its own principal, and may ask it to destroy only what it could
    /// destroy itself ([`Ctx::may_destroy`]). (Joins and leaves are
    /// checked by the engine, as the requester's principal.)
    pub(super) fn may_ask_kernel_server(
        &self,
        m: &Message,
        from: Pid,
        to: Pid,
    ) -> Result<(), IpcError> {
        if self.uid == 0 {
            return Ok(());
        }
        let me = self.p.pid();
        let ks = Pid::new(me.host(), KERNEL_SERVER_LOCAL_ID);
        if to != ks && to != KERNEL_SERVER_GROUP {
            return Ok(());
        }
        if from != me {
            let sender = self.p.shared().with_engine(|e, _| e.principal_of(from));
            if sender != self.principal {
                return Err(IpcError::AccessDenied(to));
            }
        }
        if m.code() == DESTROY_PROCESS {
            self.may_destroy(Pid(m.word(field::PID)))?;
        }
        Ok(())
    }
}
