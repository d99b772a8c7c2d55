//! The gateway: listeners, the poller thread that holds idle
//! connections, and the connections' pumps.

use super::*;

/// Where the gateway listens: a TCP address or `unix:PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// TCP.
    Tcp(SocketAddr),
    /// A Unix-domain socket path.
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a path".into());
            }
            return Ok(ListenAddr::Unix(p.into()));
        }
        s.parse()
            .map(ListenAddr::Tcp)
            .map_err(|_| format!("`{s}` is neither HOST:PORT nor unix:PATH"))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

pub(super) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l) => l.as_fd(),
        }
    }

    /// Accepts one connection: its reading half, its writing half, a
    /// handle to close it.
    fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => l.accept().and_then(|(s, peer)| {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                let w = s.try_clone()?;
                let c = s.try_clone()?;
                Ok((
                    Box::new(s) as _,
                    Box::new(w) as _,
                    Conn::Tcp(c),
                    peer.to_string(),
                ))
            }),
            Listener::Unix(l) => l.accept().and_then(|(s, _)| {
                s.set_nonblocking(false)?;
                let w = s.try_clone()?;
                let c = s.try_clone()?;
                let peer = "a Unix-socket client".to_string();
                Ok((Box::new(s) as _, Box::new(w) as _, Conn::Unix(c), peer))
            }),
        }
    }
}

pub(super) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn shutdown(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// Counters of a gateway.
#[derive(Debug, Default)]
pub struct GatewayStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections closed for a protocol violation or I/O error.
    pub errors: AtomicU64,
    /// Connections refused (closed at once) over the connection limit.
    pub refused: AtomicU64,
    /// Connections closed for not finishing the handshake in time.
    pub handshake_timeouts: AtomicU64,
    /// Times a connection's reading stopped until the memory budget had
    /// room for its next request.
    pub memory_waits: AtomicU64,
    /// Most budget bytes held at once (see [`Limits::memory`]).
    pub memory_peak: AtomicU64,
    /// Times an idle connection gave back its threads.
    pub parked: AtomicU64,
}

/// A connection the gateway tracks (for stop, the limit and the
/// handshake deadline).
pub(super) struct Tracked {
    conn: Conn,
    /// The client, for the log: its address (TCP).
    peer: String,
    since: std::time::Instant,
    /// Negotiation is over (the deadline no longer applies).
    negotiated: bool,
    /// Closed for its deadline (once).
    expired: bool,
    deadline: std::time::Instant,
}

/// A connection no thread serves: waiting on the poller for its client.
pub(super) struct Idle {
    id: u64,
    rs: Box<dyn ReadWrite>,
    ws: Box<dyn Write + Send>,
    /// The export once negotiated; before that, the hello has been sent.
    export: Option<Export>,
}

/// What the poller and the connections' workers share.
pub(super) struct Shared {
    exports: Vec<Export>,
    limits: Limits,
    budget: Arc<Budget>,
    stats: Arc<GatewayStats>,
    stop: AtomicBool,
    /// Wakes the poller to see `stop`.
    wake: Wake,
    epoll: std::os::fd::OwnedFd,
    conns: Mutex<std::collections::HashMap<u64, Tracked>>,
    idle: Mutex<std::collections::HashMap<u64, Idle>>,
}

/// An eventfd that wakes the poller.
pub(super) struct Wake(std::os::fd::OwnedFd);

impl Wake {
    fn new() -> rustix::io::Result<Wake> {
        use rustix::event::{eventfd, EventfdFlags};
        eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).map(Wake)
    }

    /// Makes the eventfd readable. A failure (counter overflow) still
    /// leaves it readable.
    fn signal(&self) {
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// Makes the eventfd unreadable again.
    fn drain(&self) {
        let _ = rustix::io::read(&self.0, &mut [0u8; 8]);
    }

    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.0)
    }
}

/// Epoll keys: the listener, the wake eventfd, then connection ids.
pub(super) const KEY_LISTENER: u64 = 0;
pub(super) const KEY_WAKE: u64 = 1;

impl Shared {
    /// Hands a connection to the poller until its client sends something.
    fn park(&self, c: Idle) {
        use rustix::event::epoll;
        if self.stop.load(Ordering::Acquire) {
            self.close(c.id);
            return;
        }
        let id = c.id;
        // Locked first: the poller, woken at once by a client that has
        // sent already, waits here until the connection is in the map.
        let mut idle = lock(&self.idle);
        let added = epoll::add(
            &self.epoll,
            &c.rs,
            epoll::EventData::new_u64(id),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT,
        );
        match added {
            Ok(()) => {
                idle.insert(id, c);
            }
            Err(e) => {
                drop(idle);
                tracing::warn!("nbd: cannot watch a connection: {e}");
                self.close(id);
            }
        }
    }

