//! Authenticated (and optionally encrypted) interkernel datagrams.
//!
//! With a cluster key configured, every datagram leaving a host carries a
//! 28-byte trailer: a per-host random `salt` (4 bytes), a packet `counter`
//! (8 bytes, strictly increasing per host, and never more than
//! [`COUNTER_LAG`] behind the sender's wall clock in µs) and a 16-byte tag.
//! The header's `key_id` byte names the key. The tag is
//!
//! - MAC mode: BLAKE3 keyed hash of the whole datagram (fixed part, data,
//!   salt, counter), truncated to 16 bytes;
//! - AEAD mode: ChaCha20-Poly1305 (the default) or AES-256-GCM
//!   ([`Cipher`], the same on every host of a cluster) over the message
//!   and data (encrypted in place), with the 44-byte header, salt and
//!   counter as associated data and nonce = salt ‖ counter.
//!
//! A receiver accepts a datagram only if its key id is one it holds, the tag
//! verifies, the counter is not older than the receiver's own start minus
//! `max_skew` (so nothing captured well before a restart is accepted
//! again: a restarted host has no memory of what it saw), and the counter
//! is new for the sending host (a 960-packet sliding window per host id,
//! as in IPsec). Anything else is dropped and counted by reason before
//! the protocol engine sees it. Two keys may be
//! held at once, so keys rotate without a restart: install the new key
//! everywhere, switch the send key, then retire the old one.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::wire::{field, RawHeader, FIXED_BYTES, HEADER_BYTES};

/// Bytes the trailer adds to each datagram.
pub const TRAILER_BYTES: usize = 4 + 8 + 16;

/// A cluster key: an id (1–255, carried in the header) and 32 secret bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    /// Carried in the header's `key_id` byte.
    pub id: u8,
    /// The secret.
    pub secret: [u8; 32],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({}, <secret>)", self.id)
    }
}

impl Key {
    /// Parses `ID:HEX64` (64 hex digits = 32 bytes).
    pub fn parse(s: &str) -> Result<Key, String> {
        let (id, hex) = s
            .trim()
            .split_once(':')
            .ok_or("a key is ID:HEX (e.g. 1:<64 hex digits>)")?;
        let id: u8 = id
            .trim()
            .parse()
            .map_err(|_| format!("key id `{id}` is not in 1..=255"))?;
        if id == 0 {
            return Err("key id 0 means \"no key\"; use 1..=255".into());
        }
        let hex = hex.trim();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("the key secret must be 64 hex digits (32 bytes)".into());
        }
        let mut secret = [0u8; 32];
        for (i, b) in secret.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| "bad hex digit in key")?;
        }
        Ok(Key { id, secret })
    }
}

/// The AEAD of the encrypting mode. Every host of a cluster must use the
/// same: a datagram sealed with the other fails authentication (counted
/// as a bad tag, answered with an authentication NAck).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cipher {
    /// ChaCha20-Poly1305 (RFC 8439): fast everywhere, the default.
    #[default]
    ChaCha20Poly1305,
    /// AES-256-GCM: several times faster on CPUs with AES and carry-less
    /// multiply instructions (x86-64 AES-NI and PCLMULQDQ, ARMv8 crypto).
    Aes256Gcm,
}

impl Cipher {
    /// The cipher's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
            Cipher::Aes256Gcm => "aes-256-gcm",
        }
    }

    /// The cipher named `s` (as [`Cipher::name`] gives).
    pub fn parse(s: &str) -> Result<Cipher, String> {
        match s {
            "chacha20-poly1305" => Ok(Cipher::ChaCha20Poly1305),
            "aes-256-gcm" => Ok(Cipher::Aes256Gcm),
            _ => Err(format!(
                "unknown cipher `{s}`: chacha20-poly1305 or aes-256-gcm"
            )),
        }
    }
}

/// How datagrams are protected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthConfig {
    /// Keys accepted (at most a few; two during a rotation).
    pub keys: Vec<Key>,
    /// Id of the key used to send (must be among `keys`).
    pub send_key: u8,
    /// Encrypt message and data (AEAD) instead of only authenticating.
    pub encrypt: bool,
    /// The AEAD, when `encrypt`.
    pub cipher: Cipher,
    /// The host's start in wall-clock µs (the runtime reads the clock):
    /// the first packet counter, and the base of the receive floor.
    pub counter_start: u64,
    /// Clock difference allowed between hosts (µs): a receiver refuses
    /// counters older than its own start minus this ([`Reject::Stale`]).
    pub max_skew: u64,
    /// Per-host random salt (the runtime passes a random value).
    pub salt: u32,
}

