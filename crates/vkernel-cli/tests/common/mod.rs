//! Helpers shared by the CLI's integration tests.
#![allow(dead_code)] // each test binary uses a part

use std::process::Child;
use std::time::{Duration, Instant};

/// The `vkernel` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_vkernel");

/// A child process killed (and reaped) on drop, so no test leaves one
/// running.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `cond` every few milliseconds until it gives a value; panics
/// with `what` after `limit`. A hang guard, so that a broken build fails
/// instead of holding CI; never a speed check (limits are generous).
pub fn wait_for<T>(limit: Duration, what: &str, mut cond: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = cond() {
            return v;
        }
        if t.elapsed() > limit {
            panic!("{what} (waited {limit:?})");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
