//! How a process waiting in a primitive is woken.
//!
//! Whoever runs the engine hands a completion to the waiter's slot and
//! sets its `ready` flag; a spinning process sees the flag, and only one
//! blocked in the kernel (`parked`) is also signalled through an eventfd.
//!
//! The descriptors belong to threads, not processes: a thread that blocks
//! makes (once) an eventfd and an epoll set of its own, and a process
//! about to block notes whose thread's eventfd wakes it. So a process
//! holds no descriptor, and a host can have as many processes as memory
//! allows. A thread blocks in its epoll set on its eventfd and, while its
//! process is a socket reader, the host's socket, registered
//! `EPOLLEXCLUSIVE` so a datagram wakes one blocked thread rather than all
//! of them. A thread awaiting a remote reply at its own answer socket
//! (docs/PROTOCOL.md §1c) blocks in `recvfrom` on that socket instead, and
//! is woken by an empty datagram to it; so is a host's lone blocked
//! reader, which waits in the host's socket itself
//! (`Shared::enter_reader`, [`WaitFds::waiting_in`]).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use vkernel_proto::engine::Completion;
use vkernel_proto::{IpcError, Pid};

use crate::sys::EventFd;

/// Wake-up state of one process.
pub(crate) struct Waiter {
    /// The completion handed over by whoever ran the engine.
    pub(crate) slot: std::sync::Mutex<Option<Completion>>,
    pub(crate) ready: AtomicBool,
    pub(crate) parked: AtomicBool,
    pub(crate) destroyed: AtomicBool,
    /// The descriptors of the thread that last blocked waiting for this
    /// process (set before `parked`, so a waker that sees `parked` finds
    /// them).
    parked_on: Mutex<Option<Arc<WaitFds>>>,
    /// Where an armed operation's completion goes instead (an attached
    /// program's call slot): set once.
    sink: OnceLock<Arc<dyn Sink>>,
    /// The operation in progress completes into `sink`.
    armed: AtomicBool,
    /// The last completion went to `sink`, which must be woken.
    sink_wake: AtomicBool,
    /// The port of the answer socket the process's thread reads during a
    /// Send outside the engine (`process/direct.rs`), 0 if none: whoever
    /// destroys the process or stops the host wakes that thread with an
    /// empty datagram, as it is not parked.
    answer_port: std::sync::atomic::AtomicU32,
    /// The process's peer page, if its thread exchanges through pages
    /// (`process/local/peer.rs`): set once.
    peer: OnceLock<Arc<crate::process::LocalPeer>>,
}

/// Takes completions for a process that nobody waits for in this program:
/// the proxy of an attached process starts an operation and goes back to
/// its call slot, and whoever runs the engine when the operation completes
/// writes the result straight into the slot (one wake-up fewer).
pub(crate) trait Sink: Send + Sync {
    /// Takes the completion (under the engine lock); true if the waiting
    /// side must be woken with [`Sink::wake`] once the lock is released.
    fn complete(&self, c: Completion) -> bool;
    /// Wakes the waiting side.
    fn wake(&self);
    /// Whether messages wait in the process's queue (under the engine
    /// lock): a process that also receives outside the engine must then
    /// receive through it.
    fn queue_state(&self, _nonempty: bool) {}
    /// The process was destroyed (not under the engine lock).
    fn destroyed(&self) {}
    /// Takes the span of the Send just started for this sink (feature
    /// `otel`; under the engine lock, before it can complete), to end it
    /// when it completes; `Some` gives it back (the waiting side ends it).
    #[cfg(feature = "otel")]
    fn send_begun(&self, b: crate::otel::Begun) -> Option<crate::otel::Begun> {
        Some(b)
    }
}

impl Waiter {
    /// A waiter (it holds no descriptor: see the module's notes).
    pub(crate) fn new() -> Waiter {
        Waiter {
            slot: std::sync::Mutex::new(None),
            ready: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            parked_on: Mutex::new(None),
            sink: OnceLock::new(),
            armed: AtomicBool::new(false),
            sink_wake: AtomicBool::new(false),
            answer_port: std::sync::atomic::AtomicU32::new(0),
            peer: OnceLock::new(),
        }
    }

