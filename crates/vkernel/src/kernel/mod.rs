//! The runtime of one logical host: the engine behind a mutex, one UDP
//! socket, a background thread for timers, and the waiting strategy.
//!
//! There is no network server thread on the common path. A process that
//! sends puts its datagram on the wire from its own thread, and a process
//! that waits reads the socket itself (busy-polling briefly, then blocking
//! in its own epoll set on its eventfd and, as a socket reader, the socket
//! registered `EPOLLEXCLUSIVE`; a process that does not read the socket
//! blocks on its eventfd alone), so the reply it waits for is usually
//! processed by the thread that wants it. Whoever reads a
//! datagram runs it through the engine and wakes its target. The
//! background thread only reads the socket when no process is waiting, and
//! runs timers.
//!
//! By concern: `config` (the configuration and its checks), `shared` (the
//! state a host's threads share, and the way into the engine), `reading`
//! (who reads the sockets, and how), `background` (the timer thread);
//! this file is [`Kernel`] itself, embedded or attached.

mod background;
mod config;
mod reading;
mod shared;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vkernel_proto::engine::KERNEL_SERVER_LOCAL_ID;
use vkernel_proto::{Config, Engine, HostId, IpcError, Micros, Pid, Stats};

use crate::attach::program::Attachment;
use crate::net::Net;
use crate::process::{LocalProcess, Process};
use crate::sys::{poll2, EventFd};
use crate::vocab::CacheLine;

pub use config::{KernelConfig, KernelError};
pub(crate) use reading::Reading;
pub(crate) use shared::{Shared, State, SPIN_BEGINS};

/// One logical host: a kernel instance with its own UDP port, run by this
/// program ([`Kernel::start`]) or by a machine host this program attached
/// to ([`Kernel::attach`]). The API is the same either way.
///
/// Dropping it shuts the host down (or detaches): blocked operations fail
/// with [`IpcError::Shutdown`].
pub struct Kernel {
    imp: Imp,
}

enum Imp {
    Embedded(Embedded),
    Attached(Arc<Attachment>),
}

/// A logical host run by this program.
struct Embedded {
    shared: Arc<Shared>,
    bg: Option<JoinHandle<()>>,
    ks: Option<JoinHandle<()>>,
}

