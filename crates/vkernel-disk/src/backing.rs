//! Backing stores of an IPdisk: RAM, a regular file, or a block device.
//!
//! All three are a file descriptor accessed with positioned reads and
//! writes (`pread`/`pwrite`), so concurrent commands need no lock. RAM is
//! an anonymous memory file (`memfd`), also mapped so a large READ can be
//! sent from where its bytes are ([`Backing::with_slice`]); there, range
//! locks keep writes out of bytes being sent. Durability is `fdatasync`,
//! called for SYNCHRONIZE CACHE and for FUA writes.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

/// Errors opening a backing store.
#[derive(Debug, thiserror::Error)]
pub enum BackingError {
    /// The specification could not be parsed.
    #[error("bad backing `{0}`: expected ram:SIZE, file:PATH[:SIZE] or dev:PATH")]
    Spec(String),
    /// A size could not be parsed (the message says why).
    #[error("{0}")]
    Size(String),
    /// The store is smaller than one block.
    #[error("backing store of {0} bytes is smaller than one block")]
    TooSmall(u64),
    /// Opening or sizing failed.
    #[error("{what}: {err}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        err: std::io::Error,
    },
}

/// What to open: `ram:SIZE`, `file:PATH[:SIZE]` (created or grown to SIZE
/// if given) or `dev:PATH` (an existing block device or file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackingSpec {
    /// Anonymous memory of this many bytes.
    Ram(u64),
    /// A regular file; with a size it is created or grown to that size.
    File(PathBuf, Option<u64>),
    /// A block device (or any existing file), used at its current size.
    Dev(PathBuf),
}

/// Parses a size with its unit (parse-size's syntax, binary prefixes:
/// `64K` = `64KiB` = `64KB` = 65536). A bare number is refused, except
/// `0`: `4096` might mean bytes or blocks or KiB.
pub fn parse_size(s: &str) -> Result<u64, BackingError> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    if t.ends_with(|c: char| c.is_ascii_digit()) {
        return Err(BackingError::Size(format!(
            "`{t}` needs a unit: e.g. {t}B, 64KiB or 1GiB (K, M, G, T are powers of 1024)"
        )));
    }
    parse_size::Config::new()
        .with_binary()
        .parse_size(t)
        .map_err(|e| {
            BackingError::Size(format!(
                "`{t}` is not a size ({e}; e.g. 512B, 64KiB, 1GiB; K, M, G, T are powers of 1024)"
            ))
        })
}

impl FromStr for BackingSpec {
    type Err = BackingError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(sz) = s.strip_prefix("ram:") {
            return Ok(BackingSpec::Ram(parse_size(sz)?));
        }
        if let Some(rest) = s.strip_prefix("file:") {
            // A trailing `:SIZE` is a size if it starts with a digit (and
            // must then parse: `file:x:4096` is refused for its missing
            // unit, not taken for a file named `x:4096`).
            if let Some((p, sz)) = rest.rsplit_once(':') {
                if sz.starts_with(|c: char| c.is_ascii_digit()) {
                    return Ok(BackingSpec::File(p.into(), Some(parse_size(sz)?)));
                }
            }
            if rest.is_empty() {
                return Err(BackingError::Spec(s.into()));
            }
            return Ok(BackingSpec::File(rest.into(), None));
        }
        if let Some(p) = s.strip_prefix("dev:") {
            if p.is_empty() {
                return Err(BackingError::Spec(s.into()));
            }
            return Ok(BackingSpec::Dev(p.into()));
        }
        Err(BackingError::Spec(s.into()))
    }
}

/// An open backing store of a fixed size.
#[derive(Debug)]
pub struct Backing {
    file: File,
    len: u64,
    /// Hole punching works (cleared after the first EOPNOTSUPP).
    punch: AtomicBool,
    describe: String,
    /// A RAM store: reads and writes are memory copies, syncs are no-ops.
    memory: bool,
    /// A RAM store's memory file, mapped (see [`Backing::with_slice`]).
    map: Option<Mapped>,
}

/// A RAM store's memory file mapped into this process, with range locks.
/// A slice of the mapping exists only while the lock of every stripe it
/// covers is held (shared), and every change to the store's bytes —
/// writes, zeroing, hole punching, through the mapping or the descriptor
/// — holds those locks exclusively: no `&[u8]` ever aliases bytes being
/// changed.
#[derive(Debug)]
struct Mapped {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    stripes: Vec<std::sync::RwLock<()>>,
    /// log2 of a stripe's size in bytes.
    shift: u32,
}

