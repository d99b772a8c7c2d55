//! Lending a caller's buffer to the engine for the duration of one call.
//!
//! The engine sees lent memory only through [`LentBuf`], a `SegMem` over a
//! raw pointer that it reaches only by copies (`ptr::copy`), never as a
//! Rust reference: the memory may be an attached program's window, which
//! that program can write at any time. Soundness rests on one rule the
//! runtime enforces: the memory stays mapped and the lender does not
//! return (ending the borrow) until the engine has dropped every
//! `LentBuf` for it. [`Lease::release`] checks this with a reference
//! count and aborts the process rather than return while the engine could
//! still touch the memory.

use std::sync::Arc;

use vkernel_proto::{RawBytes, RawBytesMut, SegMem};

/// A raw view of a caller's buffer, handed to the engine.
pub struct LentBuf {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    _lease: Arc<()>,
}

// SAFETY: the buffer is only accessed by whichever thread holds the engine
// lock, and the lending thread is blocked (not touching it) until release.
unsafe impl Send for LentBuf {}

impl LentBuf {
    /// `off..off + n` if within the buffer.
    fn within(&self, off: usize, n: usize) -> bool {
        off.checked_add(n).is_some_and(|end| end <= self.len)
    }
}

impl SegMem for LentBuf {
    fn len(&self) -> usize {
        self.len
    }

    fn read_at(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.within(off, dst.len()) {
            return false;
        }
        if !dst.is_empty() {
            // SAFETY: `off..off + dst.len()` is within the lent memory,
            // mapped for the lease (module docs); `dst` is our own and
            // cannot overlap memory lent to the engine by a blocked lender.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), dst.as_mut_ptr(), dst.len()) }
        }
        true
    }

    fn write_at(&mut self, off: usize, src: &[u8]) -> bool {
        if !self.writable || !self.within(off, src.len()) {
            return false;
        }
        if !src.is_empty() {
            // SAFETY: lent writable, and `off..off + src.len()` is within
            // it (module docs); `src` is the engine's own data.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(off), src.len()) }
        }
        true
    }

    fn copy_from(&mut self, off: usize, src: &dyn SegMem, src_off: usize, n: usize) -> bool {
        if !self.writable || !self.within(off, n) {
            return false;
        }
        let Some(from) = src.raw(src_off, n) else {
            return false;
        };
        if n > 0 {
            // SAFETY: both ranges are within memory lent for this call
            // (`src.raw` checked its own bounds); `ptr::copy` allows the
            // two to overlap (a move within one window).
            unsafe { std::ptr::copy(from.as_ptr(), self.ptr.add(off), n) }
        }
        true
    }

    fn append_to(&self, off: usize, n: usize, v: &mut Vec<u8>) -> bool {
        if !self.within(off, n) {
            return false;
        }
        v.reserve(n);
        let at = v.len();
        // SAFETY: `reserve` made room for `n` more bytes past `at`; they
        // are written (from within the lent memory) before `set_len`
        // counts them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr().add(at), n);
            v.set_len(at + n);
        }
        true
    }

    fn raw(&self, off: usize, n: usize) -> Option<RawBytes<'_>> {
        // (`wrapping_add`: the address only; within the buffer anyway.)
        self.within(off, n)
            .then(|| RawBytes::from_raw(self.ptr.wrapping_add(off), n))
    }

    fn raw_mut(&mut self, off: usize, n: usize) -> Option<RawBytesMut<'_>> {
        (self.writable && self.within(off, n))
            .then(|| RawBytesMut::from_raw(self.ptr.wrapping_add(off), n))
    }
}

/// Memory a call lends the engine: the caller's own slice, or a range of
/// a window another program maps (and may write meanwhile).
pub(crate) enum Loan<'a> {
    /// A slice the engine only reads.
    Own(&'a [u8]),
    /// A slice the engine may write.
    OwnMut(&'a mut [u8]),
    /// A window range, reached only by copies.
    Window(Window<'a>),
}

/// A range of a mapped window, valid for `'a` (see [`Window::new`]).
#[derive(Clone, Copy)]
pub(crate) struct Window<'a> {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    _mapped: std::marker::PhantomData<&'a ()>,
}

impl<'a> Window<'a> {
    /// `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay mapped, and writable if `writable`, for
    /// `'a`.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize, writable: bool) -> Window<'a> {
        Window {
            ptr,
            len,
            writable,
            _mapped: std::marker::PhantomData,
        }
    }
}

impl Loan<'_> {
    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Loan::Own(b) => b.len(),
            Loan::OwnMut(b) => b.len(),
            Loan::Window(w) => w.len,
        }
    }

    /// The same memory, lent again for a shorter while.
    pub(crate) fn reborrow(&mut self) -> Loan<'_> {
        match self {
            Loan::Own(b) => Loan::Own(b),
            Loan::OwnMut(b) => Loan::OwnMut(b),
            Loan::Window(w) => Loan::Window(*w),
        }
    }

    /// Lends it to the engine until the lease is released.
    pub(crate) fn lend(self) -> (Lease, Box<LentBuf>) {
        match self {
            Loan::Own(b) => Lease::shared(b),
            Loan::OwnMut(b) => Lease::exclusive(b),
            // SAFETY: `Window::new`'s contract: mapped for `'a`, which
            // the borrow of this loan (and so the lease's release) is
            // within.
            Loan::Window(w) => unsafe { Lease::window(w.ptr, w.len, w.writable) },
        }
    }
}

/// The lender's side: proves the engine has let go before the borrow ends.
pub struct Lease(Arc<()>);

