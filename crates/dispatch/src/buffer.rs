//! Async reads into the shared read buffer ([`bypass_wire::Buffer`]): whole messages, control
//! frames larger than the buffer, non-blocking reads.

use std::io;

use bypass_wire::frame::{read_header, Header};
use bypass_wire::HEADER_LEN;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::error::{DispatchError, Result};

pub use bypass_wire::Buffer;

/// The dispatcher's reads into a [`Buffer`] (the buffer itself lives in `bypass-wire`, shared
/// with the pooler).
#[allow(async_fn_in_trait)] // Used only inside this crate; no caller needs a Send bound.
pub trait BufferIo {
    /// Reads once from `stream`; `Ok(0)` means the peer closed.
    async fn read_from(&mut self, stream: &mut TcpStream) -> io::Result<usize>;
    /// Reads without waiting; `Ok(None)` when nothing is there yet.
    fn try_read_from(&mut self, stream: &TcpStream) -> io::Result<Option<usize>>;
    /// Waits until the buffer starts with one whole message (which must fit) and returns its
    /// header. For login-time and control messages, not relayed results.
    async fn read_message(&mut self, stream: &mut TcpStream, what: &str) -> Result<Header>;
    /// Waits for one whole message at the head and returns its tag and body, consuming it; it
    /// may be larger than the buffer (up to `frame_bytes_max`).
    async fn read_frame(&mut self, stream: &mut TcpStream, what: &str, frame_bytes_max: usize)
        -> Result<(u8, Vec<u8>)>;
    /// The body of a whole message at the head.
    fn body(&self, header: Header) -> &[u8];
}

impl BufferIo for Buffer {
    /// Reads once from `stream`; `Ok(0)` means the peer closed.
    async fn read_from(&mut self, stream: &mut TcpStream) -> io::Result<usize> {
        let spare = self.spare();
        debug_assert!(!spare.is_empty(), "a read into no space would look like EOF");
        let count = stream.read(spare).await?;
        self.commit(count);
        Ok(count)
    }

    /// Reads without waiting; `Ok(None)` when nothing is there yet.
    fn try_read_from(&mut self, stream: &TcpStream) -> io::Result<Option<usize>> {
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
    async fn read_message(&mut self, stream: &mut TcpStream, what: &str) -> Result<Header> {
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
    async fn read_frame(
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
            read_more(self, stream, what).await?;
        };
        let frame_len = header.frame_len();
        if frame_len <= self.capacity() {
            while self.pending().len() < frame_len {
                read_more(self, stream, what).await?;
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

    /// The body of a whole message at the head.
    fn body(&self, header: Header) -> &[u8] {
        &self.pending()[HEADER_LEN..header.frame_len()]
    }
}

/// Reads more into `buffer`; the peer closing is an error here.
async fn read_more(buffer: &mut Buffer, stream: &mut TcpStream, what: &str) -> Result<()> {
    let count = buffer.read_from(stream).await.map_err(|e| DispatchError::io(format!("reading from {what}"), e))?;
    if count == 0 {
        return Err(closed(what));
    }
    Ok(())
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
