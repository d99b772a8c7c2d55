//! The pipe server: byte pipes between V processes on any hosts.
//!
//! One server process per logical host keeps every pipe's buffer. Each end
//! is held by one process at a time (the creator holds both, and hands
//! them out). Blocking is the V way: a READ on an empty pipe, or a WRITE
//! that does not fit, is simply not replied to until it can be — the
//! sender stays blocked in its Send (a *delayed Reply*), and the server
//! goes on serving others. A watcher process notices holders that no
//! longer exist and closes their ends, so a reader gets end-of-file after
//! the data a vanished writer left behind.
//!
//! Message layout (word 0 = request code; replies: word 0 = [`Status`]):
//!
//! | code | request | w1 | w2 | w3 | segment | reply |
//! |---|---|---|---|---|---|---|
//! | `0x505001` | CREATE | capacity (0 = default) | | | | w1 pipe id |
//! | `0x505002` | WRITE | pipe | length (≤ [`CHUNK`]) | | R: the data | w1 bytes taken |
//! | `0x505003` | READ | pipe | most bytes wanted | | W: room | w1 bytes, w2 1 = end of file; data in the segment |
//! | `0x505004` | CLOSE | pipe | end (1 read, 2 write) | | | |
//! | `0x505005` | HANDOFF | pipe | end | new holder pid | | |

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use vkernel::{IpcError, Kernel, Message, Pid, Process, Scope, Segment};

use crate::msg::{
    count_reply, eof_reply, reply_count, reply_eof, reply_status, status_reply, PipeRequest,
};
use crate::Status;

/// CREATE request code.
pub const CREATE: u32 = 0x50_5001;
/// WRITE request code.
pub const WRITE: u32 = 0x50_5002;
/// READ request code.
pub const READ: u32 = 0x50_5003;
/// CLOSE request code.
pub const CLOSE: u32 = 0x50_5004;
/// HANDOFF request code.
pub const HANDOFF: u32 = 0x50_5005;
/// Internal: the watcher reports a holder that no longer exists (w1 pid).
pub(crate) const GONE: u32 = 0x50_5006;

/// Largest WRITE or READ of one request (it travels appended to the
/// message: one datagram each way).
pub const CHUNK: usize = 32 << 10;
/// Buffer of a pipe unless CREATE asks otherwise.
pub const DEFAULT_CAPACITY: usize = 64 << 10;
/// Largest buffer a pipe may ask for.
pub const MAX_CAPACITY: usize = 4 << 20;
/// Most pipes one server keeps.
pub const MAX_PIPES: usize = 1024;
/// How often the watcher checks that holders still exist.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(200);

/// The service name a host's pipe server registers under (local scope).
pub const SERVICE: &str = vkernel::service::PIPE;

/// Which end of a pipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The read end.
    Read = 1,
    /// The write end.
    Write = 2,
}

impl End {
    pub(crate) fn from_word(w: u32) -> Option<End> {
        match w {
            1 => Some(End::Read),
            2 => Some(End::Write),
            _ => None,
        }
    }
}

/// Why a pipe operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PipeError {
    /// The IPC failed (server gone, host timeout).
    #[error("IPC: {0}")]
    Ipc(#[from] IpcError),
    /// The server refused the request.
    #[error("pipe server: {0}")]
    Status(Status),
}

struct Pipe {
    buf: VecDeque<u8>,
    cap: usize,
    reader: Option<Pid>,
    writer: Option<Pid>,
    /// A READ held for data: (reader, most bytes wanted).
    waiting_reader: Option<(Pid, usize)>,
    /// A WRITE held for room: (writer, its data).
    waiting_writer: Option<(Pid, Vec<u8>)>,
}

/// A running pipe server.
pub struct PipeServer {
    pid: Pid,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for PipeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipeServer")
            .field("pid", &self.pid)
            .finish()
    }
}

