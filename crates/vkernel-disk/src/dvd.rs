//! Derived virtual devices (DVDs) and who may use them.
//!
//! A DVD is a window on the device — a base LBA and a length — with
//! read-only or read-write access and a list of the clients allowed: by
//! logical host, by pid, by key, or anyone. The device owner (whoever
//! presents the owner key, or the owner pid) defines, changes, lists and
//! revokes DVDs at run time. A client opens a DVD and gets a *handle*
//! bound to its host (or to its pid, when only its pid is allowed); every
//! command carrying the handle is checked again against the policy in
//! force, so a change or a revocation takes effect on the next command.
//!
//! DVD 0 is the whole device and belongs to the owner alone. Pure logic:
//! no I/O, no IPC.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::str::FromStr;

use vkernel::{HostId, Pid};

/// Errors of policy operations.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DvdError {
    /// The range does not fit in the device.
    #[error("DVD range base {base} + {blocks} blocks exceeds the device's {device} blocks")]
    Range {
        /// Base LBA.
        base: u64,
        /// Length in blocks.
        blocks: u64,
        /// Device size in blocks.
        device: u64,
    },
    /// No DVD has this id.
    #[error("no DVD {0}")]
    NoSuchDvd(u32),
    /// DVD 0 is the whole device and cannot be defined or revoked.
    #[error("DVD 0 is the whole device; it cannot be redefined or revoked")]
    Reserved,
    /// A record or text description is malformed.
    #[error("malformed DVD description: {0}")]
    Malformed(String),
    /// Too many DVDs.
    #[error("too many DVDs (at most {0})")]
    TooMany(usize),
}

/// Why a client may not use a DVD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The handle is unknown, expired, or not bound to this client.
    #[error("unknown or foreign handle")]
    BadHandle,
    /// The policy does not (or no longer does) admit this client.
    #[error("not authorised for this DVD")]
    Denied,
    /// The DVD does not exist (or was revoked).
    #[error("no such DVD")]
    NoSuchDvd,
}

/// A client a DVD admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Principal {
    /// Any client.
    Any,
    /// Any process of this logical host.
    Host(u16),
    /// This process only.
    Pid(u32),
    /// Whoever presents this key when opening.
    Key(u64),
    /// Processes running as this V principal (`Process::set_principal`;
    /// authenticated with the cluster key). Never 0.
    User(u32),
}

impl Principal {
    fn kind(&self) -> u8 {
        match self {
            Principal::Any => 0,
            Principal::Host(_) => 1,
            Principal::Pid(_) => 2,
            Principal::Key(_) => 3,
            Principal::User(_) => 4,
        }
    }
    fn value(&self) -> u64 {
        match *self {
            Principal::Any => 0,
            Principal::Host(h) => u64::from(h),
            Principal::Pid(p) => u64::from(p),
            Principal::Key(k) => k,
            Principal::User(u) => u64::from(u),
        }
    }
}

fn parse_num(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

impl FromStr for Principal {
    type Err = DvdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            DvdError::Malformed(format!(
                "client `{s}` (host:H, pid:P, key:K, user:U or any)"
            ))
        };
        if s == "any" {
            return Ok(Principal::Any);
        }
        let (k, v) = s.split_once(':').ok_or_else(bad)?;
        let n = parse_num(v).ok_or_else(bad)?;
        match k {
            "host" => u16::try_from(n).map(Principal::Host).map_err(|_| bad()),
            "pid" => u32::try_from(n).map(Principal::Pid).map_err(|_| bad()),
            "key" => Ok(Principal::Key(n)),
            "user" => u32::try_from(n)
                .ok()
                .filter(|&u| u != 0)
                .map(Principal::User)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Any => write!(f, "any"),
            Principal::Host(h) => write!(f, "host:{h:#x}"),
            Principal::Pid(p) => write!(f, "pid:{p:#010x}"),
            // Keys are secrets: never printed in full.
            Principal::Key(_) => write!(f, "key:****"),
            Principal::User(u) => write!(f, "user:{u}"),
        }
    }
}

