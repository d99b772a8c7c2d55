//! Fault injection: loss, duplication, reordering and delay applied to
//! every outgoing datagram of a host, whichever socket it leaves from, so
//! the real binary can run on a "bad network" (`--faults`); and its
//! configuration ([`FaultConfig`], parsed from the command line's spec).

use std::collections::BinaryHeap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Net;

/// Fault rates (probabilities in `0.0..=1.0`) applied to outgoing datagrams.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Drop the datagram.
    pub loss: f64,
    /// Send it twice.
    pub duplicate: f64,
    /// Hold it back and send it after the next datagram.
    pub reorder: f64,
    /// Delay it by `delay` (uniform 0..=delay).
    pub delay_rate: f64,
    /// Upper bound of an injected delay.
    pub delay: Duration,
    /// RNG seed (0 = from the clock).
    pub seed: u64,
}

impl FaultConfig {
    /// True if any fault is enabled.
    pub fn active(&self) -> bool {
        self.loss > 0.0 || self.duplicate > 0.0 || self.reorder > 0.0 || self.delay_rate > 0.0
    }

    /// The spec [`FaultConfig::parse`] reads back.
    pub fn spec(&self) -> String {
        format!(
            "loss={},dup={},reorder={},delay={}:{}us,seed={}",
            self.loss,
            self.duplicate,
            self.reorder,
            self.delay_rate,
            self.delay.as_micros(),
            self.seed
        )
    }

    /// Parses `loss=0.05,dup=0.01,reorder=0.01,delay=0.1:5ms,seed=7`.
    pub fn parse(s: &str) -> Result<FaultConfig, String> {
        let mut f = FaultConfig::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("fault spec `{part}`: expected key=value"))?;
            let rate = |v: &str| -> Result<f64, String> {
                let r: f64 = v
                    .parse()
                    .map_err(|_| format!("fault `{k}`: `{v}` is not a number"))?;
                if !(0.0..=1.0).contains(&r) {
                    return Err(format!("fault `{k}`: rate {r} not in 0..=1"));
                }
                Ok(r)
            };
            match k {
                "loss" => f.loss = rate(v)?,
                "dup" | "duplicate" => f.duplicate = rate(v)?,
                "reorder" => f.reorder = rate(v)?,
                "delay" => {
                    let (r, d) = v.split_once(':').unwrap_or((v, "5ms"));
                    f.delay_rate = rate(r)?;
                    f.delay = parse_duration(d)?;
                }
                "seed" => {
                    f.seed = v
                        .parse()
                        .map_err(|_| format!("fault seed `{v}` is not an integer"))?
                }
                _ => {
                    return Err(format!(
                        "unknown fault `{k}` (known: loss, dup, reorder, delay, seed)"
                    ))
                }
            }
        }
        Ok(f)
    }
}

/// Parses a duration with its unit: `5ms`, `200us` (or `µs`), `1s`,
/// `1m`, `1h 30m` (humantime's syntax). A bare number is refused, except
/// `0`: `5` could mean 5 ms or 5 s, and guessing wrong was a real bug
/// (`host_timeout = 5` read as 5 ms).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
        return Err(format!(
            "`{t}` needs a unit: e.g. {t}ms or {t}s (units: ns, us, ms, s, m, h)"
        ));
    }
    humantime::parse_duration(&t.replace('µ', "u"))
        .map_err(|e| format!("`{t}` is not a duration ({e}; e.g. 5ms, 200us, 1s, 1m)"))
}

pub(super) struct Delayed {
    pub(super) due: Instant,
    pub(super) to: SocketAddr,
    pub(super) data: Vec<u8>,
    /// The socket it leaves from (None: the main one).
    pub(super) from: Option<Arc<UdpSocket>>,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        self.due == o.due
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.due.cmp(&self.due) // min-heap
    }
}

/// A fault injector's state: its configuration, random numbers, and the
/// datagrams it keeps back ([`FaultState::inject`]).
pub(crate) struct FaultState {
    pub(super) cfg: FaultConfig,
    pub(super) rng: SmallRng,
    pub(super) held: Option<(SocketAddr, Vec<u8>, Option<Arc<UdpSocket>>)>,
    pub(super) delayed: BinaryHeap<Delayed>,
}

impl FaultState {
    /// The injector for `faults`, if any fault is on (seeded from
    /// `faults.seed`, or from the clock if that is 0).
    pub(crate) fn for_config(faults: FaultConfig) -> Option<Mutex<FaultState>> {
        faults.active().then(|| {
            let seed = if faults.seed == 0 {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
                    ^ std::process::id() as u64
            } else {
                faults.seed
            };
            Mutex::new(FaultState {
                rng: SmallRng::seed_from_u64(seed),
                cfg: faults,
                held: None,
                delayed: BinaryHeap::new(),
            })
        })
    }
}

