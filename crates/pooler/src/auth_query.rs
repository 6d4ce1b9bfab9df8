//! `auth_query`: secrets of users missing from the auth file, looked up in PostgreSQL.
//!
//! ```text
//!  client "carol" not in auth_file ─► cache (≤ AUTH_CACHE_TTL old)? ─► secret
//!        │ miss
//!        ▼
//!  log in as auth_user ─► Parse/Bind($1 = "carol")/Execute/Sync ─► (usename, passwd)
//!        ─► SCRAM verifier or MD5 hash ─► cache, authenticate the client with it
//! ```
//! The user name travels as a bound parameter, never inside the SQL text. Only found secrets
//! are cached, so a user created a moment ago or a wrong password is never remembered as a
//! failure. The plaintext is never needed: a SCRAM client's proof yields the keys the pool
//! then logs in with ([`crate::pool::Pool::learn_scram_keys`]), an MD5 hash answers MD5.

use std::time::{Duration, Instant};

use bypass_wire::frontend::{build, FrontendMessage};
use bypass_wire::{BackendMessage, SqlState};

use crate::auth_file::Secret;
use crate::error::PoolerError;
use crate::io::{body, read_message, ReadFailure};
use crate::lease::Lease;
use crate::pool::Pool;
use crate::server::{Credential, LoginTarget, ServerConn, ServerLimits};
use crate::shared::Shared;

/// Bound on the lookup's answer messages (a misconfigured query returning a table).
const ANSWER_MESSAGES_MAX: usize = 64;

/// The stored secret of `user`: the auth file's, else `auth_query`'s answer when `auth_user` is
/// set and the client's database is known (`target`: where its pool would log in). `None` for a
/// user found nowhere, who then gets the front door's mock exchange (no user enumeration).
pub async fn secret_for(
    shared: &Shared,
    target: Option<&LoginTarget>,
    database: &str,
    user: &str,
) -> Result<Option<Secret>, PoolerError> {
    let live = shared.live();
    if let Some(secret) = live.auth.get(user) {
        return Ok(Some(secret.clone()));
    }
    let (Some(auth_user), Some(target)) = (live.settings.auth_user.as_deref(), target) else {
        return Ok(None);
    };
    let scope = format!("{}/{}", target.address, target.dbname);
    if let Some(secret) = shared.auth_cache.get(&scope, user, Instant::now()) {
        return Ok(Some(secret));
    }
    let permit = shared.auth_cache.lookups.acquire().await.expect("the semaphore is never closed");
    // Another client may have looked the same user up while this one waited.
    if let Some(secret) = shared.auth_cache.get(&scope, user, Instant::now()) {
        return Ok(Some(secret));
    }
    let found = look_up(shared, target, database, auth_user, user).await;
    drop(permit);
    let Some(secret) = found? else { return Ok(None) };
    shared.auth_cache.insert(&scope, user, secret.clone(), Instant::now());
    Ok(Some(secret))
}

/// How the pooler logs in as `auth_user`: its auth file entry, else the password of a database
/// entry that logs in as that user.
fn auth_user_credential(shared: &Shared, database: &str, auth_user: &str) -> Credential {
    let live = shared.live();
    match live.auth.get(auth_user) {
        Some(Secret::Plain { password, .. }) => return Credential::Password(password.clone()),
        Some(Secret::Md5(hash)) => return Credential::Md5Hash(hash.clone()),
        Some(Secret::Scram(_)) | None => {}
    }
    let entry = live.databases.get(database).or_else(|| live.databases.get("*"));
    match entry {
        Some(entry) if entry.user.as_deref() == Some(auth_user) => match &entry.password {
            Some(hash) if bypass_wire::md5::is_stored_hash(hash) => Credential::Md5Hash(hash.clone()),
            Some(password) => Credential::Password(password.clone()),
            None => Credential::None,
        },
        _ => Credential::None,
    }
}

