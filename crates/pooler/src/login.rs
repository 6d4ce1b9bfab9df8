//! The client side of connection start: startup packet, SSL/GSS refusal when TLS is off
//! (encryption is negotiated before, in [`crate::tls`]), cancel requests, the hba decision,
//! authentication (trust, MD5, SCRAM-SHA-256, cleartext, certificate; secrets from the auth file
//! or [`crate::auth_query`]) and the welcome a client sees after it.
//!
//! ```text
//!  Startup ─► SSLRequest/GSSENCRequest ─► 'N' ─► Startup
//!     │ CancelRequest ─► forward to the linked server, close
//!     ▼
//!  pool for (database, user) ─► authenticate ─► server params known? (else log in one server)
//!     ─► AuthenticationOk, ParameterStatus…, BackendKeyData (ours), ReadyForQuery ─► Session
//! ```

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use bypass_wire::backend::build;
use bypass_wire::scram::{constant_time_eq, ClientSecret, ServerExchange, MECHANISM};
use bypass_wire::startup::{decode_startup, StartupParams};
use bypass_wire::{auth_messages, md5, Authentication, BackendMessage, SqlState, StartupPacket, TransactionStatus};
use rand::Rng;

use crate::auth_file::Secret;
use crate::config::{AuthType, PoolMode, PoolerSettings, SessionStatePolicy};
use crate::error::PoolerError;
use crate::hba::HbaMethod;
use crate::io::{body, read_message, read_some, ReadFailure};
use crate::params::{tracked_index, ParamSet, TRACKED};
use std::os::fd::AsRawFd;

use crate::cancel::{ClientInfo, Registration};
use crate::client::ClientSide;
use crate::pool::{acquire_current, Pool, Waiter};
use crate::server::{Credential, ServerConn};
use crate::session::Session;
use crate::shared::Shared;
use crate::tls::{accept_client, REQUEST_LEN};

