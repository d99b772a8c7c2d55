//! A [`Request`] to and from its message words.

use super::*;

impl Request {
    /// The request message (code, fields, and the idempotent flag when it
    /// applies). The segment is declared by the kernel on Send.
    pub fn encode(&self) -> Message {
        let mut m = Message::zero();
        let w = &mut m.0;
        let code = match *self {
            Request::Open {
                prefetch,
                path_len,
                flags,
                mode,
                owner,
            } => {
                (w[1], w[2], w[3]) = (path_len, flags, mode);
                (w[4], w[5]) = (owner.uid, owner.gid);
                if prefetch {
                    OPENREAD
                } else {
                    OPEN
                }
            }
            Request::Close { handle } => {
                w[1] = handle;
                CLOSE
            }
            Request::Read {
                handle,
                offset,
                count,
            } => {
                w[1] = handle;
                (w[2], w[3]) = split64(offset);
                w[4] = count;
                READ
            }
            Request::Write {
                handle,
                offset,
                count,
                flags,
            } => {
                w[1] = handle;
                (w[2], w[3]) = split64(offset);
                (w[4], w[5]) = (count, flags);
                WRITE
            }
            Request::Stat { path_len, nofollow } => {
                w[1] = path_len;
                w[2] = if nofollow { STAT_NOFOLLOW } else { 0 };
                STAT
            }
            Request::Fstat { handle } => {
                w[1] = handle;
                FSTAT
            }
            Request::Opendir { path_len } => {
                w[1] = path_len;
                OPENDIR
            }
            Request::Readdir { handle, index } => {
                (w[1], w[2]) = (handle, index);
                READDIR
            }
            Request::Mkdir {
                path_len,
                mode,
                owner,
            } => {
                (w[1], w[2]) = (path_len, mode);
                (w[4], w[5]) = (owner.uid, owner.gid);
                MKDIR
            }
            Request::Rmdir { path_len } => {
                w[1] = path_len;
                RMDIR
            }
            Request::Unlink { path_len } => {
                w[1] = path_len;
                UNLINK
            }
            Request::Rename {
                old_len,
                new_len,
                flags,
            } => {
                (w[1], w[2], w[3]) = (old_len, new_len, flags);
                RENAME
            }
            Request::Truncate { path_len, size } => {
                w[1] = path_len;
                (w[2], w[3]) = split64(size);
                TRUNCATE
            }
            Request::Ftruncate { handle, size } => {
                w[1] = handle;
                (w[2], w[3]) = split64(size);
                FTRUNCATE
            }
            Request::Fsync {
                handle,
                datasync,
                flush_only,
            } => {
                w[1] = handle;
                w[2] = if datasync { FSYNC_DATASYNC } else { 0 }
                    | if flush_only { FSYNC_FLUSH_ONLY } else { 0 };
                FSYNC
            }
            Request::Symlink {
                target_len,
                path_len,
                owner,
            } => {
                (w[1], w[2]) = (target_len, path_len);
                (w[4], w[5]) = (owner.uid, owner.gid);
                SYMLINK
            }
            Request::Mknod {
                path_len,
                mode,
                rdev,
                owner,
            } => {
                (w[1], w[2], w[3]) = (path_len, mode, rdev);
                (w[4], w[5]) = (owner.uid, owner.gid);
                MKNOD
            }
            Request::Readlink { path_len } => {
                w[1] = path_len;
                READLINK
            }
            Request::Setattr { path_len } => {
                w[1] = path_len;
                SETATTR
            }
            Request::Fsetattr { handle } => {
                w[1] = handle;
                FSETATTR
            }
            Request::Link { old_len, new_len } => {
                (w[1], w[2]) = (old_len, new_len);
                LINK
            }
            Request::Statfs => STATFS,
            Request::Watch {
                callback,
                members,
                flags,
            } => {
                (w[1], w[2], w[3]) = (callback, members, flags);
                WATCH
            }
            Request::Unwatch { callback } => {
                w[1] = callback;
                UNWATCH
            }
            Request::Readdirplus { handle, index } => {
                (w[1], w[2]) = (handle, index);
                READDIRPLUS
            }
            Request::Closev { count } => {
                w[1] = count;
                CLOSEV
            }
            Request::Removev { count, len } => {
                (w[1], w[2]) = (count, len);
                REMOVEV
            }
            Request::Lock {
                handle,
                flags,
                owner,
                pid,
            } => {
                (w[1], w[2]) = (handle, flags);
                (w[3], w[4]) = split64(owner);
                w[5] = pid;
                LOCK
            }
            Request::Getxattr {
                path_len,
                name_len,
                size,
            } => {
                (w[1], w[2], w[3]) = (path_len, name_len, size);
                GETXATTR
            }
            Request::Listxattr { path_len, size } => {
                (w[1], w[2]) = (path_len, size);
                LISTXATTR
            }
            Request::Setxattr {
                path_len,
                name_len,
                value_len,
                flags,
            } => {
                (w[1], w[2], w[3], w[4]) = (path_len, name_len, value_len, flags);
                SETXATTR
            }
            Request::Removexattr { path_len, name_len } => {
                (w[1], w[2]) = (path_len, name_len);
                REMOVEXATTR
            }
            Request::Fallocate { handle, mode } => {
                (w[1], w[2]) = (handle, mode);
                FALLOCATE
            }
            Request::Lseek {
                handle,
                whence,
                offset,
            } => {
                (w[1], w[2]) = (handle, whence);
                (w[3], w[4]) = split64(offset);
                LSEEK
            }
        };
        w[0] = code;
        if self.idempotent() {
            m.set_flag(IDEMPOTENT, true);
        }
        m
    }

