//! Thin safe wrappers over the few Linux calls the runtime needs: eventfd,
//! poll, socket buffer sizes and CPU affinity.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An eventfd used to wake a thread blocked in [`poll2`].
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new non-blocking, close-on-exec eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a negative return is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the eventfd readable (wakes a poller).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own descriptor.
        // A failure (counter overflow) still leaves the fd readable.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
    }

    /// Resets the eventfd to unreadable.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a valid u64; non-blocking fd.
        unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut v as *mut u64).cast::<libc::c_void>(),
                8,
            )
        };
    }

    /// The raw descriptor, for [`poll2`].
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// The descriptor, borrowed (for an epoll set).
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.0.as_fd()
    }
}

/// Waits until `a` or `b` (if given) is readable, or `timeout` passes.
/// Returns (a readable, b readable).
pub fn poll2(a: RawFd, b: Option<RawFd>, timeout: Duration) -> (bool, bool) {
    let r = poll3(a, b, None, timeout);
    (r[0], r[1])
}

/// Like [`poll2`] with up to three descriptors (absent ones are skipped).
pub fn poll3(a: RawFd, b: Option<RawFd>, c: Option<RawFd>, timeout: Duration) -> [bool; 3] {
    let pfd = |fd: RawFd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // A negative fd is ignored by ppoll.
    let mut fds = [pfd(a), pfd(b.unwrap_or(-1)), pfd(c.unwrap_or(-1))];
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as _,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    let n: libc::nfds_t = if c.is_some() {
        3
    } else if b.is_some() {
        2
    } else {
        1
    };
    // SAFETY: `fds` holds at least `n` valid pollfd entries and `ts` is a
    // valid timespec, both live for the call; the sigmask is null.
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), n, &ts, std::ptr::null()) };
    if r <= 0 {
        return [false; 3];
    }
    fds.map(|f| f.revents & libc::POLLIN != 0)
}

pub(crate) fn setsockopt_int(fd: RawFd, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn getsockopt_int(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and sized for a c_int option.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// The credentials of a Unix socket's peer (SO_PEERCRED).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerCred {
    /// The peer's pid as this process's PID namespace sees it; `None` when
    /// the peer is in a namespace this one cannot see (the kernel says 0).
    pub pid: Option<u32>,
    /// The peer's uid, mapped into this process's user namespace.
    pub uid: u32,
}

/// Reads SO_PEERCRED. Written here rather than taken from rustix, whose
/// `UCred` holds the pid as non-zero: a peer in another PID namespace
/// (a container) has pid 0, and must still be served.
pub(crate) fn peer_cred(fd: RawFd) -> io::Result<PeerCred> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are live and sized for a ucred.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: u32::try_from(c.pid).ok().filter(|&p| p != 0),
        uid: c.uid,
    })
}

/// Sets receive and send buffers to `bytes` (forcing past the sysctl limit
/// when privileged). Returns the receive buffer size granted.
pub fn set_socket_buffers(fd: RawFd, bytes: usize) -> usize {
    let v = bytes.min(i32::MAX as usize / 2) as libc::c_int;
    if setsockopt_int(fd, libc::SO_RCVBUFFORCE, v).is_err() {
        let _ = setsockopt_int(fd, libc::SO_RCVBUF, v);
    }
    if setsockopt_int(fd, libc::SO_SNDBUFFORCE, v).is_err() {
        let _ = setsockopt_int(fd, libc::SO_SNDBUF, v);
    }
    getsockopt_int(fd, libc::SO_RCVBUF).map_or(0, |v| v.max(0) as usize)
}

/// Enables sending to broadcast addresses.
pub fn set_broadcast(fd: RawFd) -> io::Result<()> {
    setsockopt_int(fd, libc::SO_BROADCAST, 1)
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: CPU_SET writes within `set`: `cpu` is below CPU_SETSIZE
    // (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: passes a valid cpu_set_t of the size given; pid 0 = this thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Number of online CPUs (independent of the caller's affinity mask).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

/// CPU time consumed by the calling thread.
pub fn thread_cpu_time() -> Duration {
    // SAFETY: timespec is plain data; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.max(0) as u32)
}

/// The machine's 1-minute load average (0 if unavailable).
pub fn load_average() -> f64 {
    let mut v = [0f64; 1];
    // SAFETY: `v` has room for the one sample asked for.
    let n = unsafe { libc::getloadavg(v.as_mut_ptr(), 1) };
    if n == 1 && v[0].is_finite() {
        v[0].max(0.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn peer_cred_names_the_process_at_the_other_end() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let c = peer_cred(a.as_raw_fd()).unwrap();
        assert_eq!(c.pid, Some(std::process::id()));
        // SAFETY: getuid has no preconditions.
        assert_eq!(c.uid, unsafe { libc::getuid() });
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(peer_cred(file.as_raw_fd()).is_err(), "not a socket");
    }

    #[test]
    fn eventfd_wakes_poll() {
        let e = EventFd::new().unwrap();
        let (r, _) = poll2(e.fd(), None, Duration::from_millis(1));
        assert!(!r);
        e.signal();
        let (r, _) = poll2(e.fd(), None, Duration::from_millis(100));
        assert!(r);
        e.drain();
        let (r, _) = poll2(e.fd(), None, Duration::from_millis(1));
        assert!(!r);
    }

    #[test]
    fn poll_sees_socket_and_buffers_set() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = EventFd::new().unwrap();
        let granted = set_socket_buffers(a.as_raw_fd(), 1 << 20);
        assert!(granted > 0);
        set_broadcast(b.as_raw_fd()).unwrap();
        b.send_to(b"x", a.local_addr().unwrap()).unwrap();
        let (sock, ev) = poll2(a.as_raw_fd(), Some(e.fd()), Duration::from_secs(2));
        assert!(sock);
        assert!(!ev);
    }

    #[test]
    fn pin_and_cpu_time() {
        assert!(online_cpus() >= 1);
        pin_to_cpu(0).unwrap();
        assert!(pin_to_cpu(usize::MAX).is_err());
        let t0 = thread_cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(thread_cpu_time() > t0);
    }

    #[test]
    fn load_average_is_a_plausible_number() {
        let l = load_average();
        assert!((0.0..10_000.0).contains(&l), "{l}");
    }

    #[test]
    fn poll3_reports_which_descriptor_is_ready() {
        let (a, b, c) = (
            EventFd::new().unwrap(),
            EventFd::new().unwrap(),
            EventFd::new().unwrap(),
        );
        c.signal();
        let r = poll3(
            a.fd(),
            Some(b.fd()),
            Some(c.fd()),
            Duration::from_millis(100),
        );
        assert_eq!(r, [false, false, true]);
        assert_eq!(
            poll3(a.fd(), None, None, Duration::from_millis(1)),
            [false; 3]
        );
    }
}
