//! Memory lent to the engine for the duration of one operation.
//!
//! A Send lends the sender's segment; Receive, MoveTo and MoveFrom lend the
//! caller's buffer. The engine reaches it only through this trait, and only
//! by copies: it never holds a Rust reference into lent memory, because an
//! attached program's window is memory that program may write while the
//! engine copies (a `&[u8]` over it would be undefined behaviour). Zero-copy
//! sends and receives get the memory's address ([`RawBytes`],
//! [`RawBytesMut`]) for the runtime to hand to the OS. The engine drops its
//! handle when the operation completes. The runtime implements the trait
//! over the caller's buffer or a window; tests implement it over a `Vec`.

use std::marker::PhantomData;

/// A buffer the engine may access, by copying, until it drops the handle.
pub trait SegMem: Send {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True if empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `dst.len()` bytes from offset `off` into `dst`. False, with
    /// nothing copied, if the range is not within the buffer.
    fn read_at(&self, off: usize, dst: &mut [u8]) -> bool;
    /// Copies `src` in at offset `off`. False, with nothing copied, if the
    /// range is not within the buffer or it was lent read-only.
    fn write_at(&mut self, off: usize, src: &[u8]) -> bool;
    /// Copies `n` bytes of `src` from `src_off` in at `off`, with one copy.
    /// False, with nothing copied, if either range is out of bounds or this
    /// buffer was lent read-only.
    fn copy_from(&mut self, off: usize, src: &dyn SegMem, src_off: usize, n: usize) -> bool;
    /// Appends bytes `off..off + n` to `v`. False, with `v` unchanged, if
    /// the range is not within the buffer.
    fn append_to(&self, off: usize, n: usize, v: &mut Vec<u8>) -> bool;
    /// Where bytes `off..off + n` lie, for the OS to read (a send's
    /// iovec); `None` if out of range.
    fn raw(&self, off: usize, n: usize) -> Option<RawBytes<'_>>;
    /// Where bytes `off..off + n` lie, for the OS to write (a receive in
    /// place); `None` if out of range or lent read-only.
    fn raw_mut(&mut self, off: usize, n: usize) -> Option<RawBytesMut<'_>>;
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

/// A copy of all of `seg`'s bytes.
pub(crate) fn to_vec(seg: &dyn SegMem) -> Vec<u8> {
    let mut v = Vec::with_capacity(seg.len());
    seg.append_to(0, seg.len(), &mut v);
    v
}

/// The address of a run of lent bytes, for the runtime to give the OS (an
/// iovec) without forming a reference to memory another program may write.
/// Valid for the borrow `'a` it came from; only the runtime dereferences it,
/// in `unsafe` code that relies on that.
#[derive(Clone, Copy, Debug)]
pub struct RawBytes<'a> {
    ptr: *const u8,
    len: usize,
    _lent: PhantomData<&'a [u8]>,
}

impl<'a> RawBytes<'a> {
    /// The address of `s`.
    pub fn of(s: &'a [u8]) -> RawBytes<'a> {
        RawBytes::from_raw(s.as_ptr(), s.len())
    }

    /// An address and length as given. Making one is harmless; whoever
    /// reads through it must know `ptr..ptr + len` is readable for `'a`.
    pub fn from_raw(ptr: *const u8, len: usize) -> RawBytes<'a> {
        RawBytes {
            ptr,
            len,
            _lent: PhantomData,
        }
    }

    /// The first byte's address.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The writable counterpart of [`RawBytes`], for receiving in place.
#[derive(Debug)]
pub struct RawBytesMut<'a> {
    ptr: *mut u8,
    len: usize,
    _lent: PhantomData<&'a mut [u8]>,
}

impl<'a> RawBytesMut<'a> {
    /// The address of `s`.
    pub fn of(s: &'a mut [u8]) -> RawBytesMut<'a> {
        RawBytesMut::from_raw(s.as_mut_ptr(), s.len())
    }

    /// An address and length as given. Making one is harmless; whoever
    /// writes through it must know `ptr..ptr + len` is writable for `'a`.
    pub fn from_raw(ptr: *mut u8, len: usize) -> RawBytesMut<'a> {
        RawBytesMut {
            ptr,
            len,
            _lent: PhantomData,
        }
    }

    /// The first byte's address.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// [`SegMem`]'s operations over memory the engine's own process owns (a
/// `Vec`, an `Arc<[u8]>`, a borrowed slice): plain slice copies.
mod own {
    use super::{RawBytes, RawBytesMut, SegMem};

