//! docs/GUIDE.md's command-line walk-through, run as written (its first
//! `sh` block) by bash with this build's `vkernel` first on PATH.

use std::path::Path;
use std::time::Duration;

mod common;

/// The first fenced block of `lang` in `doc`.
fn first_block(doc: &str, lang: &str) -> Option<String> {
    let start = doc.find(&format!("```{lang}\n"))? + lang.len() + 4;
    let len = doc[start..].find("```")?;
    Some(doc[start..start + len].to_string())
}

#[test]
fn the_guides_command_line_walk_through_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/GUIDE.md")).unwrap();
    let script = first_block(&doc, "sh").expect("a sh block in GUIDE.md");
    // The build step is this test's own build.
    assert!(
        script.starts_with("cargo build --release -p vkernel-cli\n"),
        "{script}"
    );
    let script = script.replacen("cargo build --release -p vkernel-cli\n", "", 1);
    let dir = std::env::temp_dir().join(format!("vk-guide-{}", std::process::id()));
    let (status, o, e) = common::run_walk_through(&script, &dir, Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{o}\n{e}");
    assert!(o.contains("10000") && o.contains("median"), "{o}\n{e}");
}
