//! OTLP export from the command (feature `otel`): an echo host and a ping
//! run with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a minimal OTLP/HTTP
//! collector in this test, which must receive the client spans of the
//! ping and the server spans of the echo host.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;
use common::{listening_addr, wait_for, Proc, BIN};

/// Reads HTTP/1.1 requests on one connection and keeps their bodies.
fn serve(s: TcpStream, bodies: &Mutex<Vec<(String, Vec<u8>)>>) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    loop {
        let mut start = String::new();
        if r.read_line(&mut start)? == 0 {
            return Ok(());
        }
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            r.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; len.min(16 << 20)];
        r.read_exact(&mut body)?;
        bodies
            .lock()
            .unwrap()
            .push((start.trim_end().to_string(), body));
        w.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        )?;
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn spans_are_exported_by_otlp_http() {
    let l = TcpListener::bind("127.0.0.1:0").expect("listen");
    let endpoint = format!("http://{}", l.local_addr().expect("addr"));
    let bodies = Arc::new(Mutex::new(Vec::new()));
    {
        let bodies = bodies.clone();
        // Ends with the test process.
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let b = bodies.clone();
                std::thread::spawn(move || serve(s, &b));
            }
        });
    }
    let with_otel = |c: &mut Command| {
        c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_SERVICE_NAME");
    };
    let mut c = Command::new(BIN);
    c.args(["echo", "--bind", "127.0.0.1:0", "--exit-after", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    with_otel(&mut c);
    let mut echo = Proc(c.spawn().expect("spawn echo"));
    let mut line = String::new();
    BufReader::new(echo.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("banner");
    let addr = listening_addr(&line);

    let mut c = Command::new(BIN);
    c.args(["ping", "--peer", &addr, "-n", "3"]);
    with_otel(&mut c);
    let o = c.output().expect("ping");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    wait_for(
        Duration::from_secs(30),
        "the collector did not get both hosts' spans",
        || {
            let b = bodies.lock().unwrap();
            let all = |s: &str| b.iter().any(|(_, body)| contains(body, s));
            (all("vkernel.send") && all("vkernel.receive")).then_some(())
        },
    );
    let b = bodies.lock().unwrap();
    for (start, body) in b.iter() {
        assert!(start.starts_with("POST /v1/traces "), "{start}");
        if contains(body, "vkernel.send") {
            assert!(contains(body, "vkernel.seq") && contains(body, "vkernel.sender"));
            assert!(contains(body, "service.name") && contains(body, "vkernel"));
        }
    }
}
