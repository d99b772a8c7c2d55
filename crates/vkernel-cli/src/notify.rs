//! Readiness for a service manager (systemd `Type=notify`, sd_notify(3)):
//! READY=1 once a command serves — its name registered, its socket
//! listening, its file system mounted — so units ordered after it start
//! only then; STOPPING=1 when it begins to stop; each with a STATUS= line
//! for `systemctl status`. Without $NOTIFY_SOCKET nothing is sent.

use sd_notify::NotifyState;

/// Tells the service manager that the command serves; `status` says what
/// (one line; no secrets: any user may read it).
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(&one_line(status))]);
}

/// Tells the service manager that the command is stopping, and why.
pub fn stopping(why: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(&one_line(why))]);
}

/// A newline would end the STATUS= assignment.
fn one_line(s: &str) -> String {
    s.trim().replace('\n', " ")
}

fn send(states: &[NotifyState<'_>]) {
    // A manager that cannot be told is no reason to stop serving; it
    // will time the start out itself.
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify the service manager at $NOTIFY_SOCKET: {e}");
    }
}
