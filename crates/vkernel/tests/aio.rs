//! Async processes: Send, Receive, Reply and the moves as futures, on
//! tokio runtimes, locally, across hosts and attached to a machine host;
//! what dropping a pending future does.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

mod common;

use common::{pattern, two_hosts};
use vkernel::{AsyncProcess, IpcError, Kernel, KernelConfig, Message, Scope, SegAccess};

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

/// Polls `f` once with a waker that does nothing.
fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Receives `n` messages and replies to each with word 1 tripled.
async fn triple_server(mut s: AsyncProcess, n: usize) -> AsyncProcess {
    let mut m = Message::zero();
    for _ in 0..n {
        let i = s.receive(&mut m).await.unwrap();
        m.set_word(1, m.word(1) * 3);
        s.reply(&m, i.from).await.unwrap();
    }
    s
}

#[test]
fn ten_thousand_exchanges_at_once_on_two_runtime_threads() {
    const N: usize = 10_000;
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let (fds0, threads0) = (open_fds(), threads());
    let rt = runtime(2);
    let server = k.create_async_process().unwrap();
    let spid = server.pid();
    let clients: Vec<AsyncProcess> = (0..N).map(|_| k.create_async_process().unwrap()).collect();
    // No descriptor and no thread per async process. (Other tests run in
    // this program at the same time: the bounds leave room for them, far
    // below one per process.)
    assert!(
        open_fds() < fds0 + 500,
        "{} fds for {N} processes",
        open_fds() - fds0
    );
    let started = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for (i, mut c) in clients.into_iter().enumerate() {
            let started = started.clone();
            tasks.push(tokio::spawn(async move {
                let mut m = Message::with_code(1);
                m.set_word(1, i as u32);
                started.fetch_add(1, Ordering::SeqCst);
                let r = c.send(&mut m, spid).await.unwrap();
                assert_eq!(r.from, spid);
                assert_eq!(m.word(1), 3 * i as u32);
            }));
        }
        // Every client's Send is outstanding before the server takes one.
        while started.load(Ordering::SeqCst) < N {
            tokio::task::yield_now().await;
        }
        let server = tokio::spawn(triple_server(server, N));
        for t in tasks {
            t.await.unwrap();
        }
        server.await.unwrap();
    });
    assert!(
        threads() < threads0 + 100,
        "threads grew by {}",
        threads() - threads0
    );
}

