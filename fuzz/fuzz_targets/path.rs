//! The file server's path resolution: any bytes as a client path never
//! resolve outside the exported root (symlinks out, `..`, loops).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vkernel_fs::fuzzing::fuzz_path(data);
});
