//! A small blocking PostgreSQL client: login, simple queries, and payload queries verified as
//! they stream in. The load generator and the tests use it; nothing here allocates per row.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::time::Duration;

use bypass_wire::frame::read_header;
use bypass_wire::{frontend, BackendMessage, TransactionStatus, HEADER_LEN};

use crate::payload::Verifier;
use bypass_dispatch::error::{DispatchError, Result};
use bypass_dispatch::pglogin::{server_error, Login, LoginRequest, LoginStep, Welcome};

/// Initial bytes of the read buffer: many payload rows per `read`.
pub const READ_BUFFER_BYTES: usize = 256 * 1024;
/// The largest single message the client accepts (the buffer grows up to this for one message).
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// A logged-in connection.
pub struct PgConnection {
    stream: TcpStream,
    buffer: Vec<u8>,
    /// Unconsumed bytes are `buffer[start..end]`.
    start: usize,
    end: usize,
    out: Vec<u8>,
    pub welcome: Welcome,
    /// Transaction status of the last ReadyForQuery.
    pub status: TransactionStatus,
}

/// What a simple query returned: rows of text values (NULL = `None`) and the command tags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryResult {
    pub rows: Vec<Vec<Option<String>>>,
    pub tags: Vec<String>,
}

impl PgConnection {
    /// Connects and logs in.
    pub fn connect(address: SocketAddr, request: LoginRequest, timeout: Duration) -> Result<Self> {
        let stream = TcpStream::connect_timeout(&address, timeout)
            .map_err(|e| DispatchError::io(format!("connecting to {address}"), e))?;
        stream.set_nodelay(true).map_err(|e| DispatchError::io("TCP_NODELAY", e))?;
        stream.set_read_timeout(Some(timeout)).map_err(|e| DispatchError::io("read timeout", e))?;
        let mut connection = PgConnection {
            stream,
            buffer: vec![0; READ_BUFFER_BYTES],
            start: 0,
            end: 0,
            out: Vec::with_capacity(1024),
            welcome: Welcome::default(),
            status: TransactionStatus::Idle,
        };
        connection.login(request)?;
        Ok(connection)
    }

    fn login(&mut self, request: LoginRequest) -> Result<()> {
        let (mut login, startup) = Login::start(request);
        self.write(&startup)?;
        loop {
            let (tag, body) = self.next_message()?;
            let message = BackendMessage::decode(tag, &self.buffer[body])?;
            match login.on_message(message)? {
                LoginStep::Send(bytes) => self.write(&bytes)?,
                LoginStep::Continue => {}
                LoginStep::Done(welcome) => {
                    self.welcome = welcome;
                    return Ok(());
                }
            }
        }
    }

    /// Sets how long a read may block (the benchmark and tests bound every wait).
    pub fn set_read_timeout(&self, timeout: Duration) -> Result<()> {
        self.stream.set_read_timeout(Some(timeout)).map_err(|e| DispatchError::io("read timeout", e))
    }

