//! `bypass agent`: beside each backend it holds the backend's PostgreSQL connections, one per
//! dispatcher link, and relays answers to the dispatcher — or, once a client's connection has
//! been handed over, writes them straight into it and hands it back at ReadyForQuery.
//!
//! ```text
//!   dispatcher ══ link (PG messages + control frames) ══► agent ── PG protocol ──► PostgreSQL
//!                                                           │
//!        client ◄══════ handed-over TCP connection ═════════┘ (answers only)
//! ```
//! Invariants:
//! - Nothing reaches PostgreSQL before the peer proved the agent key ([`key`]); a plain
//!   PostgreSQL client gets FATAL 28000 and CancelRequests are not forwarded (the dispatcher
//!   does not route cancels yet, and a CancelRequest cannot carry a proof).
//! - The agent never reads what a handed-over client sends: those bytes stay in the kernel's
//!   receive queue and travel back to the dispatcher with the connection.
//! - Control frames are only sent at PostgreSQL message boundaries.

use std::net::SocketAddr;
use std::sync::Arc;

use bypass_wire::auth::Refusal;
use bypass_wire::backend::build;
use bypass_wire::startup::decode_startup;
use bypass_wire::{tag, Authentication, BackendMessage, Severity, SqlState, StartupPacket, TransactionStatus};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::buffer::{Buffer, BufferIo};
use crate::config::ValidAgentConfig;
use crate::error::{DispatchError, Result};
use crate::pglogin::{Login, LoginRequest, LoginStep, Welcome};
use crate::runtime::{self, Running};

pub mod key;
mod relay;

/// Password messages the key proof reads at most.
const PROOF_ROUNDS_MAX: usize = 2;

/// Bytes of each direction's buffer on a link; answers stream through in pieces this large.
pub const LINK_BUFFER_BYTES: usize = 256 * 1024;
/// Largest startup packet a dispatcher may send.
const STARTUP_BYTES_MAX: usize = 10_000;

/// Starts an agent on its own runtime (inside `namespace` when given). Returns once listening.
pub fn start(config: ValidAgentConfig, namespace: Option<String>) -> Result<Running<SocketAddr>> {
    let workers = config.settings.workers;
    runtime::spawn("agent", namespace, workers, move |stop, ready| serve(config, stop, ready))
}

async fn serve(
    config: ValidAgentConfig,
    mut stop: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<SocketAddr>,
) -> Result<()> {
    let listener = TcpListener::bind(config.listen_addr)
        .await
        .map_err(|e| DispatchError::io(format!("agent binding {}", config.listen_addr), e))?;
    let local = listener.local_addr().map_err(|e| DispatchError::io("agent listen address", e))?;
    let _ = ready.send(local);
    tracing::info!(address = %local, postgres = %config.postgres_addr, "agent listening");
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(config.settings.links_max));
    loop {
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => { tracing::warn!(%error, "agent accept failed"); continue; }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, "agent at links_max; refusing a link");
                    continue;
                };
                let config = config.clone();
                tokio::spawn(async move {
                    if let Err(error) = serve_link(&config, stream).await {
                        tracing::debug!(%peer, %error, "link ended");
                    }
                    drop(slot);
                });
            }
        }
    }
}

/// One dispatcher link: startup, login to PostgreSQL on the dispatcher's behalf, then relay.
async fn serve_link(config: &ValidAgentConfig, mut link: TcpStream) -> Result<()> {
    link.set_nodelay(true).map_err(|e| DispatchError::io("TCP_NODELAY on a link", e))?;
    let peer = link.peer_addr().map_err(|e| DispatchError::io("a link's address", e))?;
    let mut buffer = Buffer::with_capacity(LINK_BUFFER_BYTES);
    let mut requests = 0;
    let request = loop {
        match read_startup(&mut link, &mut buffer).await? {
            Startup::Login(request) => break request,
            Startup::Ssl if requests < 2 => {
                requests += 1;
                link.write_all(&[tag::encryption::REFUSE]).await.map_err(|e| DispatchError::io("refusing SSL", e))?
            }
            Startup::Ssl => return Err(DispatchError::Protocol("too many encryption requests".into())),
            Startup::Cancel => {
                tracing::debug!(%peer, "agent: CancelRequest not forwarded");
                return Ok(());
            }
        }
    };
    if let Err(refusal) = prove_key(config, &mut link, &mut buffer, &request).await {
        tracing::warn!(client = %peer, user = %request.user, database = %request.database,
            sqlstate = refusal.code.code(), reason = %refusal.message, "agent refused a link");
        let mut out = Vec::new();
        refusal.write_fatal(&mut out);
        let _ = link.write_all(&out).await;
        return Err(DispatchError::Protocol(refusal.message));
    }
    let mut request = LoginRequest { password: config.settings.password.clone(), ..request };
    request.parameters.retain(|(name, _)| name != key::LINK_PARAMETER);
    let (postgres, welcome) = match login(config.postgres_addr, request).await {
        Ok(logged_in) => logged_in,
        Err(error) => {
            let mut out = Vec::new();
            let (code, text) = match &error {
                DispatchError::Server { code, message } => (code.clone(), message.clone()),
                other => (SqlState::CONNECTION_FAILURE.code().to_string(), other.to_string()),
            };
            build::error_with_code(&mut out, Severity::Fatal, &code, &text);
            let _ = link.write_all(&out).await;
            return Err(error);
        }
    };
    link.write_all(&welcome_bytes(&welcome)).await.map_err(|e| DispatchError::io("sending the welcome", e))?;
    relay::LinkSession::new(config, link, buffer, postgres).run().await
}

