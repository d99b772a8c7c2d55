//! Records carried in segments: attributes, attribute changes, file
//! system statistics and directory entries.

use super::*;

/// Reads `N` big-endian bytes at `at`, or `None` past the end.
pub(super) fn be<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

pub(super) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    be::<4>(b, at).map(u32::from_be_bytes)
}

pub(super) fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    be::<8>(b, at).map(u64::from_be_bytes)
}

pub(super) fn i64_at(b: &[u8], at: usize) -> Option<i64> {
    be::<8>(b, at).map(i64::from_be_bytes)
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is shorter than its layout.
    #[error("record truncated: {have} of {need} bytes")]
    Short {
        /// Bytes present.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A field has an impossible value.
    #[error("bad field: {0}")]
    Field(&'static str),
}

/// Bytes of an [`Attr`] record.
pub const ATTR_LEN: usize = 88;

/// File attributes (a `stat` result) as carried in segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attr {
    /// Inode number on the server.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Last access, seconds since the epoch.
    pub atime: i64,
    /// Last modification, seconds.
    pub mtime: i64,
    /// Last status change, seconds.
    pub ctime: i64,
    /// Nanoseconds of `atime`.
    pub atime_ns: u32,
    /// Nanoseconds of `mtime`.
    pub mtime_ns: u32,
    /// Nanoseconds of `ctime`.
    pub ctime_ns: u32,
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number for device files.
    pub rdev: u32,
    /// Preferred I/O size.
    pub blksize: u32,
    /// Server device number (low 32 bits).
    pub dev: u32,
}

impl Attr {
    /// Encodes into [`ATTR_LEN`] bytes.
    pub fn encode(&self) -> [u8; ATTR_LEN] {
        let mut b = [0u8; ATTR_LEN];
        b[0..8].copy_from_slice(&self.ino.to_be_bytes());
        b[8..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..24].copy_from_slice(&self.blocks.to_be_bytes());
        b[24..32].copy_from_slice(&self.atime.to_be_bytes());
        b[32..40].copy_from_slice(&self.mtime.to_be_bytes());
        b[40..48].copy_from_slice(&self.ctime.to_be_bytes());
        let words = [
            self.atime_ns,
            self.mtime_ns,
            self.ctime_ns,
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            self.rdev,
            self.blksize,
            self.dev,
        ];
        for (i, v) in words.iter().enumerate() {
            b[48 + 4 * i..52 + 4 * i].copy_from_slice(&v.to_be_bytes());
        }
        b
    }

    /// Decodes an [`ATTR_LEN`]-byte record (longer input is fine).
    pub fn decode(b: &[u8]) -> Result<Attr, DecodeError> {
        let short = DecodeError::Short {
            have: b.len(),
            need: ATTR_LEN,
        };
        if b.len() < ATTR_LEN {
            return Err(short);
        }
        let w = |i: usize| u32_at(b, 48 + 4 * i).ok_or(short.clone());
        let a = Attr {
            ino: u64_at(b, 0).ok_or(short.clone())?,
            size: u64_at(b, 8).ok_or(short.clone())?,
            blocks: u64_at(b, 16).ok_or(short.clone())?,
            atime: i64_at(b, 24).ok_or(short.clone())?,
            mtime: i64_at(b, 32).ok_or(short.clone())?,
            ctime: i64_at(b, 40).ok_or(short.clone())?,
            atime_ns: w(0)?,
            mtime_ns: w(1)?,
            ctime_ns: w(2)?,
            mode: w(3)?,
            nlink: w(4)?,
            uid: w(5)?,
            gid: w(6)?,
            rdev: w(7)?,
            blksize: w(8)?,
            dev: w(9)?,
        };
        if a.atime_ns >= 1_000_000_000 || a.mtime_ns >= 1_000_000_000 {
            return Err(DecodeError::Field("nanoseconds"));
        }
        Ok(a)
    }

    /// The file type bits (`mode & S_IFMT`).
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    /// True for a regular file.
    pub fn is_file(&self) -> bool {
        self.kind() == libc::S_IFREG
    }

    /// True for a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }
}

/// Bytes of a [`SetAttr`] record.
pub const SETATTR_LEN: usize = 48;

/// [`SetAttr::valid`]: set the permission bits.
pub const SET_MODE: u32 = 1;
/// [`SetAttr::valid`]: set the owner.
pub const SET_UID: u32 = 2;
/// [`SetAttr::valid`]: set the group.
pub const SET_GID: u32 = 4;
/// [`SetAttr::valid`]: set the size.
pub const SET_SIZE: u32 = 8;
/// [`SetAttr::valid`]: set the access time to the record's.
pub const SET_ATIME: u32 = 16;
/// [`SetAttr::valid`]: set the modification time to the record's.
pub const SET_MTIME: u32 = 32;
/// [`SetAttr::valid`]: set the access time to the server's now.
pub const SET_ATIME_NOW: u32 = 64;
/// [`SetAttr::valid`]: set the modification time to the server's now.
pub const SET_MTIME_NOW: u32 = 128;
pub(super) const SET_ALL: u32 = 255;

/// Attribute changes (chmod, chown, truncate, utimens in one request).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Which fields apply (`SET_*` bits).
    pub valid: u32,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size.
    pub size: u64,
    /// Access time, seconds.
    pub atime: i64,
    /// Access time, nanoseconds.
    pub atime_ns: u32,
    /// Modification time, nanoseconds.
    pub mtime_ns: u32,
    /// Modification time, seconds.
    pub mtime: i64,
}