impl Kernel {
    /// Starts a logical host with the given configuration.
    pub fn start(cfg: KernelConfig) -> Result<Kernel, KernelError> {
        let mut peers: Vec<crate::PeerSpec> = cfg
            .peers
            .iter()
            .map(|&a| crate::PeerSpec::Addr(a))
            .collect();
        peers.extend(cfg.named_peers.iter().cloned());
        if let Some(why) = crate::unreachable_from(cfg.bind, &peers) {
            tracing::warn!("{why}");
        }
        let mut net = Net::bind(cfg.bind, cfg.faults.clone(), cfg.socket_buffer)?;
        if let Some(port) = cfg.multicast_port {
            net.bind_multicast(port)?;
        }
        net.set_gso(cfg.gso);
        let side = cfg.side_sockets && net.use_side_sockets()?;
        let me = net.local_addr()?;
        let seed = cfg.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ ((std::process::id() as u64) << 32) ^ me.port() as u64
        });
        let (datagram_size, auth) = cfg.check(me, seed)?;
        let host_timeout = cfg.host_timeout.as_micros() as Micros;
        let resolver = Arc::new(crate::discover::Resolver::new(
            me,
            &cfg.peers,
            cfg.resolve_interval,
        ));
        let mut discovery: Vec<SocketAddr> = cfg.peers.clone();
        discovery.extend(resolver.initial(&cfg.named_peers));
        let mut seen = std::collections::HashSet::new();
        discovery.retain(|p| *p != me && seen.insert(*p));
        let ecfg = Config {
            host_id: cfg.host_id.map(HostId),
            discovery,
            datagram_size,
            window: cfg.window.max(datagram_size),
            write_behind: cfg.write_behind,
            alien_pool: cfg.alien_pool.max(1),
            alien_per_host: (cfg.alien_pool / 2).max(1),
            host_timeout,
            alien_timeout: host_timeout * 2 + 2_000_000,
            seed,
            multicast_port: cfg.multicast_port,
            group_policy: cfg.group_policy.clone(),
            auth,
            metrics: cfg.metrics,
            // Named in every datagram, so that small ones may leave from a
            // side socket (see `Net::send`).
            reply_port: if side { me.port() } else { 0 },
            ..Config::default()
        };
        let alloc_wait = Duration::from_micros(ecfg.alloc_timeout) * 4 + Duration::from_secs(1);
        let state = State {
            engine: Engine::new(ecfg, 0),
            waiters: crate::waiter::Waiters::default(),
            conflict: None,
        };
        let gathers = net.gathers();
        // (Side sockets are off with a fault injector, which sends from
        // the main socket; answer sockets are not: it sends from them too.)
        let answers = (cfg.answer_sockets && (side || net.has_faults()) && cfg.side_sockets)
            .then_some(me.ip());
        let direct = cfg.direct_sends
            && answers.is_some()
            && std::env::var_os("VKERNEL_DIRECT_SENDS").is_none_or(|v| v != "off");
        let mut shared = Shared {
            state: Mutex::new(state),
            net,
            gathers,
            answers,
            direct,
            direct_tally: Default::default(),
            attach_tally: Default::default(),
            peer_book: Default::default(),
            direct_peers: Default::default(),
            clock: crate::clock::Clock::new(),
            next_timer: CacheLine(AtomicU64::new(0)),
            spinners: CacheLine(AtomicU64::new(0)),
            blocked_readers: CacheLine(AtomicU64::new(0)),
            gated: AtomicU64::new(0),
            lone_batch: Mutex::new(None),
            busy_until: CacheLine(AtomicU64::new(0)),
            async_spinners: AtomicU64::new(0),
            async_left: AtomicBool::new(false),
            async_asleep: AtomicBool::new(false),
            bg_efd: EventFd::new()?,
            stop: AtomicBool::new(false),
            bulk_rx: AtomicBool::new(false),
            rx_batch: Mutex::new(None),
            spin: cfg.spin_policy(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            run_queue: crate::spin::RunQueue::new(),
            pace: crate::attach::wait::Pace::new(),
            peer_retired: AtomicU64::new(0),
            send_deadline: cfg.send_deadline,
            host: HostId(0),
            tracer: match &cfg.trace {
                Some(p) => Some(crate::trace::Tracer::create(p)?),
                None => None,
            },
            resolver,
            #[cfg(feature = "otel")]
            otel: cfg.otel.then(crate::otel::Spans::new),
        };
        // Allocate the host id before anyone else sees the state.
        let deadline = Instant::now() + alloc_wait;
        let started = Instant::now();
        // A fixed id is announced once; give a holder a moment to complain.
        let fixed_wait =
            if cfg.host_id.is_some() && !shared.lock().engine.config().discovery.is_empty() {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
        let host = loop {
            shared.poll_socket(256);
            shared.run_timers_if_due();
            let (id, conflict) = {
                let st = shared.lock();
                (st.engine.host_id(), st.conflict)
            };
            if let Some(c) = conflict {
                return Err(KernelError::HostIdConflict(c));
            }
            if let Some(id) = id {
                if cfg.host_id.is_none() || started.elapsed() >= fixed_wait {
                    break id;
                }
            }
            if Instant::now() >= deadline {
                return Err(KernelError::AllocationTimeout);
            }
            poll2(
                shared.net.fd(),
                None,
                shared.time_to_timer(Duration::from_millis(10)),
            );
        };
        shared.host = host;
        if let Some(t) = &shared.tracer {
            t.set_host(host.0);
        }
        let shared = Arc::new(shared);
        shared.start_resolver()?;
        let bg = {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("vk-{host}-timer"))
                .spawn(move || s.background())?
        };
        let mut emb = Embedded {
            shared,
            bg: Some(bg),
            ks: None,
        };
        let kpid = emb.shared.with_engine(|e, _| e.create_kernel_server())?;
        let ks = LocalProcess::new(emb.shared.clone(), kpid)?;
        emb.ks = Some(
            std::thread::Builder::new()
                .name(format!("vk-{host}-kserver"))
                .spawn(move || crate::kernel_server::run(ks))?,
        );
        Ok(Kernel {
            imp: Imp::Embedded(emb),
        })
    }

    /// Attaches this program to the machine host listening on `path` (see
    /// `vkernel host`): processes created through the returned handle are
    /// that host's processes, in its pid space, with its names, groups,
    /// kernel server and sockets.
    pub fn attach(path: impl AsRef<std::path::Path>) -> Result<Kernel, KernelError> {
        Kernel::attach_with(path, &KernelConfig::default())
    }

    /// [`Kernel::attach`] whose processes wait as `cfg.spin` and
    /// `cfg.adaptive_spin` say and default to `cfg.send_deadline`; the
    /// rest of `cfg` is the machine host's business.
    pub fn attach_with(
        path: impl AsRef<std::path::Path>,
        cfg: &KernelConfig,
    ) -> Result<Kernel, KernelError> {
        let spin = cfg.spin_policy();
        let a = Attachment::connect(path.as_ref(), spin, cfg.send_deadline)?;
        Ok(Kernel {
            imp: Imp::Attached(a),
        })
    }

    /// [`Kernel::attach`] to the machine host at
    /// [`crate::attach::default_path`] (`$VKERNEL_HOST`, or the per-user
    /// default).
    pub fn attach_default() -> Result<Kernel, KernelError> {
        Kernel::attach(crate::attach::default_path())
    }

    /// True if this handle is attached to a machine host rather than
    /// running its own.
    pub fn is_attached(&self) -> bool {
        matches!(self.imp, Imp::Attached(_))
    }

    /// Makes this host a machine host: programs may attach to it through
    /// a Unix socket at `path` whose permission bits are `mode` (who may
    /// attach). Stops serving when the returned handle is dropped.
    pub fn serve_attach(
        &self,
        path: impl AsRef<std::path::Path>,
        mode: u32,
    ) -> Result<crate::attach::AttachServer, KernelError> {
        match &self.imp {
            Imp::Embedded(e) => Ok(crate::attach::AttachServer::start(
                e.shared.clone(),
                path.as_ref(),
                mode,
            )?),
            Imp::Attached(_) => Err(KernelError::Config(
                "an attached program cannot serve attachments; run `vkernel host`".into(),
            )),
        }
    }

    /// This host's logical id.
    pub fn host_id(&self) -> HostId {
        match &self.imp {
            Imp::Embedded(e) => e.shared.host,
            Imp::Attached(a) => a.host,
        }
    }

    /// The pid of this host's kernel-server process.
    pub fn kernel_server(&self) -> Pid {
        Pid::new(self.host_id(), KERNEL_SERVER_LOCAL_ID)
    }

    /// The UDP address this host listens on.
    pub fn local_addr(&self) -> SocketAddr {
        let a = match &self.imp {
            Imp::Embedded(e) => e.shared.net.local_addr().ok(),
            Imp::Attached(a) => a.host_addr,
        };
        a.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Receive buffer granted by the OS.
    /// (0 for an attached program, which has no socket of its own.)
    pub fn socket_buffer(&self) -> usize {
        match &self.imp {
            Imp::Embedded(e) => e.shared.net.rcvbuf(),
            Imp::Attached(_) => 0,
        }
    }

    /// Adds a peer address (static peer list) at run time.
    pub fn add_peer(&self, a: SocketAddr) {
        match &self.imp {
            Imp::Embedded(e) => {
                e.shared.resolver.add_static(a);
                e.shared.with_engine(|e, _| e.add_discovery(a));
            }
            Imp::Attached(at) => at.add_peer(&a.to_string()),
        }
    }

    /// Adds a peer at run time: an address as [`Kernel::add_peer`] does, a
    /// name to be followed from now on (looked up at once on the host's
    /// resolver thread, then every `resolve_interval`). Attached, the
    /// machine host follows the name, since it owns the socket.
    pub fn add_peer_spec(&self, p: &crate::PeerSpec) -> Result<(), KernelError> {
        match (&self.imp, p) {
            (_, crate::PeerSpec::Addr(a)) => {
                self.add_peer(*a);
                Ok(())
            }
            (Imp::Embedded(e), name) => {
                e.shared.resolver.add_name(name.clone());
                Ok(e.shared.start_resolver()?)
            }
            (Imp::Attached(at), name) => {
                at.add_peer(&name.to_string());
                Ok(())
            }
        }
    }

    /// Creates a process owned by the caller (a V process is a thread that
    /// uses this handle).
    pub fn create_process(&self) -> Result<Process, IpcError> {
        match &self.imp {
            Imp::Embedded(e) => {
                let pid = e.shared.with_engine(|e, _| e.create_process())?;
                Ok(LocalProcess::new(e.shared.clone(), pid)?
                    .allow_direct()
                    .allow_peer()
                    .into())
            }
            Imp::Attached(a) => Ok(a.create_process()?.into()),
        }
    }

    /// Creates a process whose operations are futures (see [`crate::aio`]):
    /// a few runtime threads can serve any number of them.
    pub fn create_async_process(&self) -> Result<crate::AsyncProcess, IpcError> {
        match &self.imp {
            Imp::Embedded(e) => {
                let pid = e.shared.with_engine(|e, _| e.create_process())?;
                let sink = Arc::new(crate::aio::FutureSink::default());
                let p = LocalProcess::with_sink(e.shared.clone(), pid, sink.clone());
                Ok(crate::AsyncProcess::local(p, sink))
            }
            Imp::Attached(a) => crate::AsyncProcess::attached(a.create_process()?.into()),
        }
    }

    /// Creates a process and runs `f` with it on a new thread.
    pub fn spawn<F>(&self, name: &str, f: F) -> Result<(Pid, JoinHandle<()>), IpcError>
    where
        F: FnOnce(Process) + Send + 'static,
    {
        let p = self.create_process()?;
        let pid = p.pid();
        let h = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || f(p))
            .map_err(|_| IpcError::TableFull)?;
        Ok((pid, h))
    }

    /// True if `pid` is a live process of this host.
    pub fn process_exists(&self, pid: Pid) -> bool {
        match &self.imp {
            Imp::Embedded(e) => e.shared.with_engine(|e, _| e.process_exists(pid)),
            Imp::Attached(a) => a.process_exists(pid),
        }
    }

    /// A copy of the protocol counters.
    /// (Attached: the machine host's, read from its JSON document.)
    /// Reading drops the counters of peers gone silent (docs/METRICS.md).
    pub fn stats(&self) -> Stats {
        match &self.imp {
            Imp::Embedded(e) => e.shared.snapshot().stats,
            Imp::Attached(a) => crate::metrics::stats_from_json(
                &a.document(crate::attach::control::ask::STATS_JSON),
            ),
        }
    }

    /// Every counter and gauge as JSON (the same document `vkernel stats`
    /// reads from a host's kernel server).
    pub fn stats_json(&self) -> String {
        match &self.imp {
            Imp::Embedded(e) => e.shared.snapshot().to_json(),
            Imp::Attached(a) => a.document(crate::attach::control::ask::STATS_JSON),
        }
    }

    /// Every counter and gauge in the Prometheus text format.
    pub fn prometheus(&self) -> String {
        match &self.imp {
            Imp::Embedded(e) => e.shared.snapshot().to_prometheus(),
            Imp::Attached(a) => a.document(crate::attach::control::ask::PROMETHEUS),
        }
    }

    /// Serves `/metrics` (Prometheus) and `/stats.json` over HTTP on
    /// `addr` until the host shuts down; returns the bound address.
    pub fn serve_metrics(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        match &self.imp {
            Imp::Embedded(e) => crate::metrics::serve(e.shared.clone(), addr),
            Imp::Attached(_) => Err(std::io::Error::other(
                "an attached program's metrics are the machine host's: serve them there (`vkernel host --metrics`)",
            )),
        }
    }

    /// Datagram-layer counters (injected faults, send errors).
    /// (An attached program sends no datagrams itself: all zero.)
    pub fn net_counters(&self) -> &crate::net::NetCounters {
        match &self.imp {
            Imp::Embedded(e) => &e.shared.net.counters,
            Imp::Attached(a) => &a.net_counters,
        }
    }

    /// Bulk bursts sent: (segmented sends, datagrams in them, sendmmsg
    /// calls).
    pub fn batch_counts(&self) -> (u64, u64, u64) {
        match &self.imp {
            Imp::Embedded(e) => e.shared.net.batch_counts(),
            Imp::Attached(_) => (0, 0, 0),
        }
    }

    /// Measured smoothed RTT to a host, if any.
    pub fn srtt(&self, host: HostId) -> Option<Duration> {
        match &self.imp {
            Imp::Embedded(e) => e
                .shared
                .with_engine(|e, _| e.srtt(host))
                .map(Duration::from_micros),
            Imp::Attached(a) => a.srtt(host),
        }
    }

    /// Exchanges between this program's threads' processes that went
    /// through their peer pages, not the engine; they count among
    /// `local_exchanges`. (0 for an attached program: its machine host's
    /// `AttachServer::peer_exchanges` counts those of attached programs.)
    pub fn peer_exchanges(&self) -> u64 {
        match &self.imp {
            Imp::Embedded(e) => e.shared.peer_exchanges(),
            Imp::Attached(_) => 0,
        }
    }

    /// Stops the host; blocked operations fail with `Shutdown`.
    pub fn shutdown(&mut self) {
        let e = match &mut self.imp {
            Imp::Embedded(e) => e,
            Imp::Attached(a) => return a.close(),
        };
        if e.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        e.shared.with_engine(|e, _| e.shutdown());
        let direct: Vec<_> = e.shared.lock().waiters.values().cloned().collect();
        for w in &direct {
            e.shared.wake_direct(w);
            // (Wakes its thread if it waits in a page: `gone` says why.)
            if let Some(p) = w.peer() {
                p.page.die(&IpcError::HostLost);
            }
        }
        e.shared.resolver.stop();
        e.shared.bg_efd.signal();
        if let Some(h) = e.bg.take() {
            let _ = h.join();
        }
        if let Some(h) = e.ks.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(crate) fn destroy_local(shared: &Shared, pid: Pid) -> Result<(), IpcError> {
    shared.with_engine(|e, now| e.destroy_process(now, pid))?;
    if let Some(w) = shared.unregister(pid) {
        w.destroy();
        shared.wake_direct(&w);
        shared.peer_died(&w, pid);
    }
    Ok(())
}
