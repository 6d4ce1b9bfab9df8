//! The client side of connection start, on the front door ([`bypass_frontdoor::login`]):
//! negotiation (SSLRequest/GSSENCRequest/direct TLS), the first packet (a CancelRequest is
//! forwarded), the hba decision, authentication (trust, MD5, SCRAM-SHA-256, cleartext,
//! certificate; secrets from the auth file or [`crate::auth_query`], a mock exchange for users
//! found nowhere), then the pool and the welcome.
//!
//! ```text
//!  negotiate ─► StartupMessage ─► per-address bound, TLS required?, max_client_conn, parameters
//!     │ CancelRequest ─► forward to the linked server, close
//!     ▼
//!  method (hba | auth_type) ─► secret (auth file | auth_query | none: mock) ─► exchange
//!     ─► pool for (database, user) (created now, never for a stranger) ─► server params known?
//!     ─► AuthenticationOk, ParameterStatus…, BackendKeyData (ours), ReadyForQuery ─► Session
//!  any failure ─► one warn line (user, database, client, reason), count + delay if class 28
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpStream, UnixStream};

use bypass_frontdoor::login::{self as door, Attempt, First, LoginError};
use bypass_frontdoor::{Attempted, Proof, Refusal};
use bypass_wire::auth::Method;
use bypass_wire::backend::build;
use bypass_wire::scram::ClientSecret;
use bypass_wire::{Authentication, SqlState, StartupRequest, TransactionStatus};

use crate::auth_file::Secret;
use crate::config::{AuthType, PoolMode, PoolerSettings, SessionStatePolicy};
use crate::error::{PoolerError, TimeoutKind};
use crate::params::{tracked_index, ParamSet, TRACKED};
use std::os::fd::AsRawFd;

use crate::cancel::{ClientInfo, Registration};
use crate::client::ClientSide;
use crate::pool::{acquire_current, Pool, Waiter};
use crate::server::{Credential, ServerConn};
use crate::session::Session;
use crate::shared::Shared;

/// What the startup packet asked for, with the parameters the pooler tracks.
struct Startup {
    user: String,
    database: String,
    wanted: ParamSet,
    /// `options`, passed on to servers (`pass_options`).
    options: Option<String>,
}

/// How connection start ended.
pub enum LoginOutcome {
    Session(Box<Session>),
    /// A cancel request was handled; the connection is done.
    Cancelled,
    /// An admin console session.
    Admin(crate::admin::Console),
}

/// Runs connection start on a freshly negotiated client within `client_login_timeout_ms`. A
/// client over `max_client_conn` is read up to its startup packet (so it can understand the
/// answer) and refused. `shard` is the runtime the client runs on. A failure is logged (one
/// warn line), counted and delayed (`auth_failure_delay_ms`) here; the caller sends the FATAL.
pub async fn login(
    shared: &Arc<Shared>,
    client: &mut ClientSide,
    over_limit: bool,
    shard: usize,
) -> Result<LoginOutcome, PoolerError> {
    let peer = client.stream.peer_addr();
    let timeout = Duration::from_millis(shared.live().settings.client_login_timeout_ms);
    let mut startup = None;
    let result = match tokio::time::timeout(timeout, start(shared, client, over_limit, shard, &mut startup)).await {
        Ok(result) => result,
        Err(_) => Err(PoolerError::Timeout(TimeoutKind::ClientLogin)),
    };
    if let Err(error) = &result {
        let attempted = Attempted {
            peer,
            user: startup.as_ref().map(|s: &Startup| s.user.as_str()),
            database: startup.as_ref().map(|s| s.database.as_str()),
        };
        shared.guard.on_failure(attempted, &as_login_error(error)).await;
    }
    result
}

/// A pooler error as the front door's accounting sees it: the client's report, or its absence.
fn as_login_error(error: &PoolerError) -> LoginError {
    match (error, error.client_report()) {
        (PoolerError::Refused { code, message }, _) => LoginError::Refused(Refusal::new(*code, message.clone())),
        (_, Some((code, message))) => {
            LoginError::Refused(Refusal::new(SqlState::from_code(&code).unwrap_or(SqlState::INTERNAL_ERROR), message))
        }
        (_, None) => LoginError::Io(std::io::Error::other(error.to_string())),
    }
}

fn from_door(error: LoginError) -> PoolerError {
    match error {
        LoginError::Io(error) => PoolerError::ClientIo(error),
        LoginError::Refused(refusal) => PoolerError::Refused { code: refusal.code, message: refusal.message },
    }
}

fn refused(refusal: Refusal) -> PoolerError {
    PoolerError::Refused { code: refusal.code, message: refusal.message }
}

