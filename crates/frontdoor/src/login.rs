//! The steps of connection start, each a thin async shell around a sans-I/O piece of
//! `bypass-wire`: negotiation, the first packet, the method decision, the password exchange, the
//! welcome. [`crate::FrontDoor::accept`] runs them all; the pooler runs them one by one because
//! it looks secrets up and chooses pools between them.
//!
//! ```text
//!  negotiate: [GSSENCRequest ─► 'N'] [SSLRequest ─► 'S' + TLS | 'N'] | direct TLS (ALPN)
//!  read_first: StartupMessage ─► StartupRequest | CancelRequest ─► CancelRequest
//!  choose_method (hba or fixed) ─► authenticate (exchange or mock) ─► Proof
//!  write_welcome: AuthenticationOk, ParameterStatus…, BackendKeyData, ReadyForQuery
//! ```

use std::io;
use std::net::IpAddr;

use bypass_wire::auth::{Exchange, Method, MockKey, Proof, Refusal, Step};
use bypass_wire::auth_file::Secret;
use bypass_wire::backend::build;
use bypass_wire::frame::read_header;
use bypass_wire::hba::{Connection, Hba};
use bypass_wire::startup::{decode_startup, STARTUP_PACKET_MAX};
use bypass_wire::tag;
use bypass_wire::{Authentication, Buffer, SqlState, StartupPacket, StartupRequest, TransactionStatus};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use crate::cancel::CancelKey;
use crate::stream::Stream;
use crate::tls::ServerTls;

/// Encryption requests a client may send before its startup packet (GSSENCRequest, then
/// SSLRequest, as libpq does with `gssencmode=prefer`).
pub const ENCRYPTION_REQUESTS_MAX: usize = 2;
/// Password messages one exchange reads at most (SCRAM needs two).
const EXCHANGE_ROUNDS_MAX: usize = 3;

/// Why connection start ended before a session.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// The client's socket failed or the client left: there is no one to tell.
    #[error("client connection: {0}")]
    Io(#[source] io::Error),
    /// The client is refused with this FATAL.
    #[error("{0}")]
    Refused(Refusal),
}

impl From<Refusal> for LoginError {
    fn from(refusal: Refusal) -> Self {
        LoginError::Refused(refusal)
    }
}

fn protocol_violation(message: impl Into<String>) -> LoginError {
    LoginError::Refused(Refusal::new(SqlState::PROTOCOL_VIOLATION, message))
}

fn closed() -> LoginError {
    LoginError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "client closed the connection during login"))
}

/// A CancelRequest: the key it names. The connection carries nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRequest {
    pub process_id: i32,
    /// 4 bytes in protocol 3.0, up to 256 in 3.2.
    pub secret: Vec<u8>,
}

/// What a client's first packet after negotiation asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum First {
    Startup(StartupRequest),
    Cancel(CancelRequest),
}

/// Negotiates encryption on a fresh connection: answers GSSENCRequest with 'N', SSLRequest with
/// 'S' and a TLS handshake (or 'N' without `tls`), accepts PostgreSQL 17's direct TLS (ALPN
/// `postgresql` required). Bytes of the startup packet already read stay in `buffer`. A
/// refusal here is answered here, in plaintext, since no stream is handed back.
pub async fn negotiate(tls: Option<&ServerTls>, mut tcp: TcpStream, buffer: &mut Buffer) -> Result<Stream, LoginError> {
    let negotiated = match direct_tls(tls, &tcp).await {
        Ok(true) => Ok(Negotiated::Tls { direct: true }),
        Ok(false) => negotiate_on(tls, &mut tcp, buffer).await,
        Err(error) => Err(error),
    };
    match answer_refusal(negotiated, &mut tcp).await? {
        Negotiated::Plain => Ok(Stream::Plain(tcp)),
        Negotiated::Tls { direct } => {
            accept_tls(tls.expect("TLS is negotiated only when configured"), tcp, direct).await
        }
    }
}

/// Negotiation on a Unix-domain socket: encryption requests are answered 'N' (PostgreSQL offers
/// no TLS there either), so the client goes on in plaintext.
pub async fn negotiate_unix(mut unix: UnixStream, buffer: &mut Buffer) -> Result<Stream, LoginError> {
    let negotiated = negotiate_on(None, &mut unix, buffer).await;
    answer_refusal(negotiated, &mut unix).await?;
    Ok(Stream::Unix(unix))
}

/// Whether a client with `tls` configured opened with a TLS handshake (PostgreSQL 17 direct TLS).
async fn direct_tls(tls: Option<&ServerTls>, tcp: &TcpStream) -> Result<bool, LoginError> {
    if tls.is_none() {
        return Ok(false);
    }
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await.map_err(LoginError::Io)? == 0 {
        return Err(closed());
    }
    Ok(first[0] == tag::encryption::TLS_HANDSHAKE)
}

