//! How a process of an embedded host waits for its completion: spinning
//! (also reading the socket), then blocking on its eventfd and, as a socket
//! reader, the socket (`waiter.rs`).

use super::*;

impl LocalProcess {
    /// Waits for the completion of the operation just started, spinning
    /// as long as the process's [`SpinPolicy`] says, and teaches the policy
    /// how long the wait took.
    pub(super) fn wait(&self, expect: Expect) -> Result<Completion, IpcError> {
        self.wait_via(expect, None, NEVER)
    }

    /// [`LocalProcess::wait`] for the reply to a Send that asked for its
    /// answers at `answer`, the thread's answer socket (read first); `due`
    /// is when this thread must run the exchange's timer itself
    /// (`Engine::own_deadline`).
    pub(super) fn wait_via(
        &self,
        expect: Expect,
        answer: Option<&Arc<std::net::UdpSocket>>,
        due: OwnDue,
    ) -> Result<Completion, IpcError> {
        let sh = &self.shared;
        let start = sh.now();
        let policy = self.spin.get();
        let spinners = if policy.wants_to_spin() {
            sh.spinning()
        } else {
            0
        };
        let mut busy = false;
        let spin = Spin::begin(&policy, start, spinners, sh.cpus, || {
            busy = sh.run_queue.contended(start, sh.cpus);
            busy
        });
        let crowded = policy.is_adaptive() && (busy || spinners >= sh.cpus);
        let mut blocked = false;
        let r = self.wait_spin_then_block(expect, answer, due, spin, &mut blocked);
        self.waited(policy, start, blocked, crowded);
        r
    }

    /// Counts a wait begun at `start` that blocked or not, and teaches an
    /// adaptive `policy` (the process's) how long it took.
    pub(super) fn waited(&self, mut policy: SpinPolicy, start: u64, blocked: bool, crowded: bool) {
        let mut n = self.waits.get();
        if blocked {
            n.blocked += 1;
            n.blocked_crowded += u64::from(crowded);
        } else {
            n.unblocked += 1;
        }
        self.waits.set(n);
        if policy.is_adaptive() {
            policy.record(self.shared.now().saturating_sub(start));
            self.spin.set(policy);
        }
    }

