//! The C ABI of vkernel: start or attach a kernel, create processes, and
//! Send/Receive/Reply with segments, Forward, MoveTo/MoveFrom, names and
//! groups, from C (or anything that calls C).
//!
//! Conventions (see include/vkernel.h, generated from this file):
//! - Every call that can fail returns 0 or a positive `VK_E*` code: the
//!   codes of `IpcError::code` (1 `VK_ENOSUCHPROCESS` … 19 `VK_EHOSTLOST`),
//!   then this library's own (`VK_EINVAL` and up). `vk_strerror` names a
//!   code; `vk_last_error` describes the calling thread's last failure.
//! - No Rust panic crosses the boundary: one becomes `VK_EPANIC`.
//! - A `vk_kernel` may be shared by threads; a `vk_process` must be used
//!   by one thread at a time (it may move between threads).
//! - Pointers are borrowed for the call only; objects returned through
//!   `out` parameters are freed with the matching `vk_*_free`.

#![allow(clippy::missing_safety_doc)] // each function's doc says what it needs
#![allow(non_camel_case_types)] // C names, as the header spells them
#![warn(clippy::undocumented_unsafe_blocks)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use vkernel::{IpcError, Kernel, KernelConfig, Message, Pid, Process, Scope, Segment};

/// A 32-byte V message: eight 32-bit words (word 0 holds the request
/// code in its low 24 bits and flags in its high byte).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct vk_message {
    /// The words.
    pub w: [u32; 8],
}

/// What a Receive returns besides the message.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct vk_incoming {
    /// The sender (the original sender after a Forward).
    pub from: u32,
    /// Bytes of the sender's segment copied into the receive buffer.
    pub seg_bytes: u32,
    /// The process that forwarded it (`from` if not forwarded).
    pub forwarder: u32,
    /// The sender's principal (0: none).
    pub principal: u32,
}

/// What a Send returns besides the reply message.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct vk_reply_info {
    /// The process that replied.
    pub from: u32,
    /// Bytes the replier wrote into the segment with the reply.
    pub seg_bytes: u32,
}

/// A kernel: an embedded logical host, or an attachment to a machine
/// host.
pub struct vk_kernel {
    k: Kernel,
}

/// A V process of a kernel.
pub struct vk_process {
    p: Process,
}

/// Scopes of names (`vk_set_pid`, `vk_get_pid`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum vk_scope {
    /// This logical host only.
    VK_SCOPE_LOCAL = 0,
    /// Other logical hosts only.
    VK_SCOPE_REMOTE = 1,
    /// Both (this host first).
    VK_SCOPE_ANY = 2,
}

/// What a segment lets the receiver do.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum vk_access {
    /// The receiver may read it (MoveFrom, appended to the message).
    VK_SEG_READ = 1,
    /// The receiver may write it (MoveTo, reply data).
    VK_SEG_WRITE = 2,
    /// Both.
    VK_SEG_READ_WRITE = 3,
}

/// Word 0 of a message: the request code.
pub const VK_CODE_MASK: u32 = 0x00ff_ffff;
/// Word 0 of a message: it carries a segment (words 6 and 7 describe it).
pub const VK_FLAG_SEGMENT: u32 = 0x8000_0000;
/// Word 0 of a message: the segment may be read by the receiver.
pub const VK_FLAG_SEG_READ: u32 = 0x4000_0000;
/// Word 0 of a message: the segment may be written by the receiver.
pub const VK_FLAG_SEG_WRITE: u32 = 0x2000_0000;
// (Literals, for the header; the same as the Rust crate's.)
const _: () = assert!(
    VK_FLAG_SEGMENT == vkernel::message::SEGMENT
        && VK_FLAG_SEG_READ == vkernel::message::SEG_READ
        && VK_FLAG_SEG_WRITE == vkernel::message::SEG_WRITE
);