impl AuthConfig {
    /// Bytes of the encoding before the keys.
    const HEAD: usize = 24;

    /// The configuration as bytes (to lend it to a program of the host's
    /// own uid): mode (0 MAC, 1 ChaCha20-Poly1305, 2 AES-256-GCM), send
    /// key, key count, 0, salt (LE u32), max skew (LE u64), counter start
    /// (LE u64), then each key's id and secret.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::HEAD + 33 * self.keys.len());
        let n = u8::try_from(self.keys.len()).unwrap_or(u8::MAX);
        let mode = match (self.encrypt, self.cipher) {
            (false, _) => 0,
            (true, Cipher::ChaCha20Poly1305) => 1,
            (true, Cipher::Aes256Gcm) => 2,
        };
        b.extend_from_slice(&[mode, self.send_key, n, 0]);
        b.extend_from_slice(&self.salt.to_le_bytes());
        b.extend_from_slice(&self.max_skew.to_le_bytes());
        b.extend_from_slice(&self.counter_start.to_le_bytes());
        for k in self.keys.iter().take(usize::from(n)) {
            b.push(k.id);
            b.extend_from_slice(&k.secret);
        }
        b
    }

    /// The configuration of [`AuthConfig::to_bytes`]; None if `b` is not one.
    pub fn from_bytes(b: &[u8]) -> Option<AuthConfig> {
        let head = b.get(..Self::HEAD)?;
        let n = usize::from(head[2]);
        let u64_at = |i: usize| head.get(i..i + 8)?.try_into().ok().map(u64::from_le_bytes);
        let keys = b
            .get(Self::HEAD..)?
            .chunks_exact(33)
            .map(|k| {
                let mut secret = [0u8; 32];
                secret.copy_from_slice(&k[1..]);
                Key { id: k[0], secret }
            })
            .collect::<Vec<_>>();
        if keys.len() != n || b.len() != Self::HEAD + 33 * n || head[0] > 2 {
            return None;
        }
        Some(AuthConfig {
            keys,
            send_key: head[1],
            encrypt: head[0] != 0,
            cipher: if head[0] == 2 {
                Cipher::Aes256Gcm
            } else {
                Cipher::ChaCha20Poly1305
            },
            salt: u32::from_le_bytes(head[4..8].try_into().ok()?),
            max_skew: u64_at(8)?,
            counter_start: u64_at(16)?,
        })
    }
}

/// Why an incoming datagram was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// Shorter than fixed part + trailer.
    Truncated,
    /// key_id 0 (unauthenticated) while we require a key.
    NoKey,
    /// A key id we do not hold.
    UnknownKey,
    /// The tag does not verify (forged, corrupted, wrong key).
    BadTag,
    /// The counter was already seen or is too old (replay).
    Replay,
    /// The counter is from before this host started (minus the allowed
    /// clock skew): a datagram captured before a restart and replayed, or
    /// a sender whose clock is behind by more than the skew.
    Stale,
}

impl Reject {
    /// All reasons, in counter order.
    pub const ALL: [Reject; 6] = [
        Reject::Truncated,
        Reject::NoKey,
        Reject::UnknownKey,
        Reject::BadTag,
        Reject::Replay,
        Reject::Stale,
    ];
}

/// 64-bit words in a replay window's ring.
const WINDOW_WORDS: usize = 16;
/// How far behind the newest counter seen an older one is still accepted
/// (once): 960. The ring is cleared a word at a time as the top moves, so
/// one word of it is never usable. (At 128, a datagram sealed by a thread
/// that was then preempted while other threads sent a bulk burst arrived
/// too late and was refused.)
pub const REPLAY_WINDOW: u64 = (WINDOW_WORDS as u64 - 1) * 64;

/// Sliding replay window of one sending host: a ring of bits indexed by
/// counter, cleared a word at a time as the newest counter moves up (as
/// in RFC 6479), so no shifting of the whole window.
#[derive(Clone, Copy, Default)]
struct Window {
    top: u64,
    bits: [u64; WINDOW_WORDS],
}

