//! Attaching programs to a machine host.
//!
//! A machine host ([`AttachServer`], `vkernel host`) is a logical host
//! whose processes may belong to other programs: a program calls
//! `Kernel::attach` and from then on creates processes of that host, with
//! the same `Process` API an embedded program uses. The pieces:
//!
//! - `control`: the attach socket (Unix SEQPACKET): hello, process
//!   creation with the memory files passed alongside, questions about the
//!   host. Its end is how each side learns the other has gone.
//! - `slot`: one call slot per process in a page both map; the program
//!   posts a call, the host's proxy for the process runs it and posts the
//!   result; `wait` spins or blocks on a futex for the other side.
//! - `shm`: sealed memory files (the slot, and the window through which a
//!   call's bytes travel).
//! - `host` / `program`: the two sides.
//! - `peer`: exchanges between programs of one uid through each other's
//!   pages, bypassing the host.
//! - `direct`: remote Sends a process sends and takes on its own socket,
//!   bypassing the host's threads.
//!
//! The protocol and its invariants are in docs/PROTOCOL.md ("Attach").

pub(crate) mod control;
pub(crate) mod direct;
pub(crate) mod host;
pub(crate) mod peer;
pub(crate) mod program;
pub(crate) mod shm;
pub(crate) mod slot;
pub(crate) mod wait;

use std::path::PathBuf;
use std::time::Duration;

use vkernel_proto::{Pid, Scope};

use crate::vocab::HostLoad;

pub use host::{AttachServer, MAX_PROCESSES_PER_PROGRAM};

/// The environment variable that names the machine host's socket.
pub const ENV: &str = "VKERNEL_HOST";

/// A process's window starts this large (bytes).
pub(crate) const MIN_WINDOW: usize = 64 << 10;
/// The most sequence numbers one `ask::DIRECT` reserves.
pub(crate) const DIRECT_LEASE_MAX: u32 = 1 << 16;
/// A process's window grows to at most this (the largest segment or move
/// one call of an attached program may carry).
pub const MAX_WINDOW: usize = 1 << 30;

/// Where programs find the machine host: `$VKERNEL_HOST` if set, else
/// `/run/vkernel/host.sock` for root and
/// `$XDG_RUNTIME_DIR/vkernel/host.sock` (or `/tmp/vkernel-<uid>/host.sock`)
/// for anyone else.
pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os(ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 {
        return PathBuf::from("/run/vkernel/host.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        Some(d) => PathBuf::from(d).join("vkernel/host.sock"),
        None => PathBuf::from(format!("/tmp/vkernel-{uid}/host.sock")),
    }
}

/// Locks `m`, also after a panic elsewhere (the data stays usable).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn scope_code(s: Scope) -> u32 {
    match s {
        Scope::Local => 0,
        Scope::Remote => 1,
        Scope::Any => 2,
    }
}

pub(crate) fn scope_of(c: u32) -> Option<Scope> {
    match c {
        0 => Some(Scope::Local),
        1 => Some(Scope::Remote),
        2 => Some(Scope::Any),
        _ => None,
    }
}

/// Bytes of one [`HostLoad`] in a window.
pub(crate) const HOST_LOAD_BYTES: usize = 32;

pub(crate) fn host_load_to(h: &HostLoad, c: &mut [u8]) {
    c[0..4].copy_from_slice(&h.kernel_server.0.to_le_bytes());
    c[4..8].copy_from_slice(&h.processes.to_le_bytes());
    c[8..16].copy_from_slice(&h.load.to_bits().to_le_bytes());
    c[16..20].copy_from_slice(&h.cpus.to_le_bytes());
    let after = u64::try_from(h.after.as_micros()).unwrap_or(u64::MAX);
    c[24..32].copy_from_slice(&after.to_le_bytes());
}

pub(crate) fn host_load_from(c: &[u8]) -> HostLoad {
    let w = |i: usize| u32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
    let d = |i: usize| u64::from(w(i)) | (u64::from(w(i + 4)) << 32);
    let load = f64::from_bits(d(8));
    HostLoad {
        kernel_server: Pid(w(0)),
        processes: w(4),
        load: if load.is_finite() { load } else { f64::MAX },
        cpus: w(16),
        after: Duration::from_micros(d(24)),
    }
}