#[test]
fn a_thousand_remote_clients_on_two_threads() {
    let (a, b) = two_hosts();
    let rt = runtime(2);
    let server = b.create_async_process().unwrap();
    let spid = server.pid();
    rt.block_on(async {
        let server = tokio::spawn(triple_server(server, 1000 * 5));
        let mut tasks = Vec::new();
        for i in 0..1000u32 {
            let mut c = a.create_async_process().unwrap();
            tasks.push(tokio::spawn(async move {
                for j in 0..5 {
                    let mut m = Message::with_code(1);
                    m.set_word(1, i * 10 + j);
                    c.send(&mut m, spid).await.unwrap();
                    assert_eq!(m.word(1), 3 * (i * 10 + j));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        server.await.unwrap();
    });
}

#[test]
fn a_dropped_send_not_yet_received_is_withdrawn() {
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let mut s = k.create_async_process().unwrap();
    let mut c = k.create_async_process().unwrap();
    let spid = s.pid();
    let mut m1 = Message::with_code(1);
    m1.set_word(1, 1);
    {
        let f = std::pin::pin!(c.send(&mut m1, spid));
        assert!(
            poll_once(f).is_pending(),
            "queued: the server is not receiving"
        );
    } // dropped: withdrawn
    let mut got = Message::zero();
    let mut rf = Box::pin(s.receive(&mut got));
    assert!(
        poll_once(rf.as_mut()).is_pending(),
        "the withdrawn message was delivered"
    );
    let mut m2 = Message::with_code(1);
    m2.set_word(1, 2);
    let mut sf = Box::pin(c.send(&mut m2, spid));
    assert!(poll_once(sf.as_mut()).is_pending());
    let Poll::Ready(i) = poll_once(rf.as_mut()) else {
        panic!("the second message did not arrive");
    };
    let i = i.unwrap();
    drop(rf);
    assert_eq!(got.word(1), 2);
    got.set_word(1, 20);
    futures_block_on(s.reply(&got, i.from)).unwrap();
    let Poll::Ready(r) = poll_once(sf.as_mut()) else {
        panic!("the reply did not complete the Send");
    };
    r.unwrap();
    drop(sf);
    assert_eq!(m2.word(1), 20);
}

#[test]
fn a_dropped_send_already_received_cannot_be_replied_to() {
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let mut s = k.create_async_process().unwrap();
    let mut c = k.create_async_process().unwrap();
    let (spid, cpid) = (s.pid(), c.pid());
    let mut got = Message::zero();
    let mut rf = Box::pin(s.receive(&mut got));
    assert!(poll_once(rf.as_mut()).is_pending());
    let mut m = Message::with_code(1);
    {
        let f = std::pin::pin!(c.send(&mut m, spid));
        assert!(poll_once(f).is_pending());
        let Poll::Ready(i) = poll_once(rf.as_mut()) else {
            panic!("not delivered");
        };
        assert_eq!(i.unwrap().from, cpid);
    } // the Send is dropped while the server holds its message
    drop(rf);
    assert_eq!(
        futures_block_on(s.reply(&got, c.pid())),
        Err(IpcError::NotAwaitingReply(c.pid()))
    );
    // Both processes go on as usual.
    let rt = runtime(1);
    rt.block_on(async {
        let server = tokio::spawn(triple_server(s, 1));
        let mut m = Message::with_code(1);
        m.set_word(1, 5);
        c.send(&mut m, spid).await.unwrap();
        assert_eq!(m.word(1), 15);
        server.await.unwrap();
    });
}

#[test]
fn a_message_taken_by_a_dropped_receive_is_not_lost() {
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let mut s = k.create_async_process().unwrap();
    let mut c = k.create_async_process().unwrap();
    let (spid, cpid) = (s.pid(), c.pid());
    let mut m = Message::with_code(1);
    m.set_word(1, 8);
    {
        let mut got = Message::zero();
        let mut rf = Box::pin(s.receive(&mut got));
        assert!(poll_once(rf.as_mut()).is_pending());
        let mut sf = std::pin::pin!(c.send(&mut m, spid));
        // Delivered into the pending Receive, which is then dropped
        // without being polled again.
        assert!(poll_once(sf.as_mut()).is_pending());
        drop(rf);
        let mut got2 = Message::zero();
        let i = futures_block_on(s.receive(&mut got2)).unwrap();
        assert_eq!((i.from, got2.word(1)), (cpid, 8));
        got2.set_word(1, 80);
        futures_block_on(s.reply(&got2, i.from)).unwrap();
        let Poll::Ready(r) = poll_once(sf.as_mut()) else {
            panic!("reply lost");
        };
        r.unwrap();
    }
    assert_eq!(m.word(1), 80);
}

#[test]
fn a_dropped_remote_send_never_takes_a_later_reply() {
    let (a, b) = two_hosts();
    let server = b.create_process().unwrap();
    let spid = server.pid();
    let (got_tx, got_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        let i = server.receive(&mut m).unwrap();
        got_tx.send(m.word(1)).unwrap();
        go_rx.recv().unwrap();
        m.set_word(1, 100);
        let _ = server.reply(&m, i.from); // to a sender that gave up
        let i = server.receive(&mut m).unwrap();
        assert_eq!(m.word(1), 2);
        m.set_word(1, 200);
        server.reply(&m, i.from).unwrap();
    });
    let rt = runtime(2);
    let mut c = a.create_async_process().unwrap();
    rt.block_on(async {
        let mut m = Message::with_code(1);
        m.set_word(1, 1);
        tokio::select! {
            r = c.send(&mut m, spid) => panic!("replied early: {r:?}"),
            w = tokio::task::spawn_blocking(move || got_rx.recv()) => assert_eq!(w.unwrap().unwrap(), 1),
        }
        // The Send was dropped with the server holding its request.
        go_tx.send(()).unwrap();
        let mut m = Message::with_code(1);
        m.set_word(1, 2);
        c.send(&mut m, spid).await.unwrap();
        assert_eq!(m.word(1), 200, "a stale reply answered a later Send");
    });
    t.join().unwrap();
}

/// Serves one request with a segment: reads it all, writes it back
/// reversed, replies.
async fn reverse_server(mut s: AsyncProcess, len: usize) {
    let mut m = Message::zero();
    let i = s.receive(&mut m).await.unwrap();
    let (r, mut buf) = s.move_from(i.from, 0, vec![0; len]).await;
    assert_eq!(r.unwrap(), len);
    buf.reverse();
    let (r, _) = s.move_to(i.from, 0, buf).await;
    assert_eq!(r.unwrap(), len);
    m.set_word(1, 9);
    s.reply(&m, i.from).await.unwrap();
}

fn segment_round_trip(client_host: &Kernel, server_host: &Kernel, len: usize) {
    let rt = runtime(2);
    let s = server_host.create_async_process().unwrap();
    let spid = s.pid();
    let mut c = client_host.create_async_process().unwrap();
    rt.block_on(async {
        let server = tokio::spawn(reverse_server(s, len));
        let data = pattern(len, 3);
        let mut m = Message::with_code(2);
        let (r, back) = c
            .send_with_segment(&mut m, spid, SegAccess::READ_WRITE, data.clone())
            .await;
        r.unwrap();
        assert_eq!(m.word(1), 9);
        let mut want = data;
        want.reverse();
        assert!(back == want, "segment not reversed");
        server.await.unwrap();
    });
}

#[test]
fn segments_and_moves_locally_and_across_hosts() {
    let k = Kernel::start(KernelConfig::default()).unwrap();
    segment_round_trip(&k, &k, 300_000);
    let (a, b) = two_hosts();
    segment_round_trip(&a, &b, 3 << 20);
}

#[test]
fn a_deadline_and_a_destroyed_receiver_end_a_send() {
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let rt = runtime(1);
    let s = k.create_async_process().unwrap();
    let spid = s.pid();
    let mut c = k.create_async_process().unwrap();
    rt.block_on(async {
        let mut m = Message::with_code(1);
        let r = c.send_within(&mut m, spid, Duration::from_millis(30)).await;
        assert_eq!(r, Err(IpcError::Deadline(spid)));
        let mut sf = Box::pin(c.send(&mut m, spid));
        assert!(poll_once(sf.as_mut()).is_pending());
        drop(s);
        let r = sf.await;
        assert!(
            matches!(r, Err(IpcError::NoSuchProcess(_))),
            "Send to a destroyed process: {r:?}"
        );
    });
}

#[test]
fn names_resolve_across_hosts() {
    let (a, b) = two_hosts();
    let rt = runtime(2);
    let mut s = b.create_async_process().unwrap();
    let mut c = a.create_async_process().unwrap();
    rt.block_on(async {
        let spid = s.pid();
        s.set_pid(4242, spid, Scope::Any).await.unwrap();
        let server = tokio::spawn(triple_server(s, 1));
        let found = c.get_pid(4242, Scope::Any).await.unwrap();
        assert_eq!(found, spid);
        let mut m = Message::with_code(1);
        m.set_word(1, 4);
        c.send(&mut m, found).await.unwrap();
        assert_eq!(m.word(1), 12);
        server.await.unwrap();
    });
}

#[test]
fn attached_async_processes_exchange_with_the_host() {
    let dir = std::env::temp_dir().join(format!("vk-aio-{}", std::process::id()));
    let path = dir.join("host.sock");
    let host = Kernel::start(KernelConfig::default()).unwrap();
    let _srv = host.serve_attach(&path, 0o600).unwrap();
    let prog = Kernel::attach(&path).unwrap();
    let rt = runtime(2);
    let s = host.create_async_process().unwrap();
    let spid = s.pid();
    let mut c = prog.create_async_process().unwrap();
    assert!(c.is_attached());
    rt.block_on(async {
        let server = tokio::spawn(triple_server(s, 100));
        for j in 0..100u32 {
            let mut m = Message::with_code(1);
            m.set_word(1, j);
            c.send(&mut m, spid).await.unwrap();
            assert_eq!(m.word(1), 3 * j);
        }
        server.await.unwrap();
    });
    // A segment from the attached side.
    segment_round_trip(&prog, &host, 200_000);
    // A Receive dropped while its thread waits keeps the message.
    let mut r = prog.create_async_process().unwrap();
    let rpid = r.pid();
    let mut sender = host.create_async_process().unwrap();
    rt.block_on(async {
        let mut got = Message::zero();
        let t = tokio::time::timeout(Duration::from_millis(20), r.receive(&mut got)).await;
        assert!(t.is_err(), "nothing was sent yet");
        let client = tokio::spawn(async move {
            let mut m = Message::with_code(1);
            m.set_word(1, 6);
            sender.send(&mut m, rpid).await.unwrap();
            m.word(1)
        });
        let i = r.receive(&mut got).await.unwrap();
        assert_eq!(got.word(1), 6);
        got.set_word(1, 60);
        r.reply(&got, i.from).await.unwrap();
        assert_eq!(client.await.unwrap(), 60);
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs a future to completion on a one-thread runtime.
fn futures_block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn the_example_server_holds_a_thousand_clients_on_two_threads() {
    // Built by `cargo test` with the other examples, next to this test's
    // binary (target/<profile>/examples/).
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/async_echo");
    for extra in [&[][..], &["--remote"][..]] {
        let out = std::process::Command::new(&bin)
            .args(["--clients", "1000", "--rounds", "5"])
            .args(extra)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("5000 exchanges") && text.contains(" 0 failed"),
            "{text}"
        );
    }
}
