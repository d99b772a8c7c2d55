//! Sans-IO core of vkernel, the distributed V kernel for Linux.
//!
//! - [`pid`]: 32-bit global process ids.
//! - [`message`]: the fixed 32-byte message and its flag bits.
//! - [`wire`]: the byte-exact interkernel packet format.
//! - [`engine`]: the protocol state machine of one logical host.
//!
//! Nothing here performs I/O or reads a clock; see the `vkernel` crate for
//! the runtime that owns sockets and threads.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod auth;
pub mod config;
pub mod direct;
pub mod engine;
pub mod error;
pub mod local_table;
pub mod message;
pub mod pid;
pub mod rtt;
pub mod segment;
pub mod sender;
pub mod stats;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod wire;

pub use config::{multicast_addr, Config, GroupPolicy, Micros, MAX_APPEND};
pub use engine::{Completion, Engine, Event, OwnDue, Received, ReplyInfo, Scope, Transmit};
pub use error::IpcError;
pub use message::{GroupMode, Message, SegAccess};
pub use pid::{HostId, Pid};
pub use segment::{RawBytes, RawBytesMut, Seg, SegMem, SharedBuf, SharedSeg, Slice, SliceMut};
pub use stats::{DropReason, Stats};
