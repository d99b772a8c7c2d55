//! How a measurement runs: where its two threads execute and how they wait.
//!
//! "Placement" means CPU pinning only ([`vkernel_peers::Placement`], shared
//! with the peers); a [`Mode`] is a placement plus a waiting strategy, and
//! every figure in a report names the mode it was measured in.

use std::thread;
use std::time::Duration;

use serde::Serialize;
use vkernel_peers::{Placement, Wait};

/// A placement and a waiting strategy: the conditions of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Mode {
    /// CPUs of the client (measuring) and server threads.
    pub cpus: Placement,
    /// Busy-poll or block while waiting.
    pub wait: Wait,
}

impl Mode {
    /// Busy-polling, threads unpinned (`--placement spin`, the default).
    pub const SPIN: Mode = Mode {
        cpus: Placement::UNPINNED,
        wait: Wait::Spin,
    };
    /// Blocking waits, threads unpinned (`--placement block`).
    pub const BLOCK: Mode = Mode {
        cpus: Placement::UNPINNED,
        wait: Wait::Block,
    };

    /// Client on CPU 0 and server on CPU 1 if `pinned` (both on CPU 0 on a
    /// one-CPU machine); busy-polling if `spin`, else blocking.
    pub fn new(pinned: bool, spin: bool) -> Mode {
        let n = vkernel::host::online_cpus().max(1);
        Mode {
            cpus: if pinned {
                Placement::pinned(0, 1 % n)
            } else {
                Placement::UNPINNED
            },
            wait: if spin { Wait::Spin } else { Wait::Block },
        }
    }

    /// The mode named on the command line: `spin`, `spin-pinned` (client on
    /// CPU 0, server on CPU 1) or `block`.
    pub fn parse(name: &str) -> Result<Mode, String> {
        match name {
            "spin" => Ok(Mode::SPIN),
            "block" => Ok(Mode::BLOCK),
            "spin-pinned" => Ok(Mode::new(true, true)),
            _ => Err(format!(
                "unknown placement `{name}` (spin, spin-pinned, block)"
            )),
        }
    }

    /// True if threads busy-poll while waiting.
    pub fn spins(&self) -> bool {
        self.wait == Wait::Spin
    }

    /// This mode with blocking waits (same CPUs).
    pub fn blocking(self) -> Mode {
        Mode {
            wait: Wait::Block,
            ..self
        }
    }

    /// The kernel spin budget this mode implies.
    pub fn spin_budget(&self) -> Duration {
        if self.spins() {
            // Long enough to cover any exchange; an idle server then blocks.
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        }
    }

    /// Pins the calling thread as the client (role 0) or the server (1).
    pub fn pin(&self, role: usize) {
        // Pinning is best effort: a refused affinity leaves the thread
        // where the scheduler puts it, as in the unpinned modes.
        let _ = if role == 0 {
            self.cpus.pin_client()
        } else {
            self.cpus.pin_server()
        };
    }

    /// Runs `f` on a new thread placed as `role`, so the caller's own
    /// affinity (inherited by threads it starts later) is never changed.
    pub fn run_as<T: Send>(&self, role: usize, f: impl FnOnce() -> T + Send) -> T {
        thread::scope(|s| {
            s.spawn(|| {
                self.pin(role);
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// The mode in words.
    pub fn describe(&self) -> String {
        let cpus = match (self.cpus.client_cpu, self.cpus.server_cpu) {
            (Some(c), Some(s)) => format!("client on CPU {c}, server on CPU {s}"),
            _ => "threads unpinned".into(),
        };
        let wait = if self.spins() {
            "busy-poll waiting"
        } else {
            "blocking waits"
        };
        format!("{cpus}, {wait}")
    }
}