    /// The local address (the client's port identifies the flow in the steering map).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.stream.local_addr().map_err(|e| DispatchError::io("local address", e))
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).map_err(|e| DispatchError::io("sending to the server", e))
    }

    /// Sends a simple Query without waiting for its answer (for pipelining).
    pub fn send_query(&mut self, sql: &str) -> Result<()> {
        self.out.clear();
        frontend::build::query(&mut self.out, sql);
        self.stream.write_all(&self.out).map_err(|e| DispatchError::io("sending a query", e))
    }

    /// Sends a simple Query and closes the sending side in the same segment: the query waits
    /// corked (TCP_CORK) until the FIN joins it, so the server learns both at once — a client
    /// that leaves right after its last query, without Terminate.
    pub fn send_query_and_close(&mut self, sql: &str) -> Result<()> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.stream);
        let cork: libc::c_int = 1;
        // SAFETY: setsockopt reads `cork`, a live c_int of the size passed.
        let status = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_CORK,
                (&cork as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if status != 0 {
            return Err(DispatchError::io("TCP_CORK", std::io::Error::last_os_error()));
        }
        self.send_query(sql)?;
        self.stream.shutdown(std::net::Shutdown::Write).map_err(|e| DispatchError::io("closing the sending side", e))
    }

    /// Reads until the server closes the connection; bytes instead are a protocol error.
    pub fn expect_closed(&mut self) -> Result<()> {
        if self.end > self.start {
            return Err(DispatchError::Protocol("bytes after the last answer".into()));
        }
        let mut probe = [0u8; 1];
        match self.stream.read(&mut probe) {
            Ok(0) => Ok(()),
            Ok(_) => Err(DispatchError::Protocol("bytes after the last answer".into())),
            Err(e) => Err(DispatchError::io("waiting for the server to close", e)),
        }
    }

    /// Sends raw bytes (tests use it to send messages the builder has no helper for).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.write(bytes)
    }

    /// Reads one query's answer up to ReadyForQuery, verifying every row with `verifier`.
    /// Returns the payload bytes. A server error is returned after its ReadyForQuery.
    pub fn read_payload(&mut self, verifier: &mut Verifier) -> Result<u64> {
        let mut failure = None;
        loop {
            let (tag, body) = self.next_message()?;
            match tag {
                b'D' if failure.is_none() => {
                    if let Err(error) = verify_row(&self.buffer[body], verifier) {
                        failure = Some(error);
                    }
                }
                b'E' => {
                    if let BackendMessage::ErrorResponse(fields) = BackendMessage::decode(tag, &self.buffer[body])? {
                        failure.get_or_insert(server_error(&fields));
                    }
                }
                b'Z' => {
                    self.status = ready_status(&self.buffer[body])?;
                    return match failure {
                        Some(error) => Err(error),
                        None => verifier.finish(),
                    };
                }
                _ => {}
            }
        }
    }

    /// Runs a simple query and collects its rows and command tags.
    pub fn query(&mut self, sql: &str) -> Result<QueryResult> {
        self.send_query(sql)?;
        self.read_result()
    }

    /// Reads one answer up to ReadyForQuery, collecting rows and tags.
    pub fn read_result(&mut self) -> Result<QueryResult> {
        let mut result = QueryResult::default();
        let mut failure = None;
        loop {
            let (tag, body) = self.next_message()?;
            match BackendMessage::decode(tag, &self.buffer[body])? {
                BackendMessage::DataRow(values) => result
                    .rows
                    .push(values.iter().map(|v| v.map(|b| String::from_utf8_lossy(b).into_owned())).collect()),
                BackendMessage::CommandComplete(text) => result.tags.push(String::from_utf8_lossy(text).into_owned()),
                BackendMessage::ErrorResponse(fields) => {
                    failure.get_or_insert(server_error(&fields));
                }
                BackendMessage::ReadyForQuery(status) => {
                    self.status = status;
                    return failure.map_or(Ok(result), Err);
                }
                _ => {}
            }
        }
    }

    /// Sends Terminate and closes.
    pub fn terminate(mut self) {
        self.out.clear();
        frontend::build::terminate(&mut self.out);
        let _ = self.stream.write_all(&self.out);
    }

    /// Returns the next whole message: its tag and the body's range in the buffer. The range is
    /// valid until the next call.
    fn next_message(&mut self) -> Result<(u8, Range<usize>)> {
        loop {
            let pending = &self.buffer[self.start..self.end];
            if let Some(header) = read_header(pending, MESSAGE_BYTES_MAX as u32)? {
                let frame_len = header.frame_len();
                if pending.len() >= frame_len {
                    let body = self.start + HEADER_LEN..self.start + frame_len;
                    self.start += frame_len;
                    return Ok((header.tag, body));
                }
                self.make_room(frame_len);
            } else {
                self.make_room(HEADER_LEN);
            }
            self.fill()?;
        }
    }

    /// Ensures a frame of `frame_len` bytes fits after `start`.
    fn make_room(&mut self, frame_len: usize) {
        if self.start + frame_len <= self.buffer.len() {
            return;
        }
        self.buffer.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        if frame_len > self.buffer.len() {
            self.buffer.resize(frame_len, 0);
        }
    }

    fn fill(&mut self) -> Result<()> {
        assert!(self.end < self.buffer.len(), "make_room leaves space for the frame being waited on");
        let count = self
            .stream
            .read(&mut self.buffer[self.end..])
            .map_err(|e| DispatchError::io("reading from the server", e))?;
        if count == 0 {
            let error = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "server closed the connection");
            return Err(DispatchError::io("reading from the server", error));
        }
        self.end += count;
        Ok(())
    }
}

fn verify_row(body: &[u8], verifier: &mut Verifier) -> Result<()> {
    // DataRow body: Int16 column count, then per column Int32 length + bytes.
    if body.len() < 6 || body[..2] != [0, 1] {
        return Err(DispatchError::Protocol("payload row must have exactly one column".into()));
    }
    let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
    let value = usize::try_from(len).ok().and_then(|len| body.get(6..6 + len));
    match value {
        Some(value) if 6 + value.len() == body.len() => verifier.row(value),
        _ => Err(DispatchError::Protocol(format!("malformed payload row (length {len})"))),
    }
}

fn ready_status(body: &[u8]) -> Result<TransactionStatus> {
    body.first()
        .copied()
        .and_then(TransactionStatus::from_byte)
        .ok_or_else(|| DispatchError::Protocol("malformed ReadyForQuery".into()))
}
