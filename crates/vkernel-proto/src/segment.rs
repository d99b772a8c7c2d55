//! Memory lent to the engine for the duration of one operation.
//!
//! A Send lends the sender's segment; Receive, MoveTo and MoveFrom lend the
//! caller's buffer. The engine reads and writes it only through this trait and
//! drops its handle when the operation completes. The runtime implements it
//! over the caller's borrowed slice; tests implement it over a `Vec`.

/// A buffer the engine may access until it drops the handle.
pub trait SegMem: Send {
    /// The whole buffer.
    fn bytes(&self) -> &[u8];
    /// The whole buffer, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Length in bytes.
    fn len(&self) -> usize {
        self.bytes().len()
    }
    /// True if empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// True if the bytes stay as they are for as long as the engine holds
    /// the handle, even after the lender's operation returned (an owned,
    /// immutable buffer such as [`SharedSeg`]): a write-behind MoveTo then
    /// keeps the handle instead of copying the bytes.
    fn is_stable(&self) -> bool {
        false
    }
    /// This buffer as a [`SharedSeg`], if it is one: a write-behind MoveTo
    /// from the next range of the same shared buffer may then join it.
    fn as_shared(&self) -> Option<&SharedSeg> {
        None
    }
}

/// A MoveTo source that the caller shares and cannot change: a range of
/// an `Arc<[u8]>`. The engine may keep it past the MoveTo (write-behind)
/// without a copy. It is never written: [`SegMem::bytes_mut`] gives an
/// empty slice.
#[derive(Clone, Debug)]
pub struct SharedSeg {
    buf: std::sync::Arc<[u8]>,
    range: std::ops::Range<usize>,
}

impl SharedSeg {
    /// `buf[range]`; `None` if the range is not within `buf`.
    pub fn new(buf: std::sync::Arc<[u8]>, range: std::ops::Range<usize>) -> Option<SharedSeg> {
        buf.get(range.clone())?;
        Some(SharedSeg { buf, range })
    }

    /// True if `next` is the range of the same buffer that follows this
    /// one.
    pub(crate) fn is_followed_by(&self, next: &SharedSeg) -> bool {
        std::sync::Arc::ptr_eq(&self.buf, &next.buf) && next.range.start == self.range.end
    }

    /// Takes in the first `k` bytes of what follows this range.
    pub(crate) fn grow(&mut self, k: usize) {
        self.range.end = (self.range.end + k).min(self.buf.len());
    }

    /// This range without its first `k` bytes.
    pub(crate) fn skip(&self, k: usize) -> SharedSeg {
        let start = (self.range.start + k).min(self.range.end);
        SharedSeg {
            buf: self.buf.clone(),
            range: start..self.range.end,
        }
    }
}

impl SegMem for SharedSeg {
    fn bytes(&self) -> &[u8] {
        self.buf.get(self.range.clone()).unwrap_or_default()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut []
    }
    fn is_stable(&self) -> bool {
        true
    }
    fn as_shared(&self) -> Option<&SharedSeg> {
        Some(self)
    }
}

/// A boxed lent buffer.
pub type Seg = Box<dyn SegMem>;

/// An owned buffer shared with the test that created it, so the test can look
/// at what the engine wrote after the operation completes.
#[derive(Clone, Debug, Default)]
pub struct SharedBuf(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl SharedBuf {
    /// A buffer holding `v`.
    pub fn new(v: Vec<u8>) -> SharedBuf {
        SharedBuf(std::sync::Arc::new(std::sync::Mutex::new(v)))
    }

    /// A copy of the contents.
    pub fn snapshot(&self) -> Vec<u8> {
        match self.0.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// A handle to lend to the engine.
    pub fn lend(&self) -> Seg {
        Box::new(VecSeg {
            data: self.snapshot(),
            back: self.clone(),
        })
    }
}

/// Lent view of a [`SharedBuf`]: works on a copy and writes it back on drop.
struct VecSeg {
    data: Vec<u8>,
    back: SharedBuf,
}

impl SegMem for VecSeg {
    fn bytes(&self) -> &[u8] {
        &self.data
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

impl Drop for VecSeg {
    fn drop(&mut self) {
        let mut g = match self.back.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *g = std::mem::take(&mut self.data);
    }
}
