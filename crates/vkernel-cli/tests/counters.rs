//! What `ping` reports agrees with what happened: bulk chunks re-sent
//! under loss are counted as retransmissions.

use std::process::Command;

mod common;
use common::BIN;

#[test]
fn ping_counts_bulk_retransmissions() {
    let (_echo, addr, _) = common::echo(&[]);
    let o = Command::new(BIN)
        .args(["ping", "--peer", &addr, "-n", "8", "--bulk", "4194304"])
        .args(["--fault", "loss=0.05,seed=11"])
        .output()
        .expect("run ping");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    // "retransmissions T (R requests, B bulk chunks)"
    let tail = out
        .split("retransmissions ")
        .nth(1)
        .unwrap_or_else(|| panic!("no retransmissions line: {out}"));
    let nums: Vec<u64> = tail
        .split(|ch: char| !ch.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .take(3)
        .map(|w| w.parse().expect("number"))
        .collect();
    assert_eq!(nums.len(), 3, "{out}");
    assert!(
        nums[2] > 0,
        "bulk chunks lost at 5 % but none re-sent: {out}"
    );
    assert_eq!(nums[0], nums[1] + nums[2], "{out}");
}