impl PipeServer {
    /// Starts the pipe server of `kernel`'s logical host and registers it
    /// (local scope) as [`SERVICE`]. It ends when the host shuts down.
    pub fn start(kernel: &Kernel) -> Result<PipeServer, IpcError> {
        let server = kernel.create_process()?;
        let pid = server.pid();
        vkernel::service::register(&server, SERVICE, pid, Scope::Local);
        let holders: Arc<Mutex<Vec<Pid>>> = Arc::default();
        let h2 = holders.clone();
        let (_, watcher) = kernel.spawn("pipe-watch", move |p| watch(p, pid, h2))?;
        let main = std::thread::Builder::new()
            .name("pipe-server".into())
            .spawn(move || serve(server, holders))
            .map_err(|_| IpcError::TableFull)?;
        Ok(PipeServer {
            pid,
            threads: vec![main, watcher],
        })
    }

    /// The server's pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Waits for the server's threads (they end with the host).
    pub fn join(self) {
        for h in self.threads {
            let _ = h.join();
        }
    }
}

/// Reports holders that no longer exist (checked every
/// [`WATCH_INTERVAL`]; a holder on an unreachable host counts as gone).
fn watch(p: Process, server: Pid, holders: Arc<Mutex<Vec<Pid>>>) {
    p.set_socket_reader(false);
    loop {
        std::thread::sleep(WATCH_INTERVAL);
        let list: Vec<Pid> = match holders.lock() {
            Ok(g) => g.clone(),
            Err(e) => e.into_inner().clone(),
        };
        for h in list {
            let gone = match p.process_exists(h) {
                Ok(live) => !live,
                Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
                Err(_) => true,
            };
            if gone {
                let mut m = PipeRequest::Gone { holder: h }.encode();
                match p.send(&mut m, server) {
                    Ok(_) => {}
                    Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
                    Err(e) => tracing::debug!("pipe watcher: {e}"),
                }
            }
        }
    }
}

struct Server {
    p: Process,
    pipes: HashMap<u32, Pipe>,
    next: u32,
}

fn serve(p: Process, holders: Arc<Mutex<Vec<Pid>>>) {
    let mut s = Server {
        p,
        pipes: HashMap::new(),
        next: 1,
    };
    let mut m = Message::zero();
    let mut seg = vec![0u8; CHUNK];
    loop {
        let inc = match s.p.receive_with_segment(&mut m, &mut seg) {
            Ok(i) => i,
            Err(IpcError::Shutdown) | Err(IpcError::Destroyed) => return,
            Err(e) => {
                tracing::debug!("pipe server: receive: {e}");
                continue;
            }
        };
        let data = &seg[..inc.seg_bytes.min(seg.len())];
        if let Some(r) = s.handle(&m, inc.from, data) {
            let _ = s.p.reply(&r, inc.from);
        }
        let mut list: Vec<Pid> = s
            .pipes
            .values()
            .flat_map(|p| [p.reader, p.writer])
            .flatten()
            .collect();
        list.sort_unstable_by_key(|p| p.0);
        list.dedup();
        match holders.lock() {
            Ok(mut g) => *g = list,
            Err(e) => *e.into_inner() = list,
        }
    }
}

impl Server {
    /// Handles one request; `None` = the reply is delayed (or was sent).
    fn handle(&mut self, m: &Message, from: Pid, data: &[u8]) -> Option<Message> {
        match PipeRequest::decode(m) {
            Some(PipeRequest::Create { capacity }) => Some(self.create(capacity as usize, from)),
            Some(PipeRequest::Write { pipe, len }) => self.write(pipe, len as usize, from, data),
            Some(PipeRequest::Read { pipe, most }) => {
                self.read(pipe, most as usize, m.seg_len() as usize, from)
            }
            Some(PipeRequest::Close { pipe, end }) => Some(match end {
                Some(end) => self.close(pipe, end, from),
                None => status_reply(Status::EINVAL),
            }),
            Some(PipeRequest::HandOff { pipe, end, to }) => Some(match end {
                Some(end) => self.hand_off(pipe, end, from, to),
                None => status_reply(Status::EINVAL),
            }),
            Some(PipeRequest::Gone { holder }) if from.host() == self.p.pid().host() => {
                self.gone(holder);
                Some(status_reply(Status::OK))
            }
            _ => Some(status_reply(Status::ENOSYS)),
        }
    }

