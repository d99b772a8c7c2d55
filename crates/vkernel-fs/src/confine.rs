//! Path resolution confined to the exported root.
//!
//! Every path a client sends is resolved relative to a directory file
//! descriptor of the root with `openat2(2)` and
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: the kernel itself refuses any
//! resolution that would leave the root — through `..`, an absolute path,
//! or a symbolic link (absolute or relative) pointing outside — with
//! `EXDEV`, and `/proc`-style magic links with `ELOOP`. Operations on a
//! final component that must not be followed (unlink, rename, symlink,
//! lstat, chown, utimens) resolve the *parent* that way and then act on a
//! single plain name with an `*at` call that does not follow it, or on an
//! `O_PATH | O_NOFOLLOW` descriptor of it. Nothing here ever builds a host
//! path from client input, so no check-then-use race can redirect an
//! operation outside the root.
//!
//! A path longer than one system call takes (`PATH_MAX`) is walked in
//! steps, each confined the same way beneath the directory the step
//! before reached (`long`): deep trees work, and never leave the root.
//!
//! Before the kernel sees a path, [`check_path`] refuses NUL bytes
//! (`EINVAL`), paths over [`MAX_REQUEST_PATH`] and components over
//! [`MAX_NAME`] (`ENAMETOOLONG`) and absolute paths (`EXDEV`).
//!
//! All system calls go through `rustix`, whose wrappers are safe; this
//! module has no `unsafe` code.

mod long;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{
    AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, Stat, Timestamps, CWD, UTIME_NOW, UTIME_OMIT,
};

use crate::vio::{
    self, Attr, Dirent, Errno, SetAttr, StatFs, MAX_NAME, MAX_PATH, MAX_REQUEST_PATH,
};

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

fn err(e: rustix::io::Errno) -> Errno {
    Errno::from_rustix(e)
}

/// Lexical checks before any resolution: no NUL (`EINVAL`), at most
/// [`MAX_REQUEST_PATH`] bytes and [`MAX_NAME`] per component
/// (`ENAMETOOLONG`), not absolute (`EXDEV`: it would name something
/// outside the root).
pub fn check_path(path: &[u8]) -> Result<(), Errno> {
    if path.contains(&0) {
        return Err(Errno::EINVAL);
    }
    if path.len() > MAX_REQUEST_PATH {
        return Err(Errno::ENAMETOOLONG);
    }
    if path.split(|&b| b == b'/').any(|c| c.len() > MAX_NAME) {
        return Err(Errno::ENAMETOOLONG);
    }
    if path.first() == Some(&b'/') {
        return Err(Errno::EXDEV);
    }
    Ok(())
}

/// The path as given to `openat2`: the empty path is the root itself.
/// How often [`openat2_beneath`] tries again when the kernel could not
/// be sure a `..` stayed beneath.
const RACE_RETRIES: usize = 16;

/// `openat2(2)` of `path` beneath `dir`. The kernel answers EAGAIN when a
/// rename or mount anywhere on the system raced a `..` of the walk and it
/// cannot tell whether the walk stayed beneath; openat2(2) says to try
/// again, which is done here a bounded number of times (a client then
/// sees EAGAIN only under a storm of renames).
fn openat2_beneath(
    dir: impl AsFd,
    path: &[u8],
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, rustix::io::Errno> {
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(dir.as_fd(), path, flags, mode, RESOLVE) {
            Err(rustix::io::Errno::AGAIN) if tries < RACE_RETRIES => tries += 1,
            r => return r,
        }
    }
}

fn rel(path: &[u8]) -> &[u8] {
    if path.is_empty() {
        b"."
    } else {
        path
    }
}

/// Splits `path` into (parent, last component). The last component must
/// be a plain name: `.`, `..` or nothing (the root) give `EINVAL`.
pub fn split_last(path: &[u8]) -> Result<(&[u8], &[u8]), Errno> {
    let trimmed = {
        let mut end = path.len();
        while end > 0 && path[end - 1] == b'/' {
            end -= 1;
        }
        &path[..end]
    };
    let (parent, name) = match trimmed.iter().rposition(|&b| b == b'/') {
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => (&b""[..], trimmed),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Errno::EINVAL);
    }
    Ok((parent, name))
}

