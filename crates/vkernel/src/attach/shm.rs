//! Sealed memory files shared between a program and its machine host, and
//! futex waits on words in them.
//!
//! The program creates each file and seals its size before it hands it
//! over, so the host can check that it will never shrink: a mapping whose
//! file shrank would fault (SIGBUS) on access, and a hostile program must
//! not be able to crash the host that way.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::lent::{Loan, Window};

/// A host's packet counter on a page of its own, shared by the host and
/// the programs of its uid that send for it (docs/PROTOCOL.md §8f).
pub(crate) struct CounterPage(Shm);

impl CounterPage {
    /// A new page, and its file to hand over.
    pub(crate) fn create() -> io::Result<(CounterPage, OwnedFd)> {
        let (shm, fd) = Shm::create("vk-counter", 4096)?;
        Ok((CounterPage(shm), fd))
    }

    /// The page of a file the host handed over.
    pub(crate) fn adopt(fd: &OwnedFd) -> io::Result<CounterPage> {
        Shm::adopt(fd, 4096, 4096).map(CounterPage)
    }
}

impl vkernel_proto::auth::CounterCell for CounterPage {
    fn cell(&self) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: the mapping is at least 4096 bytes, page-aligned (so the
        // first 8 bytes are aligned for an AtomicU64), and lives as long as
        // `self`; any bit pattern is a valid u64, and every program that
        // maps the page touches these bytes only through atomics.
        unsafe { &*self.0.as_ptr().cast::<std::sync::atomic::AtomicU64>() }
    }
}

/// One shared mapping of a whole sealed memory file.
pub(crate) struct Shm {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access through `Shm`
// goes through atomics or through byte copies whose callers own the
// protocol step that makes the range theirs (see `slot.rs`).
unsafe impl Send for Shm {}
// SAFETY: as above: `&Shm` only hands out atomics and raw byte ranges.
unsafe impl Sync for Shm {}

impl std::fmt::Debug for Shm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shm").field("len", &self.len).finish()
    }
}

