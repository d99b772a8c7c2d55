//! Peers given by name: `HOST:PORT` where HOST is an IP literal or a DNS
//! name that may resolve to several addresses (a Kubernetes headless
//! Service resolves to every ready pod).
//!
//! A host resolves its names as it starts, then again every
//! `KernelConfig::resolve_interval` on a small thread of its own, so that
//! hosts coming and going behind a name are followed without a restart.
//! Each address a name yields is a discovery address of the engine (asked
//! when a host's location is unknown, for remote GetPid, host-id
//! announcements and unicast group fan-out). An address the name no longer
//! yields is dropped from that list; what the engine learned from the
//! host's own datagrams (its location-cache entry) stays until newer
//! datagrams overwrite it or it is evicted, as for any host.
//!
//! A name that does not resolve (yet) is not an error: a StatefulSet's pods
//! appear one by one, and a pod's own name may be published only once it
//! is ready. It is logged as a warning and tried again at the next round.
//! A name whose lookup fails keeps the addresses it had (a DNS outage must
//! not cut a cluster apart); only a successful lookup replaces them.

use std::collections::HashSet;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::kernel::Shared;

/// A peer as a user names it: an address, or a DNS name and a port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerSpec {
    /// An IP address and port (`10.0.0.5:7000`, `[::1]:7000`).
    Addr(SocketAddr),
    /// A name to resolve (`vkernel.vkernel.default.svc.cluster.local:7000`).
    Name {
        /// The DNS name (or /etc/hosts name).
        host: String,
        /// The UDP port of every host behind the name.
        port: u16,
    },
}

