//! IPdisk over V IPC: the VISA idea (a disk driven with standard SCSI
//! commands over plain IP, the device enforcing derived virtual devices)
//! as a V service, a client "virtual SCSI adapter", and an NBD gateway for
//! today's block clients.
//!
//! - [`scsi`]: CDB parsing, sense data and the command set (pure, fuzzable).
//! - [`backing`]: RAM, file and block-device stores; durability by fdatasync.
//! - [`dvd`]: derived virtual devices and who may use them.
//! - [`msg`]: the request and reply messages (docs/IPDISK.md).
//! - [`server`]: the IPdisk service (dispatcher + worker processes).
//! - [`client`]: block read/write/flush with many commands in flight.
//! - [`nbd`]: the NBD gateway.
//!
//! ```no_run
//! use vkernel::{Kernel, KernelConfig};
//! use vkernel_disk::backing::{Backing, BackingSpec};
//! use vkernel_disk::client::Client;
//! use vkernel_disk::server::{DiskServer, ServerConfig};
//! let k = Kernel::start(KernelConfig::default()).unwrap();
//! let store = Backing::open(&BackingSpec::Ram(64 << 20)).unwrap();
//! let cfg = ServerConfig { owner_key: Some(7), ..ServerConfig::default() };
//! let disk = DiskServer::start(&k, store, cfg).unwrap();
//! let c = Client::open(&k, disk.pid(), 0, 7, 8).unwrap();
//! c.write(0, &[1u8; 4096], true).unwrap();
//! let mut back = [0u8; 4096];
//! c.read(0, &mut back).unwrap();
//! ```
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod backing;
pub mod client;
pub mod dvd;
pub mod msg;
pub mod nbd;
pub mod scsi;
pub mod server;

/// Fuzzing entry point for the SCSI layer (see [`scsi::fuzz_cdb`]).
pub fn fuzz_cdb(data: &[u8]) {
    scsi::fuzz_cdb(data)
}

/// Fuzzing entry point for the NBD handshake and command stream (see
/// [`nbd::fuzz_stream`]).
pub fn fuzz_nbd(data: &[u8]) {
    nbd::fuzz_stream(data)
}
