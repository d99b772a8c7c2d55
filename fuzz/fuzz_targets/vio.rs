//! V I/O request handling: any message and segment sent to a real file
//! server is answered, and the server keeps serving.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vkernel_fs::fuzzing::fuzz_request(data);
});