/// The process does not exist.
pub const VK_ENOSUCHPROCESS: c_int = 1;
/// The process's host did not answer (timeout).
pub const VK_ETIMEOUT: c_int = 2;
/// The process is not awaiting a reply from the caller.
pub const VK_ENOTAWAITINGREPLY: c_int = 3;
/// The segment does not grant this access.
pub const VK_EACCESS: c_int = 4;
/// An access outside the segment.
pub const VK_EOUTOFBOUNDS: c_int = 5;
/// The segment is too large.
pub const VK_ESEGMENTTOOLARGE: c_int = 6;
/// Not a valid process id.
pub const VK_EINVALIDPID: c_int = 7;
/// The caller is not a process of this logical host.
pub const VK_ENOTAPROCESS: c_int = 8;
/// The process is already blocked in an operation.
pub const VK_EBUSY: c_int = 9;
/// The logical host id is not yet allocated.
pub const VK_ENOHOSTID: c_int = 10;
/// The process table is full.
pub const VK_ETABLEFULL: c_int = 11;
/// Out of file descriptors.
pub const VK_ENODESCRIPTORS: c_int = 12;
/// The remote kernel has no resources.
pub const VK_ENORESOURCES: c_int = 13;
/// The process was destroyed.
pub const VK_EDESTROYED: c_int = 14;
/// Group ids are not supported by this operation.
pub const VK_EGROUPUNSUPPORTED: c_int = 15;
/// Refused as malformed.
pub const VK_EREFUSED: c_int = 16;
/// No reply within the deadline.
pub const VK_EDEADLINE: c_int = 17;
/// The kernel shut down.
pub const VK_ESHUTDOWN: c_int = 18;
/// The machine host has gone (attach again).
pub const VK_EHOSTLOST: c_int = 19;
/// A bad argument: a null pointer, text that is not UTF-8, an address
/// that does not parse.
pub const VK_EINVAL: c_int = 100;
/// The kernel could not start or attach (see `vk_last_error`).
pub const VK_ESTART: c_int = 101;
/// A bug: the library panicked (see `vk_last_error`).
pub const VK_EPANIC: c_int = 102;
/// A buffer given for text is too small (the text is truncated).
pub const VK_ERANGE: c_int = 103;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// A failure: a code and what to tell `vk_last_error`.
struct Fail(c_int, String);

impl From<IpcError> for Fail {
    fn from(e: IpcError) -> Fail {
        Fail(e.code().0 as c_int, e.to_string())
    }
}

fn inval(what: &str) -> Fail {
    Fail(VK_EINVAL, what.to_string())
}

/// Runs `f`, turning its failure or panic into a code.
fn guard(f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(Fail(c, m))) => {
            remember(&m);
            c
        }
        Err(p) => {
            let m = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            remember(&format!("vkernel panicked: {m}"));
            VK_EPANIC
        }
    }
}

/// `ptr` as a reference, or `VK_EINVAL`.
///
/// # Safety
/// `ptr` is null or points to a live `T` not mutated elsewhere meanwhile.
unsafe fn r<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: non-null pointers are valid by the caller's contract.
    unsafe { ptr.as_ref() }.ok_or_else(|| inval(&format!("{what} is NULL")))
}

/// `ptr` as a mutable reference, or `VK_EINVAL`.
///
/// # Safety
/// `ptr` is null or points to a live `T` used by no one else meanwhile.
unsafe fn m<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Fail> {
    // SAFETY: as in `r`, exclusively.
    unsafe { ptr.as_mut() }.ok_or_else(|| inval(&format!("{what} is NULL")))
}

/// Optional text: NULL is `None`.
///
/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<Option<&'a str>, Fail> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: a NUL-terminated string by the caller's contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map(Some)
        .map_err(|_| inval(&format!("{what} is not UTF-8")))
}

/// `len` bytes at `ptr` (an empty slice for length 0, whatever `ptr`).
///
/// # Safety
/// `ptr` is valid for reads of `len` bytes when `len > 0`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(inval("a buffer is NULL"));
    }
    // SAFETY: valid for `len` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// `len` writable bytes at `ptr`.
///
/// # Safety
/// `ptr` is valid for reads and writes of `len` bytes when `len > 0`, and
/// not used elsewhere during the call.
unsafe fn bytes_mut<'a>(ptr: *mut u8, len: usize) -> Result<&'a mut [u8], Fail> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(inval("a buffer is NULL"));
    }
    // SAFETY: valid and exclusive for `len` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// A `vk_scope` value from C (an int: any value may arrive).
