//! A logical host's counters as JSON (`doc.rs`: what its kernel server
//! answers to a STATS request, so they are readable remotely too) and as
//! Prometheus text (`prom.rs`), both served by the `--metrics ADDR`
//! endpoint; `peers.rs` bounds the per-peer series.

mod doc;
mod peers;
mod prom;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use vkernel_proto::Stats;

pub(crate) use doc::stats_from_json;
pub use doc::{HistogramDoc, PeerDoc, StatsDoc};
pub(crate) use peers::PeerBook;
pub use peers::{PeerSeries, MAX_PEER_SERIES};
pub use prom::CONTENT_TYPE;

use crate::kernel::Shared;

/// Gauges read from the engine beside its counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Logical host id.
    pub host: u16,
    /// Live processes.
    pub processes: u64,
    /// Messages queued for receivers.
    pub queued: u64,
    /// Microseconds since the host started.
    pub uptime_us: u64,
}

/// One reading of a host's counters: what `/metrics`, `/stats.json` and
/// a kernel server's STATS answer show.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The protocol counters (gone peers already taken out).
    pub stats: Stats,
    /// The gauges read beside them.
    pub gauges: Gauges,
    /// Which peers have Prometheus series of their own.
    pub peers: PeerSeries,
}

impl Snapshot {
    /// The counters as a statistics document.
    pub fn doc(&self) -> StatsDoc {
        StatsDoc::from(self)
    }

    /// The counters as one JSON object ([`StatsDoc`]).
    pub fn to_json(&self) -> String {
        self.doc().to_json()
    }
}

/// Reads a request head (up to its blank line, or until `buf` is full, the
/// peer stops sending, or the read timeout passes). A request can arrive in
/// several segments; answering after the first and closing with the rest
/// unread would reset the connection under the client's feet.
fn read_head(c: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match c.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    n
}

/// Serves `GET /metrics` (Prometheus text) and `GET /stats.json` on `addr`
/// until the host shuts down. Returns the bound address.
pub(crate) fn serve(shared: Arc<Shared>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let bound = l.local_addr()?;
    l.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("vk-metrics".into())
        .spawn(move || {
            while !shared.stopping() {
                match l.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.set_nonblocking(false);
                        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut buf = [0u8; 2048];
                        let n = read_head(&mut c, &mut buf);
                        let req = String::from_utf8_lossy(&buf[..n]);
                        let path = req.split_whitespace().nth(1).unwrap_or("/");
                        let (status, ctype, body) = match path {
                            "/metrics" => ("200 OK", CONTENT_TYPE, shared.snapshot().to_prometheus()),
                            "/stats.json" => ("200 OK", "application/json", shared.snapshot().to_json()),
                            _ => ("404 Not Found", "text/plain", "try /metrics or /stats.json\n".into()),
                        };
                        let _ = write!(
                            c,
                            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                    }
                    // Sleep until a scrape connects (no polling interval
                    // for it to wait out); look at `stopping` now and then.
                    Err(_) => {
                        crate::sys::poll2(l.as_raw_fd(), None, Duration::from_millis(200));
                    }
                }
            }
        })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::read_head;

    /// Hands out its bytes a few at a time, like a request split over
    /// several TCP segments.
    struct Trickle<'a>(&'a [u8], usize);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let k = self.1.min(self.0.len()).min(buf.len());
            buf[..k].copy_from_slice(&self.0[..k]);
            self.0 = &self.0[k..];
            Ok(k)
        }
    }

    #[test]
    fn a_request_head_split_over_reads_is_read_whole() {
        let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut buf = [0u8; 2048];
        let n = read_head(&mut Trickle(req, 4), &mut buf);
        assert_eq!(&buf[..n], &req[..]);
        // A peer that stops early: what came is returned.
        let n = read_head(&mut Trickle(b"GET /met", 3), &mut buf);
        assert_eq!(&buf[..n], b"GET /met");
        // A head longer than the buffer stops at the buffer's end.
        let long = vec![b'a'; 5000];
        let n = read_head(&mut Trickle(&long, 1000), &mut buf);
        assert_eq!(n, 2048);
    }
}