impl Window {
    /// True (and records it) if `c` was not seen and is within the window.
    fn accept(&mut self, c: u64) -> bool {
        if c > self.top {
            // Clear the words the top moves into (all, after a long jump).
            let (from, to) = (self.top / 64, c / 64);
            for w in from + 1..=to.min(from + WINDOW_WORDS as u64) {
                self.bits[Self::word(w)] = 0;
            }
            self.top = c;
        } else if self.top - c >= REPLAY_WINDOW {
            return false;
        }
        let word = &mut self.bits[Self::word(c / 64)];
        let bit = 1u64 << (c % 64);
        if *word & bit != 0 {
            return false;
        }
        *word |= bit;
        true
    }

    fn word(w: u64) -> usize {
        (w % WINDOW_WORDS as u64) as usize
    }
}

/// How far a sender's counter may fall behind its wall clock (µs) before
/// it jumps up to it. A jump puts everything sent before it out of a
/// receiver's [`REPLAY_WINDOW`], so jumps are kept rare (at most one per
/// this long); the lag is part of the bound a receiver's floor gives.
pub const COUNTER_LAG: u64 = 100_000;

/// Where a host's packet counter lives: its own memory (an `AtomicU64`),
/// or a page shared with the programs that send for the host (a machine
/// host's; the runtime maps it).
pub trait CounterCell: Send + Sync {
    /// The counter.
    fn cell(&self) -> &AtomicU64;
}

impl CounterCell for AtomicU64 {
    fn cell(&self) -> &AtomicU64 {
        self
    }
}

/// The sending half of a host's keys, shared by every path that sends
/// for the host (the engine's [`Auth`], and threads that send outside the
/// engine): the keys, and the host's one packet counter, so every
/// datagram the host sends carries a counter newer than the last.
#[derive(Clone)]
pub struct Sealer {
    cfg: Arc<AuthConfig>,
    /// Each key's AEAD, keyed once (in AEAD mode): AES-256-GCM's key
    /// schedule is not redone for every datagram.
    aeads: Arc<Vec<(u8, LessSafeKey)>>,
    counter: Arc<dyn CounterCell>,
    /// Engine time at the start: the wall clock is
    /// `counter_start + (now - started)`.
    started: u64,
    /// Counters below this are refused ([`Reject::Stale`]).
    floor: u64,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer(send key {})", self.cfg.send_key)
    }
}

impl Sealer {
    fn new(cfg: AuthConfig, now: u64) -> Sealer {
        let counter = Arc::new(AtomicU64::new(cfg.counter_start));
        Sealer::lent(cfg, counter, now)
    }

    /// A sealer for a program that sends for a host: the host's keys as
    /// [`Sealer::lend`] gave them and the host's counter `cell`, at the
    /// program's clock time `now` (µs).
    pub fn lent(cfg: AuthConfig, cell: Arc<dyn CounterCell>, now: u64) -> Sealer {
        let aeads = if cfg.encrypt {
            cfg.keys
                .iter()
                .filter_map(|k| Some((k.id, aead(cfg.cipher, &k.secret)?)))
                .collect()
        } else {
            Vec::new()
        };
        Sealer {
            counter: cell,
            aeads: Arc::new(aeads),
            floor: cfg.counter_start.saturating_sub(cfg.max_skew),
            cfg: Arc::new(cfg),
            started: now,
        }
    }

    /// The keys to lend a program that sends for this host, at engine
    /// time `now`: `counter_start` is the host's wall clock now.
    pub fn lend(&self, now: u64) -> AuthConfig {
        let mut c = (*self.cfg).clone();
        c.counter_start = c
            .counter_start
            .saturating_add(now.saturating_sub(self.started));
        c
    }

    /// Moves the counter into `cell`, which keeps counting from the
    /// higher of the two.
    fn move_counter(&mut self, cell: Arc<dyn CounterCell>) {
        let c = self.counter.cell().load(Ordering::Relaxed);
        cell.cell().fetch_max(c, Ordering::Relaxed);
        self.counter = cell;
    }

    /// The next counter at engine time `now`: one more than the last, or
    /// the wall clock if the counter has fallen more than [`COUNTER_LAG`]
    /// behind it (a host that sends little), so a peer that restarted
    /// since still accepts it.
    fn next_counter(&self, now: u64) -> u64 {
        let wall = self
            .cfg
            .counter_start
            .saturating_add(now.saturating_sub(self.started));
        let step = |c: u64| {
            if c.saturating_add(1 + COUNTER_LAG) < wall {
                wall
            } else {
                c + 1
            }
        };
        let cell = self.counter.cell();
        let mut c = cell.load(Ordering::Relaxed);
        loop {
            match cell.compare_exchange_weak(c, step(c), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return step(c),
                Err(seen) => c = seen,
            }
        }
    }

