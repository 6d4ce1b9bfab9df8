//! Pools of server connections, one per (database, user), and the per-database connection limit.
//!
//! ```text
//!  acquire ─► idle LIFO has a clean server? ─► yes: take it
//!                 │ no
//!                 ├► open < size and database has room? ─► count it, log in a new server
//!                 └► wait in the FIFO queue ◄─ release hands a server to the first waiter,
//!                                              a closed server hands over its slot ("connect")
//! ```
//!
//! Invariants: `open` counts every live [`ServerConn`] of the pool (idle, in use, logging in) and
//! never exceeds the pool size; a connection's [`Lease`] gives its slot back when it is dropped;
//! no server is ever dropped while the pool's lock is held (its lease takes that lock).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::config::PoolMode;
use crate::error::{PoolerError, TimeoutKind};
use crate::server::{Credential, LoginTarget, ServerConn, Welcome};

/// Identifies a pool: the client-visible database and the client's user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub database: String,
    pub user: String,
}

/// Limits and timeouts of one pool, resolved from the configuration.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub mode: PoolMode,
    pub size: u32,
    pub min_size: u32,
    pub query_wait_timeout_ms: u64,
    pub server_idle_timeout_ms: u64,
    pub server_lifetime_ms: u64,
    pub server_connect_timeout_ms: u64,
    pub message_size_max: u32,
    pub reset_query: String,
}

/// Servers open for one backend database across all its pools, against `max_db_connections`.
#[derive(Debug)]
pub struct DatabaseLimit {
    max: u32,
    open: AtomicU32,
    pools: Mutex<Vec<Weak<Pool>>>,
}

impl DatabaseLimit {
    pub fn new(max: u32) -> Arc<Self> {
        Arc::new(DatabaseLimit { max, open: AtomicU32::new(0), pools: Mutex::new(Vec::new()) })
    }

    fn try_take(&self) -> bool {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (self.max == 0 || open < self.max).then_some(open + 1)
            })
            .is_ok()
    }

    fn give_back(&self) {
        let previous = self.open.fetch_sub(1, Ordering::AcqRel);
        assert!(previous > 0, "database connection count underflow");
    }

    fn siblings(&self) -> Vec<Arc<Pool>> {
        lock(&self.pools).iter().filter_map(Weak::upgrade).collect()
    }
}

/// What a waiting client is handed.
// Boxing the server would allocate on every hand-off; moving 336 bytes is cheaper.
#[allow(clippy::large_enum_variant)]
pub enum Grant {
    Server(ServerConn),
    /// A counted slot: the waiter logs in a new server itself.
    Connect,
    /// The waiter sat in the queue for `query_wait_timeout`.
    Expired,
}

/// A client's place in a pool's queue. Each client owns one for its whole session, so waiting
/// allocates nothing.
#[derive(Default)]
pub struct Waiter {
    grant: Mutex<Option<Grant>>,
    wake: Notify,
}

impl Waiter {
    pub fn new() -> Arc<Self> {
        Arc::new(Waiter::default())
    }

    fn give(&self, grant: Grant) {
        let previous = lock(&self.grant).replace(grant);
        assert!(previous.is_none(), "a waiter was granted twice");
        self.wake.notify_one();
    }

    fn take(&self) -> Option<Grant> {
        lock(&self.grant).take()
    }
}

/// Counters read by the status line and, later, metrics.
#[derive(Debug, Default)]
pub struct PoolStats {
    pub clients: AtomicU32,
    pub waiting: AtomicU32,
    pub transactions: AtomicU64,
    pub wait_time_us: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<ServerConn>,
    /// Waiting clients and when they joined; FIFO, so the oldest is always at the front.
    waiters: VecDeque<(Arc<Waiter>, Instant)>,
    open: u32,
}

/// One pool of servers.
pub struct Pool {
    pub key: PoolKey,
    pub target: LoginTarget,
    pub settings: PoolSettings,
    pub credential: RwLock<Credential>,
    pub welcome: OnceLock<Arc<Welcome>>,
    pub stats: PoolStats,
    database: Arc<DatabaseLimit>,
    state: Mutex<PoolState>,
    myself: Weak<Pool>,
}