    /// Notes the answer socket port the process's thread reads during a
    /// direct Send (0: it no longer does). Set before the thread's last
    /// look at `destroyed`: a destroyer sets that first, then looks here.
    pub(crate) fn set_answer_port(&self, port: u16) {
        self.answer_port.store(u32::from(port), Ordering::SeqCst);
    }

    /// The answer socket port noted by [`Waiter::set_answer_port`], if any.
    pub(crate) fn answer_port(&self) -> Option<u16> {
        u16::try_from(self.answer_port.load(Ordering::SeqCst))
            .ok()
            .filter(|&p| p != 0)
    }

    /// The calling thread's descriptors, noted as the ones that wake
    /// this process (call before setting `parked`). `None`: the thread
    /// could not make them (out of descriptors); the caller then waits by
    /// sleeping briefly.
    pub(crate) fn park_here(&self) -> Option<Arc<WaitFds>> {
        let fds = thread_fds()?;
        *lock(&self.parked_on) = Some(fds.clone());
        Some(fds)
    }

    /// The answer socket the process's thread is blocked in, if it is.
    pub(crate) fn blocked_in_answer(&self) -> Option<Arc<std::net::UdpSocket>> {
        let f = lock(&self.parked_on).clone()?;
        let s = match &*lock(&f.in_recv) {
            Some((s, None)) => Some(s.clone()),
            _ => None,
        };
        s
    }

    /// The process is awake again: its thread's descriptors are no longer
    /// its to hold (a waker that saw `parked` just before may still find
    /// them and signal: a spurious wake-up of that thread, which looks
    /// again). Keeps a process from holding a dead thread's descriptors.
    pub(crate) fn unpark(&self) {
        lock(&self.parked_on).take();
    }

