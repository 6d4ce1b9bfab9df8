//! `bypass dispatch serve`: the PostgreSQL-aware dispatcher. It owns every client session,
//! routes each request to a backend (primary or least-busy healthy replica), relays answers —
//! and, for large ones, hands the client's TCP connection to the backend's agent.
//!
//! ```text
//!  client ──► accept ──► session (login, then per request:)
//!                          classify ─► route ─► link from the backend's pool ─► relay answer
//!                                                                   └─► or hand over (policy)
//!  health task per backend: every health_interval_ms, `select lag` through a link:
//!      failure ⇒ banned (no reads, idle links dropped); success ⇒ readmitted; lag > max ⇒ no reads
//! ```
//! Threads: `workers` threads, each a single-threaded runtime; the first accepts and deals
//! connections round-robin. A session, its links and its imported sockets live on one thread
//! (idle links are pooled per thread), so no answer ever waits for a wake-up of another thread.
//!
//! Invariants:
//! - A link goes back to its pool only when its session is idle ('I') with every request
//!   answered and no unread bytes.
//! - Inside a transaction the session keeps its link; routing decides only between transactions.

mod backend;
mod health;
mod session;
mod transfer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use bypass_frontdoor::{FrontDoor, FrontDoorConfig, GuardSettings};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

pub use backend::{BackendState, Link, LinkKind};

use crate::config::{Policy, ValidDispatcherConfig};
use crate::error::{DispatchError, Result};
use crate::routing::{self, pick_replica, AnswerSizes, Candidate, Prediction};
use crate::runtime::{self, Running};
use crate::steer::Switch;

/// Most function names whose volatility the dispatcher remembers.
const VOLATILITY_CACHE_MAX: usize = 4096;

/// State shared by every session.
pub struct Shared {
    pub config: ValidDispatcherConfig,
    pub backends: Vec<BackendState>,
    /// Round-robin tie-break among equally busy replicas.
    turn: AtomicUsize,
    /// Function name → volatile? (from pg_proc on the primary).
    volatility: Mutex<HashMap<String, bool>>,
    clients: Arc<Semaphore>,
    /// The switch's steering table (hand-over policies only).
    pub switch: Option<Switch>,
    /// Statement fingerprint → sizes of its last answers (hybrid policy).
    history: Mutex<HashMap<u64, AnswerSizes>>,
    pub stats: Stats,
    /// Client authentication: the front door shared with the pooler and the engine.
    pub door: Arc<FrontDoor>,
}

/// Counters the tests and the benchmark read.
#[derive(Default)]
pub struct Stats {
    /// Connections handed to an agent (upfront or on demand).
    pub handovers: AtomicU64,
    /// Of those, moves an agent asked for in the middle of an answer.
    pub on_demand: AtomicU64,
    /// Connections returned by agents.
    pub handbacks: AtomicU64,
    /// Of those, returns that carried the client's next request in the receive queue.
    pub returned_with_request: AtomicU64,
    /// Imports an agent refused (the answer was relayed instead).
    pub import_failures: AtomicU64,
    /// Sessions that ended because the agent owning their connection went away.
    pub lost_while_away: AtomicU64,
    /// Sessions whose client closed while an agent owned the connection (it cannot move).
    pub closed_while_away: AtomicU64,
    /// Moves not made because the client had closed its side (a closing connection cannot be
    /// exported); the answer was relayed.
    pub stayed_home_closing: AtomicU64,
    /// Moves whose owner gave up waiting (`settle_wait_ms`) for segments the switch had let
    /// through before blocking the flow: one was lost on the way, or the host is very slow.
    pub settle_timeouts: AtomicU64,
    /// Moves from the dispatcher that found segments still on their way after the BLOCK, and
    /// waited for them (each one a reset or a lost request without that wait).
    pub settle_waits: AtomicU64,
}

impl Shared {
    fn new(config: ValidDispatcherConfig, switch: Option<Switch>) -> Self {
        let settings = &config.settings;
        let backends = config
            .backends
            .iter()
            .enumerate()
            .map(|(id, spec)| {
                BackendState::new(
                    id,
                    spec.clone(),
                    settings.link_idle_max,
                    settings.source_addr,
                    config.agent_key.clone(),
                )
                .with_postgres_password(settings.postgres_password.clone())
            })
            .collect();
        let clients = Arc::new(Semaphore::new(settings.clients_max));
        let door = front_door(&config);
        Shared {
            door,
            config,
            backends,
            turn: AtomicUsize::new(0),
            volatility: Mutex::new(HashMap::new()),
            clients,
            switch,
            history: Mutex::new(HashMap::new()),
            stats: Stats::default(),
        }
    }

