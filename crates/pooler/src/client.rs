//! A client connection as the pooler holds it from accept to exit: its socket (plaintext or
//! TLS), its fixed read buffer and framing state, a scratch buffer for replies, and its shadow
//! when its database is mirrored.

use bypass_wire::backend::build;
use bypass_wire::frame::Scanner;
use bypass_wire::Severity;
use tokio::net::TcpStream;

use crate::buffer::Buffer;
pub use crate::buffer::CLIENT_BUFFER_BYTES;
use crate::error::PoolerError;
use crate::io::read_some;
use crate::mirror::ClientMirror;
use crate::stream::Stream;

/// The client's socket, its read buffer and framing state, a scratch buffer for replies, and
/// its shadow when its database is mirrored.
pub struct ClientSide {
    pub stream: Stream,
    pub buffer: Buffer,
    pub scanner: Scanner,
    pub out: Vec<u8>,
    pub mirror: Option<ClientMirror>,
}

impl ClientSide {
    pub fn new(stream: TcpStream) -> Self {
        Self::over(Stream::Plain(stream))
    }

    /// A client on an already negotiated connection (plaintext or TLS).
    pub fn over(stream: Stream) -> Self {
        ClientSide {
            stream,
            buffer: Buffer::with_capacity(CLIENT_BUFFER_BYTES),
            scanner: Scanner::new(),
            out: Vec::with_capacity(512),
            mirror: None,
        }
    }

    /// A client on a negotiated connection whose first bytes are already in `buffer`.
    pub fn with_buffer(stream: Stream, buffer: Buffer) -> Self {
        ClientSide { stream, buffer, scanner: Scanner::new(), out: Vec::with_capacity(512), mirror: None }
    }

    /// Reads once into the buffer; `Ok(0)` means the client closed. Where a logged-in client's
    /// bytes are read in user space, so a user-space mirror copies them here (the kernel path
    /// in `session/kernel.rs` reads on its own: its clients are never mirrored in user space).
    pub async fn read_some(&mut self) -> std::io::Result<usize> {
        let count = read_some(&mut self.stream, &mut self.buffer).await?;
        if let Some(mirror) = &self.mirror {
            let pending = self.buffer.pending();
            mirror.copy(&pending[pending.len() - count..]);
        }
        Ok(count)
    }

    /// Writes and clears `out`.
    pub async fn flush(&mut self) -> Result<(), PoolerError> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await.map_err(PoolerError::ClientIo)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Tells the client why it is being disconnected, if it can still be told.
    pub async fn send_fatal(&mut self, error: &PoolerError) {
        let Some((code, text)) = error.client_report() else { return };
        self.out.clear();
        build::error_with_code(&mut self.out, Severity::Fatal, &code, &text);
        let _ = self.flush().await;
    }
}
