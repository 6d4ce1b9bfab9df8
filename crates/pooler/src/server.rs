//! A connection to a PostgreSQL server: login (trust, cleartext, MD5, SCRAM-SHA-256), the
//! pooler's own queries (reset, parameter sync) and the idle health check.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bypass_wire::backend::Fields;
use bypass_wire::frame::Scanner;
use bypass_wire::scram::{ClientExchange, ClientSecret, MECHANISM};
use bypass_wire::tag;
use bypass_wire::{auth_messages, frontend, startup, Authentication, BackendMessage, TransactionStatus};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::buffer::Buffer;
use crate::error::PoolerError;
use crate::io::{body, read_message, tune, ReadFailure};
use crate::lease::Lease;
use crate::params::ParamSet;
use crate::prepared::{ResponsePlan, ServerStatements};
use crate::stream::Stream;

/// Bytes of a server connection's read buffer: results stream through it.
pub const SERVER_BUFFER_BYTES: usize = 64 * 1024;
/// Longest cancel key we keep (PostgreSQL 18 sends at most 32 bytes).
const CANCEL_KEY_MAX: usize = 32;

/// How the pooler proves itself to a server.
#[derive(Debug, Clone)]
pub enum Credential {
    /// No password known: only `trust` servers accept us.
    None,
    Password(String),
    /// A stored `md5…` hash: answers MD5 challenges only.
    Md5Hash(String),
    /// Keys recovered from a client's SCRAM login, valid for a server with the same verifier.
    ScramKeys(ClientSecret),
}

impl Credential {
    /// True when both come from the same configured secret (keys learned from a client's SCRAM
    /// login stand for "none configured").
    pub fn same_source(&self, other: &Credential) -> bool {
        match (self, other) {
            (Credential::None | Credential::ScramKeys(_), Credential::None | Credential::ScramKeys(_)) => true,
            (Credential::Password(a), Credential::Password(b)) | (Credential::Md5Hash(a), Credential::Md5Hash(b)) => {
                a == b
            }
            _ => false,
        }
    }
}

/// Where and as whom a pool logs in.
#[derive(Debug, Clone)]
pub struct LoginTarget {
    pub address: SocketAddr,
    pub dbname: String,
    pub user: String,
    /// The configured host name: what `server_tls_sslmode = verify-full` checks.
    pub host: String,
    /// TLS towards this server, `None` when disabled.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// The `options` startup parameter servers are started with (`pass_options`).
    pub options: Option<String>,
}

impl LoginTarget {
    /// Same server, database and user (TLS settings are fixed for the process's life).
    pub fn same_backend(&self, other: &LoginTarget) -> bool {
        self.address == other.address
            && self.dbname == other.dbname
            && self.user == other.user
            && self.host == other.host
            && self.options == other.options
    }
}

/// A server's cancel key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendKey {
    pub process_id: i32,
    secret: [u8; CANCEL_KEY_MAX],
    secret_len: u8,
}

impl BackendKey {
    pub fn new(process_id: i32, secret_key: &[u8]) -> Option<Self> {
        let mut secret = [0; CANCEL_KEY_MAX];
        secret.get_mut(..secret_key.len())?.copy_from_slice(secret_key);
        Some(BackendKey { process_id, secret, secret_len: secret_key.len() as u8 })
    }

    pub fn secret(&self) -> &[u8] {
        &self.secret[..self.secret_len as usize]
    }
}

/// Bounds a server connection is created with.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub message_size_max: u32,
    /// Prepared statements kept on the server (least recently used ones are closed).
    pub statements_max: usize,
}

/// Everything the first login to a server told us, replayed to clients at their login.

#[derive(Debug, Clone, Default)]
pub struct Welcome {
    pub parameters: Vec<(String, String)>,
}

/// A logged-in server connection, owned by a pool or by the client using it.
pub struct ServerConn {
    pub stream: Stream,
    pub buffer: Buffer,
    pub scanner: Scanner,
    pub key: BackendKey,
    pub params: ParamSet,
    pub created_at: Instant,
    pub idle_since: Instant,
    /// Set when the server sent a FATAL error or broke protocol: never reuse it.
    pub broken: bool,
    /// Counts this connection in its pool until dropped.
    pub lease: Lease,
    /// The shard whose reactor the socket is registered with.
    pub home: usize,
    /// Prepared statements this server has (transaction mode).
    pub statements: ServerStatements,
    /// Requests in flight on this connection and how their answers are handled (transaction
    /// mode); empty whenever the server is in the pool. Kept here so its storage is reused.
    pub plan: ResponsePlan,
    /// Scratch for the pooler's own queries.
    scratch: Vec<u8>,
    /// A client changed session state here that is not carried over (see
    /// [`crate::session_state`]): reset before the next client gets this server.
    pub session_dirty: bool,
    /// The socket's place in the kernel fast path's maps, once it was lent there.
    pub kernel: Option<KernelSocket>,
}

