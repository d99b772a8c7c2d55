//! Waiting for SIGINT or SIGTERM, or for the session to end.

use std::sync::Arc;
use std::time::Duration;

/// Waits for SIGINT or SIGTERM (installed before the mount, so a signal
/// during mounting is not lost) or for the session to end on its own.
#[derive(Debug)]
pub struct Termination {
    pub(super) flag: Arc<std::sync::atomic::AtomicUsize>,
}

impl Termination {
    /// Installs handlers for SIGINT and SIGTERM that record the signal
    /// instead of killing the process.
    pub fn install() -> std::io::Result<Termination> {
        let flag = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register_usize(sig, flag.clone(), sig as usize)?;
        }
        Ok(Termination { flag })
    }

    /// Blocks until a signal arrives or `session` ends; says which.
    pub fn wait(&self, session: &fuser::BackgroundSession) -> String {
        loop {
            match self.flag.load(std::sync::atomic::Ordering::Acquire) {
                0 => {}
                s if s == signal_hook::consts::SIGINT as usize => return "SIGINT".into(),
                _ => return "SIGTERM".into(),
            }
            if session.guard.is_finished() {
                return "the file system was unmounted".into();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
