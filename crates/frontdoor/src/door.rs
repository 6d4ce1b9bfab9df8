//! The whole front door in one call, for servers whose users all come from one auth file (the
//! dispatcher, the engine): [`FrontDoor::accept`] runs connection start up to the welcome, and
//! refuses, logs and delays by itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bypass_wire::auth::{Method, MockKey, Proof, Refusal};
use bypass_wire::auth_file::AuthFile;
use bypass_wire::hba::Hba;
use bypass_wire::{Buffer, SqlState, StartupRequest};
use tokio::net::TcpStream;

use crate::cancel::CancelKey;
use crate::guard::{Attempted, GuardSettings, LoginGuard};
use crate::login::{self, Attempt, CancelRequest, First, LoginError};
use crate::stream::Stream;
use crate::tls::ServerTls;

/// The least buffer a login needs: a whole startup packet and then some.
pub const LOGIN_BUFFER_MIN: usize = 16 * 1024;

/// How clients are checked.
#[derive(Debug)]
pub struct FrontDoorConfig {
    /// TLS offered to clients; `None`: SSLRequest is answered 'N'.
    pub tls: Option<ServerTls>,
    /// Method for every client when `hba` is `None`.
    pub method: Method,
    /// Access rules (first match decides the method; no match is refused).
    pub hba: Option<Hba>,
    /// Users and their secrets (PgBouncer's userlist format).
    pub users: AuthFile,
    /// Bound on negotiation, startup and authentication together.
    pub login_timeout: Duration,
    /// Largest password message accepted.
    pub message_size_max: u32,
    pub guard: GuardSettings,
    /// The key of mock exchanges and plaintext salts ([`crate::mock_key`] keeps one across
    /// restarts); `None`: a random key for this process.
    pub mock: Option<MockKey>,
}

impl FrontDoorConfig {
    /// Every client must prove a password from `users` with SCRAM-SHA-256, no TLS.
    pub fn scram(users: AuthFile) -> Self {
        FrontDoorConfig {
            tls: None,
            method: Method::ScramSha256,
            hba: None,
            users,
            login_timeout: Duration::from_secs(60),
            message_size_max: 64 * 1024,
            guard: GuardSettings::default(),
            mock: None,
        }
    }
}

/// One server's front door: configuration, its mock key, failure accounting.
#[derive(Debug)]
pub struct FrontDoor {
    config: FrontDoorConfig,
    mock: MockKey,
    guard: LoginGuard,
}

/// How a connection's start ended well.
#[derive(Debug)]
pub enum Admission {
    /// An authenticated client; send [`Admitted::welcome`] next.
    Client(Box<Admitted>),
    /// A CancelRequest; the connection carries nothing else (close it, answer nothing).
    Cancel(CancelRequest),
}

/// An authenticated client before its welcome.
pub struct Admitted {
    pub stream: Stream,
    /// Bytes the client sent after its last login message (it may pipeline its first query).
    pub buffer: Buffer,
    pub peer: SocketAddr,
    pub request: StartupRequest,
    pub proof: Proof,
    /// A SASLFinal (or protocol negotiation) still to be sent before the welcome.
    out: Vec<u8>,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Admitted")
            .field("peer", &self.peer)
            .field("user", &self.request.user)
            .field("database", &self.request.database)
            .field("tls", &self.stream.is_tls())
            .finish_non_exhaustive()
    }
}

impl Admitted {
    /// Sends AuthenticationOk, `parameters` as ParameterStatus, BackendKeyData and ReadyForQuery;
    /// the client may send queries from here on.
    pub async fn welcome(&mut self, parameters: &[(String, String)], key: CancelKey) -> std::io::Result<()> {
        login::write_welcome(&mut self.out, parameters, key);
        self.stream.write_all(&self.out).await?;
        self.out.clear();
        Ok(())
    }
}

impl FrontDoor {
    pub fn new(config: FrontDoorConfig) -> Arc<Self> {
        let guard = LoginGuard::new(config.guard);
        let mock = config.mock.clone().unwrap_or_else(MockKey::random);
        Arc::new(FrontDoor { config, mock, guard })
    }

    pub fn guard(&self) -> &LoginGuard {
        &self.guard
    }

    pub fn config(&self) -> &FrontDoorConfig {
        &self.config
    }