/// Attributes of a `stat` result.
// The field types of `Stat` differ between architectures, so some of
// these casts are identities on x86_64 and conversions elsewhere.
#[allow(clippy::unnecessary_cast)]
pub fn attr_of(st: &Stat) -> Attr {
    Attr {
        ino: st.st_ino as u64,
        size: st.st_size.max(0) as u64,
        blocks: st.st_blocks as u64,
        atime: st.st_atime as i64,
        mtime: st.st_mtime as i64,
        ctime: st.st_ctime as i64,
        atime_ns: (st.st_atime_nsec as u64).min(999_999_999) as u32,
        mtime_ns: (st.st_mtime_nsec as u64).min(999_999_999) as u32,
        ctime_ns: (st.st_ctime_nsec as u64).min(999_999_999) as u32,
        mode: st.st_mode as u32,
        nlink: u32::try_from(st.st_nlink as u64).unwrap_or(u32::MAX),
        uid: st.st_uid as u32,
        gid: st.st_gid as u32,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        dev: st.st_dev as u32,
    }
}

/// Attributes of the entry `name` (a plain name, not followed) of the
/// open directory `dir`.
pub fn stat_entry(dir: &impl AsFd, name: &[u8]) -> Result<Attr, Errno> {
    if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
        return Err(Errno::EINVAL);
    }
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err)?;
    Ok(attr_of(&st))
}

