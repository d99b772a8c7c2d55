//! Naming: SetPid/GetPid (local table and remote queries, first answer
//! wins) and logical host id allocation by announcement–complaint.

use std::net::SocketAddr;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::idmap::{new_map, IdMap};
use super::{Completion, Dest, Engine, Event, HostState, PState};
use crate::config::Micros;
use crate::error::IpcError;
use crate::message::Message;
use crate::pid::{HostId, Pid};
use crate::stats::DropReason;
use crate::wire::{Header, Packet, PacketType};

/// Where a logical id registration is visible, or where a lookup searches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// This logical host only.
    Local,
    /// Other logical hosts only.
    Remote,
    /// Both (lookups try local first).
    Any,
}

/// A remote GetPid query in progress.
struct Query {
    caller: Pid,
    logical: u32,
    next: Micros,
    deadline: Micros,
    interval: Micros,
}

/// Who holds a name: the principal of the process that registered it,
/// and that process (`None`: the host itself, through [`Engine::set_pid`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Owner {
    principal: u32,
    by: Option<Pid>,
}

/// One registration in the LogicalIdMap.
#[derive(Clone, Copy, Debug)]
struct Entry {
    pid: Pid,
    scope: Scope,
    /// `None` once its registrant is gone and it names a remote pid: then
    /// anyone may replace it.
    owner: Option<Owner>,
}

/// The LogicalIdMap plus outstanding queries.
pub(crate) struct Names {
    map: IdMap<u32, Entry>,
    queries: IdMap<u32, Query>,
}

impl Names {
    pub(crate) fn new(seed: u64) -> Names {
        Names {
            map: new_map(seed),
            queries: new_map(seed),
        }
    }

    pub(crate) fn forget_query(&mut self, qseq: u32) {
        self.queries.remove(&qseq);
    }

    /// Local process `pid` is gone: its names go, and names it registered
    /// for others are held from now on by what they name (a local
    /// process, until it goes too) or by nobody (a remote pid).
    pub(crate) fn forget_pid(&mut self, pid: Pid) {
        self.map.retain(|_, e| e.pid != pid);
        for e in self.map.values_mut() {
            if e.owner.is_some_and(|o| o.by == Some(pid)) {
                if e.pid.host() == pid.host() {
                    if let Some(o) = &mut e.owner {
                        o.by = Some(e.pid);
                    }
                } else {
                    e.owner = None;
                }
            }
        }
    }
}

impl Engine {
    /// SetPid as the host itself: registers `pid` under `logical` with
    /// `scope`, replacing whatever was there; a null pid removes the
    /// registration. The name is then held as principal 0 (see
    /// [`Engine::set_pid_as`]). An embedded program's processes, all
    /// threads of one OS process, register this way.
    pub fn set_pid(&mut self, logical: u32, pid: Pid, scope: Scope) {
        let owner = Owner {
            principal: 0,
            by: None,
        };
        self.put_name(logical, pid, scope, owner);
    }

    /// SetPid asked by local process `caller`, which holds the name from
    /// then on as its principal. The rule of a host shared by several
    /// users: a name held by one principal may be replaced or removed
    /// only by that principal, or by principal 0 (root's programs on a
    /// machine host, the host's own processes). A name is held while the
    /// process that registered it, or the local process it names, lives;
    /// a free or unheld name goes to whoever asks first.
    ///
    /// # Errors
    /// [`IpcError::NotAProcess`] if `caller` is not a live process of this
    /// host; [`IpcError::AccessDenied`] (with the pid the name now names)
    /// if another principal holds the name.
    pub fn set_pid_as(
        &mut self,
        caller: Pid,
        logical: u32,
        pid: Pid,
        scope: Scope,
    ) -> Result<(), IpcError> {
        if !self.process_exists(caller) {
            return Err(IpcError::NotAProcess(caller));
        }
        let principal = self.principal_of(caller);
        if let Some((holder, named)) = self.name_holder(logical) {
            if principal != 0 && holder != principal {
                return Err(IpcError::AccessDenied(named));
            }
        }
        let owner = Owner {
            principal,
            by: Some(caller),
        };
        self.put_name(logical, pid, scope, owner);
        Ok(())
    }

