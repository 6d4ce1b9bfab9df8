//! Small async helpers over a socket and its [`Buffer`], shared by client and server code.

use std::io;

use bypass_wire::frame::{read_header, Header};
use bypass_wire::WireError;
use tokio::net::TcpStream;

use crate::buffer::Buffer;
use crate::stream::Stream;

/// Why reading a whole message failed, before it is attributed to a client or a server.
#[derive(Debug)]
pub enum ReadFailure {
    Io(io::Error),
    Protocol(WireError),
}

impl From<io::Error> for ReadFailure {
    fn from(error: io::Error) -> Self {
        ReadFailure::Io(error)
    }
}

/// Reads once into the buffer's spare space; `Ok(0)` means the peer closed.
///
/// Uses `AsyncRead` rather than `try_read`: on epoll, tokio clears a socket's readiness after a
/// short read, so the next wait goes straight to epoll instead of costing a `recv` that returns
/// EAGAIN. `try_read` keeps the stale readiness and wastes that system call.
pub async fn read_some(stream: &mut Stream, buffer: &mut Buffer) -> io::Result<usize> {
    let spare = buffer.spare();
    debug_assert!(!spare.is_empty(), "a read into no space would look like EOF");
    let count = stream.read(spare).await?;
    buffer.commit(count);
    Ok(count)
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection")
}

/// Waits until the buffer starts with one whole tagged message and returns its header. The
/// message must fit the buffer: this is for login-time messages, not relayed traffic.
pub async fn read_message(
    stream: &mut Stream,
    buffer: &mut Buffer,
    message_size_max: u32,
) -> Result<Header, ReadFailure> {
    let limit = message_size_max.min(buffer.capacity() as u32 - 1);
    loop {
        if let Some(header) = read_header(buffer.pending(), limit).map_err(ReadFailure::Protocol)? {
            if buffer.pending().len() >= header.frame_len() {
                return Ok(header);
            }
        }
        if read_some(stream, buffer).await? == 0 {
            return Err(ReadFailure::Io(closed()));
        }
    }
}

/// Sleeps until `deadline`, or forever when there is none (a `select!` branch that never fires).
pub async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

/// The body of the message [`read_message`] returned.
pub fn body(buffer: &Buffer, header: Header) -> &[u8] {
    &buffer.pending()[bypass_wire::HEADER_LEN..header.frame_len()]
}

/// Sets the socket options every relayed connection wants.
pub fn tune(stream: &TcpStream) {
    // Requests and answers are small and latency-bound: never wait to coalesce.
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
}