async fn start(
    shared: &Arc<Shared>,
    client: &mut ClientSide,
    over_limit: bool,
    shard: usize,
    startup: &mut Option<Startup>,
) -> Result<LoginOutcome, PoolerError> {
    let request = match door::read_first(&mut client.stream, &mut client.buffer).await.map_err(from_door)? {
        First::Cancel(cancel) => {
            shared.forward_cancel(cancel.process_id, &cancel.secret);
            return Ok(LoginOutcome::Cancelled);
        }
        First::Startup(request) => request,
    };
    let live = shared.live();
    let tracked = tracked_parameters(&request, &live.settings);
    let who = startup.insert(Startup {
        user: request.user.clone(),
        database: request.database.clone(),
        wanted: ParamSet::default(),
        options: None,
    });
    // A Unix-socket client is local: no address to count, and TLS is not offered there (as
    // PostgreSQL).
    let address = client.stream.peer_addr().map(|peer| peer.ip());
    if let Some(address) = address {
        shared.guard.admit(address, Instant::now()).map_err(refused)?;
    }
    let plaintext_refused = shared.tls.client.as_ref().is_some_and(|tls| tls.acceptor.plaintext_refused);
    if plaintext_refused && !client.stream.is_tls() && !client.stream.is_unix() {
        return Err(PoolerError::refused(
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            "SSL required: this pooler accepts TLS connections only",
        ));
    }
    if over_limit {
        return Err(PoolerError::refused(
            SqlState::TOO_MANY_CONNECTIONS,
            "no more connections allowed (max_client_conn)",
        ));
    }
    (who.wanted, who.options) = tracked?;
    request.write_negotiation(&mut client.out);
    let method = client_method(&live, address, client.stream.is_tls(), &request)?;
    let who: &Startup = who;
    if crate::admin::is_console(&who.database) {
        let secret = live.auth.get(&who.user).cloned();
        authenticate(shared, client, &who.user, method, secret.as_ref()).await?;
        let access = crate::admin::access(&live.settings, &who.user).ok_or_else(|| {
            let text = format!(
                "user \"{}\" is not allowed to use the admin console: list it in admin_users (every command) \
                 or stats_users (SHOW only) under [pooler]",
                who.user
            );
            PoolerError::refused(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, text)
        })?;
        let registration = register(shared, client, who)?;
        crate::admin::welcome(client, &registration).await?;
        return Ok(LoginOutcome::Admin(crate::admin::Console::new(shared.clone(), access, registration)));
    }
    welcome_pooled(shared, client, who, method, shard).await
}

/// The method for a client: the hba file's, else `auth_type`'s. The hba file has host lines
/// only, so a Unix-socket client under one is refused.
fn client_method(
    live: &crate::shared::Live,
    address: Option<std::net::IpAddr>,
    tls: bool,
    request: &StartupRequest,
) -> Result<Method, PoolerError> {
    let fallback = fallback_method(live.settings.auth_type);
    match address {
        Some(address) => door::choose_method(live.hba.as_ref(), fallback, address, tls, request).map_err(refused),
        None if live.hba.is_some() => Err(PoolerError::refused(
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            format!(
                "no hba entry for a Unix-socket connection, user \"{}\", database \"{}\" (the hba file has host \
                 lines only)",
                request.user, request.database
            ),
        )),
        None => Ok(fallback),
    }
}

/// The method when no hba file decides.
fn fallback_method(auth_type: AuthType) -> Method {
    match auth_type {
        AuthType::Trust => Method::Trust,
        AuthType::Md5 => Method::Md5,
        AuthType::ScramSha256 => Method::ScramSha256,
    }
}

