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

/// The LogicalIdMap plus outstanding queries.
pub(crate) struct Names {
    map: IdMap<u32, (Pid, Scope)>,
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

    pub(crate) fn forget_pid(&mut self, pid: Pid) {
        self.map.retain(|_, (p, _)| *p != pid);
    }
}

impl Engine {
    /// SetPid: registers `pid` under `logical` with `scope` (overwrites).
    /// A null pid removes the registration.
    pub fn set_pid(&mut self, logical: u32, pid: Pid, scope: Scope) {
        if pid.is_none() {
            self.names.map.remove(&logical);
        } else {
            self.names.map.insert(logical, (pid, scope));
        }
    }

    fn local_lookup(&self, logical: u32, remote_asker: bool) -> Option<Pid> {
        let &(pid, scope) = self.names.map.get(&logical)?;
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