impl Lease {
    /// Lends a read-only slice.
    pub fn shared(buf: &[u8]) -> (Lease, Box<LentBuf>) {
        let a = Arc::new(());
        let lent = LentBuf {
            ptr: buf.as_ptr() as *mut u8,
            len: buf.len(),
            writable: false,
            _lease: a.clone(),
        };
        (Lease(a), Box::new(lent))
    }

    /// Lends a writable slice.
    pub fn exclusive(buf: &mut [u8]) -> (Lease, Box<LentBuf>) {
        let a = Arc::new(());
        let lent = LentBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            writable: true,
            _lease: a.clone(),
        };
        (Lease(a), Box::new(lent))
    }

    /// Lends `len` bytes at `ptr` that another program may write
    /// meanwhile (an attached program's window): the engine only copies
    /// them.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay mapped (and, if `writable`, writable)
    /// until [`Lease::release`] returns.
    pub unsafe fn window(ptr: *mut u8, len: usize, writable: bool) -> (Lease, Box<LentBuf>) {
        let a = Arc::new(());
        let lent = LentBuf {
            ptr,
            len,
            writable,
            _lease: a.clone(),
        };
        (Lease(a), Box::new(lent))
    }

    /// True once the engine has dropped its view.
    pub fn is_released(&self) -> bool {
        Arc::strong_count(&self.0) == 1
    }

    /// Ends the lease. If the engine still holds the view this is a kernel
    /// bug that would become a use-after-free: abort instead.
    pub fn release(self) {
        if !self.is_released() {
            eprintln!("vkernel: engine still holds a lent buffer at release; aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(b: &dyn SegMem) -> Vec<u8> {
        let mut v = Vec::new();
        assert!(b.append_to(0, b.len(), &mut v));
        v
    }

    #[test]
    fn lent_views_read_and_write_the_callers_slice() {
        let mut v = vec![1u8, 2, 3, 4];
        {
            let (lease, mut lent) = Lease::exclusive(&mut v);
            assert_eq!(all(&*lent), [1, 2, 3, 4]);
            assert!(lent.write_at(1, &[9]));
            assert!(!lent.write_at(3, &[1, 2]), "out of range writes nothing");
            let mut two = [0u8; 2];
            assert!(lent.read_at(2, &mut two));
            assert_eq!(two, [3, 4]);
            assert!(!lent.read_at(3, &mut two));
            assert!(!lease.is_released());
            drop(lent);
            lease.release();
        }
        assert_eq!(v, vec![1, 9, 3, 4]);
        let (lease, mut lent) = Lease::shared(&v);
        assert_eq!(lent.len(), 4);
        assert!(!lent.write_at(0, &[7]), "read-only loans never write");
        assert!(lent.raw_mut(0, 1).is_none());
        drop(lent);
        lease.release();
        assert_eq!(v, vec![1, 9, 3, 4]);
        let (lease, lent) = Lease::shared(&[]);
        assert!(all(&*lent).is_empty());
        drop(lent);
        assert!(lease.is_released());
    }

    /// A window another program maps is lent by address and reached only
    /// by copies: copies between two loans of one buffer, overlapping
    /// ones included, and the addresses handed out for the OS.
    #[test]
    fn a_window_is_copied_into_and_out_of_by_address() {
        let mut w = (0u8..32).collect::<Vec<u8>>();
        let p = w.as_mut_ptr();
        // SAFETY: `w` outlives both leases, released below.
        let ((la, mut a), (lb, b)) =
            unsafe { (Lease::window(p, 32, true), Lease::window(p, 32, false)) };
        assert!(
            a.copy_from(4, &*b, 0, 8),
            "overlapping ranges of one window"
        );
        assert!(!a.copy_from(30, &*b, 0, 8));
        assert!(!a.copy_from(0, &*b, 30, 8));
        let raw = b.raw(2, 3).unwrap();
        assert_eq!(
            (raw.as_ptr(), raw.len()),
            (p.wrapping_add(2) as *const u8, 3)
        );
        assert!(b.raw(30, 3).is_none());
        let mut out = vec![0xAA];
        assert!(b.append_to(4, 8, &mut out));
        assert_eq!(out, [0xAA, 0, 1, 2, 3, 4, 5, 6, 7]);
        let other = vkernel_proto::Slice(&[5, 5]);
        let mut r = [0u8; 2];
        assert!(a.copy_from(0, &other, 0, 2) && a.read_at(0, &mut r));
        assert_eq!(r, [5, 5]);
        drop((a, b));
        la.release();
        lb.release();
        assert_eq!(&w[..12], &[5, 5, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]);
    }

    /// The runtime's pattern: the view crosses to another thread (the one
    /// running the engine), is written and dropped there, and only then does
    /// the lender release and read its buffer. Run under Miri in CI.
    #[test]
    fn a_view_used_and_dropped_on_another_thread() {
        let mut v = vec![0u8; 64];
        let (lease, lent) = Lease::exclusive(&mut v);
        let (tx, rx) = std::sync::mpsc::channel::<Box<LentBuf>>();
        let engine = std::thread::spawn(move || {
            let mut b = rx.recv().unwrap();
            let data: Vec<u8> = (0..64).collect();
            assert!(b.write_at(0, &data));
            drop(b);
        });
        tx.send(lent).unwrap();
        engine.join().unwrap();
        assert!(lease.is_released());
        lease.release();
        assert_eq!(v[63], 63);
        let (lease, lent) = Lease::shared(&v[8..16]);
        let h = std::thread::spawn(move || all(&*lent).iter().map(|&x| u32::from(x)).sum::<u32>());
        assert_eq!(h.join().unwrap(), (8..16).sum::<u32>());
        lease.release();
    }
}