/// What the startup packet asked for, copied out of the client's buffer.
struct StartupRequest {
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

/// Runs connection start on a freshly accepted client. A client over `max_client_conn` is read
/// up to its startup packet (so it can understand the answer) and refused.
/// `shard` is the runtime the client runs on.
pub async fn login(
    shared: &Arc<Shared>,
    client: &mut ClientSide,
    over_limit: bool,
    shard: usize,
) -> Result<LoginOutcome, PoolerError> {
    let Some(request) = read_startup(shared, client).await? else {
        return Ok(LoginOutcome::Cancelled);
    };
    crate::tls::check_client(shared.tls.client.as_deref(), &client.stream)?;
    if over_limit {
        return Err(PoolerError::refused(
            SqlState::TOO_MANY_CONNECTIONS,
            "no more connections allowed (max_client_conn)",
        ));
    }
    let live = shared.live();
    let method = crate::hba::client_method(
        live.hba.as_ref(),
        live.settings.auth_type,
        &client.stream,
        &request.database,
        &request.user,
    )?;
    if crate::admin::is_console(&request.database) {
        let access = crate::admin::access(&live.settings, &request.user);
        authenticate(shared, client, &request.user, None, method).await?;
        let access = access.ok_or_else(|| {
            let text = format!(
                "user \"{}\" is not allowed to use the admin console: list it in admin_users (every command) \
                 or stats_users (SHOW only) under [pooler]",
                request.user
            );
            PoolerError::refused(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, text)
        })?;
        let registration = register(shared, client, &request)?;
        crate::admin::welcome(client, &registration).await?;
        return Ok(LoginOutcome::Admin(crate::admin::Console::new(shared.clone(), access, registration)));
    }
    shared.refuse_disabled(&request.database)?;
    let mut pool = shared.pool_with_options(&request.database, &request.user, request.options.as_deref())?;
    authenticate(shared, client, &request.user, Some(&pool), method).await?;
    let waiter = Waiter::new();
    let server = first_server(&mut pool, &waiter, shard).await?;
    let welcome = pool.welcome.get().cloned().unwrap_or_default();
    let wanted = wanted_params(&welcome.parameters, &request.wanted);
    let registration = register(shared, client, &request)?;
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

fn register(shared: &Shared, client: &ClientSide, request: &StartupRequest) -> Result<Registration, PoolerError> {
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

/// Reads startup packets until a StartupMessage; `None` after a CancelRequest.
async fn read_startup(shared: &Shared, client: &mut ClientSide) -> Result<Option<StartupRequest>, PoolerError> {
    loop {
        let Some((packet, used)) = decode_startup(client.buffer.pending()).map_err(PoolerError::ClientProtocol)? else {
            if read_some(&mut client.stream, &mut client.buffer).await.map_err(PoolerError::ClientIo)? == 0 {
                return Err(PoolerError::ClientIo(std::io::ErrorKind::UnexpectedEof.into()));
            }
            continue;
        };
        match packet {
            StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                client.buffer.consume(used);
                client.stream.write_all(b"N").await.map_err(PoolerError::ClientIo)?;
            }
            StartupPacket::Cancel { process_id, secret_key } => {
                shared.forward_cancel(process_id, secret_key);
                return Ok(None);
            }
            StartupPacket::Startup(params) => {
                let request = startup_request(&params, &shared.live().settings, &mut client.out)?;
                client.buffer.consume(used);
                client.flush().await?;
                return Ok(Some(request));
            }
        }
    }
}

/// Copies what we need out of the startup parameters and refuses what we cannot honor. Protocol
/// options (`_pq_.*`) and minor versions above 3.0 get a NegotiateProtocolVersion in `out`.
fn startup_request(
    params: &StartupParams<'_>,
    settings: &PoolerSettings,
    out: &mut Vec<u8>,
) -> Result<StartupRequest, PoolerError> {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let user = params.get("user").filter(|u| !u.is_empty()).map(text).ok_or_else(|| {
        PoolerError::refused(
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            "no PostgreSQL user name specified in startup packet",
        )
    })?;
    let database = params.get("database").filter(|d| !d.is_empty()).map(text).unwrap_or_else(|| user.clone());
    let mut wanted = ParamSet::default();
    let mut unrecognized = Vec::new();
    let mut options = None;
    for (name, value) in params.iter() {
        let ignored = settings.ignore_startup_parameters.iter().any(|p| p.as_bytes() == name);
        let known = matches!(name, b"user" | b"database") || (name == b"options" && value.is_empty()) || ignored;
        if name.starts_with(b"_pq_.") {
            unrecognized.push(name);
        } else if name == b"options" && !known && settings.pass_options {
            options = Some(text(value));
        } else if !known && !wanted.update(name, value) {
            let name = String::from_utf8_lossy(name);
            return Err(PoolerError::refused(
                SqlState::FEATURE_NOT_SUPPORTED,
                format!(
                    "unsupported startup parameter: {name} (list it in ignore_startup_parameters to drop it{})",
                    if name == "options" { ", or set pass_options" } else { "" }
                ),
            ));
        }
    }
    if params.minor_version > 0 || !unrecognized.is_empty() {
        negotiate_protocol(out, &unrecognized);
    }
    Ok(StartupRequest { user, database, wanted, options })
}

fn negotiate_protocol(out: &mut Vec<u8>, unrecognized: &[&[u8]]) {
    let mut raw = Vec::new();
    for name in unrecognized {
        bypass_wire::write::put_cstr(&mut raw, name);
    }
    let list = bypass_wire::backend::ValueListOfStrings { count: unrecognized.len(), raw: &raw };
    BackendMessage::NegotiateProtocolVersion { newest_minor: 0, unrecognized: list }.encode(out);
}

fn password_failed(user: &str) -> PoolerError {
    PoolerError::refused(SqlState::INVALID_PASSWORD, format!("password authentication failed for user \"{user}\""))
}

/// Proves the client's identity per its method (hba file or `auth_type`) and stored secret.
/// `pool` learns the client's SCRAM keys or MD5 hash to log in to servers as that user; the admin
/// console has none (its users must be in the auth file).
async fn authenticate(
    shared: &Shared,
    client: &mut ClientSide,
    user: &str,
    pool: Option<&Pool>,
    method: HbaMethod,
) -> Result<(), PoolerError> {
    let auth_type = match method {
        HbaMethod::Trust => return Ok(()),
        HbaMethod::Cert => return crate::hba::check_certificate(&client.stream, user),
        // client_method refuses `reject` before any pool exists; kept total for safety.
        HbaMethod::Reject => {
            return Err(PoolerError::refused(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, "rejected by hba"))
        }
        HbaMethod::Md5 | HbaMethod::Password => AuthType::Md5,
        HbaMethod::ScramSha256 => AuthType::ScramSha256,
    };
    let secret = match pool {
        Some(pool) => crate::auth_query::secret_for(shared, pool, user).await?,
        None => shared.live().auth.get(user).cloned().ok_or_else(|| password_failed(user))?,
    };
    if method == HbaMethod::Password {
        return cleartext_exchange(shared, client, user, &secret, pool).await;
    }
    match (&secret, auth_type) {
        (Secret::Scram(verifier), _) | (Secret::Plain { verifier, .. }, AuthType::ScramSha256) => {
            let client_key = scram_exchange(shared, client, user, verifier).await?;
            if let Some(pool) = pool {
                pool.learn_scram_keys(client_key, verifier);
            }
            Ok(())
        }
        (Secret::Plain { password, .. }, AuthType::Md5) => {
            md5_exchange(shared, client, user, &md5::stored_hash(user.as_bytes(), password.as_bytes())).await
        }
        (Secret::Md5(stored), AuthType::Md5) => {
            md5_exchange(shared, client, user, stored).await?;
            if let Some(pool) = pool {
                pool.learn_md5_hash(stored);
            }
            Ok(())
        }
        // An MD5 hash cannot answer SCRAM: refuse as a wrong password would be.
        (Secret::Md5(_), _) | (Secret::Plain { .. }, AuthType::Trust) => Err(password_failed(user)),
    }
}

/// hba `password`: the client sends its password in clear (over TLS, one hopes); it is checked
/// against whatever form the secret is stored in.
async fn cleartext_exchange(
    shared: &Shared,
    client: &mut ClientSide,
    user: &str,
    secret: &Secret,
    pool: Option<&Pool>,
) -> Result<(), PoolerError> {
    client.out.clear();
    build::authentication(&mut client.out, &Authentication::CleartextPassword);
    client.flush().await?;
    let body = client.read_password_message(shared.live().settings.message_size_max).await?;
    let password = auth_messages::decode_password(&body).map_err(PoolerError::ClientProtocol)?;
    let correct = match secret {
        Secret::Plain { password: stored, .. } => constant_time_eq(stored.as_bytes(), password),
        Secret::Md5(stored) => {
            constant_time_eq(md5::stored_hash(user.as_bytes(), password).as_bytes(), stored.as_bytes())
        }
        Secret::Scram(verifier) => {
            let candidate = bypass_wire::scram::Verifier::from_password_and_salt(
                password,
                verifier.salt.clone(),
                verifier.iterations,
            );
            constant_time_eq(&candidate.stored_key, &verifier.stored_key)
        }
    };
    if !correct {
        return Err(password_failed(user));
    }
    if let Some(pool) = pool {
        pool.learn_password(&String::from_utf8_lossy(password));
    }
    Ok(())
}

async fn md5_exchange(shared: &Shared, client: &mut ClientSide, user: &str, stored: &str) -> Result<(), PoolerError> {
    let salt: [u8; 4] = rand::thread_rng().gen();
    client.out.clear();
    build::authentication(&mut client.out, &Authentication::Md5Password { salt });
    client.flush().await?;
    let body = client.read_password_message(shared.live().settings.message_size_max).await?;
    let response = auth_messages::decode_password(&body).map_err(PoolerError::ClientProtocol)?;
    if md5::verify_response(stored, salt, response) {
        Ok(())
    } else {
        Err(password_failed(user))
    }
}

/// Runs a SCRAM-SHA-256 exchange; returns the client's recovered ClientKey.
async fn scram_exchange(
    shared: &Shared,
    client: &mut ClientSide,
    user: &str,
    verifier: &bypass_wire::scram::Verifier,
) -> Result<[u8; 32], PoolerError> {
    let limit = shared.live().settings.message_size_max;
    client.out.clear();
    build::authentication(&mut client.out, &Authentication::Sasl { mechanisms: b"SCRAM-SHA-256\0" });
    client.flush().await?;
    let initial = client.read_password_message(limit).await?;
    let (mechanism, data) = auth_messages::decode_sasl_initial(&initial).map_err(PoolerError::ClientProtocol)?;
    if mechanism != MECHANISM.as_bytes() {
        return Err(PoolerError::refused(
            SqlState::PROTOCOL_VIOLATION,
            "client selected an invalid SASL authentication mechanism",
        ));
    }
    let (exchange, server_first) =
        ServerExchange::start(verifier.clone(), data.unwrap_or_default()).map_err(|_| password_failed(user))?;
    client.out.clear();
    build::authentication(&mut client.out, &Authentication::SaslContinue(server_first.as_bytes()));
    client.flush().await?;
    let response = client.read_password_message(limit).await?;
    let success = exchange.finish(&response).map_err(|_| password_failed(user))?;
    client.out.clear();
    build::authentication(&mut client.out, &Authentication::SaslFinal(success.server_final.as_bytes()));
    client.flush().await?;
    Ok(success.client_key)
}

impl ClientSide {
    /// Reads one `'p'` message during authentication and returns its body.
    async fn read_password_message(&mut self, message_size_max: u32) -> Result<Vec<u8>, PoolerError> {
        let header =
            read_message(&mut self.stream, &mut self.buffer, message_size_max).await.map_err(
                |failure| match failure {
                    ReadFailure::Io(error) => PoolerError::ClientIo(error),
                    ReadFailure::Protocol(error) => PoolerError::ClientProtocol(error),
                },
            )?;
        if header.tag != b'p' {
            return Err(PoolerError::refused(SqlState::PROTOCOL_VIOLATION, "expected a password response"));
        }
        let message = body(&self.buffer, header).to_vec();
        self.buffer.consume(header.frame_len());
        Ok(message)
    }
}

impl Pool {
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
/// wraps it for login; `None` when the client left or the handshake failed (there is no
/// protocol left to tell it in).
pub async fn accept_within_login_timeout(shared: &Shared, tcp: TcpStream) -> Option<ClientSide> {
    let timeout = Duration::from_millis(shared.live().settings.client_login_timeout_ms);
    let accepted = match tokio::time::timeout(timeout, accept_client(shared.tls.client.as_deref(), tcp)).await {
        Ok(Ok(accepted)) => accepted,
        Ok(Err(error)) => {
            tracing::debug!(%error, "client encryption negotiation failed");
            return None;
        }
        Err(_) => {
            tracing::debug!("client encryption negotiation timed out");
            return None;
        }
    };
    let mut client = ClientSide::over(accepted.stream);
    if let Some(leftover) = accepted.leftover {
        client.buffer.spare()[..REQUEST_LEN].copy_from_slice(&leftover);
        client.buffer.commit(REQUEST_LEN);
    }
    Some(client)
}
