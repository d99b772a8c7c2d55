//! The typed report `vkernel bench` writes as `bench.json`: one struct per
//! section, serialized with serde (the field names are the JSON keys).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::stats::Summary;
use crate::trace::TraceReport;

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The mode's command-line name (`spin`, `spin-pinned`, `block`).
    pub placement: String,
    /// The mode in words.
    pub description: String,
    /// Timed iterations per measurement.
    pub count: usize,
    /// Small counts and sizes.
    pub quick: bool,
    /// Wall time of the run.
    pub seconds: f64,
    /// Every goal checked in the run, met or not.
    pub goals: Vec<Goal>,
    /// `section<N>` → that section's figures.
    pub sections: BTreeMap<String, SectionReport>,
}

/// A target the implementation is held to, and whether this run met it.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    /// What is compared, e.g. "MAC exchange / unauthenticated".
    pub what: String,
    /// The bound, e.g. "≤ 1.10×".
    pub target: String,
    /// The measured value.
    pub measured: f64,
    /// Whether the bound held.
    pub met: bool,
}

impl Goal {
    /// Checks `measured <= bound` and prints the line with ✓ or ✗.
    pub fn at_most(what: &str, measured: f64, bound: f64, unit: &str) -> Goal {
        let g = Goal {
            what: what.into(),
            target: format!("≤ {bound}{unit}"),
            measured,
            met: measured <= bound,
        };
        g.print(unit);
        g
    }

    /// Checks `measured >= bound` and prints the line with ✓ or ✗.
    pub fn at_least(what: &str, measured: f64, bound: f64, unit: &str) -> Goal {
        let g = Goal {
            what: what.into(),
            target: format!("≥ {bound}{unit}"),
            measured,
            met: measured >= bound,
        };
        g.print(unit);
        g
    }

    fn print(&self, unit: &str) {
        crate::outln!(
            "  {} goal: {} {} (measured {:.3}{unit})",
            if self.met { "✓" } else { "✗" },
            self.what,
            self.target,
            self.measured
        );
    }
}

/// One section's figures.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum SectionReport {
    /// 1.
    Penalty(Penalty),
    /// 2 and 3.
    Ops(Ops),
    /// 4.
    Sequential(Sequential),
    /// 5.
    Loading(Loading),
    /// 6.
    Load(Load),
    /// 7.
    Peers(Peers),
    /// 8.
    Groups(Groups),
    /// 9.
    Observability(Observability),
    /// 10.
    Disk(Disk),
    /// 11.
    Files(Files),
    /// 12.
    Security(Security),
    /// 13.
    Attach(crate::attach::Attach),
    /// 14.
    Python(crate::python::PythonReport),
    /// 15.
    Async(crate::asyncrt::AsyncReport),
    /// 16.
    Metadata(crate::metadata::Metadata),
    /// 17.
    Processes(crate::scale::Processes),
    /// 18.
    Clients(crate::clients::Clients),
}

/// Section 1.
#[derive(Clone, Debug, Serialize)]
pub struct Penalty {
    /// One row per datagram size.
    pub rows: Vec<PenaltyRow>,
    /// Slope of the fit, µs per byte.
    pub fit_us_per_byte: f64,
    /// Intercept of the fit, µs.
    pub fit_us: f64,
}

/// One datagram size of section 1.
#[derive(Clone, Debug, Serialize)]
pub struct PenaltyRow {
    /// Datagram payload.
    pub bytes: usize,
    /// Raw UDP round trip.
    pub rtt: Summary,
    /// Half the median round trip.
    pub one_way_median_us: f64,
}

/// Sections 2 and 3: operation rows.
#[derive(Clone, Debug, Serialize)]
pub struct Ops {
    /// One row per operation.
    pub rows: Vec<OpRow>,
    /// The null exchange between hosts as configured by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub defaults: Option<DefaultsRow>,
}

/// The exchange a user gets from the README's commands.
#[derive(Clone, Debug, Serialize)]
pub struct DefaultsRow {
    /// Remote null exchange.
    pub remote: Summary,
    /// The default waiting in words.
    pub waiting: String,
}