impl ServerConn {
    /// Connects and logs in; returns the connection and what the server announced.
    pub async fn login(
        target: &LoginTarget,
        credential: &Credential,
        lease: Lease,
        limits: ServerLimits,
        shard: usize,
    ) -> Result<(Box<ServerConn>, Welcome), PoolerError> {
        let stream = TcpStream::connect(target.address)
            .await
            .map_err(|source| PoolerError::ServerConnect { address: target.address.to_string(), source })?;
        tune(&stream);
        let stream = crate::tls::connect_server(target.tls.as_deref(), stream, &target.host).await?;
        let now = Instant::now();
        // Boxed once per connection: pools, grants and links then move a pointer, not 300+ bytes.
        let mut server = Box::new(ServerConn {
            stream,
            buffer: Buffer::with_capacity(SERVER_BUFFER_BYTES),
            scanner: Scanner::new(),
            key: BackendKey::new(0, &[]).expect("an empty key fits"),
            params: ParamSet::default(),
            created_at: now,
            idle_since: now,
            broken: false,
            lease,
            home: shard,
            statements: ServerStatements::new(limits.statements_max),
            plan: ResponsePlan::default(),
            scratch: Vec::with_capacity(256),
            session_dirty: false,
            kernel: None,
        });
        let welcome = server.handshake(target, credential, limits.message_size_max).await?;
        Ok((server, welcome))
    }

    async fn handshake(
        &mut self,
        target: &LoginTarget,
        credential: &Credential,
        message_size_max: u32,
    ) -> Result<Welcome, PoolerError> {
        self.scratch.clear();
        let mut parameters = vec![("user", target.user.as_str()), ("database", target.dbname.as_str())];
        if let Some(options) = &target.options {
            parameters.push(("options", options));
        }
        startup::encode_startup(&mut self.scratch, &parameters);
        self.flush_scratch().await?;
        let mut welcome = Welcome::default();
        let mut scram = None;
        loop {
            let header =
                read_message(&mut self.stream, &mut self.buffer, message_size_max).await.map_err(server_failure)?;
            let message =
                BackendMessage::decode(header.tag, body(&self.buffer, header)).map_err(PoolerError::ServerProtocol)?;
            let done = match message {
                BackendMessage::Authentication(auth) => {
                    self.scratch.clear();
                    answer_auth(&auth, target, credential, &mut scram, &mut self.scratch)?;
                    false
                }
                BackendMessage::BackendKeyData { process_id, secret_key } => {
                    self.key = BackendKey::new(process_id, secret_key).ok_or(PoolerError::ServerProtocol(
                        bypass_wire::WireError::BadField { tag: 'K', field: "secret key length" },
                    ))?;
                    false
                }
                BackendMessage::ParameterStatus { name, value } => {
                    self.params.update(name, value);
                    welcome.parameters.push((lossy(name), lossy(value)));
                    false
                }
                BackendMessage::ErrorResponse(fields) => return Err(login_error(&fields)),
                BackendMessage::ReadyForQuery(_) => true,
                BackendMessage::NoticeResponse(_) | BackendMessage::NegotiateProtocolVersion { .. } => false,
                other => return Err(unexpected(other.tag())),
            };
            self.buffer.consume(header.frame_len());
            self.flush_scratch().await?;
            if done {
                return Ok(welcome);
            }
        }
    }

    async fn flush_scratch(&mut self) -> Result<(), PoolerError> {
        if !self.scratch.is_empty() {
            self.stream.write_all(&self.scratch).await.map_err(PoolerError::ServerIo)?;
            self.scratch.clear();
        }
        Ok(())
    }