    /// The principal holding name `logical` and the pid it names, if it is
    /// held (see [`Engine::set_pid_as`]).
    pub fn name_holder(&self, logical: u32) -> Option<(u32, Pid)> {
        let e = self.names.map.get(&logical)?;
        // A local pid that is gone no longer holds (its entry is dropped
        // when it is destroyed; this is the belt to those braces).
        if self.is_local(e.pid) && !self.process_exists(e.pid) {
            return None;
        }
        e.owner.map(|o| (o.principal, e.pid))
    }

    fn put_name(&mut self, logical: u32, pid: Pid, scope: Scope, owner: Owner) {
        if pid.is_none() {
            self.names.map.remove(&logical);
        } else {
            let owner = Some(owner);
            self.names.map.insert(logical, Entry { pid, scope, owner });
        }
    }

    fn local_lookup(&self, logical: u32, remote_asker: bool) -> Option<Pid> {
        let &Entry { pid, scope, .. } = self.names.map.get(&logical)?;
        let visible = match scope {
            Scope::Any => true,
            Scope::Local => !remote_asker,
            Scope::Remote => remote_asker,
        };
        if !visible {
            return None;
        }
        // Registered local pids must still be alive; remote ones are trusted.
        if self.is_local(pid) && !self.process_exists(pid) {
            return None;
        }
        if remote_asker && !self.is_local(pid) {
            return None;
        }
        Some(pid)
    }

    /// GetPid. Returns the pid at once when the local table answers (or the
    /// null pid for a local-scope miss); otherwise queries the other hosts
    /// and blocks the caller until a [`Completion::GetPid`].
    pub fn get_pid(
        &mut self,
        now: Micros,
        caller: Pid,
        logical: u32,
        scope: Scope,
    ) -> Result<Option<Pid>, IpcError> {
        self.tick(now);
        self.check_ready_caller(caller)?;
        if scope != Scope::Remote {
            if let Some(p) = self.local_lookup(logical, false) {
                return Ok(Some(p));
            }
            if scope == Scope::Local {
                return Ok(Some(Pid::NONE));
            }
        }
        if self.group_dests(super::KERNEL_SERVER_GROUP).is_empty() {
            return Ok(Some(Pid::NONE));
        }
        let qseq = self.new_seq();
        let interval = (self.cfg.getpid_timeout / 5).max(1);
        self.names.queries.insert(
            qseq,
            Query {
                caller,
                logical,
                next: now + interval,
                deadline: now + self.cfg.getpid_timeout,
                interval,
            },
        );
        self.set_state(caller, PState::GettingPid { qseq });
        self.send_query(qseq);
        self.arm(now + interval);
        Ok(None)
    }

    fn send_query(&mut self, qseq: u32) {
        let Some(q) = self.names.queries.get(&qseq) else {
            return;
        };
        let mut h = Header::new(PacketType::RemoteGetPid);
        h.seq = qseq;
        h.src = q.caller;
        h.forwarder = Pid(q.logical);
        // To every kernel server, on the group transport: the multicast
        // address, or the static peers and every host we already know.
        for t in self.group_dests(super::KERNEL_SERVER_GROUP) {
            self.emit(Dest::Addr(t), &h, &Message::zero(), &[]);
        }
    }

    pub(super) fn on_getpid(&mut self, _now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
        let h = pkt.header;
        let Some(found) = self.local_lookup(h.forwarder.0, true) else {
            return;
        };
        let mut r = Header::new(PacketType::RemoteGetPidReply);
        r.seq = h.seq;
        r.src = found;
        r.dst = h.src;
        r.forwarder = h.forwarder;
        self.emit(Dest::Addr(from), &r, &Message::zero(), &[]);
    }

    pub(super) fn on_getpid_reply(&mut self, _now: Micros, pkt: &Packet<'_>) {
        let h = pkt.header;
        match self.names.queries.get(&h.seq) {
            Some(q) if q.caller == h.dst && q.logical == h.forwarder.0 => {}
            _ => {
                self.stats.drop(DropReason::NoMatch);
                return;
            }
        }
        self.names.queries.remove(&h.seq);
        self.complete(h.dst, Completion::GetPid(Ok(h.src)));
    }

    pub(super) fn naming_timers(&mut self, now: Micros, next: &mut Micros) {
        let due: Vec<u32> = self
            .names
            .queries
            .iter()
            .filter(|(_, q)| now >= q.next)
            .map(|(&k, _)| k)
            .collect();
        for k in due {
            let Some(q) = self.names.queries.get_mut(&k) else {
                continue;
            };
            if now >= q.deadline {
                let caller = q.caller;
                self.names.queries.remove(&k);
                self.complete(caller, Completion::GetPid(Ok(Pid::NONE)));
                continue;
            }
            q.next = now + q.interval;
            self.send_query(k);
        }
        for q in self.names.queries.values() {
            *next = (*next).min(q.next);
        }
    }

