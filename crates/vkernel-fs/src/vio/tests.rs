use super::*;
use proptest::prelude::*;

fn all_requests() -> Vec<Request> {
    vec![
        Request::Open {
            prefetch: false,
            path_len: 7,
            flags: 0o1101,
            mode: 0o644,
            owner: Owner {
                uid: 1000,
                gid: 100,
            },
        },
        Request::Open {
            prefetch: true,
            path_len: 3,
            flags: 0,
            mode: 0,
            owner: Owner::default(),
        },
        Request::Watch {
            callback: 0x0001_0002,
            members: 3,
            flags: WATCH_RENAMES,
        },
        Request::Unwatch {
            callback: 0x0001_0002,
        },
        Request::Readdirplus {
            handle: 5,
            index: 9,
        },
        Request::Closev { count: 12 },
        Request::Removev { count: 3, len: 40 },
        Request::Getxattr {
            path_len: 3,
            name_len: 6,
            size: 100,
        },
        Request::Listxattr {
            path_len: 3,
            size: 0,
        },
        Request::Setxattr {
            path_len: 3,
            name_len: 6,
            value_len: 9,
            flags: XATTR_CREATE,
        },
        Request::Removexattr {
            path_len: 3,
            name_len: 6,
        },
        Request::Lock {
            handle: 4,
            flags: LOCK_WRITE | LOCK_WAIT,
            owner: 0xdead_beef_0000_0001,
            pid: 4242,
        },
        Request::Close { handle: 9 },
        Request::Read {
            handle: 3,
            offset: 0x1_0000_0007,
            count: 4096,
        },
        Request::Write {
            handle: 3,
            offset: u64::MAX - 1,
            count: 1,
            flags: WRITE_APPEND,
        },
        Request::Stat {
            path_len: 4,
            nofollow: true,
        },
        Request::Fstat { handle: 1 },
        Request::Opendir { path_len: 0 },
        Request::Readdir {
            handle: 5,
            index: 77,
        },
        Request::Mkdir {
            path_len: 3,
            mode: 0o755,
            owner: Owner::default(),
        },
        Request::Rmdir { path_len: 3 },
        Request::Unlink { path_len: 3 },
        Request::Rename {
            old_len: 1,
            new_len: 2,
            flags: RENAME_NOREPLACE,
        },
        Request::Truncate {
            path_len: 1,
            size: 1 << 40,
        },
        Request::Ftruncate { handle: 2, size: 0 },
        Request::Fallocate {
            handle: 2,
            mode: FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE,
        },
        Request::Lseek {
            handle: 2,
            whence: libc::SEEK_HOLE as u32,
            offset: 0x1_0000_0003,
        },
        Request::Fsync {
            handle: 2,
            datasync: true,
            flush_only: false,
        },
        Request::Symlink {
            target_len: 9,
            path_len: 2,
            owner: Owner { uid: 7, gid: 8 },
        },
        Request::Mknod {
            path_len: 4,
            mode: libc::S_IFIFO | 0o600,
            rdev: 0x0103,
            owner: Owner {
                uid: 65534,
                gid: 65534,
            },
        },
        Request::Readlink { path_len: 2 },
        Request::Setattr { path_len: 5 },
        Request::Fsetattr { handle: 6 },
        Request::Link {
            old_len: 1,
            new_len: 1,
        },
        Request::Statfs,
    ]
}

#[test]
fn an_owner_of_minus_one_is_refused() {
    let mut m = Request::Mkdir {
        path_len: 1,
        mode: 0o755,
        owner: Owner {
            uid: u32::MAX,
            gid: 0,
        },
    }
    .encode();
    assert_eq!(Request::decode(&m), Err(Errno::EINVAL));
    m.0[4] = 0;
    m.0[5] = u32::MAX;
    assert_eq!(Request::decode(&m), Err(Errno::EINVAL));
    let s = SetAttr {
        valid: SET_UID,
        uid: u32::MAX,
        ..SetAttr::default()
    };
    assert!(SetAttr::decode(&s.encode()).is_err());
}

#[test]
fn every_request_round_trips() {
    for r in all_requests() {
        let m = r.encode();
        assert_eq!(m.idempotent(), r.idempotent(), "{r:?}");
        assert_eq!(Request::decode(&m), Ok(r));
        assert_eq!(m.0[6], 0);
        assert_eq!(m.0[7], 0);
    }
}

