//! Python bindings of vkernel: `Kernel`, `Process`, `Message`, `Incoming`,
//! and the exceptions (`vkernel._vkernel`; the `vkernel` package re-exports
//! them). Every blocking call releases the GIL, and Ctrl-C ends one the
//! main thread is in (`interrupt`); segments are Python buffers (bytes,
//! bytearray, memoryview, array, numpy) used in place.
#![warn(clippy::undocumented_unsafe_blocks)]

mod interrupt;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

use vkernel::{IpcError, KernelConfig, Pid, Scope, Segment};

use interrupt::{KernelCell, Kind};

create_exception!(vkernel, VkernelError, PyException, "Any vkernel failure: `.code` is the IpcError code (0 for start-up failures), `.pid` the process it names.");
create_exception!(
    vkernel,
    NoSuchProcess,
    VkernelError,
    "The process does not exist."
);
create_exception!(
    vkernel,
    NotAwaitingReply,
    VkernelError,
    "The process awaits no reply from the caller."
);
create_exception!(
    vkernel,
    HostLost,
    VkernelError,
    "The machine host this program attached to has gone, or the kernel shut down."
);
create_exception!(
    vkernel,
    AccessDenied,
    VkernelError,
    "The segment does not grant that access, or the access lies outside it."
);

/// `DeadlineExceeded`: a `VkernelError` and a `TimeoutError` both, as
/// Python code that catches timeouts expects. `create_exception!` takes
/// one base, so the type is made by `type()` when the module loads.
static DEADLINE_EXCEEDED: pyo3::sync::PyOnceLock<Py<PyType>> = pyo3::sync::PyOnceLock::new();

/// The `DeadlineExceeded` type (made on first use).
fn deadline_exceeded(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    DEADLINE_EXCEEDED
        .get_or_try_init(py, || {
            // (Its own `__init__` keeps OSError from reading the
            // arguments as errno and strerror and dropping the pid.)
            let ns = PyDict::new(py);
            ns.set_item("VkernelError", py.get_type::<VkernelError>())?;
            py.run(
                c"class DeadlineExceeded(VkernelError, TimeoutError):\n    \"No reply came within the Send's deadline.\"\n    __module__ = 'vkernel'\n    def __init__(self, *args):\n        BaseException.__init__(self, *args)\n",
                Some(&ns),
                None,
            )?;
            let t = ns
                .get_item("DeadlineExceeded")?
                .ok_or_else(|| PyValueError::new_err("DeadlineExceeded was not made"))?
                .cast_into::<PyType>()?;
            Ok(t.unbind())
        })
        .map(|t| t.bind(py))
}

fn err(e: IpcError) -> PyErr {
    let (code, arg) = e.code();
    let msg = e.to_string();
    let args = (msg, code, arg);
    match e {
        IpcError::NoSuchProcess(_) => NoSuchProcess::new_err(args),
        IpcError::NotAwaitingReply(_) => NotAwaitingReply::new_err(args),
        IpcError::Deadline(_) => Python::attach(|py| match deadline_exceeded(py) {
            Ok(t) => PyErr::from_type(t.clone(), args),
            Err(e) => e,
        }),
        IpcError::HostLost | IpcError::Shutdown => HostLost::new_err(args),
        IpcError::AccessDenied(_) | IpcError::OutOfBounds(_) => AccessDenied::new_err(args),
        _ => VkernelError::new_err(args),
    }
}

/// A 32-byte V message: eight 32-bit words. Word 0 holds the request code
/// (low 24 bits) and flags; words 6 and 7 belong to the kernel (a
/// segment's description).
#[pyclass(module = "vkernel")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Message {
    w: [u32; 8],
}

#[pymethods]
impl Message {
    /// `Message(code=0, *words)`: the request code, then up to seven words.
    #[new]
    #[pyo3(signature = (code = 0, *words))]
    fn new(code: u32, words: Vec<u32>) -> PyResult<Message> {
        if words.len() > 7 {
            return Err(PyValueError::new_err(
                "a message has 8 words: code and 7 more",
            ));
        }
        let mut w = [0u32; 8];
        w[0] = code;
        w[1..=words.len()].copy_from_slice(&words);
        Ok(Message { w })
    }

