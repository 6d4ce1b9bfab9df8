//! Backends as the dispatcher sees them: health, replay lag, outstanding requests, and pools of
//! links. A link is one logged-in PostgreSQL session, either through the backend's agent (its
//! answers can be handed over) or straight to the server (relayed answers: one hop less).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use bypass_wire::frame::Scanner;
use bypass_wire::BackendMessage;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

use crate::agent::key::{LinkKey, LinkLogin};
use crate::buffer::{Buffer, BufferIo};
use crate::config::BackendSpec;
use crate::error::{DispatchError, Result};
use crate::link::Delivery;
use crate::pglogin::{Login, LoginRequest, LoginStep, Welcome};

/// Bytes of a link's read buffer; answers stream through it.
pub const LINK_BUFFER_BYTES: usize = 256 * 1024;

/// One backend (an agent beside a PostgreSQL server).
pub struct BackendState {
    pub id: usize,
    pub spec: BackendSpec,
    /// False while banned by a failed health check or link; reads skip it.
    pub healthy: AtomicBool,
    /// Last measured replay lag in ms (0 on a primary).
    pub lag_ms: AtomicU64,
    /// Requests sent and not yet answered.
    pub outstanding: AtomicU32,
    /// Requests ever sent here (tests read it to see where queries went).
    pub requests: AtomicU64,
    /// Idle links by (thread, user, database): a link's socket is registered with the runtime of
    /// the thread that opened it, and a link used from another thread would wake that one.
    idle: Mutex<HashMap<PoolKey, Vec<Link>>>,
    idle_max: usize,
    source_addr: Option<std::net::Ipv4Addr>,
    /// For servers that do not trust the dispatcher's links straight to them.
    postgres_password: Option<String>,
    /// What every link proves to the agent.
    key: LinkKey,
}

/// Where a link goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// Through the backend's agent: answers may be handed over, control frames travel.
    Agent,
    /// Straight to the PostgreSQL server: relayed answers only, no control frames.
    Postgres,
}

/// A logged-in link to an agent or to a server.
pub struct Link {
    pub kind: LinkKind,
    pub stream: TcpStream,
    pub buffer: Buffer,
    pub scanner: Scanner,
    pub backend: usize,
    pub welcome: Welcome,
    /// Hash of the session settings this link's server has applied (0 = none).
    pub settings_applied: u64,
    /// The delivery (Relay or OnDemand) and threshold the agent applies to a request that
    /// comes without a `Request` frame.
    pub standing: (Delivery, u64),
    key: PoolKey,
}

/// Which idle links may serve a request: same thread, kind, user and database.
type PoolKey = (std::thread::ThreadId, LinkKind, String, String);

impl Link {
    fn new(kind: LinkKind, backend: usize, stream: TcpStream, request: &LoginRequest) -> Link {
        Link {
            kind,
            stream,
            buffer: Buffer::with_capacity(LINK_BUFFER_BYTES),
            scanner: Scanner::new(),
            backend,
            welcome: Welcome::default(),
            settings_applied: 0,
            standing: (Delivery::Relay, u64::MAX),
            key: (std::thread::current().id(), kind, request.user.clone(), request.database.clone()),
        }
    }

