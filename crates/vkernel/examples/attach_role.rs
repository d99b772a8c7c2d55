//! Programs the attach tests run as separate OS processes:
//!
//! - `attach_role sleeper PATH NAME`: attaches, registers a process under
//!   NAME that never receives, prints its pid, and waits to be killed.
//! - `attach_role hostile PATH SECONDS`: speaks the attach protocol by
//!   hand, then scribbles random words over its call slot, window and
//!   peer page while posting calls, and sends garbage records, for
//!   SECONDS.
//! - `attach_role holder PATH`: prints its pid, receives one message,
//!   prints "got PID", and never replies (waits to be killed).
//! - `attach_role send PATH PID N`: sends N messages to PID, each with a
//!   counter the receiver is to add one to; prints "ok" or the error.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vkernel::{Kernel, Scope};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("sleeper") => sleeper(&args[2], &args[3]),
        Some("hostile") => hostile(&args[2], args[3].parse().unwrap_or(1.0)),
        Some("holder") => holder(&args[2]),
        Some("send") => send(&args[2], &args[3], args[4].parse().unwrap_or(1)),
        _ => eprintln!(
            "usage: attach_role sleeper PATH NAME | hostile PATH SECONDS | holder PATH | send PATH PID N"
        ),
    }
}

fn holder(path: &str) {
    let k = Kernel::attach(path).expect("attach");
    let p = k.create_process().expect("process");
    println!("{}", p.pid());
    let _ = std::io::stdout().flush();
    let mut m = vkernel::Message::zero();
    match p.receive(&mut m) {
        Ok(i) => println!("got {}", i.from),
        Err(e) => println!("receive failed: {e}"),
    }
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(120));
}

fn send(path: &str, pid: &str, n: u32) {
    let k = Kernel::attach(path).expect("attach");
    let p = k.create_process().expect("process");
    let to = vkernel::Pid(u32::from_str_radix(pid, 16).expect("a pid in hex"));
    for i in 0..n {
        let mut m = vkernel::Message::with_code(1);
        m.set_word(1, i);
        match p.send(&mut m, to) {
            Ok(_) if m.word(1) == i + 1 => {}
            Ok(_) => {
                println!("wrong reply {} to {i}", m.word(1));
                return;
            }
            Err(e) => {
                println!("{e}");
                return;
            }
        }
    }
    println!("ok");
}

fn sleeper(path: &str, name: &str) {
    let k = Kernel::attach(path).expect("attach");
    let p = k.create_process().expect("process");
    p.set_pid(vkernel::service::id(name), p.pid(), Scope::Any);
    println!("{}", p.pid());
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(120));
}

/// A memory file sealed as the host requires, mapped.
fn sealed(len: usize) -> (std::os::fd::OwnedFd, *mut u32) {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create("h", MemfdFlags::ALLOW_SEALING).expect("memfd");
    rustix::fs::ftruncate(&fd, len as u64).expect("size");
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).expect("seal");
    // SAFETY: a fresh shared mapping of the whole file; this program only
    // writes it through raw pointers (it is the hostile side).
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &fd,
            0,
        )
        .expect("mmap")
    };
    (fd, p.cast())
}

fn record(sock: &impl AsFd, words: [u32; 8], payload: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    b.extend_from_slice(payload);
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        anc.push(SendAncillaryMessage::ScmRights(fds));
    }
    let _ = rustix::net::sendmsg(
        sock,
        &[std::io::IoSlice::new(&b)],
        &mut anc,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    );
}

fn hostile(path: &str, seconds: f64) {
    use rustix::net::{AddressFamily, SocketType};
    let sock =
        rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).expect("socket");
    rustix::net::connect(
        &sock,
        &rustix::net::SocketAddrUnix::new(path).expect("path"),
    )
    .expect("connect");
    record(&sock, [1, 0x564b_4154, 1, 0, 0, 0, 0, 0], &[], &[]);
    let mut buf = [0u8; 4096];
    let _ = rustix::io::read(&sock, &mut buf);
    let (sfd, slot) = sealed(4096);
    let (wfd, window) = sealed(64 << 10);
    let (pfd, peer) = sealed(4096);
    record(
        &sock,
        [3, 1, 0, 0, 0, 0, 0, 0],
        &[],
        &[sfd.as_fd(), wfd.as_fd(), pfd.as_fd()],
    );
    let _ = rustix::io::read(&sock, &mut buf);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let end = Instant::now() + Duration::from_secs_f64(seconds.clamp(0.0, 600.0));
    let mut seq = 0u32;
    while Instant::now() < end {
        // SAFETY: in bounds of the slot page; AtomicU32 has no invalid values.
        let word = |i: usize| unsafe { &*(slot.add(i % 1024) as *const AtomicU32) };
        for _ in 0..64 {
            let r = rnd();
            word(r as usize).store((r >> 32) as u32, Ordering::Relaxed);
        }
        // Small ops with random arguments, and sizes beyond the window.
        word(32).store((rnd() % 30) as u32, Ordering::Relaxed);
        for i in 33..45 {
            let v = if rnd() % 2 == 0 {
                rnd() as u32
            } else {
                (rnd() % 70_000) as u32
            };
            word(i).store(v, Ordering::Relaxed);
        }
        // SAFETY: in bounds of the window.
        unsafe { *window.add((rnd() % (16 << 10)) as usize) = rnd() as u32 };
        // The peer page (inbox and reply area) too.
        for _ in 0..8 {
            // SAFETY: in bounds of the peer page.
            unsafe { *peer.add((rnd() % 1024) as usize) = rnd() as u32 };
        }
        seq = seq.wrapping_add(1 + (rnd() % 3) as u32);
        word(0).store(seq, Ordering::SeqCst);
        let _ = rustix::thread::futex::wake(word(0), rustix::thread::futex::Flags::empty(), 1);
        if rnd() % 16 == 0 {
            let junk: Vec<u8> = (0..(rnd() % 200)).map(|_| rnd() as u8).collect();
            let w: [u32; 8] = std::array::from_fn(|_| rnd() as u32 % 8);
            record(&sock, w, &junk, &[]);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}
