//! Lending a caller's buffer to the engine for the duration of one call.
//!
//! The engine sees a borrowed slice only through [`LentBuf`], a `SegMem`
//! over a raw pointer. Soundness rests on one rule the runtime enforces: the
//! calling thread does not return (ending the borrow) until the engine has
//! dropped every `LentBuf` for that buffer. [`Lease::release`] checks this
//! with a reference count and aborts the process rather than return while
//! the engine could still touch the memory.

use std::sync::Arc;

use vkernel_proto::SegMem;

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

impl SegMem for LentBuf {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr+len` is the lender's live slice (see module docs).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if !self.writable || self.len == 0 {
            return &mut [];
        }
        // SAFETY: the slice was lent mutably (`writable`), the lender is
        // blocked, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn len(&self) -> usize {
        self.len
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

    #[test]
    fn lent_views_read_and_write_the_callers_slice() {
        let mut v = vec![1u8, 2, 3, 4];
        {
            let (lease, mut lent) = Lease::exclusive(&mut v);
            assert_eq!(lent.bytes(), &[1, 2, 3, 4]);
            lent.bytes_mut()[1] = 9;
            assert!(!lease.is_released());
            drop(lent);
            lease.release();
        }
        assert_eq!(v, vec![1, 9, 3, 4]);
        let (lease, mut lent) = Lease::shared(&v);
        assert_eq!(lent.len(), 4);
        assert!(lent.bytes_mut().is_empty(), "read-only loans never write");
        drop(lent);
        lease.release();
        let (lease, lent) = Lease::shared(&[]);
        assert!(lent.bytes().is_empty());
        drop(lent);
        assert!(lease.is_released());
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
            for (i, x) in b.bytes_mut().iter_mut().enumerate() {
                *x = i as u8;
            }
            drop(b);
        });
        tx.send(lent).unwrap();
        engine.join().unwrap();
        assert!(lease.is_released());
        lease.release();
        assert_eq!(v[63], 63);
        let (lease, lent) = Lease::shared(&v[8..16]);
        let h = std::thread::spawn(move || lent.bytes().iter().map(|&x| u32::from(x)).sum::<u32>());
        assert_eq!(h.join().unwrap(), (8..16).sum::<u32>());
        lease.release();
    }
}