/// One operation measured locally and remotely.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpRow {
    /// Operation name.
    pub op: String,
    /// Local samples.
    pub local: Option<Summary>,
    /// Remote samples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<Summary>,
    /// Local median, the enclosing exchange taken off for Move rows.
    pub local_us: f64,
    /// Remote median, likewise.
    pub remote_us: f64,
    /// The network penalty of the bytes that cross.
    pub penalty_us: f64,
    /// Remote client CPU per operation (median of batches).
    pub client_cpu_us: f64,
    /// Remote server CPU per operation.
    pub server_cpu_us: f64,
    /// Local client CPU per operation.
    pub local_client_cpu_us: f64,
    /// Local server CPU per operation.
    pub local_server_cpu_us: f64,
}

/// Section 4.
#[derive(Clone, Debug, Serialize)]
pub struct Sequential {
    /// One row per disk latency.
    pub rows: Vec<SequentialRow>,
}

/// One disk latency of section 4.
#[derive(Clone, Debug, Serialize)]
pub struct SequentialRow {
    /// Simulated disk latency.
    pub latency_ms: f64,
    /// Time per page.
    pub per_page: Summary,
}

/// Section 5.
#[derive(Clone, Debug, Serialize)]
pub struct Loading {
    /// 64 KiB by transfer unit.
    pub rows: Vec<LoadingRow>,
    /// Large images.
    pub images: Vec<Image>,
    /// The transfer on a faulty network.
    pub faulty: Faulty,
    /// The largest image in 64 KiB units with write-behind off (every
    /// MoveTo waiting for its acknowledgement), MB/s, for comparison with
    /// the default in `images`.
    pub units_without_write_behind_mbps: f64,
    /// The largest image in 64 KiB units from a buffer the server shares
    /// (`Process::move_to_shared`: write-behind without a copy), MB/s.
    pub units_shared_mbps: f64,
    /// 64 KiB units against one MoveTo across a veth pair of real MTUs
    /// (1,500 and 9,000) between two network namespaces; empty where
    /// namespaces cannot be made.
    pub mtu_units: Vec<crate::mtu::MtuUnits>,
    /// Cost against bytes, loss, segmentation offload.
    pub bulk: BulkRows,
}

/// One transfer unit of section 5.
#[derive(Clone, Debug, Serialize)]
pub struct LoadingRow {
    /// Transfer unit.
    pub unit_kib: usize,
    /// Local load.
    pub local: Summary,
    /// Remote load.
    pub remote: Summary,
    /// Remote throughput.
    pub mbps: f64,
    /// Client CPU per load.
    pub client_cpu_ms: f64,
    /// Server CPU per load.
    pub server_cpu_ms: f64,
}

/// A large image loaded by MoveTo.
#[derive(Clone, Debug, Serialize)]
pub struct Image {
    /// Image size.
    pub bytes: usize,
    /// Transfer unit.
    pub unit: usize,
    /// Throughput (median).
    pub mbps: f64,
    /// Loads timed.
    pub n: usize,
    /// Raw UDP blast of the same bytes.
    pub raw_blast_mbps: f64,
    /// Its loss.
    pub raw_blast_loss: f64,
}

/// Section 5's bulk rows: cost against bytes, congestion control under
/// loss, segmentation offload at an Ethernet datagram size.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BulkRows {
    /// One remote MoveTo of each size: (bytes, time).
    pub by_bytes: Vec<(usize, Summary)>,
    /// The same transfers on a clean link and with injected loss.
    pub loss: Vec<LossRow>,
    /// Transfers with 1,472-byte datagrams, with and without GSO.
    pub mtu: Vec<MtuRow>,
}

/// One transfer clean and under loss.
#[derive(Clone, Debug, Serialize)]
pub struct LossRow {
    /// "MoveTo" or "MoveFrom".
    pub op: String,
    /// Bytes per transfer.
    pub bytes: usize,
    /// Injected loss (fraction).
    pub loss: f64,
    /// Median MB/s on the clean pair.
    pub clean_mbps: f64,
    /// Median MB/s with the loss.
    pub lossy_mbps: f64,
    /// Chunks retransmitted with the loss.
    pub retransmits: u64,
    /// Congestion-window cuts with the loss.
    pub cwnd_cuts: u64,
}

