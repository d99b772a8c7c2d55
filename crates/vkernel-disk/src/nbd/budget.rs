//! The gateway's memory budget and limits.

use super::*;

/// The gateway's memory budget: payload bytes of requests read and not yet
/// answered (WRITE data, READ buffers), over every connection. A request
/// waits for its bytes before its payload is read, in arrival order; one
/// larger than the whole budget waits for all of it (so it still runs,
/// alone).
pub struct Budget {
    total: usize,
    state: Mutex<BudgetState>,
    freed: std::sync::Condvar,
    stats: Arc<GatewayStats>,
}

#[derive(Default)]
pub(super) struct BudgetState {
    used: usize,
    /// Tickets: waiters get their bytes in the order they asked.
    next: u64,
    serving: u64,
    /// Threads waiting (a release wakes them only if there are any).
    waiting: usize,
}

impl Budget {
    /// A budget of `total` bytes counted into `stats`.
    pub fn new(total: usize, stats: Arc<GatewayStats>) -> Arc<Budget> {
        Arc::new(Budget {
            total: total.max(1),
            state: Mutex::new(BudgetState::default()),
            freed: std::sync::Condvar::new(),
            stats,
        })
    }

    fn grant(self: &Arc<Self>, st: &mut BudgetState, n: usize) -> Lease {
        st.used += n;
        self.stats
            .memory_peak
            .fetch_max(st.used as u64, Ordering::Relaxed);
        Lease {
            budget: Some(self.clone()),
            n,
        }
    }

    /// Takes `n` bytes (at most the whole budget), waiting for them.
    pub(super) fn take(self: &Arc<Self>, n: usize) -> Lease {
        if n == 0 {
            return Lease::none();
        }
        let n = n.min(self.total);
        let mut st = lock(&self.state);
        let me = st.next;
        st.next += 1;
        if st.serving != me || st.used + n > self.total {
            self.stats.memory_waits.fetch_add(1, Ordering::Relaxed);
            st.waiting += 1;
            while st.serving != me || st.used + n > self.total {
                st = match self.freed.wait(st) {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
            }
            st.waiting -= 1;
        }
        st.serving += 1;
        let l = self.grant(&mut st, n);
        let others = st.waiting > 0;
        drop(st);
        if others {
            // The next ticket may fit too.
            self.freed.notify_all();
        }
        l
    }

    /// Takes `n` bytes if they are free and nobody waits.
    pub(super) fn try_take(self: &Arc<Self>, n: usize) -> Option<Lease> {
        if n == 0 {
            return Some(Lease::none());
        }
        let mut st = lock(&self.state);
        if st.serving != st.next || st.used + n > self.total {
            return None;
        }
        Some(self.grant(&mut st, n))
    }
}

/// Bytes held from a [`Budget`], given back on drop.
pub(super) struct Lease {
    budget: Option<Arc<Budget>>,
    n: usize,
}

impl Lease {
    pub(super) fn none() -> Lease {
        Lease { budget: None, n: 0 }
    }

    /// Adds `other`'s bytes to this lease (both from one budget).
    pub(super) fn join(&mut self, mut other: Lease) {
        if other.n == 0 {
            return;
        }
        if self.budget.is_none() {
            self.budget = other.budget.take();
        }
        self.n += std::mem::take(&mut other.n);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let (Some(b), true) = (&self.budget, self.n > 0) {
            let mut st = lock(&b.state);
            st.used -= self.n;
            if st.waiting > 0 {
                drop(st);
                b.freed.notify_all();
            }
        }
    }
}

/// Limits of a gateway (see docs/IPDISK.md, "Limits").
#[derive(Clone, Debug)]
pub struct Limits {
    /// Payload bytes held for requests not yet answered, over every
    /// connection; at the limit the gateway stops reading requests until
    /// replies drain.
    pub memory: usize,
    /// Connections open at once; one more is closed at once (logged).
    pub max_connections: usize,
    /// A connection that has not finished negotiating after this long is
    /// closed.
    pub handshake_timeout: Duration,
    /// A connection with no request for this long gives back its threads
    /// (it waits on the gateway's poller).
    pub idle_after: Duration,
}

/// Default memory budget: 256 MiB (eight maximum-size requests).
pub const DEFAULT_MEMORY: usize = 256 << 20;
/// Default connection limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default handshake timeout (qemu-nbd's `--handshake-limit` default).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory: DEFAULT_MEMORY,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_after: Duration::from_secs(2),
        }
    }
}
