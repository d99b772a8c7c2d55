//! The FUSE file system's state: [`VioFs`] and what it shares with the
//! thread that applies the server's invalidations.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use fuser::{Errno as FErrno, INodeNo};

use super::deferred::{send_in_order, Deferred};
use super::dirs::{LastListing, Snapshot, LOCAL_DIR};
use super::handles::{close_in_batches, Head, LocalFile, LOCAL_FILE};
use super::invalidate::Drop;
use super::nodes::Nodes;
use super::{ferr, lock_or_recover};
use crate::client::Client;

/// What the FUSE file system shares with the thread that applies the
/// server's invalidations.
pub(super) struct Shared {
    pub(super) nodes: Mutex<Nodes>,
    /// Open file handles per inode: attributes of a file whose names are
    /// all gone are still reached through one (fstat after unlink).
    pub(super) open: Mutex<HashMap<u64, Vec<u32>>>,
    /// The start of files opened for reading, per handle (dropped when
    /// the server reports the file's data changed).
    pub(super) heads: Mutex<HashMap<u32, Head>>,
    /// Tells the kernel to drop cached names, attributes and pages (set
    /// once the session exists).
    pub(super) notifier: OnceLock<fuser::Notifier>,
    /// To the thread that tells the kernel (while watching); taken at
    /// unmount so that thread ends.
    pub(super) drops: Mutex<Option<std::sync::mpsc::Sender<Vec<Drop>>>>,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            nodes: Mutex::new(Nodes::new()),
            open: Mutex::new(HashMap::new()),
            heads: Mutex::new(HashMap::new()),
            notifier: OnceLock::new(),
            drops: Mutex::new(None),
        }
    }

    pub(super) fn nodes(&self) -> MutexGuard<'_, Nodes> {
        lock_or_recover(&self.nodes)
    }

    /// Has the kernel drop these soon, on the thread that tells it (a
    /// request's own thread must not wait on the kernel).
    pub(super) fn drop_later(&self, drops: Vec<Drop>) {
        if let Some(tx) = lock_or_recover(&self.drops).as_ref() {
            let _ = tx.send(drops);
        }
    }
}

/// The FUSE file system: a [`Client`] and the node table.
pub struct VioFs {
    pub(super) client: Arc<Client>,
    pub(super) shared: Arc<Shared>,
    /// Handles to close, to the closer thread (which closes them in
    /// batches: the kernel does not wait for a release, nor should the
    /// server have one exchange per close); `None` once unmounted.
    pub(super) closer: Mutex<Option<std::sync::mpsc::Sender<u32>>>,
    pub(super) closer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// (inode, lock owner) that set locks through this mount: their close
    /// must unlock at the server.
    pub(super) lockers: Mutex<std::collections::HashSet<(u64, u64)>>,
    /// File handles written since their last flush or fsync.
    pub(super) written: Mutex<std::collections::HashSet<u32>>,
    /// Handles opened read-only, which the kernel closes without FLUSH
    /// (`FOPEN_NOFLUSH`), and the owners of fcntl locks set through
    /// each: their release unlocks those.
    pub(super) noflush: Mutex<HashMap<u64, Vec<u64>>>,
    /// Listings served here: directory handles (from [`LOCAL_DIR`] up)
    /// and the entries each was opened with (with attributes for
    /// readdirplus).
    pub(super) local_dirs: Mutex<HashMap<u64, Snapshot>>,
    pub(super) next_local_dir: std::sync::atomic::AtomicU64,
    /// Directory handles whose listing ended, and the offset after it.
    pub(super) listed: Mutex<HashMap<u32, u64>>,
    /// Files opened here without the server (handles from [`LOCAL_FILE`]).
    pub(super) local_files: Mutex<HashMap<u64, LocalFile>>,
    pub(super) next_local_file: std::sync::atomic::AtomicU64,
    pub(super) ttl: Duration,
    /// The server reports other clients' changes.
    pub(super) watched: bool,
    /// The kernel caches listings and symbolic links (only while
    /// `watched`: the server's reports are what drop them).
    pub(super) kernel_cache: bool,
    /// The kernel was told it need not open directories: every listing
    /// comes with handle 0 and is served by inode.
    pub(super) no_dir_handles: std::sync::atomic::AtomicBool,
    /// The last listing served by inode, for the READDIRs that follow.
    pub(super) last_listing: Mutex<Option<LastListing>>,
    /// Unlinks and rmdirs answered before the server has them, and the
    /// thread that sends them (`None`: every change waits for the server).
    pub(super) deferred: Option<Arc<Deferred>>,
    pub(super) deferred_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held by a rename here until the node table has the new paths, and
    /// by a removal answered early while it takes its path.
    pub(super) paths: Mutex<()>,
    /// The last STATFS answer and when it came.
    pub(super) statfs: Mutex<Option<(std::time::Instant, crate::vio::StatFs)>>,
}