/// One transfer with 1,472-byte datagrams.
#[derive(Clone, Debug, Serialize)]
pub struct MtuRow {
    /// "MoveTo" or "MoveFrom".
    pub op: String,
    /// Bytes per transfer.
    pub bytes: usize,
    /// Median MB/s, one datagram per send call.
    pub plain_mbps: f64,
    /// Median MB/s with UDP segmentation offload.
    pub gso_mbps: f64,
    /// Datagrams that left in segmented sends.
    pub gso_datagrams: u64,
}

/// Section 5's transfer on a faulty network.
#[derive(Clone, Debug, Serialize)]
pub struct Faulty {
    /// The faults in words.
    pub faults: String,
    /// MoveTo throughput.
    pub move_to_mbps: f64,
    /// MoveFrom throughput.
    pub move_from_mbps: f64,
    /// Both transfers delivered the right bytes.
    pub intact: bool,
}

/// Section 6.
#[derive(Clone, Debug, Serialize)]
pub struct Load {
    /// One row per configuration.
    pub rows: Vec<LoadRow>,
    /// Duration of each configuration.
    pub seconds: f64,
}

/// One configuration of section 6.
#[derive(Clone, Debug, Serialize)]
pub struct LoadRow {
    /// Clients and servers.
    pub config: String,
    /// Throughput.
    pub exchanges_per_s: f64,
    /// Server CPU per exchange.
    pub server_cpu_us: f64,
}

/// Section 7.
#[derive(Clone, Debug, Serialize)]
pub struct Peers {
    /// One row per message size.
    pub rows: Vec<PeerRow>,
}

/// One message size of section 7.
#[derive(Clone, Debug, Serialize)]
pub struct PeerRow {
    /// Bytes each way.
    pub bytes: usize,
    /// vkernel, one logical host.
    pub vkernel_local: Summary,
    /// vkernel, two logical hosts.
    pub vkernel_remote: Summary,
    /// Raw UDP ping-pong.
    pub udp: Summary,
    /// TCP NODELAY ping-pong.
    pub tcp: Summary,
    /// ZeroMQ REQ/REP.
    pub zeromq: Summary,
    /// gRPC unary.
    pub grpc: Summary,
    /// vkernel remote over each peer (median / median).
    pub ratios: PeerRatios,
}

/// vkernel remote / peer, by median.
#[derive(Clone, Debug, Serialize)]
pub struct PeerRatios {
    /// Over raw UDP.
    pub vk_udp: f64,
    /// Over TCP.
    pub vk_tcp: f64,
    /// Over ZeroMQ.
    pub vk_zmq: f64,
    /// Over gRPC.
    pub vk_grpc: f64,
}

/// Section 8.
#[derive(Clone, Debug, Serialize)]
pub struct Groups {
    /// 1-reply group Send to one remote member.
    pub one_reply: Summary,
    /// One-to-one Send to that member.
    pub one_to_one: Summary,
    /// Group / one-to-one.
    pub ratio: f64,
    /// Multi-reply gathering by member count.
    pub multi_reply: Vec<GroupRow>,
    /// Multi-reply gathering, one member on each of N hosts (`members`
    /// is the host count).
    pub by_hosts: Vec<GroupRow>,
}

/// One member count of section 8.
#[derive(Clone, Debug, Serialize)]
pub struct GroupRow {
    /// Members.
    pub members: usize,
    /// Time to the first reply.
    pub first: Summary,
    /// Time to all replies.
    pub all: Summary,
    /// Slope of "all replies" over members (least squares, ≥ 0).
    pub per_extra_reply_us: f64,
}

/// A setup compared in alternating rounds (sections 9 and 12).
#[derive(Clone, Debug, Serialize)]
pub struct SetupRow {
    /// Setup name.
    pub setup: String,
    /// Remote null exchange.
    pub latency: Summary,
    /// Median over the first setup's.
    pub ratio_vs_off: f64,
    /// Bulk MoveTo throughput (section 12).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moveto_mbps: Option<f64>,
    /// Over the first setup's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moveto_ratio: Option<f64>,
}