/// The identity of a file: (device, inode).
#[allow(clippy::unnecessary_cast)]
pub fn file_id(st: &Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// Open flags a client may ask for; anything else is dropped, and
/// `O_PATH` / `O_TMPFILE` are refused.
const ALLOWED_OPEN: u32 = (libc::O_ACCMODE
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_TRUNC
    | libc::O_APPEND
    | libc::O_NOFOLLOW
    | libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_NOATIME) as u32;

/// The exported directory tree.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

impl Root {
    /// Opens the root directory and checks that the kernel has `openat2`
    /// (Linux ≥ 5.6); without it the server refuses to start rather than
    /// serve unconfined.
    pub fn open(dir: &Path) -> std::io::Result<Root> {
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let root = Root {
            fd,
            path: dir.to_path_buf(),
        };
        match root.resolve(b"", OFlags::PATH | OFlags::DIRECTORY) {
            Ok(_) => Ok(root),
            Err(e) if e == Errno(libc::ENOSYS as u32) => Err(std::io::Error::other(
                "this kernel has no openat2(2) (Linux 5.6 or later is needed to confine paths)",
            )),
            Err(e) => Err(std::io::Error::from_raw_os_error(e.as_i32())),
        }
    }

    /// The root's path on this host (for messages only; never used to
    /// resolve client paths).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves `path` beneath the root and opens it with `flags`
    /// (`O_CLOEXEC` added). Symbolic links are followed only while they
    /// stay beneath the root.
    pub fn resolve(&self, path: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
        self.resolve_mode(path, flags, Mode::empty())
    }

    /// The one resolution every operation goes through ([`Root::resolve`],
    /// [`Root::parent`]): a long path's leading directories step by step
    /// (`long::walk`), then the rest beneath the last.
    fn resolve_mode(&self, path: &[u8], flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        check_path(path)?;
        // openat2 refuses flags that O_PATH ignores, such as O_NOCTTY.
        let extra = if flags.contains(OFlags::PATH) {
            OFlags::CLOEXEC
        } else {
            OFlags::CLOEXEC | OFlags::NOCTTY
        };
        let (dir, rest) = long::walk(self.fd.as_fd(), path)?;
        openat2_beneath(dir, rel(rest), flags | extra, mode).map_err(err)
    }

    /// The parent directory of `path` (resolved beneath the root) and the
    /// last component, a plain name.
    pub fn parent<'p>(&self, path: &'p [u8]) -> Result<(OwnedFd, &'p [u8]), Errno> {
        check_path(path)?;
        let (parent, name) = split_last(path)?;
        let fd = self.resolve(parent, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok((fd, name))
    }

    /// Attributes by path; `follow` follows a final symbolic link (only
    /// while it stays beneath the root).
    pub fn stat(&self, path: &[u8], follow: bool) -> Result<(Attr, (u64, u64)), Errno> {
        let mut flags = OFlags::PATH;
        if !follow {
            flags |= OFlags::NOFOLLOW;
        }
        let fd = self.resolve(path, flags)?;
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        Ok((attr_of(&st), file_id(&st)))
    }

    /// Opens a regular file for I/O. Only regular files may be opened (a
    /// FIFO or device node inside the tree is refused with `EOPNOTSUPP`,
    /// a directory with `EISDIR`), and never blocking. Returns the
    /// descriptor and whether the file was created. A created file gets
    /// exactly `mode` (no umask).
    pub fn open_file(&self, path: &[u8], flags: u32, mode: u32) -> Result<(OwnedFd, bool), Errno> {
        if flags & (libc::O_PATH as u32 | libc::O_TMPFILE as u32 | libc::O_DIRECTORY as u32) != 0 {
            return Err(Errno::EINVAL);
        }
        let want = OFlags::from_bits_retain(flags & ALLOWED_OPEN) | OFlags::NONBLOCK;
        let mode = Mode::from_bits_truncate(mode & 0o7777);
        let creat = want.contains(OFlags::CREATE);
        let excl = want.contains(OFlags::EXCL);
        let plain = want & !(OFlags::CREATE | OFlags::EXCL);
        for _ in 0..4 {
            if !(creat && excl) {
                match self.open_existing(path, plain) {
                    Ok(fd) => return Ok((fd, false)),
                    Err(Errno::ENOENT) if creat => {}
                    Err(e) => return Err(e),
                }
            }
            // Create exclusively so we know the file is ours to chmod;
            // O_CREAT|O_EXCL never follows a final symbolic link.
            match self.resolve_mode(path, want | OFlags::CREATE | OFlags::EXCL, mode) {
                Ok(fd) => {
                    // The server's umask must not narrow the client's mode.
                    rustix::fs::fchmod(&fd, mode).map_err(err)?;
                    return Ok((fd, true));
                }
                Err(Errno::EEXIST) if !excl => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Errno::EEXIST)
    }

    /// Opens an existing file: first as `O_PATH` to check its type without
    /// side effects, then for real, and checks that both are the same file.
    fn open_existing(&self, path: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
        let nofollow = flags & OFlags::NOFOLLOW;
        let probe = self.resolve(path, OFlags::PATH | nofollow)?;
        let st = rustix::fs::fstat(&probe).map_err(err)?;
        check_regular(&st)?;
        let fd = self.resolve(path, flags)?;
        let st2 = rustix::fs::fstat(&fd).map_err(err)?;
        check_regular(&st2)?;
        if file_id(&st) != file_id(&st2) {
            // Replaced between the two opens: let the client retry.
            return Err(Errno::EAGAIN);
        }
        Ok(fd)
    }

    /// Makes a directory with exactly `mode` (plus set-group-ID, which a
    /// directory made in a set-group-ID directory inherits).
    pub fn mkdir(&self, path: &[u8], mode: u32) -> Result<Attr, Errno> {
        let (dir, name) = self.parent(path)?;
        let inherit = rustix::fs::fstat(&dir).map_err(err)?.st_mode & libc::S_ISGID;
        let mode = Mode::from_bits_truncate((mode | inherit) & 0o7777);
        rustix::fs::mkdirat(&dir, name, mode).map_err(err)?;
        let fd = name_fd(&dir, name, OFlags::DIRECTORY)?;
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        if st.st_mode & 0o7777 != mode.bits() {
            // Best effort: the directory exists either way.
            let _ = chmod_opath(&fd, mode);
        }
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        Ok(attr_of(&st))
    }

    /// Makes a FIFO, socket, character or block device node, or an empty
    /// regular file (`mode`'s file type; 0 is a regular file) with exactly
    /// `mode`'s permission bits. `rdev` is a device node's number.
    pub fn mknod(&self, path: &[u8], mode: u32, rdev: u64) -> Result<Attr, Errno> {
        use rustix::fs::FileType;
        let kind = match mode & libc::S_IFMT {
            0 | libc::S_IFREG => FileType::RegularFile,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFCHR => FileType::CharacterDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            _ => return Err(Errno::EINVAL),
        };
        let (dir, name) = self.parent(path)?;
        let perm = Mode::from_bits_truncate(mode & 0o7777);
        rustix::fs::mknodat(&dir, name, kind, perm, rdev).map_err(err)?;
        let fd = name_fd(&dir, name, OFlags::empty())?;
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        if st.st_mode & 0o7777 != perm.bits() {
            // The server's umask must not narrow the client's mode.
            chmod_opath(&fd, perm)?;
        }
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        Ok(attr_of(&st))
    }

    /// Gives the name `path` just created (not followed) to `uid` and
    /// `gid` — the group stays the directory's when that directory is
    /// set-group-ID, as it would for a creator of that group — and puts
    /// back the permission bits a change of owner clears (set-user-ID,
    /// set-group-ID). Returns the new attributes.
    pub fn give(&self, path: &[u8], uid: u32, gid: u32) -> Result<Attr, Errno> {
        let (dir, name) = self.parent(path)?;
        let inherit = rustix::fs::fstat(&dir).map_err(err)?.st_mode & libc::S_ISGID != 0;
        let fd = name_fd(&dir, name, OFlags::empty())?;
        let before = rustix::fs::fstat(&fd).map_err(err)?;
        let gid = (!inherit).then(|| rustix::fs::Gid::from_raw(gid));
        rustix::fs::chownat(
            &fd,
            c"",
            Some(rustix::fs::Uid::from_raw(uid)),
            gid,
            AtFlags::EMPTY_PATH,
        )
        .map_err(err)?;
        let st = rustix::fs::fstat(&fd).map_err(err)?;
        let is_link = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
        if !is_link && st.st_mode & 0o7777 != before.st_mode & 0o7777 {
            chmod_opath(&fd, Mode::from_bits_truncate(before.st_mode & 0o7777))?;
            return Ok(attr_of(&rustix::fs::fstat(&fd).map_err(err)?));
        }
        Ok(attr_of(&st))
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &[u8]) -> Result<(), Errno> {
        let (dir, name) = self.parent(path)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(err)
    }

    /// Removes a name that is not a directory.
    pub fn unlink(&self, path: &[u8]) -> Result<(), Errno> {
        let (dir, name) = self.parent(path)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(err)
    }

    /// Renames `old` to `new` (neither followed); `flags` are
    /// [`vio::RENAME_NOREPLACE`] / [`vio::RENAME_EXCHANGE`].
    pub fn rename(&self, old: &[u8], new: &[u8], flags: u32) -> Result<(), Errno> {
        let (od, on) = self.parent(old)?;
        let (nd, nn) = self.parent(new)?;
        let mut f = RenameFlags::empty();
        if flags & vio::RENAME_NOREPLACE != 0 {
            f |= RenameFlags::NOREPLACE;
        }
        if flags & vio::RENAME_EXCHANGE != 0 {
            f |= RenameFlags::EXCHANGE;
        }
        rustix::fs::renameat_with(&od, on, &nd, nn, f).map_err(err)
    }

    /// Makes a hard link `new` to `old` (not followed).
    pub fn link(&self, old: &[u8], new: &[u8]) -> Result<Attr, Errno> {
        let (od, on) = self.parent(old)?;
        let (nd, nn) = self.parent(new)?;
        rustix::fs::linkat(&od, on, &nd, nn, AtFlags::empty()).map_err(err)?;
        let st = rustix::fs::statat(&nd, nn, AtFlags::SYMLINK_NOFOLLOW).map_err(err)?;
        Ok(attr_of(&st))
    }

    /// Makes a symbolic link at `path` holding `target`. The target is
    /// stored as given (it is only text); resolving it later is confined
    /// like any other path.
    pub fn symlink(&self, target: &[u8], path: &[u8]) -> Result<Attr, Errno> {
        if target.is_empty() || target.contains(&0) {
            return Err(Errno::EINVAL);
        }
        if target.len() > MAX_PATH {
            return Err(Errno::ENAMETOOLONG);
        }
        let (dir, name) = self.parent(path)?;
        rustix::fs::symlinkat(target, &dir, name).map_err(err)?;
        let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err)?;
        Ok(attr_of(&st))
    }

    /// The target of the symbolic link at `path` (`EINVAL` if it is not one).
    pub fn readlink(&self, path: &[u8]) -> Result<Vec<u8>, Errno> {
        let fd = self.resolve(path, OFlags::PATH | OFlags::NOFOLLOW)?;
        let t = rustix::fs::readlinkat(&fd, c"", Vec::new()).map_err(|e| {
            if e == rustix::io::Errno::NOENT {
                // readlinkat on an empty path answers ENOENT for non-links.
                Errno::EINVAL
            } else {
                err(e)
            }
        })?;
        Ok(t.into_bytes())
    }

    /// Applies attribute changes to `path` without following a final
    /// symbolic link. Size changes are the caller's (it must order them
    /// with pending writes); this does mode, owner and times.
    pub fn setattr(&self, path: &[u8], s: &SetAttr) -> Result<Attr, Errno> {
        let fd = self.resolve(path, OFlags::PATH | OFlags::NOFOLLOW)?;
        setattr_fd(&fd, s)
    }

    /// The entries of the directory at `path`, without `.` and `..`.
    pub fn list(&self, path: &[u8]) -> Result<Vec<Dirent>, Errno> {
        self.list_dir(path).map(|(_, entries)| entries)
    }

    /// [`Root::list`], and the directory, open, for [`stat_entry`].
    pub fn list_dir(&self, path: &[u8]) -> Result<(OwnedFd, Vec<Dirent>), Errno> {
        let fd = self.resolve(path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let dir = rustix::fs::Dir::read_from(&fd).map_err(err)?;
        let mut out = Vec::new();
        for e in dir {
            let e = e.map_err(err)?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            out.push(Dirent {
                ino: e.ino().max(1),
                kind: dt_of(e.file_type()),
                name: name.to_vec(),
            });
        }
        Ok((fd, out))
    }

    /// The file at `path` itself (a final symbolic link not followed),
    /// named for the xattr calls: `/proc/self/fd/N` of a descriptor
    /// resolved beneath the root, so they reach exactly that file.
    fn xattr_target(&self, path: &[u8]) -> Result<(OwnedFd, String), Errno> {
        let fd = self.resolve(path, OFlags::PATH | OFlags::NOFOLLOW)?;
        let name = format!("/proc/self/fd/{}", fd.as_raw_fd());
        Ok((fd, name))
    }

    /// An extended attribute's value (`room` 0: only its length, with an
    /// empty value); `ERANGE` when `room` is too small.
    pub fn getxattr(
        &self,
        path: &[u8],
        name: &[u8],
        room: usize,
    ) -> Result<(usize, Vec<u8>), Errno> {
        let (_fd, at) = self.xattr_target(path)?;
        let mut buf = vec![0u8; room];
        let n = rustix::fs::getxattr(at.as_str(), name, &mut buf[..]).map_err(err)?;
        buf.truncate(if room == 0 { 0 } else { n });
        Ok((n, buf))
    }

    /// The names of the file's extended attributes, NUL-terminated (`room`
    /// 0: only the length).
    pub fn listxattr(&self, path: &[u8], room: usize) -> Result<(usize, Vec<u8>), Errno> {
        let (_fd, at) = self.xattr_target(path)?;
        let mut buf = vec![0u8; room];
        let n = rustix::fs::listxattr(at.as_str(), &mut buf[..]).map_err(err)?;
        buf.truncate(if room == 0 { 0 } else { n });
        Ok((n, buf))
    }

    /// Sets an extended attribute (`flags`: [`vio::XATTR_CREATE`],
    /// [`vio::XATTR_REPLACE`]).
    pub fn setxattr(
        &self,
        path: &[u8],
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        let (_fd, at) = self.xattr_target(path)?;
        let mut f = rustix::fs::XattrFlags::empty();
        if flags & vio::XATTR_CREATE != 0 {
            f |= rustix::fs::XattrFlags::CREATE;
        }
        if flags & vio::XATTR_REPLACE != 0 {
            f |= rustix::fs::XattrFlags::REPLACE;
        }
        rustix::fs::setxattr(at.as_str(), name, value, f).map_err(err)
    }

    /// Removes an extended attribute.
    pub fn removexattr(&self, path: &[u8], name: &[u8]) -> Result<(), Errno> {
        let (_fd, at) = self.xattr_target(path)?;
        rustix::fs::removexattr(at.as_str(), name).map_err(err)
    }

    /// Statistics of the file system holding the root.
    pub fn statfs(&self) -> Result<StatFs, Errno> {
        let v = rustix::fs::fstatvfs(&self.fd).map_err(err)?;
        Ok(StatFs {
            blocks: v.f_blocks,
            bfree: v.f_bfree,
            bavail: v.f_bavail,
            files: v.f_files,
            ffree: v.f_ffree,
            bsize: u32::try_from(v.f_bsize).unwrap_or(4096),
            namelen: u32::try_from(v.f_namemax).unwrap_or(255),
            frsize: u32::try_from(v.f_frsize).unwrap_or(4096),
        })
    }
}

fn check_regular(st: &Stat) -> Result<(), Errno> {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Ok(()),
        libc::S_IFDIR => Err(Errno::EISDIR),
        _ => Err(Errno::EOPNOTSUPP),
    }
}

fn dt_of(t: rustix::fs::FileType) -> u8 {
    use rustix::fs::FileType as T;
    match t {
        T::RegularFile => libc::DT_REG,
        T::Directory => libc::DT_DIR,
        T::Symlink => libc::DT_LNK,
        T::Fifo => libc::DT_FIFO,
        T::Socket => libc::DT_SOCK,
        T::CharacterDevice => libc::DT_CHR,
        T::BlockDevice => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    }
}

/// chmod through an `O_PATH` descriptor: via the server's own
/// `/proc/self/fd` entry, which names exactly the file the descriptor
/// holds (Linux has no fchmod for `O_PATH` descriptors before 6.6).
/// Changes the attributes `s` asks for (not the size) of the file `fd`
/// stands for: an `O_PATH` descriptor of a name, or an open file.
pub fn setattr_fd(fd: &impl AsFd, s: &SetAttr) -> Result<Attr, Errno> {
    let st = rustix::fs::fstat(fd).map_err(err)?;

    if s.valid & vio::SET_MODE != 0 {
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(Errno::EOPNOTSUPP);
        }
        chmod_opath(fd, Mode::from_bits_truncate(s.mode & 0o7777))?;
    }
    if s.valid & (vio::SET_UID | vio::SET_GID) != 0 {
        let uid = (s.valid & vio::SET_UID != 0).then(|| rustix::fs::Uid::from_raw(s.uid));
        let gid = (s.valid & vio::SET_GID != 0).then(|| rustix::fs::Gid::from_raw(s.gid));
        rustix::fs::chownat(fd, c"", uid, gid, AtFlags::EMPTY_PATH).map_err(err)?;
    }
    let tv = |set: u32, now: u32, sec: i64, ns: u32| {
        if s.valid & now != 0 {
            rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_NOW,
            }
        } else if s.valid & set != 0 {
            rustix::fs::Timespec {
                tv_sec: sec,
                tv_nsec: i64::from(ns),
            }
        } else {
            rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            }
        }
    };
    if s.valid & (vio::SET_ATIME | vio::SET_MTIME | vio::SET_ATIME_NOW | vio::SET_MTIME_NOW) != 0 {
        let ts = Timestamps {
            last_access: tv(vio::SET_ATIME, vio::SET_ATIME_NOW, s.atime, s.atime_ns),
            last_modification: tv(vio::SET_MTIME, vio::SET_MTIME_NOW, s.mtime, s.mtime_ns),
        };
        rustix::fs::utimensat(
            fd,
            c"",
            &ts,
            AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(err)?;
    }
    let st = rustix::fs::fstat(fd).map_err(err)?;
    Ok(attr_of(&st))
}