    /// The request code (word 0's low 24 bits).
    #[getter]
    fn code(&self) -> u32 {
        self.w[0] & 0x00ff_ffff
    }

    /// The eight words, as a list.
    #[getter]
    fn words(&self) -> Vec<u32> {
        self.w.to_vec()
    }

    fn __len__(&self) -> usize {
        8
    }

    fn __getitem__(&self, i: isize) -> PyResult<u32> {
        Ok(self.w[index(i)?])
    }

    fn __setitem__(&mut self, i: isize, v: u32) -> PyResult<()> {
        self.w[index(i)?] = v;
        Ok(())
    }

    fn __eq__(&self, other: &Message) -> bool {
        self == other
    }

    fn __repr__(&self) -> String {
        let ws: Vec<String> = self.w[1..].iter().map(|w| format!("{w:#x}")).collect();
        format!("Message(code={:#x}, {})", self.code(), ws.join(", "))
    }
}

fn index(i: isize) -> PyResult<usize> {
    let j = if i < 0 { i + 8 } else { i };
    if (0..8).contains(&j) {
        Ok(j as usize)
    } else {
        Err(pyo3::exceptions::PyIndexError::new_err(
            "a message has 8 words",
        ))
    }
}

/// Who sent a received message.
#[pyclass(module = "vkernel", frozen, get_all)]
#[derive(Clone, Copy, Debug)]
pub struct Incoming {
    /// The sender's pid (the original sender after a Forward).
    sender: u32,
    /// Bytes of the sender's segment copied into the receive buffer.
    seg_bytes: usize,
    /// The pid that forwarded it (the sender if not forwarded).
    forwarder: u32,
    /// The sender's principal (0: none).
    principal: u32,
}

#[pymethods]
impl Incoming {
    fn __repr__(&self) -> String {
        format!(
            "Incoming(sender={:#010x}, seg_bytes={}, forwarder={:#010x}, principal={})",
            self.sender, self.seg_bytes, self.forwarder, self.principal
        )
    }
}

fn incoming(i: &vkernel::Incoming) -> Incoming {
    Incoming {
        sender: i.from.0,
        seg_bytes: i.seg_bytes,
        forwarder: i.forwarder.0,
        principal: i.principal,
    }
}

/// A kernel: `Kernel.start()` makes this program its own logical host;
/// `Kernel.attach()` joins the machine host (`vkernel host`). Use it as a
/// context manager, or call `close()`.
#[pyclass(module = "vkernel")]
pub struct Kernel {
    /// Shared (weakly) with its processes, so Ctrl-C can make a process
    /// that ends one's call (`interrupt`).
    k: Arc<KernelCell>,
}

fn closed() -> PyErr {
    HostLost::new_err(("the kernel is closed", 18u32, 0u32))
}

impl Kernel {
    fn with<R>(&self, f: impl FnOnce(&vkernel::Kernel) -> PyResult<R>) -> PyResult<R> {
        let g = self.k.lock().unwrap_or_else(|p| p.into_inner());
        f(g.as_ref().ok_or_else(closed)?)
    }
}

#[pymethods]
impl Kernel {
    /// Starts an embedded kernel bound to `bind` (by default "127.0.0.1:0",
    /// or "0.0.0.0:0" when a peer is on another machine), knowing the
    /// hosts at `peers` ("HOST:PORT": an address, or
    /// a DNS name standing for all its addresses, looked up again every
    /// 10 s).
    #[staticmethod]
    #[pyo3(signature = (bind = None, peers = None))]
    fn start(py: Python<'_>, bind: Option<String>, peers: Option<Vec<String>>) -> PyResult<Kernel> {
        let mut cfg = KernelConfig::default();
        let mut specs = Vec::new();
        for p in peers.unwrap_or_default() {
            let spec = vkernel::PeerSpec::parse(&p)
                .map_err(|e| PyValueError::new_err(format!("peer: {e}")))?;
            match spec.clone() {
                vkernel::PeerSpec::Addr(a) => cfg.peers.push(a),
                name => cfg.named_peers.push(name),
            }
            specs.push(spec);
        }
        cfg.bind = match bind {
            Some(b) => b
                .parse()
                .map_err(|_| PyValueError::new_err(format!("bind address {b:?} does not parse")))?,
            None => vkernel::default_bind(&specs),
        };
        let k = py
            .detach(|| vkernel::Kernel::start(cfg))
            .map_err(|e| VkernelError::new_err((e.to_string(), 0u32, 0u32)))?;
        Ok(Kernel {
            k: Arc::new(Mutex::new(Some(k))),
        })
    }

