//! IPdisk end to end: a disk server on one logical host, clients on
//! another (loopback UDP), through the V kernel's Send/Receive/Reply,
//! Forward, MoveTo and MoveFrom.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use vkernel::{FaultConfig, Kernel, KernelConfig, Message, Pid, Segment};
use vkernel_disk::backing::{Backing, BackingSpec};
use vkernel_disk::client::{Client, ClientError, Data};
use vkernel_disk::dvd::{Dvd, Principal};
use vkernel_disk::msg::{self, Response};
use vkernel_disk::scsi::{self, asc, key};
use vkernel_disk::server::{DiskServer, ServerConfig};

const OWNER_KEY: u64 = 0x0123_4567_89ab_cdef;

fn two_hosts_with(faults: FaultConfig) -> (Kernel, Kernel) {
    let a = Kernel::start(KernelConfig {
        faults: faults.clone(),
        ..Default::default()
    })
    .expect("start a");
    let b = Kernel::start(KernelConfig {
        peers: vec![a.local_addr()],
        faults: FaultConfig {
            seed: faults.seed.wrapping_add(1),
            ..faults
        },
        ..Default::default()
    })
    .expect("start b");
    a.add_peer(b.local_addr());
    assert_ne!(a.host_id(), b.host_id());
    (a, b)
}

fn two_hosts() -> (Kernel, Kernel) {
    two_hosts_with(FaultConfig::default())
}

fn ram_server(k: &Kernel, bytes: u64) -> DiskServer {
    let store = Backing::open(&BackingSpec::Ram(bytes)).expect("ram");
    DiskServer::start(
        k,
        store,
        ServerConfig {
            owner_key: Some(OWNER_KEY),
            workers: 8,
            ..ServerConfig::default()
        },
    )
    .expect("server")
}

/// FNV-1a 64 over a buffer (integrity by hashing).
fn hash(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen()).collect()
}

fn assert_sense(e: ClientError, k: u8, code: (u8, u8)) {
    match e {
        ClientError::Check(s) => assert_eq!((s.key, (s.asc, s.ascq)), (k, code), "{s}"),
        other => panic!("expected CHECK CONDITION, got {other}"),
    }
}