impl PeerSpec {
    /// Parses `HOST:PORT`: HOST is an IPv4 address, `[IPv6]`, or a DNS
    /// name. This is the one parser of peers, for `--peer` and for
    /// configuration files alike.
    pub fn parse(s: &str) -> Result<PeerSpec, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("empty peer: expected HOST:PORT".into());
        }
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(PeerSpec::Addr(a));
        }
        if s.starts_with('[') {
            return Err(format!(
                "`{s}` is not an IPv6 address and port like [fd00::5]:7000"
            ));
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(format!(
                "`{s}` has no port: expected HOST:PORT, e.g. 10.0.0.5:7000 or vkernel-0.vkernel:7000"
            ));
        };
        if host.contains(':') {
            return Err(format!(
                "`{s}`: an IPv6 address needs brackets, e.g. [fd00::5]:7000"
            ));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{s}`: `{port}` is not a port (1..=65535)"))?;
        if port == 0 {
            return Err(format!("`{s}`: port 0 cannot be a peer's port"));
        }
        check_name(host).map_err(|e| format!("`{s}`: {e}"))?;
        Ok(PeerSpec::Name {
            host: host.to_string(),
            port,
        })
    }

    /// The address, if this is one rather than a name.
    pub fn addr(&self) -> Option<SocketAddr> {
        match self {
            PeerSpec::Addr(a) => Some(*a),
            PeerSpec::Name { .. } => None,
        }
    }

    /// Every address this peer stands for now (a name is looked up through
    /// the system resolver, which reads /etc/hosts and DNS), sorted,
    /// without duplicates.
    pub fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        let mut v: Vec<SocketAddr> = match self {
            PeerSpec::Addr(a) => vec![*a],
            PeerSpec::Name { host, port } => (host.as_str(), *port).to_socket_addrs()?.collect(),
        };
        v.sort();
        v.dedup();
        Ok(v)
    }
}

impl PeerSpec {
    /// True if this peer is on this machine: a loopback address, or the
    /// name `localhost`.
    pub fn is_local(&self) -> bool {
        match self {
            PeerSpec::Addr(a) => a.ip().is_loopback(),
            PeerSpec::Name { host, .. } => {
                let h = host.strip_suffix('.').unwrap_or(host);
                h.eq_ignore_ascii_case("localhost")
                    || h.to_ascii_lowercase().ends_with(".localhost")
            }
        }
    }
}

/// Where a logical host binds when not told: loopback, which only this
/// machine reaches, unless a peer is off this machine; then every
/// interface (`0.0.0.0:0`, or `[::]:0` if every such peer is an IPv6
/// address), so that peer's answers can come back.
pub fn default_bind(peers: &[PeerSpec]) -> SocketAddr {
    let remote: Vec<&PeerSpec> = peers.iter().filter(|p| !p.is_local()).collect();
    if remote.is_empty() {
        return SocketAddr::from(([127, 0, 0, 1], 0));
    }
    if remote.iter().all(|p| p.addr().is_some_and(|a| a.is_ipv6())) {
        return SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0));
    }
    SocketAddr::from(([0, 0, 0, 0], 0))
}

/// Why a host bound at `bind` cannot hear from `peers`, if it cannot: a
/// loopback address is unreachable from another machine, so a peer
/// there can never answer.
pub fn unreachable_from(bind: SocketAddr, peers: &[PeerSpec]) -> Option<String> {
    if !bind.ip().is_loopback() {
        return None;
    }
    let far: Vec<String> = peers
        .iter()
        .filter(|p| !p.is_local())
        .map(|p| match p {
            PeerSpec::Addr(a) => a.to_string(),
            PeerSpec::Name { host, port } => format!("{host}:{port}"),
        })
        .collect();
    (!far.is_empty()).then(|| {
        format!(
            "bound to {bind}, which only this machine reaches: {} cannot answer. Bind 0.0.0.0:PORT (or leave --bind out: with a peer off this machine that is the default)",
            far.join(", ")
        )
    })
}

/// A DNS name's syntax (RFC 1123, plus `_` which some resolvers allow).
fn check_name(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("no host before the port".into());
    }
    if host.len() > 253 {
        return Err("a host name is at most 253 characters".into());
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("`{host}` is not an IPv4 address"));
    }
    for label in host.strip_suffix('.').unwrap_or(host).split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!(
                "`{host}` is not a host name (each dot-separated part is 1..=63 characters)"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!(
                "`{host}` is not a host name (`{c}`: only letters, digits, `-`, `_` and dots)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "`{host}` is not a host name (a part starts or ends with `-`)"
            ));
        }
    }
    Ok(())
}

impl FromStr for PeerSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<PeerSpec, String> {
        PeerSpec::parse(s)
    }
}

impl From<SocketAddr> for PeerSpec {
    fn from(a: SocketAddr) -> PeerSpec {
        PeerSpec::Addr(a)
    }
}

impl fmt::Display for PeerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerSpec::Addr(a) => write!(f, "{a}"),
            PeerSpec::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// The names a host follows, shared with its resolver thread.
pub(crate) struct Resolver {
    watch: Mutex<Watch>,
    wake: Condvar,
}

struct Watch {
    names: Vec<Named>,
    /// Addresses given as addresses: never dropped.
    statics: HashSet<SocketAddr>,
    /// This host's own address, never a peer of itself.
    me: SocketAddr,
    interval: Duration,
    /// Resolve at once (a name was added without addresses).
    due: bool,
    stop: bool,
    /// Whether the thread runs.
    running: bool,
}

struct Named {
    spec: PeerSpec,
    addrs: Vec<SocketAddr>,
    /// The last lookup failed (warn once per failure streak).
    failing: bool,
}

/// Whether a host bound at `me` may use `a` as a peer: not itself, and
/// not an IPv6 address from an IPv4 socket (a name with A and AAAA
/// records, as in a dual-stack cluster, gives both).
fn usable(me: SocketAddr, a: SocketAddr) -> bool {
    a != me && !(me.is_ipv4() && a.is_ipv6())
}

/// One lookup's result, logged as the start of a host and each round do.
fn lookup(spec: &PeerSpec, was_failing: bool) -> Option<Vec<SocketAddr>> {
    match spec.resolve() {
        Ok(v) if !v.is_empty() => Some(v),
        Ok(_) => {
            if !was_failing {
                tracing::warn!("peer {spec}: the name has no addresses yet; trying again later");
            }
            None
        }
        Err(e) => {
            if !was_failing {
                tracing::warn!("peer {spec}: {e}; trying again later");
            }
            None
        }
    }
}

impl Resolver {
    /// A resolver for a host at `me`, whose static peers are `statics`.
    pub(crate) fn new(me: SocketAddr, statics: &[SocketAddr], interval: Duration) -> Resolver {
        Resolver {
            watch: Mutex::new(Watch {
                names: Vec::new(),
                statics: statics.iter().copied().collect(),
                me,
                interval: interval.max(Duration::from_millis(100)),
                due: false,
                stop: false,
                running: false,
            }),
            wake: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Watch> {
        match self.watch.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Resolves `specs` now (names that do not resolve are warned about
    /// and kept for later) and returns the addresses to add to the engine.
    /// Used as the host starts, before the engine exists.
    pub(crate) fn initial(&self, specs: &[PeerSpec]) -> Vec<SocketAddr> {
        let mut out = Vec::new();
        for spec in specs {
            match spec {
                PeerSpec::Addr(a) => {
                    self.lock().statics.insert(*a);
                    out.push(*a);
                }
                PeerSpec::Name { .. } => {
                    let got = lookup(spec, false);
                    let mut w = self.lock();
                    let me = w.me;
                    let addrs: Vec<SocketAddr> = got
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|a| usable(me, *a))
                        .collect();
                    out.extend(addrs.iter().copied());
                    let failing = addrs.is_empty();
                    if !w.names.iter().any(|n| n.spec == *spec) {
                        w.names.push(Named {
                            spec: spec.clone(),
                            addrs,
                            failing,
                        });
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Records a static peer address (never dropped).
    pub(crate) fn add_static(&self, a: SocketAddr) {
        self.lock().statics.insert(a);
    }

    /// Follows a name from now on; it is looked up by the resolver thread
    /// at once (the caller does not wait for DNS).
    pub(crate) fn add_name(&self, spec: PeerSpec) {
        let mut w = self.lock();
        if !w.names.iter().any(|n| n.spec == spec) {
            w.names.push(Named {
                spec,
                addrs: Vec::new(),
                failing: false,
            });
        }
        w.due = true;
        self.wake.notify_all();
    }

    /// True if the resolver thread should be started (names to follow and
    /// none running); marks it running.
    pub(crate) fn needs_thread(&self) -> bool {
        let mut w = self.lock();
        if w.names.is_empty() || w.running || w.stop {
            return false;
        }
        w.running = true;
        true
    }

    /// Stops the thread (it exits at its next wake-up, without waiting for
    /// a lookup in progress).
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }

    /// The resolver thread: every interval (or at once when a name is
    /// added) looks every name up and tells the engine what changed. It
    /// holds the host weakly, so it never keeps a stopped host alive, and
    /// a slow lookup never delays the host's shutdown.
    pub(crate) fn run(self: Arc<Self>, host: Weak<Shared>) {
        loop {
            let specs: Vec<(PeerSpec, bool)> = {
                let mut w = self.lock();
                let deadline = Instant::now() + w.interval;
                while !w.stop && !w.due {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    w = match self.wake.wait_timeout(w, left) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                }
                if w.stop {
                    return;
                }
                w.due = false;
                w.names
                    .iter()
                    .map(|n| (n.spec.clone(), n.failing))
                    .collect()
            };
            let results: Vec<(PeerSpec, Option<Vec<SocketAddr>>)> = specs
                .into_iter()
                .map(|(s, failing)| {
                    let r = lookup(&s, failing);
                    (s, r)
                })
                .collect();
            let Some(shared) = host.upgrade() else { return };
            let (added, dropped) = {
                let mut w = self.lock();
                if w.stop {
                    return;
                }
                w.apply(results)
            };
            if !added.is_empty() || !dropped.is_empty() {
                tracing::info!("peers by name: added {added:?}, dropped {dropped:?}");
                shared.with_engine(|e, _| {
                    for a in added {
                        e.add_discovery(a);
                    }
                    for a in dropped {
                        e.remove_discovery(a);
                    }
                });
            }
        }
    }
}

impl Watch {
    /// Takes a round's lookups; returns the addresses to add and to drop.
    fn apply(
        &mut self,
        results: Vec<(PeerSpec, Option<Vec<SocketAddr>>)>,
    ) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
        let before: HashSet<SocketAddr> = self.all();
        let me = self.me;
        for (spec, got) in results {
            let Some(n) = self.names.iter_mut().find(|n| n.spec == spec) else {
                continue;
            };
            match got {
                Some(v) => {
                    n.addrs = v.into_iter().filter(|a| usable(me, *a)).collect();
                    n.failing = false;
                }
                None => n.failing = true,
            }
        }
        let after = self.all();
        let mut added: Vec<SocketAddr> = after.difference(&before).copied().collect();
        let mut dropped: Vec<SocketAddr> = before
            .difference(&after)
            .filter(|a| !self.statics.contains(a))
            .copied()
            .collect();
        added.sort();
        dropped.sort();
        (added, dropped)
    }

    fn all(&self) -> HashSet<SocketAddr> {
        self.names
            .iter()
            .flat_map(|n| n.addrs.iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_and_names() {
        assert_eq!(
            PeerSpec::parse("127.0.0.1:7000").unwrap(),
            PeerSpec::Addr("127.0.0.1:7000".parse().unwrap())
        );
        assert_eq!(
            PeerSpec::parse(" [::1]:7000 ").unwrap(),
            PeerSpec::Addr("[::1]:7000".parse().unwrap())
        );
        assert_eq!(
            PeerSpec::parse("vkernel.default.svc.cluster.local:7000").unwrap(),
            PeerSpec::Name {
                host: "vkernel.default.svc.cluster.local".into(),
                port: 7000
            }
        );
        assert_eq!(
            PeerSpec::parse("vkernel-0.vkernel:7000")
                .unwrap()
                .to_string(),
            "vkernel-0.vkernel:7000"
        );
    }

    #[test]
    fn malformed_peers_give_clear_errors() {
        for (s, want) in [
            ("", "empty"),
            ("host", "no port"),
            ("host:", "not a port"),
            ("host:70000", "not a port"),
            ("host:0", "port 0"),
            (":7000", "no host"),
            ("::1:7000", "brackets"),
            ("[::1]", "IPv6"),
            ("[nope]:7000", "IPv6"),
            ("999.1.1.1:7000", "not an IPv4"),
            ("a..b:7000", "not a host name"),
            ("-a.b:7000", "starts or ends"),
            ("a b:7000", "only letters"),
            ("héllo:7000", "only letters"),
        ] {
            let e = PeerSpec::parse(s).unwrap_err();
            assert!(e.contains(want), "{s:?}: {e}");
        }
        let long = format!("{}:1", "a.".repeat(130));
        assert!(PeerSpec::parse(&long).unwrap_err().contains("253"));
    }

    #[test]
    fn a_peer_off_this_machine_makes_the_default_bind_reachable() {
        let p = |s: &str| PeerSpec::parse(s).unwrap();
        let lo = SocketAddr::from(([127, 0, 0, 1], 0));
        assert_eq!(default_bind(&[]), lo);
        assert_eq!(
            default_bind(&[p("127.0.0.1:7000"), p("localhost:7000")]),
            lo
        );
        assert_eq!(default_bind(&[p("[::1]:7000")]), lo);
        let any4 = SocketAddr::from(([0, 0, 0, 0], 0));
        assert_eq!(
            default_bind(&[p("127.0.0.1:7000"), p("10.0.0.5:7000")]),
            any4
        );
        assert_eq!(default_bind(&[p("vkernel-0.vkernel:7000")]), any4);
        let any6: SocketAddr = "[::]:0".parse().unwrap();
        assert_eq!(default_bind(&[p("[fd00::5]:7000")]), any6);
        let why = unreachable_from(lo, &[p("10.0.0.5:7000")]).unwrap();
        assert!(why.contains("10.0.0.5:7000 cannot answer"), "{why}");
        assert!(unreachable_from(lo, &[p("127.0.0.1:7000")]).is_none());
        assert!(unreachable_from(any4, &[p("10.0.0.5:7000")]).is_none());
    }

    #[test]
    fn resolves_localhost_and_literals() {
        let a = PeerSpec::parse("10.1.2.3:9").unwrap().resolve().unwrap();
        assert_eq!(a, vec!["10.1.2.3:9".parse().unwrap()]);
        let l = PeerSpec::parse("localhost:7000")
            .unwrap()
            .resolve()
            .unwrap();
        assert!(!l.is_empty() && l.iter().all(|a| a.ip().is_loopback() && a.port() == 7000));
    }

    #[test]
    fn a_round_adds_and_drops_but_keeps_statics_and_failed_names() {
        let me: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let s: SocketAddr = "127.0.0.9:9".parse().unwrap();
        let r = Resolver::new(me, &[s], Duration::from_secs(1));
        let n = PeerSpec::parse("peers.test:9").unwrap();
        let m = PeerSpec::parse("other.test:9").unwrap();
        r.add_name(n.clone());
        r.add_name(m.clone());
        let a = |x: &str| -> SocketAddr { x.parse().unwrap() };
        let mut w = r.lock();
        let (add, drop) = w.apply(vec![
            (n.clone(), Some(vec![a("127.0.0.2:9"), me, s, a("[::1]:9")])),
            (m.clone(), Some(vec![a("127.0.0.3:9")])),
        ]);
        assert_eq!(add, vec![a("127.0.0.2:9"), a("127.0.0.3:9"), s]);
        assert!(drop.is_empty());
        // `n` loses two addresses; `m`'s lookup fails: it keeps its own.
        let (add, drop) = w.apply(vec![(n.clone(), Some(vec![a("127.0.0.4:9")])), (m, None)]);
        assert_eq!(add, vec![a("127.0.0.4:9")]);
        assert_eq!(drop, vec![a("127.0.0.2:9")]);
        assert!(w.names.iter().any(|x| x.failing));
    }
}
