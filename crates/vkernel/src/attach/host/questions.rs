//! The host's answers to a program's questions (`kind::ASK` records)
//! about other processes' pages and the host itself, each with who may
//! ask it (docs/SECURITY.md, "A machine host shared by several users").

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vkernel_proto::rtt::Rtt;
use vkernel_proto::{HostId, IpcError, Pid};

use super::super::control::{self, ask, Record};
use super::super::{lock, DIRECT_LEASE_MAX};
use super::{Inner, Proxy};

impl Inner {
    /// The file of `target`'s peer page (or of its window, with its
    /// generation), for a program of `uid` that has peer pages of its own.
    pub(super) fn peer_page(
        &self,
        target: Pid,
        uid: u32,
        has_peer: bool,
        window: bool,
    ) -> Result<(Arc<OwnedFd>, u32), IpcError> {
        if !has_peer {
            return Err(IpcError::Refused(target));
        }
        let e = lock(&self.peers.map)
            .get(&target)
            .cloned()
            .ok_or(IpcError::NoSuchProcess(target))?;
        if e.uid != uid {
            return Err(IpcError::AccessDenied(target));
        }
        if window {
            let w = lock(&e.win);
            return Ok((w.fd.clone(), w.generation));
        }
        Ok((e.fd.clone(), 0))
    }

    /// Answers `ask::DIRECT`: lets a process of this program send its own
    /// remote Sends (as the host would: same host id, same principal, seq
    /// numbers reserved here), with where the destination host is.
    pub(super) fn direct(
        &self,
        r: &Record,
        uid: u32,
        procs: &HashMap<Pid, Proxy>,
    ) -> Result<([u32; 2], Vec<u8>), IpcError> {
        let (target, pid) = (HostId(r.words[3] as u16), Pid(r.words[4]));
        // What the program learned of `target` since the host last lent
        // it (docs/PROTOCOL.md §8f), on the host's clock.
        let back = std::str::from_utf8(&r.payload)
            .ok()
            .and_then(|t| t.strip_prefix("rtt="))
            .and_then(|w| {
                let w: Vec<u64> = w.split(',').filter_map(|x| x.parse().ok()).collect();
                <[u64; 9]>::try_from(w).ok()
            });
        let n = r.words[5].min(DIRECT_LEASE_MAX);
        if !procs.contains_key(&pid) {
            return Err(IpcError::NoSuchProcess(pid));
        }
        // Its datagrams name the host and a principal the host would not
        // check: only for programs that could act as the host anyway.
        if uid != 0 && uid != self.owner_uid {
            return Err(IpcError::AccessDenied(pid));
        }
        // (Older programs send 0: they are not woken, and learn of their
        // process's end from the slot at their next timer.)
        if let Ok(port @ 1..) = u16::try_from(r.words[6]) {
            self.shared.note_direct_port(pid, port);
        }
        self.shared.with_engine(|e, now| {
            if let Some(w) = back {
                e.peer_times().merge(target, Rtt::from_words(w));
            }
            let keyed = if e.is_keyed() { ";keyed" } else { "" };
            // The host's timing of `target`, lent (its clock now, to
            // translate it).
            let lent: Vec<String> = e
                .rtt_of(now, target)
                .to_words()
                .iter()
                .map(u64::to_string)
                .collect();
            let lent = format!(";now={now};rtt={}", lent.join(","));
            // The host's fault injector applies to the program's socket
            // too (its own stream of the same faults).
            let faults = match self.shared.net.fault_config() {
                Some(mut f) => {
                    f.seed = f
                        .seed
                        .wrapping_mul(0x9e37_79b9)
                        .wrapping_add(u64::from(pid.0));
                    format!(";faults={}", f.spec())
                }
                None => String::new(),
            };
            let at = e.location_of(target).map(|a| a.to_string());
            // Nowhere to send yet: the Send goes through this host.
            let n = if at.is_some() { n } else { 0 };
            let first = if n > 0 {
                self.peers.direct.fetch_add(1, Ordering::Relaxed);
                e.reserve_seqs(n)
            } else {
                0
            };
            // With the host's timers, so the program's exchanges are timed
            // as the host's own (docs/PROTOCOL.md §8f).
            let c = e.config();
            let doc = format!(
                "{};timers={},{},{},{},{}{keyed}{faults}{lent}",
                at.unwrap_or_default(),
                c.host_timeout,
                c.min_rto,
                c.max_rto,
                c.initial_rto,
                c.local_send_floor
            );
            Ok(([first, n], doc.into_bytes()))
        })
    }

    /// Answers `ask::KEYS`: the host's keys and its counter page, to a
    /// program that could act as the host anyway (its uid or root's, as
    /// for DIRECT): docs/SECURITY.md, "Attached programs and the key".
    pub(super) fn keys(&self, uid: u32) -> Result<(Arc<OwnedFd>, Vec<u8>), IpcError> {
        if uid != 0 && uid != self.owner_uid {
            return Err(IpcError::AccessDenied(Pid(0)));
        }
        let page = self.counter.clone().ok_or(IpcError::Refused(Pid(0)))?;
        let cfg = self
            .shared
            .with_engine(|e, now| e.sealer().map(|s| s.lend(now)))
            .ok_or(IpcError::Refused(Pid(0)))?;
        Ok((page, cfg.to_bytes()))
    }

    pub(super) fn answer(&self, r: &Record, uid: u32) -> Result<([u32; 2], Vec<u8>), IpcError> {
        let a = r.words[3];
        match r.words[2] {
            ask::PROCESS_EXISTS => {
                let e = self.shared.with_engine(|e, _| e.process_exists(Pid(a)));
                Ok(([u32::from(e), 0], Vec::new()))
            }
            ask::STATS_JSON | ask::PROMETHEUS => {
                let snap = self.shared.snapshot();
                let doc = if r.words[2] == ask::STATS_JSON {
                    snap.to_json()
                } else {
                    snap.to_prometheus()
                };
                if doc.len() > control::MAX_PAYLOAD {
                    return Err(IpcError::SegmentTooLarge {
                        max: control::MAX_PAYLOAD,
                    });
                }
                Ok(([0, 0], doc.into_bytes()))
            }
            ask::SRTT => {
                let t = self.shared.with_engine(|e, _| e.srtt(HostId(a as u16)));
                Ok((
                    [
                        u32::from(t.is_some()),
                        t.map_or(0, |t| t.min(u64::from(u32::MAX)) as u32),
                    ],
                    Vec::new(),
                ))
            }
            ask::ADD_PEER => {
                if uid != 0 && uid != self.owner_uid {
                    return Err(IpcError::AccessDenied(Pid(0)));
                }
                let peer = std::str::from_utf8(&r.payload)
                    .ok()
                    .and_then(|s| crate::PeerSpec::parse(s).ok())
                    .ok_or(IpcError::Refused(Pid(0)))?;
                match peer {
                    crate::PeerSpec::Addr(a) => {
                        self.shared.resolver.add_static(a);
                        self.shared.with_engine(|e, _| e.add_discovery(a));
                    }
                    name => {
                        // Looked up on the resolver thread: DNS never
                        // holds up this connection.
                        self.shared.resolver.add_name(name);
                        self.shared
                            .start_resolver()
                            .map_err(|_| IpcError::TableFull)?;
                    }
                }
                Ok(([0, 0], Vec::new()))
            }
            _ => Err(IpcError::Refused(Pid(0))),
        }
    }
}