    /// Runs connection start within `login_timeout`: negotiation, startup, method, exchange.
    /// On failure the client has been told (FATAL with the SQLSTATE), the failure logged and,
    /// for a failed authentication, counted and delayed; the error is returned for the caller's
    /// own accounting. `buffer_capacity` sizes the client's read buffer (at least
    /// [`LOGIN_BUFFER_MIN`]).
    pub async fn accept(&self, tcp: TcpStream, buffer_capacity: usize) -> Result<Admission, LoginError> {
        let peer = tcp.peer_addr().map_err(LoginError::Io)?;
        let mut buffer = Buffer::with_capacity(buffer_capacity.max(LOGIN_BUFFER_MIN));
        let mut state = Progress { stream: None, request: None };
        let run = self.run(tcp, peer, &mut buffer, &mut state);
        let result = match tokio::time::timeout(self.config.login_timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(LoginError::Refused(Refusal::new(SqlState::CONNECTION_FAILURE, "login timed out"))),
        };
        match result {
            Ok(Outcome::Cancel(cancel)) => Ok(Admission::Cancel(cancel)),
            Ok(Outcome::Authenticated { proof, out }) => {
                let stream = state.stream.expect("negotiated before authentication");
                let request = state.request.expect("read before authentication");
                Ok(Admission::Client(Box::new(Admitted { stream, buffer, peer, request, proof, out })))
            }
            Err(error) => {
                let request = state.request.as_ref();
                let attempted = Attempted {
                    peer: Some(peer),
                    user: request.map(|r| r.user.as_str()),
                    database: request.map(|r| r.database.as_str()),
                };
                self.guard.on_failure(attempted, &error).await;
                if let (LoginError::Refused(refusal), Some(stream)) = (&error, state.stream.as_mut()) {
                    let mut out = Vec::new();
                    refusal.write_fatal(&mut out);
                    let _ = stream.write_all(&out).await;
                }
                Err(error)
            }
        }
    }

    async fn run(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        buffer: &mut Buffer,
        state: &mut Progress,
    ) -> Result<Outcome, LoginError> {
        let tls = self.config.tls.as_ref();
        let stream = state.stream.insert(login::negotiate(tls, tcp, buffer).await?);
        let request = match login::read_first(stream, buffer).await? {
            First::Cancel(cancel) => return Ok(Outcome::Cancel(cancel)),
            First::Startup(request) => state.request.insert(request),
        };
        self.guard.admit(peer.ip(), Instant::now())?;
        if tls.is_some_and(|tls| tls.plaintext_refused) && !stream.is_tls() {
            return Err(LoginError::Refused(Refusal::new(
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                "SSL required: this server accepts TLS connections only",
            )));
        }
        let method =
            login::choose_method(self.config.hba.as_ref(), self.config.method, peer.ip(), stream.is_tls(), request)?;
        let mut out = Vec::new();
        request.write_negotiation(&mut out);
        let attempt = Attempt {
            method,
            user: &request.user,
            secret: self.config.users.get(&request.user),
            mock: &self.mock,
            message_size_max: self.config.message_size_max,
        };
        let proof = login::authenticate(stream, buffer, &mut out, attempt).await?;
        Ok(Outcome::Authenticated { proof, out })
    }

    /// Refuses an admitted client (e.g. its database is unknown): logs the failure and sends the
    /// FATAL. Authentication already succeeded, so nothing is counted or delayed.
    pub async fn refuse(&self, admitted: &mut Admitted, refusal: Refusal) {
        let attempted = Attempted {
            peer: Some(admitted.peer),
            user: Some(&admitted.request.user),
            database: Some(&admitted.request.database),
        };
        tracing::warn!(
            client = %admitted.peer,
            user = attempted.user,
            database = attempted.database,
            sqlstate = refusal.code.code(),
            reason = refusal.message.as_str(),
            "login failed"
        );
        admitted.out.clear();
        refusal.write_fatal(&mut admitted.out);
        let _ = admitted.stream.write_all(&admitted.out).await;
    }
}

/// How `run` ended well.
enum Outcome {
    Cancel(CancelRequest),
    Authenticated { proof: Proof, out: Vec<u8> },
}

/// What `run` got to (before it failed, for the failure's report).
struct Progress {
    stream: Option<Stream>,
    request: Option<StartupRequest>,
}
