//! The packet decoder never panics, and what it accepts re-encodes to the
//! same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vkernel_proto::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = wire::decode(data) {
        let again = wire::encode(&p.header, &p.msg, p.data);
        // Unknown status values decode to BadRequest, so compare decoded forms.
        let q = wire::decode(&again).expect("re-encoded packet decodes");
        assert_eq!(p.header.seq, q.header.seq);
        assert_eq!(p.msg, q.msg);
        assert_eq!(p.data, q.data);
    }
});