/// Authenticates a pooled client, then (and only then) finds or creates its pool, logs in a
/// server when needed and sends the welcome.
async fn welcome_pooled(
    shared: &Arc<Shared>,
    client: &mut ClientSide,
    request: &Startup,
    method: Method,
    shard: usize,
) -> Result<LoginOutcome, PoolerError> {
    let target = shared.login_target(&request.database, &request.user).transpose()?;
    let needs_secret = matches!(method, Method::Md5 | Method::ScramSha256 | Method::Password);
    let secret = match needs_secret {
        true => crate::auth_query::secret_for(shared, target.as_ref(), &request.database, &request.user).await?,
        false => None,
    };
    let proof = authenticate(shared, client, &request.user, method, secret.as_ref()).await?;
    if target.is_none() {
        return Err(PoolerError::refused(
            SqlState::INVALID_CATALOG_NAME,
            format!("no such database: {}", request.database),
        ));
    }
    shared.refuse_disabled(&request.database)?;
    let mut pool = shared.pool_with_options(&request.database, &request.user, request.options.as_deref())?;
    pool.learn(&proof);
    let waiter = Waiter::new();
    let server = match first_server(&mut pool, &waiter, shard).await {
        Ok(server) => server,
        Err(error) => {
            // A (database, user) no server accepts leaves no pool behind.
            shared.forget_unused_pool(&pool);
            return Err(error);
        }
    };
    let welcome = pool.welcome.get().cloned().unwrap_or_default();
    let wanted = wanted_params(&welcome.parameters, &request.wanted);
    let registration = register(shared, client, request)?;
    client.out.clear();
    build::authentication(&mut client.out, &Authentication::Ok);
    for (name, value) in &welcome.parameters {
        let value = tracked_index(name.as_bytes()).and_then(|i| wanted.get(i)).unwrap_or(value);
        build::parameter_status(&mut client.out, name.as_bytes(), value.as_bytes());
    }
    build::backend_key_data(&mut client.out, registration.entry.process_id, &registration.entry.secret);
    build::ready_for_query(&mut client.out, TransactionStatus::Idle);
    // Mirrored before the ReadyForQuery leaves, so the shadow sees the client's first request;
    // a client mirrored in user space stays off the kernel path, where its bytes would bypass
    // the copy.
    client.mirror = crate::shadow::attach(shared, client, &request.database, &request.user, shard).await;
    let user_mirrored = client.mirror.as_ref().is_some_and(crate::mirror::ClientMirror::in_user_space);
    // Into the kernel's maps before the ReadyForQuery leaves: the client's first request, sent
    // right after it, must meet the verdict program.
    let message_max = pool.settings.message_size_max;
    // `warn` and `error` promise a verdict on every statement, which only the relay can give
    // (the kernel reads no SQL): clients under them stay in user space.
    let guard_all = shared.live().settings.session_state != SessionStatePolicy::Track;
    let kernel = pool
        .kernel()
        .filter(|_| !user_mirrored && !guard_all)
        .and_then(|kernel| crate::session::KernelClient::enter(kernel, client, message_max, &wanted));
    if let Some(kernel) = &kernel {
        let _ = registration.entry.kernel_slot.set(kernel.slot());
    }
    client.flush().await?;
    let session = Session::new(shared.clone(), pool, shard, wanted, waiter, registration, server).in_kernel(kernel);
    Ok(LoginOutcome::Session(Box::new(session)))
}

/// Runs the front door's exchange for `method` with the user's `secret` (`None`: the mock
/// exchange), and sends what it left to send (a SASLFinal, a protocol negotiation).
async fn authenticate(
    shared: &Shared,
    client: &mut ClientSide,
    user: &str,
    method: Method,
    secret: Option<&Secret>,
) -> Result<Proof, PoolerError> {
    let attempt =
        Attempt { method, user, secret, mock: &shared.mock, message_size_max: shared.live().settings.message_size_max };
    let proof = door::authenticate(&mut client.stream, &mut client.buffer, &mut client.out, attempt)
        .await
        .map_err(from_door)?;
    client.flush().await?;
    Ok(proof)
}

fn register(shared: &Shared, client: &ClientSide, request: &Startup) -> Result<Registration, PoolerError> {
    let info = ClientInfo {
        user: request.user.clone(),
        database: request.database.clone(),
        peer: client.stream.peer_addr(),
        local: client.stream.local_addr(),
        connected_at: std::time::SystemTime::now(),
        fd: client.stream.as_raw_fd(),
        application_name: tracked_index(b"application_name")
            .and_then(|index| request.wanted.get(index))
            .unwrap_or_default()
            .to_owned(),
        tls: client.stream.is_tls(),
    };
    shared.cancel.register(info).ok_or_else(|| PoolerError::refused(SqlState::TOO_MANY_CONNECTIONS, "too many clients"))
}

/// Session mode keeps the server it logs in with; transaction mode logs one in only to learn the
/// server's parameters the first time.
async fn first_server(
    pool: &mut Arc<Pool>,
    waiter: &Arc<Waiter>,
    shard: usize,
) -> Result<Option<Box<ServerConn>>, PoolerError> {
    if pool.settings.mode == PoolMode::Session {
        return acquire_current(pool, shard, waiter).await.map(Some);
    }
    if pool.welcome.get().is_none() {
        let server = acquire_current(pool, shard, waiter).await?;
        pool.release(server);
    }
    Ok(None)
}

/// The client's parameter values: the server's defaults overlaid with the startup packet's.
fn wanted_params(server_defaults: &[(String, String)], from_client: &ParamSet) -> ParamSet {
    let mut wanted = ParamSet::default();
    for (name, value) in server_defaults {
        wanted.update(name.as_bytes(), value.as_bytes());
    }
    for (index, name) in TRACKED.iter().enumerate() {
        if let Some(value) = from_client.get(index) {
            wanted.update(name.as_bytes(), value.as_bytes());
        }
    }
    wanted
}

