//! On a clean loopback bulk chunks are not sent twice en masse: a series
//! of 64 MiB MoveFroms and MoveTos between two hosts resends at most
//! 1 % of its chunks (it was 8–20 % before the tail-loss probe asked for
//! one chunk and gaps waited a reordering window), and the counters agree
//! with what crossed the wire. The simulator shows that a path that loses
//! nothing resends nothing (`a_path_that_loses_nothing_resends_nothing`);
//! on a 2-vCPU VM, threads stalled for milliseconds still fire a few
//! probes. (Alone in its binary, so no other test competes for the CPUs
//! while it runs.)

mod common;

use std::sync::atomic::Ordering;

use vkernel::{Message, Process, Segment};

const LEN: usize = 64 << 20;
const ROUNDS: usize = 6;
/// Chunks of a transfer (the default chunk: 64 KiB less the header).
const CHUNKS: u64 = (2 * ROUNDS * LEN / 65_000) as u64;
/// A series the OS dropped datagrams in (a full receive buffer) is not a
/// clean loopback: it is run again, this many times at most.
const TRIES: usize = 4;

/// MoveFrom the client's whole segment, MoveTo it back into its second
/// half, reply.
fn serve(p: Process) {
    let mut buf = vec![0u8; LEN];
    loop {
        let mut m = Message::zero();
        let Ok(i) = p.receive(&mut m) else { return };
        if m.code() == 0 {
            let _ = p.reply(&m, i.from);
            return;
        }
        let ok =
            p.move_from(i.from, 0, &mut buf).is_ok() && p.move_to(i.from, LEN as u32, &buf).is_ok();
        m.0[1] = u32::from(ok);
        let _ = p.reply(&m, i.from);
    }
}

struct Series {
    retransmits: u64,
    /// Resent by the MoveFrom owner (the client's host) and by the MoveTo
    /// mover (the server's).
    by_owner: u64,
    by_mover: u64,
    duplicates: u64,
    os_drops: u64,
    moved: u64,
}

fn series(a: &vkernel::Kernel, b: &vkernel::Kernel, c: &Process, server: vkernel::Pid) -> Series {
    let sum = |f: fn(&vkernel_proto::Stats) -> u64| f(&a.stats()) + f(&b.stats());
    let (o0, v0) = (b.stats().bulk_retransmits, a.stats().bulk_retransmits);
    let (r0, d0, m0) = (
        sum(|s| s.bulk_retransmits),
        sum(|s| s.bulk_duplicates),
        sum(|s| s.bulk_bytes),
    );
    let drops0 = common::udp_rcvbuf_errors();
    let mut seg = common::pattern(2 * LEN, 7);
    for round in 0..ROUNDS {
        seg[LEN..].fill(0);
        let mut m = Message::with_code(1);
        c.send_with_segment(&mut m, server, Segment::ReadWrite(&mut seg))
            .expect("bulk exchange");
        assert_eq!(m.0[1], 1, "round {round}: the server's moves failed");
        assert!(
            seg[..LEN] == seg[LEN..],
            "round {round}: data came back wrong"
        );
    }
    Series {
        retransmits: sum(|s| s.bulk_retransmits) - r0,
        by_owner: b.stats().bulk_retransmits - o0,
        by_mover: a.stats().bulk_retransmits - v0,
        duplicates: sum(|s| s.bulk_duplicates) - d0,
        os_drops: common::udp_rcvbuf_errors() - drops0,
        moved: sum(|s| s.bulk_bytes) - m0,
    }
}

#[test]
fn a_clean_loopback_resends_no_bulk_chunk() {
    let (a, b) = common::two_hosts();
    let (server, h) = a.spawn("mover", serve).expect("spawn");
    let c = b.create_process().expect("client");
    let mut seen = Vec::new();
    for _ in 0..TRIES {
        let s = series(&a, &b, &c, server);
        assert_eq!(s.moved, (2 * ROUNDS * LEN) as u64, "bytes counted");
        // Every duplicate received is a resend (loopback neither loses
        // nor copies), and a resend with no OS drop is needless.
        assert!(
            s.duplicates <= s.retransmits,
            "{} duplicates received but {} chunks resent",
            s.duplicates,
            s.retransmits
        );
        if s.os_drops == 0 {
            println!(
                "{ROUNDS} × 2 × 64 MiB: {} chunks resent ({} MoveFrom, {} MoveTo), {} received twice",
                s.retransmits, s.by_owner, s.by_mover, s.duplicates
            );
            assert!(
                s.retransmits * 100 <= CHUNKS,
                "a clean series of {ROUNDS} × 2 × 64 MiB resent {} of {CHUNKS} chunks \
                 ({} MoveFrom, {} MoveTo; earlier tries: {seen:?})",
                s.retransmits,
                s.by_owner,
                s.by_mover
            );
            let mut m = Message::zero();
            let _ = c.send(&mut m, server);
            h.join().expect("server");
            let placed = b.net_counters().bulk_in_place.load(Ordering::Relaxed);
            assert!(placed > 0, "MoveTo's chunks were received in place");
            return;
        }
        seen.push((s.os_drops, s.retransmits));
    }
    panic!("the OS dropped datagrams in every series: {seen:?} (drops, resends)");
}