    fn key(&self, id: u8) -> Option<&Key> {
        self.cfg.keys.iter().find(|k| k.id == id)
    }

    /// Key `id`'s AEAD (AEAD mode).
    fn aead(&self, id: u8) -> Option<&LessSafeKey> {
        self.aeads.iter().find(|(k, _)| *k == id).map(|(_, a)| a)
    }

    /// Whether datagrams are encrypted, not only authenticated.
    pub fn encrypts(&self) -> bool {
        self.cfg.encrypt
    }

    /// Appends the trailer (and encrypts in AEAD mode) at engine time
    /// `now`. A datagram whose send key is missing goes out unchanged
    /// (rejected by peers, counted).
    pub fn seal(&self, now: u64, d: &mut Vec<u8>) {
        if d.len() < FIXED_BYTES {
            return;
        }
        let Some(key) = self.key(self.cfg.send_key) else {
            return;
        };
        let ctr = self.next_counter(now).to_be_bytes();
        d[field::KEY_ID] = key.id;
        let salt = self.cfg.salt.to_be_bytes();
        if self.cfg.encrypt {
            let mut aad = [0u8; HEADER_BYTES + 12];
            aad[..HEADER_BYTES].copy_from_slice(&d[..HEADER_BYTES]);
            aad[HEADER_BYTES..HEADER_BYTES + 4].copy_from_slice(&salt);
            aad[HEADER_BYTES + 4..].copy_from_slice(&ctr);
            let body = &mut d[HEADER_BYTES..];
            // Encryption in place of a buffer this size cannot fail (the
            // limit is 2^38 bytes); on error send nothing useful.
            let tag = self
                .aead(key.id)
                .and_then(|k| {
                    k.seal_in_place_separate_tag(nonce(&salt, &ctr), Aad::from(aad), body)
                        .ok()
                })
                .map_or([0u8; 16], |t| tag_bytes(&t));
            d.extend_from_slice(&salt);
            d.extend_from_slice(&ctr);
            d.extend_from_slice(&tag);
        } else {
            d.extend_from_slice(&salt);
            d.extend_from_slice(&ctr);
            let tag = mac(&key.secret, d);
            d.extend_from_slice(&tag);
        }
    }

    /// Verifies `d`'s key, tag and age: the inner datagram (trailer
    /// removed, body decrypted into `scratch` in AEAD mode), its counter
    /// and its sender's host id. No replay window: see
    /// [`Sealer::open_answer`] and [`Auth::open`].
    fn verify<'a>(
        &self,
        d: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Result<(&'a [u8], u64, u16), Reject> {
        if d.get(field::KEY_ID) == Some(&0) {
            return Err(Reject::NoKey);
        }
        if d.len() < FIXED_BYTES + TRAILER_BYTES {
            return Err(Reject::Truncated);
        }
        let key = self.key(d[field::KEY_ID]).ok_or(Reject::UnknownKey)?;
        let n = d.len() - TRAILER_BYTES;
        let (salt, rest) = d[n..].split_at(4);
        let (ctr, tag) = rest.split_at(8);
        let counter = u64::from_be_bytes(ctr.try_into().map_err(|_| Reject::Truncated)?);
        let host = RawHeader::new_checked(d).map_or(0, |r| r.src().host().0);
        let inner: &[u8] = if self.cfg.encrypt {
            let mut aad = [0u8; HEADER_BYTES + 12];
            aad[..HEADER_BYTES].copy_from_slice(&d[..HEADER_BYTES]);
            aad[HEADER_BYTES..HEADER_BYTES + 4].copy_from_slice(salt);
            aad[HEADER_BYTES + 4..].copy_from_slice(ctr);
            scratch.clear();
            scratch.extend_from_slice(&d[..n]);
            let tag = Tag::try_from(tag).map_err(|_| Reject::Truncated)?;
            self.aead(key.id)
                .ok_or(Reject::BadTag)?
                .open_in_place_separate_tag(
                    nonce(salt, ctr),
                    Aad::from(aad),
                    tag,
                    &mut scratch[HEADER_BYTES..],
                    0..,
                )
                .map_err(|_| Reject::BadTag)?;
            &scratch[..]
        } else {
            let want = mac(&key.secret, &d[..n + 12]);
            if !constant_time_eq(&want, tag) {
                return Err(Reject::BadTag);
            }
            &d[..n]
        };
        if counter < self.floor {
            return Err(Reject::Stale);
        }
        Ok((inner, counter, host))
    }

