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
    /// A plaintext socket out of every reactor ([`Stream::park`]): the kernel fast path moves
    /// its bytes, and epoll would wake a reactor for each of them with nothing to do. The first
    /// async read or write registers it with the runtime it runs on; `None` if that failed.
    Parked(Option<std::net::TcpStream>),
}

impl Stream {
    /// The TCP socket under the connection; `None` for a Unix-domain socket.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Plain(stream) => Some(stream),
            Stream::Tls(tls) => Some(tls.get_ref().0),
            Stream::Unix(_) | Stream::Parked(_) => None,
        }
    }

    /// The peer's address; `None` for a Unix-domain socket (or a socket already closed).
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Stream::Parked(socket) => socket.as_ref()?.peer_addr().ok(),
            _ => self.tcp()?.peer_addr().ok(),
        }
    }

    /// Our end's address; `None` for a Unix-domain socket.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Stream::Parked(socket) => socket.as_ref()?.local_addr().ok(),
            _ => self.tcp()?.local_addr().ok(),
        }
    }

    pub fn is_parked(&self) -> bool {
        matches!(self, Stream::Parked(_))
    }

    /// Takes a plaintext socket out of its reactor (one `epoll_ctl`); any other stream stays
    /// as it is. Fails only if the reactor refused, and then the socket is closed (`Parked(None)`).
    pub fn park(&mut self) -> io::Result<()> {
        if let Stream::Plain(_) = self {
            let Stream::Plain(stream) = std::mem::replace(self, Stream::Parked(None)) else { unreachable!() };
            *self = Stream::Parked(Some(stream.into_std()?));
        }
        Ok(())
    }

    /// Registers a parked socket with the runtime this runs on (one `epoll_ctl`; the fresh
    /// registration reports what is already readable).
    fn unpark(&mut self) -> io::Result<()> {
        if let Stream::Parked(socket) = self {
            let socket = socket.take().ok_or_else(lost_socket)?;
            *self = Stream::Plain(TcpStream::from_std(socket)?);
        }
        Ok(())
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
        self.unpark()?;
        match self {
            Stream::Plain(stream) => stream.read(buffer).await,
            Stream::Tls(tls) => tls.read(buffer).await,
            Stream::Unix(stream) => stream.read(buffer).await,
            Stream::Parked(_) => Err(lost_socket()),
        }
    }

    /// Writes every byte. TLS also flushes: rustls may hold encrypted records back after a
    /// partial socket write, and nothing else would push them out.
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.unpark()?;
        match self {
            Stream::Plain(stream) => stream.write_all(bytes).await,
            Stream::Unix(stream) => stream.write_all(bytes).await,
            Stream::Parked(_) => Err(lost_socket()),
            Stream::Tls(tls) => {
                tls.write_all(bytes).await?;
                tls.flush().await
            }
        }
    }

    /// Reads whatever is ready without waiting: `WouldBlock` when nothing is. For plaintext this
    /// is one `recv`; for TLS a record that carries no data (a session ticket) also counts as
    /// nothing. A parked socket is read with one non-blocking `recv` and stays parked.
    pub fn try_read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(stream) => stream.try_read(buffer),
            Stream::Unix(stream) => stream.try_read(buffer),
            Stream::Parked(socket) => io::Read::read(&mut socket.as_ref().ok_or_else(lost_socket)?, buffer),
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
            // Registered where it is first read or written.
            parked @ Stream::Parked(_) => Ok(parked),
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
        self.unpark()?;
        match self {
            Stream::Plain(stream) => stream.shutdown().await,
            Stream::Tls(tls) => tls.shutdown().await,
            Stream::Unix(stream) => stream.shutdown().await,
            Stream::Parked(_) => Err(lost_socket()),
        }
    }
}

impl std::os::fd::AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Stream::Plain(stream) => stream.as_raw_fd(),
            Stream::Tls(tls) => tls.get_ref().0.as_raw_fd(),
            Stream::Unix(stream) => stream.as_raw_fd(),
            Stream::Parked(socket) => socket.as_ref().map_or(-1, |socket| socket.as_raw_fd()),
        }
    }
}

fn tls_socket(tls: &mut TlsStream<TcpStream>) -> &mut TcpStream {
    match tls {
        TlsStream::Client(client) => client.get_mut().0,
        TlsStream::Server(server) => server.get_mut().0,
    }
}

fn lost_socket() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "a parked socket could not rejoin a reactor")
}

fn ensure_silent(stream: &std::net::TcpStream) -> io::Result<()> {
    match stream.peek(&mut [0u8; 1]) {
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(()),
        _ => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "peer closed or spoke while idle")),
    }
}
