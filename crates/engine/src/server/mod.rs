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
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

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
#[derive(Debug, Clone)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub database: String,
    pub connections_max: usize,
    pub message_size_max: usize,
}

impl ServerSettings {
    pub fn new(listen: SocketAddr) -> ServerSettings {
        ServerSettings {
            listen,
            database: DATABASE_NAME.into(),
            connections_max: CONNECTIONS_MAX,
            message_size_max: MESSAGE_SIZE_MAX,
        }
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
        if let Some(control) = &*self.control.lock().unwrap_or_else(|p| p.into_inner()) {
            control.stop(StopReason::Canceled);
        }
    }
}

/// State shared by all connections of one server.
pub(crate) struct Shared {
    engine: Arc<Engine>,
    settings: ServerSettings,
    cancels: Mutex<HashMap<(i32, i32), Arc<CancelSlot>>>,
    next_process_id: AtomicI32,
}

impl Shared {
    /// Registers a connection's cancel key: (process id, secret).
    fn register(&self, slot: &Arc<CancelSlot>) -> (i32, i32) {
        let process_id = self.next_process_id.fetch_add(1, Ordering::Relaxed);
        let key = (process_id, random_i32());
        self.cancels.lock().unwrap_or_else(|p| p.into_inner()).insert(key, Arc::clone(slot));
        key
    }

    fn unregister(&self, key: (i32, i32)) {
        self.cancels.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
    }

    /// Cancels the running statement of the connection with this key; a wrong key does nothing
    /// (and says nothing, as PostgreSQL).
    fn cancel(&self, process_id: i32, secret: &[u8]) {
        let Ok(secret) = <[u8; 4]>::try_from(secret) else { return };
        let slot = self.cancels.lock().unwrap_or_else(|p| p.into_inner()).get(&(process_id, i32::from_be_bytes(secret))).cloned();
        if let Some(slot) = slot {
            slot.cancel();
        }
    }
}

fn random_i32() -> i32 {
    let mut bytes = [0u8; 4];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into our buffer.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    assert_eq!(filled, 4, "the kernel's random source works");
    i32::from_ne_bytes(bytes)
}

/// A running server: its address, and a handle that stops it when dropped.
pub struct Server {
    pub address: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
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

/// Starts serving on `address` (port 0 = any free port) with default settings.
pub fn start(engine: Arc<Engine>, address: SocketAddr) -> Result<Server, EngineError> {
    start_with(engine, ServerSettings::new(address))
}

/// Starts serving on a separate network thread.
pub fn start_with(engine: Arc<Engine>, settings: ServerSettings) -> Result<Server, EngineError> {
    let address = settings.listen;
    let listener =
        std::net::TcpListener::bind(address).map_err(|e| EngineError::io(format!("binding {address}"), e))?;
    listener.set_nonblocking(true).map_err(|e| EngineError::io("configuring the listener", e))?;
    let address = listener.local_addr().map_err(|e| EngineError::io("reading the listen address", e))?;
    let (shutdown, stopped) = tokio::sync::oneshot::channel();
    let shared = Arc::new(Shared {
        engine,
        settings,
        cancels: Mutex::new(HashMap::new()),
        next_process_id: AtomicI32::new(std::process::id() as i32 & 0x3fff_ffff),
    });
    let thread = std::thread::Builder::new()
        .name("engine-network".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            match runtime {
                Ok(runtime) => runtime.block_on(accept_loop(listener, shared, stopped)),
                Err(error) => eprintln!("engine server: cannot start the network runtime: {error}"),
            }
        })
        .map_err(|e| EngineError::io("spawning the network thread", e))?;
    Ok(Server { address, shutdown: Some(shutdown), thread: Some(thread) })
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
