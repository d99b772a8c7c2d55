//! Building blocks for V services: the name → logical id mapping, the
//! dispatcher and worker pool a server runs, and the process pool a
//! client borrows from.
//!
//! - [`id`], [`group`], [`register`] and [`find`] turn a service name
//!   ([`IPDISK`], [`FILESERVER`], [`TEAM`], [`PIPE`] or any other) into the
//!   logical id and well-known group every host agrees on, so a library
//!   user finds a server by name.
//! - [`WorkerPool`] runs a [`Handler`] behind one registered pid: a
//!   dispatcher Forwards each request to an idle worker, queues requests
//!   while every worker is busy, and applies the superseded-exchange rule.
//! - [`ClientPool`] holds the processes a multi-threaded client sends from
//!   (one Send in flight per process).

mod client;
mod names;
mod pool;

pub use client::ClientPool;
pub use names::{find, group, id, register, FILESERVER, IPDISK, PIPE, TEAM};
pub use pool::{Handler, PoolConfig, Request, WorkerPool};