/// The startup parameters the pooler tracks and replays, and `options` when `pass_options`
/// sends it on to servers. Names in `ignore_startup_parameters` are dropped; any other
/// unsupported one is refused with 0A000 (after authentication, as every refusal about the
/// session itself).
fn tracked_parameters(
    request: &StartupRequest,
    settings: &PoolerSettings,
) -> Result<(ParamSet, Option<String>), PoolerError> {
    let mut wanted = ParamSet::default();
    let mut options = None;
    for (name, value) in &request.parameters {
        let ignored =
            (name == "options" && value.is_empty()) || settings.ignore_startup_parameters.iter().any(|p| p == name);
        if ignored {
            continue;
        }
        if name == "options" && settings.pass_options {
            options = Some(value.clone());
        } else if !wanted.update(name.as_bytes(), value.as_bytes()) {
            let hint = if name == "options" { ", or set pass_options" } else { "" };
            return Err(PoolerError::refused(
                SqlState::FEATURE_NOT_SUPPORTED,
                format!(
                    "unsupported startup parameter: {name} (list it in ignore_startup_parameters to drop it{hint})"
                ),
            ));
        }
    }
    Ok((wanted, options))
}

impl Pool {
    /// Lets the pool log in to servers as the client when it has no password of its own: with
    /// the SCRAM keys, MD5 hash or cleartext password the client just proved.
    fn learn(&self, proof: &Proof) {
        match proof {
            Proof::Scram { client_key, verifier } => self.learn_scram_keys(*client_key, verifier),
            Proof::Md5 { stored } => self.learn_md5_hash(stored),
            Proof::Password(password) => self.learn_password(&String::from_utf8_lossy(password)),
            Proof::Trust | Proof::Certificate => {}
        }
    }

    /// The parameters a fresh server of this pool reports (what DISCARD ALL returns to).
    pub fn welcome_params(&self) -> ParamSet {
        let mut params = ParamSet::default();
        for (name, value) in self.welcome.get().map(|welcome| welcome.parameters.as_slice()).unwrap_or_default() {
            params.update(name.as_bytes(), value.as_bytes());
        }
        params
    }

    /// Lets the pool log in to servers with a SCRAM client's keys when it has no password.
    pub fn learn_scram_keys(&self, client_key: [u8; 32], verifier: &bypass_wire::scram::Verifier) {
        if self.target.user != self.key.user {
            return; // The keys prove the client's user, not the backend user this pool logs in as.
        }
        let mut credential = self.credential.write().unwrap_or_else(|p| p.into_inner());
        if matches!(*credential, Credential::None) {
            *credential = Credential::ScramKeys(ClientSecret::Keys {
                client_key,
                server_key: verifier.server_key,
                salt: verifier.salt.clone(),
                iterations: verifier.iterations,
            });
        }
    }
}
/// Negotiates encryption with a freshly accepted client within `client_login_timeout_ms` and
/// wraps it for login; `None` when the client left, was refused (the front door answered it) or
/// the handshake failed.
pub async fn accept_within_login_timeout(shared: &Shared, tcp: TcpStream) -> Option<ClientSide> {
    let peer = tcp.peer_addr().ok();
    let mut buffer = crate::buffer::Buffer::with_capacity(crate::buffer::CLIENT_BUFFER_BYTES);
    let tls = shared.tls.client.as_ref().map(|tls| &tls.acceptor);
    let stream = within_login_timeout(shared, peer, door::negotiate(tls, tcp, &mut buffer)).await?;
    Some(ClientSide::with_buffer(stream, buffer))
}

/// [`accept_within_login_timeout`] for a client of the `unix_socket_dir` socket (no TLS there).
pub async fn accept_unix_within_login_timeout(shared: &Shared, unix: UnixStream) -> Option<ClientSide> {
    let mut buffer = crate::buffer::Buffer::with_capacity(crate::buffer::CLIENT_BUFFER_BYTES);
    let stream = within_login_timeout(shared, None, door::negotiate_unix(unix, &mut buffer)).await?;
    Some(ClientSide::with_buffer(stream, buffer))
}

async fn within_login_timeout(
    shared: &Shared,
    peer: Option<SocketAddr>,
    negotiation: impl std::future::Future<Output = Result<crate::stream::Stream, LoginError>>,
) -> Option<crate::stream::Stream> {
    let timeout = Duration::from_millis(shared.live().settings.client_login_timeout_ms);
    let error = match tokio::time::timeout(timeout, negotiation).await {
        Ok(Ok(stream)) => return Some(stream),
        Ok(Err(error)) => error,
        Err(_) => LoginError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "encryption negotiation timed out")),
    };
    shared.guard.on_failure(Attempted { peer, user: None, database: None }, &error).await;
    None
}
