//! Tests of the C ABI called from Rust, as C calls it.
use super::*;

fn ok(c: c_int) {
    // SAFETY: vk_last_error returns a NUL-terminated string that lives
    // until this thread's next failing call; it is copied at once.
    assert_eq!(c, 0, "{:?}", unsafe { CStr::from_ptr(vk_last_error()) });
}

#[test]
fn the_version_is_the_crates() {
    // SAFETY: vk_version returns static NUL-terminated text.
    let v = unsafe { CStr::from_ptr(vk_version()) };
    assert_eq!(v.to_str(), Ok(env!("CARGO_PKG_VERSION")));
}

#[test]
fn every_error_code_has_its_name() {
    use vkernel::IpcError as E;
    let p = vkernel::Pid(7);
    let named = [
        (VK_ENOSUCHPROCESS, E::NoSuchProcess(p)),
        (VK_ETIMEOUT, E::Timeout(p)),
        (VK_ENOTAWAITINGREPLY, E::NotAwaitingReply(p)),
        (VK_EACCESS, E::AccessDenied(p)),
        (VK_EOUTOFBOUNDS, E::OutOfBounds(p)),
        (VK_ESEGMENTTOOLARGE, E::SegmentTooLarge { max: 1 }),
        (VK_EINVALIDPID, E::InvalidPid(p)),
        (VK_ENOTAPROCESS, E::NotAProcess(p)),
        (VK_EBUSY, E::Busy(p)),
        (VK_ENOHOSTID, E::NoHostId),
        (VK_ETABLEFULL, E::TableFull),
        (VK_ENODESCRIPTORS, E::OutOfDescriptors),
        (VK_ENORESOURCES, E::NoResources),
        (VK_EDESTROYED, E::Destroyed),
        (VK_EGROUPUNSUPPORTED, E::GroupUnsupported),
        (VK_EREFUSED, E::Refused(p)),
        (VK_EDEADLINE, E::Deadline(p)),
        (VK_ESHUTDOWN, E::Shutdown),
        (VK_EHOSTLOST, E::HostLost),
    ];
    for (c, e) in named {
        assert_eq!(c as u32, e.code().0, "{e:?}");
        // SAFETY: vk_strerror returns static NUL-terminated text.
        let s = unsafe { CStr::from_ptr(vk_strerror(c)) };
        assert_ne!(s.to_bytes(), b"unknown error code", "{e:?}");
    }
}

#[test]
fn an_exchange_with_a_segment_through_the_c_abi() {
    let mut k = std::ptr::null_mut();
    // SAFETY: valid pointers throughout; every object is freed once.
    unsafe {
        ok(vk_start(c"127.0.0.1:0".as_ptr(), std::ptr::null(), &mut k));
        let (mut s, mut c) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(vk_process_create(k, &mut s));
        ok(vk_process_create(k, &mut c));
        let spid = vk_pid(s);
        let sp = s as usize;
        let t = std::thread::spawn(move || {
            let s = sp as *mut vk_process;
            let mut m = vk_message::default();
            let mut info = vk_incoming::default();
            let mut buf = [0u8; 16];
            let r = vk_receive_segment(s, &mut m, buf.as_mut_ptr(), 16, &mut info);
            let mut moved = 0;
            let mv = vk_move_to(s, info.from, 5, b" world".as_ptr(), 6, &mut moved);
            let code = m.w[0] & 0xff_ffff;
            m.w[1] = 42;
            // Answered before anything is checked: a failed check
            // must not leave the client waiting.
            let rp = vk_reply(s, &m, info.from);
            (r, mv, rp, code, info.seg_bytes, buf, moved)
        });
        let mut seg = *b"hello......";
        let mut m = vk_message::default();
        m.w[0] = 7;
        let mut rep = vk_reply_info::default();
        ok(vk_send_segment(
            c,
            &mut m,
            spid,
            seg.as_mut_ptr(),
            seg.len(),
            vk_access::VK_SEG_READ_WRITE as c_int,
            &mut rep,
        ));
        let (r, mv, rp, code, seg_bytes, buf, moved) = t.join().unwrap();
        assert_eq!((r, mv, rp), (0, 0, 0));
        assert_eq!((code, seg_bytes, moved), (7, 11, 6));
        assert_eq!(&buf[..11], b"hello......");
        assert_eq!((m.w[1], rep.from), (42, spid));
        assert_eq!(&seg, b"hello world");
        vk_process_free(s);
        vk_process_free(c);
        vk_kernel_free(k);
    }
}

#[test]
fn misuse_is_a_code_and_a_message_not_a_crash() {
    // SAFETY: deliberately NULL and bad arguments; nothing is freed.
    unsafe {
        let mut k = std::ptr::null_mut();
        assert_eq!(
            vk_start(c"nonsense".as_ptr(), std::ptr::null(), &mut k),
            VK_EINVAL
        );
        let e = CStr::from_ptr(vk_last_error()).to_str().unwrap();
        assert!(e.contains("nonsense"), "{e}");
        // Peers: a malformed one is refused; a name is taken.
        assert_eq!(
            vk_start(std::ptr::null(), c"127.0.0.1:9, localhost".as_ptr(), &mut k),
            VK_EINVAL
        );
        let e = CStr::from_ptr(vk_last_error()).to_str().unwrap();
        assert!(e.contains("has no port"), "{e}");
        ok(vk_start(std::ptr::null(), c"localhost:9".as_ptr(), &mut k));
        vk_kernel_free(k);
        k = std::ptr::null_mut();
        assert_eq!(
            vk_send(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                1,
                std::ptr::null_mut()
            ),
            VK_EINVAL
        );
        assert_eq!(
            vk_attach(c"/nonexistent/vk.sock".as_ptr(), &mut k),
            VK_ESTART
        );
        assert!(k.is_null());
        ok(vk_start(std::ptr::null(), std::ptr::null(), &mut k));
        let mut p = std::ptr::null_mut();
        ok(vk_process_create(k, &mut p));
        let mut m = vk_message::default();
        // Replying to a process that awaits no reply from it.
        assert_eq!(vk_reply(p, &m, vk_pid(p)), 3);
        // Sending to nobody: the engine's code, and its text.
        let code = vk_send(p, &mut m, 0x7777_0001, std::ptr::null_mut());
        assert_ne!(code, 0);
        assert_ne!(
            CStr::from_ptr(vk_strerror(code)).to_bytes(),
            b"unknown error code"
        );
        let mut small = [0 as c_char; 4];
        assert_eq!(vk_local_addr(k, small.as_mut_ptr(), 4), VK_ERANGE);
        assert_eq!(CStr::from_ptr(small.as_ptr()).to_bytes().len(), 3);
        let js = vk_stats_json(k);
        assert!(CStr::from_ptr(js).to_str().unwrap().starts_with('{'));
        vk_string_free(js);
        vk_process_free(p);
        vk_kernel_free(k);
    }
}