/// Counts one server connection in its pool; dropping it frees the slot.
pub struct Lease {
    pool: Weak<Pool>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.slot_freed();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a pool lock is a bug elsewhere; the state itself stays consistent.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Pool {
    pub fn new(
        key: PoolKey,
        target: LoginTarget,
        settings: PoolSettings,
        credential: Credential,
        database: Arc<DatabaseLimit>,
    ) -> Arc<Self> {
        let pool = Arc::new_cyclic(|myself| Pool {
            key,
            target,
            settings,
            credential: RwLock::new(credential),
            welcome: OnceLock::new(),
            stats: PoolStats::default(),
            database: database.clone(),
            state: Mutex::new(PoolState::default()),
            myself: myself.clone(),
        });
        lock(&database.pools).push(Arc::downgrade(&pool));
        pool
    }

    /// Gets a server: idle, newly logged in, or from the queue within `query_wait_timeout`.
    pub async fn acquire(&self, waiter: &Arc<Waiter>) -> Result<ServerConn, PoolerError> {
        loop {
            let grant = match self.try_grant(waiter) {
                Some(grant) => grant,
                None => self.wait(waiter).await?,
            };
            match grant {
                Grant::Server(mut server) => {
                    if server.is_clean() {
                        return Ok(server);
                    }
                    drop(server); // Closed or spoke while idle; its lease frees the slot.
                }
                Grant::Connect => return self.connect().await,
                Grant::Expired => return Err(PoolerError::Timeout(TimeoutKind::QueryWait)),
            }
        }
    }

    /// Takes an idle server or a connect slot, or queues `waiter`; `None` means it was queued.
    fn try_grant(&self, waiter: &Arc<Waiter>) -> Option<Grant> {
        let mut state = lock(&self.state);
        if let Some(server) = state.idle.pop() {
            return Some(Grant::Server(server));
        }
        if state.open < self.settings.size && self.database.try_take() {
            state.open += 1;
            return Some(Grant::Connect);
        }
        state.waiters.push_back((waiter.clone(), Instant::now()));
        drop(state);
        if state_needs_eviction(self) {
            self.evict_sibling_idle();
        }
        None
    }

    async fn wait(&self, waiter: &Arc<Waiter>) -> Result<Grant, PoolerError> {
        let started = Instant::now();
        self.stats.waiting.fetch_add(1, Ordering::Relaxed);
        let mut guard = QueueGuard { pool: self, waiter, finished: false };
        // No timer per wait: `expire_waiters` hands out `Grant::Expired` from the maintenance
        // tick, as PgBouncer's janitor does. A timer per wait would touch tokio's shared timer
        // wheel on every transaction once the pool is busy.
        let grant = loop {
            if let Some(grant) = waiter.take() {
                break grant;
            }
            waiter.wake.notified().await;
        };
        guard.finished = true;
        self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
        self.stats.wait_time_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        Ok(grant)
    }

    /// Leaves the queue; returns a grant that raced in first.
    fn leave_queue(&self, waiter: &Arc<Waiter>) -> Option<Grant> {
        let mut state = lock(&self.state);
        state.waiters.retain(|(queued, _)| !Arc::ptr_eq(queued, waiter));
        drop(state);
        waiter.take()
    }

    /// Expires waiters queued for `query_wait_timeout` or longer; called every maintenance tick.
    pub fn expire_waiters(&self, now: Instant) {
        let timeout_ms = self.settings.query_wait_timeout_ms;
        if timeout_ms == 0 {
            return;
        }
        let timeout = Duration::from_millis(timeout_ms);
        let mut state = lock(&self.state);
        while let Some((_, queued_at)) = state.waiters.front() {
            if now.duration_since(*queued_at) < timeout {
                break;
            }
            let (waiter, _) = state.waiters.pop_front().expect("checked non-empty");
            waiter.give(Grant::Expired);
        }
    }

    /// Logs in a new server in a slot already counted in `open`.
    async fn connect(&self) -> Result<ServerConn, PoolerError> {
        let lease = Lease { pool: self.myself.clone() };
        let credential = self.credential.read().unwrap_or_else(|p| p.into_inner()).clone();
        let timeout = Duration::from_millis(self.settings.server_connect_timeout_ms);
        let login = ServerConn::login(&self.target, &credential, lease, self.settings.message_size_max);
        let (server, welcome) = tokio::time::timeout(timeout, login)
            .await
            .map_err(|_| PoolerError::Timeout(TimeoutKind::ServerConnect))??;
        let _ = self.welcome.set(Arc::new(welcome));
        Ok(server)
    }

    /// Returns a server after use. Broken or expired servers are closed instead.
    pub fn release(&self, mut server: ServerConn) {
        let now = Instant::now();
        let lifetime = self.settings.server_lifetime_ms;
        if server.broken || !server.buffer.is_empty() || (lifetime > 0 && server.age_ms(now) >= lifetime) {
            drop(server);
            return;
        }
        server.idle_since = now;
        let mut state = lock(&self.state);
        match state.waiters.pop_front() {
            Some((waiter, _)) => waiter.give(Grant::Server(server)),
            None => state.idle.push(server),
        }
    }

    /// Called when a server of this pool is closed: hands its slot to a waiter, here or in a
    /// sibling pool of the same database.
    fn slot_freed(&self) {
        let mut state = lock(&self.state);
        assert!(state.open > 0, "pool open count underflow");
        state.open -= 1;
        self.database.give_back();
        if let Some(entry) = state.waiters.pop_front() {
            if self.database.try_take() {
                state.open += 1;
                entry.0.give(Grant::Connect);
                return;
            }
            state.waiters.push_front(entry);
        }
        drop(state);
        for sibling in self.database.siblings() {
            if sibling.offer_slot() {
                return;
            }
        }
    }

    /// Gives a connect slot to this pool's first waiter if it may open one; true if it did.
    fn offer_slot(&self) -> bool {
        let mut state = lock(&self.state);
        if state.waiters.is_empty() || state.open >= self.settings.size || !self.database.try_take() {
            return false;
        }
        state.open += 1;
        let (waiter, _) = state.waiters.pop_front().expect("checked non-empty");
        waiter.give(Grant::Connect);
        true
    }

    /// Closes one idle server of another pool of this database so a slot frees up for us.
    fn evict_sibling_idle(&self) {
        for sibling in self.database.siblings() {
            if std::ptr::eq(Arc::as_ptr(&sibling), self) {
                continue;
            }
            let victim = lock(&sibling.state).idle.pop();
            if let Some(victim) = victim {
                drop(victim);
                return;
            }
        }
    }

    /// Closes idle servers past `server_idle_timeout` or `server_lifetime` (keeping `min_size`)
    /// and returns how many servers should be opened to reach `min_size`.
    pub fn maintain(&self, now: Instant) -> u32 {
        let settings = &self.settings;
        let mut closing = Vec::new();
        let mut state = lock(&self.state);
        let mut index = 0;
        while index < state.idle.len() {
            let server = &state.idle[index];
            let idle_expired =
                settings.server_idle_timeout_ms > 0 && server.idle_ms(now) >= settings.server_idle_timeout_ms;
            let too_old = settings.server_lifetime_ms > 0 && server.age_ms(now) >= settings.server_lifetime_ms;
            let keep_for_min = state.open - closing.len() as u32 <= settings.min_size;
            if too_old || (idle_expired && !keep_for_min) {
                closing.push(state.idle.remove(index));
            } else {
                index += 1;
            }
        }
        let missing = settings.min_size.saturating_sub(state.open - closing.len() as u32);
        drop(state);
        drop(closing);
        missing
    }

    /// Opens one server toward `min_size` and parks it idle.
    pub async fn prefill_one(&self) -> Result<(), PoolerError> {
        let counted = {
            let mut state = lock(&self.state);
            let room = state.open < self.settings.min_size && self.database.try_take();
            if room {
                state.open += 1;
            }
            room
        };
        if counted {
            let server = self.connect().await?;
            self.release(server);
        }
        Ok(())
    }

    /// (open servers, idle servers, queued clients).
    pub fn counts(&self) -> (u32, u32, u32) {
        let state = lock(&self.state);
        (state.open, state.idle.len() as u32, state.waiters.len() as u32)
    }
}

/// Leaves the queue if a wait is abandoned (its future dropped), returning anything granted.
struct QueueGuard<'a> {
    pool: &'a Pool,
    waiter: &'a Arc<Waiter>,
    finished: bool,
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.pool.stats.waiting.fetch_sub(1, Ordering::Relaxed);
        match self.pool.leave_queue(self.waiter) {
            Some(Grant::Server(server)) => self.pool.release(server),
            Some(Grant::Connect) => drop(Lease { pool: self.pool.myself.clone() }),
            Some(Grant::Expired) | None => {}
        }
    }
}

/// True when this pool could open a server but its database is full.
fn state_needs_eviction(pool: &Pool) -> bool {
    pool.database.max > 0 && lock(&pool.state).open < pool.settings.size
}