    /// Runs one simple query of the pooler's own and swallows its answer. `what` names it in errors.
    pub async fn run_internal(
        &mut self,
        sql: &str,
        what: &'static str,
        message_size_max: u32,
    ) -> Result<(), PoolerError> {
        debug_assert!(self.buffer.is_empty() && self.scanner.at_boundary(), "internal query on a busy server");
        self.scratch.clear();
        frontend::build::query(&mut self.scratch, sql);
        self.flush_scratch().await?;
        let mut failure = None;
        loop {
            let header =
                read_message(&mut self.stream, &mut self.buffer, message_size_max).await.map_err(server_failure)?;
            let message =
                BackendMessage::decode(header.tag, body(&self.buffer, header)).map_err(PoolerError::ServerProtocol)?;
            let done = match message {
                BackendMessage::ParameterStatus { name, value } => {
                    self.params.update(name, value);
                    false
                }
                BackendMessage::ErrorResponse(fields) => {
                    self.broken |= fields.is_fatal();
                    failure = Some(query_error(what, &fields));
                    false
                }
                BackendMessage::ReadyForQuery(status) => {
                    self.broken |= status != TransactionStatus::Idle;
                    true
                }
                _ => false,
            };
            self.buffer.consume(header.frame_len());
            if done {
                return failure.map_or(Ok(()), Err);
            }
        }
    }

    /// Moves the socket's registration to the reactor of `shard`, the runtime this runs on: one
    /// `epoll_ctl` to leave the old reactor and one to join the new. A no-op at home. Fails if the
    /// server closed or spoke while idle: a fresh registration starts with no readiness, so
    /// [`Self::is_clean`] could not see that, and one `recv(MSG_PEEK)` checks it here instead.
    pub fn rehome(mut self: Box<Self>, shard: usize) -> io::Result<Box<ServerConn>> {
        if self.stream.is_parked() {
            self.home = shard; // It registers on its first read or write, on this shard.
            return Ok(self);
        }
        if self.home == shard {
            return Ok(self);
        }
        let ServerConn {
            stream,
            buffer,
            scanner,
            key,
            params,
            created_at,
            idle_since,
            broken,
            lease,
            home: _,
            statements,
            plan,
            scratch,
            session_dirty,
            kernel,
        } = *self;
        let stream = stream.rehome()?;
        let server = ServerConn {
            stream,
            buffer,
            scanner,
            key,
            params,
            created_at,
            idle_since,
            broken,
            lease,
            home: shard,
            statements,
            plan,
            scratch,
            session_dirty,
            kernel,
        };
        Ok(Box::new(server))
    }

    /// Takes the socket out of its shard's reactor while the kernel fast path moves its bytes
    /// (see [`bypass_frontdoor::stream::Stream::Parked`]); `home` stays where it last was, so a
    /// server taken back there costs no move. `None`: the reactor refused, the server is closed.
    pub fn park(mut self: Box<Self>) -> Option<Box<ServerConn>> {
        match self.stream.park() {
            Ok(()) => Some(self),
            Err(error) => {
                tracing::debug!(%error, "could not park a server socket; closing it");
                None
            }
        }
    }

