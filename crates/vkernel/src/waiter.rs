//! How a process waiting in a primitive is woken.
//!
//! Whoever runs the engine hands a completion to the waiter's slot and
//! sets its `ready` flag; a spinning process sees the flag, and only one
//! blocked in the kernel (`parked`) is also signalled through its eventfd.
//! Each process blocks in its own epoll set on that eventfd and, while it
//! is a socket reader, the host's socket, registered `EPOLLEXCLUSIVE` so a
//! datagram wakes one blocked process rather than all of them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use vkernel_proto::engine::Completion;

use crate::sys::EventFd;

/// Wake-up state of one process.
pub(crate) struct Waiter {
    /// The completion handed over by whoever ran the engine.
    pub(crate) slot: std::sync::Mutex<Option<Completion>>,
    pub(crate) ready: AtomicBool,
    pub(crate) parked: AtomicBool,
    pub(crate) destroyed: AtomicBool,
    /// The socket is in `epoll` (only the owning thread changes this).
    pub(crate) sock_in_epoll: AtomicBool,
    pub(crate) efd: EventFd,
    /// The eventfd (data 0) and, while blocked, the host's socket
    /// (data 1, exclusive).
    pub(crate) epoll: std::os::fd::OwnedFd,
}

impl Waiter {
    pub(crate) fn new() -> Option<Waiter> {
        use rustix::event::epoll;
        let efd = EventFd::new().ok()?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).ok()?;
        epoll::add(
            &ep,
            efd.as_fd(),
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )
        .ok()?;
        Some(Waiter {
            slot: std::sync::Mutex::new(None),
            ready: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            sock_in_epoll: AtomicBool::new(false),
            efd,
            epoll: ep,
        })
    }

    /// Blocks until the eventfd or (exclusively among the processes
    /// blocked this way) the socket is readable, or `timeout` passes.
    /// Returns (socket readable, eventfd readable).
    ///
    /// The socket joins this process's epoll set when it first blocks and
    /// leaves it when the process next spins ([`Waiter::spinning`]): every
    /// entry on a socket's wait queue costs a callback under a lock with
    /// interrupts off for each datagram sent or received on it, so a
    /// process busy-polling the socket must not have one, while one that
    /// always blocks keeps its entry rather than pay two syscalls a wait.
    /// (Readiness is checked when the socket is added, so a datagram that
    /// arrived just before is not missed.)
    pub(crate) fn block_on_both(
        &self,
        sock: &std::net::UdpSocket,
        timeout: Duration,
    ) -> (bool, bool) {
        use rustix::event::{epoll, Timespec};
        let ts = Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        if !self.sock_in_epoll.load(Ordering::Relaxed)
            && epoll::add(
                &self.epoll,
                sock,
                epoll::EventData::new_u64(1),
                epoll::EventFlags::IN | epoll::EventFlags::EXCLUSIVE,
            )
            .is_ok()
        {
            self.sock_in_epoll.store(true, Ordering::Relaxed);
        }
        let mut events = Vec::with_capacity(2);
        match epoll::wait(
            &self.epoll,
            rustix::buffer::spare_capacity(&mut events),
            Some(&ts),
        ) {
            Ok(_) => {}
            // Interrupted or failed: the caller's loop looks again.
            Err(_) => return (false, false),
        }
        let mut r = (false, false);
        for e in &events {
            match e.data.u64() {
                0 => r.1 = true,
                _ => r.0 = true,
            }
        }
        r
    }

    /// The process is about to busy-poll the socket: take the socket out
    /// of its epoll set (see [`Waiter::block_on_both`]).
    pub(crate) fn spinning(&self, sock: &std::net::UdpSocket) {
        if self.sock_in_epoll.swap(false, Ordering::Relaxed) {
            let _ = rustix::event::epoll::delete(&self.epoll, sock);
        }
    }

    pub(crate) fn deliver(&self, c: Completion) {
        match self.slot.lock() {
            Ok(mut g) => *g = Some(c),
            Err(p) => *p.into_inner() = Some(c),
        }
    }

    pub(crate) fn take(&self) -> Option<Completion> {
        match self.slot.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        }
    }

    /// Marks the completion ready; signals the eventfd only if the process
    /// is blocked in the kernel (a spinning process sees the flag).
    pub(crate) fn wake(&self) {
        if self.wake_spinning() {
            self.signal();
        }
    }

    /// Marks the completion ready. True if the process is blocked in the
    /// kernel and must also be [`Waiter::signal`]led. (The process sets
    /// `parked` before it looks at `ready` one last time, so one of the two
    /// sides always sees the other.)
    pub(crate) fn wake_spinning(&self) -> bool {
        self.ready.store(true, Ordering::SeqCst);
        self.parked.load(Ordering::SeqCst)
    }

    /// Signals the eventfd of a process blocked in the kernel.
    pub(crate) fn signal(&self) {
        self.efd.signal();
    }

    pub(crate) fn destroy(&self) {
        self.destroyed.store(true, Ordering::SeqCst);
        self.wake();
    }
}
