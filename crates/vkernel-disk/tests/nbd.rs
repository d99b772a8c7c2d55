//! The NBD gateway: protocol conformance with a hand-written client, then
//! real clients (qemu-img, qemu-io, nbdinfo, nbdcopy, fio) against an
//! IPdisk on another logical host. Missing tools skip their test with a
//! message, unless VKERNEL_REQUIRE_NBD_TOOLS=1 (CI installs them).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkernel::{Kernel, KernelConfig};
use vkernel_disk::backing::{Backing, BackingSpec};
use vkernel_disk::client::Client;
use vkernel_disk::dvd::Dvd;
use vkernel_disk::nbd::{
    self, cmd, errno, opt, rep, BlockDev, Export, Gateway, ListenAddr, MemDev,
};
use vkernel_disk::server::{DiskServer, ServerConfig};

const KEY: u64 = 0xfeed;

/// A disk on host a, a gateway on host b (the client's side).
struct Rig {
    _a: Kernel,
    _b: Kernel,
    srv: DiskServer,
    gw: Gateway,
}

fn rig(bytes: u64, listen: ListenAddr, dvd: Option<&str>) -> Rig {
    let a = Kernel::start(KernelConfig::default()).unwrap();
    let b = Kernel::start(KernelConfig {
        peers: vec![a.local_addr()],
        ..Default::default()
    })
    .unwrap();
    a.add_peer(b.local_addr());
    let srv = DiskServer::start(
        &a,
        Backing::open(&BackingSpec::Ram(bytes)).unwrap(),
        ServerConfig {
            owner_key: Some(KEY),
            ..Default::default()
        },
    )
    .unwrap();
    let (id, key) = match dvd {
        Some(spec) => (srv.define_dvd(spec.parse::<Dvd>().unwrap()).unwrap(), 0),
        None => (0, KEY),
    };
    let c = Client::open(&b, srv.pid(), id, key, 32).unwrap();
    let gw = Gateway::start(
        &listen,
        vec![Export {
            name: "disk".into(),
            description: "test disk".into(),
            dev: Arc::new(c),
        }],
    )
    .unwrap();
    Rig {
        _a: a,
        _b: b,
        srv,
        gw,
    }
}

fn tcp_rig(bytes: u64) -> Rig {
    rig(bytes, "127.0.0.1:0".parse().unwrap(), None)
}

fn uri(r: &Rig) -> String {
    match r.gw.addr() {
        ListenAddr::Tcp(a) => format!("nbd://{a}/disk"),
        ListenAddr::Unix(p) => format!("nbd+unix:///disk?socket={}", p.display()),
    }
}

fn tcp_addr(r: &Rig) -> std::net::SocketAddr {
    match r.gw.addr() {
        ListenAddr::Tcp(a) => *a,
        ListenAddr::Unix(_) => panic!("not tcp"),
    }
}

// ------------------------------------------------------------ raw client

struct Raw {
    s: TcpStream,
}

impl Raw {
    fn connect(addr: std::net::SocketAddr, cflags: u32) -> Raw {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
        assert_eq!(&hello[8..16], b"IHAVEOPT");
        assert_eq!(
            u16::from_be_bytes([hello[16], hello[17]]) & 1,
            1,
            "fixed newstyle"
        );
        s.write_all(&cflags.to_be_bytes()).unwrap();
        Raw { s }
    }

    fn option(&mut self, o: u32, data: &[u8]) {
        let mut b = Vec::new();
        b.extend_from_slice(&nbd::IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&o.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    /// Reads one option reply: (option, type, data).
    fn reply(&mut self) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            nbd::REPLY_MAGIC
        );
        let n = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut d = vec![0u8; n];
        self.s.read_exact(&mut d).unwrap();
        (
            u32::from_be_bytes(h[8..12].try_into().unwrap()),
            u32::from_be_bytes(h[12..16].try_into().unwrap()),
            d,
        )
    }

