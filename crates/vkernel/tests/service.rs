//! The service layer: names, the dispatcher and worker pool, the client
//! process pool.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::two_hosts;
use vkernel::service::{self, ClientPool, Handler, PoolConfig, Request, WorkerPool};
use vkernel::{IpcError, Kernel, KernelConfig, Message, Pid, Scope};

const ECHO: u32 = 1;
const SLOW: u32 = 2;
const INLINE: u32 = 3;
const BUSY: u32 = 0xb;
const FAILED: u32 = 0xf;
const IDLE: u32 = 0x7e_57ff;

/// Adds one to word 1, says in word 2 which process ran it. A SLOW
/// request takes 300 ms, or with `gather` set waits (bounded) until that
/// many are in the handler at once.
#[derive(Default)]
struct Echo {
    ran: AtomicUsize,
    gather: usize,
    slow_entered: AtomicUsize,
    in_slow: AtomicUsize,
    most_in_slow: AtomicUsize,
}

impl Handler for Echo {
    type Scratch = Vec<u8>;

    fn handle(&self, r: Request<'_>, scratch: &mut Vec<u8>) -> Result<(), IpcError> {
        self.ran.fetch_add(1, Ordering::SeqCst);
        scratch.push(0);
        let mut m = r.message;
        if m.code() == SLOW {
            self.slow_entered.fetch_add(1, Ordering::SeqCst);
            let now = self.in_slow.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_slow.fetch_max(now, Ordering::SeqCst);
            if self.gather == 0 {
                std::thread::sleep(Duration::from_millis(300));
            }
            // Bounded, so that serialized workers fail the test, not hang it.
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while self.slow_entered.load(Ordering::SeqCst) < self.gather
                && std::time::Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.in_slow.fetch_sub(1, Ordering::SeqCst);
        }
        m.0[1] = m.0[1].wrapping_add(1);
        m.0[2] = r.process.pid().0;
        r.process.reply(&m, r.from)
    }

    fn failed(&self) -> Message {
        Message::with_code(FAILED)
    }

    fn busy(&self) -> Message {
        Message::with_code(BUSY)
    }

    fn runs_inline(&self, r: &Request<'_>) -> bool {
        r.message.code() == INLINE
    }
}

fn config(workers: usize, queue: usize) -> PoolConfig {
    PoolConfig {
        name: "test".into(),
        workers,
        queue,
        idle_code: IDLE,
        inline_upto: 4096,
        logical_id: Some(service::id("test-echo")),
        worker_spin: None,
    }
}

#[test]
fn a_library_user_finds_a_service_by_name() {
    let (a, b) = two_hosts();
    let pool = WorkerPool::start(&a, config(2, 8), Arc::new(Echo::default())).unwrap();
    let c = b.create_process().unwrap();
    assert_eq!(
        service::find(&c, "test-echo", Scope::Any).unwrap(),
        Some(pool.pid())
    );
    assert_eq!(
        service::find(&c, "nobody-here", Scope::Local).unwrap(),
        None
    );
    let p = a.create_process().unwrap();
    service::register(&p, service::IPDISK, p.pid(), Scope::Any);
    assert_eq!(
        service::find(&c, service::IPDISK, Scope::Any).unwrap(),
        Some(p.pid())
    );
}

#[test]
fn workers_serve_clients_at_once_and_small_requests_run_inline() {
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let h = Arc::new(Echo {
        gather: 4,
        ..Echo::default()
    });
    let pool = WorkerPool::start(&k, config(4, 16), h.clone()).unwrap();
    let server = pool.pid();
    let clients = Arc::new(ClientPool::new(&k, 4, 0).unwrap());
    assert_eq!(clients.size(), 4);
    let threads: Vec<_> = (0..4)
        .map(|n| {
            let c = clients.clone();
            std::thread::spawn(move || {
                let p = c.take();
                let mut m = Message::with_code(SLOW);
                m.0[1] = n;
                p.send(&mut m, server).unwrap();
                c.give(p);
                assert_eq!(m.0[1], n + 1);
                Pid(m.0[2])
            })
        })
        .collect();
    let ran_by: Vec<Pid> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Four slow requests at once on four workers: in parallel, each by a
    // worker, not the dispatcher.
    assert_eq!(h.most_in_slow.load(Ordering::SeqCst), 4, "all four at once");
    assert!(ran_by.iter().all(|&p| p != server));
    let p = clients.take();
    let mut m = Message::with_code(INLINE);
    p.send(&mut m, server).unwrap();
    assert_eq!(Pid(m.0[2]), server);
    let mut m = Message::with_code(ECHO);
    p.send(&mut m, server).unwrap();
    assert_ne!(Pid(m.0[2]), server);
    assert_eq!(h.ran.load(Ordering::SeqCst), 6);
}

#[test]
fn a_full_queue_answers_busy_and_queued_requests_are_served() {
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let pool = WorkerPool::start(&k, config(1, 1), Arc::new(Echo::default())).unwrap();
    let server = pool.pid();
    let clients = Arc::new(ClientPool::new(&k, 3, 0).unwrap());
    let go = Arc::new(Barrier::new(3));
    let threads: Vec<_> = (0..3u64)
        .map(|n| {
            let (c, go) = (clients.clone(), go.clone());
            std::thread::spawn(move || {
                let p = c.take();
                go.wait();
                // One at the worker, one queued, one refused (in some order).
                std::thread::sleep(Duration::from_millis(50 * n));
                let mut m = Message::with_code(SLOW);
                p.send(&mut m, server).unwrap();
                c.give(p);
                m.code()
            })
        })
        .collect();
    let mut codes: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    codes.sort();
    assert_eq!(codes, vec![SLOW, SLOW, BUSY]);
}

#[test]
fn only_workers_may_send_the_idle_code() {
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let pool = WorkerPool::start(&k, config(1, 4), Arc::new(Echo::default())).unwrap();
    let p = k.create_process().unwrap();
    // From a client it is an ordinary request, executed by a worker.
    let mut m = Message::with_code(IDLE);
    p.send(&mut m, pool.pid()).unwrap();
    assert_eq!(m.0[1], 1);
    assert_ne!(Pid(m.0[2]), pool.pid());
}