/// An `O_PATH` descriptor of the single name `name` in `dir`, not
/// followed (`extra`: more flags, e.g. `DIRECTORY`).
fn name_fd(dir: &OwnedFd, name: &[u8], extra: OFlags) -> Result<OwnedFd, Errno> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC | extra;
    rustix::fs::openat(dir, name, flags, Mode::empty()).map_err(err)
}

fn chmod_opath(fd: &impl AsFd, mode: Mode) -> Result<(), Errno> {
    let p = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd());
    rustix::fs::chmodat(CWD, p.as_str(), mode, AtFlags::empty()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `..` resolved while renames happen elsewhere on the system (a
    /// busy server's other clients) is retried, never refused: openat2
    /// answers EAGAIN when a rename raced the walk.
    #[test]
    fn dot_dot_survives_renames_elsewhere() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("f"), b"x").unwrap();
        let r = Root::open(&root).unwrap();
        let other = tempfile::tempdir().unwrap();
        let (x, y) = (other.path().join("x"), other.path().join("y"));
        std::fs::write(&x, b"").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renamer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                for i in 0..200_000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let (a, b) = if i % 2 == 0 { (&x, &y) } else { (&y, &x) };
                    let _ = std::fs::rename(a, b);
                }
            })
        };
        let mut refused = 0;
        for _ in 0..20_000 {
            if r.resolve(b"a/b/../../f", OFlags::PATH).is_err() {
                refused += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        renamer.join().unwrap();
        assert_eq!(refused, 0, "of 20,000 resolutions during renames");
    }

    #[test]
    fn lexical_checks() {
        assert_eq!(check_path(b"a/b"), Ok(()));
        assert_eq!(check_path(b""), Ok(()));
        assert_eq!(check_path(b"a\0b"), Err(Errno::EINVAL));
        assert_eq!(check_path(b"/etc/passwd"), Err(Errno::EXDEV));
        assert_eq!(check_path(&[b'x'; 256]), Err(Errno::ENAMETOOLONG));
        assert_eq!(check_path(&[b'x'; 255]), Ok(()));
        // Deeper than PATH_MAX is a path; over the request limit not.
        assert_eq!(check_path(&b"d/".repeat(2049)), Ok(()));
        let long: Vec<u8> = b"d/".repeat(MAX_REQUEST_PATH / 2 + 1);
        assert_eq!(check_path(&long), Err(Errno::ENAMETOOLONG));
    }

    #[test]
    fn split_last_wants_a_plain_name() {
        assert_eq!(split_last(b"a/b/c"), Ok((&b"a/b"[..], &b"c"[..])));
        assert_eq!(split_last(b"c"), Ok((&b""[..], &b"c"[..])));
        assert_eq!(split_last(b"a/c//"), Ok((&b"a"[..], &b"c"[..])));
        assert_eq!(split_last(b""), Err(Errno::EINVAL));
        assert_eq!(split_last(b"a/.."), Err(Errno::EINVAL));
        assert_eq!(split_last(b"."), Err(Errno::EINVAL));
    }

    #[test]
    fn resolution_stays_beneath_the_root() {
        let outer = tempfile::tempdir().unwrap();
        let root_dir = outer.path().join("root");
        std::fs::create_dir(&root_dir).unwrap();
        std::fs::write(outer.path().join("secret"), b"s").unwrap();
        std::fs::create_dir(root_dir.join("d")).unwrap();
        std::fs::write(root_dir.join("d/f"), b"inside").unwrap();
        std::os::unix::fs::symlink("../secret", root_dir.join("up")).unwrap();
        std::os::unix::fs::symlink("d/f", root_dir.join("ok")).unwrap();
        let r = Root::open(&root_dir).unwrap();
        assert!(r.stat(b"d/f", true).is_ok());
        assert!(r.stat(b"d/../d/f", true).is_ok());
        assert_eq!(r.stat(b"ok", true).unwrap().0.size, 6);
        assert_eq!(r.stat(b"../secret", true).unwrap_err(), Errno::EXDEV);
        assert_eq!(r.stat(b"up", true).unwrap_err(), Errno::EXDEV);
        assert!(r.stat(b"up", false).unwrap().0.is_symlink());
        assert_eq!(r.readlink(b"up").unwrap(), b"../secret");
        assert_eq!(r.readlink(b"d/f").unwrap_err(), Errno::EINVAL);
        // open_file creates with the exact mode, ignoring the umask.
        let (_, created) = r
            .open_file(b"d/new", (libc::O_CREAT | libc::O_WRONLY) as u32, 0o666)
            .unwrap();
        assert!(created);
        assert_eq!(r.stat(b"d/new", true).unwrap().0.mode & 0o777, 0o666);
        assert_eq!(
            r.open_file(b"d", libc::O_RDONLY as u32, 0).unwrap_err(),
            Errno::EISDIR
        );
        let a = r.mkdir(b"d/sub", 0o777).unwrap();
        assert_eq!(a.mode & 0o777, 0o777);
        let s = SetAttr {
            valid: vio::SET_MODE | vio::SET_MTIME,
            mode: 0o700,
            mtime: 1_000_000,
            mtime_ns: 5,
            ..SetAttr::default()
        };
        let a = r.setattr(b"d/sub", &s).unwrap();
        assert_eq!((a.mode & 0o777, a.mtime, a.mtime_ns), (0o700, 1_000_000, 5));
        assert_eq!(
            r.setattr(b"up", &s).unwrap_err(),
            Errno::EOPNOTSUPP,
            "chmod of a symlink"
        );
        assert!(r.statfs().unwrap().bsize > 0);
        let names: Vec<Vec<u8>> = r.list(b"d").unwrap().into_iter().map(|d| d.name).collect();
        assert_eq!(names.len(), 3);
    }
}