/// One derived virtual device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dvd {
    /// Its id (0 when defining asks the device to pick one).
    pub id: u32,
    /// First block of the device that is block 0 of the DVD.
    pub base: u64,
    /// Length in blocks.
    pub blocks: u64,
    /// Writes allowed (else they fail with DATA PROTECT).
    pub writable: bool,
    /// Who may open it.
    pub allow: Vec<Principal>,
}

/// Bytes of a DVD record before its client entries.
pub const RECORD_HEAD: usize = 28;
/// Bytes of one client entry in a DVD record.
pub const RECORD_ENTRY: usize = 12;
/// Most client entries one DVD may carry.
pub const MAX_ALLOW: usize = 256;

impl Dvd {
    /// Encodes the binary record (see docs/IPDISK.md §DVD records).
    pub fn encode(&self) -> Vec<u8> {
        let n = self.allow.len().min(MAX_ALLOW);
        let mut b = Vec::with_capacity(RECORD_HEAD + n * RECORD_ENTRY);
        b.extend_from_slice(&self.id.to_be_bytes());
        b.extend_from_slice(&u32::from(self.writable).to_be_bytes());
        b.extend_from_slice(&self.base.to_be_bytes());
        b.extend_from_slice(&self.blocks.to_be_bytes());
        b.extend_from_slice(&(n as u16).to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        for p in &self.allow[..n] {
            b.push(p.kind());
            b.extend_from_slice(&[0, 0, 0]);
            b.extend_from_slice(&p.value().to_be_bytes());
        }
        b
    }

    /// Decodes one record from the front of `b`; returns it and its length.
    pub fn decode(b: &[u8]) -> Result<(Dvd, usize), DvdError> {
        let short = || DvdError::Malformed("record cut short".into());
        if b.len() < RECORD_HEAD {
            return Err(short());
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        let flags = u32_at(4);
        if flags & !1 != 0 {
            return Err(DvdError::Malformed(format!("unknown flags {flags:#x}")));
        }
        let n = u16::from_be_bytes([b[24], b[25]]) as usize;
        if n > MAX_ALLOW {
            return Err(DvdError::Malformed(format!(
                "{n} clients (max {MAX_ALLOW})"
            )));
        }
        let len = RECORD_HEAD + n * RECORD_ENTRY;
        if b.len() < len {
            return Err(short());
        }
        let mut allow = Vec::with_capacity(n);
        for i in 0..n {
            let o = RECORD_HEAD + i * RECORD_ENTRY;
            let v = u64_at(o + 4);
            let p = match b[o] {
                0 => Principal::Any,
                1 => Principal::Host(
                    u16::try_from(v).map_err(|_| DvdError::Malformed("host id".into()))?,
                ),
                2 => {
                    Principal::Pid(u32::try_from(v).map_err(|_| DvdError::Malformed("pid".into()))?)
                }
                3 => Principal::Key(v),
                4 => Principal::User(
                    u32::try_from(v)
                        .ok()
                        .filter(|&u| u != 0)
                        .ok_or_else(|| DvdError::Malformed("user".into()))?,
                ),
                k => return Err(DvdError::Malformed(format!("client kind {k}"))),
            };
            allow.push(p);
        }
        Ok((
            Dvd {
                id: u32_at(0),
                base: u64_at(8),
                blocks: u64_at(16),
                writable: flags & 1 != 0,
                allow,
            },
            len,
        ))
    }

    /// True if the DVD admits this principal exactly.
    pub fn admits(&self, p: Principal) -> bool {
        self.allow.contains(&p)
    }
}

/// Text form: `[id=N,]base=LBA,len=BLOCKS,ro|rw,allow=CLIENT[,allow=CLIENT...]`
/// where CLIENT is `host:H`, `pid:P`, `key:K`, `user:U` or `any` (numbers decimal or 0x-hex).
impl FromStr for Dvd {
    type Err = DvdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut d = Dvd {
            id: 0,
            base: 0,
            blocks: 0,
            writable: false,
            allow: Vec::new(),
        };
        let mut have_len = false;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || DvdError::Malformed(format!("`{part}`"));
            match part.split_once('=') {
                Some(("id", v)) => {
                    d.id = parse_num(v)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(bad)?
                }
                Some(("base", v)) => d.base = parse_num(v).ok_or_else(bad)?,
                Some(("len", v)) => {
                    d.blocks = parse_num(v).ok_or_else(bad)?;
                    have_len = true;
                }
                Some(("allow", v)) => d.allow.push(v.parse()?),
                None if part == "ro" => d.writable = false,
                None if part == "rw" => d.writable = true,
                _ => return Err(bad()),
            }
        }
        if !have_len {
            return Err(DvdError::Malformed("missing len=BLOCKS".into()));
        }
        Ok(d)
    }
}

