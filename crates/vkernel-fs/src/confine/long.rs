//! Paths longer than one system call takes.
//!
//! Linux refuses a path argument of `PATH_MAX` (4096) bytes or more with
//! `ENAMETOOLONG`, though a tree may be any depth: a local program reaches
//! a deep file by a relative path from a deep working directory. A client
//! path may be up to [`MAX_REQUEST_PATH`] bytes; [`walk`] resolves one
//! that is too long for a single call in steps. It cuts the path at a
//! `/` into pieces shorter than `PATH_MAX`, opens each leading piece as an
//! `O_PATH | O_DIRECTORY` descriptor with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)` relative to the descriptor the step before
//! opened (the first relative to the root), and leaves the last piece to
//! the caller, to resolve the same way relative to the last descriptor.
//!
//! Confinement holds by induction: each step is refused by the kernel
//! (`EXDEV`) unless it stays beneath its starting directory, which is
//! beneath the root. That is stricter than one resolution from the root:
//! a `..` component, or a relative symbolic link, that climbs above the
//! start of its own piece is refused with `EXDEV` even when it would stay
//! inside the root. (The mount never sends either: it builds paths of
//! plain names.) A directory the walk passed through and that something
//! outside the server moves out of the root at that moment takes the rest
//! of the walk with it, as any open directory would; clients can only
//! move names within the root.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use super::err;
use crate::vio::{Errno, MAX_REQUEST_PATH};

/// Longest path one `openat2` takes: `PATH_MAX` counts the final NUL.
const STEP: usize = libc::PATH_MAX as usize - 1;

/// The directory a walk ended in: the root itself, or one it opened.
pub(super) enum Dir<'r> {
    Root(BorrowedFd<'r>),
    Step(OwnedFd),
}

impl AsFd for Dir<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Dir::Root(fd) => *fd,
            Dir::Step(fd) => fd.as_fd(),
        }
    }
}

/// Resolves the leading directories of `path` (checked by
/// `check_path`) beneath `root` until what is left fits one system call;
/// returns that directory and the rest (a path shorter than `PATH_MAX`,
/// never absolute). A path short enough already is left whole.
pub(super) fn walk<'r, 'p>(
    root: BorrowedFd<'r>,
    path: &'p [u8],
) -> Result<(Dir<'r>, &'p [u8]), Errno> {
    let mut dir = Dir::Root(root);
    let mut rest = path;
    while rest.len() > STEP {
        let (piece, tail) = cut(rest)?;
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = super::openat2_beneath(&dir, piece, flags, Mode::empty()).map_err(err)?;
        dir = Dir::Step(fd);
        rest = tail;
    }
    Ok((dir, rest))
}

/// Splits a path longer than [`STEP`] at the last `/` that leaves a
/// first piece of at most [`STEP`] bytes; the rest starts after the run
/// of `/` (so it is never absolute). With components of at most
/// [`crate::vio::MAX_NAME`] bytes there is such a `/`; a path without one
/// is `ENAMETOOLONG`.
fn cut(path: &[u8]) -> Result<(&[u8], &[u8]), Errno> {
    let window = &path[..path.len().min(STEP + 1)];
    let at = window
        .iter()
        .rposition(|&b| b == b'/')
        .filter(|&i| i > 0)
        .ok_or(Errno::ENAMETOOLONG)?;
    let skip = path[at..].iter().take_while(|&&b| b == b'/').count();
    Ok((&path[..at], &path[at + skip..]))
}

// The request limit must leave room for at least one step.
const _: () = assert!(MAX_REQUEST_PATH > STEP);

#[cfg(test)]
mod tests {
    use super::super::Root;
    use super::*;
    use crate::vio::{self, SetAttr};

    #[test]
    fn cuts_fit_one_call_and_end_at_a_slash() {
        let p = [&b"a".repeat(4000)[..], b"/", &b"b".repeat(200), b"//c"].concat();
        let (piece, tail) = cut(&p).unwrap();
        assert_eq!(piece.len(), 4000);
        assert_eq!(tail, [&b"b".repeat(200)[..], b"//c"].concat());
        // A slash right at the limit: a piece of exactly STEP bytes.
        let p = [&b"x/".repeat(STEP / 2)[..], b"x/y"].concat();
        let (piece, tail) = cut(&p).unwrap();
        assert_eq!((piece.len(), tail), (STEP, &b"y"[..]));
        assert!(piece.ends_with(b"x"));
        assert_eq!(cut(&b"z".repeat(STEP + 1)), Err(Errno::ENAMETOOLONG));
    }

