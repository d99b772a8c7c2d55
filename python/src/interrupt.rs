//! Ctrl-C during a blocking call of the main thread.
//!
//! A vkernel call blocks in the kernel's own waits, which look again when
//! a signal interrupts them, so Python's SIGINT handler runs (at the C
//! level) but the call never returns to let it raise. Waking every few
//! milliseconds to ask Python would cost every idle program wake-ups, and
//! a blocked call cannot be withdrawn from outside the kernel: so this
//! module ends the call the way V ends one, by the IPC itself.
//!
//! A C handler chained in front of Python's SIGINT handler (which still
//! runs first) wakes a watcher thread through an eventfd. If the main
//! thread is in a call, a thread made for this ends it:
//! - a Receive gets a *wake* message (a random token only this program
//!   knows) from a process made for the purpose; the binding answers it,
//!   runs Python's handlers (`check_signals`: KeyboardInterrupt) and, if
//!   they raise nothing, receives again, as Python retries a system call
//!   after a signal (PEP 475). Nothing is lost: a message that came first
//!   is returned, and a late wake message is answered and skipped by the
//!   next Receive.
//! - any other call (a Send awaiting its reply, a move, a lookup) cannot
//!   be withdrawn, so its process is destroyed once the call has lasted
//!   [`GRACE`]. Its exchange ends as when any process dies; Python's
//!   handlers run, and the call fails with their exception
//!   (KeyboardInterrupt) or, if they raise none, with code 14
//!   (destroyed), as does every later call of that `Process`.
//!
//! No thread of this module takes the GIL: one that did could be stopped
//! by the interpreter's shutdown in the middle of Rust code.
//!
//! Our handler is put back in front whenever a main-thread call finds
//! Python's reinstalled (`signal.signal(SIGINT, ...)` replaces it); with
//! SIGINT ignored or default there is nothing to chain.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use vkernel::{Message, Pid};

/// The kernel a process belongs to, as the watcher reaches it.
pub(crate) type KernelCell = Mutex<Option<vkernel::Kernel>>;

/// How long a non-Receive call must have lasted before Ctrl-C destroys
/// its process: a call about to end is left to end.
const GRACE: Duration = Duration::from_millis(20);

/// How long a wake message waits to be received before it is withdrawn.
const WAKE_WAIT: Duration = Duration::from_secs(10);

/// The request code of a wake message (its words 1-4 hold the token).
const WAKE_CODE: u32 = 0x00ff_fe1c;

/// What kind of call the main thread is in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Never blocks for long: left alone.
    Quick,
    /// A Receive: woken by a message.
    Receive,
    /// May block (Send, moves, lookups): its process is destroyed.
    Block,
}

/// The main thread's call in progress.
#[derive(Clone)]
struct Call {
    serial: u64,
    pid: Pid,
    kind: Kind,
    since: Instant,
    kernel: Weak<KernelCell>,
    hit: Arc<AtomicBool>,
}

static CURRENT: Mutex<Option<Call>> = Mutex::new(None);
static SERIAL: AtomicU64 = AtomicU64::new(0);
/// `threading.main_thread().ident` (a pthread_t), set when the module loads.
static MAIN: AtomicU64 = AtomicU64::new(0);
/// The eventfd our handler signals (-1 until the watcher runs).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The handler ours runs first, and whether it takes three arguments.
static CHAINED: AtomicUsize = AtomicUsize::new(0);
static CHAINED_SIGINFO: AtomicBool = AtomicBool::new(false);
/// Held while a watcher starts.
static STARTING: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes which thread is Python's main thread (the one KeyboardInterrupt
/// is raised in).
pub(crate) fn init(py: Python<'_>) -> PyResult<()> {
    let ident: u64 = py
        .import("threading")?
        .call_method0("main_thread")?
        .getattr("ident")?
        .extract()?;
    MAIN.store(ident, Ordering::Relaxed);
    // SAFETY: `forked` only stores to atomics and closes a descriptor.
    unsafe { libc::pthread_atfork(None, None, Some(forked)) };
    Ok(())
}

/// In a forked child: the watcher thread did not come along, and the
/// eventfd is the parent's (a SIGINT of the child must not wake the
/// parent's watcher). The child's next call starts its own.
extern "C" fn forked() {
    let fd = WAKE_FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: the descriptor is ours and nothing in this process
        // reads it any more.
        unsafe { libc::close(fd) };
    }
}

fn on_main_thread() -> bool {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    me == MAIN.load(Ordering::Relaxed)
}

/// The wake message's token: random, so no other program's message
/// passes for one.
fn token() -> &'static [u32; 4] {
    static T: OnceLock<[u32; 4]> = OnceLock::new();
    T.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut t = [0u32; 4];
        for pair in t.chunks_mut(2) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            let v = h.finish();
            pair[0] = v as u32;
            pair[1] = (v >> 32) as u32;
        }
        t
    })
}

/// True if `m` is a wake message of this program.
pub(crate) fn is_wake(m: &Message) -> bool {
    m.code() == WAKE_CODE && m.0[1..5] == token()[..]
}

fn wake_message() -> Message {
    let mut m = Message::zero();
    m.0[0] = WAKE_CODE;
    m.0[1..5].copy_from_slice(token());
    m
}