impl std::fmt::Display for Dvd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "id={},base={},len={},{}",
            self.id,
            self.base,
            self.blocks,
            if self.writable { "rw" } else { "ro" }
        )?;
        for p in &self.allow {
            write!(f, ",allow={p}")?;
        }
        Ok(())
    }
}

/// Decodes a sequence of records (a DVD_LIST answer).
pub fn decode_list(mut b: &[u8]) -> Result<Vec<Dvd>, DvdError> {
    let mut v = Vec::new();
    while !b.is_empty() {
        let (d, n) = Dvd::decode(b)?;
        v.push(d);
        b = &b[n..];
    }
    Ok(v)
}

/// What a handle grants on one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// The DVD (0 = whole device).
    pub dvd: u32,
    /// Device block that is block 0 of the view.
    pub base: u64,
    /// Blocks visible.
    pub blocks: u64,
    /// Writes allowed.
    pub writable: bool,
    /// The holder is the device owner.
    pub owner: bool,
}

/// How a session was admitted (re-checked on every command).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Owner,
    Principal(Principal),
}

#[derive(Clone, Copy, Debug)]
struct Session {
    dvd: u32,
    host: HostId,
    /// Bound to this pid only (pid-admitted sessions); else to the host.
    pid: Option<Pid>,
    /// Bound to this principal (user-admitted sessions).
    user: Option<u32>,
    via: Via,
}

/// Most DVDs a device holds.
pub const MAX_DVDS: usize = 4096;
/// Most open sessions; the oldest is forgotten beyond this.
pub const MAX_SESSIONS: usize = 16384;

/// The device's access state: owner credentials, DVDs, open sessions.
#[derive(Debug)]
pub struct Access {
    owner_key: Option<u64>,
    owner_pid: Option<Pid>,
    device_blocks: u64,
    dvds: BTreeMap<u32, Dvd>,
    next_id: u32,
    sessions: HashMap<u32, Session>,
    order: VecDeque<u32>,
    rng: u64,
}

impl Access {
    /// Access state for a device of `device_blocks` blocks with these owner
    /// credentials (at least one should be set, or nobody owns it).
    pub fn new(
        device_blocks: u64,
        owner_key: Option<u64>,
        owner_pid: Option<Pid>,
        seed: u64,
    ) -> Access {
        Access {
            owner_key,
            owner_pid,
            device_blocks,
            dvds: BTreeMap::new(),
            next_id: 1,
            sessions: HashMap::new(),
            order: VecDeque::new(),
            rng: seed | 1,
        }
    }

    fn next_random(&mut self) -> u32 {
        // xorshift64*: handles need to be hard to guess by accident, not
        // cryptographically (pids are not authenticated on the wire either).
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }

    /// True if `from` is the owner pid.
    pub fn is_owner_pid(&self, from: Pid) -> bool {
        self.owner_pid == Some(from)
    }

