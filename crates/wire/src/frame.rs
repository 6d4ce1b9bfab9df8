//! Message framing for relays: finds message boundaries in a byte stream without decoding bodies.
//!
//! A relay reads into a fixed buffer and asks the [`Scanner`] for the next step. Messages that fit
//! the buffer are only handed out whole, so a relay can inspect any small message (ReadyForQuery,
//! Terminate) without reassembly. A message larger than the buffer is streamed: the scanner hands out
//! its first bytes with the header, then plain continuation chunks until it is done.
//!
//! ```text
//!  buffer: | Z 00000005 I | D 0000.... (partial, fits) |
//!           ^ Message      ^ NeedMore: read more bytes, keep these
//! ```

use crate::error::{WireError, WireResult};

/// Bytes in a message header: the type byte and the Int32 length.
pub const HEADER_LEN: usize = 5;

/// The header of a tagged message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub tag: u8,
    /// The length field: counts itself and the body, not the tag.
    pub length: u32,
}

impl Header {
    /// Bytes after the header.
    pub fn body_len(self) -> usize {
        self.length as usize - 4
    }

    /// Bytes of the whole message on the wire, tag included.
    pub fn frame_len(self) -> usize {
        self.length as usize + 1
    }
}

/// Reads a header from the start of `buf`; `None` when fewer than five bytes are present.
/// `message_size_max` bounds the whole message.
pub fn read_header(buf: &[u8], message_size_max: u32) -> WireResult<Option<Header>> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let tag = buf[0];
    let length = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if length < 4 || length > i32::MAX as u32 {
        return Err(WireError::BadLength { tag: tag as char, length: i64::from(length as i32) });
    }
    if length > message_size_max {
        return Err(WireError::TooLarge { length: u64::from(length), limit: message_size_max });
    }
    Ok(Some(Header { tag, length }))
}

/// Refuses a logged-in client's next message by its type byte alone, before its length is
/// read, as PostgreSQL does: a StartupPacket sent again after login (type byte 0) would
/// otherwise be taken for the header of a message some kilobytes long and waited for.
/// `pending` starts at a message boundary.
pub fn check_frontend_tag(pending: &[u8]) -> WireResult<()> {
    match pending.first() {
        Some(&tag) if !crate::tag::frontend::after_login(tag) => Err(WireError::UnknownTag(tag as char)),
        _ => Ok(()),
    }
}

/// Splits a complete message frame into its header and body; `None` if `frame` is incomplete.
pub fn split_message(frame: &[u8], message_size_max: u32) -> WireResult<Option<(Header, &[u8])>> {
    let Some(header) = read_header(frame, message_size_max)? else {
        return Ok(None);
    };
    if frame.len() < header.frame_len() {
        return Ok(None);
    }
    Ok(Some((header, &frame[HEADER_LEN..header.frame_len()])))
}

/// What the scanner found at the start of the unprocessed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A whole message of `header.frame_len()` bytes.
    Message(Header),
    /// The first `chunk_len` bytes of a message too large for the buffer; the rest follows as
    /// [`Step::Continuation`] chunks.
    LargeStart { header: Header, chunk_len: usize },
    /// `chunk_len` more bytes of the large message in progress.
    Continuation { chunk_len: usize, last: bool },
    /// The bytes present are a partial message that will fit: read more before going on.
    NeedMore,
}

/// Carries the framing state of one direction of a connection across reads.
#[derive(Debug, Clone, Default)]
pub struct Scanner {
    /// Bytes of a large message still to pass through.
    large_remaining: usize,
}

impl Scanner {
    pub fn new() -> Self {
        Scanner::default()
    }

    /// True when the stream is at a message boundary.
    pub fn at_boundary(&self) -> bool {
        self.large_remaining == 0
    }

    /// Looks at `pending` (unprocessed bytes) and returns the next step. `buffer_capacity` is the
    /// most a relay can hold; messages up to that size are returned whole. The caller consumes the
    /// step's bytes before calling again.
    pub fn next(&mut self, pending: &[u8], buffer_capacity: usize, message_size_max: u32) -> WireResult<Step> {
        assert!(buffer_capacity >= HEADER_LEN, "a relay buffer holds at least a header");
        if self.large_remaining > 0 {
            return Ok(self.continue_large(pending.len()));
        }
        let Some(header) = read_header(pending, message_size_max)? else {
            return Ok(Step::NeedMore);
        };
        let frame_len = header.frame_len();
        if pending.len() >= frame_len {
            return Ok(Step::Message(header));
        }
        if frame_len <= buffer_capacity {
            return Ok(Step::NeedMore);
        }
        self.large_remaining = frame_len - pending.len();
        Ok(Step::LargeStart { header, chunk_len: pending.len() })
    }

    fn continue_large(&mut self, available: usize) -> Step {
        if available == 0 {
            return Step::NeedMore;
        }
        let chunk_len = available.min(self.large_remaining);
        self.large_remaining -= chunk_len;
        Step::Continuation { chunk_len, last: self.large_remaining == 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_rejects_lengths_below_four_and_above_limit() {
        assert!(matches!(read_header(b"Q\0\0\0\x03", 100), Err(WireError::BadLength { .. })));
        assert!(matches!(read_header(b"Q\0\0\x01\0", 100), Err(WireError::TooLarge { .. })));
        assert!(matches!(read_header(b"Q\xff\xff\xff\xff", u32::MAX), Err(WireError::BadLength { .. })));
        assert_eq!(read_header(b"Q\0\0", 100), Ok(None));
    }

    #[test]
    fn scanner_streams_a_message_larger_than_the_buffer() {
        let mut scanner = Scanner::new();
        let mut frame = vec![b'D', 0, 0, 0, 20];
        frame.extend_from_slice(&[7; 16]);
        let step = scanner.next(&frame[..8], 8, 1000).expect("valid");
        assert_eq!(step, Step::LargeStart { header: Header { tag: b'D', length: 20 }, chunk_len: 8 });
        assert_eq!(scanner.next(&frame[8..16], 8, 1000), Ok(Step::Continuation { chunk_len: 8, last: false }));
        assert_eq!(scanner.next(&frame[16..], 8, 1000), Ok(Step::Continuation { chunk_len: 5, last: true }));
        assert!(scanner.at_boundary());
    }

    #[test]
    fn scanner_waits_for_a_partial_message_that_fits() {
        let mut scanner = Scanner::new();
        assert_eq!(scanner.next(b"Z\0\0\0\x05", 64, 1000), Ok(Step::NeedMore));
        assert_eq!(scanner.next(b"Z\0\0\0\x05I", 64, 1000), Ok(Step::Message(Header { tag: b'Z', length: 5 })));
    }
}
