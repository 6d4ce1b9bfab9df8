//! A fixed-capacity read buffer with async helpers: bytes are read into the tail and consumed
//! from the head, so a connection reuses one allocation for its whole life.

use std::io;

use bypass_wire::frame::{read_header, Header};
use bypass_wire::HEADER_LEN;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::error::{DispatchError, Result};

/// Unconsumed bytes live in `bytes[start..end]`.
pub struct Buffer {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Buffer {
    pub fn with_capacity(capacity: usize) -> Self {
        assert!(capacity >= HEADER_LEN, "a buffer holds at least a message header");
        Buffer { bytes: vec![0; capacity].into_boxed_slice(), start: 0, end: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.bytes.len()
    }

    pub fn pending(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub fn consume(&mut self, count: usize) {
        assert!(count <= self.end - self.start, "consumed more than was read");
        self.start += count;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Free space at the tail, after moving pending bytes to the front if that makes room.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 && self.end == self.bytes.len() {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.bytes[self.end..]
    }

    /// Marks `count` bytes written into [`Self::spare`] as received.
    pub fn commit(&mut self, count: usize) {
        assert!(self.end + count <= self.bytes.len(), "committed past the buffer");
        self.end += count;
    }

    /// Appends bytes (the caller checked they fit).
    pub fn push(&mut self, bytes: &[u8]) {
        let spare = self.spare();
        assert!(bytes.len() <= spare.len(), "pushed more than fits");
        spare[..bytes.len()].copy_from_slice(bytes);
        self.commit(bytes.len());
    }

    /// Reads once from `stream`; `Ok(0)` means the peer closed.
    pub async fn read_from(&mut self, stream: &mut TcpStream) -> io::Result<usize> {
        let spare = self.spare();
        debug_assert!(!spare.is_empty(), "a read into no space would look like EOF");
        let count = stream.read(spare).await?;
        self.commit(count);
        Ok(count)
    }

    /// Reads without waiting; `Ok(None)` when nothing is there yet.
    pub fn try_read_from(&mut self, stream: &TcpStream) -> io::Result<Option<usize>> {
        match stream.try_read(self.spare()) {
            Ok(count) => {
                self.commit(count);
                Ok(Some(count))
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Waits until the buffer starts with one whole message (which must fit) and returns its
    /// header. For login-time and control messages, not relayed results.
    pub async fn read_message(&mut self, stream: &mut TcpStream, what: &str) -> Result<Header> {
        let limit = (self.capacity() - 1) as u32;
        loop {
            if let Some(header) = read_header(self.pending(), limit)? {
                if self.pending().len() >= header.frame_len() {
                    return Ok(header);
                }
            }
            let count =
                self.read_from(stream).await.map_err(|e| DispatchError::io(format!("reading from {what}"), e))?;
            if count == 0 {
                return Err(closed(what));
            }
        }
    }

    /// The body of a whole message at the head.
    pub fn body(&self, header: Header) -> &[u8] {
        &self.pending()[HEADER_LEN..header.frame_len()]
    }
}

/// "`what` closed the connection" as an error.
pub fn closed(what: &str) -> DispatchError {
    let error = io::Error::new(io::ErrorKind::UnexpectedEof, format!("{what} closed the connection"));
    DispatchError::io(format!("reading from {what}"), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the buffer compacts only when the tail is full; method: fill, consume, check room.
    #[test]
    fn compacts_only_when_the_tail_is_full() {
        let mut buffer = Buffer::with_capacity(8);
        buffer.push(b"abcdefgh");
        buffer.consume(6);
        assert_eq!(buffer.spare().len(), 6);
        assert_eq!(buffer.pending(), b"gh");
        buffer.consume(2);
        assert!(buffer.is_empty());
        assert_eq!(buffer.spare().len(), 8);
    }
}
