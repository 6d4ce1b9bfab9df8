//! Feeds arbitrary bytes to every decoder and to the relay scanner: none may panic, and the
//! scanner must always make progress or ask for more bytes.
#![no_main]

use bypass_wire::frame::{Scanner, Step};
use bypass_wire::startup::decode_startup;
use bypass_wire::{BackendMessage, FrontendMessage};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_startup(data);
    if let Some((&tag, body)) = data.split_first() {
        let _ = FrontendMessage::decode(tag, body);
        let _ = BackendMessage::decode(tag, body);
    }
    let mut scanner = Scanner::new();
    let mut position = 0;
    while position < data.len() {
        match scanner.next(&data[position..], 64, 1 << 16) {
            Ok(Step::Message(header)) => position += header.frame_len(),
            Ok(Step::LargeStart { chunk_len, .. } | Step::Continuation { chunk_len, .. }) => {
                assert!(chunk_len > 0);
                position += chunk_len;
            }
            Ok(Step::NeedMore) | Err(_) => break,
        }
    }
});
