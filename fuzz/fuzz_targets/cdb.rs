//! The SCSI CDB parser and command layer: any bytes give a status and correct sense, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vkernel_disk::fuzz_cdb(data);
});