    /// What the answers of a statement with this fingerprint are expected to be.
    fn predict(&self, fingerprint: u64) -> Prediction {
        let sizes = self.history.lock().unwrap_or_else(|p| p.into_inner()).get(&fingerprint).copied();
        routing::predict_answer(sizes, self.config.settings.handover_min_bytes)
    }

    fn remember_bytes(&self, fingerprint: u64, bytes: u64) {
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if history.len() >= self.config.settings.size_history_max {
            history.clear();
        }
        let sizes = history.get(&fingerprint).copied().unwrap_or_default();
        history.insert(fingerprint, sizes.after(bytes, self.config.settings.handover_min_bytes));
    }

    /// The replica for a read: healthy, fresh enough, fewest outstanding requests; a tie goes to
    /// `preferred` (the session's last replica).
    pub fn pick_replica(&self, replicas: &[usize], preferred: Option<usize>) -> Option<usize> {
        let lag_max = self.config.settings.replica_lag_max_ms;
        let candidates: Vec<Candidate> = replicas
            .iter()
            .map(|&id| {
                let backend = &self.backends[id];
                Candidate {
                    id,
                    healthy: backend.is_healthy(),
                    lag_ok: backend.lag_ms.load(Ordering::Relaxed) <= lag_max,
                    outstanding: backend.outstanding.load(Ordering::Relaxed),
                }
            })
            .collect();
        let picked = pick_replica(&candidates, self.turn.load(Ordering::Relaxed), preferred);
        // The turn moves only when round-robin decided, so sessions' first picks alternate.
        if picked.is_some() && picked != preferred {
            self.turn.fetch_add(1, Ordering::Relaxed);
        }
        picked
    }

    /// Cached volatility of `name`, if known.
    fn cached_volatility(&self, name: &str) -> Option<bool> {
        self.volatility.lock().unwrap_or_else(|p| p.into_inner()).get(name).copied()
    }

    fn remember_volatility(&self, name: &str, volatile: bool) {
        let mut cache = self.volatility.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= VOLATILITY_CACHE_MAX {
            cache.clear();
        }
        cache.insert(name.to_string(), volatile);
    }
}

/// The dispatcher's front door: its auth file or hba, plaintext only (a connection that may
/// move to a backend's agent cannot carry TLS state yet).
fn front_door(config: &ValidDispatcherConfig) -> Arc<FrontDoor> {
    let settings = &config.settings;
    FrontDoor::new(FrontDoorConfig {
        tls: None,
        method: settings.auth_type.method(),
        hba: config.hba.clone(),
        users: config.users.clone(),
        login_timeout: Duration::from_millis(settings.client_login_timeout_ms),
        message_size_max: LOGIN_MESSAGE_BYTES_MAX,
        guard: GuardSettings {
            failure_delay: Duration::from_millis(settings.auth_failure_delay_ms),
            failures_per_address_max: settings.failed_logins_per_address_max,
            failure_window: Duration::from_millis(settings.failed_login_window_ms),
        },
        mock: settings.auth_file.as_deref().and_then(|path| bypass_frontdoor::mock_key(path).ok()),
    })
}

/// Largest password message a client may send.
const LOGIN_MESSAGE_BYTES_MAX: u32 = 64 * 1024;

/// What a started dispatcher reports.
#[derive(Clone)]
pub struct DispatcherInfo {
    pub local_addr: SocketAddr,
    pub shared: Arc<Shared>,
}

/// Starts the dispatcher (inside `namespace` when given): `workers` threads, each with its own
/// single-threaded runtime; the first also accepts and runs the health checks.
pub fn start(config: ValidDispatcherConfig, namespace: Option<String>) -> Result<Running<DispatcherInfo>> {
    let worker_namespace = namespace.clone();
    runtime::spawn("dispatcher", namespace, 1, move |stop, ready| serve(config, worker_namespace, stop, ready))
}

