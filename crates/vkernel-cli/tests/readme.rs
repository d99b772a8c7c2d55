//! README.md's walk-throughs (each `sh` block after a `<!-- readme-test
//! -->` line), run as written by bash from an empty directory with this
//! build's `vkernel` first on PATH.

use std::path::Path;
use std::time::Duration;

mod common;

/// The blocks marked for this test, in order.
fn marked_blocks(doc: &str) -> Vec<String> {
    const MARK: &str = "<!-- readme-test -->\n```sh\n";
    doc.match_indices(MARK)
        .filter_map(|(i, _)| {
            let start = i + MARK.len();
            let len = doc[start..].find("```")?;
            Some(doc[start..start + len].to_string())
        })
        .collect()
}

fn run(script: &str, name: &str) -> (String, String) {
    let dir = std::env::temp_dir().join(format!("vk-readme-{name}-{}", std::process::id()));
    let (status, o, e) = common::run_walk_through(script, &dir, Duration::from_secs(180));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        status.success(),
        "{script}\n--- stdout\n{o}\n--- stderr\n{e}"
    );
    (o, e)
}

#[test]
fn the_readmes_walk_throughs_run_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = marked_blocks(&doc);
    assert_eq!(blocks.len(), 2, "README.md's marked walk-throughs");

    // Exchanges, a trace of both ends, and its report.
    let (o, e) = run(&blocks[0], "exchanges");
    assert_eq!(o.matches("failures 0").count(), 3, "{o}\n{e}");
    // Both ends' traces were read: the report checks conservation.
    assert!(o.contains("conservation"), "{o}");

    // The disk and a real NBD client.
    let qemu = std::process::Command::new("qemu-img")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !qemu {
        assert!(
            std::env::var("VKERNEL_REQUIRE_NBD_TOOLS").as_deref() != Ok("1"),
            "qemu-img is required (VKERNEL_REQUIRE_NBD_TOOLS=1) but not installed"
        );
        eprintln!("skipped the disk walk-through: no qemu-img (Debian: qemu-utils)");
        return;
    }
    let (o, e) = run(&blocks[1], "disk");
    assert!(o.contains("virtual size: 256 MiB"), "{o}\n{e}");
}
