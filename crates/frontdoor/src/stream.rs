//! One connection type for both sides of every server: plaintext TCP, TLS over TCP, or (clients
//! of the pooler's `unix_socket_dir` only) a Unix-domain socket.
//!
//! Plaintext stays as cheap as a bare `TcpStream`: a read or write is one `match` and then the
//! socket's own call. TLS is boxed because a rustls session is about a kilobyte of state that
//! plaintext connections should not carry. The TCP socket is reachable ([`Stream::tcp`]) for
//! socket options and the kernel fast path (plaintext only).

use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsStream;

/// A client's or a server's connection.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// A local client on a Unix-domain socket (no TLS there, as PostgreSQL).
    Unix(UnixStream),
}

impl Stream {
    /// The TCP socket under the connection; `None` for a Unix-domain socket.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Plain(stream) => Some(stream),
            Stream::Tls(tls) => Some(tls.get_ref().0),
            Stream::Unix(_) => None,
        }
    }

    /// The peer's address; `None` for a Unix-domain socket (or a socket already closed).
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp()?.peer_addr().ok()
    }

    /// Our end's address; `None` for a Unix-domain socket.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp()?.local_addr().ok()
    }

    pub fn is_unix(&self) -> bool {
        matches!(self, Stream::Unix(_))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// The bare socket of a plaintext TCP connection; any other is given back unchanged.
    pub fn into_plain(self) -> Result<TcpStream, Stream> {
        match self {
            Stream::Plain(stream) => Ok(stream),
            tls => Err(tls),
        }
    }

    /// Reads once; `Ok(0)` means the peer closed. Cancel-safe (used inside `select!`): TCP keeps
    /// unread bytes in the kernel, rustls keeps undelivered plaintext in its session.
    pub async fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(stream) => stream.read(buffer).await,
            Stream::Tls(tls) => tls.read(buffer).await,
            Stream::Unix(stream) => stream.read(buffer).await,
        }
    }

    /// Writes every byte. TLS also flushes: rustls may hold encrypted records back after a
    /// partial socket write, and nothing else would push them out.
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Stream::Plain(stream) => stream.write_all(bytes).await,
            Stream::Unix(stream) => stream.write_all(bytes).await,
            Stream::Tls(tls) => {
                tls.write_all(bytes).await?;
                tls.flush().await
            }
        }
    }

    /// Reads whatever is ready without waiting: `WouldBlock` when nothing is. For plaintext this
    /// is one `recv`; for TLS a record that carries no data (a session ticket) also counts as
    /// nothing.
    pub fn try_read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(stream) => stream.try_read(buffer),
            Stream::Unix(stream) => stream.try_read(buffer),
            Stream::Tls(tls) => {
                let mut context = Context::from_waker(Waker::noop());
                let mut read_buffer = ReadBuf::new(buffer);
                match Pin::new(tls.as_mut()).poll_read(&mut context, &mut read_buffer) {
                    Poll::Ready(Ok(())) => Ok(read_buffer.filled().len()),
                    Poll::Ready(Err(error)) => Err(error),
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }

    /// Moves the socket's registration to the reactor of the runtime this runs on. Fails if the
    /// peer closed or sent bytes: a fresh registration starts with no readiness, so that must be
    /// checked here with one `recv(MSG_PEEK)`.
    pub fn rehome(self) -> io::Result<Stream> {
        match self {
            Stream::Plain(stream) => {
                let stream = stream.into_std()?;
                ensure_silent(&stream)?;
                Ok(Stream::Plain(TcpStream::from_std(stream)?))
            }
            Stream::Tls(mut tls) => {
                // The TLS session cannot be taken apart and rebuilt, so its socket is swapped
                // for a duplicate registered here; dropping the old one leaves the old reactor.
                let duplicate = std::net::TcpStream::from(tls.get_ref().0.as_fd().try_clone_to_owned()?);
                ensure_silent(&duplicate)?;
                duplicate.set_nonblocking(true)?;
                let local = TcpStream::from_std(duplicate)?;
                drop(std::mem::replace(tls_socket(&mut tls), local));
                Ok(Stream::Tls(tls))
            }
            // Only servers move between shards, and servers are reached over TCP.
            Stream::Unix(_) => Err(io::Error::new(io::ErrorKind::Unsupported, "a Unix-socket client never moves")),
        }
    }

    /// Closes the sending side (TLS sends close_notify first).
    pub async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(stream) => stream.shutdown().await,
            Stream::Tls(tls) => tls.shutdown().await,
            Stream::Unix(stream) => stream.shutdown().await,
        }
    }
}

impl std::os::fd::AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Stream::Plain(stream) => stream.as_raw_fd(),
            Stream::Tls(tls) => tls.get_ref().0.as_raw_fd(),
            Stream::Unix(stream) => stream.as_raw_fd(),
        }
    }
}

fn tls_socket(tls: &mut TlsStream<TcpStream>) -> &mut TcpStream {
    match tls {
        TlsStream::Client(client) => client.get_mut().0,
        TlsStream::Server(server) => server.get_mut().0,
    }
}

fn ensure_silent(stream: &std::net::TcpStream) -> io::Result<()> {
    match stream.peek(&mut [0u8; 1]) {
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(()),
        _ => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "peer closed or spoke while idle")),
    }
}