#[test]
fn bad_requests_get_codes() {
    assert_eq!(
        Request::decode(&Message::with_code(0x56_00ff)),
        Err(Errno::ENOSYS)
    );
    let mut m = Message::with_code(STAT);
    m.0[1] = MAX_REQUEST_PATH as u32 + 1;
    assert_eq!(Request::decode(&m), Err(Errno::ENAMETOOLONG));
    // Deeper than PATH_MAX is a path; a link target that long is not.
    m.0[1] = MAX_PATH as u32 + 1;
    assert!(Request::decode(&m).is_ok());
    m.0[1] = 1;
    m.0[2] = 6;
    assert_eq!(Request::decode(&m), Err(Errno::EINVAL));
    let long = Request::Symlink {
        target_len: MAX_PATH as u32,
        path_len: MAX_REQUEST_PATH as u32,
        owner: Owner::default(),
    };
    assert_eq!(Request::decode(&long.encode()), Ok(long));
    let mut m = long.encode();
    m.0[1] += 1;
    assert_eq!(Request::decode(&m), Err(Errno::ENAMETOOLONG));
    let mut m = Message::with_code(RENAME);
    m.0[3] = 3;
    assert_eq!(Request::decode(&m), Err(Errno::EINVAL));
}

#[test]
fn records_round_trip_and_reject_short_input() {
    let a = Attr {
        ino: 1,
        size: 2,
        blocks: 3,
        atime: -4,
        mtime: 5,
        ctime: 6,
        atime_ns: 7,
        mtime_ns: 8,
        ctime_ns: 9,
        mode: 0o100644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        rdev: 0,
        blksize: 4096,
        dev: 42,
    };
    assert_eq!(Attr::decode(&a.encode()), Ok(a));
    assert!(Attr::decode(&a.encode()[..ATTR_LEN - 1]).is_err());
    let s = SetAttr {
        valid: SET_MODE | SET_MTIME,
        mode: 0o600,
        mtime: 12,
        mtime_ns: 999_999_999,
        ..SetAttr::default()
    };
    assert_eq!(SetAttr::decode(&s.encode()), Ok(s));
    let mut bad = s.encode();
    bad[3] = 0xff;
    bad[2] = 1;
    assert!(SetAttr::decode(&bad).is_err());
    let f = StatFs {
        blocks: 1,
        bfree: 2,
        bavail: 3,
        files: 4,
        ffree: 5,
        bsize: 4096,
        namelen: 255,
        frsize: 4096,
    };
    assert_eq!(StatFs::decode(&f.encode()), Ok(f));
    let mut b = Vec::new();
    for n in ["a", "bc", "d.e"] {
        Dirent {
            ino: 9,
            kind: 8,
            name: n.as_bytes().to_vec(),
        }
        .encode_into(&mut b);
    }
    let d = Dirent::decode_all(&b).unwrap();
    assert_eq!(d.len(), 3);
    assert_eq!(d[2].name, b"d.e");
    assert!(Dirent::decode_all(&b[..b.len() - 1]).is_err());
}

proptest! {
    #[test]
    fn decoders_never_panic(words in proptest::array::uniform8(any::<u32>()),
                            bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Request::decode(&Message(words));
        let _ = Attr::decode(&bytes);
        let _ = SetAttr::decode(&bytes);
        let _ = StatFs::decode(&bytes);
        let _ = Dirent::decode_all(&bytes);
    }
}

#[test]
fn invalidations_round_trip_and_bad_ones_are_refused() {
    let inv = Invalidation {
        flags: INVAL_ATTR | INVAL_DATA,
        id: (7, 0x1_0000_0002),
        path_len: 12,
    };
    assert_eq!(Invalidation::decode(&inv.encode()), Ok(inv));
    let mut m = inv.encode();
    m.0[1] |= 0x100;
    assert_eq!(Invalidation::decode(&m), Err(Errno::EPROTO));
    let mut m = inv.encode();
    m.0[5] = MAX_REQUEST_PATH as u32 + 1;
    assert_eq!(Invalidation::decode(&m), Err(Errno::EPROTO));
    m.0[5] = MAX_PATH as u32 + 1;
    assert!(Invalidation::decode(&m).is_ok());
    assert_eq!(
        Invalidation::decode(&Request::Statfs.encode()),
        Err(Errno::EPROTO)
    );
    // Too many members in a WATCH.
    let mut w = Request::Watch {
        callback: 1,
        members: 1,
        flags: 0,
    }
    .encode();
    w.0[2] = MAX_WATCH_MEMBERS + 1;
    assert_eq!(Request::decode(&w), Err(Errno::EINVAL));
    // FALLOCATE modes the server does not do; LSEEK other than DATA/HOLE;
    // unknown WRITE flags.
    let mut f = Request::Fallocate { handle: 1, mode: 0 }.encode();
    f.0[2] = 0x08; // FALLOC_FL_COLLAPSE_RANGE
    assert_eq!(Request::decode(&f), Err(Errno::EOPNOTSUPP));
    let mut l = Request::Lseek {
        handle: 1,
        whence: libc::SEEK_DATA as u32,
        offset: 0,
    }
    .encode();
    l.0[2] = libc::SEEK_END as u32;
    assert_eq!(Request::decode(&l), Err(Errno::EINVAL));
    let mut wr = Request::Write {
        handle: 1,
        offset: 0,
        count: 1,
        flags: WRITE_APPEND,
    }
    .encode();
    for bad in [4, WRITE_APPEND | WRITE_AT] {
        wr.0[5] = bad;
        assert_eq!(Request::decode(&wr), Err(Errno::EINVAL));
    }
}
