//! `vkernel stats`'s table: one row per logical host from the JSON its
//! kernel server returns, with rates since the previous row of that host.

use std::collections::BTreeMap;
use std::time::Instant;

use vkernel::metrics::StatsDoc;

/// Successive views of one host: counters as totals first, then as rates.
#[derive(Default)]
pub struct HostView {
    prev: Option<(Instant, [u64; 4])>,
}

impl HostView {
    /// The table's header line.
    pub const HEADER: &'static str = "  host  procs  aliens  queued datagrams rx datagrams tx  remote ex   local ex     retx     dups    drops rem p50 µs rem p99 µs";

    /// The row for a statistics document (the JSON a kernel server sends).
    pub fn row(&mut self, doc: &str) -> Result<String, String> {
        let v: StatsDoc = serde_json::from_str(doc).map_err(|e| e.to_string())?;
        let sum = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
        let now = Instant::now();
        let cur = [
            sum(&v.datagrams_rx),
            sum(&v.datagrams_tx),
            v.remote_exchanges,
            v.local_exchanges,
        ];
        let shown: Vec<String> = match self.prev {
            Some((t, old)) => {
                let dt = now.duration_since(t).as_secs_f64().max(1e-9);
                cur.iter()
                    .zip(old)
                    .map(|(c, o)| format!("{:.0}/s", c.saturating_sub(o) as f64 / dt))
                    .collect()
            }
            None => cur.iter().map(u64::to_string).collect(),
        };
        self.prev = Some((now, cur));
        Ok(format!(
            "{:>6} {:>6} {:>7} {:>7} {:>12} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8} {:>10} {:>10}",
            v.host,
            v.processes,
            v.aliens_in_use,
            v.queued_messages,
            shown[0],
            shown[1],
            shown[2],
            shown[3],
            v.retransmits + v.bulk_retransmits,
            v.duplicates,
            sum(&v.drops) + sum(&v.auth_rejects),
            v.remote_latency_us.p50,
            v.remote_latency_us.p99,
        ))
    }
}
