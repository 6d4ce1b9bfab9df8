//! Feeds arbitrary bytes to the pod's message decoder and to the limits check every host runs
//! on what it receives: neither may panic, and whatever decodes must encode back to the same
//! bytes and decode to the same message.
#![no_main]

use bypass_pod::message::{Limits, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(message) = Message::decode(1, data) else { return };
    let limits = Limits { row_bytes: vec![8, 100, 1000], hwcc: 0x1_0000..0x10_0000, node_bytes: 32 };
    let _ = message.check(&limits);
    let mut encoded = Vec::new();
    message.encode(&mut encoded);
    assert_eq!(encoded, data, "a decoded message encodes to other bytes");
    assert_eq!(Message::decode(1, &encoded).expect("re-decodes"), message);
});