/// Marks the main thread's call in progress until dropped.
pub(crate) struct Guard {
    serial: u64,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut c = lock(&CURRENT);
        if c.as_ref().is_some_and(|c| c.serial == self.serial) {
            *c = None;
        }
    }
}

/// Notes the call `pid` is about to make, if this is the main thread and
/// the call may block; `hit` is set if Ctrl-C destroys the process.
pub(crate) fn enter(
    kind: Kind,
    pid: u32,
    kernel: &Weak<KernelCell>,
    hit: &Arc<AtomicBool>,
) -> Option<Guard> {
    if kind == Kind::Quick || !on_main_thread() || !chain_handler() {
        return None;
    }
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    *lock(&CURRENT) = Some(Call {
        serial,
        pid: Pid(pid),
        kind,
        since: Instant::now(),
        kernel: kernel.clone(),
        hit: hit.clone(),
    });
    Some(Guard { serial })
}

/// Puts our handler in front of SIGINT's if Python's is there; false if
/// SIGINT has no handler to chain (ignored or default) or the watcher
/// cannot run.
fn chain_handler() -> bool {
    // SAFETY: a zeroed sigaction is a valid out-parameter; querying
    // changes nothing.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `cur`.
    if unsafe { libc::sigaction(libc::SIGINT, std::ptr::null(), &mut cur) } != 0 {
        return false;
    }
    let ours = on_sigint as *const () as usize;
    if cur.sa_sigaction == ours {
        // (A forked child inherits the handler, not the watcher.)
        return start_watcher();
    }
    if cur.sa_sigaction == libc::SIG_DFL || cur.sa_sigaction == libc::SIG_IGN {
        return false;
    }
    if !start_watcher() {
        return false;
    }
    CHAINED_SIGINFO.store(cur.sa_flags & libc::SA_SIGINFO != 0, Ordering::SeqCst);
    CHAINED.store(cur.sa_sigaction, Ordering::SeqCst);
    let mut act = cur;
    act.sa_sigaction = ours;
    act.sa_flags |= libc::SA_SIGINFO;
    // SAFETY: `act` is the current action with our handler, which calls
    // the one it replaces and then only async-signal-safe functions.
    unsafe { libc::sigaction(libc::SIGINT, &act, std::ptr::null_mut()) == 0 }
}

/// Our SIGINT handler: Python's first, then the watcher's eventfd.
extern "C" fn on_sigint(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is this thread's; it is put back before returning, as
    // a handler must.
    let errno = unsafe { *libc::__errno_location() };
    let f = CHAINED.load(Ordering::SeqCst);
    if f != 0 {
        if CHAINED_SIGINFO.load(Ordering::SeqCst) {
            // SAFETY: `f` was installed with SA_SIGINFO, so it has this
            // signature; it gets what the kernel gave us.
            let h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(f) };
            h(sig, info, ctx);
        } else {
            // SAFETY: `f` was installed without SA_SIGINFO: one argument.
            let h: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
            h(sig);
        }
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; `one` outlives the call.
        let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Starts the watcher thread unless it runs; false if it could not start.
fn start_watcher() -> bool {
    if WAKE_FD.load(Ordering::SeqCst) >= 0 {
        return true;
    }
    let _one = lock(&STARTING);
    if WAKE_FD.load(Ordering::SeqCst) >= 0 {
        return true;
    }
    // SAFETY: eventfd has no memory preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    let started = std::thread::Builder::new()
        .name("vk-ctrl-c".into())
        .spawn(move || watch(fd));
    if started.is_err() {
        // SAFETY: the descriptor was just made and is used by no one.
        unsafe { libc::close(fd) };
        return false;
    }
    WAKE_FD.store(fd, Ordering::SeqCst);
    true
}

/// Waits (blocked, no timeout) for our handler to signal, then ends the
/// main thread's call, if any.
fn watch(fd: libc::c_int) {
    loop {
        let mut n: u64 = 0;
        // SAFETY: `n` is 8 writable bytes; a blocking eventfd read waits
        // for a signal.
        let r = unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
        if r != 8 {
            // (Interrupted: by SIGINT itself, when it lands on this thread.)
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let call = lock(&CURRENT).clone();
        if let Some(c) = call {
            // Its own thread: a wake message waits for its answer.
            let _ = std::thread::Builder::new()
                .name("vk-interrupt".into())
                .spawn(move || end(c));
        }
    }
}

/// Ends the call `c` (see the module's notes).
fn end(c: Call) {
    let Some(kernel) = c.kernel.upgrade() else {
        return;
    };
    let q = match lock(&kernel).as_ref().map(|k| k.create_process()) {
        Some(Ok(q)) => q,
        _ => return,
    };
    drop(kernel);
    match c.kind {
        Kind::Receive => {
            let _ = q.send_within(&mut wake_message(), c.pid, Some(WAKE_WAIT));
        }
        _ => {
            std::thread::sleep(GRACE.saturating_sub(c.since.elapsed()));
            // Under the lock: the call cannot end and another begin
            // between the look and the destruction.
            let cur = lock(&CURRENT);
            if cur.as_ref().is_some_and(|x| x.serial == c.serial) {
                c.hit.store(true, Ordering::SeqCst);
                let _ = q.destroy(c.pid);
            }
        }
    }
}