    pub(super) fn wait_spin_then_block(
        &self,
        expect: Expect,
        answer: Option<&Arc<std::net::UdpSocket>>,
        mut due: OwnDue,
        mut spin: Spin,
        blocked: &mut bool,
    ) -> Result<Completion, IpcError> {
        let sh = &self.shared;
        let w = &self.waiter;
        let start = spin.start();
        // Microseconds between socket polls while spinning: none when a
        // datagram is expected; when a local hand-over is, polls are rare,
        // since a recv syscall in progress delays seeing the hand-over.
        let gap: u64 = match expect {
            Expect::Remote | Expect::Either => 0,
            Expect::Receive if self.last_from_remote.get() => 0,
            Expect::Receive => 2,
            Expect::Local => 8,
        };
        let mut next_poll = start + gap;
        let mut spinning = spin.budget_us() > 0;
        // While spinning this thread reads the socket itself.
        if spinning {
            Waiter::spinning(sh.net.socket());
        }
        // Counted as a spinner only once the wait has lasted a while: the
        // count is a hint (whether the socket needs another reader), and
        // two writes to its shared line on every short wait cost more than
        // a local exchange's own work.
        // (A wait for a remote answer counts in at once: with no spinner
        // counted the background thread would compete for each datagram.)
        let mut counted = (spinning && gap == 0).then(|| Counted::enter(&sh.spinners, SPIN_BEGINS));
        loop {
            if w.ready.swap(false, Ordering::AcqRel) {
                if let Some(c) = w.take() {
                    return Ok(c);
                }
                if let Some(c) = sh.with_engine(|e, _| e.take_completion(self.pid)) {
                    return Ok(c);
                }
            }
            if w.destroyed.load(Ordering::Acquire) {
                return Err(IpcError::Destroyed);
            }
            // This thread times its own exchange (no other thread wakes for
            // it): retransmit, or learn the next deadline.
            if let Some(a) = answer.filter(|_| sh.now() >= due.at) {
                // The reply may have come while this thread waited for a
                // CPU after its wait timed out: not a loss.
                if let Some(c) = sh.poll_answer(self.pid, a) {
                    return Ok(c);
                }
                let (d, c) = sh.with_engine_as(Some(self.pid), |e, now| {
                    e.handle_timeout(now);
                    e.own_deadline(self.pid)
                });
                if let Some(c) = c {
                    return Ok(c);
                }
                due = d.unwrap_or(NEVER);
                continue;
            }
            if sh.stopping() {
                // The engine failed every blocked op at shutdown; pick it
                // up. Look at the slot under the engine lock: the thread
                // shutting the engine down hands completions over under
                // it, so one handed over just before is seen here and not
                // left behind to answer this process's next operation
                // (which would return while the engine still held that
                // operation's lent buffer).
                w.ready.store(false, Ordering::SeqCst);
                return sh.with_engine(|e, _| {
                    if let Some(c) = w.take() {
                        return Ok(c);
                    }
                    e.take_completion(self.pid).ok_or_else(|| {
                        e.cancel(self.pid);
                        IpcError::Shutdown
                    })
                });
            }
            if spinning {
                let polled = gap == 0 || {
                    let now = sh.now();
                    now >= next_poll && {
                        next_poll = now + gap;
                        true
                    }
                };
                if polled {
                    if let Some(c) = answer.and_then(|a| sh.poll_answer(self.pid, a)) {
                        return Ok(c);
                    }
                    // One datagram at a time: if it was ours, see it at once
                    // instead of paying another empty recv first. (With an
                    // answer socket the main one is only looked at every
                    // eighth turn: the reply comes to the other.)
                    if answer.is_none() || spin.turns().is_multiple_of(8) {
                        if let (_, Some(c)) = sh.poll_socket_as(Some(self.pid), 1) {
                            return Ok(c);
                        }
                    }
                }
                if spin.turns().is_multiple_of(32) {
                    sh.run_timers_if_due();
                }
                if spin.again_after(polled, || sh.now(), |t| sh.run_queue.contended(t, sh.cpus)) {
                    if spin.turns() == 64 && counted.is_none() {
                        counted = Some(Counted::enter(&sh.spinners, SPIN_BEGINS));
                    }
                    continue;
                }
                spinning = false;
                counted = None;
            }
            *blocked = true;
            // Noted before parking, so a waker that sees `parked` has an
            // eventfd to signal.
            let fds = w.park_here();
            w.parked.store(true, Ordering::SeqCst);
            if w.ready.load(Ordering::SeqCst) || w.destroyed.load(Ordering::SeqCst) {
                w.parked.store(false, Ordering::SeqCst);
                continue;
            }
            // Block. Read the socket too, unless another thread is spinning
            // on it (then a datagram would wake us for nothing) or this
            // process never reads it (the kernel server). A process
            // awaiting its reply at the thread's answer socket blocks in
            // that socket alone (one syscall, as a plain UDP client's
            // `recv`); the background thread reads the main one.
            let reads = answer.is_none() && self.socket_reader.get() && sh.spinning() == 0;
            let mut sock_ready = false;
            let mut got = None;
            // Read by the lone reader's own wait: the datagrams it took.
            let mut lone_took = None;
            let ev = if let (Some(a), Some(f)) = (answer, &fds) {
                let left = Duration::from_micros(due.at.saturating_sub(sh.now()));
                got = ANSWER_BUF.with(|b| {
                    let mut b = b.borrow_mut();
                    let (n, from) = f.recv_blocking(a, &mut b[..], left, due.exact, &w.ready)?;
                    sh.net.count_answer();
                    Some(sh.handle_answer(self.pid, from, &b[..n]))
                });
                false
            } else if let (true, Some(f)) = (reads, &fds) {
                let (e, s, l) = self.block_reading(f, expect);
                (sock_ready, lone_took) = (s, l);
                e
            } else {
                // A process that never reads the socket (the kernel server)
                // runs due timers only while nobody spins: spinners run
                // them (and its wake-up would take a CPU from them); with
                // everyone blocked, taking them here keeps that work off
                // the threads waiting for answers.
                let t = if self.socket_reader.get() {
                    sh.time_to_timer(Duration::from_millis(1))
                } else if sh.spinning() == 0 {
                    sh.time_to_timer(Duration::from_millis(50))
                } else {
                    Duration::from_millis(50)
                };
                match &fds {
                    Some(f) => poll2(f.efd.fd(), None, t).0,
                    None => {
                        std::thread::sleep(t.min(Duration::from_millis(1)));
                        false
                    }
                }
            };
            w.parked.store(false, Ordering::SeqCst);
            w.unpark();
            if ev {
                if let Some(f) = &fds {
                    f.efd.drain();
                }
            }
            if let Some(Some(c)) = got {
                return Ok(c);
            }
            match lone_took {
                Some((_, Some(c))) => return Ok(c),
                // All that was queued, unless the batch was full.
                Some((k, None)) if k < crate::net::RECV_BATCH => {
                    sh.run_timers_if_due();
                    continue;
                }
                _ => {}
            }
            if reads {
                match sh.poll_socket_as(Some(self.pid), 256) {
                    (_, Some(c)) => return Ok(c),
                    (0, None) if sock_ready => {
                        sh.net.counters.idle_wakes.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
            sh.run_timers_if_due();
        }
    }

    /// Blocks this parked process's thread as a reader of the host's
    /// socket (`Shared::enter_reader`) until it is woken, a datagram
    /// comes, or the next timer. Returns (eventfd signalled, socket
    /// readable, what the lone reader's own wait took and handled).
    pub(super) fn block_reading(
        &self,
        f: &crate::waiter::WaitFds,
        expect: Expect,
    ) -> (bool, bool, Option<(usize, Option<Completion>)>) {
        let sh = &self.shared;
        let t = sh.time_to_timer(Duration::from_millis(50));
        // (A local Send's reply comes as a hand-over, never in a
        // datagram.)
        let needs_socket = !matches!(expect, Expect::Local);
        // Waiting in the socket pays off when a datagram is what ends the
        // wait: a hand-over would have to send one (dearer than
        // signalling the eventfd), so a server of local clients waits as
        // before.
        let datagram_next = match expect {
            Expect::Receive => self.last_from_remote.get(),
            _ => needs_socket,
        };
        let may_lone = datagram_next && sh.may_wait_lone(t);
        let r = sh.enter_reader(may_lone, needs_socket);
        match r.reading() {
            Reading::Lone => {
                f.waiting_in(Some(sh.net.lone_wait()));
                let took =
                    (!self.waiter.ready.load(Ordering::SeqCst)).then(|| sh.recv_lone(self.pid));
                f.waiting_in(None);
                (false, false, took)
            }
            Reading::Gated(_) => (poll2(f.efd.fd(), None, t).0, false, None),
            alone => {
                let (s, e) = Waiter::block_on_both(
                    f,
                    sh.net.socket(),
                    sh.net.serial(),
                    t,
                    alone == Reading::Alone,
                );
                (e, s, None)
            }
        }
    }

    pub(super) fn expect_for(&self, peer: Pid) -> Expect {
        if peer.is_group() {
            Expect::Either
        } else if peer.host() == self.shared.host {
            Expect::Local
        } else {
            Expect::Remote
        }
    }
}