// SAFETY: the mapping is process-wide shared memory owned by this value
// (unmapped only when it drops); every access to its bytes goes through the
// stripe locks, which make readers and writers of a range exclusive.
unsafe impl Send for Mapped {}
// SAFETY: as above: `&Mapped` hands out slices only under the locks.
unsafe impl Sync for Mapped {}

/// The stripe guards of one range, held together.
enum RangeGuard<'a> {
    Shared {
        _held: Vec<std::sync::RwLockReadGuard<'a, ()>>,
    },
    Exclusive {
        _held: Vec<std::sync::RwLockWriteGuard<'a, ()>>,
    },
}

impl Mapped {
    /// Maps all `len` bytes of `file` shared, read-write.
    fn new(file: &File, len: u64) -> std::io::Result<Mapped> {
        let n = usize::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        if n == 0 {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh shared mapping of an open descriptor, `n` bytes
        // (the file's size); the kernel picks the address. The result is
        // checked for MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>()).ok_or(std::io::ErrorKind::Other)?;
        // Stripes of at least 64 KiB, at most 1024 of them.
        let mut shift = 16;
        while (n >> shift) > 1024 {
            shift += 1;
        }
        let count = (n >> shift) + 1;
        Ok(Mapped {
            ptr,
            len: n,
            stripes: (0..count).map(|_| std::sync::RwLock::new(())).collect(),
            shift,
        })
    }

    /// Locks the stripes of `[off, off + len)` (in bounds, `len` > 0), in
    /// ascending order so two ranges never deadlock.
    fn lock(&self, off: usize, len: usize, exclusive: bool) -> RangeGuard<'_> {
        let first = off >> self.shift;
        let last = (off + len - 1) >> self.shift;
        let stripes = &self.stripes[first..=last];
        if exclusive {
            RangeGuard::Exclusive {
                _held: stripes
                    .iter()
                    .map(|l| l.write().unwrap_or_else(|p| p.into_inner()))
                    .collect(),
            }
        } else {
            RangeGuard::Shared {
                _held: stripes
                    .iter()
                    .map(|l| l.read().unwrap_or_else(|p| p.into_inner()))
                    .collect(),
            }
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; no slice of it can
        // outlive `self` (they borrow it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackingError {
    let what = what.into();
    move |err| BackingError::Io { what, err }
}

/// Creates an anonymous memory file (`memfd_create`).
fn memfd(name: &str) -> std::io::Result<File> {
    use std::os::unix::io::FromRawFd;
    let cname = std::ffi::CString::new(name).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the
    // call; memfd_create reads it and returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create, is open, and is owned
    // by nobody else; the File takes sole ownership and closes it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl Backing {
    /// True for a RAM store: no operation on it waits for a device.
    pub fn in_memory(&self) -> bool {
        self.memory
    }

    /// True if [`Backing::with_slice`] works (a RAM store, mapped).
    pub fn is_mapped(&self) -> bool {
        self.map.is_some()
    }

    /// Opens (or creates) the store a specification names.
    pub fn open(spec: &BackingSpec) -> Result<Backing, BackingError> {
        let (file, describe) = match spec {
            BackingSpec::Ram(n) => {
                let f = memfd("vkernel-ipdisk").map_err(io_err("memfd_create"))?;
                f.set_len(*n).map_err(io_err("sizing the RAM disk"))?;
                (f, format!("ram:{n}"))
            }
            BackingSpec::File(p, size) => {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(size.is_some())
                    .truncate(false)
                    .open(p)
                    .map_err(io_err(format!("opening {}", p.display())))?;
                if let Some(n) = size {
                    let cur = f
                        .metadata()
                        .map_err(io_err(format!("stat {}", p.display())))?
                        .len();
                    if cur < *n {
                        f.set_len(*n)
                            .map_err(io_err(format!("sizing {}", p.display())))?;
                    }
                }
                (f, format!("file:{}", p.display()))
            }
            BackingSpec::Dev(p) => {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(p)
                    .map_err(io_err(format!("opening {}", p.display())))?;
                (f, format!("dev:{}", p.display()))
            }
        };
        // Block devices report 0 in metadata; seeking to the end works for both.
        let len = (&file)
            .seek(SeekFrom::End(0))
            .map_err(io_err("finding the size"))?;
        let memory = matches!(spec, BackingSpec::Ram(_));
        // A RAM store is mapped, so its bytes can be sent from where they
        // are; if mapping fails it is used through the descriptor.
        let map = if memory && len > 0 {
            Mapped::new(&file, len).ok()
        } else {
            None
        };
        Ok(Backing {
            file,
            len,
            punch: AtomicBool::new(!matches!(spec, BackingSpec::Dev(_))),
            describe,
            memory,
            map,
        })
    }

    /// Runs `f` on the store's bytes `[off, off + len)` in place, with no
    /// copy, while writes to them wait. `None` if the store is not mapped
    /// (only a RAM store is); an error if the range is out of bounds.
    pub fn with_slice<R>(
        &self,
        off: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<std::io::Result<R>> {
        let m = self.map.as_ref()?;
        if let Err(e) = self.check(off, len) {
            return Some(Err(e));
        }
        if len == 0 {
            return Some(Ok(f(&[])));
        }
        let o = off as usize; // in bounds of a mapped (usize-sized) store
        let _g = m.lock(o, len, false);
        // SAFETY: `[o, o + len)` is inside the mapping (checked above), the
        // mapping lives as long as `self`, and the shared locks of its
        // stripes keep every writer out while the slice exists (it cannot
        // escape `f`).
        let bytes = unsafe { std::slice::from_raw_parts(m.ptr.as_ptr().add(o), len) };
        Some(Ok(f(bytes)))
    }

    /// Runs `f` on the store's bytes `[off, off + len)` in place, writable,
    /// while every other slice of them and every write to them waits.
    /// `None` if the store is not mapped; an error if the range is out of
    /// bounds. What `f` leaves there is the store's content, even if it
    /// stops half way.
    pub fn with_slice_mut<R>(
        &self,
        off: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<std::io::Result<R>> {
        let m = self.map.as_ref()?;
        if let Err(e) = self.check(off, len) {
            return Some(Err(e));
        }
        if len == 0 {
            return Some(Ok(f(&mut [])));
        }
        let o = off as usize; // in bounds of a mapped (usize-sized) store
        let _g = m.lock(o, len, true);
        // SAFETY: `[o, o + len)` is inside the mapping (checked above), the
        // mapping lives as long as `self`, and the exclusive locks of its
        // stripes keep every other slice and every descriptor write out
        // while this slice exists (it cannot escape `f`). Descriptor reads
        // take no lock: the kernel copies out of the pages, so one that
        // overlaps may see the change half done, as overlapping SCSI
        // commands in flight may, but never aliases this slice.
        let bytes = unsafe { std::slice::from_raw_parts_mut(m.ptr.as_ptr().add(o), len) };
        Some(Ok(f(bytes)))
    }

    /// Takes the exclusive range locks of a mapped store around a change
    /// of `[off, off + len)` (in bounds); nothing for other stores.
    fn exclusive(&self, off: u64, len: usize) -> Option<RangeGuard<'_>> {
        let m = self.map.as_ref()?;
        (len > 0).then(|| m.lock(off as usize, len, true))
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True if the store has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What was opened, e.g. `ram:67108864`.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    fn check(&self, off: u64, len: usize) -> std::io::Result<()> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "access beyond the end of the backing store",
            )),
        }
    }