/// A refusal during negotiation is answered here, in plaintext, since no stream is handed back.
async fn answer_refusal<S: AsyncWrite + Unpin>(
    negotiated: Result<Negotiated, LoginError>,
    socket: &mut S,
) -> Result<Negotiated, LoginError> {
    if let Err(LoginError::Refused(refusal)) = &negotiated {
        let mut out = Vec::new();
        refusal.write_fatal(&mut out);
        let _ = write_socket(socket, &out).await;
    }
    negotiated
}

enum Negotiated {
    Plain,
    Tls { direct: bool },
}

async fn negotiate_on<S: AsyncRead + AsyncWrite + Unpin>(
    tls: Option<&ServerTls>,
    socket: &mut S,
    buffer: &mut Buffer,
) -> Result<Negotiated, LoginError> {
    assert!(buffer.capacity() > STARTUP_PACKET_MAX as usize, "a login buffer holds a whole startup packet");
    let mut requests = 0;
    loop {
        let Some((packet, used)) = decode_startup(buffer.pending()).map_err(invalid_startup)? else {
            read_socket(socket, buffer).await?;
            continue;
        };
        let answer_tls = match packet {
            StartupPacket::SslRequest => tls,
            StartupPacket::GssEncRequest => None,
            StartupPacket::Startup(_) | StartupPacket::Cancel { .. } => return Ok(Negotiated::Plain),
        };
        requests += 1;
        if requests > ENCRYPTION_REQUESTS_MAX {
            return Err(protocol_violation("too many encryption requests"));
        }
        buffer.consume(used);
        match answer_tls {
            Some(_) => {
                // Bytes after the SSLRequest were sent in clear before the handshake: taking
                // them as part of the encrypted session would let a man in the middle inject them.
                if !buffer.is_empty() {
                    return Err(protocol_violation("received unencrypted data after SSL request"));
                }
                write_socket(socket, &[tag::encryption::ACCEPT]).await?;
                return Ok(Negotiated::Tls { direct: false });
            }
            None => write_socket(socket, &[tag::encryption::REFUSE]).await?,
        }
    }
}

async fn read_socket<S: AsyncRead + Unpin>(socket: &mut S, buffer: &mut Buffer) -> Result<(), LoginError> {
    let count = socket.read(buffer.spare()).await.map_err(LoginError::Io)?;
    if count == 0 {
        return Err(closed());
    }
    buffer.commit(count);
    Ok(())
}

async fn write_socket<S: AsyncWrite + Unpin>(socket: &mut S, bytes: &[u8]) -> Result<(), LoginError> {
    tokio::io::AsyncWriteExt::write_all(socket, bytes).await.map_err(LoginError::Io)
}

async fn accept_tls(tls: &ServerTls, tcp: TcpStream, direct: bool) -> Result<Stream, LoginError> {
    let session = tls.acceptor.accept(tcp).await.map_err(LoginError::Io)?;
    // PostgreSQL 17 requires ALPN with direct TLS so that a TLS port of another protocol
    // cannot be confused with ours.
    if direct && session.get_ref().1.alpn_protocol() != Some(crate::tls::ALPN_POSTGRESQL) {
        return Err(LoginError::Refused(Refusal::new(
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            "direct TLS connection without ALPN \"postgresql\"",
        )));
    }
    Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(session))))
}

fn invalid_startup(error: bypass_wire::WireError) -> LoginError {
    protocol_violation(format!("invalid startup packet: {error}"))
}

async fn read_some(stream: &mut Stream, buffer: &mut Buffer) -> Result<(), LoginError> {
    if buffer.spare().is_empty() {
        return Err(protocol_violation("login message larger than the buffer"));
    }
    match stream.read(buffer.spare()).await.map_err(LoginError::Io)? {
        0 => Err(closed()),
        count => {
            buffer.commit(count);
            Ok(())
        }
    }
}

/// Reads the client's first packet after negotiation: a StartupMessage or a CancelRequest.
pub async fn read_first(stream: &mut Stream, buffer: &mut Buffer) -> Result<First, LoginError> {
    loop {
        let Some((packet, used)) = decode_startup(buffer.pending()).map_err(invalid_startup)? else {
            read_some(stream, buffer).await?;
            continue;
        };
        let first = match packet {
            StartupPacket::Startup(params) => First::Startup(StartupRequest::from_params(&params)?),
            StartupPacket::Cancel { process_id, secret_key } => {
                First::Cancel(CancelRequest { process_id, secret: secret_key.to_vec() })
            }
            StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                return Err(protocol_violation("encryption request after negotiation"))
            }
        };
        buffer.consume(used);
        return Ok(first);
    }
}