    fn create(&mut self, cap: usize, from: Pid) -> Message {
        if self.pipes.len() >= MAX_PIPES {
            return status_reply(Status::ENFILE);
        }
        let cap = if cap == 0 { DEFAULT_CAPACITY } else { cap };
        if !(CHUNK..=MAX_CAPACITY).contains(&cap) {
            return status_reply(Status::EINVAL);
        }
        let mut id = self.next;
        while id == 0 || self.pipes.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next = id.wrapping_add(1);
        self.pipes.insert(
            id,
            Pipe {
                buf: VecDeque::new(),
                cap,
                reader: Some(from),
                writer: Some(from),
                waiting_reader: None,
                waiting_writer: None,
            },
        );
        count_reply(id)
    }

    fn write(&mut self, id: u32, len: usize, from: Pid, data: &[u8]) -> Option<Message> {
        let Some(pp) = self.pipes.get_mut(&id) else {
            return Some(status_reply(Status::EBADF));
        };
        if pp.writer != Some(from) {
            return Some(status_reply(Status::EBADF));
        }
        if len > CHUNK || data.len() < len {
            return Some(status_reply(Status::EINVAL));
        }
        if pp.reader.is_none() {
            return Some(status_reply(Status::EPIPE));
        }
        if pp.buf.len() + len > pp.cap {
            // Full: hold the writer until a reader makes room.
            pp.waiting_writer = Some((from, data[..len].to_vec()));
            return None;
        }
        pp.buf.extend(&data[..len]);
        self.feed_reader(id);
        Some(count_reply(len as u32))
    }

    fn read(&mut self, id: u32, want: usize, room: usize, from: Pid) -> Option<Message> {
        let Some(pp) = self.pipes.get_mut(&id) else {
            return Some(status_reply(Status::EBADF));
        };
        if pp.reader != Some(from) {
            return Some(status_reply(Status::EBADF));
        }
        let want = want.min(room).min(CHUNK);
        if want == 0 {
            return Some(status_reply(Status::EINVAL));
        }
        pp.waiting_reader = Some((from, want));
        self.feed_reader(id);
        None
    }

    /// Answers a held READ if there is data or end of file, then lets a
    /// held WRITE in if it now fits.
    fn feed_reader(&mut self, id: u32) {
        let Some(pp) = self.pipes.get_mut(&id) else {
            return;
        };
        if let Some((rd, want)) = pp.waiting_reader {
            if !pp.buf.is_empty() {
                let n = want.min(pp.buf.len());
                let chunk: Vec<u8> = pp.buf.drain(..n).collect();
                pp.waiting_reader = None;
                let r = count_reply(n as u32);
                let _ = self.p.reply_with_segment(&r, rd, 0, &chunk);
            } else if pp.writer.is_none() {
                pp.waiting_reader = None;
                let _ = self.p.reply(&eof_reply(), rd);
            }
        }
        let Some(pp) = self.pipes.get_mut(&id) else {
            return;
        };
        let fits = pp
            .waiting_writer
            .as_ref()
            .is_some_and(|(_, d)| pp.buf.len() + d.len() <= pp.cap);
        if fits {
            if let Some((wr, d)) = pp.waiting_writer.take() {
                pp.buf.extend(&d);
                let _ = self.p.reply(&count_reply(d.len() as u32), wr);
                // The data just taken may answer a reader waiting again.
                if pp.waiting_reader.is_some() {
                    self.feed_reader(id);
                }
            }
        }
    }

    fn close(&mut self, id: u32, end: End, from: Pid) -> Message {
        let Some(pp) = self.pipes.get(&id) else {
            return status_reply(Status::EBADF);
        };
        let holder = match end {
            End::Read => pp.reader,
            End::Write => pp.writer,
        };
        if holder != Some(from) {
            return status_reply(Status::EBADF);
        }
        self.close_end(id, end);
        status_reply(Status::OK)
    }

    fn close_end(&mut self, id: u32, end: End) {
        let Some(pp) = self.pipes.get_mut(&id) else {
            return;
        };
        match end {
            End::Write => {
                pp.writer = None;
                // A vanished writer's held WRITE ends with it.
                pp.waiting_writer = None;
                self.feed_reader(id);
            }
            End::Read => {
                pp.reader = None;
                pp.waiting_reader = None;
                pp.buf.clear();
                if let Some((wr, _)) = pp.waiting_writer.take() {
                    let _ = self.p.reply(&status_reply(Status::EPIPE), wr);
                }
            }
        }
        if let Some(pp) = self.pipes.get(&id) {
            if pp.reader.is_none() && pp.writer.is_none() {
                self.pipes.remove(&id);
            }
        }
    }