    /// Reads exactly `buf.len()` bytes at `off`.
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.check(off, buf.len())?;
        // A mapped store's descriptor reads the same pages; the kernel
        // copies them, so no lock is needed.
        self.file.read_exact_at(buf, off)
    }

    /// Writes all of `data` at `off`; with `durable`, also `fdatasync`.
    pub fn write_at(&self, off: u64, data: &[u8], durable: bool) -> std::io::Result<()> {
        self.check(off, data.len())?;
        let _g = self.exclusive(off, data.len());
        self.file.write_all_at(data, off)?;
        if durable {
            self.sync()?;
        }
        Ok(())
    }

    /// Makes every completed write durable (`fdatasync`).
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Zeroes `len` bytes at `off`; with `dealloc`, frees the space where
    /// the store can (hole punching), else writes zeros. Reads of the range
    /// return zeros afterwards either way.
    pub fn zero(&self, off: u64, len: u64, dealloc: bool) -> std::io::Result<()> {
        let n = usize::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        self.check(off, n)?;
        if len == 0 {
            return Ok(());
        }
        let _g = self.exclusive(off, n);
        if dealloc && self.punch.load(Ordering::Relaxed) {
            match self.punch_hole(off, len) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    self.punch.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        let chunk = vec![0u8; n.min(1 << 20)];
        let mut done = 0u64;
        while done < len {
            let k = (len - done).min(chunk.len() as u64) as usize;
            self.file.write_all_at(&chunk[..k], off + done)?;
            done += k as u64;
        }
        Ok(())
    }

    fn punch_hole(&self, off: u64, len: u64) -> std::io::Result<()> {
        let (Ok(o), Ok(l)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
            return Err(std::io::ErrorKind::InvalidInput.into());
        };
        // SAFETY: fallocate takes no pointers; the descriptor is open for
        // the lifetime of `self.file`, and KEEP_SIZE leaves the size alone.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                o,
                l,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_specs_parse() {
        assert_eq!(parse_size("4096B").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1 GB").unwrap(), 1 << 30);
        assert_eq!(parse_size("2k").unwrap(), 2048);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size("0").unwrap(), 0);
        let e = parse_size("4096").unwrap_err().to_string();
        assert!(e.contains("needs a unit") && e.contains("4096B"), "{e}");
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1K").is_err());
        assert!(parse_size("99999999999999T").is_err());
        assert_eq!(
            "ram:8M".parse::<BackingSpec>().unwrap(),
            BackingSpec::Ram(8 << 20)
        );
        assert_eq!(
            "file:/tmp/a:1M".parse::<BackingSpec>().unwrap(),
            BackingSpec::File("/tmp/a".into(), Some(1 << 20))
        );
        assert_eq!(
            "file:/tmp/a".parse::<BackingSpec>().unwrap(),
            BackingSpec::File("/tmp/a".into(), None)
        );
        assert_eq!(
            "dev:/dev/x".parse::<BackingSpec>().unwrap(),
            BackingSpec::Dev("/dev/x".into())
        );
        assert!("disk:/x".parse::<BackingSpec>().is_err());
        assert!("dev:".parse::<BackingSpec>().is_err());
    }

    /// Exercises the two `unsafe` blocks: memfd creation and hole punching.
    #[test]
    fn ram_backing_reads_writes_and_punches() {
        let b = Backing::open(&BackingSpec::Ram(1 << 20)).unwrap();
        assert_eq!(b.len(), 1 << 20);
        let mut buf = vec![0xffu8; 4096];
        b.read_at(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
        b.write_at(8192, &[7u8; 8192], true).unwrap();
        b.read_at(8192, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 7));
        b.zero(8192, 4096, true).unwrap();
        b.read_at(8192, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
        b.read_at(12288, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 7));
        b.zero(12288, 4096, false).unwrap();
        b.read_at(12288, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
        assert!(b.read_at((1 << 20) - 100, &mut buf).is_err());
        assert!(b.write_at(u64::MAX - 10, &buf, false).is_err());
        assert!(b.zero(1 << 20, 1, false).is_err());
    }

    #[test]
    fn file_backing_is_created_and_persists() {
        let dir = std::env::temp_dir().join(format!("vkdisk-bk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.img");
        let _ = std::fs::remove_file(&p);
        {
            let b = Backing::open(&BackingSpec::File(p.clone(), Some(65536))).unwrap();
            assert_eq!(b.len(), 65536);
            b.write_at(512, b"hello", false).unwrap();
            b.sync().unwrap();
            b.zero(4096, 4096, true).unwrap();
        }
        let b = Backing::open(&BackingSpec::File(p.clone(), None)).unwrap();
        let mut h = [0u8; 5];
        b.read_at(512, &mut h).unwrap();
        assert_eq!(&h, b"hello");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod mapped_tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_ram_store_lends_its_bytes_in_place() {
        let b = Backing::open(&BackingSpec::Ram(1 << 20)).unwrap();
        assert!(b.is_mapped());
        b.write_at(4096, &[7u8; 8192], false).unwrap();
        let got = b.with_slice(4096, 8192, |d| d.to_vec()).unwrap().unwrap();
        assert_eq!(got, vec![7u8; 8192]);
        // What the descriptor reads is what the mapping shows.
        let mut via_fd = vec![0u8; 8192];
        b.read_at(4096, &mut via_fd).unwrap();
        assert_eq!(via_fd, got);
        // Zeroing (hole punching) shows through the mapping too.
        b.zero(4096, 4096, true).unwrap();
        let z = b.with_slice(4096, 8192, |d| (d[..4096].to_vec(), d[4096..].to_vec()));
        let (zeros, rest) = z.unwrap().unwrap();
        assert_eq!(zeros, vec![0u8; 4096]);
        assert_eq!(rest, vec![7u8; 4096]);
        // Bounds are checked; the empty range at the end is fine.
        assert!(b.with_slice((1 << 20) - 10, 11, |_| ()).unwrap().is_err());
        assert!(b.with_slice(u64::MAX, 2, |_| ()).unwrap().is_err());
        assert!(b.with_slice(1 << 20, 0, |d| d.is_empty()).unwrap().unwrap());
        // A file store is not mapped: the caller reads it instead.
        let dir = std::env::temp_dir().join(format!("vk-map-{}", std::process::id()));
        let f = Backing::open(&BackingSpec::File(dir.clone(), Some(1 << 16))).unwrap();
        assert!(!f.is_mapped());
        assert!(f.with_slice(0, 16, |_| ()).is_none());
        let _ = std::fs::remove_file(dir);
    }

    #[test]
    fn a_ram_store_takes_writes_in_place() {
        let b = Backing::open(&BackingSpec::Ram(1 << 20)).unwrap();
        let n = b
            .with_slice_mut(8192, 100_000, |d| {
                d.fill(9);
                d.len()
            })
            .unwrap()
            .unwrap();
        assert_eq!(n, 100_000);
        // The descriptor sees the write; nothing around it moved.
        let mut via_fd = vec![0u8; 100_002];
        b.read_at(8191, &mut via_fd).unwrap();
        assert_eq!(via_fd[0], 0);
        assert!(via_fd[1..100_001].iter().all(|&x| x == 9));
        assert_eq!(via_fd[100_001], 0);
        assert!(b.with_slice_mut((1 << 20) - 1, 2, |_| ()).unwrap().is_err());
        assert!(b
            .with_slice_mut(1 << 20, 0, |d| d.is_empty())
            .unwrap()
            .unwrap());
        let dir = std::env::temp_dir().join(format!("vk-mapw-{}", std::process::id()));
        let f = Backing::open(&BackingSpec::File(dir.clone(), Some(1 << 16))).unwrap();
        assert!(f.with_slice_mut(0, 16, |_| ()).is_none());
        let _ = std::fs::remove_file(dir);
    }

    /// Writers fill whole 192 KiB regions (spanning stripes) with one byte
    /// value while readers look at them in place: a reader must never see a
    /// region half old, half new (the range locks keep writers out while a
    /// slice exists).
    #[test]
    fn readers_in_place_never_see_a_write_half_done() {
        const R: usize = 192 << 10;
        let b = Arc::new(Backing::open(&BackingSpec::Ram(4 << 20)).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2u8)
            .map(|w| {
                let (b, stop) = (b.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut v = w;
                    while !stop.load(Ordering::Relaxed) {
                        v = v.wrapping_add(2);
                        // Regions start mid-stripe, so each spans several;
                        // one writer goes through the descriptor, one in place.
                        if w == 0 {
                            b.write_at(40_000, &vec![v; R], false).unwrap();
                        } else {
                            b.with_slice_mut(40_000, R, |d| d.fill(v)).unwrap().unwrap();
                        }
                    }
                })
            })
            .collect();
        let mut torn = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut looks = 0;
        while std::time::Instant::now() < deadline && looks < 20_000 {
            looks += 1;
            let uniform = b
                .with_slice(40_000, R, |d| d.iter().all(|&x| x == d[0]))
                .unwrap()
                .unwrap();
            if !uniform {
                torn += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert!(looks > 10);
        assert_eq!(torn, 0, "{torn} of {looks} looks saw a torn region");
    }
}