impl SetAttr {
    /// Encodes into [`SETATTR_LEN`] bytes.
    pub fn encode(&self) -> [u8; SETATTR_LEN] {
        let mut b = [0u8; SETATTR_LEN];
        b[0..4].copy_from_slice(&self.valid.to_be_bytes());
        b[4..8].copy_from_slice(&self.mode.to_be_bytes());
        b[8..12].copy_from_slice(&self.uid.to_be_bytes());
        b[12..16].copy_from_slice(&self.gid.to_be_bytes());
        b[16..24].copy_from_slice(&self.size.to_be_bytes());
        b[24..32].copy_from_slice(&self.atime.to_be_bytes());
        b[32..36].copy_from_slice(&self.atime_ns.to_be_bytes());
        b[36..40].copy_from_slice(&self.mtime_ns.to_be_bytes());
        b[40..48].copy_from_slice(&self.mtime.to_be_bytes());
        b
    }

    /// Decodes a record; unknown `valid` bits and nanoseconds ≥ 10⁹ are errors.
    pub fn decode(b: &[u8]) -> Result<SetAttr, DecodeError> {
        let short = DecodeError::Short {
            have: b.len(),
            need: SETATTR_LEN,
        };
        let s = SetAttr {
            valid: u32_at(b, 0).ok_or(short.clone())?,
            mode: u32_at(b, 4).ok_or(short.clone())?,
            uid: u32_at(b, 8).ok_or(short.clone())?,
            gid: u32_at(b, 12).ok_or(short.clone())?,
            size: u64_at(b, 16).ok_or(short.clone())?,
            atime: i64_at(b, 24).ok_or(short.clone())?,
            atime_ns: u32_at(b, 32).ok_or(short.clone())?,
            mtime_ns: u32_at(b, 36).ok_or(short.clone())?,
            mtime: i64_at(b, 40).ok_or(short)?,
        };
        if s.valid & !SET_ALL != 0 {
            return Err(DecodeError::Field("valid bits"));
        }
        if s.atime_ns >= 1_000_000_000 || s.mtime_ns >= 1_000_000_000 {
            return Err(DecodeError::Field("nanoseconds"));
        }
        // (-1 is chown's "leave it", never an owner.)
        if (s.valid & SET_UID != 0 && s.uid == u32::MAX)
            || (s.valid & SET_GID != 0 && s.gid == u32::MAX)
        {
            return Err(DecodeError::Field("owner"));
        }
        Ok(s)
    }
}

/// Bytes of a [`StatFs`] record.
pub const STATFS_LEN: usize = 52;

/// File-system statistics of the exported tree's file system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Total blocks (of `frsize`).
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

impl StatFs {
    /// Encodes into [`STATFS_LEN`] bytes.
    pub fn encode(&self) -> [u8; STATFS_LEN] {
        let mut b = [0u8; STATFS_LEN];
        for (i, v) in [self.blocks, self.bfree, self.bavail, self.files, self.ffree]
            .iter()
            .enumerate()
        {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_be_bytes());
        }
        b[40..44].copy_from_slice(&self.bsize.to_be_bytes());
        b[44..48].copy_from_slice(&self.namelen.to_be_bytes());
        b[48..52].copy_from_slice(&self.frsize.to_be_bytes());
        b
    }

    /// Decodes a record.
    pub fn decode(b: &[u8]) -> Result<StatFs, DecodeError> {
        let short = DecodeError::Short {
            have: b.len(),
            need: STATFS_LEN,
        };
        let q = |i: usize| u64_at(b, 8 * i).ok_or(short.clone());
        Ok(StatFs {
            blocks: q(0)?,
            bfree: q(1)?,
            bavail: q(2)?,
            files: q(3)?,
            ffree: q(4)?,
            bsize: u32_at(b, 40).ok_or(short.clone())?,
            namelen: u32_at(b, 44).ok_or(short.clone())?,
            frsize: u32_at(b, 48).ok_or(short)?,
        })
    }
}

/// Fixed bytes of a directory entry before its name.
pub const DIRENT_HEAD: usize = 10;

/// One directory entry: inode, type (a `DT_*` value) and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent {
    /// Inode number on the server (never 0).
    pub ino: u64,
    /// `DT_*` type (`DT_UNKNOWN` = 0 when the server could not tell).
    pub kind: u8,
    /// The name (1..=255 bytes, no `/` or NUL; never `.` or `..`).
    pub name: Vec<u8>,
}

impl Dirent {
    /// Encoded length.
    pub fn len(&self) -> usize {
        DIRENT_HEAD + self.name.len()
    }

    /// True if the name is empty (never for a valid entry).
    pub fn is_empty(&self) -> bool {
        self.name.is_empty()
    }

    /// Appends the entry: ino u64, type u8, name length u8, name.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ino.to_be_bytes());
        out.push(self.kind);
        out.push(self.name.len().min(MAX_NAME) as u8);
        out.extend_from_slice(&self.name[..self.name.len().min(MAX_NAME)]);
    }

    /// Decodes a packed run of entries.
    pub fn decode_all(mut b: &[u8]) -> Result<Vec<Dirent>, DecodeError> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let short = DecodeError::Short {
                have: b.len(),
                need: DIRENT_HEAD,
            };
            let ino = u64_at(b, 0).ok_or(short.clone())?;
            let kind = *b.get(8).ok_or(short.clone())?;
            let n = usize::from(*b.get(9).ok_or(short)?);
            let name = b
                .get(DIRENT_HEAD..DIRENT_HEAD + n)
                .ok_or(DecodeError::Short {
                    have: b.len(),
                    need: DIRENT_HEAD + n,
                })?;
            if n == 0 || name.contains(&b'/') || name.contains(&0) {
                return Err(DecodeError::Field("entry name"));
            }
            out.push(Dirent {
                ino,
                kind,
                name: name.to_vec(),
            });
            b = &b[DIRENT_HEAD + n..];
        }
        Ok(out)
    }
}
