//! Adaptive retransmission timeout (Jacobson/Karels), per peer host.

use crate::config::Micros;

/// Smoothed RTT state for one peer host.
#[derive(Clone, Copy, Debug)]
pub struct Rtt {
    srtt: Option<Micros>,
    rttvar: Micros,
    /// A floor under a request's timeout, raised when a retransmission
    /// proved needless (the peer held the request), and when it was last
    /// raised or lowered: it halves over each [`HELD_HALF_LIFE`] since,
    /// and at each retransmission that proved needed ([`Rtt::lost`]).
    held: Micros,
    held_at: Micros,
    /// When the peer last answered a Send of ours, and the newest first
    /// transmission among the Sends it has answered ([`Rtt::older_served`]).
    answered_at: Micros,
    answered_newest: Micros,
    /// When a Send to the peer was last retransmitted, when the peer last
    /// answered anything (a reply or replyPending), and when it last
    /// showed a retransmission needless ([`Rtt::probing`]).
    probe_at: Micros,
    heard_at: Micros,
    needless_at: Micros,
}

impl Default for Rtt {
    fn default() -> Self {
        Rtt::new()
    }
}

impl Rtt {
    /// No samples yet.
    pub const fn new() -> Rtt {
        Rtt {
            srtt: None,
            rttvar: 0,
            held: 0,
            held_at: 0,
            answered_at: 0,
            answered_newest: 0,
            probe_at: 0,
            heard_at: 0,
            needless_at: 0,
        }
    }

    /// No samples yet, and a needless-copy floor of `floor` µs as of `now`
    /// (as if a copy had proved needless then; see
    /// `Config::local_send_floor`).
    pub const fn primed(now: Micros, floor: Micros) -> Rtt {
        let mut r = Rtt::new();
        r.held = floor;
        r.held_at = now;
        r
    }

    /// What is known at `now` of a peer never measured, found at `at`:
    /// nothing, unless `at` is a loopback address (the peer shares this
    /// machine's CPUs), which starts with a floor of `local_floor`.
    pub fn for_peer(now: Micros, at: Option<std::net::SocketAddr>, local_floor: Micros) -> Rtt {
        match at {
            Some(a) if a.ip().is_loopback() && local_floor > 0 => Rtt::primed(now, local_floor),
            _ => Rtt::new(),
        }
    }

    /// The state as words, to lend it to another clock's holder (an
    /// attached program; [`Rtt::from_words`], [`Rtt::shifted`]): srtt
    /// (`u64::MAX`: none), rttvar, held floor, then the times held_at,
    /// answered_at, answered_newest, probe_at, heard_at, needless_at.
    pub fn to_words(&self) -> [u64; 9] {
        [
            self.srtt.unwrap_or(u64::MAX),
            self.rttvar,
            self.held,
            self.held_at,
            self.answered_at,
            self.answered_newest,
            self.probe_at,
            self.heard_at,
            self.needless_at,
        ]
    }

    /// The state of [`Rtt::to_words`].
    pub fn from_words(w: [u64; 9]) -> Rtt {
        Rtt {
            srtt: (w[0] != u64::MAX).then_some(w[0]),
            rttvar: w[1],
            held: w[2],
            held_at: w[3],
            answered_at: w[4],
            answered_newest: w[5],
            probe_at: w[6],
            heard_at: w[7],
            needless_at: w[8],
        }
    }

    /// The same state on a clock `delta` µs ahead of this one's (times
    /// that are 0, "never", stay 0).
    pub fn shifted(&self, delta: i64) -> Rtt {
        let s = |t: Micros| {
            if t == 0 {
                0
            } else {
                t.saturating_add_signed(delta).max(1)
            }
        };
        Rtt {
            held_at: s(self.held_at),
            answered_at: s(self.answered_at),
            answered_newest: s(self.answered_newest),
            probe_at: s(self.probe_at),
            heard_at: s(self.heard_at),
            needless_at: s(self.needless_at),
            ..*self
        }
    }

