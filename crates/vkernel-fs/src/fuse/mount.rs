//! Mounting (with the options a mount takes) and unmounting.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::invalidate::{forget_changed, tell_kernel, Drop};
use super::state::{Shared, VioFs};
use crate::client::Client;
use crate::vio::Invalidation;

/// How the mount behaves.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// How long the kernel may cache attributes and names when the server
    /// does not tell of changes (an older server, or `watch` off).
    pub ttl: Duration,
    /// How long attributes, names and the absence of names are cached
    /// when the server tells this mount of every change another client
    /// makes ([`vio::WATCH`](crate::vio::WATCH)). Changes made on the
    /// server's disk by other programs than the file server show up after
    /// at most this long.
    pub cache_ttl: Duration,
    /// Ask the server to report other clients' changes, so caches can
    /// live for `cache_ttl`.
    pub watch: bool,
    /// Threads serving FUSE requests (and requests in flight to the server).
    pub threads: usize,
    /// Name shown in /proc/mounts.
    pub fsname: String,
    /// Let other users use the mount (needs `user_allow_other` for non-root).
    pub allow_other: bool,
    /// While the server reports changes, let the kernel cache what the
    /// mount keeps true: directory listings (no OPENDIR/RELEASEDIR, the
    /// kernel's readdir cache) and symbolic links. The server's reports
    /// drop them.
    pub kernel_cache: bool,
    /// While the server reports changes, answer an unlink or rmdir the
    /// mount can decide from the listings it keeps at once, and send it
    /// to the server after, in order (errors: logged, and at the next
    /// fsync of the directory). Every other request waits until the
    /// removals answered before it are at the server.
    pub async_removals: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            ttl: Duration::from_secs(1),
            cache_ttl: Duration::from_secs(10),
            watch: true,
            threads: 4,
            fsname: "vkernel".into(),
            allow_other: false,
            kernel_cache: true,
            async_removals: true,
        }
    }
}

/// Mounts `client`'s file server at `mountpoint` in the background; the
/// mount ends when the returned session is unmounted or dropped. With
/// `opts.watch`, the server is asked (through a callback process on
/// `kernel`) to report other clients' changes, and caches then live for
/// `opts.cache_ttl`; a server that cannot leaves them at `opts.ttl`.
pub fn mount(
    kernel: &vkernel::Kernel,
    client: Arc<Client>,
    mountpoint: &Path,
    opts: &FuseOptions,
) -> std::io::Result<fuser::BackgroundSession> {
    let shared = Arc::new(Shared::new());
    let watched = if opts.watch {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Drop>>();
        *super::lock_or_recover(&shared.drops) = Some(tx.clone());
        let sh = shared.clone();
        let sink = move |inv: Invalidation, path: &[u8]| {
            let _ = tx.send(forget_changed(&sh, &inv, path));
        };
        match client.watch(kernel, sink) {
            Ok(true) => {
                let sh = shared.clone();
                std::thread::Builder::new()
                    .name("vkernel-invalidate".into())
                    .spawn(move || {
                        // Ends when the callback process (and its sender) goes.
                        while let Ok(drops) = rx.recv() {
                            tell_kernel(&sh, drops);
                        }
                    })?;
                true
            }
            Ok(false) => {
                tracing::info!(
                    "the file server does not report changes; caching for {:?}",
                    opts.ttl
                );
                false
            }
            Err(e) => {
                tracing::warn!(
                    "asking the file server to report changes: {e}; caching for {:?}",
                    opts.ttl
                );
                false
            }
        }
    } else {
        false
    };
    let ttl = if watched { opts.cache_ttl } else { opts.ttl };
    let mut fs = VioFs::with_shared(client, ttl, watched, shared.clone());
    fs.kernel_cache = watched && opts.kernel_cache;
    if opts.async_removals {
        fs.defer_removals()?;
    }
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName(opts.fsname.clone()),
        fuser::MountOption::Subtype("vkernel".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if opts.allow_other {
        cfg.acl = fuser::SessionACL::All;
    }
    cfg.n_threads = Some(opts.threads.max(1));
    let session = fuser::spawn_mount(fs, mountpoint, &cfg)?;
    let _ = shared.notifier.set(session.notifier());
    raise_read_ahead(mountpoint);
    Ok(session)
}

/// Read-ahead the mount asks of the kernel, KiB: as large as one READ
/// may be (`max_write`, 1 MiB), so a sequential read is one exchange per
/// MiB rather than per 128 KiB.
const READ_AHEAD_KB: u32 = 1024;

/// Sets the mount's read-ahead (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`;
/// only root may). Best effort: without it reads are 128 KiB each.
fn raise_read_ahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = md.dev();
    let bdi = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    if let Err(e) = std::fs::write(&bdi, READ_AHEAD_KB.to_string()) {
        tracing::debug!("read-ahead stays at the kernel's default ({bdi}: {e})");
    }
}

/// Unmounts and waits for the session; if the mount is busy, detaches it
/// lazily (`fusermount3 -u -z`) so the process can still exit cleanly.
pub fn unmount(session: fuser::BackgroundSession, mountpoint: &Path) -> std::io::Result<()> {
    if session.guard.is_finished() {
        return session.join();
    }
    match session.umount_and_join() {
        Ok(()) => Ok(()),
        Err(e) => {
            tracing::warn!("unmount of {}: {e}; detaching lazily", mountpoint.display());
            let st = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(mountpoint)
                .status()?;
            if st.success() {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}
