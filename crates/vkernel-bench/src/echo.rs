//! The echo protocol of `vkernel echo` and `vkernel ping`: the server, and
//! the client's timed exchanges (plain, with a segment, or bulk).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkernel::{IpcError, Message, Pid, Process, Segment};

use crate::stats::Summary;

/// Request code of an echo exchange.
pub const ECHO: u32 = 0x0e_c400;
/// Request code of a bulk echo: the server MoveFroms the whole segment,
/// flips every byte (XOR 0xff) and MoveTos it back before replying.
pub const ECHO_BULK: u32 = 0x0e_c401;

/// Request code of a move echo: the segment's first half is MoveFrom'd
/// into a buffer the server keeps warm and MoveTo'd into its second half.
/// The server touches no byte itself, so the client times the transport
/// alone (it fills and checks the halves outside the timed interval).
pub const ECHO_MOVE: u32 = 0x0e_c402;

/// Largest segment a bulk echo accepts.
pub const MAX_BULK: usize = 256 << 20;

/// Requests answered by every [`serve`] of this program, for its exit
/// summary (an attached echo's requests reach it through the machine
/// host, so its own kernel counts no datagrams for them).
static SERVED: AtomicU64 = AtomicU64::new(0);

/// Requests the echo servers of this program have answered.
pub fn served() -> u64 {
    SERVED.load(Ordering::Relaxed)
}

/// Serves echo requests until the host shuts down (or, attached, goes
/// away): the message comes back unchanged, and a read+write segment's
/// first part is returned with the reply.
pub fn serve(p: Process) {
    let mut m = Message::zero();
    let mut buf = vec![0u8; vkernel_proto::MAX_APPEND];
    // A move echo's buffer, kept between requests: its pages are faulted
    // in once, not on every exchange.
    let mut warm = Vec::new();
    loop {
        let i = match p.receive_with_segment(&mut m, &mut buf) {
            Ok(i) => i,
            Err(e) if ends(&e) => return,
            Err(_) => continue,
        };
        SERVED.fetch_add(1, Ordering::Relaxed);
        let access = m.seg_access();
        if m.code() == ECHO_BULK || m.code() == ECHO_MOVE {
            // A failed move still gets an answer (word 1 = u32::MAX): an
            // unanswered Send would wait on replyPending forever.
            let r = if m.code() == ECHO_MOVE {
                move_halves(&p, &mut m, i.from, &mut warm)
            } else {
                bulk(&p, &mut m, i.from)
            };
            match r {
                Ok(()) => {}
                Err(e) if ends(&e) => return,
                Err(e) => {
                    tracing::debug!("bulk echo for {}: {e}", i.from);
                    m.0[1] = u32::MAX;
                }
            }
            if let Err(e) = p.reply(&m, i.from) {
                tracing::debug!("bulk echo reply to {}: {e}", i.from);
            }
            continue;
        }
        let r = if m.code() == ECHO && access.write && i.seg_bytes > 0 {
            p.reply_with_segment(&m, i.from, 0, &buf[..i.seg_bytes])
        } else {
            p.reply(&m, i.from)
        };
        if let Err(e) = r {
            tracing::debug!("echo reply to {}: {e}", i.from);
        }
    }
}

/// An error no later call of the process can recover from: its kernel
/// shut down, it was destroyed, or the machine host it is attached to has
/// gone.
pub fn ends(e: &IpcError) -> bool {
    matches!(
        e,
        IpcError::Shutdown | IpcError::Destroyed | IpcError::HostLost
    )
}

fn bulk(p: &Process, m: &mut Message, from: vkernel::Pid) -> Result<(), IpcError> {
    let n = m.seg_len() as usize;
    let a = m.seg_access();
    if !(a.read && a.write) || n > MAX_BULK {
        m.0[1] = u32::MAX;
        return Ok(());
    }
    let mut data = vec![0u8; n];
    p.move_from(from, 0, &mut data)?;
    for b in &mut data {
        *b ^= 0xff;
    }
    p.move_to(from, 0, &data)?;
    m.0[1] = n as u32;
    Ok(())
}