fn scope(s: c_int) -> Result<Scope, Fail> {
    match s {
        x if x == vk_scope::VK_SCOPE_LOCAL as c_int => Ok(Scope::Local),
        x if x == vk_scope::VK_SCOPE_REMOTE as c_int => Ok(Scope::Remote),
        x if x == vk_scope::VK_SCOPE_ANY as c_int => Ok(Scope::Any),
        _ => Err(inval(&format!("scope {s} is not a vk_scope"))),
    }
}

/// Starts an embedded kernel: this program is its own logical host.
/// `bind` is the UDP address to bind (NULL: any port on 127.0.0.1, which
/// only this machine reaches, or on 0.0.0.0 when a peer is on another
/// machine, so that it can answer); `peers`
/// a comma-separated list of other hosts as `HOST:PORT` (NULL: none),
/// HOST an IP address or a DNS name standing for all its addresses
/// (looked up again every 10 s; one that does not resolve yet is
/// retried). On
/// success `*out` holds the kernel, freed with `vk_kernel_free`.
///
/// # Safety
/// `bind` and `peers` are NULL or NUL-terminated; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn vk_start(
    bind: *const c_char,
    peers: *const c_char,
    out: *mut *mut vk_kernel,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let out = unsafe { m(out, "out") }?;
        let mut cfg = KernelConfig::default();
        let mut specs = Vec::new();
        // SAFETY: as the function's contract says.
        if let Some(ps) = unsafe { text(peers, "peers") }? {
            for p in ps.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let spec = vkernel::PeerSpec::parse(p).map_err(|e| inval(&format!("peer: {e}")))?;
                match spec.clone() {
                    vkernel::PeerSpec::Addr(a) => cfg.peers.push(a),
                    name => cfg.named_peers.push(name),
                }
                specs.push(spec);
            }
        }
        // SAFETY: as the function's contract says.
        cfg.bind = match unsafe { text(bind, "bind") }? {
            Some(b) => b
                .parse()
                .map_err(|_| inval(&format!("bind address {b:?} does not parse")))?,
            None => vkernel::default_bind(&specs),
        };
        let k = Kernel::start(cfg).map_err(|e| Fail(VK_ESTART, e.to_string()))?;
        *out = Box::into_raw(Box::new(vk_kernel { k }));
        Ok(())
    })
}

/// Attaches to the machine host at `path` (NULL: `$VKERNEL_HOST`, else
/// the default socket): this program's processes are that host's.
///
/// # Safety
/// `path` is NULL or NUL-terminated; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn vk_attach(path: *const c_char, out: *mut *mut vk_kernel) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let out = unsafe { m(out, "out") }?;
        // SAFETY: as the function's contract says.
        let k = match unsafe { text(path, "path") }? {
            Some(p) => Kernel::attach(p),
            None => Kernel::attach_default(),
        }
        .map_err(|e| Fail(VK_ESTART, e.to_string()))?;
        *out = Box::into_raw(Box::new(vk_kernel { k }));
        Ok(())
    })
}

/// Stops (or detaches) a kernel and frees it; its processes' calls fail
/// from then on. NULL is ignored.
///
/// # Safety
/// `k` is NULL or came from `vk_start`/`vk_attach` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn vk_kernel_free(k: *mut vk_kernel) {
    if !k.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: ownership returns from the caller, once.
            drop(unsafe { Box::from_raw(k) });
        }));
    }
}

/// The kernel's logical host id (0 if `k` is NULL).
///
/// # Safety
/// `k` is NULL or a live kernel.
#[no_mangle]
pub unsafe extern "C" fn vk_host_id(k: *const vk_kernel) -> u16 {
    // SAFETY: as the function's contract says.
    unsafe { k.as_ref() }.map_or(0, |k| k.k.host_id().0)
}

/// Writes the kernel's UDP address as text (NUL-terminated) into `buf`.
///
/// # Safety
/// `k` is a live kernel; `buf` is valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn vk_local_addr(k: *const vk_kernel, buf: *mut c_char, len: usize) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let k = unsafe { r(k, "kernel") }?;
        // SAFETY: as the function's contract says.
        let b = unsafe { bytes_mut(buf.cast(), len) }?;
        copy_text(&k.k.local_addr().to_string(), b)
    })
}