    fn go(&mut self, name: &str, infos: &[u16]) -> (u64, u16) {
        self.option(opt::GO, &info_data(name, infos));
        let (mut size, mut flags) = (0, 0);
        loop {
            let (o, t, d) = self.reply();
            assert_eq!(o, opt::GO);
            match t {
                rep::INFO => {
                    if u16::from_be_bytes([d[0], d[1]]) == 0 {
                        size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                        flags = u16::from_be_bytes([d[10], d[11]]);
                    }
                }
                rep::ACK => return (size, flags),
                t => panic!("GO failed: {t:#x}"),
            }
        }
    }

    fn request(&mut self, ty: u16, flags: u16, cookie: u64, off: u64, len: u32, data: &[u8]) {
        let mut b = Vec::new();
        b.extend_from_slice(&nbd::REQUEST_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&ty.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&off.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    /// Reads a simple reply: (error, cookie).
    fn simple(&mut self) -> (u32, u64) {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(
            u32::from_be_bytes(h[..4].try_into().unwrap()),
            nbd::SIMPLE_REPLY_MAGIC
        );
        (
            u32::from_be_bytes(h[4..8].try_into().unwrap()),
            u64::from_be_bytes(h[8..16].try_into().unwrap()),
        )
    }

    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

#[test]
fn handshake_options_and_commands_follow_the_spec() {
    let r = tcp_rig(16 << 20);
    let addr = tcp_addr(&r);
    let mut c = Raw::connect(addr, 1);
    // Unknown options (STRUCTURED_REPLY, STARTTLS, 99): ERR_UNSUP, still in sync.
    for o in [8u32, 5, 99] {
        c.option(o, b"xyz");
        assert_eq!(c.reply(), (o, rep::ERR_UNSUP, vec![]));
    }
    // LIST: one SERVER reply then ACK; with data: ERR_INVALID.
    c.option(opt::LIST, &[]);
    let (_, t, d) = c.reply();
    assert_eq!(t, rep::SERVER);
    assert_eq!(&d[4..], b"disk");
    assert_eq!(c.reply().1, rep::ACK);
    c.option(opt::LIST, b"x");
    assert_eq!(c.reply().1, rep::ERR_INVALID);
    // INFO on an unknown export, a malformed INFO, then a good one with name and block size.
    c.option(opt::INFO, &info_data("nope", &[]));
    assert_eq!(c.reply().1, rep::ERR_UNKNOWN);
    c.option(opt::INFO, &[0, 0, 0, 9, b'a']);
    assert_eq!(c.reply().1, rep::ERR_INVALID);
    c.option(opt::INFO, &info_data("disk", &[1, 2, 3]));
    let mut seen = Vec::new();
    loop {
        let (_, t, d) = c.reply();
        if t == rep::ACK {
            break;
        }
        assert_eq!(t, rep::INFO);
        let ty = u16::from_be_bytes([d[0], d[1]]);
        if ty == 3 {
            assert_eq!(&d[2..6], &512u32.to_be_bytes());
            assert_eq!(&d[6..10], &4096u32.to_be_bytes());
            assert_eq!(&d[10..14], &(32u32 << 20).to_be_bytes());
        }
        if ty == 1 {
            assert_eq!(&d[2..], b"disk");
        }
        seen.push(ty);
    }
    seen.sort();
    assert_eq!(seen, vec![0, 1, 2, 3]);
    // GO on the default export "".
    let (size, flags) = c.go("", &[3]);
    assert_eq!(size, 16 << 20);
    for f in [
        nbd::tflag::HAS_FLAGS,
        nbd::tflag::SEND_FLUSH,
        nbd::tflag::SEND_FUA,
        nbd::tflag::SEND_TRIM,
        nbd::tflag::SEND_WRITE_ZEROES,
        nbd::tflag::CAN_MULTI_CONN,
    ] {
        assert_eq!(flags & f, f);
    }
    // WRITE (FUA), READ, pipelined with distinct cookies.
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    c.request(cmd::WRITE, cmd::FLAG_FUA, 1, 4096, 8192, &data);
    assert_eq!(c.simple(), (0, 1));
    for k in 0..4u64 {
        c.request(cmd::READ, 0, 10 + k, 4096 + k * 2048, 2048, &[]);
    }
    let mut got = std::collections::HashMap::new();
    for _ in 0..4 {
        let (e, ck) = c.simple();
        assert_eq!(e, 0);
        let mut d = vec![0u8; 2048];
        c.s.read_exact(&mut d).unwrap();
        got.insert(ck, d);
    }
    for k in 0..4u64 {
        assert_eq!(
            got[&(10 + k)],
            data[(k * 2048) as usize..((k + 1) * 2048) as usize]
        );
    }
    // FLUSH, TRIM, WRITE_ZEROES (NO_HOLE), then read zeros back.
    c.request(cmd::FLUSH, 0, 20, 0, 0, &[]);
    assert_eq!(c.simple(), (0, 20));
    c.request(cmd::TRIM, 0, 21, 4096, 4096, &[]);
    assert_eq!(c.simple(), (0, 21));
    c.request(
        cmd::WRITE_ZEROES,
        cmd::FLAG_NO_HOLE | cmd::FLAG_FUA,
        22,
        8192,
        4096,
        &[],
    );
    assert_eq!(c.simple(), (0, 22));
    c.request(cmd::READ, 0, 23, 4096, 8192, &[]);
    assert_eq!(c.simple(), (0, 23));
    let mut d = vec![1u8; 8192];
    c.s.read_exact(&mut d).unwrap();
    assert!(d.iter().all(|&x| x == 0));
    // Errors: unaligned, beyond the end, unknown command, bad flags.
    c.request(cmd::READ, 0, 30, 100, 512, &[]);
    assert_eq!(c.simple(), (errno::EINVAL, 30));
    c.request(cmd::READ, 0, 31, 16 << 20, 512, &[]);
    assert_eq!(
        c.simple(),
        (errno::EINVAL, 31),
        "the spec: a read past the end"
    );
    c.request(7, 0, 32, 0, 512, &[]);
    assert_eq!(c.simple(), (errno::EINVAL, 32));
    c.request(cmd::READ, cmd::FLAG_FUA, 33, 0, 512, &[]);
    assert_eq!(c.simple(), (errno::EINVAL, 33));
    c.request(cmd::WRITE, 0, 34, 1, 512, &[0u8; 512]);
    assert_eq!(
        c.simple(),
        (errno::EINVAL, 34),
        "payload consumed, still in sync"
    );
    c.request(cmd::READ, 0, 35, 0, 512, &[]);
    assert_eq!(c.simple(), (0, 35));
    let mut d = vec![0u8; 512];
    c.s.read_exact(&mut d).unwrap();
    // DISC: the server closes.
    c.request(cmd::DISC, 0, 40, 0, 0, &[]);
    assert!(c.closed());

    // EXPORT_NAME with NO_ZEROES: size + flags, no padding.
    let mut c = Raw::connect(addr, 3);
    c.option(opt::EXPORT_NAME, b"disk");
    let mut b = [0u8; 10];
    c.s.read_exact(&mut b).unwrap();
    assert_eq!(u64::from_be_bytes(b[..8].try_into().unwrap()), 16 << 20);
    c.request(cmd::READ, 0, 1, 4096, 512, &[]);
    assert_eq!(c.simple(), (0, 1), "no zero padding before the first reply");
    // Without NO_ZEROES: 124 zero bytes.
    let mut c = Raw::connect(addr, 1);
    c.option(opt::EXPORT_NAME, b"");
    let mut b = [1u8; 134];
    c.s.read_exact(&mut b).unwrap();
    assert!(b[10..].iter().all(|&x| x == 0));
    // ABORT: ACK and close.
    let mut c = Raw::connect(addr, 1);
    c.option(opt::ABORT, &[]);
    assert_eq!(c.reply().1, rep::ACK);
    assert!(c.closed());
}

#[test]
fn bad_clients_lose_their_connection_and_the_gateway_lives_on() {
    let r = tcp_rig(4 << 20);
    let addr = tcp_addr(&r);
    // Unknown client flags.
    let mut c = Raw::connect(addr, 0x80);
    assert!(c.closed());
    // Bad option magic.
    let mut c = Raw::connect(addr, 1);
    c.s.write_all(&[0xde; 16]).unwrap();
    assert!(c.closed());
    // Huge option length.
    let mut c = Raw::connect(addr, 1);
    c.s.write_all(&nbd::IHAVEOPT.to_be_bytes()).unwrap();
    c.s.write_all(&[0, 0, 0, 99, 0xff, 0xff, 0xff, 0xff])
        .unwrap();
    assert!(c.closed());
    // EXPORT_NAME of an unknown export.
    let mut c = Raw::connect(addr, 1);
    c.option(opt::EXPORT_NAME, b"nope");
    assert!(c.closed());
    // Bad request magic after GO.
    let mut c = Raw::connect(addr, 1);
    c.go("disk", &[]);
    c.s.write_all(&[0x11; 28]).unwrap();
    assert!(c.closed());
    // Oversized write payload.
    let mut c = Raw::connect(addr, 1);
    c.go("disk", &[]);
    c.request(cmd::WRITE, 0, 1, 0, u32::MAX, &[]);
    assert!(c.closed());
    // A client that vanishes mid-write and mid-handshake.
    let mut c = Raw::connect(addr, 1);
    c.go("disk", &[]);
    c.request(cmd::WRITE, 0, 1, 0, 4096, &[1, 2, 3]);
    drop(c);
    let s = TcpStream::connect(addr).unwrap();
    drop(s);
    // Random garbage on several connections.
    for seed in 0..8u8 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let junk: Vec<u8> = (0..2000u32)
            .map(|i| (i as u8).wrapping_mul(seed | 1) ^ seed)
            .collect();
        let _ = s.write_all(&junk);
    }
    // The gateway still serves a well-behaved client.
    let mut c = Raw::connect(addr, 1);
    c.go("disk", &[]);
    c.request(cmd::READ, 0, 9, 0, 4096, &[]);
    assert_eq!(c.simple(), (0, 9));
    let mut d = vec![0u8; 4096];
    c.s.read_exact(&mut d).unwrap();
    assert!(
        r.gw.stats()
            .errors
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 5
    );
}

#[test]
fn read_only_dvd_export_refuses_writes() {
    let r = rig(
        8 << 20,
        "127.0.0.1:0".parse().unwrap(),
        Some("base=1024,len=2048,ro,allow=any"),
    );
    let mut c = Raw::connect(tcp_addr(&r), 1);
    let (size, flags) = c.go("disk", &[3]);
    assert_eq!(size, 2048 * 512);
    assert_eq!(flags & nbd::tflag::READ_ONLY, nbd::tflag::READ_ONLY);
    c.request(cmd::WRITE, 0, 1, 0, 512, &[9u8; 512]);
    assert_eq!(c.simple(), (errno::EPERM, 1));
    c.request(cmd::READ, 0, 2, (2048 - 1) * 512, 512, &[]);
    assert_eq!(c.simple(), (0, 2));
}

#[test]
fn fuzz_entry_point_survives_streams() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    // A valid prefix (flags, GO) followed by random requests, and pure noise.
    let mut go = 1u32.to_be_bytes().to_vec();
    go.extend_from_slice(&nbd::IHAVEOPT.to_be_bytes());
    go.extend_from_slice(&opt::GO.to_be_bytes());
    let d = info_data("fuzz", &[3]);
    go.extend_from_slice(&(d.len() as u32).to_be_bytes());
    go.extend_from_slice(&d);
    for i in 0..300 {
        let n = rng.gen_range(0..600);
        let noise: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        vkernel_disk::fuzz_nbd(&noise);
        let mut s = go.clone();
        for _ in 0..rng.gen_range(0..8) {
            let mut req = nbd::REQUEST_MAGIC.to_be_bytes().to_vec();
            req.extend_from_slice(&rng.gen::<u16>().to_be_bytes().map(|b| b & 3));
            req.extend_from_slice(&(rng.gen_range(0..8u16)).to_be_bytes());
            req.extend_from_slice(&(i as u64).to_be_bytes());
            req.extend_from_slice(&(rng.gen_range(0..200u64) * 512).to_be_bytes());
            req.extend_from_slice(&(rng.gen_range(0..20u32) * 512).to_be_bytes());
            s.extend(req);
            s.extend((0..rng.gen_range(0..3000)).map(|_| rng.gen::<u8>()));
        }
        vkernel_disk::fuzz_nbd(&s);
    }
    // MemDev behaves as a device.
    let m = MemDev::new(4096, 512, false);
    m.write(512, &[1; 512], false).unwrap();
    let mut b = [0u8; 512];
    m.read(512, &mut b).unwrap();
    assert_eq!(b, [1; 512]);
    assert!(m.read(4000, &mut b).is_err());
}

// ------------------------------------------------------------ real clients

fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("VKERNEL_REQUIRE_NBD_TOOLS").as_deref() == Ok("1") {
            panic!("{tool} is required (VKERNEL_REQUIRE_NBD_TOOLS=1)");
        }
        eprintln!("SKIP: {tool} not installed");
    }
    ok
}

