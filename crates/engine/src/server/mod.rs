//! `bypass engine serve`: the PostgreSQL protocol (simple and extended query, COPY, cancel)
//! over the engine, on the `bypass-wire` codec.
//!
//! ```text
//!   client ─TCP─► network thread (current-thread Tokio runtime: only socket I/O)
//!     startup ─► session loop ─► one statement at a time on a blocking thread:
//!        Session::execute ─► morsel workers encode DataRows ─► bounded channel ─► socket
//!     while a statement runs the loop also reads the socket: EOF stops the statement
//!   CancelRequest (new connection) ─► registry (pid, secret) ─► that statement's control
//! ```
//!
//! Why our own loop instead of the `pgwire` crate: results must stream as the pipeline
//! produces them (pgwire wants a whole response), a statement must notice its client leaving,
//! CancelRequest must reach the running statement, COPY FROM STDIN needs the raw message loop,
//! and sessions carry transaction state. Owning the loop makes each of these a few lines.
//!
//! Invariants: compute and encoding never run on the network thread; every engine error
//! becomes an ErrorResponse with its SQLSTATE and the connection stays usable; a client's
//! buffered input is bounded by `message_size_max`; a statement's pending output by the
//! channel's capacity.

mod connection;
pub mod encode;
pub mod params;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bypass_frontdoor::{CancelKey, FrontDoor, FrontDoorConfig};
use bypass_wire::auth::Method;
use bypass_wire::auth_file::AuthFile;
use tokio::net::TcpListener;

use crate::control::{QueryControl, StopReason};
use crate::engine::Engine;
use crate::error::EngineError;

/// Connections served at once; further ones wait in the listen backlog.
pub const CONNECTIONS_MAX: usize = 256;
/// Largest message a client may send (bytes).
pub const MESSAGE_SIZE_MAX: usize = 64 << 20;
/// The database name clients connect to.
pub const DATABASE_NAME: &str = "bypass";

/// How the server runs.
#[derive(Debug)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub database: String,
    pub connections_max: usize,
    pub message_size_max: usize,
    /// Who may connect and how they prove it (auth file, method, TLS): the shared front door.
    pub front_door: FrontDoorConfig,
}

impl ServerSettings {
    /// A server whose clients prove a password from `users` (SCRAM-SHA-256, or MD5 for users
    /// whose secret is an MD5 hash), without TLS.
    pub fn new(listen: SocketAddr, users: AuthFile) -> ServerSettings {
        ServerSettings::with_front_door(listen, FrontDoorConfig::scram(users))
    }

    pub fn with_front_door(listen: SocketAddr, front_door: FrontDoorConfig) -> ServerSettings {
        ServerSettings {
            listen,
            database: DATABASE_NAME.into(),
            connections_max: CONNECTIONS_MAX,
            message_size_max: MESSAGE_SIZE_MAX,
            front_door,
        }
    }

    /// One user with a password (tests, `make run`).
    pub fn with_password(listen: SocketAddr, user: &str, password: &str) -> ServerSettings {
        let mut users = AuthFile::default();
        users.insert(user, password);
        ServerSettings::new(listen, users)
    }

    /// No authentication: anyone who can reach the port is in (`--no-auth`, only when asked).
    pub fn trust(listen: SocketAddr) -> ServerSettings {
        let front_door = FrontDoorConfig { method: Method::Trust, ..FrontDoorConfig::scram(AuthFile::default()) };
        ServerSettings::with_front_door(listen, front_door)
    }
}

/// The running statement of one connection, for CancelRequest.
#[derive(Default)]
pub(crate) struct CancelSlot {
    control: Mutex<Option<Arc<QueryControl>>>,
}

impl CancelSlot {
    fn set(&self, control: Option<Arc<QueryControl>>) {
        *self.control.lock().unwrap_or_else(|p| p.into_inner()) = control;
    }

    fn cancel(&self) {
        if let Some(control) = self.current() {
            control.stop(StopReason::Canceled);
        }
    }

    fn current(&self) -> Option<Arc<QueryControl>> {
        self.control.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A cancel key as the registry holds it: (process id, secret).
type CancelId = (i32, [u8; 4]);

/// State shared by all connections of one server.
pub(crate) struct Shared {
    engine: Arc<Engine>,
    settings: ServerSettings,
    door: Arc<FrontDoor>,
    cancels: Mutex<HashMap<CancelId, Arc<CancelSlot>>>,
    /// Statements running now (tests and monitoring watch it).
    running: std::sync::atomic::AtomicUsize,
}

impl Shared {
    /// Registers a connection's cancel key.
    fn register(&self, key: &CancelKey, slot: &Arc<CancelSlot>) {
        self.cancels.lock().unwrap_or_else(|p| p.into_inner()).insert((key.process_id, key.secret), Arc::clone(slot));
    }

    fn unregister(&self, key: &CancelKey) {
        self.cancels.lock().unwrap_or_else(|p| p.into_inner()).remove(&(key.process_id, key.secret));
    }

    /// Cancels the running statement of the connection with this key; a wrong key does nothing
    /// (and says nothing, as PostgreSQL).
    fn cancel(&self, process_id: i32, secret: &[u8]) {
        let Ok(secret) = <[u8; 4]>::try_from(secret) else { return };
        let slot = self.cancels.lock().unwrap_or_else(|p| p.into_inner()).get(&(process_id, secret)).cloned();
        if let Some(slot) = slot {
            slot.cancel();
        }
    }
}

/// A running server: its address, and a handle that stops it when dropped.
pub struct Server {
    pub address: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Statements running now on all connections.
    pub fn statements_running(&self) -> usize {
        self.shared.running.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            // The receiver may be gone already when the accept loop failed: nothing to stop.
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts serving on a separate network thread (`settings.listen` port 0 = any free port).
pub fn start(engine: Arc<Engine>, mut settings: ServerSettings) -> Result<Server, EngineError> {
    let address = settings.listen;
    let listener =
        std::net::TcpListener::bind(address).map_err(|e| EngineError::io(format!("binding {address}"), e))?;
    listener.set_nonblocking(true).map_err(|e| EngineError::io("configuring the listener", e))?;
    let address = listener.local_addr().map_err(|e| EngineError::io("reading the listen address", e))?;
    settings.listen = address;
    let (shutdown, stopped) = tokio::sync::oneshot::channel();
    let front_door = std::mem::replace(&mut settings.front_door, FrontDoorConfig::scram(AuthFile::default()));
    let shared = Arc::new(Shared {
        engine,
        settings,
        door: FrontDoor::new(front_door),
        cancels: Mutex::new(HashMap::new()),
        running: Default::default(),
    });
    let accepting = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("engine-network".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            match runtime {
                Ok(runtime) => runtime.block_on(accept_loop(listener, accepting, stopped)),
                Err(error) => eprintln!("engine server: cannot start the network runtime: {error}"),
            }
        })
        .map_err(|e| EngineError::io("spawning the network thread", e))?;
    Ok(Server { address, shared, shutdown: Some(shutdown), thread: Some(thread) })
}

async fn accept_loop(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("engine server: {error}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(shared.settings.connections_max));
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((socket, _)) = accepted else { continue };
        let _ = socket.set_nodelay(true);
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else { return };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            // A client that misbehaves or disconnects ends only its own connection.
            connection::serve(shared, socket).await;
            drop(permit);
        });
    }
}
