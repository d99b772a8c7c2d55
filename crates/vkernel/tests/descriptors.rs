//! Processes hold no file descriptors: the descriptors a blocking wait
//! needs belong to the threads that wait. Alone in its test binary: it
//! lowers the process's descriptor limit.

use vkernel::{Kernel, KernelConfig, Message};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("fd dir").count()
}

#[test]
fn ten_thousand_processes_fit_in_twenty_descriptors() {
    let k = Kernel::start(KernelConfig {
        spin: std::time::Duration::ZERO,
        ..KernelConfig::default()
    })
    .expect("kernel");
    let open = open_fds() as libc::rlim_t;
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read only the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let low = libc::rlimit {
            rlim_cur: open + 20,
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &low), 0);
    }
    let before = open_fds();
    let mut held: Vec<_> = (0..10_000)
        .map(|i| {
            k.create_process()
                .unwrap_or_else(|e| panic!("process {i}: {e}"))
        })
        .collect();
    // (The host's own threads may make theirs meanwhile: a few.)
    let made = open_fds();
    assert!(
        made <= before + 4,
        "10,000 processes: {made} descriptors, {before} before"
    );
    // Blocking exchanges between some of them, on a few threads, work
    // within the limit (each waiting thread makes its own two, once).
    let server = held.pop().expect("a process");
    let to = server.pid();
    let mut threads = vec![std::thread::spawn(move || {
        for _ in 0..30 {
            let mut m = Message::zero();
            let i = server.receive(&mut m).expect("receive");
            server.reply(&m, i.from).expect("reply");
        }
    })];
    for _ in 0..3 {
        let mine: Vec<_> = held.drain(..10).collect();
        threads.push(std::thread::spawn(move || {
            for p in mine {
                let mut m = Message::zero();
                p.send(&mut m, to).expect("send");
            }
        }));
    }
    for t in threads {
        t.join().expect("thread");
    }
    let after = open_fds();
    // SAFETY: as above.
    unsafe {
        libc::setrlimit(libc::RLIMIT_NOFILE, &old);
    }
    assert!(
        after <= before + 8,
        "{after} descriptors open, {before} before"
    );
}