fn copy_text(s: &str, b: &mut [u8]) -> Result<(), Fail> {
    if b.is_empty() {
        return Err(Fail(VK_ERANGE, "no room for the text".into()));
    }
    let n = s.len().min(b.len() - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    b[n] = 0;
    if n < s.len() {
        return Err(Fail(
            VK_ERANGE,
            format!("{} bytes of text, room for {n}", s.len()),
        ));
    }
    Ok(())
}

/// The kernel's statistics as JSON, to free with `vk_string_free` (NULL
/// if `k` is NULL).
///
/// # Safety
/// `k` is NULL or a live kernel.
#[no_mangle]
pub unsafe extern "C" fn vk_stats_json(k: *const vk_kernel) -> *mut c_char {
    // SAFETY: as the function's contract says.
    let Some(k) = (unsafe { k.as_ref() }) else {
        return std::ptr::null_mut();
    };
    catch_unwind(AssertUnwindSafe(|| {
        CString::new(k.k.stats_json()).map_or(std::ptr::null_mut(), CString::into_raw)
    }))
    .unwrap_or(std::ptr::null_mut())
}

/// Frees text this library returned. NULL is ignored.
///
/// # Safety
/// `s` is NULL or came from this library and is not used again.
#[no_mangle]
pub unsafe extern "C" fn vk_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: ownership returns from the caller, once.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// Creates a process of the kernel.
///
/// # Safety
/// `k` is a live kernel; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn vk_process_create(
    k: *const vk_kernel,
    out: *mut *mut vk_process,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let k = unsafe { r(k, "kernel") }?;
        // SAFETY: as the function's contract says.
        let out = unsafe { m(out, "out") }?;
        let p = k.k.create_process()?;
        *out = Box::into_raw(Box::new(vk_process { p }));
        Ok(())
    })
}

/// Destroys a process and frees it. NULL is ignored.
///
/// # Safety
/// `p` is NULL or came from `vk_process_create` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn vk_process_free(p: *mut vk_process) {
    if !p.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: ownership returns from the caller, once.
            drop(unsafe { Box::from_raw(p) });
        }));
    }
}

/// The process's pid (0 if `p` is NULL).
///
/// # Safety
/// `p` is NULL or a live process.
#[no_mangle]
pub unsafe extern "C" fn vk_pid(p: *const vk_process) -> u32 {
    // SAFETY: as the function's contract says.
    unsafe { p.as_ref() }.map_or(0, |p| p.p.pid().0)
}

/// How the process waits: spin up to `micros` then block (`adaptive` ≠ 0:
/// spin only while spinning pays, up to `micros`).
///
/// # Safety
/// `p` is a live process.
#[no_mangle]
pub unsafe extern "C" fn vk_set_spin(p: *mut vk_process, micros: u32, adaptive: c_int) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let p = unsafe { r(p, "process") }?;
        let d = Duration::from_micros(u64::from(micros));
        if adaptive != 0 {
            p.p.set_spin_auto(d);
        } else {
            p.p.set_spin(d);
        }
        Ok(())
    })
}

/// Sends `*msg` to `to` and waits for the reply, which replaces `*msg`.
/// `reply` (may be NULL) receives who replied.
///
/// # Safety
/// `p` is a live process; `msg` is valid; `reply` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn vk_send(
    p: *mut vk_process,
    msg: *mut vk_message,
    to: u32,
    reply: *mut vk_reply_info,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { vk_send_within(p, msg, to, 0, reply) }
}

/// [`vk_send`] that fails with `VK_EDEADLINE` if no reply came within
/// `deadline_us` microseconds (0: the process's own deadline, none unless
/// the kernel was configured with one, as `vk_send`).
///
/// # Safety
/// As for `vk_send`.
#[no_mangle]
pub unsafe extern "C" fn vk_send_within(
    p: *mut vk_process,
    msg: *mut vk_message,
    to: u32,
    deadline_us: u64,
    reply: *mut vk_reply_info,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, msg) = unsafe { (r(p, "process")?, m(msg, "msg")?) };
        let mut mm = Message(msg.w);
        let d = match deadline_us {
            0 => p.p.send_deadline(),
            us => Some(std::time::Duration::from_micros(us)),
        };
        let rep = p.p.send_within(&mut mm, Pid(to), d)?;
        msg.w = mm.0;
        // SAFETY: as the function's contract says.
        unsafe { put_reply(reply, &rep) };
        Ok(())
    })
}