    /// Verifies an answer to one of this host's own exchanges run outside
    /// the engine (key, tag, age) and returns the inner datagram. Not
    /// checked against the sender's replay window: the exchange takes
    /// only an answer naming its own sequence number, once, so a replayed
    /// answer to an older exchange matches nothing.
    pub fn open_answer<'a>(
        &self,
        d: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], Reject> {
        self.verify(d, scratch).map(|(inner, _, _)| inner)
    }
}

/// Seals outgoing and opens incoming datagrams for one host.
pub(crate) struct Auth {
    sealer: Sealer,
    windows: HashMap<u16, Window>,
    /// The latest engine time seen.
    now: u64,
}

impl Auth {
    pub(crate) fn new(cfg: AuthConfig, now: u64) -> Auth {
        Auth {
            sealer: Sealer::new(cfg, now),
            windows: HashMap::new(),
            now,
        }
    }

    /// The sending half, to share with threads that send for the host.
    pub(crate) fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    /// The host's counter moves to `cell` (a page shared with programs).
    pub(crate) fn share_counter(&mut self, cell: Arc<dyn CounterCell>) {
        self.sealer.move_counter(cell);
    }

    /// Tells the sealer the time (engine µs), so counters follow the clock.
    pub(crate) fn tick(&mut self, now: u64) {
        self.now = self.now.max(now);
    }

    /// Appends the trailer (and encrypts in AEAD mode). A datagram whose
    /// send key is missing goes out unchanged (rejected by peers, counted).
    pub(crate) fn seal(&mut self, d: &mut Vec<u8>) {
        self.sealer.seal(self.now, d);
    }

    /// Verifies `d` and returns the inner datagram (trailer removed, body
    /// decrypted into `scratch` in AEAD mode).
    pub(crate) fn open<'a>(
        &mut self,
        d: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], Reject> {
        let (inner, counter, host) = self.sealer.verify(d, scratch)?;
        // Only an authentic datagram may move the window.
        if !self.windows.entry(host).or_default().accept(counter) {
            return Err(Reject::Replay);
        }
        Ok(inner)
    }
}

/// The AEAD `c` keyed with `secret`, from ring: its assembly runs 64 KiB
/// chunks and 96-byte messages alike several times faster than a portable
/// implementation, and the bytes on the wire are RFC 8439's and NIST SP
/// 800-38D's (`tests::ring_and_rustcrypto_seal_the_same_bytes`). (`None`
/// is not reached: both take any 32-byte key.)
fn aead(c: Cipher, secret: &[u8; 32]) -> Option<LessSafeKey> {
    let alg = match c {
        Cipher::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        Cipher::Aes256Gcm => &AES_256_GCM,
    };
    UnboundKey::new(alg, secret).ok().map(LessSafeKey::new)
}

fn tag_bytes(t: &Tag) -> [u8; 16] {
    let mut b = [0u8; 16];
    b.copy_from_slice(t.as_ref());
    b
}

/// The AEAD nonce: salt ‖ counter (each unique per sending host).
fn nonce(salt: &[u8], ctr: &[u8]) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(salt);
    n[4..].copy_from_slice(ctr);
    Nonce::assume_unique_for_key(n)
}

