//! Property tests over the codec: arbitrary bytes never panic a decoder, encoded messages decode to
//! themselves, and the relay scanner finds every boundary whatever way a stream is split into reads.

use bypass_wire::backend::build as backend_build;
use bypass_wire::frame::{read_header, split_message, Scanner, Step};
use bypass_wire::frontend::build as frontend_build;
use bypass_wire::startup::decode_startup;
use bypass_wire::{BackendMessage, FrontendMessage, Severity, SqlState, TransactionStatus};
use proptest::prelude::*;

const LIMIT: u32 = 1 << 20;

fn tag() -> impl Strategy<Value = u8> {
    prop_oneof![
        Just(b'B'),
        Just(b'C'),
        Just(b'd'),
        Just(b'c'),
        Just(b'f'),
        Just(b'D'),
        Just(b'E'),
        Just(b'H'),
        Just(b'F'),
        Just(b'P'),
        Just(b'p'),
        Just(b'Q'),
        Just(b'S'),
        Just(b'X'),
        Just(b'R'),
        Just(b'K'),
        Just(b'2'),
        Just(b'3'),
        Just(b'G'),
        Just(b'W'),
        Just(b'I'),
        Just(b'V'),
        Just(b'v'),
        Just(b'n'),
        Just(b'N'),
        Just(b'A'),
        Just(b't'),
        Just(b'1'),
        Just(b's'),
        Just(b'Z'),
        Just(b'T'),
        any::<u8>()
    ]
}

proptest! {
    /// Goal: no decoder panics on any input. Method: feed random tags and bodies to every decoder.
    #[test]
    fn decoders_never_panic(tag in tag(), body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = FrontendMessage::decode(tag, &body);
        let _ = BackendMessage::decode(tag, &body);
        let _ = decode_startup(&body);
        let _ = read_header(&body, LIMIT);
        let _ = split_message(&body, LIMIT);
    }

    /// Goal: a decoded frontend message re-encodes to the same bytes. Method: decode random bodies;
    /// whatever decodes must encode back to its original frame.
    #[test]
    fn frontend_decode_encode_is_identity(tag in tag(), body in proptest::collection::vec(any::<u8>(), 0..48)) {
        if let Ok(message) = FrontendMessage::decode(tag, &body) {
            let mut encoded = Vec::new();
            message.encode(&mut encoded);
            prop_assert_eq!(&encoded[5..], &body[..]);
            prop_assert_eq!(encoded[0], tag);
        }
    }

    /// Same property for backend messages.
    #[test]
    fn backend_decode_encode_is_identity(tag in tag(), body in proptest::collection::vec(any::<u8>(), 0..48)) {
        if let Ok(message) = BackendMessage::decode(tag, &body) {
            let mut encoded = Vec::new();
            message.encode(&mut encoded);
            prop_assert_eq!(&encoded[5..], &body[..]);
        }
    }

    /// Goal: the scanner reports every message boundary however the stream is cut into reads and
    /// whatever the relay's buffer size. Method: build a stream of known messages, feed it through a
    /// simulated relay buffer in random read sizes, and compare the tags and lengths seen.
    #[test]
    fn scanner_finds_all_boundaries(
        sizes in proptest::collection::vec(0usize..300, 1..40),
        reads in proptest::collection::vec(1usize..97, 1..200),
        capacity in 5usize..128,
    ) {
        let (stream, expected) = stream_of(&sizes);
        let seen = relay(&stream, &reads, capacity);
        prop_assert_eq!(seen, expected);
    }
}

/// Builds a stream of DataRow-like messages whose bodies have the given sizes, plus a final 'Z'.
fn stream_of(sizes: &[usize]) -> (Vec<u8>, Vec<(u8, u32)>) {
    let mut stream = Vec::new();
    let mut expected = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let tag = if i % 2 == 0 { b'D' } else { b'd' };
        stream.push(tag);
        stream.extend_from_slice(&(*size as u32 + 4).to_be_bytes());
        stream.extend(std::iter::repeat_n(i as u8, *size));
        expected.push((tag, *size as u32 + 4));
    }
    backend_build::ready_for_query(&mut stream, TransactionStatus::Idle);
    expected.push((b'Z', 5));
    (stream, expected)
}

/// Simulates a relay: a buffer of `capacity` bytes filled by reads of the given sizes.
fn relay(stream: &[u8], reads: &[usize], capacity: usize) -> Vec<(u8, u32)> {
    let mut scanner = Scanner::new();
    let mut buffer: Vec<u8> = Vec::with_capacity(capacity);
    let mut offset = 0;
    let mut seen = Vec::new();
    let mut read_sizes = reads.iter().cycle();
    while offset < stream.len() || !buffer.is_empty() {
        let room = capacity - buffer.len();
        let take = (*read_sizes.next().expect("cycle")).min(room).min(stream.len() - offset);
        buffer.extend_from_slice(&stream[offset..offset + take]);
        offset += take;
        let consumed = drain(&mut scanner, &buffer, capacity, &mut seen);
        buffer.drain(..consumed);
        assert!(take > 0 || consumed > 0 || offset == stream.len(), "relay made no progress");
        if offset == stream.len() && consumed == 0 {
            break;
        }
    }
    seen
}

fn drain(scanner: &mut Scanner, buffer: &[u8], capacity: usize, seen: &mut Vec<(u8, u32)>) -> usize {
    let mut position = 0;
    loop {
        match scanner.next(&buffer[position..], capacity, LIMIT).expect("valid stream") {
            Step::Message(header) => {
                seen.push((header.tag, header.length));
                position += header.frame_len();
            }
            Step::LargeStart { header, chunk_len } => {
                seen.push((header.tag, header.length));
                position += chunk_len;
            }
            Step::Continuation { chunk_len, .. } => position += chunk_len,
            Step::NeedMore => return position,
        }
    }
}

#[test]
fn built_messages_decode() {
    // Goal: the builders the pooler uses produce frames the decoders accept.
    let mut buf = Vec::new();
    backend_build::error(&mut buf, Severity::Fatal, SqlState::INVALID_PASSWORD, "password authentication failed");
    let (header, body) = split_message(&buf, LIMIT).expect("valid").expect("complete");
    let BackendMessage::ErrorResponse(fields) = BackendMessage::decode(header.tag, body).expect("decodes") else {
        panic!("not an error response");
    };
    assert!(fields.is_fatal());
    assert_eq!(fields.code(), Some(&b"28P01"[..]));

    let mut buf = Vec::new();
    frontend_build::parse(&mut buf, "s1", "select $1", &[23]);
    let (header, body) = split_message(&buf, LIMIT).expect("valid").expect("complete");
    let FrontendMessage::Parse(parse) = FrontendMessage::decode(header.tag, body).expect("decodes") else {
        panic!("not a parse");
    };
    assert_eq!(parse.param_types().collect::<Vec<_>>(), vec![23]);
}