    /// 100 components of 99 bytes: 10,000 bytes from the root.
    fn deep() -> (tempfile::TempDir, Root, Vec<u8>) {
        let outer = tempfile::tempdir().unwrap();
        let root_dir = outer.path().join("root");
        std::fs::create_dir(&root_dir).unwrap();
        std::fs::write(outer.path().join("secret"), b"s").unwrap();
        let r = Root::open(&root_dir).unwrap();
        let mut p = Vec::new();
        for i in 0..100 {
            if i > 0 {
                p.push(b'/');
            }
            p.extend_from_slice(format!("{i:02}{}", "d".repeat(97)).as_bytes());
            r.mkdir(&p, 0o755).unwrap();
        }
        assert_eq!(p.len(), 9999);
        (outer, r, p)
    }

    fn join(a: &[u8], b: &str) -> Vec<u8> {
        [a, b"/", b.as_bytes()].concat()
    }

    #[test]
    fn a_path_of_ten_thousand_bytes_works_for_every_operation() {
        let (_outer, r, d) = deep();
        let f = join(&d, "file");
        let (_, created) = r
            .open_file(&f, (libc::O_CREAT | libc::O_WRONLY) as u32, 0o640)
            .unwrap();
        assert!(created);
        let (a, _) = r.stat(&f, false).unwrap();
        assert_eq!((a.mode & 0o777, a.size), (0o640, 0));
        let g = join(&d, "renamed");
        r.rename(&f, &g, 0).unwrap();
        assert_eq!(r.stat(&f, false).unwrap_err(), Errno::ENOENT);
        // Across the whole depth: to the root and back.
        r.rename(&g, b"top", 0).unwrap();
        r.rename(b"top", &g, 0).unwrap();
        let l = join(&d, "link");
        r.symlink(b"renamed", &l).unwrap();
        assert_eq!(r.readlink(&l).unwrap(), b"renamed");
        assert!(r.stat(&l, true).unwrap().0.is_file());
        assert!(r.stat(&l, false).unwrap().0.is_symlink());
        let h = join(&d, "hard");
        assert_eq!(r.link(&g, &h).unwrap().nlink, 2);
        let s = SetAttr {
            valid: vio::SET_MODE,
            mode: 0o600,
            ..SetAttr::default()
        };
        assert_eq!(r.setattr(&h, &s).unwrap().mode & 0o777, 0o600);
        r.mknod(&join(&d, "fifo"), libc::S_IFIFO | 0o644, 0)
            .unwrap();
        let mut names: Vec<Vec<u8>> = r.list(&d).unwrap().into_iter().map(|e| e.name).collect();
        names.sort();
        assert_eq!(names, [&b"fifo"[..], b"hard", b"link", b"renamed"]);
        // `..` a little way up stays within the last step: fine.
        let back = [&d[..], b"/../", &d[d.len() - 99..], b"/renamed"].concat();
        assert!(r.stat(&back, true).unwrap().0.is_file());
        for n in ["fifo", "hard", "link", "renamed"] {
            r.unlink(&join(&d, n)).unwrap();
        }
        let mut at = d;
        loop {
            r.rmdir(&at).unwrap();
            match at.iter().rposition(|&b| b == b'/') {
                Some(i) => at.truncate(i),
                None => break,
            }
        }
        assert!(r.list(b"").unwrap().is_empty());
    }

    #[test]
    fn a_long_path_never_leaves_the_root() {
        let (outer, r, d) = deep();
        // Enough `..` to climb out of the root: refused, whichever step
        // they fall in.
        let up = [&d[..], b"/", &b"../".repeat(101), b"secret"].concat();
        assert_eq!(r.stat(&up, true).unwrap_err(), Errno::EXDEV);
        assert_eq!(
            r.open_file(&up, libc::O_RDONLY as u32, 0).unwrap_err(),
            Errno::EXDEV
        );
        // `..` back over a step boundary: refused too (documented), though
        // it would stay inside.
        let over = [&d[..], b"/", &b"../".repeat(99), b"00"].concat();
        assert_eq!(r.stat(&over, true).unwrap_err(), Errno::EXDEV);
        // Symbolic links pointing out, relative or absolute, at the bottom
        // and as a step's last component.
        let out = format!("{}secret", "../".repeat(101));
        r.symlink(out.as_bytes(), &join(&d, "out")).unwrap();
        r.symlink(b"/etc", &join(&d, "abs")).unwrap();
        for l in ["out", "abs"] {
            let p = join(&d, l);
            assert_eq!(r.stat(&p, true).unwrap_err(), Errno::EXDEV, "{l}");
            assert!(r.stat(&p, false).unwrap().0.is_symlink());
            let via = join(&join(&d, l), &"x/".repeat(3000));
            assert_eq!(r.stat(&via, true).unwrap_err(), Errno::EXDEV, "{l}/...");
            assert_eq!(
                r.mkdir(&join(&via, "made"), 0o755).unwrap_err(),
                Errno::EXDEV
            );
        }
        r.unlink(&join(&d, "out")).unwrap();
        assert_eq!(std::fs::read(outer.path().join("secret")).unwrap(), b"s");
        assert_eq!(std::fs::read_dir(outer.path()).unwrap().count(), 2);
    }
}
