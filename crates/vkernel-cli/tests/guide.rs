//! docs/GUIDE.md's command-line walk-through, run as written (its first
//! `sh` block) by bash with this build's `vkernel` first on PATH.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The first fenced block of `lang` in `doc`.
fn first_block(doc: &str, lang: &str) -> Option<String> {
    let start = doc.find(&format!("```{lang}\n"))? + lang.len() + 4;
    let len = doc[start..].find("```")?;
    Some(doc[start..start + len].to_string())
}

/// Kills the script's process group (its background servers) at the end,
/// whatever happened.
struct Group(i32);
impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill takes no pointers; a negative pid names the group
        // this test created for the script.
        unsafe { libc::kill(-self.0, libc::SIGKILL) };
    }
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
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_vkernel")).parent().unwrap();
    let dir = std::env::temp_dir().join(format!("vk-guide-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (out_f, err_f) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&dir) // no target/release here: PATH finds this build
        .env("PATH", path)
        .env_remove("VKERNEL_HOST")
        .process_group(0)
        // Files, not pipes: a server left running must not hold them open.
        .stdout(std::fs::File::create(&out_f).unwrap())
        .stderr(std::fs::File::create(&err_f).unwrap())
        .spawn()
        .unwrap();
    let g = Group(child.id() as i32);
    let end = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "the walk-through hung");
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(g);
    let o = std::fs::read_to_string(&out_f).unwrap_or_default();
    let e = std::fs::read_to_string(&err_f).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{o}\n{e}");
    assert!(o.contains("10000") && o.contains("median"), "{o}\n{e}");
}
