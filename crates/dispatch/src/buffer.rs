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

    /// Waits for one whole message at the head and returns its tag and body, consuming it. The
    /// message may be larger than the buffer (up to `frame_bytes_max`): a control frame that
    /// carries a connection's queues can be megabytes when the client was slow to acknowledge.
    pub async fn read_frame(
        &mut self,
        stream: &mut TcpStream,
        what: &str,
        frame_bytes_max: usize,
    ) -> Result<(u8, Vec<u8>)> {
        let limit = u32::try_from(frame_bytes_max).unwrap_or(u32::MAX);
        let header = loop {
            if let Some(header) = read_header(self.pending(), limit)? {
                break header;
            }
            self.read_more(stream, what).await?;
        };
        let frame_len = header.frame_len();
        if frame_len <= self.capacity() {
            while self.pending().len() < frame_len {
                self.read_more(stream, what).await?;
            }
            let body = self.body(header).to_vec();
            self.consume(frame_len);
            return Ok((header.tag, body));
        }
        // Larger than the buffer: take what is here, read the rest straight into the body.
        let here = self.pending().len().min(frame_len);
        let mut body = Vec::with_capacity(frame_len - HEADER_LEN);
        body.extend_from_slice(&self.pending()[HEADER_LEN..here]);
        self.consume(here);
        body.resize(frame_len - HEADER_LEN, 0);
        stream
            .read_exact(&mut body[here - HEADER_LEN..])
            .await
            .map_err(|e| DispatchError::io(format!("reading from {what}"), e))?;
        Ok((header.tag, body))
    }

    async fn read_more(&mut self, stream: &mut TcpStream, what: &str) -> Result<()> {
        let count = self.read_from(stream).await.map_err(|e| DispatchError::io(format!("reading from {what}"), e))?;
        if count == 0 {
            return Err(closed(what));
        }
        Ok(())
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

    // Goal: a frame larger than the buffer (a connection state with big queues) is read whole,
    // and a small frame behind it stays intact; method: both over a loopback TCP pair.
    #[test]
    fn frames_larger_than_the_buffer_are_read_whole() {
        use tokio::io::AsyncWriteExt;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let address = listener.local_addr().expect("address");
            let mut sender = TcpStream::connect(address).await.expect("connect");
            let (mut receiver, _) = listener.accept().await.expect("accept");
            let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            let mut frames = Vec::new();
            bypass_wire::write::message(&mut frames, Some(0xB7), |b| b.extend_from_slice(&big));
            bypass_wire::write::message(&mut frames, Some(b'Z'), |b| b.push(b'I'));
            let writer = tokio::spawn(async move { sender.write_all(&frames).await.map(|_| sender) });
            let mut buffer = Buffer::with_capacity(4096);
            let (tag, body) = buffer.read_frame(&mut receiver, "test", 1 << 20).await.expect("big frame");
            assert_eq!((tag, body.len()), (0xB7, big.len()));
            assert!(body == big, "the big frame's bytes changed");
            let (tag, body) = buffer.read_frame(&mut receiver, "test", 1 << 20).await.expect("small frame");
            assert_eq!((tag, body.as_slice()), (b'Z', &b"I"[..]));
            let error = {
                let mut oversized = Vec::new();
                bypass_wire::write::message(&mut oversized, Some(0xB7), |b| b.extend_from_slice(&[0; 64]));
                let mut sender = writer.await.expect("writer").expect("written");
                sender.write_all(&oversized).await.expect("write");
                buffer.read_frame(&mut receiver, "test", 32).await
            };
            assert!(error.is_err(), "a frame above the bound is an error");
        });
    }
}