    fn hand_off(&mut self, id: u32, end: End, from: Pid, to: Pid) -> Message {
        if !to.is_process() {
            return status_reply(Status::EINVAL);
        }
        let Some(pp) = self.pipes.get_mut(&id) else {
            return status_reply(Status::EBADF);
        };
        let slot = match end {
            End::Read => &mut pp.reader,
            End::Write => &mut pp.writer,
        };
        if *slot != Some(from) {
            return status_reply(Status::EBADF);
        }
        *slot = Some(to);
        status_reply(Status::OK)
    }

    /// Closes every end `who` holds.
    fn gone(&mut self, who: Pid) {
        let ends: Vec<(u32, End)> = self
            .pipes
            .iter()
            .flat_map(|(&id, p)| {
                let mut v = Vec::new();
                if p.reader == Some(who) {
                    v.push((id, End::Read));
                }
                if p.writer == Some(who) {
                    v.push((id, End::Write));
                }
                v
            })
            .collect();
        for (id, end) in ends {
            self.close_end(id, end);
        }
    }
}

/// Client calls to a pipe server.
#[derive(Clone, Copy, Debug)]
pub struct Pipes {
    /// The pipe server.
    pub server: Pid,
}

fn check(m: &Message) -> Result<(), PipeError> {
    match reply_status(m) {
        Status::OK => Ok(()),
        s => Err(PipeError::Status(s)),
    }
}

impl Pipes {
    /// The pipe server of `p`'s own logical host.
    pub fn local(p: &Process) -> Result<Pipes, PipeError> {
        match vkernel::service::find(p, SERVICE, Scope::Local)? {
            Some(server) => Ok(Pipes { server }),
            None => Err(PipeError::Status(Status::ENOENT)),
        }
    }

    /// Creates a pipe (`capacity` bytes of buffer, 0 = default); `p`
    /// holds both ends.
    pub fn create(&self, p: &Process, capacity: usize) -> Result<u32, PipeError> {
        let capacity = u32::try_from(capacity).unwrap_or(u32::MAX);
        let mut m = PipeRequest::Create { capacity }.encode();
        p.send(&mut m, self.server)?;
        check(&m)?;
        Ok(reply_count(&m))
    }

    /// Writes all of `data` (blocks while the pipe is full).
    pub fn write(&self, p: &Process, pipe: u32, data: &[u8]) -> Result<(), PipeError> {
        for c in data.chunks(CHUNK) {
            let len = c.len() as u32;
            let mut m = PipeRequest::Write { pipe, len }.encode();
            p.send_with_segment(&mut m, self.server, Segment::Read(c))?;
            check(&m)?;
        }
        Ok(())
    }

    /// Reads what is there (at least one byte; blocks while the pipe is
    /// empty). `Ok(0)`: end of file.
    pub fn read(&self, p: &Process, pipe: u32, buf: &mut [u8]) -> Result<usize, PipeError> {
        let n = buf.len().min(CHUNK);
        if n == 0 {
            return Ok(0);
        }
        let mut m = PipeRequest::Read {
            pipe,
            most: n as u32,
        }
        .encode();
        let r = p.send_with_segment(&mut m, self.server, Segment::Write(&mut buf[..n]))?;
        check(&m)?;
        if reply_eof(&m) {
            return Ok(0);
        }
        Ok((reply_count(&m) as usize).min(r.seg_bytes).min(n))
    }

    /// Closes an end `p` holds.
    pub fn close(&self, p: &Process, pipe: u32, end: End) -> Result<(), PipeError> {
        let mut m = PipeRequest::Close {
            pipe,
            end: Some(end),
        }
        .encode();
        p.send(&mut m, self.server)?;
        check(&m)
    }

    /// Hands an end `p` holds to process `to`.
    pub fn hand_off(&self, p: &Process, pipe: u32, end: End, to: Pid) -> Result<(), PipeError> {
        let mut m = PipeRequest::HandOff {
            pipe,
            end: Some(end),
            to,
        }
        .encode();
        p.send(&mut m, self.server)?;
        check(&m)
    }
}
