//! The NBD handshake and command stream: any byte stream ends the connection cleanly, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vkernel_disk::fuzz_nbd(data);
});
