//! An async echo server holding many clients on a two-thread tokio
//! runtime: every client is a V process with its own task, and so is the
//! server. With `--peer ADDR` the clients run on a second logical host
//! and reach the server over UDP.
//!
//! ```sh
//! cargo run --release -p vkernel --example async_echo -- --clients 1000 --rounds 20
//! ```

use std::time::Instant;

use vkernel::{AsyncProcess, Kernel, KernelConfig, Message, Pid};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse().unwrap_or_else(|_| {
                eprintln!("{name} takes a number, got {v:?}");
                std::process::exit(2)
            })
        })
        .unwrap_or(default)
}

/// Echoes word 1 plus one until it has served `n` requests.
async fn server(mut s: AsyncProcess, n: usize) {
    let mut m = Message::zero();
    for _ in 0..n {
        let Ok(i) = s.receive(&mut m).await else {
            return;
        };
        m.set_word(1, m.word(1) + 1);
        let _ = s.reply(&m, i.from).await;
    }
}

async fn client(mut c: AsyncProcess, to: Pid, rounds: usize) -> Result<(), String> {
    for r in 0..rounds as u32 {
        let mut m = Message::with_code(1);
        m.set_word(1, r);
        c.send(&mut m, to).await.map_err(|e| e.to_string())?;
        if m.word(1) != r + 1 {
            return Err(format!("round {r}: got {}", m.word(1)));
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("usage: async_echo [--clients N (1000)] [--rounds R (20)] [--remote]");
        println!("  N client processes, each with its own task, send R exchanges each to one");
        println!("  server process, all on a tokio runtime with 2 worker threads;");
        println!("  --remote puts the clients on a second logical host (UDP loopback).");
        return Ok(());
    }
    let (clients, rounds) = (arg("--clients", 1000), arg("--rounds", 20));
    let remote = std::env::args().any(|a| a == "--remote");
    let server_host = Kernel::start(KernelConfig::default())?;
    let client_host = if remote {
        Some(Kernel::start(KernelConfig {
            peers: vec![server_host.local_addr()],
            ..Default::default()
        })?)
    } else {
        None
    };
    let ch = client_host.as_ref().unwrap_or(&server_host);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let s = server_host.create_async_process()?;
    let spid = s.pid();
    let procs = (0..clients)
        .map(|_| ch.create_async_process())
        .collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    let failed = rt.block_on(async move {
        let srv = tokio::spawn(server(s, clients * rounds));
        let tasks: Vec<_> = procs
            .into_iter()
            .map(|c| tokio::spawn(client(c, spid, rounds)))
            .collect();
        let mut failed = 0;
        for t in tasks {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    eprintln!("client: {e}");
                    failed += 1;
                }
                Err(e) => {
                    eprintln!("client task: {e}");
                    failed += 1;
                }
            }
        }
        let _ = srv.await;
        failed
    });
    let dt = t.elapsed();
    let n = clients * rounds;
    println!(
        "{clients} clients x {rounds} rounds on 2 runtime threads ({}): {n} exchanges in {:.3} s, {:.0} exchanges/s, {failed} failed",
        if remote { "two hosts" } else { "one host" },
        dt.as_secs_f64(),
        n as f64 / dt.as_secs_f64()
    );
    let st = ch.stats();
    println!(
        "client host: {} datagrams out, {} in, {} retransmissions",
        st.tx.iter().sum::<u64>(),
        st.rx.iter().sum::<u64>(),
        st.retransmits
    );
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
