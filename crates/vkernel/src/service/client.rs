//! The processes a client sends from.

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::{IpcError, Kernel, Process};

/// A fixed set of processes shared by a client's threads: each request
/// borrows one with [`ClientPool::take`] and returns it with
/// [`ClientPool::give`]. A process has one Send in flight, so the pool's
/// size is how many requests the client has outstanding at once.
#[derive(Debug)]
pub struct ClientPool {
    free: Mutex<Vec<Process>>,
    cv: Condvar,
    size: usize,
}

impl ClientPool {
    /// `size` (at least 1) new processes on `kernel`, each sending as V
    /// principal `principal` unless it is 0.
    pub fn new(kernel: &Kernel, size: usize, principal: u32) -> Result<ClientPool, IpcError> {
        let size = size.max(1);
        let mut procs = Vec::with_capacity(size);
        for _ in 0..size {
            let p = kernel.create_process()?;
            if principal != 0 {
                p.set_principal(principal);
            }
            procs.push(p);
        }
        Ok(ClientPool {
            free: Mutex::new(procs),
            cv: Condvar::new(),
            size,
        })
    }

    /// Makes every process of the pool busy-poll exactly `d` before it
    /// blocks while it waits for an answer (zero: always block).
    pub fn set_spin(&self, d: std::time::Duration) {
        for p in self.free().iter() {
            p.set_spin(d);
        }
    }

    /// The pids of the pool's processes that are not borrowed now (all of
    /// them before any call).
    pub fn pids(&self) -> Vec<crate::Pid> {
        self.free().iter().map(|p| p.pid()).collect()
    }

    /// How many processes the pool holds.
    pub fn size(&self) -> usize {
        self.size
    }

    fn free(&self) -> MutexGuard<'_, Vec<Process>> {
        match self.free.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Borrows a process, waiting while all are in use.
    pub fn take(&self) -> Process {
        let mut g = self.free();
        loop {
            if let Some(p) = g.pop() {
                return p;
            }
            g = match self.cv.wait(g) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
    }

    /// Returns a process borrowed with [`ClientPool::take`].
    pub fn give(&self, p: Process) {
        self.free().push(p);
        self.cv.notify_one();
    }
}
