//! The vkernel measurement suite behind `vkernel bench`: the V papers'
//! tables measured on this machine with the published figures beside
//! today's, the peers a user would pick instead (raw UDP, TCP, ZeroMQ, gRPC
//! from `vkernel-peers`) measured in the same run and [`Mode`], a typed
//! JSON [`Report`], SVG charts, and the analysis of message traces.
//!
//! - [`section`]: [`Section`] (number, title, run), [`Options`], [`run`].
//! - [`report`]: the report's serde structs, [`Goal`]s checked with ✓/✗.
//! - [`mode`]: [`Mode`] = CPU [`vkernel_peers::Placement`] + [`vkernel_peers::Wait`].
//! - [`vkbench`]: vkernel's side (host pairs, the exchange server, timed ops).
//! - [`demo`]: `vkernel demo`, a one-screen tour with raw UDP beside it.
//! - [`baseline`]: the peers called with the same mode and summarized alike.
//! - [`echo`]: the echo server and ping's timed exchanges.
//! - [`hoststats`]: the rows of `vkernel stats`.
//! - [`trace`]: `vkernel trace report` (sizes, matrix, rates, phases,
//!   conservation, Chrome export) over [`vkernel::trace::Event`]s.
//! - One file per group of sections: `kernel_ops` (1–4), `loading` (5–6),
//!   `peers` (7–8), `overhead` (9, 12), `disk` (10), `files` (11).
//!
//! To add a section: a [`Section`] variant with its number, title and `run`
//! arm, a function returning its report struct (added to [`report`]), and
//! a line in `vkernel bench --help`'s section list.

#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod asyncrt;
mod attach;
pub mod baseline;
mod bulkprograms;
pub mod chart;
mod clients;
pub mod demo;
mod disk;
pub mod echo;
mod files;
pub mod hoststats;
mod kernel_ops;
mod loading;
mod metadata;
pub mod mode;
pub mod mtu;
pub mod out;
mod overhead;
pub mod paper;
mod peers;
pub mod programs;
mod python;
pub mod report;
mod scale;
pub mod section;
pub mod stats;
pub mod trace;
mod transfers;
pub mod vkbench;

pub use mode::Mode;
pub use report::{Goal, Report};
pub use section::{run, Options, Section};
pub use stats::Summary;

/// A short description of a fault configuration.
pub fn describe_faults(f: &vkernel::FaultConfig) -> String {
    let mut v = Vec::new();
    for (name, r) in [
        ("loss", f.loss),
        ("dup", f.duplicate),
        ("reorder", f.reorder),
        ("delay", f.delay_rate),
    ] {
        if r > 0.0 {
            v.push(format!("{name} {:.0}%", r * 100.0));
        }
    }
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
