//! OpenTelemetry export of exchange spans (feature `otel`): an exchange
//! between two logical hosts gives a client span on the sender's host and
//! a server span on the receiver's, joined by the sender's pid and the
//! exchange's sequence number, for blocking and async senders alike; a
//! failed Send's span has an error status.
//! Spans are caught with the SDK's in-memory exporter.

use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use vkernel::{Kernel, KernelConfig, Message, Pid, Scope};

fn attr(s: &SpanData, key: &str) -> Option<Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

fn hex(p: Pid) -> Value {
    Value::from(format!("{:08x}", p.0))
}

/// `p` answers `n` messages with themselves, on a thread of its own.
fn echo(p: vkernel::Process, n: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut m = Message::zero();
        for _ in 0..n {
            let i = p.receive(&mut m).expect("receive");
            p.reply(&m, i.from).expect("reply");
        }
    })
}

#[test]
fn exchanges_between_two_hosts_become_spans() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());

    let a = Kernel::start(KernelConfig {
        otel: true,
        ..Default::default()
    })
    .expect("start a");
    let b = Kernel::start(KernelConfig {
        otel: true,
        peers: vec![a.local_addr()],
        ..Default::default()
    })
    .expect("start b");
    a.add_peer(b.local_addr());

    let server = b.create_process().expect("server");
    let spid = server.pid();
    server.set_pid(0x5eed, spid, Scope::Any);
    let t = std::thread::spawn(move || {
        let mut m = Message::zero();
        for _ in 0..3 {
            let i = server.receive(&mut m).expect("receive");
            m.set_word(1, m.word(1) + 1);
            server.reply(&m, i.from).expect("reply");
        }
    });
    let client = a.create_process().expect("client");
    let cpid = client.pid();
    assert_eq!(
        client.get_pid(0x5eed, Scope::Remote).expect("get_pid"),
        spid
    );
    for _ in 0..2 {
        let mut m = Message::with_code(1);
        client.send(&mut m, spid).expect("send");
        assert_eq!(m.word(1), 1);
    }
    // (ISSUE 49: a span exporter switched direct Sends off. They make
    // the same spans, keyed by the sequence number their RemoteSend
    // carries.)
    assert!(
        a.net_counters()
            .direct_sends
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2,
        "the Sends went directly"
    );
    // An async sender's exchange.
    let mut ac = a.create_async_process().expect("async client");
    let apid = ac.pid();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut m = Message::with_code(1);
        ac.send(&mut m, spid).await.expect("async send");
        assert_eq!(m.word(1), 1);
    });
    t.join().expect("server thread");
    // A Send to a process that does not exist fails: an error span.
    let gone = Pid::new(b.host_id(), 0x7777);
    let mut m = Message::with_code(1);
    assert!(client.send(&mut m, gone).is_err());

    // Threads of one host: exchanges through peer pages make spans too
    // (ISSUE 49: a span exporter switched peer pages off).
    let local = a.create_process().expect("local server");
    let lpid = local.pid();
    let rounds = 200;
    let t = echo(local, rounds);
    let lc = a.create_process().expect("local client");
    let lcpid = lc.pid();
    let before = a.peer_exchanges();
    for _ in 0..rounds {
        let mut m = Message::with_code(1);
        lc.send(&mut m, lpid).expect("local send");
    }
    t.join().expect("local server thread");
    let paged = a.peer_exchanges() - before;
    assert!(paged > 0, "no exchange went through the peer pages");

    // Attached programs of a machine host that exports spans: their
    // exchanges through peer pages, and their direct Sends to another
    // host, are reported to the host, which makes the same spans (ISSUE
    // 49: an exporter refused the direct path, and page exchanges made
    // none).
    let dir = std::env::temp_dir().join(format!("vk-otel-{}", std::process::id()));
    let sock = dir.join("host.sock");
    let srv = a.serve_attach(&sock, 0o600).expect("serve_attach");
    let prog = Kernel::attach(&sock).expect("attach");
    let aserver = prog.create_process().expect("attached server");
    let aspid = aserver.pid();
    let t = echo(aserver, rounds);
    let aclient = prog.create_process().expect("attached client");
    let acpid = aclient.pid();
    for _ in 0..rounds {
        let mut m = Message::with_code(1);
        aclient.send(&mut m, aspid).expect("attached send");
    }
    t.join().expect("attached server thread");
    let apaged = srv.peer_exchanges();
    assert!(
        apaged > 0,
        "no attached exchange went through the peer pages"
    );
    // A remote server on b, for the attached client's direct Sends.
    let rserver = b.create_process().expect("remote server");
    let rspid = rserver.pid();
    let t = echo(rserver, 2);
    let rc = prog.create_process().expect("attached remote client");
    let rcpid = rc.pid();
    for _ in 0..2 {
        let mut m = Message::with_code(1);
        rc.send(&mut m, rspid).expect("attached remote send");
    }
    t.join().expect("remote server thread");
    assert!(srv.direct_grants() > 0, "the attached client went directly");
    // (Their reports reach the host when the processes end.)
    drop((aclient, rc));

    provider.force_flush().expect("flush");
    let mut spans = exporter.get_finished_spans().expect("spans");
    let by = |spans: &[SpanData], name: &str, sender: Pid| -> Vec<i64> {
        let mut v: Vec<i64> = spans
            .iter()
            .filter(|s| s.name == name && attr(s, "vkernel.sender") == Some(hex(sender)))
            .map(|s| match attr(s, "vkernel.seq") {
                Some(Value::I64(v)) => v,
                _ => -1,
            })
            .collect();
        v.sort_unstable();
        v
    };
    let t0 = std::time::Instant::now();
    while by(&spans, "vkernel.send", rcpid).len() < 2 && t0.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        provider.force_flush().expect("flush");
        spans = exporter.get_finished_spans().expect("spans");
    }
    // Every attached Send has its client span, and so has every message
    // its server took; they are joined by sequence number.
    let (asend, arecv) = (
        by(&spans, "vkernel.send", acpid),
        by(&spans, "vkernel.receive", acpid),
    );
    assert_eq!(asend.len(), rounds, "every attached Send has a span");
    assert_eq!(asend, arecv, "and the receiver's span, joined");
    let paged_spans = spans
        .iter()
        .filter(|s| attr(s, "vkernel.sender") == Some(hex(acpid)))
        .filter(|s| attr(s, "vkernel.page") == Some(Value::Bool(true)))
        .count() as u64;
    assert_eq!(paged_spans, 2 * apaged, "two spans per paged exchange");
    let (rsend, rrecv) = (
        by(&spans, "vkernel.send", rcpid),
        by(&spans, "vkernel.receive", rcpid),
    );
    assert_eq!(rsend.len(), 2, "{spans:#?}");
    assert_eq!(rsend, rrecv, "direct spans share the RemoteSend's number");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);

    // Every local exchange has its two spans; those through the pages are
    // marked, and joined by the pages' sequence number.
    let local_of = |name: &str, page: bool| -> Vec<i64> {
        let mut v: Vec<i64> = spans
            .iter()
            .filter(|s| s.name == name && attr(s, "vkernel.sender") == Some(hex(lcpid)))
            .filter(|s| (attr(s, "vkernel.page") == Some(Value::Bool(true))) == page)
            .map(|s| match attr(s, "vkernel.seq") {
                Some(Value::I64(v)) => v,
                _ => -1,
            })
            .collect();
        v.sort_unstable();
        v
    };
    let (psend, precv) = (
        local_of("vkernel.send", true),
        local_of("vkernel.receive", true),
    );
    assert_eq!(
        psend.len() as u64,
        paged,
        "one send span per paged exchange"
    );
    assert_eq!(psend, precv, "paged spans are joined by sequence number");
    assert!(psend.iter().all(|&s| s > 0), "{psend:?}");
    let esend = local_of("vkernel.send", false);
    assert_eq!(
        esend.len() + psend.len(),
        rounds,
        "every local Send has a span"
    );
    let of = |name: &str, kind: SpanKind| -> Vec<&SpanData> {
        spans
            .iter()
            .filter(|s| s.name == name && s.span_kind == kind)
            .filter(|s| attr(s, "vkernel.sender") == Some(hex(cpid)))
            .collect()
    };
    let sends = of("vkernel.send", SpanKind::Client);
    let receives = of("vkernel.receive", SpanKind::Server);
    assert_eq!(sends.len(), 3, "{spans:#?}");
    assert_eq!(receives.len(), 2, "{spans:#?}");

    let ok: Vec<&&SpanData> = sends
        .iter()
        .filter(|s| attr(s, "vkernel.receiver") == Some(hex(spid)))
        .collect();
    assert_eq!(ok.len(), 2);
    let host = |k: &Kernel| Value::from(format!("{:04x}", k.host_id().0));
    for s in &ok {
        assert_eq!(s.status, Status::Unset);
        assert_eq!(attr(s, "vkernel.host"), Some(host(&a)));
        assert_eq!(attr(s, "vkernel.remote"), Some(Value::Bool(true)));
        assert!(s.end_time >= s.start_time);
        assert_eq!(s.instrumentation_scope.name(), vkernel::otel::SCOPE);
    }
    // Each exchange's two spans share its sequence number, which differs
    // between exchanges.
    let seq = |s: &SpanData| match attr(s, "vkernel.seq") {
        Some(Value::I64(v)) => v,
        other => panic!("no sequence number: {other:?} in {s:#?}"),
    };
    let mut client_seqs: Vec<i64> = ok.iter().map(|s| seq(s)).collect();
    let mut server_seqs: Vec<i64> = receives.iter().map(|s| seq(s)).collect();
    client_seqs.sort_unstable();
    server_seqs.sort_unstable();
    assert_eq!(client_seqs, server_seqs);
    assert_ne!(client_seqs[0], client_seqs[1]);
    for s in &receives {
        assert_eq!(attr(s, "vkernel.receiver"), Some(hex(spid)));
        assert_eq!(attr(s, "vkernel.host"), Some(host(&b)));
        assert_eq!(attr(s, "vkernel.remote"), Some(Value::Bool(true)));
    }
    let of_async = |name: &str| -> Vec<&SpanData> {
        spans
            .iter()
            .filter(|s| s.name == name && attr(s, "vkernel.sender") == Some(hex(apid)))
            .collect()
    };
    let (asend, arecv) = (of_async("vkernel.send"), of_async("vkernel.receive"));
    assert_eq!((asend.len(), arecv.len()), (1, 1), "{spans:#?}");
    assert_eq!(seq(asend[0]), seq(arecv[0]));
    assert_eq!(asend[0].status, Status::Unset);
    let failed: Vec<&&SpanData> = sends
        .iter()
        .filter(|s| attr(s, "vkernel.receiver") == Some(hex(gone)))
        .collect();
    assert_eq!(failed.len(), 1);
    assert!(
        matches!(failed[0].status, Status::Error { .. }),
        "{:?}",
        failed[0]
    );
    let _ = provider.shutdown();
}