async fn serve(
    config: ValidDispatcherConfig,
    namespace: Option<String>,
    mut stop: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<DispatcherInfo>,
) -> Result<()> {
    let listener = TcpListener::bind(config.listen_addr)
        .await
        .map_err(|e| DispatchError::io(format!("dispatcher binding {}", config.listen_addr), e))?;
    let local_addr = listener.local_addr().map_err(|e| DispatchError::io("dispatcher listen address", e))?;
    let switch = match (&config.settings.policy, &config.settings.steer_namespace) {
        (Policy::Relay, _) | (_, None) => None,
        (_, Some(namespace)) => Some(Switch::attach(namespace, &config.settings.steer_ports)?),
    };
    let shared = Arc::new(Shared::new(config, switch));
    let mut workers = Workers::start(&shared, namespace, &stop)?;
    for id in 0..shared.backends.len() {
        tokio::spawn(health::watch_backend(shared.clone(), id, stop.clone()));
    }
    let _ = ready.send(DispatcherInfo { local_addr, shared: shared.clone() });
    tracing::info!(address = %local_addr, "dispatcher listening");
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => { tracing::warn!(%error, "accept failed"); continue; }
                };
                let slot = shared.clients.clone().try_acquire_owned().ok();
                workers.assign(&shared, stream, peer, slot);
            }
        }
    }
    tokio::task::spawn_blocking(move || workers.join())
        .await
        .map_err(|_| DispatchError::Lab("joining the dispatcher's workers failed".into()))?
}

/// Accepted connections waiting for one worker thread. A connection that finds its worker's
/// queue full is served by the accepting thread instead.
const HANDOFF_QUEUE_MAX: usize = 64;

/// A connection on its way from the accepting thread to a worker.
struct Accepted {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    slot: Option<OwnedSemaphorePermit>,
}

/// The worker threads besides the accepting one; connections are dealt round-robin, the
/// accepting thread taking every `senders.len() + 1`-th.
struct Workers {
    senders: Vec<mpsc::Sender<Accepted>>,
    threads: Vec<std::thread::JoinHandle<Result<()>>>,
    next: usize,
}

impl Workers {
    fn start(shared: &Arc<Shared>, namespace: Option<String>, stop: &watch::Receiver<bool>) -> Result<Workers> {
        let mut workers = Workers { senders: Vec::new(), threads: Vec::new(), next: 0 };
        for _ in 1..shared.config.settings.workers {
            let (sender, receiver) = mpsc::channel(HANDOFF_QUEUE_MAX);
            let (shared, stop) = (shared.clone(), stop.clone());
            let work = move || serve_handed_off(shared, receiver, stop);
            workers.threads.push(runtime::spawn_worker("dispatcher-worker", namespace.clone(), work)?);
            workers.senders.push(sender);
        }
        Ok(workers)
    }

    /// Starts serving an accepted connection on the next worker in turn.
    fn assign(
        &mut self,
        shared: &Arc<Shared>,
        stream: TcpStream,
        peer: SocketAddr,
        slot: Option<OwnedSemaphorePermit>,
    ) {
        let turn = self.next % (self.senders.len() + 1);
        self.next = self.next.wrapping_add(1);
        if turn > 0 {
            // A socket is registered with the runtime of the thread that serves it.
            match stream.into_std() {
                Ok(stream) => match self.senders[turn - 1].try_send(Accepted { stream, peer, slot }) {
                    Ok(()) => return,
                    Err(refused) => {
                        let Accepted { stream, slot, .. } = refused.into_inner();
                        if let Ok(stream) = TcpStream::from_std(stream) {
                            tokio::spawn(session::serve_client(shared.clone(), stream, peer, slot));
                        }
                    }
                },
                Err(error) => tracing::warn!(%peer, %error, "could not hand a connection to a worker"),
            }
            return;
        }
        tokio::spawn(session::serve_client(shared.clone(), stream, peer, slot));
    }

    /// Closes the queues (ending the workers) and waits for the threads.
    fn join(self) -> Result<()> {
        drop(self.senders);
        for thread in self.threads {
            thread.join().map_err(|_| DispatchError::Lab("a dispatcher worker panicked".into()))??;
        }
        Ok(())
    }
}

/// A worker thread's life: serve the connections handed to it until the dispatcher stops.
async fn serve_handed_off(shared: Arc<Shared>, mut queue: mpsc::Receiver<Accepted>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            accepted = queue.recv() => {
                let Some(Accepted { stream, peer, slot }) = accepted else { return };
                match TcpStream::from_std(stream) {
                    Ok(stream) => {
                        tokio::spawn(session::serve_client(shared.clone(), stream, peer, slot));
                    }
                    Err(error) => tracing::warn!(%peer, %error, "a worker could not take a connection"),
                }
            }
        }
    }
}