enum Startup {
    Login(LoginRequest),
    Ssl,
    Cancel,
}

/// Runs the key proof ([`key`]) after a link's startup: a plain client is refused before any
/// exchange, a wrong key after it.
async fn prove_key(
    config: &ValidAgentConfig,
    link: &mut TcpStream,
    buffer: &mut Buffer,
    request: &LoginRequest,
) -> std::result::Result<(), Refusal> {
    let io_failed = |_| Refusal::new(SqlState::CONNECTION_FAILURE, "link closed during the key proof");
    let (mut challenge, first) = key::LinkChallenge::start(config.key.clone(), request)?;
    link.write_all(&first).await.map_err(io_failed)?;
    for _ in 0..PROOF_ROUNDS_MAX {
        let header = buffer
            .read_message(link, "the dispatcher")
            .await
            .map_err(|_| Refusal::new(SqlState::PROTOCOL_VIOLATION, "malformed key proof message"))?;
        if header.tag != tag::frontend::PASSWORD {
            return Err(Refusal::new(SqlState::PROTOCOL_VIOLATION, "expected a key proof message"));
        }
        let answer = challenge.respond(buffer.body(header));
        buffer.consume(header.frame_len());
        match answer? {
            key::Challenge::Send(bytes) => link.write_all(&bytes).await.map_err(io_failed)?,
            key::Challenge::Proven(bytes) => return link.write_all(&bytes).await.map_err(io_failed),
        }
    }
    Err(Refusal::new(SqlState::PROTOCOL_VIOLATION, "key proof did not end"))
}

async fn read_startup(link: &mut TcpStream, buffer: &mut Buffer) -> Result<Startup> {
    loop {
        if let Some((packet, used)) = decode_startup(buffer.pending())? {
            let startup = match packet {
                StartupPacket::Startup(params) => {
                    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                    let user = params.get("user").map(text).unwrap_or_default();
                    let database = params.get("database").map(text).unwrap_or_else(|| user.clone());
                    let parameters = params
                        .iter()
                        .filter(|(k, _)| *k != b"user" && *k != b"database")
                        .map(|(k, v)| (text(k), text(v)))
                        .collect();
                    Startup::Login(LoginRequest { user, database, password: None, parameters })
                }
                StartupPacket::SslRequest | StartupPacket::GssEncRequest => Startup::Ssl,
                StartupPacket::Cancel { .. } => Startup::Cancel,
            };
            buffer.consume(used);
            return Ok(startup);
        }
        if buffer.pending().len() >= STARTUP_BYTES_MAX {
            return Err(DispatchError::Protocol("startup packet too large".into()));
        }
        if buffer.read_from(link).await.map_err(|e| DispatchError::io("reading a link's startup", e))? == 0 {
            return Err(crate::buffer::closed("the dispatcher"));
        }
    }
}

/// Connects to PostgreSQL and logs in.
pub async fn login(address: SocketAddr, request: LoginRequest) -> Result<(TcpStream, Welcome)> {
    let mut stream =
        TcpStream::connect(address).await.map_err(|e| DispatchError::io(format!("connecting to {address}"), e))?;
    stream.set_nodelay(true).map_err(|e| DispatchError::io("TCP_NODELAY", e))?;
    let (mut login, startup) = Login::start(request);
    stream.write_all(&startup).await.map_err(|e| DispatchError::io("sending the startup packet", e))?;
    let mut buffer = Buffer::with_capacity(16 * 1024);
    loop {
        let header = buffer.read_message(&mut stream, "PostgreSQL").await?;
        let step = login.on_message(BackendMessage::decode(header.tag, buffer.body(header))?)?;
        buffer.consume(header.frame_len());
        match step {
            LoginStep::Send(bytes) => {
                stream.write_all(&bytes).await.map_err(|e| DispatchError::io("sending credentials", e))?
            }
            LoginStep::Continue => {}
            LoginStep::Done(welcome) => {
                if !buffer.is_empty() {
                    return Err(DispatchError::Protocol("PostgreSQL sent bytes after ReadyForQuery".into()));
                }
                return Ok((stream, welcome));
            }
        }
    }
}

/// What the dispatcher sees after its startup packet: the server's own welcome.
fn welcome_bytes(welcome: &Welcome) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    build::authentication(&mut out, &Authentication::Ok);
    for (name, value) in &welcome.parameters {
        build::parameter_status(&mut out, name.as_bytes(), value.as_bytes());
    }
    build::backend_key_data(&mut out, welcome.process_id, &welcome.secret_key);
    build::ready_for_query(&mut out, TransactionStatus::Idle);
    out
}