    // ------------------------------------------------- host id allocation

    pub(super) fn announce(&mut self, candidate: HostId, nonce: u32) {
        let mut h = Header::new(PacketType::LogicalHostRequest);
        h.seq = nonce;
        h.dst = Pid::new(candidate, 0);
        self.emit(Dest::Discovery, &h, &Message::zero(), &[]);
    }

    pub(super) fn on_host_alloc(&mut self, now: Micros, from: SocketAddr, pkt: &Packet<'_>) {
        let h = pkt.header;
        let asked = h.dst.host();
        match (h.ptype, &self.host) {
            (PacketType::LogicalHostRequest, HostState::Ready { id, nonce }) => {
                if h.seq == *nonce {
                    self.stats.drop(DropReason::OwnEcho);
                } else if asked == *id {
                    self.complain(from, asked, h.seq);
                }
            }
            (
                PacketType::LogicalHostRequest,
                HostState::Allocating {
                    candidate, nonce, ..
                },
            ) => {
                let (candidate, nonce) = (*candidate, *nonce);
                if h.seq == nonce {
                    // Our own echo (broadcast), or a twin that drew the same
                    // candidate and nonce from the same seed: the two look
                    // alike. Draw a new nonce mixing in the sender's address,
                    // which differs between twins, so the next round's nonce
                    // comparison separates them; for an echo it is harmless.
                    self.stats.drop(DropReason::OwnEcho);
                    if asked == candidate {
                        self.renonce(from);
                    }
                } else if asked == candidate {
                    // Both want it: the lower nonce keeps trying, the higher re-picks.
                    if nonce < h.seq {
                        self.complain(from, asked, h.seq);
                    } else {
                        self.repick(now);
                    }
                }
            }
            // Any complaint about our candidate counts, whichever of our
            // nonces it names: the nonce may have been redrawn (see above)
            // since the announcement it answers.
            (PacketType::LogicalHostComplaint, HostState::Allocating { candidate, .. })
                if asked == *candidate =>
            {
                self.repick(now);
            }
            (PacketType::LogicalHostComplaint, HostState::Ready { id, nonce })
                if asked == *id && h.seq == *nonce =>
            {
                self.out.event(Event::HostIdConflict(*id));
            }
            _ => {}
        }
    }

    fn complain(&mut self, to: SocketAddr, id: HostId, their_nonce: u32) {
        let mut h = Header::new(PacketType::LogicalHostComplaint);
        h.seq = their_nonce;
        h.dst = Pid::new(id, 0);
        self.emit(Dest::Addr(to), &h, &Message::zero(), &[]);
    }