    /// Attaches to the machine host at `path` (default: `$VKERNEL_HOST`,
    /// else the default socket).
    #[staticmethod]
    #[pyo3(signature = (path = None))]
    fn attach(py: Python<'_>, path: Option<String>) -> PyResult<Kernel> {
        let k = py
            .detach(|| match path {
                Some(p) => vkernel::Kernel::attach(p),
                None => vkernel::Kernel::attach_default(),
            })
            .map_err(|e| VkernelError::new_err((e.to_string(), 0u32, 0u32)))?;
        Ok(Kernel {
            k: Arc::new(Mutex::new(Some(k))),
        })
    }

    /// Serves a machine host's attach socket at `path` (this kernel becomes
    /// the host other programs attach to) until the returned object is
    /// closed.
    #[pyo3(signature = (path, mode = 0o600))]
    fn serve_attach(&self, path: String, mode: u32) -> PyResult<AttachServer> {
        self.with(|k| {
            let s = k
                .serve_attach(&path, mode)
                .map_err(|e| VkernelError::new_err((e.to_string(), 0u32, 0u32)))?;
            Ok(AttachServer {
                s: Mutex::new(Some(s)),
            })
        })
    }

    /// A new process of this kernel.
    fn create_process(&self) -> PyResult<Process> {
        self.with(|k| {
            let p = k.create_process().map_err(err)?;
            Ok(Process {
                pid: p.pid().0,
                p: Mutex::new(Some(p)),
                kernel: Arc::downgrade(&self.k),
                hit: Arc::new(AtomicBool::new(false)),
            })
        })
    }

    /// The logical host id.
    #[getter]
    fn host_id(&self) -> PyResult<u16> {
        self.with(|k| Ok(k.host_id().0))
    }

    /// The UDP address other hosts reach this one at ("ip:port").
    #[getter]
    fn address(&self) -> PyResult<String> {
        self.with(|k| Ok(k.local_addr().to_string()))
    }

    /// Whether this kernel is an attachment to a machine host.
    #[getter]
    fn attached(&self) -> PyResult<bool> {
        self.with(|k| Ok(k.is_attached()))
    }

    /// The kernel's statistics as a JSON document.
    fn stats_json(&self) -> PyResult<String> {
        self.with(|k| Ok(k.stats_json()))
    }

    /// Stops (or detaches from) the kernel; its processes' calls fail with
    /// `HostLost` afterwards.
    fn close(&self, py: Python<'_>) {
        let k = self.k.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(|| drop(k));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<Bound<'_, PyAny>>,
        _v: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.close(py);
        false
    }
}

/// A machine host's attach socket (from `Kernel.serve_attach`).
#[pyclass(module = "vkernel")]
pub struct AttachServer {
    s: Mutex<Option<vkernel::AttachServer>>,
}

#[pymethods]
impl AttachServer {
    /// Programs attached now.
    #[getter]
    fn attached(&self) -> usize {
        self.s
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(0, |s| s.attached())
    }

    /// Closes the socket; attached programs' processes go.
    fn close(&self, py: Python<'_>) {
        let s = self.s.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(|| drop(s));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<Bound<'_, PyAny>>,
        _v: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.close(py);
        false
    }
}

/// A V process. Its calls block (with the GIL released) and may be made
/// from any thread, one call at a time. Ctrl-C ends a call of the main
/// thread: a Receive stays usable; any other call destroys the process
/// (later calls fail with code 14).
#[pyclass(module = "vkernel")]
pub struct Process {
    /// Kept apart from the lock: a call in progress holds the lock, and
    /// another thread asking for the pid (to send to it) must not wait.
    pid: u32,
    p: Mutex<Option<vkernel::Process>>,
    /// Its kernel, for Ctrl-C to reach (`interrupt`).
    kernel: Weak<KernelCell>,
    /// Set when Ctrl-C destroyed the process during a call.
    hit: Arc<AtomicBool>,
}

