//! gRPC unary echo through tonic (HTTP/2 over TCP on loopback): the peer a
//! user who wants RPC would pick. Server and client each run a
//! current-thread tokio runtime on their own (pinnable) thread.
//!
//! tonic always waits in tokio's epoll reactor: it cannot busy-poll, so the
//! [`Wait`] passed is recorded by the caller but both ends block.
//!
//! The service is generated at build time by `tonic-build` from
//! `proto/echo.proto` (`service Echo { rpc Echo(Payload) returns
//! (Payload) }`, `message Payload { bytes data = 1; }`) and needs `protoc`
//! (Debian `protobuf-compiler`); the generated code is in [`pb`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::pingpong::{run_pingpong, total_rounds};
use crate::{BenchError, Placement, Samples, Wait, RECV_TIMEOUT};

/// Code generated from `proto/echo.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("vkbench");
}

use pb::echo_client::EchoClient;
use pb::echo_server::{Echo, EchoServer};
use pb::Payload;

/// Largest payload [`grpc_pingpong`] accepts: 4 MiB, tonic's default limit
/// on a decoded message. The codecs on both ends are configured to take a
/// payload of exactly this size plus its protobuf framing.
pub const MAX_GRPC_PAYLOAD: usize = 4 << 20;

/// Codec limit on one encoded message: the payload, its field tag (1 byte)
/// and its length varint (at most 10 bytes).
const MAX_GRPC_MESSAGE: usize = MAX_GRPC_PAYLOAD + 16;

struct Svc;

#[tonic::async_trait]
impl Echo for Svc {
    async fn echo(
        &self,
        r: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, tonic::Status> {
        Ok(tonic::Response::new(r.into_inner()))
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BenchError::io("tokio runtime"))
}

/// Round-trip times of unary gRPC calls carrying `size` bytes (0 up to
/// [`MAX_GRPC_PAYLOAD`]) each way, between a tonic client thread and a
/// tonic server thread on 127.0.0.1 (an ephemeral port, one HTTP/2
/// connection, TCP_NODELAY on both ends). Each thread runs its own
/// current-thread tokio runtime and is pinned per `placement`.
///
/// `warmup` unrecorded calls come first; each sample is the time from just
/// before the call to its response, and the echo is checked outside the
/// timed span. Connecting and every call are bounded by [`RECV_TIMEOUT`],
/// else [`BenchError::Timeout`].
///
/// `wait` is accepted so the peers share one signature, but has no effect:
/// tonic always waits in tokio's epoll reactor and cannot busy-poll, so
/// every gRPC run is in effect [`Wait::Block`], whatever is passed.
pub fn grpc_pingpong(
    size: usize,
    iters: usize,
    warmup: usize,
    _wait: Wait,
    placement: Placement,
) -> Result<Samples, BenchError> {
    let total = total_rounds(iters, warmup)?;
    if size > MAX_GRPC_PAYLOAD {
        return Err(BenchError::InvalidArgument(format!(
            "gRPC payload of {size} bytes is over {MAX_GRPC_PAYLOAD} bytes (tonic's default limit)"
        )));
    }
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(BenchError::io("bind gRPC"))?;
    listener
        .set_nonblocking(true)
        .map_err(BenchError::io("gRPC listener"))?;
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(BenchError::io("gRPC address"))?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = move || -> Result<(), BenchError> {
        let rt = runtime()?;
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener)
                .map_err(BenchError::io("gRPC listener"))?;
            // Accepted connections get TCP_NODELAY too (else Nagle and
            // delayed acknowledgements add ~40 ms to every reply).
            let incoming = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::TcpListenerStream::new(l),
                |r| {
                    r.inspect(|s| {
                        let _ = s.set_nodelay(true);
                    })
                },
            );
            tonic::transport::Server::builder()
                .add_service(
                    EchoServer::new(Svc)
                        .max_decoding_message_size(MAX_GRPC_MESSAGE)
                        .max_encoding_message_size(MAX_GRPC_MESSAGE),
                )
                .serve_with_incoming_shutdown(incoming, async {
                    // Bounded: the client ends the run, or 10 minutes pass.
                    let _ = tokio::time::timeout(Duration::from_secs(600), stop_rx).await;
                })
                .await
                .map_err(BenchError::other("gRPC server"))
        })
    };
    let client = move || -> Result<Samples, BenchError> {
        let rt = runtime()?;
        let r = rt.block_on(async move {
            let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .map_err(BenchError::other("gRPC endpoint"))?
                .tcp_nodelay(true)
                .connect_timeout(RECV_TIMEOUT);
            let start = Instant::now();
            let channel = loop {
                match ep.connect().await {
                    Ok(c) => break c,
                    Err(_) if start.elapsed() < RECV_TIMEOUT => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(e) => return Err(BenchError::other("gRPC connect")(e)),
                }
            };
            let mut c = EchoClient::new(channel)
                .max_decoding_message_size(MAX_GRPC_MESSAGE)
                .max_encoding_message_size(MAX_GRPC_MESSAGE);
            let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
            let mut s = Samples::with_capacity(iters);
            for k in 0..total {
                let req = Payload { data: data.clone() };
                let t = Instant::now();
                let r = tokio::time::timeout(RECV_TIMEOUT, c.echo(req))
                    .await
                    .map_err(|_| BenchError::timeout("gRPC call"))?
                    .map_err(BenchError::other("gRPC call"))?;
                let dt = t.elapsed();
                if r.get_ref().data != data {
                    return Err(BenchError::Protocol("gRPC echo differs".into()));
                }
                if k >= warmup {
                    s.push(dt);
                }
            }
            Ok(s)
        });
        let _ = stop_tx.send(());
        r
    };
    run_pingpong(placement, client, server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{assert_refuses_bad_counts, assert_round_trips, assert_sane};

    #[test]
    fn grpc_unary_round_trips() {
        let _g = crate::net_test_lock();
        // Wait::Spin is accepted and behaves as Wait::Block.
        assert_round_trips(grpc_pingpong, &[32, 8192]);
    }

    #[test]
    fn grpc_empty_largest_and_pinned() {
        let _g = crate::net_test_lock();
        let s = grpc_pingpong(0, 50, 5, Wait::Block, Placement::UNPINNED).expect("0 B");
        assert_sane(&s, 50);
        // Exactly the limit: the codecs must allow for the protobuf framing.
        let s = grpc_pingpong(MAX_GRPC_PAYLOAD, 2, 0, Wait::Block, Placement::UNPINNED)
            .expect("largest");
        assert_sane(&s, 2);
        let p = Placement::spread().expect("spread");
        let s = grpc_pingpong(32, 200, 20, Wait::Block, p).expect("pinned");
        assert_sane(&s, 200);
    }

    #[test]
    fn grpc_refuses_bad_arguments() {
        assert_refuses_bad_counts(grpc_pingpong, MAX_GRPC_PAYLOAD + 1);
    }
}
