//! Where the two threads of a run execute, and how they wait.

use std::io;
use std::thread;

use serde::{Deserialize, Serialize};

use crate::BenchError;

/// How a thread waits for the next datagram or stream bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Wait {
    /// Blocking receive (with a timeout): the thread sleeps in the kernel
    /// and is woken by the arrival.
    Block,
    /// Busy-poll: non-blocking receive attempts with
    /// [`std::hint::spin_loop`] between them, until data or the timeout.
    Spin,
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wait::Block => "block",
            Wait::Spin => "spin",
        })
    }
}

/// Which CPU each side of a run is pinned to (`None` = not pinned: the
/// thread keeps the affinity it inherited from the caller).
///
/// The "client" is the side that measures: the ping-pong client or the
/// blast sender. The "server" is the echo server or the blast receiver.
/// Runs start their own threads and pin those, so the calling thread's
/// affinity is never changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// CPU for the client / sender thread.
    pub client_cpu: Option<usize>,
    /// CPU for the server / receiver thread.
    pub server_cpu: Option<usize>,
}

impl Placement {
    /// Neither thread pinned.
    pub const UNPINNED: Placement = Placement {
        client_cpu: None,
        server_cpu: None,
    };

    /// Client on `client`, server on `server`.
    pub fn pinned(client: usize, server: usize) -> Placement {
        Placement {
            client_cpu: Some(client),
            server_cpu: Some(server),
        }
    }

    /// Client and server on the first two CPUs the calling thread may run
    /// on (both on the same CPU if only one is allowed).
    pub fn spread() -> Result<Placement, BenchError> {
        let cpus = current_affinity()?;
        let first = *cpus
            .first()
            .ok_or_else(|| BenchError::InvalidArgument("empty CPU affinity mask".into()))?;
        Ok(Placement::pinned(
            first,
            cpus.get(1).copied().unwrap_or(first),
        ))
    }

    /// Pins the calling thread as the client, if a client CPU is set.
    pub fn pin_client(&self) -> Result<(), BenchError> {
        self.client_cpu.map_or(Ok(()), pin_current_thread)
    }

    /// Pins the calling thread as the server, if a server CPU is set.
    pub fn pin_server(&self) -> Result<(), BenchError> {
        self.server_cpu.map_or(Ok(()), pin_current_thread)
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side =
            |c: Option<usize>| c.map_or_else(|| "unpinned".to_string(), |c| format!("CPU {c}"));
        write!(
            f,
            "client {}, server {}",
            side(self.client_cpu),
            side(self.server_cpu)
        )
    }
}

/// Number of CPUs a `cpu_set_t` can name.
const SETSIZE: usize = libc::CPU_SETSIZE as usize;

/// Pins the calling thread to `cpu` (sched_setaffinity on this thread).
///
/// Fails if `cpu` is beyond `CPU_SETSIZE` or not available to this process.
pub fn pin_current_thread(cpu: usize) -> Result<(), BenchError> {
    set_current_affinity(&[cpu])
}

/// Lets the calling thread run on exactly `cpus` (sched_setaffinity on
/// this thread), e.g. to restore what [`current_affinity`] returned.
///
/// Fails if a CPU is beyond `CPU_SETSIZE` or none is available.
pub fn set_current_affinity(cpus: &[usize]) -> Result<(), BenchError> {
    let cpu = cpus.first().copied().unwrap_or(SETSIZE);
    let pin_err = |source| BenchError::Pin { cpu, source };
    if cpus.is_empty() || cpus.iter().any(|&c| c >= SETSIZE) {
        return Err(pin_err(io::Error::from(io::ErrorKind::InvalidInput)));
    }
    // SAFETY: cpu_set_t is a plain bit array; all-zero bytes is the valid
    // empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: every `c < CPU_SETSIZE` was checked above, so CPU_SET
        // writes a bit inside `set`, which we own mutably.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid, initialised cpu_set_t and the size passed is
    // exactly its size; pid 0 means the calling thread. The kernel only
    // reads from the pointer.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(pin_err(io::Error::last_os_error()));
    }
    Ok(())
}

