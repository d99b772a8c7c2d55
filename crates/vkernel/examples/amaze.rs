//! Shared state kept consistent by 0-reply group Sends, like the thesis's
//! Amaze game: every player multicasts its *absolute* state on each move
//! and again as a periodic heartbeat, so a lost update is repaired by the
//! next one and no acknowledgements are needed (one datagram per update per
//! host instead of 2(n−1) one-to-one messages).
//!
//! `cargo run --release -p vkernel --example amaze -- [HOSTS] [PLAYERS_PER_HOST] [MOVES] [LOSS]`
//! runs HOSTS logical hosts on loopback (default 3), each with
//! PLAYERS_PER_HOST players (2), for MOVES moves (50) with LOSS injected
//! datagram loss (0.1), then checks that every player's view of the maze
//! equals every player's true final position. Exits 1 if not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use vkernel::{FaultConfig, GroupMode, Kernel, KernelConfig, Message, Pid, Process};

/// The players' well-known group.
fn game_group() -> Pid {
    Pid::well_known_group(0xa3a2)
}

const UPDATE: u32 = 0x0a_0001;
const STOP: u32 = 0x0a_0002;

/// (x, y, tick) of each player, as one player sees them.
type View = Arc<Mutex<HashMap<u32, (u32, u32, u32)>>>;

/// A player's listener: a V process in the group that applies updates.
fn listen(p: Process, view: View) {
    let mut m = Message::zero();
    while let Ok(i) = p.receive(&mut m) {
        match m.code() {
            STOP => {
                let _ = p.reply(&m, i.from);
                return;
            }
            UPDATE => {
                let (id, x, y, tick) = (m.0[1], m.0[2], m.0[3], m.0[4]);
                if let Ok(mut v) = view.lock() {
                    let e = v.entry(id).or_insert((x, y, tick));
                    // Absolute state: a newer tick simply wins.
                    if tick >= e.2 {
                        *e = (x, y, tick);
                    }
                }
                // 0-reply: the Reply is local bookkeeping, no datagram.
                let _ = p.reply(&m, i.from);
            }
            _ => {
                let _ = p.reply(&m, i.from);
            }
        }
    }
}

/// Outcome of a game.
pub struct Outcome {
    /// Every player's final (x, y, tick).
    pub truth: HashMap<u32, (u32, u32, u32)>,
    /// Each player's view at the end.
    pub views: Vec<HashMap<u32, (u32, u32, u32)>>,
    /// Group Sends made.
    pub updates: u64,
    /// RemoteSend datagrams that went on the wire.
    pub datagrams: u64,
}

/// Plays a game and returns what each player saw.
pub fn play(hosts: usize, per_host: usize, moves: u32, loss: f64) -> Outcome {
    let mut ks: Vec<Kernel> = Vec::new();
    for i in 0..hosts {
        let k = Kernel::start(KernelConfig {
            peers: ks.iter().map(|k| k.local_addr()).collect(),
            faults: FaultConfig {
                loss,
                seed: 1000 + i as u64,
                ..Default::default()
            },
            spin: Duration::ZERO,
            ..Default::default()
        })
        .expect("start host");
        for o in &ks {
            o.add_peer(k.local_addr());
        }
        ks.push(k);
    }
    let g = game_group();
    let mut players = Vec::new();
    for (h, k) in ks.iter().enumerate() {
        for j in 0..per_host {
            let id = (h * per_host + j) as u32;
            let view: View = Arc::new(Mutex::new(HashMap::new()));
            let v2 = view.clone();
            let (lpid, lh) = k
                .spawn("listener", move |p| listen(p, v2))
                .expect("spawn listener");
            let mover = k.create_process().expect("create mover");
            mover.join_group(g, lpid).expect("join");
            players.push((id, mover, lpid, lh, view));
        }
    }
    let heartbeat = Duration::from_millis(40);
    // Each mover is a V process used by its own thread.
    let running: Vec<_> = players
        .into_iter()
        .map(|(id, mover, lpid, lh, view)| {
            let h = thread::spawn(move || {
                let (mut x, mut y) = (id * 10, 0u32);
                let mut rng = 0x9e37_79b9u32 ^ id;
                let announce = |x: u32, y: u32, tick: u32| {
                    let mut m = Message::with_code(UPDATE);
                    m.set_group_mode(GroupMode::NoReply);
                    m.0[1] = id;
                    m.0[2] = x;
                    m.0[3] = y;
                    m.0[4] = tick;
                    mover.send(&mut m, game_group()).expect("group send");
                };
                for tick in 1..=moves {
                    rng ^= rng << 13;
                    rng ^= rng >> 17;
                    rng ^= rng << 5;
                    match rng % 4 {
                        0 => x += 1,
                        1 => x = x.saturating_sub(1),
                        2 => y += 1,
                        _ => y = y.saturating_sub(1),
                    }
                    announce(x, y, tick);
                    thread::sleep(Duration::from_millis(2));
                }
                // Heartbeats: the same absolute state again, so a lost last
                // update is repaired.
                let end = Instant::now() + heartbeat * 8;
                while Instant::now() < end {
                    thread::sleep(heartbeat);
                    announce(x, y, moves);
                }
                (mover, (x, y, moves))
            });
            (id, h, lpid, lh, view)
        })
        .collect();
    let mut truth = HashMap::new();
    let mut finished = Vec::new();
    for (id, h, lpid, lh, view) in running {
        let (mover, state) = h.join().expect("player");
        truth.insert(id, state);
        finished.push((mover, lpid, lh, view));
    }
    thread::sleep(Duration::from_millis(100));
    let mut views = Vec::new();
    let mut updates = 0;
    for (mover, lpid, lh, view) in finished {
        let mut m = Message::with_code(STOP);
        mover.send(&mut m, lpid).expect("stop listener");
        lh.join().expect("listener");
        views.push(view.lock().map(|v| v.clone()).unwrap_or_default());
    }
    let mut datagrams = 0;
    for k in &ks {
        let s = k.stats();
        updates += s.group_sends;
        datagrams += s.tx_of(vkernel_proto::wire::PacketType::RemoteSend);
    }
    Outcome {
        truth,
        views,
        updates,
        datagrams,
    }
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let get = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let (Ok(hosts), Ok(per), Ok(moves), Ok(loss)) = (
        get(0, "3").parse::<usize>(),
        get(1, "2").parse::<usize>(),
        get(2, "50").parse::<u32>(),
        get(3, "0.1").parse::<f64>(),
    ) else {
        eprintln!("usage: amaze [HOSTS] [PLAYERS_PER_HOST] [MOVES] [LOSS]");
        std::process::exit(2);
    };
    let o = play(hosts.max(1), per.max(1), moves.max(1), loss.clamp(0.0, 0.9));
    let agree = o.views.iter().filter(|v| **v == o.truth).count();
    println!(
        "amaze: {} players on {hosts} hosts, {moves} moves each, {:.0}% loss: {} group updates, {} datagrams ({:.2} per update); {agree}/{} views match the truth",
        o.truth.len(),
        loss * 100.0,
        o.updates,
        o.datagrams,
        o.datagrams as f64 / o.updates.max(1) as f64,
        o.views.len()
    );
    if agree != o.views.len() {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_converge_despite_loss() {
        let o = play(3, 2, 30, 0.15);
        assert_eq!(o.truth.len(), 6);
        for (i, v) in o.views.iter().enumerate() {
            assert_eq!(*v, o.truth, "player {i}'s view");
        }
        // Unicast fan-out on loopback: one datagram per other host.
        assert!(o.datagrams <= o.updates * 2, "{} datagrams", o.datagrams);
    }
}
