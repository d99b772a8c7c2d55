//! V I/O's attributes, times and file types as FUSE's, and back.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};

use crate::vio::Attr;

/// Do two answers' attributes show the same file contents?
pub(super) fn same_data(a: &Attr, b: &Attr) -> bool {
    (a.dev, a.ino, a.size, a.mtime, a.mtime_ns) == (b.dev, b.ino, b.size, b.mtime, b.mtime_ns)
}

pub(super) fn time(sec: i64, ns: u32) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, ns)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(u64::from(ns))
    }
}

pub(super) fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(super) fn dt_of_mode(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFSOCK => libc::DT_SOCK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        _ => libc::DT_REG,
    }
}

pub(super) fn dt_kind(dt: u8) -> FileType {
    match dt {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(super) fn file_attr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime, a.atime_ns),
        mtime: time(a.mtime, a.mtime_ns),
        ctime: time(a.ctime, a.ctime_ns),
        crtime: time(a.ctime, a.ctime_ns),
        kind: kind_of(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize.max(512),
        flags: 0,
    }
}

/// Asks in `valid` for a time that a FUSE setattr sets: the bit `now` for
/// the current time, or the bit `given` with the time put in `at`.
pub(super) fn set_time(
    valid: &mut u32,
    t: Option<TimeOrNow>,
    (now, given): (u32, u32),
    at: (&mut i64, &mut u32),
) {
    match t {
        Some(TimeOrNow::Now) => *valid |= now,
        Some(TimeOrNow::SpecificTime(t)) => {
            *valid |= given;
            (*at.0, *at.1) = split_time(t);
        }
        None => {}
    }
}

pub(super) fn split_time(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let mut s = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            let mut ns = d.subsec_nanos();
            if ns > 0 {
                s -= 1;
                ns = 1_000_000_000 - ns;
            }
            (s, ns)
        }
    }
}