fn mac(secret: &[u8; 32], data: &[u8]) -> [u8; 16] {
    let h = blake3::keyed_hash(secret, data);
    let mut t = [0u8; 16];
    t.copy_from_slice(&h.as_bytes()[..16]);
    t
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(encrypt: bool, keys: &[u8], send: u8) -> AuthConfig {
        AuthConfig {
            keys: keys
                .iter()
                .map(|&id| Key {
                    id,
                    secret: [id; 32],
                })
                .collect(),
            send_key: send,
            encrypt,
            cipher: Cipher::default(),
            counter_start: 1000,
            max_skew: 1_000_000,
            salt: 7,
        }
    }

    fn datagram() -> Vec<u8> {
        let mut h = crate::wire::Header::new(crate::wire::PacketType::RemoteSend);
        h.src = crate::Pid(0x0012_0005);
        h.dst = crate::Pid(0x0034_0006);
        crate::wire::encode(&h, &crate::Message([1, 2, 3, 4, 5, 6, 7, 8]), b"page data")
    }

    #[test]
    fn a_lent_configuration_round_trips_and_garbage_is_refused() {
        let c = cfg(true, &[1, 2], 2);
        assert_eq!(AuthConfig::from_bytes(&c.to_bytes()), Some(c.clone()));
        let b = c.to_bytes();
        assert_eq!(AuthConfig::from_bytes(&b[..b.len() - 1]), None);
        assert_eq!(AuthConfig::from_bytes(&b[..10]), None);
    }

    #[test]
    fn a_lent_sealer_shares_the_hosts_counter() {
        let host = Auth::new(cfg(false, &[1], 1), 0);
        let cell: Arc<dyn CounterCell> = Arc::new(AtomicU64::new(0));
        let mut host = host;
        host.share_counter(cell.clone());
        let lent = Sealer::lent(host.sealer().lend(10), cell.clone(), 5_000);
        let (mut a, mut b) = (datagram(), datagram());
        host.seal(&mut a);
        lent.seal(5_001, &mut b);
        let ctr = |d: &[u8]| u64::from_be_bytes(d[d.len() - 24..d.len() - 16].try_into().unwrap());
        assert_eq!(ctr(&b), ctr(&a) + 1, "one counter");
        let mut rx = Auth::new(cfg(false, &[1], 1), 0);
        let mut scratch = Vec::new();
        assert!(rx.open(&a, &mut scratch).is_ok());
        assert!(rx.open(&b, &mut scratch).is_ok());
    }

    /// The AEAD modes' bytes are RFC 8439's and NIST SP 800-38D's: a
    /// datagram sealed here is what RustCrypto's ChaCha20-Poly1305 (the
    /// implementation before ring) and AES-256-GCM make of the same
    /// header, body, salt and counter, so hosts of either build, and any
    /// other implementation, understand each other.
    #[test]
    fn ring_and_rustcrypto_seal_the_same_bytes() {
        use chacha20poly1305::aead::AeadInPlace;
        use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
        for cipher in [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm] {
            let mut c = cfg(true, &[1], 1);
            c.cipher = cipher;
            let mut a = Auth::new(c, 0);
            for len in [0usize, 1, 96, 4_000, 65_000] {
                let mut plain = datagram();
                plain.extend((0..len).map(|i| i as u8));
                let mut d = plain.clone();
                a.seal(&mut d);
                let n = d.len() - TRAILER_BYTES;
                let (salt, ctr) = (&d[n..n + 4], &d[n + 4..n + 12]);
                let mut aad = d[..HEADER_BYTES].to_vec();
                aad.extend_from_slice(salt);
                aad.extend_from_slice(ctr);
                let mut nonce = [0u8; 12];
                nonce[..4].copy_from_slice(salt);
                nonce[4..].copy_from_slice(ctr);
                let key = a.sealer().key(1).map(|k| k.secret).unwrap();
                let mut body = plain[HEADER_BYTES..].to_vec();
                let tag: Vec<u8> = match cipher {
                    Cipher::ChaCha20Poly1305 => ChaCha20Poly1305::new(&key.into())
                        .encrypt_in_place_detached(&nonce.into(), &aad, &mut body)
                        .unwrap()
                        .to_vec(),
                    Cipher::Aes256Gcm => aes_gcm::Aes256Gcm::new(&key.into())
                        .encrypt_in_place_detached(&nonce.into(), &aad, &mut body)
                        .unwrap()
                        .to_vec(),
                };
                assert_eq!(
                    &d[HEADER_BYTES..n],
                    &body[..],
                    "{cipher:?} ciphertext, {len} bytes"
                );
                assert_eq!(&d[n + 12..], &tag[..], "{cipher:?} tag, {len} bytes");
            }
        }
    }

    /// Hosts that disagree on the cipher refuse each other's datagrams as
    /// forged; the cipher travels with a lent configuration.
    #[test]
    fn the_cipher_is_the_clusters_and_is_lent_with_the_keys() {
        let aes = AuthConfig {
            cipher: Cipher::Aes256Gcm,
            ..cfg(true, &[1], 1)
        };
        let mut d = datagram();
        Auth::new(aes.clone(), 0).seal(&mut d);
        let mut s = Vec::new();
        let mut chacha = Auth::new(cfg(true, &[1], 1), 0);
        assert_eq!(chacha.open(&d, &mut s).err(), Some(Reject::BadTag));
        let mut same = Auth::new(aes.clone(), 0);
        let mut want = datagram();
        want[field::KEY_ID] = 1;
        assert_eq!(same.open(&d, &mut s).map(|i| i.to_vec()), Ok(want));
        assert_eq!(AuthConfig::from_bytes(&aes.to_bytes()), Some(aes.clone()));
        for c in [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm] {
            assert_eq!(Cipher::parse(c.name()), Ok(c));
        }
        assert!(Cipher::parse("rot13").is_err());
        // An encoding naming no mode known here is refused.
        let mut b = aes.to_bytes();
        b[0] = 3;
        assert_eq!(AuthConfig::from_bytes(&b), None);
    }

    #[test]
    fn seal_then_open_round_trips_in_both_modes() {
        for enc in [false, true] {
            let (mut a, mut b) = (
                Auth::new(cfg(enc, &[1], 1), 0),
                Auth::new(cfg(enc, &[1], 1), 0),
            );
            let plain = datagram();
            let mut d = plain.clone();
            a.seal(&mut d);
            assert_eq!(d.len(), plain.len() + TRAILER_BYTES);
            assert_eq!(d[5], 1);
            if enc {
                assert!(!d.windows(9).any(|w| w == b"page data"), "encrypted");
            }
            let mut s = Vec::new();
            let inner = b.open(&d, &mut s).unwrap().to_vec();
            assert_eq!(&inner[6..], &plain[6..]);
            // The same datagram again is a replay.
            assert_eq!(b.open(&d, &mut s), Err(Reject::Replay));
        }
    }

    #[test]
    fn forged_flipped_truncated_and_wrong_key_datagrams_are_rejected() {
        for enc in [false, true] {
            let mut a = Auth::new(cfg(enc, &[1], 1), 0);
            let mut b = Auth::new(cfg(enc, &[1], 1), 0);
            let mut d = datagram();
            a.seal(&mut d);
            let mut s = Vec::new();
            for i in [0usize, 8, 12, 30, 50, d.len() - 20, d.len() - 1] {
                let mut f = d.clone();
                f[i] ^= 0x40;
                assert!(b.open(&f, &mut s).is_err(), "flip at {i} accepted");
            }
            assert_eq!(b.open(&d[..FIXED_BYTES], &mut s), Err(Reject::Truncated));
            assert_eq!(b.open(&datagram(), &mut s).err(), Some(Reject::NoKey));
            let mut other = Auth::new(cfg(enc, &[2], 2), 0);
            let mut w = datagram();
            other.seal(&mut w);
            assert_eq!(b.open(&w, &mut s), Err(Reject::UnknownKey));
            // Same id, different secret: the tag fails.
            let mut c = cfg(enc, &[1], 1);
            c.keys[0].secret = [9; 32];
            let mut imposter = Auth::new(c, 0);
            let mut x = datagram();
            imposter.seal(&mut x);
            assert_eq!(b.open(&x, &mut s), Err(Reject::BadTag));
            // The genuine one still passes (rejections moved no window).
            assert!(b.open(&d, &mut s).is_ok());
        }
    }

    #[test]
    fn rotation_accepts_both_keys_during_the_switch() {
        let mut old = Auth::new(cfg(false, &[1, 2], 1), 0);
        let mut new = Auth::new(cfg(false, &[1, 2], 2), 0);
        let mut after = Auth::new(cfg(false, &[2], 2), 0);
        let (mut d1, mut d2) = (datagram(), datagram());
        old.seal(&mut d1);
        new.seal(&mut d2);
        let mut s = Vec::new();
        assert!(new.open(&d1, &mut s).is_ok());
        assert!(old.open(&d2, &mut s).is_ok());
        assert_eq!(after.open(&d1, &mut s), Err(Reject::UnknownKey));
    }

    #[test]
    fn window_accepts_reordering_and_refuses_old_and_repeated() {
        let mut w = Window::default();
        assert!(w.accept(10));
        assert!(w.accept(12));
        assert!(w.accept(11));
        assert!(!w.accept(11));
        assert!(w.accept(10 + REPLAY_WINDOW));
        assert!(!w.accept(10), "fell out of the window");
        assert!(w.accept(13), "still inside it");
        assert!(!w.accept(12), "seen before the top moved");
        assert!(w.accept(100));
        assert!(!w.accept(10 + REPLAY_WINDOW));
    }

    proptest::proptest! {
        /// The ring agrees with the plain definition: a counter is taken
        /// once, if newer than the top or less than the window behind it.
        #[test]
        fn window_matches_its_definition(
            steps in proptest::collection::vec((0u64..3000, proptest::bool::ANY), 1..400)
        ) {
            let mut w = Window::default();
            let mut seen = std::collections::HashSet::new();
            let mut top = 0u64;
            let mut last = 0u64;
            for (d, back) in steps {
                // Mostly forward, sometimes back (reordering, replays).
                let c = if back { last.saturating_sub(d) } else { last + d / 8 };
                let want = (c > top || top - c < REPLAY_WINDOW) && !seen.contains(&c);
                proptest::prop_assert_eq!(w.accept(c), want, "counter {}", c);
                if want {
                    seen.insert(c);
                    top = top.max(c);
                }
                last = c.max(last);
            }
        }
    }

    /// A sender that started at wall-clock `t0` µs (engine time 0).
    fn started_at(t0: u64) -> Auth {
        let mut c = cfg(false, &[1], 1);
        c.counter_start = t0;
        Auth::new(c, 0)
    }

    const T0: u64 = 1_700_000_000_000_000;

    #[test]
    fn a_restarted_receiver_refuses_what_was_captured_before_it_started() {
        let mut a = started_at(T0);
        let mut b = started_at(T0);
        let mut s = Vec::new();
        let mut captured = datagram();
        a.seal(&mut captured);
        assert!(b.open(&captured, &mut s).is_ok());
        // b restarts 5 s later with an empty window: the capture is stale.
        let mut b2 = started_at(T0 + 5_000_000);
        assert_eq!(b2.open(&captured, &mut s), Err(Reject::Stale));
        // a has been running all along: what it sends now is accepted,
        // although it sent only one datagram in those 5 s.
        a.tick(5_000_000);
        let mut fresh = datagram();
        a.seal(&mut fresh);
        assert!(b2.open(&fresh, &mut s).is_ok());
        // Within the skew (another host, its clock 0.5 s behind) is still
        // accepted.
        let mut behind = started_at(T0 + 4_500_000);
        let mut h = crate::wire::Header::new(crate::wire::PacketType::RemoteSend);
        h.src = crate::Pid(0x0013_0005);
        h.dst = crate::Pid(0x0034_0006);
        let mut d = crate::wire::encode(&h, &crate::Message::zero(), b"");
        behind.seal(&mut d);
        assert!(b2.open(&d, &mut s).is_ok());
    }

    #[test]
    fn counters_follow_the_clock_but_jump_at_most_once_per_lag() {
        let mut a = started_at(T0);
        let ctr = |a: &mut Auth| {
            let mut d = datagram();
            a.seal(&mut d);
            let n = d.len() - TRAILER_BYTES + 4;
            u64::from_be_bytes(d[n..n + 8].try_into().unwrap())
        };
        assert_eq!(ctr(&mut a), T0 + 1);
        // Within the lag: plain increments, however much time passed.
        a.tick(COUNTER_LAG / 2);
        assert_eq!(ctr(&mut a), T0 + 2);
        a.tick(COUNTER_LAG);
        assert_eq!(ctr(&mut a), T0 + 3);
        // Idle 10 s: the next counter is the wall clock.
        a.tick(10_000_000);
        assert_eq!(ctr(&mut a), T0 + 10_000_000);
        assert_eq!(ctr(&mut a), T0 + 10_000_001);
        // Time never runs backwards for the sealer.
        a.tick(5);
        assert_eq!(ctr(&mut a), T0 + 10_000_002);
    }

    #[test]
    fn key_parsing() {
        let k = Key::parse(&format!("3:{}", "ab".repeat(32))).unwrap();
        assert_eq!((k.id, k.secret[0]), (3, 0xab));
        assert!(Key::parse("0:00").is_err());
        assert!(Key::parse(&format!("1:{}", "zz".repeat(32))).is_err());
        assert!(Key::parse("nonsense").is_err());
        assert!(!format!("{k:?}").contains("ab"), "secrets stay out of logs");
    }
}