/// The one fault injector of a set of sockets: what a host's `Net` sends
/// passes it, and so does what an attached program sends on its own
/// socket for the host (`attach/direct.rs`). `send` sends one datagram
/// from a socket (None: the caller's main one).
impl FaultState {
    /// Applies the faults to `data` for `to`, leaving from `from`: sends
    /// what goes now through `send`, keeps what is delayed or held back.
    /// Returns the buffer unless it was kept.
    pub(crate) fn inject(
        st: &Mutex<FaultState>,
        c: &super::NetCounters,
        from: Option<&Arc<UdpSocket>>,
        to: SocketAddr,
        data: Vec<u8>,
        send: impl Fn(Option<&Arc<UdpSocket>>, SocketAddr, &[u8]),
    ) -> Option<Vec<u8>> {
        let mut st = match st.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let st = &mut *st;
        if st.rng.gen_bool(st.cfg.loss) {
            c.injected_loss.fetch_add(1, Ordering::Relaxed);
            return Some(data);
        }
        let copies = if st.rng.gen_bool(st.cfg.duplicate) {
            c.injected_dup.fetch_add(1, Ordering::Relaxed);
            2
        } else {
            1
        };
        if st.rng.gen_bool(st.cfg.delay_rate) {
            c.injected_delay.fetch_add(1, Ordering::Relaxed);
            let max = st.cfg.delay.as_micros() as u64;
            let d = Duration::from_micros(st.rng.gen_range(0..=max));
            for _ in 0..copies {
                st.delayed.push(Delayed {
                    due: Instant::now() + d,
                    to,
                    data: data.clone(),
                    from: from.cloned(),
                });
            }
            return Some(data);
        }
        if st.held.is_none() && st.rng.gen_bool(st.cfg.reorder) {
            c.injected_reorder.fetch_add(1, Ordering::Relaxed);
            st.held = Some((to, data, from.cloned()));
            return None;
        }
        let held = st.held.take();
        for _ in 0..copies {
            send(from, to, &data);
        }
        if let Some((hto, hdata, hfrom)) = held {
            send(hfrom.as_ref(), hto, &hdata);
        }
        Some(data)
    }

    /// Sends the delayed and held datagrams that are due through `send`;
    /// returns when the next one falls due (a held one waits at most one
    /// flush: 1 ms).
    pub(crate) fn flush(
        st: &Mutex<FaultState>,
        send: impl Fn(Option<&Arc<UdpSocket>>, SocketAddr, &[u8]),
    ) -> Instant {
        let mut st = match st.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let now = Instant::now();
        let mut out = Vec::new();
        if let Some(h) = st.held.take() {
            out.push(h);
        }
        while st.delayed.peek().is_some_and(|d| d.due <= now) {
            if let Some(d) = st.delayed.pop() {
                out.push((d.to, d.data, d.from));
            }
        }
        let next = st.delayed.peek().map(|d| d.due);
        drop(st);
        for (to, d, from) in out {
            send(from.as_ref(), to, &d);
        }
        next.unwrap_or(now + Duration::from_millis(1))
    }
}

impl Net {
    /// The fault injector: every datagram of this host passes here when
    /// one is configured, whichever socket it leaves from (`from`: None
    /// for the main one), so that faults apply to every path alike.
    /// Returns the buffer unless it was kept.
    pub(super) fn inject(
        &self,
        from: Option<&Arc<UdpSocket>>,
        to: SocketAddr,
        data: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let Some(f) = &self.faults else {
            self.raw_send_from(from, to, &data);
            return Some(data);
        };
        FaultState::inject(f, &self.counters, from, to, data, |from, to, d| {
            self.raw_send_from(from, to, d)
        })
    }

    /// Sends delayed and held datagrams that are due; returns when the next
    /// one falls due.
    pub fn flush_due(&self) -> Option<Instant> {
        let f = self.faults.as_ref()?;
        Some(FaultState::flush(f, |from, to, d| {
            self.raw_send_from(from, to, d)
        }))
    }

    /// The fault injector's configuration, if one is on.
    pub(crate) fn fault_config(&self) -> Option<FaultConfig> {
        let f = self.faults.as_ref()?;
        let g = match f.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        Some(g.cfg.clone())
    }

    /// True if fault injection is on.
    pub fn has_faults(&self) -> bool {
        self.faults.is_some()
    }
}
