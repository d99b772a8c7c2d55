//! Stopping a long-running command the way service managers do. SIGTERM
//! (systemd, podman, Kubernetes) and SIGINT (Ctrl-C) end its wait, so it
//! prints its summary and drops its host, which flushes the trace and
//! shuts the engine down; a second signal ends the process at once. The
//! service manager is told (STOPPING=1) as the wait ends, whatever ends it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};

/// The stop signals, once installed (see the module docs).
pub struct Stop(Arc<AtomicUsize>, Arc<AtomicBool>);

impl Stop {
    /// Catches SIGINT and SIGTERM from now on. If that fails (it should
    /// not), the signals keep their default action, which still ends the
    /// process.
    pub fn install() -> Stop {
        let flag = Arc::new(AtomicUsize::new(0));
        let once = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            // A second signal, once `once` is set, exits at once.
            let r = signal_hook::flag::register_conditional_shutdown(sig, 130, once.clone())
                .and_then(|_| signal_hook::flag::register(sig, once.clone()))
                .and_then(|_| signal_hook::flag::register_usize(sig, flag.clone(), sig as usize));
            if let Err(e) = r {
                tracing::warn!("cannot catch signal {sig}: {e}; it will end the process at once");
            }
        }
        Stop(flag, once)
    }

    /// A flag set by the first stop signal, for a loop that checks it
    /// (a long `ping`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.1.clone()
    }

    /// The stop signal received, if any.
    pub fn received(&self) -> Option<&'static str> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            s if s == SIGINT as usize => Some("SIGINT"),
            _ => Some("SIGTERM"),
        }
    }

    /// Waits until `exit_after` has passed since `start`, a stop signal
    /// arrives, or `done` says why the command must end (checked every
    /// 200 ms; signals every 100 ms, so an idle service wakes 10 times a
    /// second). Returns that reason, if any.
    pub fn wait(
        &self,
        start: Instant,
        exit_after: Option<Duration>,
        mut done: impl FnMut() -> Option<String>,
    ) -> Option<String> {
        let mut turns = 0u32;
        loop {
            if let Some(sig) = self.received() {
                eprintln!("vkernel: {sig} received: stopping (another one ends it at once)");
                crate::notify::stopping(&format!("stopping: {sig} received"));
                return None;
            }
            if exit_after.is_some_and(|d| start.elapsed() >= d) {
                crate::notify::stopping("stopping: --exit-after has passed");
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
            turns += 1;
            if turns.is_multiple_of(2) {
                if let Some(why) = done() {
                    crate::notify::stopping(&format!("stopping: {why}"));
                    return Some(why);
                }
            }
        }
    }
}