async fn look_up(
    shared: &Shared,
    target: &LoginTarget,
    database: &str,
    auth_user: &str,
    user: &str,
) -> Result<Option<Secret>, PoolerError> {
    let target = LoginTarget { user: auth_user.to_owned(), ..target.clone() };
    let credential = auth_user_credential(shared, database, auth_user);
    let limits = ServerLimits { message_size_max: shared.live().settings.message_size_max, statements_max: 0 };
    let timeout = Duration::from_millis(shared.live().settings.server_connect_timeout_ms);
    // Not counted in any pool: the connection lives only for this one query.
    let login = ServerConn::login(&target, &credential, Lease::detached(), limits, 0);
    let (mut server, _) = tokio::time::timeout(timeout, login)
        .await
        .map_err(|_| PoolerError::Timeout(crate::error::TimeoutKind::ServerConnect))??;
    let secret = query_secret(&mut server, &shared.live().settings.auth_query, user, limits.message_size_max).await;
    let mut goodbye = Vec::with_capacity(8);
    build::terminate(&mut goodbye);
    let _ = server.stream.write_all(&goodbye).await;
    secret
}

/// Runs `auth_query` with `$1 = user` over the extended protocol and reads the secret column.
async fn query_secret(
    server: &mut ServerConn,
    auth_query: &str,
    user: &str,
    message_size_max: u32,
) -> Result<Option<Secret>, PoolerError> {
    let mut request = Vec::with_capacity(128 + auth_query.len());
    build::parse(&mut request, "", auth_query, &[]);
    build::bind(&mut request, "", "", &[Some(user.as_bytes())]);
    FrontendMessage::Execute { portal: b"", max_rows: 0 }.encode(&mut request);
    build::sync(&mut request);
    server.stream.write_all(&request).await.map_err(PoolerError::ServerIo)?;
    let mut secret = None;
    let mut failure = None;
    for _ in 0..ANSWER_MESSAGES_MAX {
        let header =
            read_message(&mut server.stream, &mut server.buffer, message_size_max).await.map_err(|failure| {
                match failure {
                    ReadFailure::Io(error) => PoolerError::ServerIo(error),
                    ReadFailure::Protocol(error) => PoolerError::ServerProtocol(error),
                }
            })?;
        let message =
            BackendMessage::decode(header.tag, body(&server.buffer, header)).map_err(PoolerError::ServerProtocol)?;
        match message {
            // The second column is the secret; NULL (a user without a password) stays None.
            BackendMessage::DataRow(values) if secret.is_none() => {
                secret = values.iter().nth(1).flatten().map(|raw| String::from_utf8_lossy(raw).into_owned());
            }
            BackendMessage::ErrorResponse(fields) => {
                failure = Some(PoolerError::ServerQuery {
                    what: "auth_query",
                    code: String::from_utf8_lossy(fields.code().unwrap_or(b"XX000")).into_owned(),
                    message: String::from_utf8_lossy(fields.message().unwrap_or(b"auth_query failed")).into_owned(),
                });
            }
            BackendMessage::ReadyForQuery(_) => {
                return match failure {
                    Some(error) => Err(error),
                    None => Ok(secret.map(Secret::classify)),
                };
            }
            _ => {}
        }
        server.buffer.consume(header.frame_len());
    }
    Err(PoolerError::ServerQuery {
        what: "auth_query",
        code: SqlState::PROTOCOL_VIOLATION.code().into(),
        message: "auth_query answered with too many messages".into(),
    })
}

impl Pool {
    /// Lets the pool log in to servers with an MD5 hash learned from `auth_query`.
    pub fn learn_md5_hash(&self, hash: &str) {
        if self.target.user != self.key.user {
            return; // The hash is the client's user's, not the backend user this pool logs in as.
        }
        let mut credential = self.credential.write().unwrap_or_else(|p| p.into_inner());
        if matches!(*credential, Credential::None) {
            *credential = Credential::Md5Hash(hash.to_owned());
        }
    }
}

impl Pool {
    /// Lets the pool log in to servers with a password a client sent in clear (hba `password`).
    pub fn learn_password(&self, password: &str) {
        if self.target.user != self.key.user {
            return;
        }
        let mut credential = self.credential.write().unwrap_or_else(|p| p.into_inner());
        if matches!(*credential, Credential::None) {
            *credential = Credential::Password(password.to_owned());
        }
    }
}