    /// When the peer last answered anything (0: never).
    pub fn heard_at(&self) -> Micros {
        self.heard_at
    }

    /// A Send to the peer was retransmitted at `now`.
    pub fn probed(&mut self, now: Micros) {
        self.probe_at = now;
    }

    /// The peer answered a Send (a reply or replyPending) at `now`;
    /// `needless` if that showed a retransmission needless.
    pub fn heard(&mut self, now: Micros, needless: bool) {
        self.heard_at = self.heard_at.max(now);
        if needless {
            self.needless_at = self.needless_at.max(now);
        }
    }

    /// Should another Send's due retransmission to the peer wait? One
    /// retransmission went out less than `window` µs ago and the peer has
    /// not answered since, or within `window` it showed a retransmission
    /// needless (it is slow, not losing datagrams). When a stall — the
    /// server's thread or the whole machine off the CPU — makes every
    /// exchange in flight to a host late at once, one copy probes the
    /// host instead of all of them (as TCP's timeout resends one segment,
    /// not the window).
    pub fn probing(&self, now: Micros, window: Micros) -> bool {
        let probe_out = self.probe_at > 0
            && now.saturating_sub(self.probe_at) < window
            && self.heard_at <= self.probe_at;
        let slow = self.needless_at > 0 && now.saturating_sub(self.needless_at) < window;
        probe_out || slow
    }

    /// The peer replied, at `now`, to a Send first transmitted at `sent_at`.
    pub fn answered(&mut self, now: Micros, sent_at: Micros) {
        self.answered_at = self.answered_at.max(now);
        self.answered_newest = self.answered_newest.max(sent_at);
    }

    /// Is the peer busy serving requests older than one first sent at
    /// `sent_at`? It answered within the last `window` µs, and only Sends
    /// sent before that one, or less than a smoothed round trip after it
    /// (the reordering allowance: a sender's datagram leaves after its
    /// encoding, later if its thread loses the CPU in between). A server
    /// takes its queue in order, so the request is most likely queued
    /// behind them, not lost: if it were lost, the Sends that follow it
    /// would be answered first (the idea of RACK, RFC 8985, for requests).
    /// A retransmission now would be needless, so the sender waits
    /// another timeout instead.
    pub fn older_served(&self, now: Micros, sent_at: Micros, window: Micros) -> bool {
        self.answered_at > sent_at
            && now.saturating_sub(self.answered_at) < window
            && self.answered_newest < sent_at + self.srtt.unwrap_or(0)
    }

    /// Feeds one sample (only from exchanges that were not retransmitted).
    pub fn sample(&mut self, s: Micros) {
        match self.srtt {
            None => {
                self.srtt = Some(s);
                self.rttvar = s / 2;
            }
            Some(srtt) => {
                let err = srtt.abs_diff(s);
                self.rttvar = (3 * self.rttvar + err) / 4;
                self.srtt = Some((7 * srtt + s) / 8);
            }
        }
    }

    /// At `now`, a retransmission proved needless after the exchange had
    /// waited `waited` µs (the peer answered it with replyPending, or
    /// replied to the first copy): the peer is busy (its queue, or its
    /// threads waiting for a CPU) and held the request all along, so the
    /// timeout is at least twice that for a while.
    ///
    /// The floor fades with time, not samples: what holds a server up (a
    /// machine whose CPUs busy-polling clients take, a deep queue) lasts
    /// seconds, while a busy client takes a hundred thousand samples in
    /// one. At most [`HELD_MAX`]: a server that holds requests on purpose
    /// (a pipe's reader, a delayed reply) would otherwise double it with
    /// every exchange, and a lost datagram to that host would wait as long.
    pub fn held(&mut self, now: Micros, waited: Micros) {
        let floor = waited.saturating_mul(2).min(HELD_MAX);
        self.held = self.floor(now).max(floor);
        self.held_at = now;
    }