    pub(super) fn read_at(s: &[u8], off: usize, dst: &mut [u8]) -> bool {
        match off.checked_add(dst.len()).and_then(|end| s.get(off..end)) {
            Some(b) => {
                dst.copy_from_slice(b);
                true
            }
            None => false,
        }
    }

    pub(super) fn write_at(s: &mut [u8], off: usize, src: &[u8]) -> bool {
        match off
            .checked_add(src.len())
            .and_then(|end| s.get_mut(off..end))
        {
            Some(b) => {
                b.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    pub(super) fn copy_from(
        s: &mut [u8],
        off: usize,
        src: &dyn SegMem,
        src_off: usize,
        n: usize,
    ) -> bool {
        match off.checked_add(n).and_then(|end| s.get_mut(off..end)) {
            Some(b) => src.read_at(src_off, b),
            None => false,
        }
    }

    pub(super) fn append_to(s: &[u8], off: usize, n: usize, v: &mut Vec<u8>) -> bool {
        match off.checked_add(n).and_then(|end| s.get(off..end)) {
            Some(b) => {
                v.extend_from_slice(b);
                true
            }
            None => false,
        }
    }

    pub(super) fn raw(s: &[u8], off: usize, n: usize) -> Option<RawBytes<'_>> {
        s.get(off..off.checked_add(n)?).map(RawBytes::of)
    }

    pub(super) fn raw_mut(s: &mut [u8], off: usize, n: usize) -> Option<RawBytesMut<'_>> {
        s.get_mut(off..off.checked_add(n)?).map(RawBytesMut::of)
    }
}

/// Implements [`SegMem`] for a type over its own memory: `$ro` gives the
/// bytes, `$rw` gives them writable (or `None` if read-only).
macro_rules! own_segmem {
    ($t:ty, |$s:ident| $ro:expr, |$m:ident| $rw:expr $(, $($extra:tt)*)?) => {
        impl SegMem for $t {
            fn len(&self) -> usize {
                let $s = self;
                $ro.len()
            }
            fn read_at(&self, off: usize, dst: &mut [u8]) -> bool {
                let $s = self;
                own::read_at($ro, off, dst)
            }
            fn write_at(&mut self, off: usize, src: &[u8]) -> bool {
                let $m = self;
                let w: Option<&mut [u8]> = $rw;
                w.is_some_and(|w| own::write_at(w, off, src))
            }
            fn copy_from(
                &mut self,
                off: usize,
                src: &dyn SegMem,
                src_off: usize,
                n: usize,
            ) -> bool {
                let $m = self;
                let w: Option<&mut [u8]> = $rw;
                w.is_some_and(|w| own::copy_from(w, off, src, src_off, n))
            }
            fn append_to(&self, off: usize, n: usize, v: &mut Vec<u8>) -> bool {
                let $s = self;
                own::append_to($ro, off, n, v)
            }
            fn raw(&self, off: usize, n: usize) -> Option<RawBytes<'_>> {
                let $s = self;
                own::raw($ro, off, n)
            }
            fn raw_mut(&mut self, off: usize, n: usize) -> Option<RawBytesMut<'_>> {
                let $m = self;
                let w: Option<&mut [u8]> = $rw;
                own::raw_mut(w?, off, n)
            }
            $($($extra)*)?
        }
    };
}

/// A caller's own slice, read-only, for one engine call that copies at
/// once.
pub struct Slice<'a>(pub &'a [u8]);

own_segmem!(Slice<'_>, |s| s.0, |_m| None);

/// A caller's own slice lent for one engine call that copies at once
/// (`Engine::receive_queued`).
pub struct SliceMut<'a>(pub &'a mut [u8]);

own_segmem!(SliceMut<'_>, |s| &s.0[..], |m| Some(&mut m.0[..]));
own_segmem!(Vec<u8>, |s| &s[..], |m| Some(&mut m[..]));

/// A MoveTo source that the caller shares and cannot change: a range of
/// an `Arc<[u8]>`. The engine may keep it past the MoveTo (write-behind)
/// without a copy. It is never written (it is lent read-only).
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

own_segmem! {
    SharedSeg,
    |s| s.buf.get(s.range.clone()).unwrap_or_default(),
    |_m| None,
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

own_segmem!(VecSeg, |s| &s.data[..], |m| Some(&mut m.data[..]));

impl Drop for VecSeg {
    fn drop(&mut self) {
        let mut g = match self.back.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *g = std::mem::take(&mut self.data);
    }
}