/// Sends with a segment of `len` bytes at `seg` that the receiver may
/// access as `access` (a `vk_access`) says while this process awaits the
/// reply.
///
/// # Safety
/// `p` is a live process; `msg` is valid; `seg` is valid for reads and
/// writes of `len` bytes; `reply` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn vk_send_segment(
    p: *mut vk_process,
    msg: *mut vk_message,
    to: u32,
    seg: *mut u8,
    len: usize,
    access: c_int,
    reply: *mut vk_reply_info,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, msg) = unsafe { (r(p, "process")?, m(msg, "msg")?) };
        // SAFETY: as the function's contract says.
        let buf = unsafe { bytes_mut(seg, len) }?;
        let s = match access {
            x if x == vk_access::VK_SEG_READ as c_int => Segment::Read(buf),
            x if x == vk_access::VK_SEG_WRITE as c_int => Segment::Write(buf),
            x if x == vk_access::VK_SEG_READ_WRITE as c_int => Segment::ReadWrite(buf),
            _ => return Err(inval(&format!("access {access} is not a vk_access"))),
        };
        let mut mm = Message(msg.w);
        let rep = p.p.send_with_segment(&mut mm, Pid(to), s)?;
        msg.w = mm.0;
        // SAFETY: as the function's contract says.
        unsafe { put_reply(reply, &rep) };
        Ok(())
    })
}

/// Writes `i` to `info` unless it is NULL.
///
/// # Safety
/// `info` is NULL or valid for a write.
unsafe fn put_incoming(info: *mut vk_incoming, i: &vkernel::Incoming) {
    // SAFETY: as the function's contract says.
    if let Some(out) = unsafe { info.as_mut() } {
        *out = vk_incoming {
            from: i.from.0,
            seg_bytes: i.seg_bytes as u32,
            forwarder: i.forwarder.0,
            principal: i.principal,
        };
    }
}

/// Writes `r` to `reply` unless it is NULL.
///
/// # Safety
/// `reply` is NULL or valid for a write.
unsafe fn put_reply(reply: *mut vk_reply_info, r: &vkernel::Reply) {
    // SAFETY: as the function's contract says.
    if let Some(out) = unsafe { reply.as_mut() } {
        *out = vk_reply_info {
            from: r.from.0,
            seg_bytes: r.seg_bytes as u32,
        };
    }
}

/// Waits for a message (first come, first served) into `*msg`; `info`
/// (may be NULL) receives its sender.
///
/// # Safety
/// `p` is a live process; `msg` is valid; `info` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn vk_receive(
    p: *mut vk_process,
    msg: *mut vk_message,
    info: *mut vk_incoming,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, msg) = unsafe { (r(p, "process")?, m(msg, "msg")?) };
        let mut mm = Message::zero();
        let i = p.p.receive(&mut mm)?;
        msg.w = mm.0;
        // SAFETY: as the function's contract says.
        unsafe { put_incoming(info, &i) };
        Ok(())
    })
}

/// Receive that also copies the first part of a readable segment into
/// `buf` (`info->seg_bytes` says how much).
///
/// # Safety
/// As `vk_receive`; `buf` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn vk_receive_segment(
    p: *mut vk_process,
    msg: *mut vk_message,
    buf: *mut u8,
    len: usize,
    info: *mut vk_incoming,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, msg) = unsafe { (r(p, "process")?, m(msg, "msg")?) };
        // SAFETY: as the function's contract says.
        let b = unsafe { bytes_mut(buf, len) }?;
        let mut mm = Message::zero();
        let i = p.p.receive_with_segment(&mut mm, b)?;
        msg.w = mm.0;
        // SAFETY: as the function's contract says.
        unsafe { put_incoming(info, &i) };
        Ok(())
    })
}

