//! ZeroMQ REQ/REP ping-pong through the real libzmq (the `zmq` crate binds
//! the system library; Debian `libzmq3-dev`), over TCP on loopback.

use std::time::Instant;

use crate::pingpong::{run_pingpong, timed_rounds, total_rounds};
use crate::{BenchError, Placement, Samples, Wait, RECV_TIMEOUT};

/// Largest message [`zmq_pingpong`] accepts: 64 MiB.
pub const MAX_ZMQ_MESSAGE: usize = 64 << 20;

/// [`RECV_TIMEOUT`] in the milliseconds libzmq's socket options take.
fn timeout_ms() -> i32 {
    i32::try_from(RECV_TIMEOUT.as_millis()).unwrap_or(i32::MAX)
}

/// A libzmq error, with what was being done.
fn zerr(context: &'static str) -> impl FnOnce(zmq::Error) -> BenchError {
    BenchError::other(context)
}

/// Receives one message into `buf`: blocking with a timeout, or busy-polling
/// with DONTWAIT until [`RECV_TIMEOUT`].
fn recv(sock: &zmq::Socket, buf: &mut zmq::Message, wait: Wait) -> Result<(), BenchError> {
    match wait {
        Wait::Block => sock.recv(buf, 0).map_err(|e| match e {
            zmq::Error::EAGAIN => BenchError::timeout("ZeroMQ receive"),
            e => zerr("zmq recv")(e),
        }),
        Wait::Spin => {
            let t = Instant::now();
            let mut i = 0u32;
            loop {
                match sock.recv(buf, zmq::DONTWAIT) {
                    Ok(()) => return Ok(()),
                    Err(zmq::Error::EAGAIN) if t.elapsed() < RECV_TIMEOUT => {
                        // libzmq moves the data on its own I/O thread: with
                        // two spinning threads on two CPUs it must still get
                        // to run.
                        i = i.wrapping_add(1);
                        if i.is_multiple_of(64) {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                    Err(zmq::Error::EAGAIN) => return Err(BenchError::timeout("ZeroMQ receive")),
                    Err(e) => return Err(zerr("zmq recv")(e)),
                }
            }
        }
    }
}

/// Sends `data` as one message, blocking for at most [`RECV_TIMEOUT`]
/// (ZMQ_SNDTIMEO) while libzmq has no room for it.
fn send(sock: &zmq::Socket, data: &[u8]) -> Result<(), BenchError> {
    sock.send(data, 0).map_err(|e| match e {
        zmq::Error::EAGAIN => BenchError::timeout("ZeroMQ send"),
        e => zerr("zmq send")(e),
    })
}

/// Round-trip times of `size`-byte messages (0 up to [`MAX_ZMQ_MESSAGE`])
/// between a REQ client thread and a REP echo-server thread, each pinned
/// per `placement`: one libzmq context, TCP on 127.0.0.1, an ephemeral port
/// (`tcp://127.0.0.1:*`, read back as ZMQ_LAST_ENDPOINT).
///
/// `warmup` unrecorded round trips come first; each sample is the time from
/// just before the client's send to just after its receive of the echo, and
/// the echo's length and contents are checked outside the timed span.
///
/// libzmq always moves the bytes through its own I/O thread; `wait` decides
/// how our two threads wait for it: [`Wait::Block`] is a blocking receive
/// with ZMQ_RCVTIMEO, [`Wait::Spin`] busy-polls ZMQ_DONTWAIT receives
/// (yielding the CPU every 64 attempts, so the I/O thread gets to run on a
/// machine with few CPUs). Every receive, and every send libzmq cannot
/// queue at once, waits at most [`RECV_TIMEOUT`], else
/// [`BenchError::Timeout`].
pub fn zmq_pingpong(
    size: usize,
    iters: usize,
    warmup: usize,
    wait: Wait,
    placement: Placement,
) -> Result<Samples, BenchError> {
    let total = total_rounds(iters, warmup)?;
    if size > MAX_ZMQ_MESSAGE {
        return Err(BenchError::InvalidArgument(format!(
            "ZeroMQ ping-pong size {size} is over {MAX_ZMQ_MESSAGE} bytes"
        )));
    }
    let ctx = zmq::Context::new();
    let rep = ctx.socket(zmq::REP).map_err(zerr("zmq socket"))?;
    let req = ctx.socket(zmq::REQ).map_err(zerr("zmq socket"))?;
    for sock in [&rep, &req] {
        sock.set_rcvtimeo(timeout_ms())
            .map_err(zerr("zmq rcvtimeo"))?;
        sock.set_sndtimeo(timeout_ms())
            .map_err(zerr("zmq sndtimeo"))?;
    }
    // The server closes its socket right after queueing the last echo,
    // which libzmq's I/O thread may not have written to TCP yet: a linger
    // of 0 would discard it (the client then times out on its last
    // receive, seen in about 1 run in 10 with 8 KiB messages). With a
    // bounded linger the echo is delivered; dropping the context at the
    // end waits for it at most this long. The client's last message is
    // always answered before it closes, so it lingers for nothing.
    rep.set_linger(timeout_ms()).map_err(zerr("zmq linger"))?;
    req.set_linger(0).map_err(zerr("zmq linger"))?;
    rep.bind("tcp://127.0.0.1:*").map_err(zerr("zmq bind"))?;
    let endpoint = rep
        .get_last_endpoint()
        .map_err(zerr("zmq endpoint"))?
        .map_err(|_| BenchError::Protocol("ZeroMQ endpoint is not UTF-8".into()))?;
    req.connect(&endpoint).map_err(zerr("zmq connect"))?;
    let server = move || -> Result<(), BenchError> {
        let mut m = zmq::Message::new();
        for _ in 0..total {
            recv(&rep, &mut m, wait)?;
            send(&rep, &m)?;
        }
        Ok(())
    };
    let client = move || -> Result<Samples, BenchError> {
        let out: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let mut m = zmq::Message::new();
        timed_rounds(total, warmup, |_| {
            let t = Instant::now();
            send(&req, &out)?;
            recv(&req, &mut m, wait)?;
            let dt = t.elapsed();
            if m.len() != size || m[..] != out[..] {
                return Err(BenchError::Protocol(format!(
                    "ZeroMQ echo of {} bytes, expected {size}",
                    m.len()
                )));
            }
            Ok(dt)
        })
    };
    run_pingpong(placement, client, server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{assert_refuses_bad_counts, assert_round_trips, assert_sane};

    #[test]
    fn zmq_round_trips_in_both_waiting_modes() {
        let _g = crate::net_test_lock();
        assert_round_trips(zmq_pingpong, &[32, 8192]);
    }

    #[test]
    fn zmq_empty_large_and_pinned() {
        let _g = crate::net_test_lock();
        let s = zmq_pingpong(0, 50, 5, Wait::Block, Placement::UNPINNED).expect("0 B");
        assert_sane(&s, 50);
        // Larger than libzmq's 8 KiB I/O batches and a loopback segment.
        let s = zmq_pingpong(1 << 20, 5, 1, Wait::Block, Placement::UNPINNED).expect("1 MiB");
        assert_sane(&s, 5);
        let p = Placement::spread().expect("spread");
        let s = zmq_pingpong(32, 200, 20, Wait::Spin, p).expect("pinned");
        assert_sane(&s, 200);
        // No warm-up and no samples are fine too.
        let s = zmq_pingpong(32, 0, 0, Wait::Block, Placement::UNPINNED).expect("empty");
        assert!(s.is_empty());
    }

    #[test]
    fn zmq_refuses_bad_arguments() {
        assert_refuses_bad_counts(zmq_pingpong, MAX_ZMQ_MESSAGE + 1);
    }
}