impl Shm {
    /// Creates a sealed memory file of `len` bytes and maps it; returns the
    /// mapping and the file to hand over.
    pub(crate) fn create(name: &str, len: usize) -> io::Result<(Shm, OwnedFd)> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let shm = Shm::map_fd(&fd, len)?;
        Ok((shm, fd))
    }

    /// Maps a file handed over by a program, after checking that it is
    /// sealed against shrinking and at least `min` bytes long. Returns the
    /// mapping of the whole file.
    pub(crate) fn adopt(fd: &OwnedFd, min: usize, max: usize) -> io::Result<Shm> {
        Shm::adopt_with(fd, min, max, false)
    }

    /// [`Shm::adopt`], with every page mapped at once if `populate` (a
    /// large window that will be copied into right away: one system call
    /// instead of a page fault per page).
    pub(crate) fn adopt_with(
        fd: &OwnedFd,
        min: usize,
        max: usize,
        populate: bool,
    ) -> io::Result<Shm> {
        let seals = rustix::fs::fcntl_get_seals(fd)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shared memory file is not sealed against shrinking",
            ));
        }
        let size = rustix::fs::fstat(fd)?.st_size;
        let len = usize::try_from(size).unwrap_or(usize::MAX);
        if len < min || len > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shared memory file of {len} bytes (want {min}..={max})"),
            ));
        }
        Shm::map_fd_with(fd, len, populate)
    }

    fn map_fd(fd: impl AsFd, len: usize) -> io::Result<Shm> {
        Shm::map_fd_with(fd, len, false)
    }

    fn map_fd_with(fd: impl AsFd, len: usize, populate: bool) -> io::Result<Shm> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a fresh shared mapping chosen by the kernel (null hint);
        // it aliases no Rust object. Its lifetime ends in `Drop`.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                if populate {
                    MapFlags::SHARED | MapFlags::POPULATE
                } else {
                    MapFlags::SHARED
                },
                fd,
                0,
            )?
        };
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Shm { ptr, len })
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The start of the mapping (page-aligned).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `src` into the mapping at `off`, as much as fits; returns how
    /// much. A raw copy: no slice is ever made over memory another program
    /// may write meanwhile (which would only tear the bytes copied).
    pub(crate) fn write_at(&self, off: usize, src: &[u8]) -> usize {
        let n = src.len().min(self.len.saturating_sub(off));
        if n > 0 {
            // SAFETY: [off, off + n) is inside the mapping (n is clamped
            // to what follows off), `src` is a separate allocation of at
            // least n bytes, and only bytes are copied.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), n);
            }
        }
        n
    }

    /// Copies from the mapping at `off` into `dst`, as much as there is;
    /// returns how much. A raw copy, as in [`Shm::write_at`].
    pub(crate) fn read_at(&self, off: usize, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len.saturating_sub(off));
        if n > 0 {
            // SAFETY: as in `write_at`, in the other direction.
            unsafe {
                std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), n);
            }
        }
        n
    }

    /// The first `len` bytes (at most the mapping), lent to the engine
    /// for one call: reached only by copies, since the program that maps
    /// it too may write it meanwhile (which only tears its own data).
    pub(crate) fn loan(&self, len: usize, writable: bool) -> Loan<'_> {
        let len = len.min(self.len);
        // SAFETY: in bounds of the mapping, which is readable and writable
        // and stays mapped while `self` is borrowed.
        Loan::Window(unsafe { Window::new(self.ptr.as_ptr(), len, writable) })
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map_fd`; nothing
        // borrowed from it outlives `self`.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Blocks while `word` holds `val`, for at most `timeout` (the word may be
/// in memory shared with another program: not a private futex).
pub(crate) fn futex_wait(word: &AtomicU32, val: u32, timeout: Duration) {
    use rustix::thread::futex;
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again.
    let _ = futex::wait(word, futex::Flags::empty(), val, Some(&ts));
}

/// Wakes every waiter on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    use rustix::thread::futex;
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_sealed_file_is_adopted_and_shared() {
        let (a, fd) = Shm::create("t", 8192).unwrap();
        let b = Shm::adopt(&fd, 4096, 1 << 20).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(a.write_at(0, b"abcd"), 4);
        let mut got = [0u8; 4];
        assert_eq!(b.read_at(0, &mut got), 4);
        assert_eq!(&got, b"abcd");
    }

    #[test]
    fn raw_copies_stay_inside_the_mapping() {
        let (a, fd) = Shm::create("r", 4096).unwrap();
        let b = Shm::adopt(&fd, 4096, 1 << 20).unwrap();
        assert_eq!(a.write_at(4090, b"0123456789"), 6, "clamped at the end");
        let mut out = [0u8; 10];
        assert_eq!(b.read_at(4090, &mut out), 6);
        assert_eq!(&out[..6], b"012345");
        assert_eq!(a.write_at(5000, b"x"), 0, "past the end: nothing");
        assert_eq!(b.read_at(usize::MAX, &mut out), 0);
    }

    #[test]
    fn an_unsealed_or_short_file_is_refused() {
        let fd = rustix::fs::memfd_create("u", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        assert!(Shm::adopt(&fd, 4096, 1 << 20).is_err());
        let (_a, fd) = Shm::create("s", 4096).unwrap();
        assert!(Shm::adopt(&fd, 8192, 1 << 20).is_err());
        assert!(rustix::fs::ftruncate(&fd, 0).is_err(), "sealed");
    }

    #[test]
    fn futex_wake_ends_a_wait_on_shared_memory() {
        let (a, fd) = Shm::create("f", 4096).unwrap();
        let b = Shm::adopt(&fd, 4096, 4096).unwrap();
        // SAFETY: page-aligned, in bounds; AtomicU32 has no invalid values.
        let wa = unsafe { &*(a.as_ptr() as *const AtomicU32) };
        // SAFETY: as above, through the second mapping of the same page.
        let wb = unsafe { &*(b.as_ptr() as *const AtomicU32) };
        std::thread::scope(|s| {
            s.spawn(|| {
                while wa.load(Ordering::Acquire) == 0 {
                    futex_wait(wa, 0, Duration::from_secs(5));
                }
            });
            std::thread::sleep(Duration::from_millis(20));
            wb.store(1, Ordering::Release);
            futex_wake(wb);
        });
    }
}