    /// At `now`, a retransmission proved needed (the reply answered the
    /// copy: the first, or its reply, was lost): the floor halves, so a
    /// lossy path does not keep waiting for a busy peer's worst.
    pub fn lost(&mut self, now: Micros) {
        self.held = self.floor(now) / 2;
        self.held_at = now;
    }

    /// The floor [`Rtt::held`] left, faded to `now`: halved after one
    /// [`HELD_HALF_LIFE`], a third after two, and so on.
    fn floor(&self, now: Micros) -> Micros {
        let age = now.saturating_sub(self.held_at);
        self.held
            .saturating_mul(HELD_HALF_LIFE)
            .checked_div(HELD_HALF_LIFE + age)
            .unwrap_or(0)
    }

    /// The smoothed RTT, if any sample was taken.
    pub fn srtt(&self) -> Option<Micros> {
        self.srtt
    }

    /// Current timeout: srtt + 4·rttvar, clamped, or `initial` before samples.
    pub fn rto(&self, initial: Micros, min: Micros, max: Micros) -> Micros {
        match self.srtt {
            None => initial.clamp(min, max),
            Some(s) => (s + 4 * self.rttvar).clamp(min, max),
        }
    }

    /// [`Rtt::rto`] of a request (a RemoteSend) at `now`: at least the
    /// floor [`Rtt::held`] set, since a busy peer holds requests, while
    /// bulk data is answered at once.
    pub fn send_rto(&self, now: Micros, initial: Micros, min: Micros, max: Micros) -> Micros {
        self.rto(initial, min, max)
            .max(self.floor(now).clamp(min, max))
    }
}

/// How long (µs) the needless-copy floor takes to halve (`Rtt::held`):
/// much longer than the gaps between the stalls that busy-polling
/// clients cause a server on their machine (a few a second, 2–8 ms
/// each), so that the floor, twice the first stall, stays above the
/// next ones (BENCHMARKS.md, 2026-11-29 night).
pub const HELD_HALF_LIFE: Micros = 10_000_000;

/// The highest replyPending floor (`Rtt::held`): above the queueing delays
/// of a busy server (a few ms at 256 clients here), below the holds of one
/// that delays replies on purpose. A peer on this machine starts with it
/// (`Config::local_send_floor`).
pub const HELD_MAX: Micros = 20_000;

/// Shards of [`PeerTimes`] (by host id): threads that send to different
/// hosts rarely meet on one lock.
const SHARDS: usize = 16;

/// What a logical host knows of each peer host's round trips: one store
/// per host, shared by every path that sends for it — the engine, and the
/// threads that send outside it (`vkernel` direct Sends) — so that a due
/// copy on any path sees what every other path has learned.
#[derive(Debug, Default)]
pub struct PeerTimes {
    /// A few peers per shard: a short list is searched faster than a
    /// hash map is hashed.
    shards: [std::sync::Mutex<Vec<(u16, Rtt)>>; SHARDS],
}

impl PeerTimes {
    /// An empty store.
    pub fn new() -> PeerTimes {
        PeerTimes::default()
    }

    fn shard(&self, host: crate::pid::HostId) -> std::sync::MutexGuard<'_, Vec<(u16, Rtt)>> {
        let m = &self.shards[usize::from(host.0) % SHARDS];
        // (A thread that panicked holding it left whole `Rtt`s behind.)
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What is known of `host`, if anything.
    pub fn get(&self, host: crate::pid::HostId) -> Option<Rtt> {
        self.shard(host)
            .iter()
            .find(|(h, _)| *h == host.0)
            .map(|(_, r)| *r)
    }

    /// Records `r` as what is known of `host`.
    pub fn set(&self, host: crate::pid::HostId, r: Rtt) {
        self.with(host, || r, |mine| *mine = r);
    }