/// A Python buffer's memory, to use with the GIL released.
#[derive(Clone, Copy)]
struct Raw {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is into a buffer a `PyBuffer` keeps exported (its
// object cannot resize or free it) for as long as the `Raw` is used; it
// only moves to the same call's GIL-released section.
unsafe impl Send for Raw {}

impl Raw {
    fn of(b: &PyBuffer<u8>, writable: bool) -> PyResult<Raw> {
        if !b.is_c_contiguous() {
            return Err(PyValueError::new_err("the buffer must be contiguous"));
        }
        if writable && b.readonly() {
            return Err(PyValueError::new_err(
                "the buffer is read-only (use a bytearray or a writable memoryview)",
            ));
        }
        Ok(Raw {
            ptr: b.buf_ptr().cast(),
            len: b.len_bytes(),
        })
    }

    /// # Safety
    /// The `PyBuffer` this came from is alive, and no other code uses the
    /// memory meanwhile.
    unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as the function's contract says.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

fn scope(s: &str) -> PyResult<Scope> {
    match s {
        "local" => Ok(Scope::Local),
        "remote" => Ok(Scope::Remote),
        "any" => Ok(Scope::Any),
        _ => Err(PyValueError::new_err("scope is 'local', 'remote' or 'any'")),
    }
}

/// A name (str: the service's logical id) or a logical id (int).
fn logical(name: &Bound<'_, PyAny>) -> PyResult<u32> {
    if let Ok(s) = name.extract::<String>() {
        return Ok(vkernel::service::id(&s));
    }
    name.extract::<u32>()
}

impl Process {
    /// Runs `f` on the process with the GIL released; on the main thread
    /// a call of `kind` may be ended by Ctrl-C (`interrupt`).
    fn call<R: Send>(
        &self,
        py: Python<'_>,
        kind: Kind,
        f: impl FnOnce(&vkernel::Process) -> Result<R, IpcError> + Send,
    ) -> PyResult<R> {
        let r = py.detach(|| {
            let g = self.p.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_ref() {
                Some(p) => {
                    let _in_call = interrupt::enter(kind, self.pid, &self.kernel, &self.hit);
                    f(p).map_err(Some)
                }
                None => Err(None),
            }
        });
        if self.hit.load(Ordering::SeqCst) {
            // Ctrl-C destroyed the process: drop it, let Python's handler
            // raise, and fail the call if it did not.
            let p = self.p.lock().unwrap_or_else(|p| p.into_inner()).take();
            py.detach(|| drop(p));
            py.check_signals()?;
            return Err(self.closed());
        }
        r.map_err(|e| e.map_or_else(|| self.closed(), err))
    }

    /// The error of a call on a closed process.
    fn closed(&self) -> PyErr {
        if self.hit.load(Ordering::SeqCst) {
            let (code, _) = IpcError::Destroyed.code();
            let msg = format!(
                "process {:#010x} was destroyed when Ctrl-C interrupted its call",
                self.pid
            );
            VkernelError::new_err((msg, code, self.pid))
        } else {
            closed()
        }
    }
}

#[pymethods]
impl Process {
    /// This process's pid.
    #[getter]
    fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `msg` to `to` and waits for the reply: returns the reply
    /// message and the pid that replied. `timeout` (seconds) bounds the
    /// wait (`DeadlineExceeded`).
    #[pyo3(signature = (msg, to, timeout = None))]
    fn send(
        &self,
        py: Python<'_>,
        msg: Message,
        to: u32,
        timeout: Option<f64>,
    ) -> PyResult<(Message, u32)> {
        let d = timeout.map(Duration::from_secs_f64);
        self.call(py, Kind::Block, |p| {
            let mut m = vkernel::Message(msg.w);
            let r = match d {
                Some(d) => p.send_within(&mut m, Pid(to), Some(d))?,
                None => p.send(&mut m, Pid(to))?,
            };
            Ok((Message { w: m.0 }, r.from.0))
        })
    }

    /// Sends with `segment` (any contiguous buffer) that the receiver may
    /// read (`access` "r"), write ("w") or both ("rw") in place while this
    /// process awaits the reply. Returns the reply, the replier and how
    /// many bytes the reply wrote into the segment.
    #[pyo3(signature = (msg, to, segment, access = "rw"))]
    fn send_segment(
        &self,
        py: Python<'_>,
        msg: Message,
        to: u32,
        segment: &Bound<'_, PyAny>,
        access: &str,
    ) -> PyResult<(Message, u32, usize)> {
        let write = match access {
            "r" => false,
            "w" | "rw" => true,
            _ => return Err(PyValueError::new_err("access is 'r', 'w' or 'rw'")),
        };
        let b = PyBuffer::<u8>::get(segment)?;
        let raw = Raw::of(&b, write)?;
        let access = access.to_string();
        let r = self.call(py, Kind::Block, move |p| {
            // SAFETY: `b` stays alive (exported) until after this call.
            let buf = unsafe { raw.bytes_mut() };
            let seg = match access.as_str() {
                "r" => Segment::Read(buf),
                "w" => Segment::Write(buf),
                _ => Segment::ReadWrite(buf),
            };
            let mut m = vkernel::Message(msg.w);
            let r = p.send_with_segment(&mut m, Pid(to), seg)?;
            Ok((Message { w: m.0 }, r.from.0, r.seg_bytes))
        });
        drop(b);
        r
    }

    /// Waits for a message: returns it and who sent it. With `buffer` (a
    /// writable buffer) the first part of a readable segment is copied
    /// into it (`Incoming.seg_bytes`).
    #[pyo3(signature = (buffer = None))]
    fn receive(
        &self,
        py: Python<'_>,
        buffer: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Message, Incoming)> {
        let b = buffer.map(PyBuffer::<u8>::get).transpose()?;
        let raw = b.as_ref().map(|b| Raw::of(b, true)).transpose()?;
        let r = loop {
            let got = self.call(py, Kind::Receive, move |p| {
                let mut m = vkernel::Message::zero();
                let i = match raw {
                    // SAFETY: `b` stays alive (exported) until after this call.
                    Some(raw) => p.receive_with_segment(&mut m, unsafe { raw.bytes_mut() })?,
                    None => p.receive(&mut m)?,
                };
                if interrupt::is_wake(&m) {
                    // Ctrl-C's wake message (`interrupt`): answered, not
                    // returned.
                    let _ = p.reply(&vkernel::Message::zero(), i.from);
                    return Ok(None);
                }
                Ok(Some((Message { w: m.0 }, incoming(&i))))
            });
            match got {
                Ok(Some(r)) => break Ok(r),
                // Python's handlers run; if they raise nothing, receive
                // again (as Python retries a system call, PEP 475).
                Ok(None) => {
                    if let Err(e) = py.check_signals() {
                        break Err(e);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        drop(b);
        r
    }

    /// Replies `msg` to `to`; with `data`, also writes it into `to`'s
    /// segment at `offset`.
    #[pyo3(signature = (msg, to, data = None, offset = 0))]
    fn reply(
        &self,
        py: Python<'_>,
        msg: Message,
        to: u32,
        data: Option<&Bound<'_, PyAny>>,
        offset: u32,
    ) -> PyResult<()> {
        let b = data.map(PyBuffer::<u8>::get).transpose()?;
        let raw = b.as_ref().map(|b| Raw::of(b, false)).transpose()?;
        // (With data a Reply may MoveTo first, and wait for that.)
        let kind = if raw.is_some() {
            Kind::Block
        } else {
            Kind::Quick
        };
        let r = self.call(py, kind, move |p| {
            let m = vkernel::Message(msg.w);
            match raw {
                // SAFETY: `b` stays alive (exported) until after this call;
                // the bytes are only read.
                Some(raw) => p.reply_with_segment(&m, Pid(to), offset, unsafe { raw.bytes_mut() }),
                None => p.reply(&m, Pid(to)),
            }
        });
        drop(b);
        r
    }

    /// Forwards `sender`'s message (now `msg`) to `to`, which replies to
    /// `sender`.
    fn forward(&self, py: Python<'_>, msg: Message, sender: u32, to: u32) -> PyResult<()> {
        self.call(py, Kind::Quick, |p| {
            p.forward(&vkernel::Message(msg.w), Pid(sender), Pid(to))
        })
    }

    /// Copies `data` into the segment of `to` (awaiting this process's
    /// reply) at `offset`; returns the bytes moved.
    #[pyo3(signature = (to, data, offset = 0))]
    fn move_to(
        &self,
        py: Python<'_>,
        to: u32,
        data: &Bound<'_, PyAny>,
        offset: u32,
    ) -> PyResult<usize> {
        let b = PyBuffer::<u8>::get(data)?;
        let raw = Raw::of(&b, false)?;
        let r = self.call(py, Kind::Block, move |p| {
            // SAFETY: `b` stays alive (exported) until after this call; the
            // bytes are only read.
            p.move_to(Pid(to), offset, unsafe { raw.bytes_mut() })
        });
        drop(b);
        r
    }

    /// Fills `buffer` from the segment of `sender` at `offset`; returns
    /// the bytes moved.
    #[pyo3(signature = (sender, buffer, offset = 0))]
    fn move_from(
        &self,
        py: Python<'_>,
        sender: u32,
        buffer: &Bound<'_, PyAny>,
        offset: u32,
    ) -> PyResult<usize> {
        let b = PyBuffer::<u8>::get(buffer)?;
        let raw = Raw::of(&b, true)?;
        let r = self.call(py, Kind::Block, move |p| {
            // SAFETY: `b` stays alive (exported) until after this call.
            p.move_from(Pid(sender), offset, unsafe { raw.bytes_mut() })
        });
        drop(b);
        r
    }

    /// Registers `pid` (default: this process) under `name` (a service
    /// name or a logical id) in `scope` ("local", "remote", "any").
    #[pyo3(signature = (name, pid = None, scope = "any"))]
    fn register(
        &self,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        pid: Option<u32>,
        scope: &str,
    ) -> PyResult<()> {
        let (id, sc) = (logical(name)?, self::scope(scope)?);
        self.call(py, Kind::Quick, |p| {
            p.set_pid(id, pid.map_or(p.pid(), Pid), sc);
            Ok(())
        })
    }

    /// The pid registered under `name` in `scope`, or None.
    #[pyo3(signature = (name, scope = "any"))]
    fn lookup(
        &self,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        scope: &str,
    ) -> PyResult<Option<u32>> {
        let (id, sc) = (logical(name)?, self::scope(scope)?);
        self.call(py, Kind::Block, |p| {
            let pid = p.get_pid(id, sc)?;
            Ok((!pid.is_none()).then_some(pid.0))
        })
    }

    /// How this process waits: spin up to `micros` µs, then block
    /// (`adaptive`: only while spinning pays).
    #[pyo3(signature = (micros, adaptive = false))]
    fn set_spin(&self, py: Python<'_>, micros: u64, adaptive: bool) -> PyResult<()> {
        self.call(py, Kind::Quick, |p| {
            let d = Duration::from_micros(micros);
            if adaptive {
                p.set_spin_auto(d);
            } else {
                p.set_spin(d);
            }
            Ok(())
        })
    }

    /// Destroys the process.
    fn close(&self, py: Python<'_>) {
        let p = self.p.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(|| drop(p));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<Bound<'_, PyAny>>,
        _v: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.close(py);
        false
    }
}

/// The logical id every host agrees on for a service name.
#[pyfunction]
fn service_id(name: &str) -> u32 {
    vkernel::service::id(name)
}

#[pymodule]
fn _vkernel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    interrupt::init(py)?;
    m.add_class::<Kernel>()?;
    m.add_class::<Process>()?;
    m.add_class::<Message>()?;
    m.add_class::<Incoming>()?;
    m.add_class::<AttachServer>()?;
    m.add_function(wrap_pyfunction!(service_id, m)?)?;
    m.add("VkernelError", py.get_type::<VkernelError>())?;
    m.add("NoSuchProcess", py.get_type::<NoSuchProcess>())?;
    m.add("NotAwaitingReply", py.get_type::<NotAwaitingReply>())?;
    m.add("DeadlineExceeded", deadline_exceeded(py)?)?;
    m.add("HostLost", py.get_type::<HostLost>())?;
    m.add("AccessDenied", py.get_type::<AccessDenied>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