/// Waits for a message from `from` only. `*found` is 0 if that process
/// does not exist (nothing was received).
///
/// # Safety
/// As `vk_receive`; `found` is valid.
#[no_mangle]
pub unsafe extern "C" fn vk_receive_specific(
    p: *mut vk_process,
    msg: *mut vk_message,
    from: u32,
    info: *mut vk_incoming,
    found: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, msg, found) = unsafe { (r(p, "process")?, m(msg, "msg")?, m(found, "found")?) };
        let mut mm = Message::zero();
        let i = p.p.receive_specific(&mut mm, Pid(from))?;
        *found = c_int::from(i.is_some());
        if let Some(i) = i {
            msg.w = mm.0;
            // SAFETY: as the function's contract says.
            unsafe { put_incoming(info, &i) };
        }
        Ok(())
    })
}

/// Replies `*msg` to `to`, which awaits this process's reply.
///
/// # Safety
/// `p` is a live process; `msg` is valid.
#[no_mangle]
pub unsafe extern "C" fn vk_reply(p: *mut vk_process, msg: *const vk_message, to: u32) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, msg) = unsafe { (r(p, "process")?, r(msg, "msg")?) };
        p.p.reply(&Message(msg.w), Pid(to))?;
        Ok(())
    })
}

/// Replies and writes `len` bytes at `data` into the sender's segment at
/// `offset`.
///
/// # Safety
/// As `vk_reply`; `data` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn vk_reply_segment(
    p: *mut vk_process,
    msg: *const vk_message,
    to: u32,
    offset: u32,
    data: *const u8,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, msg, d) = unsafe { (r(p, "process")?, r(msg, "msg")?, bytes(data, len)?) };
        p.p.reply_with_segment(&Message(msg.w), Pid(to), offset, d)?;
        Ok(())
    })
}

/// Forwards `from`'s message (now `*msg`) to `to`, as if `from` had sent
/// it there; `to` replies to `from`.
///
/// # Safety
/// `p` is a live process; `msg` is valid.
#[no_mangle]
pub unsafe extern "C" fn vk_forward(
    p: *mut vk_process,
    msg: *const vk_message,
    from: u32,
    to: u32,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, msg) = unsafe { (r(p, "process")?, r(msg, "msg")?) };
        p.p.forward(&Message(msg.w), Pid(from), Pid(to))?;
        Ok(())
    })
}

/// Copies `len` bytes at `src` into the segment of `to` (which awaits this
/// process's reply) at `offset`; `*moved` (may be NULL) gets the count.
///
/// # Safety
/// `p` is a live process; `src` is valid for reads of `len` bytes;
/// `moved` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn vk_move_to(
    p: *mut vk_process,
    to: u32,
    offset: u32,
    src: *const u8,
    len: usize,
    moved: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, s) = unsafe { (r(p, "process")?, bytes(src, len)?) };
        let n = p.p.move_to(Pid(to), offset, s)?;
        // SAFETY: as the function's contract says.
        if let Some(out) = unsafe { moved.as_mut() } {
            *out = n;
        }
        Ok(())
    })
}

/// Copies `len` bytes of the segment of `from` at `offset` into `dst`.
///
/// # Safety
/// `p` is a live process; `dst` is valid for writes of `len` bytes;
/// `moved` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn vk_move_from(
    p: *mut vk_process,
    from: u32,
    offset: u32,
    dst: *mut u8,
    len: usize,
    moved: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, d) = unsafe { (r(p, "process")?, bytes_mut(dst, len)?) };
        let n = p.p.move_from(Pid(from), offset, d)?;
        // SAFETY: as the function's contract says.
        if let Some(out) = unsafe { moved.as_mut() } {
            *out = n;
        }
        Ok(())
    })
}

/// The logical id every host agrees on for a service name (the
/// argument of `vk_set_pid`/`vk_get_pid`); 0 if `name` is NULL.
///
/// # Safety
/// `name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn vk_service_id(name: *const c_char) -> u32 {
    // SAFETY: as the function's contract says.
    match unsafe { text(name, "name") } {
        Ok(Some(n)) => vkernel::service::id(n),
        _ => 0,
    }
}

