//! How a proxy's process answers its program outside the proxy's loop:
//! the sink the engine writes a completed Send or Receive into (straight
//! into the call slot), and what the process's end leaves there.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use vkernel_proto::engine::{Completion, Received};
use vkernel_proto::{IpcError, Pid};

use super::super::peer::Peer;
use super::super::shm::{futex_wake, Shm};
use super::super::slot::Slot;
use super::Peers;

/// Writes a directly completed Send or Receive into the call slot (see
/// `waiter::Sink`): the proxy started it and went back to its slot.
pub(super) struct SlotSink {
    pub(super) slot: Arc<Shm>,
    /// The call it answers.
    pub(super) seq: AtomicU32,
    pub(super) stop: Arc<AtomicBool>,
    /// The process's peer page, if it has one.
    pub(super) peer: Option<Arc<Shm>>,
    pub(super) pid: Pid,
    pub(super) peers: Arc<Peers>,
    /// The host's span exporter and the span of the Send in progress
    /// (feature `otel`): ended here, as the proxy does not wait for it.
    /// (Weak: the host's state holds this sink.)
    #[cfg(feature = "otel")]
    pub(super) spans: Option<(
        std::sync::Weak<crate::kernel::Shared>,
        std::sync::Mutex<Option<crate::otel::Begun>>,
    )>,
}

impl crate::waiter::Sink for SlotSink {
    fn complete(&self, c: Completion) -> bool {
        // SAFETY: the slot mapping is SLOT_BYTES long, page-aligned, and
        // kept by this sink.
        let s = unsafe { Slot::at(self.slot.as_ptr()) };
        #[cfg(feature = "otel")]
        if let Completion::Send(r) = &c {
            self.end_span(r.as_ref().map(|r| r.from).map_err(|e| e.to_string()));
        }
        let r = match c {
            Completion::Send(Ok(r)) => {
                s.set_rmsg(&r.msg);
                s.set_out(0, r.from.0);
                s.set_out(1, r.seg_bytes as u32);
                Ok(())
            }
            Completion::Receive(Ok(r)) => {
                write_received(s, &r);
                Ok(())
            }
            Completion::Send(Err(e)) | Completion::Receive(Err(e)) => Err(e),
            _ => Err(IpcError::Refused(Pid(0))),
        };
        let r = match r {
            Err(_) if self.stop.load(Ordering::Acquire) => Err(IpcError::HostLost),
            r => r,
        };
        s.set_result(r.as_ref().err().map_or(Ok(()), Err));
        s.done
            .store(self.seq.load(Ordering::Relaxed), Ordering::SeqCst);
        s.prog_parked.load(Ordering::SeqCst) != 0
    }

    #[cfg(feature = "otel")]
    fn send_begun(&self, b: crate::otel::Begun) -> Option<crate::otel::Begun> {
        match &self.spans {
            Some((_, begun)) => {
                *super::lock(begun) = Some(b);
                None
            }
            None => Some(b),
        }
    }

    fn wake(&self) {
        // SAFETY: as in `complete`.
        futex_wake(&unsafe { Slot::at(self.slot.as_ptr()) }.done);
    }

    fn queue_state(&self, nonempty: bool) {
        if let Some(page) = &self.peer {
            // SAFETY: adopted as exactly PEER_BYTES, page-aligned, kept
            // by this sink.
            unsafe { Peer::at(page.as_ptr()) }.set_queued(nonempty);
        }
    }

    fn destroyed(&self) {
        // Ended with its attachment (the host going, or the program): as
        // the proxy reports it.
        let err = if self.stop.load(Ordering::Acquire) {
            IpcError::HostLost
        } else {
            IpcError::Destroyed
        };
        // For its own remote Sends, which the host does not see (whoever
        // destroys it then wakes their socket, `Shared::wake_direct`).
        // SAFETY: as in `complete`.
        let s = unsafe { Slot::at(self.slot.as_ptr()) };
        s.set_ended(&err);
        // A call of the program waiting in the slot (a Send through the
        // host, say) gets no answer now: wake it to read `ended`.
        futex_wake(&s.done);
        if self.peer.is_some() {
            self.peers.died(self.pid, &err);
        }
    }
}

impl SlotSink {
    /// Ends the span of the Send that completed, `by` whom or failed.
    #[cfg(feature = "otel")]
    fn end_span(&self, by: Result<Pid, String>) {
        if let Some((sh, begun)) = &self.spans {
            let b = super::lock(begun).take();
            if let (Some(sh), Some(b)) = (sh.upgrade(), b) {
                if let Some(spans) = &sh.otel {
                    spans.send(self.pid, b, by);
                }
            }
        }
    }
}

pub(super) fn write_received(s: &Slot, r: &Received) {
    s.set_rmsg(&r.msg);
    s.set_out(0, r.from.0);
    s.set_out(1, r.seg_bytes as u32);
    s.set_out(2, r.forwarder.0);
    s.set_out(3, r.principal);
    s.set_out(4, 1);
}
