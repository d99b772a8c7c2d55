//! Fuzzing entry points (cargo-fuzz targets `path` and `vio` call these;
//! unit tests run them over the committed corpora).
//!
//! - [`fuzz_path`]: any bytes as a client path (alone, and behind a
//!   prefix that makes it longer than `PATH_MAX`), resolved beneath a
//!   root that holds symbolic links pointing out of it, `..` traps and
//!   loops. Property: every successful resolution names a file beneath
//!   the root.
//! - [`fuzz_request`]: any bytes as a V I/O request (32-byte message,
//!   then the segment) sent to a real file server on a loopback logical
//!   host. Properties: the server answers every request, and still serves
//!   afterwards.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rustix::fs::OFlags;
use vkernel::{Kernel, KernelConfig, Message, Segment};

use crate::confine::Root;

struct PathFixture {
    root: Root,
    canon: PathBuf,
    _dir: PathBuf,
}

/// base/root/{a/b/file, up -> .., out -> ../outside, abs -> /etc,
/// loop -> loop, deep -> a/b/../../up/outside}, base/outside/secret.
fn path_fixture() -> Option<&'static PathFixture> {
    static F: OnceLock<Option<PathFixture>> = OnceLock::new();
    F.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("vkernel-fuzz-path-{}", std::process::id()));
        let root = base.join("root");
        std::fs::create_dir_all(root.join("a/b")).ok()?;
        std::fs::create_dir_all(base.join("outside")).ok()?;
        std::fs::write(base.join("outside/secret"), b"secret").ok()?;
        std::fs::write(root.join("a/b/file"), b"inside").ok()?;
        let link = |t: &str, l: &str| std::os::unix::fs::symlink(t, root.join(l));
        let _ = link("..", "up");
        let _ = link("../outside", "out");
        let _ = link("/etc", "abs");
        let _ = link("loop", "loop");
        let _ = link("a/b/../../up/outside", "deep");
        let _ = link("a/b", "ok");
        let canon = std::fs::canonicalize(&root).ok()?;
        Some(PathFixture {
            root: Root::open(&root).ok()?,
            canon,
            _dir: base,
        })
    })
    .as_ref()
}

fn beneath(fd: &std::os::fd::OwnedFd, root: &Path) -> bool {
    use std::os::fd::AsRawFd;
    match std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) {
        Ok(p) => p.starts_with(root),
        // Not resolvable to a path: nothing to leak.
        Err(_) => true,
    }
}

/// Resolves `data` as a path every read-only way the server does; panics
/// if a resolution lands outside the root.
pub fn fuzz_path(data: &[u8]) {
    let Some(f) = path_fixture() else {
        return;
    };
    // The same bytes behind a prefix that makes the path longer than
    // PATH_MAX: resolved in steps, as confined.
    let long = [&b"a/"[..], &b"./".repeat(2100), data].concat();
    for flags in [
        OFlags::PATH,
        OFlags::PATH | OFlags::NOFOLLOW,
        OFlags::RDONLY,
        OFlags::PATH | OFlags::DIRECTORY,
    ] {
        for p in [data, &long[..]] {
            if let Ok(fd) = f.root.resolve(p, flags) {
                assert!(
                    beneath(&fd, &f.canon),
                    "{:?} escaped the root",
                    String::from_utf8_lossy(p)
                );
            }
        }
    }
    if let Ok((fd, name)) = f.root.parent(data) {
        assert!(beneath(&fd, &f.canon), "parent of {data:?} escaped");
        assert!(!name.is_empty() && !name.contains(&b'/'), "{name:?}");
    }
    let _ = f.root.stat(data, true);
    let _ = f.root.readlink(data);
    let _ = f.root.list(data);
    if let Ok((fd, _)) = f.root.open_file(data, libc::O_RDONLY as u32, 0) {
        assert!(beneath(&fd, &f.canon), "open of {data:?} escaped");
    }
}

struct ServerFixture {
    k: Kernel,
    server: vkernel::Pid,
    _srv: crate::server::FileServer,
}

fn server_fixture() -> Option<&'static ServerFixture> {
    static F: OnceLock<Option<ServerFixture>> = OnceLock::new();
    F.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("vkernel-fuzz-vio-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("d")).ok()?;
        std::fs::write(dir.join("f"), vec![7u8; 10_000]).ok()?;
        let k = Kernel::start(KernelConfig::default()).ok()?;
        let srv = crate::server::FileServer::start(
            &k,
            &dir,
            crate::server::ServerConfig {
                workers: 2,
                ..Default::default()
            },
        )
        .ok()?;
        Some(ServerFixture {
            server: srv.pid(),
            _srv: srv,
            k,
        })
    })
    .as_ref()
}

/// Sends `data` as one request (message words, then the segment lent
/// read-write) to a real file server; panics if it does not answer, or
/// stops answering.
pub fn fuzz_request(data: &[u8]) {
    let Some(f) = server_fixture() else {
        return;
    };
    let Ok(p) = f.k.create_process() else {
        return;
    };
    let mut m = Message::zero();
    for (i, w) in data.chunks(4).take(8).enumerate() {
        let mut b = [0u8; 4];
        b[..w.len()].copy_from_slice(w);
        m.0[i] = u32::from_be_bytes(b);
    }
    // Keep requests to the V I/O range so each one exercises the server.
    m.0[0] = (m.0[0] & 0xff) | 0x56_0000;
    let mut seg = data.get(32..).unwrap_or(&[]).to_vec();
    seg.truncate(64 << 10);
    let r = if seg.is_empty() {
        p.send(&mut m, f.server)
    } else {
        p.send_with_segment(&mut m, f.server, Segment::ReadWrite(&mut seg))
    };
    assert!(r.is_ok(), "no answer to {:08x?}: {r:?}", &m.0);
    let mut s = crate::vio::Request::Statfs.encode();
    let mut room = vec![0u8; 256];
    let r = p.send_with_segment(&mut s, f.server, Segment::Write(&mut room));
    assert!(r.is_ok() && s.0[0] == 0, "server stopped serving: {r:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(name: &str) -> Vec<Vec<u8>> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus")
            .join(name);
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| std::fs::read(e.path()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every committed `path` corpus entry (crashes found become entries)
    /// plus a battery of escapes.
    #[test]
    fn path_corpus_and_escapes_stay_beneath_the_root() {
        assert!(path_fixture().is_some(), "fixture");
        let mut inputs = corpus("path");
        for p in [
            "..",
            "../outside/secret",
            "up/outside/secret",
            "out/secret",
            "abs/passwd",
            "loop",
            "deep/secret",
            "ok/file",
            "a/b/../../../outside",
            "/etc/passwd",
            "a/../../x",
            "ok/../../up",
            "",
            ".",
            "a//b///file",
        ] {
            inputs.push(p.as_bytes().to_vec());
        }
        for i in &inputs {
            fuzz_path(i);
        }
    }

    /// Every committed `vio` corpus entry gets an answer and the server
    /// keeps serving.
    #[test]
    fn vio_corpus_is_answered() {
        assert!(server_fixture().is_some(), "fixture");
        for i in corpus("vio") {
            fuzz_request(&i);
        }
        fuzz_request(&[0xff; 40]);
        fuzz_request(&[]);
    }
}