    /// Defines a DVD, or replaces the one with the same id (a change).
    /// Id 0 asks for a fresh id. Returns the id.
    pub fn define(&mut self, mut d: Dvd) -> Result<u32, DvdError> {
        match d.base.checked_add(d.blocks) {
            Some(end) if end <= self.device_blocks => {}
            _ => {
                return Err(DvdError::Range {
                    base: d.base,
                    blocks: d.blocks,
                    device: self.device_blocks,
                })
            }
        }
        if d.id == 0 {
            while self.dvds.contains_key(&self.next_id) || self.next_id == 0 {
                self.next_id = self.next_id.wrapping_add(1);
            }
            d.id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
        }
        if !self.dvds.contains_key(&d.id) && self.dvds.len() >= MAX_DVDS {
            return Err(DvdError::TooMany(MAX_DVDS));
        }
        let id = d.id;
        self.dvds.insert(id, d);
        Ok(id)
    }

    /// Revokes a DVD: its sessions fail from the next command on.
    pub fn revoke(&mut self, id: u32) -> Result<(), DvdError> {
        if id == 0 {
            return Err(DvdError::Reserved);
        }
        self.dvds.remove(&id).ok_or(DvdError::NoSuchDvd(id))?;
        Ok(())
    }

    /// The DVDs in id order.
    pub fn list(&self) -> impl Iterator<Item = &Dvd> {
        self.dvds.values()
    }

    /// One DVD.
    pub fn get(&self, id: u32) -> Option<&Dvd> {
        self.dvds.get(&id)
    }

    fn view(&self, s: &Session) -> Result<View, AccessError> {
        if s.via == Via::Owner {
            return Ok(View {
                dvd: 0,
                base: 0,
                blocks: self.device_blocks,
                writable: true,
                owner: true,
            });
        }
        let d = self.dvds.get(&s.dvd).ok_or(AccessError::NoSuchDvd)?;
        match s.via {
            Via::Principal(p) if d.admits(p) => Ok(View {
                dvd: d.id,
                base: d.base,
                blocks: d.blocks,
                writable: d.writable,
                owner: false,
            }),
            _ => Err(AccessError::Denied),
        }
    }

    /// Opens DVD `dvd` for `from`, presenting `key` (0 = none). DVD 0
    /// needs the owner key or the owner pid. Returns a handle and the view.
    pub fn open(&mut self, from: Pid, dvd: u32, key: u64) -> Result<(u32, View), AccessError> {
        self.open_as(from, 0, dvd, key)
    }

    /// Like [`Access::open`] for a sender running as `principal` (0 =
    /// none): DVDs that admit `user:principal` open too, and the session
    /// is then bound to that principal.
    pub fn open_as(
        &mut self,
        from: Pid,
        principal: u32,
        dvd: u32,
        key: u64,
    ) -> Result<(u32, View), AccessError> {
        let mut user = None;
        let owner = self.owner_pid == Some(from) || (key != 0 && self.owner_key == Some(key));
        let (via, pid) = if dvd == 0 {
            if !owner {
                return Err(AccessError::Denied);
            }
            let bind = (self.owner_pid == Some(from)).then_some(from);
            (Via::Owner, bind)
        } else {
            let d = self.dvds.get(&dvd).ok_or(AccessError::NoSuchDvd)?;
            if key != 0 && d.admits(Principal::Key(key)) {
                (Via::Principal(Principal::Key(key)), None)
            } else if d.admits(Principal::Host(from.host().0)) {
                (Via::Principal(Principal::Host(from.host().0)), None)
            } else if d.admits(Principal::Any) {
                (Via::Principal(Principal::Any), None)
            } else if d.admits(Principal::Pid(from.0)) {
                (Via::Principal(Principal::Pid(from.0)), Some(from))
            } else if principal != 0 && d.admits(Principal::User(principal)) {
                user = Some(principal);
                (Via::Principal(Principal::User(principal)), None)
            } else {
                return Err(AccessError::Denied);
            }
        };
        let s = Session {
            dvd,
            host: from.host(),
            pid,
            user,
            via,
        };
        let view = self.view(&s)?;
        let mut h = self.next_random();
        while h == 0 || self.sessions.contains_key(&h) {
            h = self.next_random();
        }
        if self.sessions.len() >= MAX_SESSIONS {
            while let Some(old) = self.order.pop_front() {
                if self.sessions.remove(&old).is_some() {
                    break;
                }
            }
        }
        self.sessions.insert(h, s);
        self.order.push_back(h);
        Ok((h, view))
    }

