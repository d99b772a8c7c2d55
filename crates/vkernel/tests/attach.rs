//! Programs attached to a machine host: the same API, the host's pid space.

use std::time::Duration;

use vkernel::{IpcError, Kernel, KernelConfig, Message, Scope, Segment};

fn machine_host(name: &str) -> (Kernel, vkernel::AttachServer, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("vk-attach-{}-{name}", std::process::id()));
    let path = dir.join("host.sock");
    let k = Kernel::start(KernelConfig::default()).unwrap();
    let s = k.serve_attach(&path, 0o600).unwrap();
    (k, s, path)
}

#[test]
fn two_attachments_exchange_in_the_hosts_pid_space() {
    let (host, _srv, path) = machine_host("x");
    let a = Kernel::attach(&path).unwrap();
    let b = Kernel::attach(&path).unwrap();
    assert!(a.is_attached());
    assert_eq!(a.host_id(), host.host_id());
    let server = b.create_process().unwrap();
    assert_eq!(server.pid().host(), host.host_id());
    server.set_pid(77, server.pid(), Scope::Local);
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        let mut buf = vec![0u8; 16];
        for _ in 0..100 {
            let i = server.receive_with_segment(&mut m, &mut buf).unwrap();
            assert_eq!(i.seg_bytes, 12);
            assert_eq!(&buf[..5], b"hello");
            m.set_word(1, m.word(1) + 1);
            server.move_to(i.from, 5, b" world").unwrap();
            server.reply(&m, i.from).unwrap();
        }
    });
    let c = a.create_process().unwrap();
    let spid = c.get_pid(77, Scope::Local).unwrap();
    for n in 0..100u32 {
        let mut m = Message::with_code(1);
        m.set_word(1, n);
        let mut seg = *b"hello......!";
        let r = c
            .send_with_segment(&mut m, spid, Segment::ReadWrite(&mut seg))
            .unwrap();
        assert_eq!(r.from, spid);
        assert_eq!(m.word(1), n + 1);
        assert_eq!(&seg, b"hello world!");
    }
    t.join().unwrap();
    assert!(host.process_exists(c.pid()));
    drop(c);
    // The host's embedded processes and attached ones talk too.
    let hp = host.create_process().unwrap();
    let ap = a.create_process().unwrap();
    let apid = ap.pid();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        let i = ap.receive(&mut m).unwrap();
        ap.reply(&m, i.from).unwrap();
    });
    let mut m = Message::with_code(9);
    hp.send(&mut m, apid).unwrap();
    t.join().unwrap();
}

#[test]
fn a_detached_program_leaves_no_process_behind() {
    let (host, _srv, path) = machine_host("d");
    let a = Kernel::attach(&path).unwrap();
    let p = a.create_process().unwrap();
    let pid = p.pid();
    let client = host.create_process().unwrap();
    let t = std::thread::spawn(move || {
        let mut m = Message::with_code(1);
        client.send(&mut m, pid)
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(a);
    // The process is gone once the host has seen the program go.
    let r = t.join().unwrap();
    assert!(matches!(r, Err(IpcError::NoSuchProcess(_))), "{r:?}");
    assert!(!host.process_exists(pid));
    let mut m = Message::zero();
    assert_eq!(p.receive(&mut m), Err(IpcError::Shutdown));
}

#[test]
fn a_lost_host_fails_calls_promptly() {
    let (host, srv, path) = machine_host("l");
    let a = Kernel::attach(&path).unwrap();
    let p = a.create_process().unwrap();
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        p.receive(&mut m)
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(srv);
    drop(host);
    assert_eq!(t.join().unwrap(), Err(IpcError::HostLost));
    assert!(a.create_process().is_err());
}