    /// Closes a tracked connection for its client.
    fn close(&self, id: u64) {
        if let Some(t) = lock(&self.conns).remove(&id) {
            t.conn.shutdown();
            tracing::info!(
                "nbd: connection {id} from {} closed after {:.1} s",
                t.peer,
                t.since.elapsed().as_secs_f64()
            );
        }
    }

    /// Serves a connection whose client has sent something, on a new
    /// thread, until it is idle again or ends.
    fn serve(self: &Arc<Self>, c: Idle) {
        let sh = self.clone();
        let id = c.id;
        let spawned = std::thread::Builder::new()
            .name("nbd-conn".into())
            .spawn(move || {
                let id = c.id;
                match sh.serve_some(c) {
                    Ok(Some(c)) => return sh.park(c),
                    Ok(None) => {}
                    Err(e) => {
                        sh.stats.errors.fetch_add(1, Ordering::Relaxed);
                        tracing::info!("nbd: connection {id}: {e}");
                    }
                }
                sh.close(id);
            });
        if let Err(e) = spawned {
            tracing::warn!("nbd: cannot start a connection thread: {e}");
            self.close(id);
        }
    }

    /// Negotiates (if not yet) and transmits until idle (`Some`: park it)
    /// or the end (`None`).
    fn serve_some(&self, mut c: Idle) -> Result<Option<Idle>, NbdError> {
        if c.export.is_none() {
            let e = match negotiate(&mut c.rs, &self.exports)? {
                Negotiated::Go(e) => e,
                Negotiated::Aborted => return Ok(None),
            };
            {
                let mut conns = lock(&self.conns);
                match conns.get_mut(&c.id) {
                    Some(t) if !t.expired => {
                        t.negotiated = true;
                        tracing::info!(
                            "nbd: connection {} from {}: export \"{}\" ({} bytes)",
                            c.id,
                            t.peer,
                            e.name,
                            e.dev.size()
                        );
                    }
                    _ => return Ok(None),
                }
            }
            // From now on a read that waits this long at a request
            // boundary lets the connection go idle.
            rustix::net::sockopt::set_socket_timeout(
                &c.rs,
                rustix::net::sockopt::Timeout::Recv,
                Some(self.limits.idle_after.max(Duration::from_millis(1))),
            )
            .map_err(io::Error::from)?;
            c.export = Some(e);
        }
        let Idle { rs, ws, export, .. } = &mut c;
        let Some(e) = export.as_ref() else {
            return Ok(None);
        };
        // A batch of small replies (fio: 32 × 4 KiB) goes out in one write;
        // replies as large as the buffer bypass it (see `write_reply`).
        let w = Arc::new(Mutex::new(io::BufWriter::with_capacity(256 << 10, ws)));
        let r = Timed {
            s: rs,
            boundary: false,
        };
        match transmit(r, w, e, WORKERS_PER_CONN, &self.budget, true)? {
            Ended::Done => Ok(None),
            Ended::Idle => {
                self.stats.parked.fetch_add(1, Ordering::Relaxed);
                Ok(Some(c))
            }
        }
    }
}

/// A connection's reading half with a read timeout set (see
/// [`Limits::idle_after`]): a read that times out is retried, except at a
/// request boundary, where it reports the idle connection.
pub(super) struct Timed<'a> {
    s: &'a mut Box<dyn ReadWrite>,
    boundary: bool,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.s.read(buf) {
                Err(e) if is_timeout(&e) && !self.boundary => continue,
                r => return r,
            }
        }
    }
}

impl Ready for Timed<'_> {
    fn peek(&self, buf: &mut [u8]) -> usize {
        self.s.peek(buf)
    }
    fn boundary(&mut self, on: bool) {
        self.boundary = on;
    }
}

/// A running NBD gateway.
pub struct Gateway {
    addr: ListenAddr,
    shared: Arc<Shared>,
    poller: Option<JoinHandle<()>>,
}

/// Pumps per connection. Two keep a batch in flight while the next is
/// read; more split the client's queue into smaller batches, which costs
/// more wake-ups per request than it gains in overlap.
pub const WORKERS_PER_CONN: usize = 2;

/// Further pumps per connection that run only while the client sends
/// large requests (more than [`BATCH_IO_MAX`], each alone in its batch):
/// then each pump carries one request, and two leave the connection
/// unread while both wait on the device. Small requests keep them parked,
/// since they would only split batches (see [`WORKERS_PER_CONN`]).
pub const LARGE_PUMPS: usize = 2;