/// The method for a client: the first matching hba rule, else `fallback`. `reject` and no
/// matching rule are refusals (28000) with PostgreSQL's wording.
pub fn choose_method(
    hba: Option<&Hba>,
    fallback: Method,
    address: IpAddr,
    tls: bool,
    request: &StartupRequest,
) -> Result<Method, Refusal> {
    let Some(hba) = hba else { return Ok(fallback) };
    let (database, user) = (request.database.as_str(), request.user.as_str());
    let connection = Connection { database, user, address, tls };
    let encryption = if tls { "SSL encryption" } else { "no encryption" };
    let refused = |text: String| Refusal::new(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, text);
    match hba.method_for(&connection) {
        Some(Method::Reject) => Err(refused(format!(
            "hba file rejects connection for host \"{address}\", user \"{user}\", database \"{database}\", {encryption}"
        ))),
        Some(method) => Ok(method),
        None => Err(refused(format!(
            "no hba entry for host \"{address}\", user \"{user}\", database \"{database}\", {encryption}"
        ))),
    }
}

/// One authentication attempt: who, how, and against what.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    pub method: Method,
    pub user: &'a str,
    /// The user's stored secret; `None` for a user the server does not know (mock exchange).
    pub secret: Option<&'a Secret>,
    pub mock: &'a MockKey,
    /// Largest password message read.
    pub message_size_max: u32,
}

/// Proves the client's identity by `attempt.method`. On success `out` may hold a SASLFinal,
/// which must reach the client before the welcome (append the welcome and send both).
pub async fn authenticate(
    stream: &mut Stream,
    buffer: &mut Buffer,
    out: &mut Vec<u8>,
    attempt: Attempt<'_>,
) -> Result<Proof, LoginError> {
    let user = attempt.user;
    match attempt.method {
        Method::Trust => return Ok(Proof::Trust),
        Method::Cert => return check_certificate(stream, user).map_err(LoginError::Refused),
        Method::Reject => {
            return Err(LoginError::Refused(Refusal::new(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, "rejected")))
        }
        Method::Md5 | Method::ScramSha256 | Method::Password => {}
    }
    let mut exchange = Exchange::start(attempt.method, user, attempt.secret, attempt.mock, out)
        .expect("password methods always start an exchange");
    for _ in 0..EXCHANGE_ROUNDS_MAX {
        stream.write_all(out).await.map_err(LoginError::Io)?;
        out.clear();
        let body = read_password_message(stream, buffer, attempt.message_size_max).await?;
        match exchange.respond(&body, out) {
            Ok(Step::Continue) => {}
            Ok(Step::Done(proof)) => return Ok(proof),
            Err(failure) => return Err(LoginError::Refused(failure.refusal(user))),
        }
    }
    Err(protocol_violation("authentication exchange did not end"))
}

/// `cert`: the client's verified certificate must carry the user name as its common name.
pub fn check_certificate(stream: &Stream, user: &str) -> Result<Proof, Refusal> {
    let refused = |text: String| Refusal::new(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, text);
    match crate::tls::client_certificate_name(stream) {
        Some(name) if name == user => Ok(Proof::Certificate),
        Some(_) => Err(refused(format!("certificate authentication failed for user \"{user}\""))),
        None => Err(refused(format!("connection requires a valid client certificate for user \"{user}\""))),
    }
}

/// Reads one `'p'` message and returns its body.
async fn read_password_message(stream: &mut Stream, buffer: &mut Buffer, size_max: u32) -> Result<Vec<u8>, LoginError> {
    let limit = size_max.min(buffer.capacity() as u32 - 1);
    loop {
        let header = read_header(buffer.pending(), limit).map_err(|error| protocol_violation(error.to_string()))?;
        if let Some(header) = header.filter(|header| buffer.pending().len() >= header.frame_len()) {
            if header.tag != tag::frontend::PASSWORD {
                return Err(protocol_violation(format!(
                    "expected password response, got message type {:?}",
                    header.tag as char
                )));
            }
            let body = buffer.pending()[bypass_wire::HEADER_LEN..header.frame_len()].to_vec();
            buffer.consume(header.frame_len());
            return Ok(body);
        }
        read_some(stream, buffer).await?;
    }
}

/// Appends what a client sees once admitted: AuthenticationOk, every parameter as a
/// ParameterStatus, BackendKeyData and ReadyForQuery (idle).
pub fn write_welcome(out: &mut Vec<u8>, parameters: &[(String, String)], key: CancelKey) {
    build::authentication(out, &Authentication::Ok);
    for (name, value) in parameters {
        build::parameter_status(out, name.as_bytes(), value.as_bytes());
    }
    build::backend_key_data(out, key.process_id, &key.secret);
    build::ready_for_query(out, TransactionStatus::Idle);
}