/// The CPUs the calling thread may run on, ascending (sched_getaffinity).
pub fn current_affinity() -> Result<Vec<usize>, BenchError> {
    // SAFETY: all-zero bytes is a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of exactly the size passed;
    // pid 0 means the calling thread.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(BenchError::io("sched_getaffinity")(
            io::Error::last_os_error(),
        ));
    }
    Ok((0..SETSIZE)
        // SAFETY: every index is < CPU_SETSIZE, so CPU_ISSET reads a bit
        // inside `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Runs the two sides of a run on two new scoped threads, each pinned per
/// `placement` before `client` / `server` is called, and joins both.
pub(crate) fn run_pair<C, S, TC, TS>(
    placement: Placement,
    client: C,
    server: S,
) -> (Result<TC, BenchError>, Result<TS, BenchError>)
where
    C: FnOnce() -> Result<TC, BenchError> + Send,
    S: FnOnce() -> Result<TS, BenchError> + Send,
    TC: Send,
    TS: Send,
{
    thread::scope(|s| {
        let srv = thread::Builder::new()
            .name("bench-server".into())
            .spawn_scoped(s, move || {
                placement.pin_server()?;
                server()
            });
        let cli = thread::Builder::new()
            .name("bench-client".into())
            .spawn_scoped(s, move || {
                placement.pin_client()?;
                client()
            });
        (join_named(cli, "client"), join_named(srv, "server"))
    })
}

/// Joins a thread that may not have started, turning a panic into
/// [`BenchError::Panicked`].
fn join_named<T>(
    h: io::Result<thread::ScopedJoinHandle<'_, Result<T, BenchError>>>,
    who: &'static str,
) -> Result<T, BenchError> {
    match h {
        Ok(h) => h.join().unwrap_or(Err(BenchError::Panicked(who))),
        Err(e) => Err(BenchError::io("spawning thread")(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_and_pinning() {
        let cpus = current_affinity().expect("getaffinity");
        assert!(!cpus.is_empty());
        let target = *cpus.last().expect("non-empty");
        // Pin a fresh thread so the test harness thread is untouched.
        let seen = thread::spawn(move || {
            pin_current_thread(target)?;
            current_affinity()
        })
        .join()
        .expect("thread");
        assert_eq!(seen.expect("pinned"), vec![target]);
        assert!(matches!(
            pin_current_thread(SETSIZE),
            Err(BenchError::Pin { .. })
        ));
        // A CPU outside the allowed mask is refused by the kernel, if any
        // such CPU number exists below CPU_SETSIZE.
        if let Some(bad) = (0..SETSIZE).find(|c| !cpus.contains(c)) {
            let r = thread::spawn(move || pin_current_thread(bad))
                .join()
                .expect("thread");
            assert!(matches!(r, Err(BenchError::Pin { .. })), "{r:?}");
        }
    }

    #[test]
    fn placement_pins_its_own_threads() {
        let p = Placement::spread().expect("spread");
        let before = current_affinity().expect("aff");
        let (c, s) = run_pair(p, current_affinity, current_affinity);
        assert_eq!(c.expect("client"), vec![p.client_cpu.expect("set")]);
        assert_eq!(s.expect("server"), vec![p.server_cpu.expect("set")]);
        assert_eq!(current_affinity().expect("aff"), before);
        let (c, _) = run_pair(Placement::UNPINNED, current_affinity, || Ok(()));
        assert_eq!(c.expect("client"), before);
        assert_eq!(p.to_string().matches("CPU").count(), 2);
        assert_eq!(Wait::Spin.to_string(), "spin");
    }

    #[test]
    fn panics_become_errors() {
        let (c, s) = run_pair(
            Placement::UNPINNED,
            || -> Result<(), BenchError> { panic!("boom") },
            || Ok(1),
        );
        assert!(matches!(c, Err(BenchError::Panicked("client"))));
        assert_eq!(s.expect("server"), 1);
    }
}