    /// Decodes a request message: `ENOSYS` for an unknown code,
    /// `ENAMETOOLONG` for a path length over [`MAX_REQUEST_PATH`] (a
    /// symbolic link's target over [`MAX_PATH`]), `EINVAL` for bad flag
    /// values.
    pub fn decode(m: &Message) -> Result<Request, Errno> {
        let w = &m.0;
        let upto = |most: usize| {
            move |n: u32| -> Result<u32, Errno> {
                if n as usize > most {
                    Err(Errno::ENAMETOOLONG)
                } else {
                    Ok(n)
                }
            }
        };
        let path = upto(MAX_REQUEST_PATH);
        let target = upto(MAX_PATH);
        let owner = Owner {
            uid: w[4],
            gid: w[5],
        };
        let xname = |n: u32| -> Result<u32, Errno> {
            match n {
                0 => Err(Errno::EINVAL),
                n if n as usize > MAX_NAME => Err(Errno(libc::ERANGE as u32)),
                n => Ok(n),
            }
        };
        // -1 is chown's "leave it", never an owner.
        let creates = matches!(w[0] & CODE_MASK, OPEN | OPENREAD | MKDIR | SYMLINK | MKNOD);
        if creates && (owner.uid == u32::MAX || owner.gid == u32::MAX) {
            return Err(Errno::EINVAL);
        }
        let r = match w[0] & CODE_MASK {
            OPEN | OPENREAD => Request::Open {
                prefetch: w[0] & CODE_MASK == OPENREAD,
                path_len: path(w[1])?,
                flags: w[2],
                mode: w[3],
                owner,
            },
            CLOSE => Request::Close { handle: w[1] },
            READ => Request::Read {
                handle: w[1],
                offset: join64(w[2], w[3]),
                count: w[4],
            },
            WRITE => {
                if w[5] & !(WRITE_APPEND | WRITE_AT) != 0 || w[5] == WRITE_APPEND | WRITE_AT {
                    return Err(Errno::EINVAL);
                }
                Request::Write {
                    handle: w[1],
                    offset: join64(w[2], w[3]),
                    count: w[4],
                    flags: w[5],
                }
            }
            STAT => {
                if w[2] & !STAT_NOFOLLOW != 0 {
                    return Err(Errno::EINVAL);
                }
                Request::Stat {
                    path_len: path(w[1])?,
                    nofollow: w[2] & STAT_NOFOLLOW != 0,
                }
            }
            FSTAT => Request::Fstat { handle: w[1] },
            OPENDIR => Request::Opendir {
                path_len: path(w[1])?,
            },
            READDIR => Request::Readdir {
                handle: w[1],
                index: w[2],
            },
            MKDIR => Request::Mkdir {
                path_len: path(w[1])?,
                mode: w[2],
                owner,
            },
            RMDIR => Request::Rmdir {
                path_len: path(w[1])?,
            },
            UNLINK => Request::Unlink {
                path_len: path(w[1])?,
            },
            RENAME => {
                if w[3] & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
                    || w[3] == RENAME_NOREPLACE | RENAME_EXCHANGE
                {
                    return Err(Errno::EINVAL);
                }
                Request::Rename {
                    old_len: path(w[1])?,
                    new_len: path(w[2])?,
                    flags: w[3],
                }
            }
            TRUNCATE => Request::Truncate {
                path_len: path(w[1])?,
                size: join64(w[2], w[3]),
            },
            FTRUNCATE => Request::Ftruncate {
                handle: w[1],
                size: join64(w[2], w[3]),
            },
            FSYNC => {
                if w[2] & !(FSYNC_DATASYNC | FSYNC_FLUSH_ONLY) != 0 {
                    return Err(Errno::EINVAL);
                }
                Request::Fsync {
                    handle: w[1],
                    datasync: w[2] & FSYNC_DATASYNC != 0,
                    flush_only: w[2] & FSYNC_FLUSH_ONLY != 0,
                }
            }
            SYMLINK => Request::Symlink {
                target_len: target(w[1])?,
                path_len: path(w[2])?,
                owner,
            },
            MKNOD => Request::Mknod {
                path_len: path(w[1])?,
                mode: w[2],
                rdev: w[3],
                owner,
            },
            READLINK => Request::Readlink {
                path_len: path(w[1])?,
            },
            SETATTR => Request::Setattr {
                path_len: path(w[1])?,
            },
            FSETATTR => Request::Fsetattr { handle: w[1] },
            LINK => Request::Link {
                old_len: path(w[1])?,
                new_len: path(w[2])?,
            },
            STATFS => Request::Statfs,
            WATCH => {
                if w[2] > MAX_WATCH_MEMBERS {
                    return Err(Errno::EINVAL);
                }
                Request::Watch {
                    callback: w[1],
                    members: w[2],
                    // Unknown bits are ignored: a newer client's wishes.
                    flags: w[3] & WATCH_RENAMES,
                }
            }
            UNWATCH => Request::Unwatch { callback: w[1] },
            READDIRPLUS => Request::Readdirplus {
                handle: w[1],
                index: w[2],
            },
            GETXATTR => Request::Getxattr {
                path_len: path(w[1])?,
                name_len: xname(w[2])?,
                size: w[3].min(MAX_XATTR_VALUE),
            },
            LISTXATTR => Request::Listxattr {
                path_len: path(w[1])?,
                size: w[2].min(MAX_XATTR_VALUE),
            },
            SETXATTR => {
                if w[3] > MAX_XATTR_VALUE {
                    return Err(Errno(libc::E2BIG as u32));
                }
                if w[4] & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
                    return Err(Errno::EINVAL);
                }
                Request::Setxattr {
                    path_len: path(w[1])?,
                    name_len: xname(w[2])?,
                    value_len: w[3],
                    flags: w[4],
                }
            }
            REMOVEXATTR => Request::Removexattr {
                path_len: path(w[1])?,
                name_len: xname(w[2])?,
            },
            FALLOCATE => {
                if w[2] & !(FALLOC_KEEP_SIZE | FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0 {
                    return Err(Errno::EOPNOTSUPP);
                }
                Request::Fallocate {
                    handle: w[1],
                    mode: w[2],
                }
            }
            LSEEK => {
                if w[2] != libc::SEEK_DATA as u32 && w[2] != libc::SEEK_HOLE as u32 {
                    return Err(Errno::EINVAL);
                }
                Request::Lseek {
                    handle: w[1],
                    whence: w[2],
                    offset: join64(w[3], w[4]),
                }
            }
            LOCK => {
                if w[2] & !(3 | LOCK_WAIT | LOCK_TEST) != 0 || w[2] & 3 == 3 {
                    return Err(Errno::EINVAL);
                }
                Request::Lock {
                    handle: w[1],
                    flags: w[2],
                    owner: join64(w[3], w[4]),
                    pid: w[5],
                }
            }
            CLOSEV => {
                if w[1] > MAX_CLOSEV {
                    return Err(Errno::EINVAL);
                }
                Request::Closev { count: w[1] }
            }
            REMOVEV => {
                if w[1] > MAX_REMOVEV || w[2] > MAX_REMOVEV_BYTES {
                    return Err(Errno::EINVAL);
                }
                Request::Removev {
                    count: w[1],
                    len: w[2],
                }
            }
            _ => return Err(Errno::ENOSYS),
        };
        Ok(r)
    }
}