impl Gateway {
    /// Binds `addr` and serves `exports` with the default [`Limits`].
    pub fn start(addr: &ListenAddr, exports: Vec<Export>) -> io::Result<Gateway> {
        Gateway::start_with(addr, exports, Limits::default())
    }

    /// Binds `addr` and serves `exports` within `limits`: one poller
    /// thread accepts connections and watches idle ones; a connection
    /// with requests to serve gets threads until it is idle again.
    pub fn start_with(
        addr: &ListenAddr,
        exports: Vec<Export>,
        limits: Limits,
    ) -> io::Result<Gateway> {
        use rustix::event::epoll;
        let (listener, bound) = match addr {
            ListenAddr::Tcp(a) => {
                let l = TcpListener::bind(a)?;
                let b = ListenAddr::Tcp(l.local_addr()?);
                l.set_nonblocking(true)?;
                (Listener::Tcp(l), b)
            }
            ListenAddr::Unix(p) => {
                // Replace a stale socket left by an earlier run, nothing else.
                use std::os::unix::fs::FileTypeExt;
                if let Ok(md) = std::fs::symlink_metadata(p) {
                    if md.file_type().is_socket() {
                        std::fs::remove_file(p)?;
                    }
                }
                let l = UnixListener::bind(p)?;
                l.set_nonblocking(true)?;
                (Listener::Unix(l), addr.clone())
            }
        };
        let stats = Arc::new(GatewayStats::default());
        let shared = Arc::new(Shared {
            exports,
            budget: Budget::new(limits.memory, stats.clone()),
            limits,
            stats,
            stop: AtomicBool::new(false),
            wake: Wake::new()?,
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            conns: Mutex::new(std::collections::HashMap::new()),
            idle: Mutex::new(std::collections::HashMap::new()),
        });
        epoll::add(
            &shared.epoll,
            listener.as_fd(),
            epoll::EventData::new_u64(KEY_LISTENER),
            epoll::EventFlags::IN,
        )?;
        epoll::add(
            &shared.epoll,
            shared.wake.as_fd(),
            epoll::EventData::new_u64(KEY_WAKE),
            epoll::EventFlags::IN,
        )?;
        let poller = {
            let sh = shared.clone();
            std::thread::Builder::new()
                .name("nbd-poll".into())
                .spawn(move || poll_loop(listener, sh))?
        };
        Ok(Gateway {
            addr: bound,
            shared,
            poller: Some(poller),
        })
    }

    /// The address actually bound (the port chosen for port 0).
    pub fn addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// Counters.
    pub fn stats(&self) -> &GatewayStats {
        &self.shared.stats
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }

    /// Stops accepting and closes every connection.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.signal();
        if let Some(h) = self.poller.take() {
            let _ = h.join();
        }
        lock(&self.shared.idle).clear();
        lock(&self.shared.conns)
            .values()
            .for_each(|t| t.conn.shutdown());
        if let ListenAddr::Unix(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A new connection: its reading half, its writing half, a handle to close it.
pub(super) type Accepted = (Box<dyn ReadWrite>, Box<dyn Write + Send>, Conn, String);

/// The hello that opens the fixed newstyle handshake.
pub(super) fn hello() -> [u8; 18] {
    let mut h = [0u8; 18];
    h[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    h[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    h[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    h
}

/// The gateway's one thread that waits: accepts connections, hands idle
/// ones whose client sent something to a worker, and closes those whose
/// handshake is late.
pub(super) fn poll_loop(l: Listener, sh: Arc<Shared>) {
    use rustix::event::epoll;
    let mut next_id = KEY_WAKE + 1;
    let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
    let tick = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    while !sh.stop.load(Ordering::Acquire) {
        events.clear();
        if let Err(e) = epoll::wait(
            &sh.epoll,
            rustix::buffer::spare_capacity(&mut events),
            Some(&tick),
        ) {
            if e != rustix::io::Errno::INTR {
                tracing::warn!("nbd: epoll: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for ev in &events {
            match ev.data.u64() {
                KEY_LISTENER => accept_all(&l, &sh, &mut next_id),
                KEY_WAKE => sh.wake.drain(),
                id => {
                    let c = lock(&sh.idle).remove(&id);
                    if let Some(c) = c {
                        let _ = epoll::delete(&sh.epoll, &c.rs);
                        sh.serve(c);
                    }
                }
            }
        }
        expire_handshakes(&sh);
    }
}

/// Accepts every pending connection, refusing those over the limit.
pub(super) fn accept_all(l: &Listener, sh: &Arc<Shared>, next_id: &mut u64) {
    loop {
        let (mut rs, ws, conn, peer) = match l.accept() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                // Out of descriptors, say: the connection waits in the
                // backlog for a later turn.
                tracing::warn!("nbd: accept: {e}");
                return;
            }
        };
        let open = lock(&sh.conns).len();
        if open >= sh.limits.max_connections {
            sh.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("nbd: connection from {peer} refused: {open} open, the limit");
            conn.shutdown();
            continue;
        }
        sh.stats.connections.fetch_add(1, Ordering::Relaxed);
        // The server speaks first; 18 bytes fit any new socket's buffer.
        if let Err(e) = rs.write_all(&hello()) {
            tracing::info!("nbd: connection from {peer} closed: {e}");
            continue;
        }
        let id = *next_id;
        *next_id += 1;
        tracing::info!("nbd: connection {id} from {peer} ({} open)", open + 1);
        lock(&sh.conns).insert(
            id,
            Tracked {
                conn,
                peer,
                since: std::time::Instant::now(),
                negotiated: false,
                expired: false,
                deadline: std::time::Instant::now() + sh.limits.handshake_timeout,
            },
        );
        sh.park(Idle {
            id,
            rs,
            ws,
            export: None,
        });
    }
}

/// Closes connections whose handshake outlived its deadline: an idle one
/// here, one in negotiation by shutting its socket (its worker then ends).
pub(super) fn expire_handshakes(sh: &Shared) {
    let now = std::time::Instant::now();
    let late: Vec<u64> = {
        let mut conns = lock(&sh.conns);
        conns
            .iter_mut()
            .filter(|(_, t)| !t.negotiated && !t.expired && now >= t.deadline)
            .map(|(&id, t)| {
                t.expired = true;
                t.conn.shutdown();
                id
            })
            .collect()
    };
    for id in late {
        sh.stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            "nbd: connection {id}: no handshake within {:?}",
            sh.limits.handshake_timeout
        );
        let c = lock(&sh.idle).remove(&id);
        if let Some(c) = c {
            let _ = rustix::event::epoll::delete(&sh.epoll, &c.rs);
            sh.close(id);
        }
    }
}

/// A stream whose next bytes can be looked at without waiting.
pub trait Ready {
    /// Copies the next bytes into `buf` without consuming them, if they
    /// have arrived; how many (0 if none have).
    fn peek(&self, buf: &mut [u8]) -> usize;
    /// Marks reads from now on as at a request boundary (`on`) or inside
    /// a request: a stream with a read timeout reports a timeout only at a
    /// boundary (see [`Limits::idle_after`]).
    fn boundary(&mut self, _on: bool) {}
}

pub(super) fn peek_now(fd: impl std::os::fd::AsFd, buf: &mut [u8]) -> usize {
    use rustix::net::RecvFlags;
    rustix::net::recv(fd, buf, RecvFlags::PEEK | RecvFlags::DONTWAIT).map_or(0, |(n, _)| n)
}

impl Ready for TcpStream {
    fn peek(&self, buf: &mut [u8]) -> usize {
        peek_now(self, buf)
    }
}

impl Ready for UnixStream {
    fn peek(&self, buf: &mut [u8]) -> usize {
        peek_now(self, buf)
    }
}

/// A socket readable and writable (TCP or Unix).
pub trait ReadWrite: Read + Write + Ready + Send + std::os::fd::AsFd {}
impl<T: Read + Write + Ready + Send + std::os::fd::AsFd> ReadWrite for T {}

impl Ready for Box<dyn ReadWrite> {
    fn peek(&self, buf: &mut [u8]) -> usize {
        (**self).peek(buf)
    }
}

/// An in-memory duplex stream for fuzzing: reads come from a byte slice,
/// writes are discarded.
pub(super) struct FuzzStream<'a> {
    input: &'a [u8],
}

impl Read for FuzzStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Ready for FuzzStream<'_> {
    fn peek(&self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        n
    }
}

impl Write for FuzzStream<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Fuzzing entry point: feeds arbitrary bytes to the handshake and then the
/// transmission phase against a small in-memory export (inline execution).
/// Must never panic or hang; errors are the expected outcome.
pub fn fuzz_stream(data: &[u8]) {
    let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(64 << 10, 512, false));
    let exports = [Export {
        name: "fuzz".into(),
        description: String::new(),
        dev,
    }];
    let mut s = FuzzStream { input: data };
    if let Ok(Negotiated::Go(e)) = handshake(&mut s, &exports) {
        let w = Arc::new(Mutex::new(io::sink()));
        let _ = transmission(s, w, &e, 0);
    }
}
