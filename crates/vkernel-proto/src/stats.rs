//! Counters kept by the engine. Cheap plain integers; the runtime copies them
//! out under its lock.

use crate::wire::{DecodeError, PacketType};

/// Why a datagram that decoded was still dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Could not be decoded (see [`Stats::decode_errors`]).
    Malformed,
    /// Addressed to another logical host (normal after a fan-out).
    NotForUs,
    /// A late duplicate of an exchange already finished.
    Stale,
    /// No matching exchange, transfer or query.
    NoMatch,
    /// The alien pool (or the per-host share) was full.
    NoBuffers,
    /// Violated segment rights or bounds.
    SegmentViolation,
    /// Our own datagram came back (broadcast / fan-out to self).
    OwnEcho,
    /// Host id not allocated yet.
    NotReady,
    /// From a host the group policy does not trust.
    Untrusted,
    /// A reply to a group Send that came too late (sender moved on, or
    /// 1-reply mode already satisfied).
    LateReply,
}

/// Per-host protocol counters.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Datagrams received, by packet type (index = type − 1).
    pub rx: [u64; 13],
    /// Datagrams transmitted, by packet type.
    pub tx: [u64; 13],
    /// Bytes received and sent in datagrams.
    pub rx_bytes: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Decode failures: truncated, magic, version, type, length, oversized.
    pub decode_errors: [u64; 6],
    /// Drops after decoding, by [`DropReason`] (index order of the enum).
    pub drops: [u64; 10],
    /// RemoteSend retransmissions.
    pub retransmits: u64,
    /// Bulk-data chunks retransmitted.
    pub bulk_retransmits: u64,
    /// Duplicate requests filtered (answered with replyPending or a saved reply).
    pub duplicates: u64,
    /// Saved replies re-sent for non-idempotent duplicates.
    pub saved_replies_resent: u64,
    /// Saved replies dropped because too many were kept (bounded memory).
    pub saved_replies_evicted: u64,
    /// Exchanges, transfers and queries that timed out.
    pub timeouts: u64,
    /// Local exchanges completed.
    pub local_exchanges: u64,
    /// Remote exchanges completed (as sender).
    pub remote_exchanges: u64,
    /// Aliens currently in use.
    pub aliens_in_use: u64,
    /// Bytes moved by MoveTo/MoveFrom.
    pub bulk_bytes: u64,
    /// Group Sends started by local processes.
    pub group_sends: u64,
    /// Group messages handed to local members (one per member).
    pub group_deliveries: u64,
    /// Members that missed a group message because every copy was in use.
    pub group_copies_exhausted: u64,
    /// Replies to group Sends received (first and later).
    pub group_replies: u64,
    /// Datagrams rejected by authentication, by
    /// [`Reject`](crate::auth::Reject) (truncated, no key, unknown key, bad
    /// tag, replay). They never reach the protocol.
    pub auth_rejects: [u64; 5],
}

impl Stats {
    pub(crate) fn rx_type(&mut self, t: PacketType, bytes: usize) {
        self.rx[t as usize - 1] += 1;
        self.rx_bytes += bytes as u64;
    }

    pub(crate) fn tx_type(&mut self, t: PacketType, bytes: usize) {
        self.tx[t as usize - 1] += 1;
        self.tx_bytes += bytes as u64;
    }

    pub(crate) fn decode_error(&mut self, e: DecodeError) {
        let i = match e {
            DecodeError::Truncated => 0,
            DecodeError::BadMagic => 1,
            DecodeError::BadVersion => 2,
            DecodeError::BadType => 3,
            DecodeError::BadLength => 4,
            DecodeError::Oversized => 5,
        };
        self.decode_errors[i] += 1;
        self.drops[DropReason::Malformed as usize] += 1;
    }

    pub(crate) fn drop(&mut self, r: DropReason) {
        self.drops[r as usize] += 1;
    }

    /// Count received of one packet type.
    pub fn rx_of(&self, t: PacketType) -> u64 {
        self.rx[t as usize - 1]
    }

    /// Count sent of one packet type.
    pub fn tx_of(&self, t: PacketType) -> u64 {
        self.tx[t as usize - 1]
    }

    /// Drops for one reason.
    pub fn drops_of(&self, r: DropReason) -> u64 {
        self.drops[r as usize]
    }

    /// Datagrams rejected by authentication for one reason.
    pub fn auth_rejects_of(&self, r: crate::auth::Reject) -> u64 {
        self.auth_rejects[r as usize]
    }

    /// All decode failures.
    pub fn malformed(&self) -> u64 {
        self.decode_errors.iter().sum()
    }
}