    /// An idle link must have nothing to read: EOF or stray bytes mean it is unusable.
    pub fn is_alive(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

impl BackendState {
    pub fn new(
        id: usize,
        spec: BackendSpec,
        idle_max: usize,
        source_addr: Option<std::net::Ipv4Addr>,
        key: LinkKey,
    ) -> Self {
        BackendState {
            id,
            spec,
            healthy: AtomicBool::new(true),
            lag_ms: AtomicU64::new(0),
            outstanding: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            idle: Mutex::new(HashMap::new()),
            idle_max,
            source_addr,
            postgres_password: None,
            key,
        }
    }

    /// The password links straight to the server log in with.
    pub fn with_postgres_password(self, postgres_password: Option<String>) -> Self {
        BackendState { postgres_password, ..self }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Bans the backend until a health check readmits it, and drops its idle links.
    pub fn ban(&self, why: &DispatchError) {
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(backend = %self.spec.name, error = %why, "backend banned");
        }
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn readmit(&self) {
        if !self.healthy.swap(true, Ordering::Relaxed) {
            tracing::info!(backend = %self.spec.name, "backend readmitted");
        }
    }

    /// The kind of link that relays answers: straight to the server when its address is known.
    pub fn relay_kind(&self) -> LinkKind {
        if self.spec.postgres.is_some() {
            LinkKind::Postgres
        } else {
            LinkKind::Agent
        }
    }

    /// An idle link of `kind` for (user, database), or a new one.
    pub async fn acquire(&self, kind: LinkKind, user: &str, database: &str) -> Result<Link> {
        let key = (std::thread::current().id(), kind, user.to_string(), database.to_string());
        loop {
            let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&key).and_then(Vec::pop);
            match idle {
                Some(link) if link.is_alive() => return Ok(link),
                // Its agent or server went away while it was idle: drop it and look again.
                Some(_) => continue,
                None => return self.connect_kind(kind, LoginRequest::trust(user, database)).await,
            }
        }
    }

    /// Opens a link of `kind`.
    pub async fn connect_kind(&self, kind: LinkKind, request: LoginRequest) -> Result<Link> {
        match kind {
            LinkKind::Agent => self.connect(request).await,
            LinkKind::Postgres => self.connect_postgres(request).await,
        }
    }

    /// Returns a clean link to the pool (or drops it when the pool is full).
    pub fn release(&self, link: Link) {
        debug_assert!(link.buffer.is_empty(), "a released link has no unread bytes");
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let links = idle.entry(link.key.clone()).or_default();
        if links.len() < self.idle_max {
            links.push(link);
        }
    }

    /// Opens a link straight to the server and logs in (with `postgres_password` when the
    /// server asks for one).
    async fn connect_postgres(&self, request: LoginRequest) -> Result<Link> {
        let address = self.spec.postgres.expect("Postgres links are made only for backends with a server address");
        let stream = connect_from(self.source_addr, address).await?;
        let link = Link::new(LinkKind::Postgres, self.id, stream, &request);
        let request = LoginRequest { password: self.postgres_password.clone(), ..request };
        let (mut login, startup) = Login::start(request);
        log_in(link, &startup, "PostgreSQL", |message| login.on_message(message)).await
    }

    /// Opens a link, proves the agent key and logs in through the agent.
    pub async fn connect(&self, request: LoginRequest) -> Result<Link> {
        let stream = connect_from(self.source_addr, self.spec.agent).await?;
        let link = Link::new(LinkKind::Agent, self.id, stream, &request);
        let (mut login, startup) = LinkLogin::start(self.key.clone(), request);
        log_in(link, &startup, "the agent", |message| login.on_message(message)).await
    }
}

/// Sends `startup` on a new link, then feeds each answer to `on_message` (a sans-I/O login:
/// PostgreSQL's exchange or the agent key's) and writes what it asks for, until it is done.
async fn log_in(
    mut link: Link,
    startup: &[u8],
    peer: &'static str,
    mut on_message: impl FnMut(BackendMessage<'_>) -> std::result::Result<LoginStep, crate::pglogin::LoginError>,
) -> Result<Link> {
    let sending = || format!("sending a login message to {peer}");
    link.stream.write_all(startup).await.map_err(|e| DispatchError::io(sending(), e))?;
    loop {
        let header = link.buffer.read_message(&mut link.stream, peer).await?;
        let step = on_message(BackendMessage::decode(header.tag, link.buffer.body(header))?)?;
        link.buffer.consume(header.frame_len());
        match step {
            LoginStep::Done(welcome) => {
                link.welcome = welcome;
                return Ok(link);
            }
            LoginStep::Continue => {}
            LoginStep::Send(bytes) => {
                link.stream.write_all(&bytes).await.map_err(|e| DispatchError::io(sending(), e))?
            }
        }
    }
}

/// Connects to `peer`, from `source` when given (the VIP must not be the source: backends own it).
pub async fn connect_from(source: Option<std::net::Ipv4Addr>, peer: SocketAddr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4().map_err(|e| DispatchError::io("creating a link socket", e))?;
    if let Some(source) = source {
        socket
            .bind(SocketAddr::from((source, 0)))
            .map_err(|e| DispatchError::io(format!("binding a link to {source}"), e))?;
    }
    let stream = socket.connect(peer).await.map_err(|e| DispatchError::io(format!("connecting to {peer}"), e))?;
    stream.set_nodelay(true).map_err(|e| DispatchError::io("TCP_NODELAY on a link", e))?;
    Ok(stream)
}