/// Registers `pid` under `logical` in `scope` (SetPid).
///
/// # Safety
/// `p` is a live process.
#[no_mangle]
pub unsafe extern "C" fn vk_set_pid(
    p: *mut vk_process,
    logical: u32,
    pid: u32,
    sc: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let p = unsafe { r(p, "process") }?;
        p.p.set_pid(logical, Pid(pid), scope(sc)?);
        Ok(())
    })
}

/// Looks up `logical` in `scope` (GetPid); `*pid` is 0 if nobody is
/// registered.
///
/// # Safety
/// `p` is a live process; `pid` is valid.
#[no_mangle]
pub unsafe extern "C" fn vk_get_pid(
    p: *mut vk_process,
    logical: u32,
    sc: c_int,
    pid: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, out) = unsafe { (r(p, "process")?, m(pid, "pid")?) };
        *out = p.p.get_pid(logical, scope(sc)?)?.0;
        Ok(())
    })
}

/// Allocates a new group id.
///
/// # Safety
/// `p` is a live process; `group` is valid.
#[no_mangle]
pub unsafe extern "C" fn vk_group_allocate(p: *mut vk_process, group: *mut u32) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let (p, out) = unsafe { (r(p, "process")?, m(group, "group")?) };
        *out = p.p.allocate_group_id()?.0;
        Ok(())
    })
}

/// Makes `pid` a member of `group`.
///
/// # Safety
/// `p` is a live process.
#[no_mangle]
pub unsafe extern "C" fn vk_group_join(p: *mut vk_process, group: u32, pid: u32) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let p = unsafe { r(p, "process") }?;
        p.p.join_group(Pid(group), Pid(pid))?;
        Ok(())
    })
}

/// Removes `pid` from `group`.
///
/// # Safety
/// `p` is a live process.
#[no_mangle]
pub unsafe extern "C" fn vk_group_leave(p: *mut vk_process, group: u32, pid: u32) -> c_int {
    guard(|| {
        // SAFETY: as the function's contract says.
        let p = unsafe { r(p, "process") }?;
        p.p.leave_group(Pid(group), Pid(pid))?;
        Ok(())
    })
}

/// A code's name and meaning (static text; never NULL).
#[no_mangle]
pub extern "C" fn vk_strerror(code: c_int) -> *const c_char {
    let s: &'static CStr = match code {
        0 => c"success",
        VK_EINVAL => c"invalid argument",
        VK_ESTART => c"the kernel could not start or attach",
        VK_EPANIC => c"internal error (a bug in vkernel)",
        VK_ERANGE => c"buffer too small",
        VK_ENOSUCHPROCESS => c"process does not exist",
        VK_ETIMEOUT => c"host of the process did not answer (timeout)",
        VK_ENOTAWAITINGREPLY => c"process is not awaiting reply from the caller",
        VK_EACCESS => c"segment does not grant this access",
        VK_EOUTOFBOUNDS => c"access outside the segment",
        VK_ESEGMENTTOOLARGE => c"segment too large",
        VK_EINVALIDPID => c"not a valid process id",
        VK_ENOTAPROCESS => c"caller is not a process of this logical host",
        VK_EBUSY => c"process is already blocked in an operation",
        VK_ENOHOSTID => c"logical host id not yet allocated",
        VK_ETABLEFULL => c"process table full",
        VK_ENODESCRIPTORS => c"out of file descriptors",
        VK_ENORESOURCES => c"remote kernel has no resources",
        VK_EDESTROYED => c"process destroyed",
        VK_EGROUPUNSUPPORTED => c"group ids are not supported by this operation",
        VK_EREFUSED => c"refused as malformed",
        VK_EDEADLINE => c"no reply within the deadline",
        VK_ESHUTDOWN => c"kernel shut down",
        VK_EHOSTLOST => c"the machine host has gone (attach again)",
        _ => c"unknown error code",
    };
    s.as_ptr()
}

/// The library's version ("MAJOR.MINOR.PATCH", static text); the header
/// it was built with says `VK_VERSION`.
#[no_mangle]
pub extern "C" fn vk_version() -> *const c_char {
    const V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"?",
        };
    V.as_ptr()
}

/// What this thread's last failed call said (static until this thread's
/// next failure; "" if none).
#[no_mangle]
pub extern "C" fn vk_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

#[cfg(test)]
mod tests;