    /// Checks a command from `from` carrying `handle` against the policy
    /// in force; the view to execute it in.
    pub fn check(&self, from: Pid, handle: u32) -> Result<View, AccessError> {
        self.check_as(from, 0, handle)
    }

    /// Like [`Access::check`] for a sender running as `principal`.
    pub fn check_as(&self, from: Pid, principal: u32, handle: u32) -> Result<View, AccessError> {
        if handle == 0 && self.owner_pid == Some(from) {
            return self.view(&Session {
                dvd: 0,
                host: from.host(),
                pid: Some(from),
                user: None,
                via: Via::Owner,
            });
        }
        let s = self.sessions.get(&handle).ok_or(AccessError::BadHandle)?;
        if s.host != from.host()
            || s.pid.is_some_and(|p| p != from)
            || s.user.is_some_and(|u| u != principal)
        {
            return Err(AccessError::BadHandle);
        }
        self.view(s)
    }

    /// Forgets a session (client close).
    pub fn close(&mut self, from: Pid, handle: u32) -> Result<(), AccessError> {
        match self.sessions.get(&handle) {
            Some(s) if s.host == from.host() && (s.pid.is_none() || s.pid == Some(from)) => {
                self.sessions.remove(&handle);
                Ok(())
            }
            _ => Err(AccessError::BadHandle),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(h: u16, l: u16) -> Pid {
        Pid::new(HostId(h), l)
    }

    #[test]
    fn records_round_trip_and_reject_garbage() {
        let d = Dvd {
            id: 7,
            base: 100,
            blocks: 2048,
            writable: true,
            allow: vec![
                Principal::Host(3),
                Principal::Pid(0x0003_0004),
                Principal::Key(0xdead_beef),
                Principal::Any,
            ],
        };
        let b = d.encode();
        assert_eq!(b.len(), RECORD_HEAD + 4 * RECORD_ENTRY);
        assert_eq!(Dvd::decode(&b).unwrap(), (d.clone(), b.len()));
        let mut two = b.clone();
        two.extend_from_slice(&b);
        assert_eq!(decode_list(&two).unwrap(), vec![d.clone(), d.clone()]);
        assert!(Dvd::decode(&b[..b.len() - 1]).is_err());
        let mut bad = b.clone();
        bad[RECORD_HEAD] = 9;
        assert!(Dvd::decode(&bad).is_err());
        let mut bad = b;
        bad[7] = 2;
        assert!(Dvd::decode(&bad).is_err());
        let t: Dvd = "id=7,base=100,len=2048,rw,allow=host:3,allow=pid:0x30004,allow=key:0xdeadbeef,allow=any"
            .parse()
            .unwrap();
        assert_eq!(t, d);
        assert!("base=1".parse::<Dvd>().is_err());
        assert!("len=1,allow=cat:3".parse::<Dvd>().is_err());
        assert!("len=1,allow=host:70000".parse::<Dvd>().is_err());
        assert!(!t.to_string().contains("deadbeef"), "keys are not printed");
    }

    #[test]
    fn open_check_change_revoke() {
        let owner = pid(1, 5);
        let mut a = Access::new(10_000, Some(42), Some(owner), 1);
        // Owner by pid and by key; others cannot open DVD 0.
        assert_eq!(a.open(owner, 0, 0).unwrap().1.blocks, 10_000);
        assert!(a.check(owner, 0).unwrap().owner);
        let (h, v) = a.open(pid(9, 9), 0, 42).unwrap();
        assert!(v.owner && v.writable);
        assert_eq!(a.check(pid(9, 10), h).unwrap().dvd, 0, "bound to the host");
        assert_eq!(a.check(pid(8, 10), h), Err(AccessError::BadHandle));
        assert_eq!(a.open(pid(9, 9), 0, 41), Err(AccessError::Denied));
        assert_eq!(a.check(pid(9, 9), 0), Err(AccessError::BadHandle));

        // Range checked against the device.
        assert!(a
            .define("base=9000,len=1001,ro,allow=any".parse().unwrap())
            .is_err());
        let id = a
            .define(
                "base=1000,len=100,ro,allow=host:2,allow=pid:0x30007,allow=key:77"
                    .parse()
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(a.open(pid(4, 1), id, 0), Err(AccessError::Denied));
        assert_eq!(a.open(pid(4, 1), 999, 0), Err(AccessError::NoSuchDvd));
        let (hh, v) = a.open(pid(2, 1), id, 0).unwrap();
        assert_eq!((v.base, v.blocks, v.writable), (1000, 100, false));
        assert!(a.check(pid(2, 2), hh).is_ok());
        let (hp, _) = a.open(pid(3, 7), id, 0).unwrap();
        assert_eq!(
            a.check(pid(3, 8), hp),
            Err(AccessError::BadHandle),
            "pid-bound"
        );
        let (hk, _) = a.open(pid(4, 1), id, 77).unwrap();
        assert!(a.check(pid(4, 3), hk).is_ok());

        // Change: rw, host 2 no longer allowed.
        let mut d = a.get(id).unwrap().clone();
        d.writable = true;
        d.allow.retain(|p| *p != Principal::Host(2));
        a.define(d).unwrap();
        assert_eq!(a.check(pid(2, 2), hh), Err(AccessError::Denied));
        assert!(a.check(pid(4, 3), hk).unwrap().writable);
        // Revoke.
        a.revoke(id).unwrap();
        assert_eq!(a.check(pid(4, 3), hk), Err(AccessError::NoSuchDvd));
        // A DVD for V principal 500: opened by that principal on any host,
        // and its handle is useless to another principal of that host.
        let u: Dvd = "base=0,len=10,ro,allow=user:500".parse().unwrap();
        assert_eq!(u.allow, vec![Principal::User(500)]);
        assert!("base=0,len=1,ro,allow=user:0".parse::<Dvd>().is_err());
        let uid = a.define(u).unwrap();
        assert_eq!(a.open_as(pid(6, 1), 0, uid, 0), Err(AccessError::Denied));
        assert_eq!(a.open_as(pid(6, 1), 501, uid, 0), Err(AccessError::Denied));
        let (hu, v) = a.open_as(pid(6, 1), 500, uid, 0).unwrap();
        assert!(!v.writable);
        assert!(a.check_as(pid(6, 2), 500, hu).is_ok());
        assert_eq!(a.check_as(pid(6, 2), 501, hu), Err(AccessError::BadHandle));
        a.revoke(uid).unwrap();
        assert_eq!(a.revoke(id), Err(DvdError::NoSuchDvd(id)));
        assert_eq!(a.revoke(0), Err(DvdError::Reserved));
        assert_eq!(a.list().count(), 0);
        // Close.
        assert!(a.close(pid(9, 1), h).is_ok());
        assert_eq!(a.check(pid(9, 1), h), Err(AccessError::BadHandle));
    }

    #[test]
    fn sessions_are_bounded() {
        let mut a = Access::new(10, Some(1), None, 3);
        let first = a.open(pid(1, 1), 0, 1).unwrap().0;
        for _ in 0..MAX_SESSIONS {
            a.open(pid(1, 1), 0, 1).unwrap();
        }
        assert_eq!(a.sessions.len(), MAX_SESSIONS);
        assert_eq!(a.check(pid(1, 1), first), Err(AccessError::BadHandle));
    }
}
