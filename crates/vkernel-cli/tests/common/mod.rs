//! Helpers shared by the CLI's integration tests.

use std::process::Child;

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
