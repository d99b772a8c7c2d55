//! The V I/O protocol over V IPC: a file server confined to one exported
//! directory tree, a Rust client, and a FUSE mount built on the client so
//! unmodified programs use the remote files (docs/VIO.md).
//!
//! - [`vio`]: request codes, message layouts, records, error codes.
//! - [`confine`]: path resolution that never leaves the exported root.
//! - [`locks`]: the advisory byte-range locks a server holds for its
//!   clients.
//! - [`server`]: the file server (dispatcher + worker pool, read-ahead,
//!   write-behind).
//! - [`client`]: the Rust client API.
//! - [`fuse`]: the FUSE file system on the client.
//! - `watch`: the server's record of watching clients and the
//!   invalidations a change sends them.
//!
//! ```no_run
//! use vkernel::{Kernel, KernelConfig};
//! use vkernel_fs::client::Client;
//! use vkernel_fs::server::{FileServer, ServerConfig};
//! let k = Kernel::start(KernelConfig::default()).unwrap();
//! let srv = FileServer::start(&k, std::path::Path::new("/srv/export"), ServerConfig::default()).unwrap();
//! let c = Client::connect(&k, srv.pid(), 4).unwrap();
//! c.write_file("hello.txt", b"hello", true).unwrap();
//! assert_eq!(c.read_file("hello.txt").unwrap(), b"hello");
//! ```
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod client;
pub mod confine;
pub mod fuse;
pub mod fuzzing;
pub mod locks;
pub mod server;
pub mod vio;
mod watch;