fn move_halves(
    p: &Process,
    m: &mut Message,
    from: vkernel::Pid,
    warm: &mut Vec<u8>,
) -> Result<(), IpcError> {
    let len = m.seg_len() as usize;
    let a = m.seg_access();
    let n = len / 2;
    if !(a.read && a.write) || n > MAX_BULK || !len.is_multiple_of(2) {
        m.0[1] = u32::MAX;
        return Ok(());
    }
    if warm.len() < n {
        warm.resize(n, 0);
    }
    let data = &mut warm[..n];
    p.move_from(from, 0, data)?;
    p.move_to(from, n as u32, data)?;
    m.0[1] = n as u32;
    Ok(())
}

/// Marks a move echo's first half as round `i`'s (a word every MiB), so
/// that data left from an earlier round cannot pass the check.
fn mark_round(half: &mut [u8], i: usize) {
    for at in (0..half.len().saturating_sub(7)).step_by(1 << 20) {
        half[at..at + 8].copy_from_slice(&(i as u64).to_le_bytes());
    }
}

/// What [`time_exchanges`] sends.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Timed exchanges.
    pub count: usize,
    /// Untimed exchanges first.
    pub warmup: usize,
    /// Bytes per request (32: a bare message; more adds a segment).
    pub size: usize,
    /// Bulk echo of a segment of this many bytes instead.
    pub bulk: Option<usize>,
    /// With `bulk`: the server inverts the data (the older ECHO_BULK, whose
    /// timed interval includes the server's pass over every byte) instead
    /// of moving it untouched between the halves of a twice-as-large
    /// segment.
    pub invert: bool,
    /// Fail at the first failed exchange.
    pub stop_on_error: bool,
    /// Stop early (with the exchanges so far) once this is set: Ctrl-C.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Timing {
    /// A bulk run's rate at the median exchange: bytes moved both ways
    /// per second, in MB/s (`None` without bulk or without a median).
    pub fn rate_mb_s(&self, s: &Summary) -> Option<f64> {
        let b = self.bulk?;
        (s.n > 0 && s.median_us > 0.0).then(|| b as f64 * 2.0 / (s.median_us * 1e-6) / 1e6)
    }

    /// The outcome of a run in words.
    pub fn describe(&self, s: &Summary, failures: usize) -> String {
        match self.bulk {
            // (No rate when nothing completed: there is no median.)
            Some(b) if s.n == 0 || s.median_us <= 0.0 => format!(
                "{} bulk exchanges of {b} bytes (MoveFrom + MoveTo): {s}  failures {failures}\n  none completed: no rate",
                s.n + failures
            ),
            Some(b) => format!(
                "{} bulk exchanges of {b} bytes (MoveFrom + MoveTo): {s}  failures {failures}\n  {:.1} MB/s moved at the median",
                s.n + failures,
                b as f64 * 2.0 / (s.median_us * 1e-6) / 1e6
            ),
            None => format!(
                "{} exchanges of {} bytes: {s}  failures {failures}",
                s.n + failures,
                self.size
            ),
        }
    }
}

