//! A process the runtime cannot give its file descriptors fails with the
//! real cause. Alone in its test binary: it lowers the process's
//! descriptor limit.

use vkernel::{IpcError, Kernel, KernelConfig};

#[test]
fn running_out_of_descriptors_says_so() {
    let k = Kernel::start(KernelConfig::default()).expect("kernel");
    let open = std::fs::read_dir("/proc/self/fd").expect("fd dir").count() as libc::rlim_t;
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
    let mut held = Vec::new();
    let err = loop {
        match k.create_process() {
            Ok(p) => held.push(p),
            Err(e) => break e,
        }
        assert!(held.len() < 100, "20 descriptors bought 100 processes");
    };
    // SAFETY: as above.
    unsafe {
        libc::setrlimit(libc::RLIMIT_NOFILE, &old);
    }
    assert_eq!(err, IpcError::OutOfDescriptors, "{err}");
    assert!(err.to_string().contains("file descriptors"), "{err}");
    // The table was not left holding the failed process: with descriptors
    // back, creation works again.
    drop(held);
    k.create_process()
        .expect("a process once descriptors are back");
}