impl std::fmt::Debug for VioFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VioFs")
            .field("client", &self.client)
            .finish()
    }
}

impl VioFs {
    /// A file system over `client` whose caches live for `ttl`; `watched`
    /// says the server reports other clients' changes (then names that
    /// do not exist are cached too).
    pub fn new(client: Arc<Client>, ttl: Duration, watched: bool) -> VioFs {
        Self::with_shared(client, ttl, watched, Arc::new(Shared::new()))
    }

    pub(super) fn with_shared(
        client: Arc<Client>,
        ttl: Duration,
        watched: bool,
        shared: Arc<Shared>,
    ) -> VioFs {
        let (tx, rx) = std::sync::mpsc::channel();
        let c = client.clone();
        let t = std::thread::Builder::new()
            .name("vkernel-close".into())
            .spawn(move || close_in_batches(&c, &rx))
            .ok();
        VioFs {
            closer: Mutex::new(t.is_some().then_some(tx)),
            closer_thread: Mutex::new(t),
            client,
            shared,
            written: Mutex::new(std::collections::HashSet::new()),
            noflush: Mutex::new(HashMap::new()),
            lockers: Mutex::new(std::collections::HashSet::new()),
            listed: Mutex::new(HashMap::new()),
            local_dirs: Mutex::new(HashMap::new()),
            next_local_dir: std::sync::atomic::AtomicU64::new(LOCAL_DIR),
            local_files: Mutex::new(HashMap::new()),
            next_local_file: std::sync::atomic::AtomicU64::new(LOCAL_FILE),
            ttl,
            watched,
            kernel_cache: false,
            no_dir_handles: std::sync::atomic::AtomicBool::new(false),
            last_listing: Mutex::new(None),
            deferred: None,
            deferred_thread: Mutex::new(None),
            statfs: Mutex::new(None),
            paths: Mutex::new(()),
        }
    }

    /// Answers unlinks and rmdirs it can decide from kept listings at
    /// once, sending them to the server on a thread of their own (only
    /// while `watched`: the listings must be kept true).
    pub(super) fn defer_removals(&mut self) -> std::io::Result<()> {
        if !self.watched || self.deferred.is_some() {
            return Ok(());
        }
        let d = Arc::new(Deferred::default());
        let (c, sh, d2) = (self.client.clone(), self.shared.clone(), d.clone());
        let t = std::thread::Builder::new()
            .name("vkernel-deferred".into())
            .spawn(move || send_in_order(&c, &sh, &d2))?;
        self.deferred = Some(d);
        *lock_or_recover(&self.deferred_thread) = Some(t);
        Ok(())
    }

    /// The server, once every change answered before now was sent to it
    /// (so no request sees the namespace as it was before them).
    pub(super) fn server(&self) -> &Client {
        if let Some(d) = &self.deferred {
            d.settle();
        }
        &self.client
    }

    /// Sends what is queued and ends the sender (at unmount).
    pub(super) fn finish_deferred(&self) {
        if let Some(d) = &self.deferred {
            d.close();
        }
        if let Some(t) = lock_or_recover(&self.deferred_thread).take() {
            let _ = t.join();
        }
    }

    pub(super) fn nodes(&self) -> MutexGuard<'_, Nodes> {
        self.shared.nodes()
    }

    pub(super) fn path(&self, ino: INodeNo) -> Result<Vec<u8>, FErrno> {
        self.nodes().path(ino.0).map_err(ferr)
    }

    /// A directory's attributes were fetched from the server (what this
    /// mount had of them had aged out): the listing the kernel may keep
    /// has aged too. The kernel checks a kept listing only against the
    /// directory's mtime, which a change on the server's disk within one
    /// clock tick of the last leaves as it was; so it is dropped, and a
    /// kept listing lives no longer than the cache lifetime. This
    /// mount's own listing goes too: it may be younger than the
    /// attributes, and the kernel would keep it for another lifetime.
    pub(super) fn dir_attr_fetched(&self, ino: u64, a: &crate::vio::Attr) {
        if self.kernel_cache && a.mode & libc::S_IFMT == libc::S_IFDIR {
            self.forget_listing(ino);
            self.shared.drop_later(vec![Drop::Data(ino)]);
        }
    }
}
