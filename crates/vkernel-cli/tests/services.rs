//! Services as scripts run them: a reader that takes the banner and
//! closes the pipe must not turn a clean exit into a failure.

use std::time::Duration;

mod common;

#[test]
fn a_service_whose_reader_left_still_exits_cleanly() {
    let root = std::env::temp_dir();
    let root = root.to_string_lossy();
    for args in [
        vec!["echo", "--bind", "127.0.0.1:0", "--exit-after", "1s"],
        vec![
            "fileserver",
            "--bind",
            "127.0.0.1:0",
            "--root",
            &root,
            "--exit-after",
            "1s",
        ],
    ] {
        // spawn_serving reads the banner and drops its end of the pipe, so
        // the exit summary is written to a closed pipe.
        let (mut p, banner) = common::spawn_serving(&args);
        assert!(banner.contains("listening"), "{banner}");
        let status = common::wait_for(Duration::from_secs(30), "the service to exit", || {
            p.0.try_wait().ok().flatten()
        });
        assert!(status.success(), "`vkernel {}` ended {status:?}", args[0]);
    }
}
