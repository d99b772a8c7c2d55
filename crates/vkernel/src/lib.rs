//! vkernel: the distributed V kernel's message passing for Linux.
//!
//! A [`Kernel`] is one logical host (one UDP port). A [`Process`] is a pid
//! registered with it; its methods are the V primitives — Send, Receive,
//! Reply, Forward, MoveTo, MoveFrom, SetPid/GetPid — and they behave the
//! same whether the peer process is on this logical host or another one.
//!
//! ```no_run
//! use vkernel::{Kernel, KernelConfig, Message, Scope};
//! let k = Kernel::start(KernelConfig::default()).unwrap();
//! let server = k.create_process().unwrap();
//! server.set_pid(42, server.pid(), Scope::Any);
//! let spid = server.pid();
//! std::thread::spawn(move || {
//!     let mut m = Message::zero();
//!     while let Ok(i) = server.receive(&mut m) {
//!         m.set_word(1, m.word(1) + 1);
//!         let _ = server.reply(&m, i.from);
//!     }
//! });
//! let client = k.create_process().unwrap();
//! let mut m = Message::with_code(1);
//! client.send(&mut m, spid).unwrap();
//! assert_eq!(m.word(1), 1);
//! ```
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod aio;
#[doc = include_str!("../../../docs/GUIDE.md")]
pub mod guide {}
pub mod attach;
mod batch;
mod clock;
mod deadline;
mod direct;
mod discover;
pub mod host;
mod kernel;
pub mod kernel_server;
mod lent;
pub mod metrics;
pub mod net;
#[cfg(feature = "otel")]
pub mod otel;
mod peer_exchange;
mod process;
pub mod service;
mod spin;
mod sys;
pub mod trace;
mod vocab;
mod waiter;

pub use aio::AsyncProcess;
pub use attach::AttachServer;
pub use discover::{default_bind, unreachable_from, PeerSpec};
pub use kernel::{Kernel, KernelConfig, KernelError};
pub use net::FaultConfig;
pub use process::Process;
pub use spin::AUTO_SPIN_CAP;
pub use vkernel_proto::{auth, MAX_APPEND};
pub use vkernel_proto::{
    message, DropReason, GroupMode, GroupPolicy, HostId, IpcError, Message, Pid, Scope, SegAccess,
    Stats,
};
pub use vocab::{HostLoad, Incoming, Reply, Segment, WaitCounts};
