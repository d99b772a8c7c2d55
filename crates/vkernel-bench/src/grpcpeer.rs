//! gRPC unary echo through tonic (HTTP/2 over TCP on loopback): the peer a
//! user who wants RPC would pick. Server and client each run a
//! current-thread tokio runtime on their own (pinnable) thread.
//!
//! tonic always waits in tokio's epoll reactor: it cannot busy-poll, so the
//! [`Wait`] passed is recorded by the caller but both ends block.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::placement::run_pair;
use crate::{BenchError, Placement, Samples, Wait, RECV_TIMEOUT};

/// Code generated from `proto/echo.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("vkbench");
}

use pb::echo_client::EchoClient;
use pb::echo_server::{Echo, EchoServer};
use pb::Payload;

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

fn other(context: &'static str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Io {
        context,
        source: std::io::Error::other(e.to_string()),
    }
}

/// Round-trip times of unary gRPC calls carrying `size` bytes each way,
/// after `warmup` unrecorded calls; each call is bounded by
/// [`RECV_TIMEOUT`] and the echo is checked outside the timed span.
pub fn grpc_pingpong(
    size: usize,
    iters: usize,
    warmup: usize,
    _wait: Wait,
    placement: Placement,
) -> Result<Samples, BenchError> {
    let total = iters
        .checked_add(warmup)
        .ok_or_else(|| BenchError::InvalidArgument("iters + warmup overflows".into()))?;
    if size > 4 << 20 {
        return Err(BenchError::InvalidArgument(format!(
            "gRPC message of {size} bytes is over tonic's 4 MiB default limit"
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
                .add_service(EchoServer::new(Svc))
                .serve_with_incoming_shutdown(incoming, async {
                    // Bounded: the client ends the run, or 10 minutes pass.
                    let _ = tokio::time::timeout(Duration::from_secs(600), stop_rx).await;
                })
                .await
                .map_err(|e| other("gRPC server", e))
        })
    };
    let client = move || -> Result<Samples, BenchError> {
        let rt = runtime()?;
        let r = rt.block_on(async move {
            let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| other("gRPC endpoint", e))?
                .tcp_nodelay(true);
            let start = Instant::now();
            let channel = loop {
                match ep.connect().await {
                    Ok(c) => break c,
                    Err(_) if start.elapsed() < RECV_TIMEOUT => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(e) => return Err(other("gRPC connect", e)),
                }
            };
            let mut c = EchoClient::new(channel);
            let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
            let mut s = Samples::with_capacity(iters);
            for k in 0..total {
                let req = Payload { data: data.clone() };
                let t = Instant::now();
                let r = tokio::time::timeout(RECV_TIMEOUT, c.echo(req))
                    .await
                    .map_err(|_| BenchError::Timeout {
                        what: "gRPC call",
                        after: RECV_TIMEOUT,
                    })?
                    .map_err(|e| other("gRPC call", e))?;
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
    let (c, s) = run_pair(placement, client, server);
    let samples = c?;
    s?;
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_unary_round_trips() {
        let _g = crate::net_test_lock();
        for size in [32, 8192] {
            let s = grpc_pingpong(size, 200, 20, Wait::Block, Placement::UNPINNED).unwrap();
            assert_eq!(s.n(), 200);
            assert!(s.median().unwrap() > 0);
        }
        assert!(matches!(
            grpc_pingpong(5 << 20, 1, 0, Wait::Block, Placement::UNPINNED),
            Err(BenchError::InvalidArgument(_))
        ));
    }
}