    /// Blocks the calling thread until its eventfd or (exclusively among
    /// the threads blocked this way) the socket `sock` of the host
    /// `host_serial` is readable, or `timeout` passes. Returns (socket
    /// readable, eventfd readable).
    ///
    /// `alone`: no other thread is blocked reading the socket (a host's
    /// single server, say, when it cannot wait in the socket itself:
    /// `Shared::enter_reader`). It then waits in a plain `ppoll`, whose entry
    /// on the socket's wait queue lasts only while it waits. (A reader that
    /// blocks while it waits is woken with it by the next datagram, once;
    /// the next wait of either is no longer alone.)
    ///
    /// Otherwise the socket joins the thread's epoll set when it first blocks and
    /// leaves it when the thread next spins ([`Waiter::spinning`]), blocks
    /// alone, or blocks on another host's socket: every entry on a socket's wait
    /// queue costs a callback under a lock with interrupts off for each
    /// datagram sent or received on it, so a thread busy-polling the
    /// socket must not have one, while one that always blocks keeps its
    /// entry rather than pay two syscalls a wait. (Readiness is checked
    /// when the socket is added, so a datagram that arrived just before is
    /// not missed.)
    pub(crate) fn block_on_both(
        fds: &WaitFds,
        sock: &std::net::UdpSocket,
        host_serial: u64,
        timeout: Duration,
        alone: bool,
    ) -> (bool, bool) {
        use rustix::event::{epoll, Timespec};
        if alone {
            // The only reader blocked: a plain poll, and no entry left on
            // the socket's wait queue between waits (an exchange's two
            // datagrams would each pay its callback).
            fds.unregister(&mut lock(&fds.sock));
            let (e, s) = crate::sys::poll2(fds.efd.fd(), Some(sock.as_raw_fd()), timeout);
            return (s, e);
        }
        let ts = Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        {
            let want = (sock.as_raw_fd(), host_serial);
            let mut cur = lock(&fds.sock);
            if *cur != Some(want) {
                // Another host's socket (or one since closed, whose
                // number may now name this one): out first.
                fds.unregister(&mut cur);
                if epoll::add(
                    &fds.epoll,
                    sock,
                    epoll::EventData::new_u64(1),
                    epoll::EventFlags::IN | epoll::EventFlags::EXCLUSIVE,
                )
                .is_ok()
                {
                    *cur = Some(want);
                }
            }
        }
        // On the stack: a wait is on every blocking exchange's path.
        let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 2];
        let events = match epoll::wait(&fds.epoll, &mut buf, Some(&ts)) {
            Ok((got, _)) => got,
            // Interrupted or failed: the caller's loop looks again.
            Err(_) => return (false, false),
        };
        let mut r = (false, false);
        for e in events.iter() {
            match e.data.u64() {
                0 => r.1 = true,
                _ => r.0 = true,
            }
        }
        r
    }

    /// The calling thread is about to busy-poll the socket: take it out
    /// of the thread's epoll set (see [`Waiter::block_on_both`]).
    pub(crate) fn spinning(sock: &std::net::UdpSocket) {
        let Some(f) = THREAD_FDS.with(|t| t.get().cloned()) else {
            return;
        };
        let mut cur = lock(&f.sock);
        if cur.is_some_and(|(fd, _)| fd == sock.as_raw_fd()) {
            *cur = None;
            let _ = rustix::event::epoll::delete(&f.epoll, sock);
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

    /// Signals the eventfd of a process blocked in the kernel (or wakes
    /// the sink that took its last completion).
    pub(crate) fn signal(&self) {
        if self.sink_wake.swap(false, Ordering::AcqRel) {
            if let Some(s) = self.sink.get() {
                s.wake();
            }
            return;
        }
        // None: the process never blocked, so nothing waits.
        if let Some(f) = lock(&self.parked_on).as_ref() {
            f.signal();
        }
    }

    /// Sets where armed operations complete.
    pub(crate) fn set_sink(&self, s: Arc<dyn Sink>) {
        let _ = self.sink.set(s);
    }

    /// Where armed operations complete, if anywhere.
    #[cfg(feature = "otel")]
    pub(crate) fn sink(&self) -> Option<&Arc<dyn Sink>> {
        self.sink.get()
    }

    /// The next completion goes to the sink (call under the engine lock,
    /// before starting the operation); returns the previous setting, to
    /// put back if the operation did not start (an operation still in
    /// progress keeps its arming).
    pub(crate) fn arm(&self, on: bool) -> bool {
        self.armed
            .swap(on && self.sink.get().is_some(), Ordering::Relaxed)
    }

    /// Whether the operation in progress completes into the sink.
    #[cfg(feature = "otel")]
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    /// Hands `c` to the sink if an operation is armed: true if it took it
    /// and must be woken ([`Waiter::signal`]) after the lock is released;
    /// `Err(c)` gives it back otherwise.
    pub(crate) fn complete_armed(&self, c: Completion) -> Result<bool, Completion> {
        if !self.armed.swap(false, Ordering::Relaxed) {
            return Err(c);
        }
        match self.sink.get() {
            Some(s) => {
                let wake = s.complete(c);
                if wake {
                    self.sink_wake.store(true, Ordering::Release);
                }
                Ok(wake)
            }
            None => Err(c),
        }
    }

    /// Tells the sink whether messages wait in this process's queue (under
    /// the engine lock).
    pub(crate) fn queue_state(&self, nonempty: bool) {
        if let Some(s) = self.sink.get() {
            s.queue_state(nonempty);
        }
        if let Some(p) = self.peer.get() {
            p.page.set_queued(nonempty);
        }
    }

    /// Gives the process its peer page (once).
    pub(crate) fn set_peer(&self, p: Arc<crate::process::LocalPeer>) {
        let _ = self.peer.set(p);
    }

    /// The process's peer page, if it has one.
    pub(crate) fn peer(&self) -> Option<&Arc<crate::process::LocalPeer>> {
        self.peer.get()
    }

    pub(crate) fn destroy(&self) {
        self.destroyed.store(true, Ordering::SeqCst);
        if let Some(s) = self.sink.get() {
            s.destroyed();
        }
        if let Some(p) = self.peer.get() {
            p.page.die(&IpcError::Destroyed);
        }
        self.wake();
    }
}

/// A host's waiters by pid: a table by local id, so that it grows and
/// shrinks without pauses (`vkernel_proto::local_table`).
#[derive(Default)]
pub(crate) struct Waiters(vkernel_proto::local_table::LocalTable<(Pid, Arc<Waiter>)>);

impl Waiters {
    /// `pid`'s waiter.
    pub(crate) fn get(&self, pid: &Pid) -> Option<&Arc<Waiter>> {
        match self.0.get(pid.local()) {
            Some((p, w)) if p == pid => Some(w),
            _ => None,
        }
    }

    /// Notes `pid`'s waiter.
    pub(crate) fn insert(&mut self, pid: Pid, w: Arc<Waiter>) {
        self.0.insert(pid.local(), (pid, w));
    }

    /// Takes `pid`'s waiter out.
    pub(crate) fn remove(&mut self, pid: &Pid) -> Option<Arc<Waiter>> {
        self.get(pid)?;
        self.0.remove(pid.local()).map(|(_, w)| w)
    }

    /// Every waiter.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<Waiter>> {
        self.0.values().map(|(_, w)| w)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

thread_local! {
    /// This thread's wait descriptors, made when it first blocks.
    static THREAD_FDS: OnceLock<Arc<WaitFds>> = const { OnceLock::new() };
}

/// The calling thread's wait descriptors (`None`: out of descriptors).
fn thread_fds() -> Option<Arc<WaitFds>> {
    THREAD_FDS.with(|t| {
        if let Some(f) = t.get() {
            return Some(f.clone());
        }
        let f = Arc::new(WaitFds::new()?);
        Some(t.get_or_init(|| f).clone())
    })
}

/// The eventfd a blocked thread waits on, and its epoll set.
pub(crate) struct WaitFds {
    pub(crate) efd: EventFd,
    /// The eventfd (data 0) and, while blocked, a host's socket
    /// (data 1, exclusive).
    epoll: std::os::fd::OwnedFd,
    /// That socket (descriptor, host serial), if it is in `epoll`; only
    /// the owning thread changes it.
    sock: Mutex<Option<(RawFd, u64)>>,
    /// The thread's answer sockets by host serial, the latest used last;
    /// only the owning thread touches them.
    answers: Mutex<Vec<(u64, Arc<std::net::UdpSocket>, u16)>>,
    /// The socket the thread is blocked in, if it is: a waker then sends
    /// it an empty datagram instead of signalling the eventfd. An answer
    /// socket (`recvfrom`), or with the address to send to, a host's main
    /// socket that the thread reads as its lone reader ([`WaitFds::waiting_in`]).
    in_recv: Mutex<Option<(Arc<std::net::UdpSocket>, Option<std::net::SocketAddr>)>>,
}

impl WaitFds {
    /// Takes the socket registered in the thread's epoll set (`cur`, its
    /// `sock` entry) out of it, if one is.
    fn unregister(&self, cur: &mut Option<(std::os::fd::RawFd, u64)>) {
        if let Some((fd, _)) = cur.take() {
            // SAFETY: only the number is used, to name the registration
            // to delete; a closed descriptor's is already gone and the
            // call then fails harmlessly.
            let old = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let _ = rustix::event::epoll::delete(&self.epoll, old);
        }
    }

    /// Wakes the thread: an empty datagram to the answer socket it is
    /// blocked in, else the eventfd.
    pub(crate) fn signal(&self) {
        if let Some((s, to)) = lock(&self.in_recv).as_ref() {
            if let Some(a) = to.or_else(|| s.local_addr().ok()) {
                if crate::net::send_wake(s, &a).is_ok() {
                    return;
                }
            }
        }
        self.efd.signal();
    }

    /// Notes that the thread is about to wait in a host's main socket
    /// `sock` as its lone reader (woken by an empty datagram to `to`), or
    /// no longer does (`None`). Set it before the last look at the
    /// process's `ready`: a waker that looked before signalled the
    /// eventfd, after setting `ready`.
    pub(crate) fn waiting_in(
        &self,
        sock: Option<(Arc<std::net::UdpSocket>, std::net::SocketAddr)>,
    ) {
        *lock(&self.in_recv) = sock.map(|(s, a)| (s, Some(a)));
    }

    /// Blocks in `recvfrom` on the answer socket `sock` (see
    /// [`WaitFds::signal`]) until a datagram comes or about `timeout`
    /// passes (whole milliseconds, 1 to [`ANSWER_WAIT`]; to the
    /// microsecond if `exact`, see [`recv_answer_within`]): the datagram,
    /// unless it was empty (a wake-up). Call with the process parked on
    /// this thread; `ready` is its flag: set already once the socket is
    /// noted (a waker that looked before signalled the eventfd), it
    /// returns at once.
    pub(crate) fn recv_blocking(
        &self,
        sock: &Arc<std::net::UdpSocket>,
        buf: &mut [u8],
        timeout: Duration,
        exact: bool,
        ready: &AtomicBool,
    ) -> Option<(usize, std::net::SocketAddr)> {
        *lock(&self.in_recv) = Some((sock.clone(), None));
        if ready.load(Ordering::SeqCst) {
            lock(&self.in_recv).take();
            return None;
        }
        let r = recv_answer_within(sock, buf, timeout, exact);
        lock(&self.in_recv).take();
        match r {
            Ok((n, _, a)) if n > 0 => crate::net::std_addr(a).map(|a| (n, a)),
            _ => None,
        }
    }
}

/// Waits for a datagram on the answer socket `sock` for about `timeout`
/// and reads it. Normally one `recvfrom` that blocks under the socket's
/// receive timeout ([`set_answer_timeout`]); but that timeout ends on the
/// kernel's tick (asked 1 ms, it sleeps 8 on a 250 Hz kernel), so with
/// `exact` (the caller's deadline) the wait is a `ppoll`, to the
/// microsecond, and the read does not block.
pub(crate) fn recv_answer_within(
    sock: &std::net::UdpSocket,
    buf: &mut [u8],
    timeout: Duration,
    exact: bool,
) -> rustix::io::Result<(usize, usize, Option<rustix::net::SocketAddrAny>)> {
    let flags = if exact {
        if !crate::sys::poll2(sock.as_raw_fd(), None, timeout).0 {
            return Err(rustix::io::Errno::AGAIN);
        }
        rustix::net::RecvFlags::DONTWAIT
    } else {
        set_answer_timeout(sock, timeout);
        rustix::net::RecvFlags::empty()
    };
    loop {
        match rustix::net::recvfrom(sock, &mut *buf, flags) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r,
        }
    }
}

/// The longest a thread blocks in its answer socket before it looks at
/// its flags again (a waker normally ends the wait sooner, see
/// [`WaitFds::signal`]).
const ANSWER_WAIT: Duration = Duration::from_millis(50);

thread_local! {
    /// The receive timeout last set on an answer socket of this thread
    /// (descriptor, milliseconds): set again only when it changes, which
    /// it rarely does (it follows the retransmission timeout).
    static ANSWER_TIMEOUT: std::cell::Cell<(RawFd, u64)> = const { std::cell::Cell::new((-1, 0)) };
}

/// Sets `sock`'s receive timeout to about `d`, unless it is set so
/// already: whole milliseconds, rounded up (1 to [`ANSWER_WAIT`]), and
/// above 2 ms down to a power of two. The time left to a retransmission
/// timer changes with every exchange; the steps keep the timeout, and so
/// the syscall, the same across them. Waking early is harmless (the
/// callers look at their timers and wait again), waking late is not.
pub(crate) fn set_answer_timeout(sock: &std::net::UdpSocket, d: Duration) {
    let ms = answer_timeout_ms(d);
    let key = (sock.as_raw_fd(), ms);
    if ANSWER_TIMEOUT.with(|c| c.get()) != key
        && sock
            .set_read_timeout(Some(Duration::from_millis(ms)))
            .is_ok()
    {
        ANSWER_TIMEOUT.with(|c| c.set(key));
    }
}

/// [`set_answer_timeout`]'s step for `d`.
fn answer_timeout_ms(d: Duration) -> u64 {
    let max = ANSWER_WAIT.as_millis() as u64;
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    match us.div_ceil(1000) {
        up if up <= 2 => up.max(1),
        _ if us >= max * 1000 => max,
        _ => 1 << (us / 1000).ilog2(),
    }
}

/// Answer sockets a thread keeps (one per host it sends from; the least
/// recently used goes first).
const ANSWER_SOCKETS: usize = 4;

/// The calling thread's answer socket for the host `serial`, bound to
/// `ip` (any port) on first use; the thread waits in it alone (not in its
/// epoll set, see [`WaitFds::recv_blocking`]): a
/// remote Send made on this thread asks for its answers there
/// (`F_ANSWER_SOURCE`), so the thread waiting for the reply is the one the
/// reply wakes, not whichever of the host's blocked threads the main
/// socket wakes (which would then wake the sender: two wake-ups).
/// With its port. `None` if the thread has no descriptors to spare.
pub(crate) fn answer_socket(
    serial: u64,
    ip: std::net::IpAddr,
) -> Option<(Arc<std::net::UdpSocket>, u16)> {
    let fds = thread_fds()?;
    let mut v = lock(&fds.answers);
    if let Some(i) = v.iter().position(|(s, _, _)| *s == serial) {
        if i + 1 != v.len() {
            let e = v.remove(i);
            v.push(e);
        }
        return v.last().map(|(_, s, port)| (s.clone(), *port));
    }
    let sock = std::net::UdpSocket::bind((ip, 0)).ok()?;
    let port = sock.local_addr().ok()?.port();
    // Blocking, so a thread waits in `recvfrom` itself (other reads pass
    // MSG_DONTWAIT); the timeout bounds a wait between looks at its flags.
    sock.set_read_timeout(Some(ANSWER_WAIT)).ok()?;
    // (A closed socket's descriptor number may come back: forget what was
    // set on it.)
    ANSWER_TIMEOUT.with(|c| c.set((sock.as_raw_fd(), ANSWER_WAIT.as_millis() as u64)));
    if v.len() >= ANSWER_SOCKETS {
        v.remove(0);
    }
    let sock = Arc::new(sock);
    v.push((serial, sock.clone(), port));
    Some((sock, port))
}

impl WaitFds {
    fn new() -> Option<WaitFds> {
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
        Some(WaitFds {
            efd,
            epoll: ep,
            sock: Mutex::new(None),
            answers: Mutex::new(Vec::new()),
            in_recv: Mutex::new(None),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_are_found_by_the_whole_pid() {
        use vkernel_proto::HostId;
        let (a, b) = (Pid::new(HostId(1), 5), Pid::new(HostId(2), 5));
        let mut ws = Waiters::default();
        let w = Arc::new(Waiter::new());
        ws.insert(a, w.clone());
        assert!(ws.get(&a).is_some_and(|x| Arc::ptr_eq(x, &w)));
        // Same local id, another host: not this waiter, and not removed.
        assert!(ws.get(&b).is_none());
        assert!(ws.remove(&b).is_none());
        assert_eq!(ws.values().count(), 1);
        assert!(ws.remove(&a).is_some());
        assert!(ws.get(&a).is_none() && ws.values().next().is_none());
    }

    #[test]
    fn answer_timeouts_come_in_few_steps_and_never_later_than_asked_above_2_ms() {
        let ms = |us| answer_timeout_ms(Duration::from_micros(us));
        assert_eq!(ms(0), 1);
        assert_eq!(ms(999), 1);
        assert_eq!(ms(1_001), 2);
        assert_eq!(ms(2_500), 2);
        assert_eq!(ms(3_999), 2);
        assert_eq!(ms(4_000), 4);
        assert_eq!(ms(7_900), 4);
        assert_eq!(ms(40_000), 32);
        assert_eq!(ms(50_000), 50);
        assert_eq!(ms(u64::MAX), 50);
        let steps: std::collections::BTreeSet<u64> = (0..60_000).step_by(7).map(ms).collect();
        assert_eq!(
            steps.into_iter().collect::<Vec<_>>(),
            [1, 2, 4, 8, 16, 32, 50]
        );
        for us in (2_001..60_000).step_by(13) {
            assert!(ms(us) * 1000 <= us.max(2_000), "{us} µs -> {} ms", ms(us));
        }
    }
}