/// Runs a command with a deadline; kills it on timeout. Returns stdout.
fn run(args: &[&str], limit: Duration) -> String {
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut out = String::new();
            let mut err = String::new();
            if let Some(mut o) = child.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            assert!(st.success(), "{args:?} failed: {st}\n{out}\n{err}");
            return out;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} timed out after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vkdisk-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn qemu_img_and_qemu_io() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let r = tcp_rig(64 << 20);
    let u = uri(&r);
    let info = run(
        &["qemu-img", "info", "--output=json", &u],
        Duration::from_secs(30),
    );
    assert!(info.contains("\"virtual-size\": 67108864"), "{info}");
    let out = run(
        &[
            "qemu-io",
            "-f",
            "raw",
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "read -P 0xab 0 1M",
            "-c",
            "write -P 0xcd -f 3M 512k",
            "-c",
            "read -P 0xcd 3M 512k",
            "-c",
            "write -z 1M 1M",
            "-c",
            "read -P 0 1M 1M",
            "-c",
            "discard 5M 1M",
            "-c",
            "read -P 0 5M 1M",
            "-c",
            "flush",
            &u,
        ],
        Duration::from_secs(60),
    );
    assert!(!out.contains("Pattern verification failed"), "{out}");
    // Unaligned I/O: qemu does the read-modify-write for our 512-byte minimum.
    let out = run(
        &[
            "qemu-io",
            "-f",
            "raw",
            "-c",
            "write -P 0x11 100 10",
            "-c",
            "read -P 0x11 100 10",
            &u,
        ],
        Duration::from_secs(30),
    );
    assert!(!out.contains("Pattern verification failed"), "{out}");
    // qemu-img convert a 16 MiB image in and out, compare.
    let d = tmpdir("qemu");
    let src = d.join("src.img");
    let data: Vec<u8> = (0..16u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    run(
        &[
            "qemu-img",
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &u,
        ],
        Duration::from_secs(60),
    );
    let back = d.join("back.img");
    run(
        &[
            "qemu-img",
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &u,
            back.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let b = std::fs::read(&back).unwrap();
    assert_eq!(b.len(), 64 << 20);
    assert!(
        b[..data.len()] == data[..],
        "round trip through the gateway differs"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn nbdinfo_and_nbdcopy_over_tcp_and_unix() {
    if !have("nbdinfo") || !have("nbdcopy") {
        return;
    }
    let d = tmpdir("libnbd");
    let sock = d.join("gw.sock");
    for listen in [
        ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        ListenAddr::Unix(sock.clone()),
    ] {
        let r = rig(32 << 20, listen, None);
        let u = uri(&r);
        let list = run(&["nbdinfo", "--list", &u], Duration::from_secs(30));
        assert!(list.contains("export=\"disk\""), "{list}");
        assert!(list.contains("block_size_minimum: 512"), "{list}");
        let j = run(&["nbdinfo", "--json", &u], Duration::from_secs(30));
        assert!(j.contains("\"export-size\": 33554432"), "{j}");
        assert!(j.contains("\"can_multi_conn\": true"), "{j}");
        // nbdcopy in (4 connections, multi-conn) and out; compare.
        let src = d.join("src.img");
        let data: Vec<u8> = (0..32u32 << 20)
            .map(|i| (i.wrapping_mul(40503) >> 7) as u8)
            .collect();
        std::fs::write(&src, &data).unwrap();
        run(
            &[
                "nbdcopy",
                "--connections=4",
                "--requests=16",
                src.to_str().unwrap(),
                &u,
            ],
            Duration::from_secs(90),
        );
        let dst = d.join("dst.img");
        run(
            &["nbdcopy", &u, dst.to_str().unwrap()],
            Duration::from_secs(90),
        );
        assert!(
            std::fs::read(&dst).unwrap() == data,
            "nbdcopy round trip differs"
        );
        assert!(
            r.srv
                .stats()
                .bytes_written
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 32 << 20
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn fio_nbd_engine_verifies() {
    if !have("fio") {
        return;
    }
    let engines = Command::new("fio").arg("--enghelp").output().unwrap();
    if !String::from_utf8_lossy(&engines.stdout).contains("nbd") {
        eprintln!("SKIP: this fio has no nbd engine");
        return;
    }
    let r = tcp_rig(64 << 20);
    let u = uri(&r);
    let out = run(
        &[
            "fio",
            "--name=vk",
            "--ioengine=nbd",
            &format!("--uri={u}"),
            "--rw=randwrite",
            "--bs=4k",
            "--size=16M",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            // No verify-state file left in the working directory.
            "--verify_state_save=0",
            "--runtime=20",
            "--time_based=0",
            "--output-format=terse",
        ],
        Duration::from_secs(90),
    );
    assert!(!out.contains("verify:"), "fio verify failure: {out}");
}

/// The accept loop sleeps in poll until a client connects (no polling
/// interval for a client to wait out); stop() must still end it at once.
#[test]
fn an_idle_gateway_serves_at_once_and_stops_at_once() {
    let mut gw = Gateway::start(
        &ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        vec![Export {
            name: "m".into(),
            description: "memory".into(),
            dev: Arc::new(MemDev::new(1 << 20, 512, false)),
        }],
    )
    .unwrap();
    let addr = match gw.addr() {
        ListenAddr::Tcp(a) => *a,
        ListenAddr::Unix(_) => unreachable!(),
    };
    // Idle long enough for the accept thread to be asleep in poll.
    std::thread::sleep(Duration::from_millis(100));
    drop(Raw::connect(addr, 1));
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    gw.stop();
    // The loop's own poll timeout is 1 s: only the wake-up ends it sooner.
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "stop took {:?}",
        t.elapsed()
    );
    assert!(
        TcpStream::connect(addr).is_err(),
        "still listening after stop"
    );
}

/// Large requests (each alone in its batch) bring in the extra pumps:
/// pipelined 256 KiB writes and reads come back whole and right, and a
/// protocol error afterwards still ends the connection (parked and busy
/// pumps alike leave) rather than leaving it hanging.
#[test]
fn large_pipelined_requests_come_back_whole_and_the_connection_still_ends() {
    const K: usize = 256 << 10;
    let r = tcp_rig(8 << 20);
    let mut c = Raw::connect(tcp_addr(&r), 1);
    c.go("disk", &[]);
    let data: Vec<u8> = (0..8 * K as u32).map(|i| (i * 7 % 253) as u8).collect();
    for k in 0..8 {
        let part = &data[k * K..(k + 1) * K];
        c.request(
            cmd::WRITE,
            0,
            100 + k as u64,
            (k * K) as u64,
            K as u32,
            part,
        );
    }
    let mut done: Vec<u64> = (0..8)
        .map(|_| c.simple())
        .map(|(e, ck)| {
            assert_eq!(e, 0, "write {ck}");
            ck
        })
        .collect();
    done.sort();
    assert_eq!(done, (100..108).collect::<Vec<u64>>());
    for k in 0..8u64 {
        c.request(cmd::READ, 0, 200 + k, k * K as u64, K as u32, &[]);
    }
    let mut seen = Vec::new();
    for _ in 0..8 {
        let (e, ck) = c.simple();
        assert_eq!(e, 0, "read {ck}");
        let k = (ck - 200) as usize;
        let mut d = vec![0u8; K];
        c.s.read_exact(&mut d).unwrap();
        assert!(
            d == data[k * K..(k + 1) * K],
            "read {k} returned other bytes"
        );
        seen.push(k);
    }
    seen.sort();
    assert_eq!(seen, (0..8).collect::<Vec<usize>>());
    // A large READ, a small one (the extra pumps park again), then
    // garbage: the READs may still be answered, then the gateway closes
    // (end of stream, not the read timeout).
    c.request(cmd::READ, 0, 300, 0, K as u32, &[]);
    c.request(cmd::READ, 0, 301, 0, 4096, &[]);
    std::thread::sleep(Duration::from_millis(50));
    c.s.write_all(&[0x11; 28]).unwrap();
    c.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    let end = c.s.read_to_end(&mut rest);
    assert!(end.is_ok(), "connection left open: {end:?}");
}

/// One request's bytes (header and payload).
fn request_bytes(ty: u16, flags: u16, cookie: u64, off: u64, data_or_len: (&[u8], u32)) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&nbd::REQUEST_MAGIC.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&ty.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&off.to_be_bytes());
    b.extend_from_slice(&data_or_len.1.to_be_bytes());
    b.extend_from_slice(data_or_len.0);
    b
}

#[test]
fn contiguous_large_requests_are_merged_and_each_answered() {
    const K: usize = 256 << 10;
    const DISK: usize = 8 << 20;
    let r = tcp_rig(DISK as u64);
    let mut c = Raw::connect(tcp_addr(&r), 1);
    c.go("disk", &[]);
    let commands = || {
        r.srv
            .stats()
            .commands
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let data: Vec<u8> = (0..DISK as u32).map(|i| (i * 13 % 251) as u8).collect();
    // Twelve contiguous WRITEs sent at once, the last four with FUA (a run
    // never mixes the two), and three crossing the end of the disk (the
    // last is refused; the two before it still land).
    let mut out = Vec::new();
    for k in 0..12u64 {
        let at = k as usize * K;
        let fua = if k >= 8 { cmd::FLAG_FUA } else { 0 };
        out.extend(request_bytes(
            cmd::WRITE,
            fua,
            100 + k,
            at as u64,
            (&data[at..at + K], K as u32),
        ));
    }
    for k in 0..3u64 {
        let at = DISK - 2 * K + k as usize * K;
        let part = &data[(k as usize * K)..(k as usize + 1) * K];
        out.extend(request_bytes(
            cmd::WRITE,
            0,
            200 + k,
            at as u64,
            (part, K as u32),
        ));
    }
    let before = commands();
    let mut w = c.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&out).unwrap());
    let mut errs = std::collections::BTreeMap::new();
    for _ in 0..15 {
        let (e, ck) = c.simple();
        errs.insert(ck, e);
    }
    writer.join().unwrap();
    let wrote = commands() - before;
    eprintln!("{wrote} commands for 14 writes");
    for ck in (100..112).chain(200..202) {
        assert_eq!(errs[&ck], 0, "write {ck}");
    }
    assert_ne!(errs[&202], 0, "a write past the end is refused");
    // (The refused one never reaches the disk.)
    assert!(
        wrote < 14,
        "{wrote} commands for 14 contiguous writes: none merged"
    );
    // Eight contiguous READs sent in one write: two runs of four, each
    // one device read; then the two that landed near the end, and one past.
    let mut out = Vec::new();
    for k in 0..8u64 {
        out.extend(request_bytes(
            cmd::READ,
            0,
            300 + k,
            k * K as u64,
            (&[], K as u32),
        ));
    }
    let before = commands();
    c.s.write_all(&out).unwrap();
    let mut got = std::collections::BTreeMap::new();
    for _ in 0..8 {
        let (e, ck) = c.simple();
        assert_eq!(e, 0, "read {ck}");
        let mut d = vec![0u8; K];
        c.s.read_exact(&mut d).unwrap();
        got.insert(ck, d);
    }
    // Two runs when the pump finds all eight buffered (the usual case); a
    // pump that wakes between segments splits a run, so the bound is
    // loose. Without merging it is eight.
    let n = commands() - before;
    assert!(n <= 4, "eight reads in {n} device commands: merging failed");
    for k in 0..8usize {
        assert!(
            got[&(300 + k as u64)] == data[k * K..(k + 1) * K],
            "read {k}"
        );
    }
    let mut out = Vec::new();
    for k in 0..3u64 {
        let at = (DISK - 2 * K) as u64 + k * K as u64;
        out.extend(request_bytes(cmd::READ, 0, 400 + k, at, (&[], K as u32)));
    }
    c.s.write_all(&out).unwrap();
    for _ in 0..3 {
        let (e, ck) = c.simple();
        if ck == 402 {
            assert_ne!(e, 0, "a read past the end is refused");
            continue;
        }
        assert_eq!(e, 0, "read {ck}");
        let mut d = vec![0u8; K];
        c.s.read_exact(&mut d).unwrap();
        let k = (ck - 400) as usize;
        assert!(d == data[k * K..(k + 1) * K], "read {ck} near the end");
    }
}

#[test]
fn requests_larger_than_the_memory_budget_still_complete() {
    // A 1 MiB budget: a 4 MiB WRITE and 32 MiB READs, pipelined, each
    // take the whole budget alone and complete; the budget is never
    // exceeded.
    let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(64 << 20, 512, false));
    let gw = Gateway::start_with(
        &"127.0.0.1:0".parse().unwrap(),
        vec![Export {
            name: "m".into(),
            description: String::new(),
            dev,
        }],
        nbd::Limits {
            memory: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let ListenAddr::Tcp(addr) = *gw.addr() else {
        panic!("not tcp")
    };
    let mut c = Raw::connect(addr, 3);
    c.go("m", &[]);
    let data: Vec<u8> = (0..4 << 20).map(|i| (i % 253) as u8).collect();
    c.request(cmd::WRITE, 0, 1, 1 << 20, data.len() as u32, &data);
    for i in 0..3u64 {
        c.request(cmd::READ, 0, 10 + i, 0, 32 << 20, &[]);
    }
    let mut got = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (err, cookie) = c.simple();
        assert_eq!(err, 0, "request {cookie}");
        if cookie >= 10 {
            let mut d = vec![0u8; 32 << 20];
            c.s.read_exact(&mut d).unwrap();
            // The WRITE may or may not have landed first (replies and
            // execution may be out of order); either the data or zeros.
            let w = &d[1 << 20..5 << 20];
            assert!(w == &data[..] || w.iter().all(|&x| x == 0));
        }
        got.insert(cookie);
    }
    assert_eq!(got.into_iter().collect::<Vec<_>>(), vec![1, 10, 11, 12]);
    let s = gw.stats();
    let peak = s.memory_peak.load(std::sync::atomic::Ordering::Relaxed);
    assert!(peak <= 1 << 20, "budget exceeded: {peak}");
    assert!(s.memory_waits.load(std::sync::atomic::Ordering::Relaxed) > 0);
}