    /// True if an idle server is still usable: no bytes or EOF arrived while it sat in the pool.
    /// Costs no system call unless the socket was reported readable.
    pub fn is_clean(&mut self) -> bool {
        if self.broken {
            return false;
        }
        match self.stream.try_read(self.buffer.spare()) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => true,
            // Unsolicited bytes (a FATAL from a terminated backend, a notice) or EOF: discard it.
            _ => false,
        }
    }

    pub fn age_ms(&self, now: Instant) -> u64 {
        now.duration_since(self.created_at).as_millis() as u64
    }

    pub fn idle_ms(&self, now: Instant) -> u64 {
        now.duration_since(self.idle_since).as_millis() as u64
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn server_failure(failure: ReadFailure) -> PoolerError {
    match failure {
        ReadFailure::Io(error) => PoolerError::ServerIo(error),
        ReadFailure::Protocol(error) => PoolerError::ServerProtocol(error),
    }
}

fn unexpected(tag: u8) -> PoolerError {
    PoolerError::ServerProtocol(bypass_wire::WireError::UnknownTag(tag as char))
}

fn login_error(fields: &Fields<'_>) -> PoolerError {
    PoolerError::ServerLogin {
        code: lossy(fields.code().unwrap_or(b"08006")),
        message: lossy(fields.message().unwrap_or(b"server refused the login")),
    }
}

fn query_error(what: &'static str, fields: &Fields<'_>) -> PoolerError {
    PoolerError::ServerQuery {
        what,
        code: lossy(fields.code().unwrap_or(b"XX000")),
        message: lossy(fields.message().unwrap_or(b"server error")),
    }
}

fn no_credential(target: &LoginTarget, method: &str) -> PoolerError {
    PoolerError::ServerLogin {
        code: "08004".into(),
        message: format!(
            "server asks {method} authentication for user \"{}\" and the pooler has no usable password",
            target.user
        ),
    }
}

/// Writes the answer to one authentication request into `out`.
fn answer_auth(
    auth: &Authentication<'_>,
    target: &LoginTarget,
    credential: &Credential,
    scram: &mut Option<ClientExchange>,
    out: &mut Vec<u8>,
) -> Result<(), PoolerError> {
    match auth {
        Authentication::Ok => Ok(()),
        Authentication::CleartextPassword => match credential {
            Credential::Password(password) => {
                auth_messages::encode_password(out, password.as_bytes());
                Ok(())
            }
            _ => Err(no_credential(target, "cleartext password")),
        },
        Authentication::Md5Password { salt } => {
            let stored = match credential {
                Credential::Password(password) => {
                    bypass_wire::md5::stored_hash(target.user.as_bytes(), password.as_bytes())
                }
                Credential::Md5Hash(hash) => hash.clone(),
                _ => return Err(no_credential(target, "MD5")),
            };
            auth_messages::encode_password(out, bypass_wire::md5::salted_response(&stored, *salt).as_bytes());
            Ok(())
        }
        Authentication::Sasl { .. } => start_scram(auth, target, credential, scram, out),
        Authentication::SaslContinue(server_first) => {
            let exchange = scram.as_mut().ok_or(unexpected(tag::backend::AUTHENTICATION))?;
            let client_final = exchange.respond(server_first).map_err(|e| scram_failed(target, e))?;
            auth_messages::encode_sasl_response(out, client_final.as_bytes());
            Ok(())
        }
        Authentication::SaslFinal(server_final) => {
            let exchange = scram.as_ref().ok_or(unexpected(tag::backend::AUTHENTICATION))?;
            exchange.verify(server_final).map_err(|e| scram_failed(target, e))
        }
        Authentication::Unsupported { code, .. } => Err(PoolerError::ServerLogin {
            code: "08004".into(),
            message: format!("server asks for authentication method {code}, which the pooler does not support"),
        }),
    }
}

fn start_scram(
    auth: &Authentication<'_>,
    target: &LoginTarget,
    credential: &Credential,
    scram: &mut Option<ClientExchange>,
    out: &mut Vec<u8>,
) -> Result<(), PoolerError> {
    if !auth.offers(MECHANISM) {
        return Err(no_credential(target, "an unsupported SASL"));
    }
    let secret = match credential {
        Credential::Password(password) => ClientSecret::Password(password.as_bytes().to_vec()),
        Credential::ScramKeys(keys) => keys.clone(),
        _ => return Err(no_credential(target, "SCRAM-SHA-256")),
    };
    let (exchange, client_first) = ClientExchange::start(secret);
    auth_messages::encode_sasl_initial(out, MECHANISM, client_first.as_bytes());
    *scram = Some(exchange);
    Ok(())
}

fn scram_failed(target: &LoginTarget, error: bypass_wire::WireError) -> PoolerError {
    PoolerError::ServerLogin {
        code: "28P01".into(),
        message: format!("SCRAM authentication of the pooler as \"{}\" failed: {error}", target.user),
    }
}

/// Sends a CancelRequest for `key` to `address` on a new connection.
pub async fn send_cancel(address: SocketAddr, key: BackendKey) -> io::Result<()> {
    let mut stream = TcpStream::connect(address).await?;
    let mut packet = Vec::with_capacity(16 + CANCEL_KEY_MAX);
    startup::encode_request(
        &mut packet,
        &bypass_wire::StartupPacket::Cancel { process_id: key.process_id, secret_key: key.secret() },
    );
    stream.write_all(&packet).await?;
    stream.shutdown().await
}

/// Shared handle type: a pool's credential can change when a client's SCRAM login supplies keys.
pub type SharedCredential = Arc<std::sync::RwLock<Credential>>;

/// A server socket in the kernel's maps; dropping it takes the socket out.
pub struct KernelSocket {
    fast: Arc<bypass_fastpath::FastPath>,
    pub slot: bypass_fastpath::ServerSlot,
    /// Bytes the kernel had redirected into the server at the last maintenance look.
    pub seen_redirected: u64,
}

impl KernelSocket {
    pub fn new(fast: Arc<bypass_fastpath::FastPath>, slot: bypass_fastpath::ServerSlot) -> Self {
        KernelSocket { fast, slot, seen_redirected: 0 }
    }
}

impl Drop for KernelSocket {
    fn drop(&mut self) {
        self.fast.remove_server(self.slot);
    }
}