    /// Redraws the allocation nonce (keeping the candidate) from the
    /// generator reseeded with `from` mixed in.
    fn renonce(&mut self, from: SocketAddr) {
        let mut x = self.rng.gen::<u64>();
        let ip = match from.ip() {
            std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(a) => a.octets(),
        };
        for b in ip.into_iter().chain(from.port().to_be_bytes()) {
            x = (x ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.rng = SmallRng::seed_from_u64(x);
        let fresh = self.rng.gen::<u32>() | 1;
        if let HostState::Allocating { nonce, .. } = &mut self.host {
            *nonce = fresh;
        }
    }

    fn repick(&mut self, now: Micros) {
        let candidate = HostId(self.rng.gen_range(1..=HostId::MAX));
        let nonce = self.rng.gen::<u32>() | 1;
        self.host = HostState::Allocating {
            candidate,
            nonce,
            deadline: now + self.cfg.alloc_timeout,
            next_announce: now,
        };
        self.arm(now);
    }

    pub(super) fn host_alloc_timer(&mut self, now: Micros, next: &mut Micros) {
        let HostState::Allocating {
            candidate,
            nonce,
            deadline,
            next_announce,
        } = self.host
        else {
            return;
        };
        if now >= deadline || self.cfg.discovery.is_empty() {
            self.host = HostState::Ready {
                id: candidate,
                nonce,
            };
            self.out.event(Event::HostReady(candidate));
            return;
        }
        if now >= next_announce {
            self.announce(candidate, nonce);
            let step = (self.cfg.alloc_timeout / 3).max(1);
            if let HostState::Allocating { next_announce, .. } = &mut self.host {
                *next_announce = now + step;
            }
            *next = (*next).min(now + step).min(deadline);
        } else {
            *next = (*next).min(next_announce).min(deadline);
        }
    }
}

#[cfg(test)]
mod shared_host_tests {
    use super::*;
    use crate::config::Config;

    fn engine() -> Engine {
        let cfg = Config {
            host_id: Some(HostId(7)),
            ..Config::default()
        };
        Engine::new(cfg, 0)
    }

    /// A process of `principal`.
    fn proc_of(e: &mut Engine, principal: u32) -> Pid {
        let p = e.create_process().unwrap();
        e.set_principal(p, principal).unwrap();
        p
    }

    #[test]
    fn a_name_is_replaced_or_removed_only_by_its_principal_or_principal_0() {
        let mut e = engine();
        let (a, a2, b, root) = (
            proc_of(&mut e, 1000),
            proc_of(&mut e, 1000),
            proc_of(&mut e, 2000),
            proc_of(&mut e, 0),
        );
        e.set_pid_as(a, 5, a, Scope::Any).unwrap();
        assert_eq!(e.name_holder(5), Some((1000, a)));
        assert_eq!(
            e.set_pid_as(b, 5, b, Scope::Local),
            Err(IpcError::AccessDenied(a))
        );
        assert_eq!(
            e.set_pid_as(b, 5, Pid::NONE, Scope::Any),
            Err(IpcError::AccessDenied(a))
        );
        assert_eq!(e.local_lookup(5, false), Some(a));
        // Its own principal may; then principal 0 may take it.
        e.set_pid_as(a2, 5, a2, Scope::Any).unwrap();
        e.set_pid_as(root, 5, root, Scope::Any).unwrap();
        assert_eq!(
            e.set_pid_as(a, 5, a, Scope::Any),
            Err(IpcError::AccessDenied(root))
        );
        // The host's own registrations are principal 0's.
        e.set_pid(6, b, Scope::Any);
        assert!(e.set_pid_as(b, 6, Pid::NONE, Scope::Any).is_err());
    }

    #[test]
    fn a_name_is_free_once_its_holders_are_gone() {
        let mut e = engine();
        let (a, b, c) = (
            proc_of(&mut e, 1000),
            proc_of(&mut e, 1000),
            proc_of(&mut e, 2000),
        );
        // a registers b: held while either lives.
        e.set_pid_as(a, 8, b, Scope::Any).unwrap();
        e.destroy_process(0, a).unwrap();
        assert_eq!(e.name_holder(8), Some((1000, b)));
        assert!(e.set_pid_as(c, 8, c, Scope::Any).is_err());
        e.destroy_process(0, b).unwrap();
        assert_eq!(e.name_holder(8), None);
        e.set_pid_as(c, 8, c, Scope::Any).unwrap();
        // A remote pid is held while its registrant lives.
        let remote = Pid::new(HostId(9), 3);
        let d = proc_of(&mut e, 1000);
        e.set_pid_as(d, 9, remote, Scope::Any).unwrap();
        assert!(e.set_pid_as(c, 9, c, Scope::Any).is_err());
        e.destroy_process(0, d).unwrap();
        assert_eq!(e.name_holder(9), None);
        e.set_pid_as(c, 9, c, Scope::Any).unwrap();
    }

    #[test]
    fn memberships_change_only_for_ones_own_processes() {
        let mut e = engine();
        let (a, b, root) = (
            proc_of(&mut e, 1000),
            proc_of(&mut e, 2000),
            proc_of(&mut e, 0),
        );
        let g = Pid::well_known_group(0x42);
        e.join_group(g, a, a).unwrap();
        // b may neither remove a, nor join a elsewhere, nor join a's group.
        assert!(e.leave_group(g, a, b).is_err());
        let other = Pid::well_known_group(0x43);
        assert!(e.join_group(other, a, b).is_err());
        assert!(e.join_group(g, b, b).is_err());
        assert_eq!(e.group_members(g), vec![a]);
        // Its own group is fine; principal 0 may do anything.
        e.join_group(other, b, b).unwrap();
        e.join_group(g, b, root).unwrap();
        e.leave_group(g, a, root).unwrap();
        assert_eq!(e.group_members(g), vec![b]);
    }
}