    /// Takes `r`, what another holder of this host's timing learned of
    /// `host` (on this store's clock), if it heard from the peer more
    /// recently than this store did.
    pub fn merge(&self, host: crate::pid::HostId, r: Rtt) {
        self.with(
            host,
            || r,
            |mine| {
                if r.heard_at > mine.heard_at {
                    *mine = r;
                }
            },
        );
    }

    /// Runs `f` on what is known of `host` (`init` if nothing yet).
    pub fn with<T>(
        &self,
        host: crate::pid::HostId,
        init: impl FnOnce() -> Rtt,
        f: impl FnOnce(&mut Rtt) -> T,
    ) -> T {
        let mut g = self.shard(host);
        let i = match g.iter().position(|(h, _)| *h == host.0) {
            Some(i) => i,
            None => {
                g.push((host.0, init()));
                g.len() - 1
            }
        };
        f(&mut g[i].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_state_comes_back_on_the_lenders_clock_and_the_newer_wins() {
        let mut r = Rtt::new();
        r.sample(2_000);
        r.held(10_000, 4_000);
        r.heard(10_500, true);
        let back = Rtt::from_words(r.shifted(-7_000).to_words()).shifted(7_000);
        assert_eq!(format!("{back:?}"), format!("{r:?}"));
        assert_eq!(Rtt::new().shifted(-5).heard_at(), 0, "never stays never");
        let t = PeerTimes::new();
        let h = crate::pid::HostId(3);
        t.merge(h, r);
        let mut older = Rtt::new();
        older.heard(9_000, false);
        t.merge(h, older);
        assert_eq!(
            t.get(h).map(|x| x.heard_at()),
            Some(10_500),
            "the newer stays"
        );
        let mut newer = Rtt::new();
        newer.heard(11_000, false);
        t.merge(h, newer);
        assert_eq!(t.get(h).map(|x| x.heard_at()), Some(11_000));
    }

    #[test]
    fn one_store_is_seen_by_every_sender() {
        let t = std::sync::Arc::new(PeerTimes::new());
        let h = crate::pid::HostId(7);
        assert!(t.get(h).is_none());
        let t2 = t.clone();
        std::thread::spawn(move || t2.with(h, Rtt::new, |r| r.sample(3_000)))
            .join()
            .unwrap();
        assert_eq!(t.get(h).and_then(|r| r.srtt()), Some(3_000));
        t.set(crate::pid::HostId(7 + SHARDS as u16), Rtt::new());
        assert_eq!(
            t.get(h).and_then(|r| r.srtt()),
            Some(3_000),
            "another host, same shard"
        );
    }

    #[test]
    fn a_held_request_raises_the_timeout_for_seconds() {
        let mut r = Rtt::new();
        for _ in 0..50 {
            r.sample(100);
        }
        let rto = |r: &Rtt, now| r.send_rto(now, 100_000, 1_000, 1_000_000);
        assert_eq!(r.rto(100_000, 1_000, 1_000_000), 1_000);
        assert_eq!(rto(&r, 0), 1_000, "no floor yet");
        let t = 10_000_000;
        r.held(t, 3_000);
        assert_eq!(rto(&r, t), 6_000);
        assert_eq!(r.rto(100_000, 1_000, 1_000_000), 1_000, "bulk data's own");
        // Samples do not wear it down (a busy client takes many a second).
        for _ in 0..1_000_000 {
            r.sample(100);
        }
        assert_eq!(rto(&r, t + 10_000), 5_994);
        // Time does: half after a half-life, a third after two.
        assert_eq!(rto(&r, t + HELD_HALF_LIFE), 3_000);
        assert_eq!(rto(&r, t + 2 * HELD_HALF_LIFE), 2_000);
        assert_eq!(rto(&r, t + 100 * HELD_HALF_LIFE), 1_000);
        // A needless copy after a shorter wait keeps what is left.
        r.held(t + HELD_HALF_LIFE, 1_000);
        assert_eq!(rto(&r, t + HELD_HALF_LIFE), 3_000);
        // A needed copy (a real loss) halves it.
        r.lost(t + HELD_HALF_LIFE);
        assert_eq!(rto(&r, t + HELD_HALF_LIFE), 1_500);
        // A long hold raises it only so far.
        r.held(t, 10_000_000);
        assert_eq!(rto(&r, t), HELD_MAX);
    }

    #[test]
    fn only_a_peer_on_this_machine_starts_with_a_floor() {
        let rto = |r: Rtt| r.send_rto(5_000, 100_000, 1_000, 1_000_000);
        let local: std::net::SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let local6: std::net::SocketAddr = "[::1]:5000".parse().unwrap();
        let lan: std::net::SocketAddr = "10.1.2.3:5000".parse().unwrap();
        for at in [local, local6] {
            let mut r = Rtt::for_peer(5_000, Some(at), 10_000);
            assert_eq!(rto(r), 100_000, "no sample yet: the initial timeout");
            for _ in 0..50 {
                r.sample(100);
            }
            assert_eq!(rto(r), 10_000, "{at}");
        }
        let mut r = Rtt::for_peer(5_000, Some(lan), 10_000);
        for _ in 0..50 {
            r.sample(100);
        }
        assert_eq!(rto(r), 1_000, "another machine");
        assert_eq!(rto(Rtt::for_peer(5_000, None, 10_000)), 100_000);
        let mut r = Rtt::for_peer(5_000, Some(local), 0);
        for _ in 0..50 {
            r.sample(100);
        }
        assert_eq!(rto(r), 1_000, "turned off");
    }

    #[test]
    fn a_peer_serving_older_requests_holds_back_a_retransmission() {
        let mut r = Rtt::new();
        assert!(!r.older_served(5_000, 1_000, 2_000), "no answers yet");
        // Ours went at 1,000; the peer answers one sent at 900, at 2,500.
        r.answered(2_500, 900);
        assert!(r.older_served(3_000, 1_000, 2_000));
        assert!(!r.older_served(5_000, 1_000, 2_000), "silent for a window");
        assert!(!r.older_served(3_000, 3_000, 2_000), "nothing since ours");
        // A Send made after ours is answered: ours is behind nothing.
        r.answered(3_100, 1_200);
        assert!(!r.older_served(3_200, 1_000, 2_000));
        assert!(r.older_served(3_200, 1_300, 2_000));
        // Unless it was made less than a round trip after ours.
        r.sample(300);
        assert!(r.older_served(3_200, 1_000, 2_000));
        assert!(!r.older_served(3_200, 800, 2_000));
    }

    #[test]
    fn one_copy_probes_a_silent_peer_for_the_rest() {
        let mut r = Rtt::new();
        assert!(!r.probing(1_000, 2_000), "nothing sent again yet");
        r.probed(1_000);
        assert!(r.probing(1_500, 2_000), "its answer is awaited");
        assert!(!r.probing(3_000, 2_000), "unanswered for a window");
        // Answered as lost (a flagged reply): the others may go.
        r.heard(1_800, false);
        assert!(!r.probing(1_900, 2_000));
        // Answered as needless: the peer is slow; wait a window.
        r.probed(4_000);
        r.heard(4_300, true);
        assert!(r.probing(5_000, 2_000));
        assert!(!r.probing(6_400, 2_000));
    }

    #[test]
    fn adapts_to_samples() {
        let mut r = Rtt::new();
        assert_eq!(r.rto(100_000, 1_000, 1_000_000), 100_000);
        for _ in 0..50 {
            r.sample(100);
        }
        assert_eq!(r.rto(100_000, 1_000, 1_000_000), 1_000);
        for _ in 0..50 {
            r.sample(50_000);
        }
        let rto = r.rto(100_000, 1_000, 1_000_000);
        assert!((50_000..200_000).contains(&rto), "{rto}");
    }
}