/// Section 9.
#[derive(Clone, Debug, Serialize)]
pub struct Observability {
    /// Metrics off / on / tracing.
    pub overhead: Vec<SetupRow>,
    /// Estimated cost of one trace event.
    pub probe_ns: f64,
    /// The traced run's characterization.
    pub characterization: TraceReport,
}

/// Section 10.
#[derive(Clone, Debug, Serialize)]
pub struct Disk {
    /// The native client.
    pub native: NativeDisk,
    /// Client tools against the gateways and nbdkit.
    pub tools: Vec<ToolRow>,
}

/// Section 10's native client.
#[derive(Clone, Debug, Serialize)]
pub struct NativeDisk {
    /// Write throughput (median of 3).
    pub write_mbps: f64,
    /// Read throughput (median of 3).
    pub read_mbps: f64,
    /// Raw UDP blast.
    pub raw_blast_mbps: f64,
    /// Disk size.
    pub bytes: usize,
}

/// One client tool of section 10 against each target.
#[derive(Clone, Debug, Serialize)]
pub struct ToolRow {
    /// The tool and workload.
    pub test: String,
    /// Gateway and disk on two logical hosts, blocking waits.
    pub gateway: Option<f64>,
    /// Gateway in the disk's host.
    pub gateway_same_host: Option<f64>,
    /// Two hosts with the default waiting.
    pub gateway_defaults: Option<f64>,
    /// nbdkit's memory plugin.
    pub nbdkit: Option<f64>,
    /// Unit of the figures.
    pub unit: String,
}

/// Section 11.
#[derive(Clone, Debug, Serialize)]
pub struct Files {
    /// 4 KiB page read over V.
    pub page_read: Latency,
    /// 4 KiB page write over V.
    pub page_write: Latency,
    /// Null exchange + 4 KiB penalty, same mode.
    pub expected_us: f64,
    /// Null exchange, same hosts and mode.
    pub exchange_us: f64,
    /// The waiting mode of every figure of the section.
    pub mode: String,
    /// Published figures.
    pub paper_ms: FilesPaper,
    /// Program loads by size.
    pub program_load: Vec<ProgramLoad>,
    /// Sequential throughput.
    pub sequential: SequentialFiles,
}

/// Median and p99, µs.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    /// Median.
    pub median_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
}

/// Section 11's published figures.
#[derive(Clone, Debug, Serialize)]
pub struct FilesPaper {
    /// 512 B page read, 1985.
    pub page_read_remote_1985: Option<f64>,
    /// 512 B page write, 1985.
    pub page_write_remote_1985: Option<f64>,
    /// 64 KiB program load, 1985.
    pub load_64k_remote_1985: f64,
}

/// One program image of section 11.
#[derive(Clone, Debug, Serialize)]
pub struct ProgramLoad {
    /// Image size.
    pub bytes: usize,
    /// Median load.
    pub median_us: f64,
    /// p99 load.
    pub p99_us: f64,
    /// Throughput.
    pub mbps: f64,
    /// `cat` of the image through the FUSE mount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cat_via_mount_ms: Option<f64>,
}

/// Section 11's sequential throughput.
#[derive(Clone, Debug, Serialize)]
pub struct SequentialFiles {
    /// File size.
    pub bytes: usize,
    /// Local directory.
    pub local: ReadWrite,
    /// V FUSE mount.
    pub vmount: Measured<ReadWrite>,
    /// sshfs.
    pub sshfs: Measured<ReadWrite>,
}

/// Read and write throughput.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ReadWrite {
    /// Read.
    pub read_mbps: f64,
    /// Write + fsync.
    pub write_mbps: f64,
}

/// A figure, or why it was not measured.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Measured<T> {
    /// Measured.
    Ok(T),
    /// Not measured.
    Skipped {
        /// Why.
        skipped: String,
    },
}

/// Section 12.
#[derive(Clone, Debug, Serialize)]
pub struct Security {
    /// No key, MAC, AEAD.
    pub rows: Vec<SetupRow>,
    /// Bytes of each bulk MoveTo.
    pub bulk_bytes: usize,
}