/// Times exchanges with an echo server `server`, checking every reply:
/// the summary of the good ones, the failures, the last error, and the
/// wall time of the whole run. An error no later exchange can recover
/// from ([`ends`]: the host gone, say) ends the run as with
/// `stop_on_error`.
pub fn time_exchanges(
    p: &Process,
    server: Pid,
    a: &Timing,
) -> Result<(Summary, usize, Option<IpcError>, Duration), String> {
    let seg_len = a.bulk.unwrap_or(a.size - 32);
    // A move echo: the data goes out in the first half and comes back,
    // untouched, in the second.
    let moving = a.bulk.is_some() && !a.invert;
    let out: Vec<u8> = (0..seg_len).map(|i| (i * 7 + 3) as u8).collect();
    let inverted: Vec<u8> = if a.bulk.is_some() && a.invert {
        out.iter().map(|b| b ^ 0xff).collect()
    } else {
        Vec::new()
    };
    let mut buf = out.clone();
    if moving {
        buf.resize(2 * seg_len, 0);
    }
    let mut samples = Vec::with_capacity(a.count);
    let mut failures = 0usize;
    let mut last_err = None;
    // Bulk runs can take minutes: a bar on a terminal (outside the timing).
    let mut progress = a
        .bulk
        .map(|_| crate::out::Progress::bar_only("vkernel ping", (a.warmup + a.count) as u64));
    let started = Instant::now();
    for i in 0..a.warmup + a.count {
        if a.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            break;
        }
        let mut m = Message::with_code(ECHO);
        m.0[1] = i as u32;
        // The segment is filled before the clock starts and checked after
        // it stops: only the exchange is timed.
        if moving {
            m.set_code(ECHO_MOVE);
            let (first, second) = buf.split_at_mut(seg_len);
            mark_round(first, i);
            second.fill(0);
        } else if a.bulk.is_some() {
            m.set_code(ECHO_BULK);
            buf.copy_from_slice(&out);
        } else if seg_len > 0 {
            buf.copy_from_slice(&out);
        }
        let t0 = Instant::now();
        let r = if seg_len > 0 {
            p.send_with_segment(&mut m, server, Segment::ReadWrite(&mut buf))
        } else {
            p.send(&mut m, server)
        };
        let dt = t0.elapsed();
        let ok = match r {
            Ok(_) if a.bulk.is_some() && m.0[1] == u32::MAX && a.stop_on_error => {
                return Err(format!(
                    "exchange {i} failed after {:.0} ms: the server's move failed",
                    dt.as_secs_f64() * 1e3
                ));
            }
            Ok(_) if moving && m.0[1] == i as u32 && i as u32 != seg_len as u32 => {
                return Err(format!(
                    "the server answered exchange {i} without moving anything: an echo older \
                     than move echoes? (`vkernel ping --invert` uses the older bulk echo)"
                ));
            }
            Ok(_) if moving => {
                let (first, second) = buf.split_at(seg_len);
                m.0[1] as usize == seg_len && first == second
            }
            Ok(_) if a.bulk.is_some() => m.0[1] as usize == seg_len && buf == inverted,
            Ok(rep) => m.0[1] == i as u32 && rep.seg_bytes == seg_len && buf == out,
            Err(e) => {
                if a.stop_on_error || ends(&e) {
                    return Err(format!(
                        "exchange {i} failed after {:.0} ms: {e}",
                        dt.as_secs_f64() * 1e3
                    ));
                }
                last_err = Some(e);
                false
            }
        };
        if i >= a.warmup {
            if ok {
                samples.push(dt);
            } else {
                failures += 1;
            }
        }
        if let Some(p) = &mut progress {
            p.advance(1);
        }
    }
    drop(progress);
    let elapsed = started.elapsed();
    let s = Summary::of(&mut samples);
    Ok((s, failures, last_err, elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bulk_run_with_no_exchange_reports_no_rate() {
        let t = Timing {
            count: 3,
            warmup: 0,
            size: 32,
            bulk: Some(1 << 20),
            invert: false,
            stop_on_error: false,
            stop: None,
        };
        let none = Summary::of(&mut []);
        let d = t.describe(&none, 3);
        assert!(d.contains("none completed"), "{d}");
        assert!(!d.contains("MB/s"), "{d}");
        let one = Summary::of(&mut [Duration::from_micros(1000)]);
        assert!(
            t.describe(&one, 0).contains("2097.2 MB/s"),
            "{}",
            t.describe(&one, 0)
        );
    }
}