#[test]
fn every_command_through_the_network() {
    let (a, b) = two_hosts();
    let srv = ram_server(&a, 16 << 20);
    let c = Client::open(&b, srv.pid(), 0, OWNER_KEY, 4).expect("open");
    assert_eq!(c.geometry().blocks, 32768);
    assert!(c.geometry().owner);
    // TEST UNIT READY
    c.command(&[0, 0, 0, 0, 0, 0], Data::None).unwrap();
    // INQUIRY standard + VPD pages.
    let (v, p, r) = c.inquiry().unwrap();
    assert_eq!(
        (v.as_str(), p.as_str(), r.as_str()),
        ("VKERNEL", "IPDISK", "0001")
    );
    assert_eq!(c.serial().unwrap(), "VK0000000001");
    for page in [0x00u8, 0x80, 0x83, 0xb0, 0xb2] {
        let mut d = [0u8; 255];
        let done = c
            .command(&scsi::cdb_inquiry(Some(page), 255), Data::In(&mut d))
            .unwrap();
        assert_eq!(d[1], page);
        assert!(done.transferred >= 4);
    }
    // READ CAPACITY 10 and 16.
    let mut cap = [0u8; 8];
    c.command(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], Data::In(&mut cap))
        .unwrap();
    assert_eq!(u32::from_be_bytes(cap[0..4].try_into().unwrap()), 32767);
    assert_eq!(c.capacity().unwrap(), (32768, 512));
    // MODE SENSE 6/10, REQUEST SENSE, REPORT LUNS.
    let mut ms = [0u8; 64];
    let d = c
        .command(&[0x1a, 0, 0x3f, 0, 64, 0], Data::In(&mut ms))
        .unwrap();
    assert_eq!(ms[0] as usize + 1, d.transferred);
    c.command(&[0x5a, 0, 0x08, 0, 0, 0, 0, 0, 64, 0], Data::In(&mut ms))
        .unwrap();
    let mut rs = [0u8; 18];
    c.command(&[0x03, 0, 0, 0, 18, 0], Data::In(&mut rs))
        .unwrap();
    assert_eq!(rs[0], 0x70);
    let mut luns = [0u8; 16];
    c.command(
        &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0],
        Data::In(&mut luns),
    )
    .unwrap();
    assert_eq!(luns[3], 8);
    // READ/WRITE 6, 10, 16 (FUA) of the same blocks.
    let data = pattern(4096, 1);
    c.command(&[0x0a, 0, 0, 8, 8, 0], Data::Out(&data)).unwrap();
    let mut back = vec![0u8; 4096];
    c.command(&[0x28, 0, 0, 0, 0, 8, 0, 0, 8, 0], Data::In(&mut back))
        .unwrap();
    assert_eq!(back, data);
    let data2 = pattern(4096, 2);
    c.command(&[0x2a, 0x08, 0, 0, 0, 8, 0, 0, 8, 0], Data::Out(&data2))
        .unwrap();
    c.command(&[0x08, 0, 0, 8, 8, 0], Data::In(&mut back))
        .unwrap();
    assert_eq!(back, data2);
    c.command(&scsi::cdb_rw16(true, 8, 8, true), Data::Out(&data))
        .unwrap();
    c.command(&scsi::cdb_rw16(false, 8, 8, false), Data::In(&mut back))
        .unwrap();
    assert_eq!(back, data);
    // SYNCHRONIZE CACHE 10/16.
    c.command(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], Data::None)
        .unwrap();
    c.flush().unwrap();
    // UNMAP and WRITE SAME(16) read back as zeros; WRITE SAME with data repeats it.
    c.unmap(8 * 512, 4 * 512).unwrap();
    c.read(8 * 512, &mut back).unwrap();
    assert!(back[..2048].iter().all(|&x| x == 0));
    assert_eq!(&back[2048..], &data[2048..]);
    c.write_zeroes(8 * 512, 4096, false).unwrap();
    c.read(8 * 512, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 0));
    let block = pattern(512, 9);
    c.command(
        &scsi::cdb_write_same16(100, 5, false, false),
        Data::Out(&block),
    )
    .unwrap();
    let mut five = vec![0u8; 5 * 512];
    c.read(100 * 512, &mut five).unwrap();
    for k in 0..5 {
        assert_eq!(&five[k * 512..(k + 1) * 512], &block[..]);
    }
    // Errors with the right sense.
    assert_sense(
        c.command(&[0xc1, 0, 0, 0, 0, 0, 0, 0, 0, 0], Data::None)
            .unwrap_err(),
        key::ILLEGAL_REQUEST,
        asc::INVALID_OPCODE,
    );
    assert_sense(
        c.command(&scsi::cdb_rw16(false, 32767, 2, false), Data::In(&mut back))
            .unwrap_err(),
        key::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    assert_sense(
        c.command(&[0x12, 0, 0x42, 0, 36, 0], Data::In(&mut back))
            .unwrap_err(),
        key::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // A data-out command without its data is refused before execution.
    assert!(matches!(
        c.command(&scsi::cdb_rw16(true, 0, 8, false), Data::None),
        Err(ClientError::Refused(Response::Malformed))
    ));
    let st = srv.stats();
    assert!(
        st.check_conditions
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 3
    );
}

#[test]
fn large_transfers_use_bulk_moves_and_hash_equal() {
    let (a, b) = two_hosts();
    let srv = ram_server(&a, 64 << 20);
    let c = Client::open(&b, srv.pid(), 0, OWNER_KEY, 4).unwrap();
    // 20 MiB: split into 8 MiB commands, each moved by MoveFrom / MoveTo.
    let data = pattern(20 << 20, 3);
    c.write(1 << 20, &data, false).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(1 << 20, &mut back).unwrap();
    assert_eq!(hash(&back), hash(&data));
    // Unaligned requests are refused on the client side.
    assert!(matches!(
        c.read(100, &mut back[..512]),
        Err(ClientError::Invalid(_))
    ));
}

/// Many commands in flight from many threads, checked against a reference
/// model of the disk (seeded random reads and writes of random sizes).
#[test]
fn random_io_in_flight_matches_a_reference_model() {
    let (a, b) = two_hosts();
    let blocks = 8192u64;
    let srv = ram_server(&a, blocks * 512);
    let c = Arc::new(Client::open(&b, srv.pid(), 0, OWNER_KEY, 16).unwrap());
    // Each thread owns a disjoint region so the model is exact.
    let threads = 8u64;
    let per = blocks / threads;
    let deadline = Instant::now() + Duration::from_secs(60);
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(1000 + t);
                let base = t * per;
                let mut model = vec![0u8; (per * 512) as usize];
                for i in 0..150 {
                    assert!(Instant::now() < deadline, "test took too long");
                    let lba = rng.gen_range(0..per);
                    let n = rng.gen_range(1..=(per - lba).min(300));
                    let off = (lba * 512) as usize;
                    let len = (n * 512) as usize;
                    if rng.gen_bool(0.5) {
                        let d = pattern(len, t * 100_000 + i);
                        c.write((base + lba) * 512, &d, rng.gen_bool(0.1)).unwrap();
                        model[off..off + len].copy_from_slice(&d);
                    } else {
                        let mut d = vec![0u8; len];
                        c.read((base + lba) * 512, &mut d).unwrap();
                        assert_eq!(hash(&d), hash(&model[off..off + len]), "thread {t} op {i}");
                    }
                }
                let mut all = vec![0u8; model.len()];
                c.read(base * 512, &mut all).unwrap();
                assert_eq!(hash(&all), hash(&model));
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// Commands really overlap: 16 slow-ish commands finish in less time than
/// one worker would need for them in sequence, and all are correct.
#[test]
fn several_commands_are_in_flight_at_once() {
    let (a, b) = two_hosts();
    let srv = ram_server(&a, 64 << 20);
    let c = Arc::new(Client::open(&b, srv.pid(), 0, OWNER_KEY, 16).unwrap());
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hs: Vec<_> = (0..16u64)
        .map(|t| {
            let (c, f, pk) = (c.clone(), in_flight.clone(), peak.clone());
            std::thread::spawn(move || {
                let d = pattern(2 << 20, t);
                for _ in 0..3 {
                    let now = f.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    pk.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    c.write(t * (4 << 20), &d, false).unwrap();
                    f.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }
                let mut back = vec![0u8; d.len()];
                c.read(t * (4 << 20), &mut back).unwrap();
                assert_eq!(hash(&back), hash(&d));
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert!(peak.load(std::sync::atomic::Ordering::SeqCst) > 1);
    // The server really executed several commands at once (tagged queueing).
    let busy = srv
        .stats()
        .peak_busy
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(busy > 1, "peak busy workers {busy}");
    let w = srv
        .stats()
        .bytes_written
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(w, 16 * 3 * (2 << 20));
}

#[test]
fn dvds_confine_clients_and_are_enforced_at_run_time() {
    let (a, b) = two_hosts();
    let srv = ram_server(&a, 8 << 20); // 16384 blocks
    let owner = Client::open(&b, srv.pid(), 0, OWNER_KEY, 2).unwrap();
    // Fill the device with a known pattern.
    let all = pattern(8 << 20, 11);
    owner.write(0, &all, false).unwrap();
    // Without the owner key, DVD 0 is refused.
    assert!(matches!(
        Client::open(&b, srv.pid(), 0, 0, 1),
        Err(ClientError::Refused(Response::Denied))
    ));
    assert!(matches!(
        Client::open(&b, srv.pid(), 0, OWNER_KEY ^ 1, 1),
        Err(ClientError::Refused(Response::Denied))
    ));
    // The owner defines a read-only DVD for host b, and a read-write one by key.
    let ro = owner
        .set_dvd(&Dvd {
            id: 0,
            base: 1000,
            blocks: 100,
            writable: false,
            allow: vec![Principal::Host(b.host_id().0)],
        })
        .unwrap();
    let rw = owner
        .set_dvd(&"base=4000,len=200,rw,allow=key:0x5555".parse().unwrap())
        .unwrap();
    let other = owner
        .set_dvd(&"base=0,len=10,rw,allow=host:0x7ffe".parse().unwrap())
        .unwrap();
    let listed = owner.list_dvds().unwrap();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[0].id, ro);
    assert_eq!(listed[1].allow, vec![Principal::Key(0x5555)]);

    // A client of the ro DVD sees only its 100 blocks, starting at 1000.
    let c = Client::open(&b, srv.pid(), ro, 0, 2).unwrap();
    assert_eq!(c.capacity().unwrap(), (100, 512));
    assert!(c.geometry().read_only);
    let mut got = vec![0u8; 100 * 512];
    c.read(0, &mut got).unwrap();
    assert_eq!(got, all[1000 * 512..1100 * 512]);
    assert_sense(
        c.command(
            &scsi::cdb_rw16(false, 99, 2, false),
            Data::In(&mut got[..1024]),
        )
        .unwrap_err(),
        key::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    // Writes to a read-only DVD: DATA PROTECT / WRITE PROTECTED.
    assert_sense(
        c.write(0, &[1u8; 512], false).unwrap_err(),
        key::DATA_PROTECT,
        asc::WRITE_PROTECTED,
    );
    assert_sense(
        c.write_zeroes(0, 512, true).unwrap_err(),
        key::DATA_PROTECT,
        asc::WRITE_PROTECTED,
    );
    // MODE SENSE reports write protection.
    let mut ms = [0u8; 4];
    c.command(&[0x1a, 0x08, 0x08, 0, 4, 0], Data::In(&mut ms))
        .unwrap();
    assert_eq!(ms[2] & 0x80, 0x80);
    // Management is the owner's.
    assert!(matches!(
        c.revoke_dvd(ro),
        Err(ClientError::Refused(Response::Denied))
    ));
    // Unauthorised: wrong host, no key.
    assert!(matches!(
        Client::open(&b, srv.pid(), other, 0, 1),
        Err(ClientError::Refused(Response::Denied))
    ));
    assert!(matches!(
        Client::open(&b, srv.pid(), rw, 0x5554, 1),
        Err(ClientError::Refused(Response::Denied))
    ));
    // The keyed DVD is writable and confined.
    let k = Client::open(&b, srv.pid(), rw, 0x5555, 2).unwrap();
    k.write(0, &[0xeeu8; 1024], true).unwrap();
    let mut dev = vec![0u8; 1024];
    owner.read(4000 * 512, &mut dev).unwrap();
    assert!(dev.iter().all(|&x| x == 0xee));
    assert_sense(
        k.write(200 * 512, &[1u8; 512], false).unwrap_err(),
        key::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );

    // Change at run time: the ro DVD becomes rw, the open client sees it.
    let mut d = owner.list_dvds().unwrap().remove(0);
    d.writable = true;
    owner.set_dvd(&d).unwrap();
    c.write(0, &[0x77u8; 512], false).unwrap();
    owner.read(1000 * 512, &mut dev[..512]).unwrap();
    assert!(dev[..512].iter().all(|&x| x == 0x77));
    // Revoke at run time: the open client's next command is refused.
    owner.revoke_dvd(ro).unwrap();
    assert!(matches!(
        c.read(0, &mut got[..512]),
        Err(ClientError::Refused(Response::NoSuchDvd))
    ));
    assert!(matches!(
        owner.revoke_dvd(ro),
        Err(ClientError::Refused(Response::NoSuchDvd))
    ));
    assert_eq!(owner.list_dvds().unwrap().len(), 2);
    // A handle is bound to its host: another host cannot use it.
    let stranger = a.create_process().unwrap();
    let mut m = msg::scsi_request(&[0, 0, 0, 0, 0, 0], 0xdead_beef);
    stranger.send(&mut m, srv.pid()).unwrap();
    assert_eq!(msg::split_word0(m.0[0]).0, Response::BadHandle);
    // Unknown request codes are refused, not crashed on.
    let mut m = Message::with_code(0x77);
    let mut junk = [0u8; 100];
    stranger
        .send_with_segment(&mut m, srv.pid(), Segment::ReadWrite(&mut junk))
        .unwrap();
    assert_eq!(msg::split_word0(m.0[0]).0, Response::Malformed);
}

#[test]
fn file_backing_survives_a_server_restart_after_sync() {
    let dir = std::env::temp_dir().join(format!("vkdisk-dur-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("disk.img");
    let _ = std::fs::remove_file(&path);
    let data = pattern(1 << 20, 5);
    let fua = pattern(4096, 6);
    {
        let (a, b) = two_hosts();
        let store = Backing::open(&BackingSpec::File(path.clone(), Some(4 << 20))).unwrap();
        let srv = DiskServer::start(
            &a,
            store,
            ServerConfig {
                owner_key: Some(OWNER_KEY),
                ..ServerConfig::default()
            },
        )
        .unwrap();
        let c = Client::open(&b, srv.pid(), 0, OWNER_KEY, 2).unwrap();
        c.write(512 * 10, &data, false).unwrap();
        c.flush().unwrap();
        c.write(3 << 20, &fua, true).unwrap();
        assert!(srv.stats().syncs.load(std::sync::atomic::Ordering::Relaxed) >= 2);
        // Both hosts shut down here: the server is gone.
    }
    // Reopen the file directly and through a new server.
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(hash(&raw[5120..5120 + data.len()]), hash(&data));
    let (a, b) = two_hosts();
    let store = Backing::open(&BackingSpec::File(path.clone(), None)).unwrap();
    let srv = DiskServer::start(
        &a,
        store,
        ServerConfig {
            owner_key: Some(OWNER_KEY),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let c = Client::open(&b, srv.pid(), 0, OWNER_KEY, 2).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(512 * 10, &mut back).unwrap();
    assert_eq!(back, data);
    let mut back = vec![0u8; 4096];
    c.read(3 << 20, &mut back).unwrap();
    assert_eq!(back, fua);
    drop(c);
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Packet loss, duplication and reordering between client and disk: no
/// corruption; every operation either succeeds with the right data or
/// fails with a clear error.
#[test]
fn lossy_network_gives_no_corruption() {
    let faults = FaultConfig {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.02,
        seed: 42,
        ..FaultConfig::default()
    };
    let (a, b) = two_hosts_with(faults);
    let srv = ram_server(&a, 8 << 20);
    let c = Arc::new(Client::open(&b, srv.pid(), 0, OWNER_KEY, 8).unwrap());
    let deadline = Instant::now() + Duration::from_secs(90);
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                for i in 0..25 {
                    if Instant::now() > deadline {
                        break;
                    }
                    let len = 512 * rng.gen_range(1..=512usize);
                    let off = t * (2 << 20);
                    let d = pattern(len, t * 1000 + i);
                    match c.write(off, &d, false) {
                        Ok(()) => {}
                        Err(ClientError::Ipc(e)) => {
                            eprintln!("write failed clearly: {e}");
                            continue;
                        }
                        Err(e) => panic!("unexpected error {e}"),
                    }
                    let mut back = vec![0u8; len];
                    match c.read(off, &mut back) {
                        Ok(()) => assert_eq!(hash(&back), hash(&d), "corruption"),
                        Err(ClientError::Ipc(e)) => eprintln!("read failed clearly: {e}"),
                        Err(e) => panic!("unexpected error {e}"),
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    // Large READs sent their data ahead of the reply; some lost a piece
    // and were run again with the data moved (docs/PROTOCOL.md §3a).
    let missing = b.stats().drops_of(vkernel::DropReason::ReplyDataMissing);
    assert!(
        missing > 0,
        "no READ data sent ahead went missing at 5 % loss"
    );
}

/// The server's dispatcher and workers also serve a client on the same
/// logical host (local IPC path), and an unknown pid fails cleanly.
#[test]
fn local_client_and_missing_server() {
    let (a, _b) = two_hosts();
    let srv = ram_server(&a, 1 << 20);
    let c = Client::open(&a, srv.pid(), 0, OWNER_KEY, 2).unwrap();
    let d = pattern(200 * 512, 8);
    c.write(0, &d, false).unwrap();
    let mut back = vec![0u8; d.len()];
    c.read(0, &mut back).unwrap();
    assert_eq!(back, d);
    let ghost = Pid::new(a.host_id(), 0x7777);
    assert!(matches!(
        Client::open(&a, ghost, 0, OWNER_KEY, 1),
        Err(ClientError::Ipc(_))
    ));
}

/// Late and lost replies make the kernel re-execute idempotent READs while
/// the single worker is busy, so requests queue at the dispatcher; a new
/// request from the same pid must supersede its queued stale one (else a
/// stale CDB is paired with the new exchange: misdirected data).
#[test]
fn queued_requests_survive_retransmission_and_re_execution() {
    let faults = FaultConfig {
        loss: 0.01,
        delay_rate: 0.03,
        delay: Duration::from_millis(30),
        seed: 9,
        ..FaultConfig::default()
    };
    let (a, b) = two_hosts_with(faults);
    let store = Backing::open(&BackingSpec::Ram(8 << 20)).unwrap();
    let srv = DiskServer::start(
        &a,
        store,
        ServerConfig {
            owner_key: Some(OWNER_KEY),
            workers: 1,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let c = Arc::new(Client::open(&b, srv.pid(), 0, OWNER_KEY, 16).unwrap());
    // Every block holds its own LBA: any misdirected read is visible.
    let mut img = vec![0u8; 8 << 20];
    for (lba, blk) in img.chunks_mut(512).enumerate() {
        blk[..8].copy_from_slice(&(lba as u64).to_be_bytes());
    }
    c.write(0, &img, false).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let hs: Vec<_> = (0..16u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(77 + t);
                let mut checked = 0;
                while checked < 150 && Instant::now() < deadline {
                    let lba = rng.gen_range(0..16384u64);
                    let mut b = [0u8; 512];
                    match c.read(lba * 512, &mut b) {
                        Ok(()) => {
                            let got = u64::from_be_bytes(b[..8].try_into().unwrap());
                            assert_eq!(got, lba, "read of block {lba} returned block {got}");
                            checked += 1;
                        }
                        Err(ClientError::Ipc(e)) => eprintln!("clear failure: {e}"),
                        Err(e) => panic!("unexpected error {e}"),
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// A DVD that names a V principal: a client running as that principal
/// (on another host) opens it; the same host's other principals cannot.
#[test]
fn dvds_admit_v_principals() {
    let (a, b) = two_hosts();
    let srv = ram_server(&a, 1 << 20);
    let id = srv
        .define_dvd(Dvd {
            id: 0,
            base: 16,
            blocks: 64,
            writable: true,
            allow: vec![Principal::User(500)],
        })
        .unwrap();
    let c = Client::open_as(&b, srv.pid(), id, 0, 4, 500).unwrap();
    assert_eq!(c.geometry().blocks, 64);
    c.write(0, &[9u8; 512], true).unwrap();
    let mut back = [0u8; 512];
    c.read(0, &mut back).unwrap();
    assert_eq!(back, [9u8; 512]);
    for principal in [0, 501] {
        match Client::open_as(&b, srv.pid(), id, 0, 1, principal) {
            Err(ClientError::Refused(Response::Denied)) => {}
            other => panic!("principal {principal}: {other:?}"),
        }
    }
}

#[test]
fn batches_run_in_order_with_a_result_per_command() {
    use vkernel_disk::client::BatchIo;
    let (a, b) = two_hosts();
    let srv = ram_server(&a, 4 << 20);
    let owner = Client::open(&b, srv.pid(), 0, OWNER_KEY, 2).unwrap();
    let all = pattern(4 << 20, 21);
    owner.write(0, &all, false).unwrap();
    let before = srv
        .stats()
        .commands
        .load(std::sync::atomic::Ordering::Relaxed);
    // Writes then reads of the same blocks in one batch: the reads see the
    // writes (in order); an unaligned command fails alone.
    let w1 = pattern(4096, 1);
    let w2 = pattern(8192, 2);
    let (mut r1, mut r2, mut r3, mut bad) = (
        vec![0u8; 4096],
        vec![0u8; 8192],
        vec![0u8; 512],
        vec![0u8; 100],
    );
    let mut ios = vec![
        (8192, BatchIo::Write(&w1, false)),
        (1 << 20, BatchIo::Write(&w2, true)),
        (8192, BatchIo::Read(&mut r1)),
        (1 << 20, BatchIo::Read(&mut r2)),
        (0, BatchIo::Read(&mut bad)),
        (3 << 20, BatchIo::Read(&mut r3)),
    ];
    let res = owner.batch(&mut ios).unwrap();
    drop(ios);
    assert_eq!(res.len(), 6);
    assert!(
        res.iter().enumerate().all(|(i, r)| (i == 4) == r.is_err()),
        "{res:?}"
    );
    assert!(matches!(res[4], Err(ClientError::Invalid(_))));
    assert_eq!(r1, w1);
    assert_eq!(r2, w2);
    assert_eq!(r3, all[3 << 20..(3 << 20) + 512]);
    let after = srv
        .stats()
        .commands
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        after - before,
        6,
        "one SCSI command per entry (the bad one as TEST UNIT READY)"
    );
    let mut dev = vec![0u8; 8192];
    owner.read(1 << 20, &mut dev).unwrap();
    assert_eq!(dev, w2);

    // Through a read-only DVD: each write gets DATA PROTECT, each read past
    // the DVD gets LBA OUT OF RANGE, and the rest complete.
    let ro = owner
        .set_dvd(&Dvd {
            id: 0,
            base: 16,
            blocks: 32,
            writable: false,
            allow: vec![Principal::Host(b.host_id().0)],
        })
        .unwrap();
    let c = Client::open(&b, srv.pid(), ro, 0, 2).unwrap();
    let mut ok = vec![0u8; 1024];
    let mut past = vec![0u8; 1024];
    let data = [7u8; 512];
    let mut ios = vec![
        (0, BatchIo::Read(&mut ok)),
        (0, BatchIo::Write(&data, false)),
        (31 * 512, BatchIo::Read(&mut past)),
    ];
    let res = c.batch(&mut ios).unwrap();
    drop(ios);
    assert!(res[0].is_ok());
    assert_eq!(ok, dev_at(&owner, 16 * 512, 1024));
    let mut res = res.into_iter();
    res.next();
    assert_sense(
        res.next().unwrap().unwrap_err(),
        key::DATA_PROTECT,
        asc::WRITE_PROTECTED,
    );
    assert_sense(
        res.next().unwrap().unwrap_err(),
        key::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    // Nothing was written through the read-only DVD.
    assert_eq!(dev_at(&owner, 16 * 512, 512), w1[..512]); // block 16 = 8192, written above

    // A batch larger than one exchange is split and still in order.
    let many: Vec<Vec<u8>> = (0..150).map(|i| pattern(512, 100 + i)).collect();
    let mut ios: Vec<(u64, BatchIo<'_>)> = many
        .iter()
        .enumerate()
        .map(|(i, d)| ((i as u64) * 512, BatchIo::Write(d, false)))
        .collect();
    assert!(owner.batch(&mut ios).unwrap().iter().all(|r| r.is_ok()));
    let back = dev_at(&owner, 0, 150 * 512);
    assert_eq!(back, many.concat());
}

fn dev_at(c: &Client, off: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    c.read(off, &mut v).unwrap();
    v
}

#[test]
fn malformed_batches_are_refused_and_the_server_lives_on() {
    let (a, b) = two_hosts();
    let srv = ram_server(&a, 1 << 20);
    let p = b.create_process().unwrap();
    // OPEN by hand for a handle.
    let mut m = Message::with_code(msg::OPEN);
    m.0[1] = (OWNER_KEY >> 32) as u32;
    m.0[2] = OWNER_KEY as u32;
    p.send(&mut m, srv.pid()).unwrap();
    assert_eq!(msg::split_word0(m.0[0]).0, Response::Complete);
    let handle = m.0[1];
    let batch = |n: u32, din_at: u32, seg: Option<Segment<'_>>| -> Message {
        let mut m = Message::with_code(msg::SCSI_BATCH);
        m.0[1] = n;
        m.0[2] = din_at;
        m.0[5] = handle;
        match seg {
            Some(s) => p.send_with_segment(&mut m, srv.pid(), s).unwrap(),
            None => p.send(&mut m, srv.pid()).unwrap(),
        };
        m
    };
    let resp = |m: &Message| msg::split_word0(m.0[0]).0;
    let mut seg = vec![0u8; 4096];
    // No segment, zero or too many commands, data-in area before the
    // entries or past the segment, a read-only segment.
    assert_eq!(resp(&batch(1, 64, None)), Response::Malformed);
    for (n, din_at) in [(0, 0), (65, 4096), (2, 64), (1, 5000)] {
        assert_eq!(
            resp(&batch(n, din_at, Some(Segment::ReadWrite(&mut seg)))),
            Response::Malformed,
            "{n} commands, data-in at {din_at}"
        );
    }
    assert_eq!(
        resp(&batch(1, 64, Some(Segment::Read(&seg.clone())))),
        Response::Malformed
    );
    // Entries whose data lies outside their area fail alone; garbage CDBs
    // get CHECK CONDITION; a good READ in the same batch completes.
    let mut seg = vec![0u8; 4 * 64 + 512];
    msg::BatchEntry::new(&scsi::cdb_rw16(false, 0, 1, false), 0, 512).encode(&mut seg[0..]);
    msg::BatchEntry::new(&scsi::cdb_rw16(false, 0, 1, false), 200, 512).encode(&mut seg[64..]);
    msg::BatchEntry::new(&[0xff; 16], 0, 0).encode(&mut seg[128..]);
    msg::BatchEntry::new(&scsi::cdb_rw16(false, 0, 1, false), 256, 512).encode(&mut seg[192..]);
    let m = batch(4, 256, Some(Segment::ReadWrite(&mut seg)));
    assert_eq!(resp(&m), Response::Complete);
    let e: Vec<msg::BatchEntry> = (0..4)
        .map(|k| msg::BatchEntry::decode(&seg[k * 64..]).unwrap())
        .collect();
    assert_eq!(msg::split_word0(e[0].result).0, Response::Malformed);
    assert_eq!(msg::split_word0(e[1].result).0, Response::Malformed);
    assert_eq!(
        msg::split_word0(e[2].result),
        (Response::Complete, scsi::STATUS_CHECK_CONDITION)
    );
    assert_eq!(
        msg::split_word0(e[3].result),
        (Response::Complete, scsi::STATUS_GOOD)
    );
    assert_eq!(e[3].transferred, 512);
    // Still serving.
    let c = Client::open(&b, srv.pid(), 0, OWNER_KEY, 1).unwrap();
    assert_eq!(c.capacity().unwrap(), (2048, 512));
}
