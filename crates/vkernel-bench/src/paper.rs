//! The published figures the benchmark prints beside today's, in
//! milliseconds as printed (`../shared/spec/1-ipc-and-measurements.md`).
//! "1983" is Cheriton & Zwaenepoel on 8 MHz SUN workstations and 3 Mb
//! Ethernet; "1985" is Zwaenepoel's thesis on 10 MHz SUNs and 10 Mb
//! Ethernet.

/// One row of a kernel-operation table (ms): local, remote, difference,
/// network penalty, client CPU, server CPU (`None` where not printed).
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// Local elapsed.
    pub local: Option<f64>,
    /// Remote elapsed.
    pub remote: Option<f64>,
    /// Network penalty.
    pub penalty: Option<f64>,
    /// Client CPU.
    pub client: Option<f64>,
    /// Server CPU.
    pub server: Option<f64>,
}

const fn row(local: f64, remote: f64, penalty: f64, client: f64, server: f64) -> Row {
    Row {
        local: Some(local),
        remote: Some(remote),
        penalty: Some(penalty),
        client: Some(client),
        server: Some(server),
    }
}

/// Network penalty, one way (ms), 10 Mb Ethernet, 10 MHz, by bytes (1985).
pub const PENALTY_1985: [(usize, f64); 5] = [
    (64, 0.55),
    (128, 0.80),
    (256, 1.29),
    (512, 2.29),
    (1024, 4.26),
];
/// The 1983 linear fit of the penalty on 3 Mb / 8 MHz: ms = A·n + B.
pub const PENALTY_FIT_1983: (f64, f64) = (0.0064, 0.390);

/// GetTime (1983, 8 MHz), ms.
pub const GET_TIME_1983: f64 = 0.07;
/// Send-Receive-Reply: 1983 (8 MHz, 3 Mb) and 1985 (10 MHz, 10 Mb).
pub const SRR_1983: Row = row(1.00, 3.18, 1.60, 1.79, 2.30);
/// See [`SRR_1983`].
pub const SRR_1985: Row = Row {
    server: None,
    ..row(0.94, 2.23, 1.10, 1.30, 0.0)
};
/// MoveFrom 1 KiB.
pub const MOVE_FROM_1983: Row = row(1.26, 9.03, 8.15, 3.76, 5.69);
/// MoveTo 1 KiB.
pub const MOVE_TO_1983: Row = row(1.26, 9.05, 8.15, 3.59, 5.87);
/// MoveFrom 1 KiB, 1985.
pub const MOVE_FROM_1985: Row = Row {
    server: None,
    ..row(1.19, 5.83, 5.16, 2.38, 0.0)
};
/// MoveTo 1 KiB, 1985.
pub const MOVE_TO_1985: Row = Row {
    server: None,
    ..row(1.19, 5.86, 5.16, 2.49, 0.0)
};
/// 512-byte page read / write, 10 Mb (1985).
pub const PAGE_READ_1985: Row = row(1.69, 4.54, 3.15, 2.41, 3.08);
/// See [`PAGE_READ_1985`].
pub const PAGE_WRITE_1985: Row = row(1.68, 4.54, 3.15, 2.38, 3.10);
/// Thoth-style Send-Receive-MoveFrom-Reply page write, 10 Mb (ms).
pub const THOTH_WRITE_1985: f64 = 7.0;
/// Sequential page reads (1983): (disk latency ms, elapsed per page ms).
pub const SEQUENTIAL_1983: [(f64, f64); 3] = [(10.0, 12.02), (15.0, 17.13), (20.0, 22.22)];
/// Program loading, 64 KiB by MoveTo, 10 Mb (1985): (unit KiB, local ms,
/// remote ms, client CPU ms, server CPU ms).
pub const LOADING_1985: [(usize, f64, f64, f64, f64); 4] = [
    (1, 71.7, 376.1, 175.8, 246.6),
    (4, 62.5, 241.1, 147.8, 181.4),
    (16, 60.2, 206.7, 140.6, 163.9),
    (64, 59.7, 198.0, 138.9, 159.5),
];
/// A file server's CPU limit, exchanges per second (1985).
pub const SERVER_LIMIT_1985: f64 = 575.0;

/// Formats an optional published figure.
pub fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.2}"))
}
