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
//! Shards: the pooler runs one single-threaded runtime per core, and each server is registered
//! with the reactor of one shard (its `home`). The queue is one FIFO for the whole pool, but a
//! released server goes to its own shard's first waiter unless that one joined more than
//! [`LOCAL_SLACK`] after the oldest waiter overall: hand-offs stay on one core (no cross-thread
//! wake-up, no change of reactor) and no client is overtaken by one that came 50 ms later. With
//! no waiter on its shard, a released server stays there idle (the next client of any shard
//! takes it) unless the oldest waiter's shard has no server or has waited past the slack.
//! The pool splits its servers between shards in proportion to their clients: a shard holding
//! more than its share (by one server) gives its released server to the oldest waiter's shard.
//! Without that, the split made at start-up persists and the clients of the shard with fewer
//! servers per client wait longer (the kernel's `SO_REUSEPORT` hash splits clients unevenly);
//! with servers moving whenever a queue runs empty for a moment, thousands move a second.
//!
//! Invariants: `open` counts every live [`ServerConn`] of the pool (idle, in use, logging in) and
//! never exceeds the pool size; a connection's [`Lease`] gives its slot back when it is dropped;
//! no server is ever dropped while the pool's lock is held (its lease takes that lock).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::config::PoolMode;
use crate::error::{PoolerError, TimeoutKind};
use crate::lease::SlotOwner;
pub use crate::lease::{ConnectionLimit, Lease, SharedLimits};
use crate::prepared::StatementRegistry;
use crate::server::{Credential, LoginTarget, ServerConn, ServerLimits, Welcome};
use crate::stats::PoolStats;

mod kernel_lend;
mod policy;
mod waiters;

pub use kernel_lend::{serve_handoffs, KernelPools};
use policy::{PoolState, Queued};
pub use waiters::{remember_client_task_bytes, Grant, Waiter};

/// How much later than the oldest waiter a waiter of the releasing shard may have joined and
/// still be served first. Measured at 1,000 clients on two pinned shards (`SELECT 1`): with a
/// slack of a quarter of the head's wait (≈ 7 ms there) ~900 servers a second changed shards and
/// throughput was 0.8× PgBouncer's; with this bound, under 5 a second and 1.7–1.9×.
pub const LOCAL_SLACK: Duration = Duration::from_millis(50);

/// Identifies a pool: the client-visible database and the client's user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub database: String,
    pub user: String,
    /// The client's `options` startup parameter when `pass_options` is on: clients with other
    /// options get other pools, whose servers were started with theirs.
    pub options: Option<String>,
}

/// What a pool is, fixed for its life: a reload that changes any of it makes a new pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSettings {
    pub mode: PoolMode,
    pub message_size_max: u32,
    pub reset_query: String,
    /// Runtimes (cores) the pooler runs on.
    pub shards: usize,
    /// Prepared statements kept per server in transaction mode; 0 turns the feature off.
    pub max_prepared_statements: u32,
}

/// Everything that identifies a pool's servers: a reload that changes any part replaces the pool.
#[derive(Debug, Clone)]
pub struct PoolIdentity {
    pub key: PoolKey,
    pub target: LoginTarget,
    pub settings: PoolSettings,
    pub credential: Credential,
}

/// Sizes and timeouts of a pool; a reload changes them while the pool serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    pub size: u32,
    pub min_size: u32,
    pub query_wait_timeout_ms: u64,
    pub server_idle_timeout_ms: u64,
    pub server_lifetime_ms: u64,
    pub server_connect_timeout_ms: u64,
    /// Log each server the pooler closes (`log_disconnections`).
    pub log_disconnections: bool,
    /// Servers beyond `size` for clients that waited `reserve_timeout_ms`.
    pub reserve_size: u32,
    pub reserve_timeout_ms: u64,
}

/// One pool of servers.
pub struct Pool {
    pub key: PoolKey,
    pub target: LoginTarget,
    pub settings: PoolSettings,
    pub credential: RwLock<Credential>,
    pub welcome: OnceLock<Arc<Welcome>>,
    pub stats: PoolStats,
    /// Statement texts prepared through this pool, by id (transaction-mode prepared statements);
    /// shared with a successor so clients keep their statements across a reload.
    pub statements: Arc<StatementRegistry>,
    /// The database's and the user's limits, shared with their other pools.
    shared_limits: SharedLimits,
    /// Servers logging in right now (PgBouncer's `sv_login`).
    logging_in: AtomicU32,
    state: Mutex<PoolState>,
    /// Set when a reload changed what this pool is (backend, credential, mode): its clients move
    /// to the successor at their next transaction, and it closes servers as they come back.
    successor: OnceLock<Arc<Pool>>,
    myself: Weak<Pool>,
    /// Set when this pool's transactions run in the kernel: its idle servers are lent there.
    kernel: OnceLock<crate::kernel::KernelPool>,
    /// Every kernel pool by index, set with `kernel`: handoffs drained here go to their pool.
    handoff_pools: OnceLock<Arc<KernelPools>>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a pool lock is a bug elsewhere; the state itself stays consistent.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Pool {
    pub fn new(
        identity: PoolIdentity,
        limits: PoolLimits,
        shared_limits: SharedLimits,
        statements: Arc<StatementRegistry>,
    ) -> Arc<Self> {
        let PoolIdentity { key, target, settings, credential } = identity;
        let shards = settings.shards;
        let pool = Arc::new_cyclic(|myself| Pool {
            key,
            target,
            settings,
            credential: RwLock::new(credential),
            welcome: OnceLock::new(),
            stats: PoolStats::new(shards),
            statements,
            shared_limits: shared_limits.clone(),
            logging_in: AtomicU32::new(0),
            state: Mutex::new(PoolState::new(shards, limits)),
            successor: OnceLock::new(),
            myself: myself.clone(),
            kernel: OnceLock::new(),
            handoff_pools: OnceLock::new(),
        });
        let owner: Weak<dyn SlotOwner> = Arc::downgrade(&pool) as Weak<Pool>;
        shared_limits.register(owner);
        pool
    }

    /// Gets a server for a client on `shard`: idle, newly logged in, or from the queue within
    /// `query_wait_timeout`. Must run on that shard's runtime.
    /// `None` means a reload replaced this pool: ask [`Pool::successor`] (see [`acquire_current`]).
    pub async fn acquire(&self, shard: usize, waiter: &Arc<Waiter>) -> Result<Option<Box<ServerConn>>, PoolerError> {
        self.drain_kernel_handoffs();
        loop {
            let grant = match self.try_grant(shard, waiter) {
                Some(grant) => {
                    self.stats.shard(shard).wait.observe(Duration::ZERO);
                    grant
                }
                None => self.wait(shard, waiter).await?,
            };
            match grant {
                Grant::Server(server) => {
                    if server.home != shard {
                        self.stats.server_moves.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(server) = usable(server, shard) {
                        return Ok(Some(server));
                    }
                }
                Grant::Connect => return self.connect(shard).await.map(Some),
                Grant::Expired => return Err(PoolerError::Timeout(TimeoutKind::QueryWait)),
                Grant::Moved => return Ok(None),
            }
        }
    }

    /// Takes an idle server or a connect slot, or queues `waiter`; `None` means it was queued.
    fn try_grant(&self, shard: usize, waiter: &Arc<Waiter>) -> Option<Grant> {
        if self.successor.get().is_some() {
            return Some(Grant::Moved);
        }
        let mut state = lock(&self.state);
        if state.paused {
            state.waiters[shard].push_back(Queued { waiter: waiter.clone(), since: Instant::now() });
            return None;
        }
        let reclaimed = || self.kernel.get().and_then(|kernel| kernel.reclaim());
        if let Some(mut server) = reclaimed().or_else(|| state.take_idle(shard)) {
            state.count_home(&mut server, shard);
            return Some(Grant::Server(server));
        }
        if !state.paused && state.open < state.limits.size && self.shared_limits.try_take() {
            state.open += 1;
            return Some(Grant::Connect);
        }
        state.waiters[shard].push_back(Queued { waiter: waiter.clone(), since: Instant::now() });
        self.sync_kernel_waiters(&state);
        // The kernel may have freed a server before it saw this waiter: look once more.
        if let Some(mut server) = self.kernel.get().and_then(|kernel| kernel.reclaim()) {
            state.remove(waiter);
            self.sync_kernel_waiters(&state);
            state.count_home(&mut server, shard);
            return Some(Grant::Server(server));
        }
        drop(state);
        if state_needs_eviction(self) {
            self.evict_sibling_idle();
        }
        None
    }

    async fn wait(&self, shard: usize, waiter: &Arc<Waiter>) -> Result<Grant, PoolerError> {
        let started = Instant::now();
        let mut guard = QueueGuard { pool: self, waiter, finished: false };
        // No timer per wait: `expire_waiters` hands out `Grant::Expired` from the maintenance
        // tick, as PgBouncer's janitor does. A timer per wait would touch tokio's shared timer
        // wheel on every transaction once the pool is busy.
        let grant = std::future::poll_fn(|context| waiter.poll_grant(context)).await;
        guard.finished = true;
        self.stats.shard(shard).wait.observe(started.elapsed());
        Ok(grant)
    }

    /// Leaves the queue; returns a grant that raced in first.
    fn leave_queue(&self, waiter: &Arc<Waiter>) -> Option<Grant> {
        let mut state = lock(&self.state);
        state.remove(waiter);
        self.sync_kernel_waiters(&state);
        drop(state);
        waiter.take()
    }

    /// Expires waiters queued for `query_wait_timeout` or longer; called every maintenance tick.
    /// Also hands out servers left idle on a quiet shard while clients of another wait.
    pub fn expire_waiters(&self, now: Instant) {
        let mut state = lock(&self.state);
        let timeout_ms = state.limits.query_wait_timeout_ms;
        if timeout_ms > 0 {
            let timeout = Duration::from_millis(timeout_ms);
            for queue in state.waiters.iter_mut() {
                while queue.front().is_some_and(|queued| now.duration_since(queued.since) >= timeout) {
                    let queued = queue.pop_front().expect("checked non-empty");
                    queued.waiter.give(Grant::Expired);
                }
            }
            self.sync_kernel_waiters(&state);
        }
        let stranded = !state.idle.is_empty() && state.waiting() > 0;
        let reserved = self.open_reserve(&mut state, now);
        drop(state);
        if reserved > 0 {
            tracing::info!(database = %self.key.database, user = %self.key.user, servers = reserved, "taking connections from the reserve pool");
        }
        if stranded {
            self.serve_waiters();
        }
    }

    /// Lets the oldest waiters open reserve servers (beyond the pool size, up to
    /// `reserve_size`) once they waited `reserve_timeout_ms`; returns how many.
    fn open_reserve(&self, state: &mut PoolState, now: Instant) -> u32 {
        let limits = state.limits;
        let mut opened = 0;
        while limits.reserve_size > 0 && !state.paused && state.open < limits.size + limits.reserve_size {
            let waited = state.oldest_wait(now).unwrap_or_default();
            if waited < Duration::from_millis(limits.reserve_timeout_ms) || !self.shared_limits.try_take() {
                break;
            }
            let (_, queued) = state.pop_oldest().expect("a waiter waited");
            state.open += 1;
            opened += 1;
            queued.waiter.give(Grant::Connect);
        }
        if opened > 0 {
            self.sync_kernel_waiters(state);
        }
        opened
    }

    /// Logs in a new server on `shard` in a slot already counted in `open`.
    async fn connect(&self, shard: usize) -> Result<Box<ServerConn>, PoolerError> {
        let lease = self.lease();
        let credential = self.credential.read().unwrap_or_else(|p| p.into_inner()).clone();
        let timeout = Duration::from_millis(lock(&self.state).limits.server_connect_timeout_ms);
        let limits = ServerLimits {
            message_size_max: self.settings.message_size_max,
            statements_max: self.settings.max_prepared_statements as usize,
        };
        let login = ServerConn::login(&self.target, &credential, lease, limits, shard);
        self.logging_in.fetch_add(1, Ordering::Relaxed);
        let _logged_in = LoginCount(&self.logging_in);

        let (mut server, welcome) = match tokio::time::timeout(timeout, login).await {
            Ok(Ok(logged_in)) => logged_in,
            Ok(Err(error)) => return Err(self.connect_failed(error)),
            Err(_) => return Err(self.connect_failed(PoolerError::Timeout(TimeoutKind::ServerConnect))),
        };
        let _ = self.welcome.set(Arc::new(welcome));
        lock(&self.state).count_home(&mut server, shard);
        Ok(server)
    }

    /// One warn line per failed server login: unreachable, refused, timed out.
    fn connect_failed(&self, error: PoolerError) -> PoolerError {
        let sqlstate = error.client_report().map(|(code, _)| code).unwrap_or_default();
        tracing::warn!(
            database = %self.key.database,
            user = %self.key.user,
            server = %self.target.address,
            %sqlstate,
            %error,
            "server connect failed"
        );
        error
    }

    /// Returns a server after use. Broken or expired servers, and servers with session state
    /// nobody reset (a dirty server the kernel handed back), are closed instead.
    pub fn release(&self, mut server: Box<ServerConn>) {
        let now = Instant::now();
        let in_flight = !server.buffer.is_empty() || !server.plan.is_empty();
        if server.broken || in_flight || server.session_dirty || self.successor.get().is_some() {
            return; // Dropping the server closes it.
        }
        server.idle_since = now;
        let mut state = lock(&self.state);
        if state.retired(&server, now) {
            drop(state);
            return;
        }
        let clients = |shard| self.stats.clients_on(shard);
        let next = match state.paused {
            true => None,
            // A server the kernel holds free is not handed to clients waiting here: no idling.
            false if self.kernel.get().is_some() => state.pop_oldest(),
            false => state.next_waiter(server.home, now, clients),
        };
        self.sync_kernel_waiters(&state);
        match next {
            Some((shard, queued)) => {
                state.count_home(&mut server, shard);
                queued.waiter.give(Grant::Server(server));
            }
            None => self.park(&mut state, server),
        }
    }

    fn lease(&self) -> Lease {
        let owner: Weak<dyn SlotOwner> = self.myself.clone();
        Lease::new(owner, self.shared_limits.clone())
    }

    /// Closes idle servers past `server_idle_timeout` or `server_lifetime` (keeping `min_size`)
    /// and returns how many servers should be opened to reach `min_size`.
    pub fn maintain(&self, now: Instant) -> u32 {
        let mut closing = Vec::new();
        let mut reasons = Vec::new();
        let replaced = self.successor.get().is_some();
        let mut state = lock(&self.state);
        let limits = state.limits;
        let mut index = 0;
        while index < state.idle.len() {
            match state.idle_close_reason(&state.idle[index], now, replaced, closing.len() as u32) {
                Some(reason) => {
                    let server = state.idle.remove(index);
                    reasons.push((server.key.process_id, reason));
                    closing.push(server);
                }
                None => index += 1,
            }
        }
        if let Some(kernel) = self.kernel.get() {
            let expired = kernel.reclaim_free_where(now, |server| {
                let reason = state.idle_close_reason(server, now, replaced, reasons.len() as u32);
                reasons.extend(reason.map(|reason| (server.key.process_id, reason)));
                reason.is_some()
            });
            closing.extend(expired);
            kernel.tick();
            let hung_up = kernel.reap_hung_up();
            reasons.extend(hung_up.iter().map(|server| (server.key.process_id, "closed by the server while lent")));
            closing.extend(hung_up);
        }
        let missing = limits.min_size.saturating_sub(state.open - closing.len() as u32);
        drop(state);
        drop(closing);
        if limits.log_disconnections {
            for (backend_pid, reason) in reasons {
                self.log_server_closed(backend_pid, reason);
            }
        }
        missing
    }

    /// One info line per server the pooler closes (with `log_disconnections`).
    fn log_server_closed(&self, backend_pid: i32, reason: &str) {
        tracing::info!(
            database = %self.key.database,
            user = %self.key.user,
            server = %self.target.address,
            backend_pid,
            %reason,
            "closing server"
        );
    }

    /// Opens one server on `shard` toward `min_size` and parks it idle.
    pub async fn prefill_one(&self, shard: usize) -> Result<(), PoolerError> {
        let counted = {
            let mut state = lock(&self.state);
            let room = !state.paused && state.open < state.limits.min_size && self.shared_limits.try_take();
            if room {
                state.open += 1;
            }
            room
        };
        if counted {
            let server = self.connect(shard).await?;
            self.release(server);
        }
        Ok(())
    }

    /// True when `identity` (from a reloaded configuration) describes this pool's servers.
    pub fn is(&self, identity: &PoolIdentity) -> bool {
        let credential = self.credential.read().unwrap_or_else(|p| p.into_inner());
        self.key == identity.key
            && self.target.same_backend(&identity.target)
            && self.settings == identity.settings
            && credential.same_source(&identity.credential)
    }

    /// The pool that replaced this one in a reload, if any.
    pub fn successor(&self) -> Option<&Arc<Pool>> {
        self.successor.get()
    }

    /// Hands this pool's clients to `successor`: waiters are told to move, idle servers close,
    /// servers in use close when they come back.
    pub fn replace_with(&self, successor: Arc<Pool>) {
        if self.successor.set(successor).is_err() {
            return;
        }
        let (waiters, idle) = {
            let mut state = lock(&self.state);
            let waiters: Vec<Queued> = state.waiters.iter_mut().flat_map(|queue| queue.drain(..)).collect();
            (waiters, std::mem::take(&mut state.idle))
        };
        for queued in waiters {
            queued.waiter.give(Grant::Moved);
        }
        drop(idle);
    }

    pub fn limits(&self) -> PoolLimits {
        lock(&self.state).limits
    }

    /// Applies new sizes and timeouts: a larger pool serves its waiters at once, a smaller one
    /// closes servers as they come back.
    pub fn set_limits(&self, limits: PoolLimits) {
        let excess = {
            let mut state = lock(&self.state);
            state.limits = limits;
            let excess = (state.open as usize).saturating_sub(limits.size as usize).min(state.idle.len());
            state.idle.drain(..excess).collect::<Vec<_>>()
        };
        drop(excess);
        self.serve_waiters();
    }

    /// PAUSE (true) or RESUME (false).
    pub fn set_paused(&self, paused: bool) {
        let mut state = lock(&self.state);
        state.paused = paused;
        self.sync_kernel_waiters(&state);
        if paused {
            self.reclaim_all(&mut state);
        }
        drop(state);
        if !paused {
            self.serve_waiters();
        }
    }

    pub fn is_paused(&self) -> bool {
        lock(&self.state).paused
    }

    /// RECONNECT: every server open now is closed once idle; new ones replace them on demand.
    pub fn reconnect(&self) {
        let idle = {
            let mut state = lock(&self.state);
            state.retire_before = Some(Instant::now());
            state.retiring = state.open;
            std::mem::take(&mut state.idle)
        };
        drop(idle);
    }

    /// Hands idle servers and free slots to waiters, oldest first (after RESUME, a larger pool
    /// size, or a server left idle on a quiet shard).
    fn serve_waiters(&self) {
        let mut state = lock(&self.state);
        while state.waiting() > 0 && !state.paused {
            let reclaimed = || self.kernel.get().and_then(|kernel| kernel.reclaim());
            let Some(mut server) = state.idle.pop().or_else(reclaimed) else { break };
            let (shard, queued) = state.pop_oldest().expect("checked non-empty");
            state.count_home(&mut server, shard);
            queued.waiter.give(Grant::Server(server));
        }
        self.sync_kernel_waiters(&state);
        drop(state);
        while self.offer_slot() {}
    }

    /// Servers in use by clients now (open minus idle; includes servers logging in).
    pub fn active_servers(&self) -> u32 {
        let (open, idle, _) = self.counts();
        open - idle
    }

    /// (open servers, idle servers, queued clients); idle includes servers the kernel holds free.
    pub fn counts(&self) -> (u32, u32, u32) {
        let kernel_free = self.kernel.get().map_or(0, |kernel| kernel.free_servers().len() as u32);
        let state = lock(&self.state);
        (state.open, state.idle.len() as u32 + kernel_free, state.waiting() as u32)
    }

    /// How long the longest-waiting client has waited.
    pub fn longest_wait(&self, now: Instant) -> Duration {
        let state = lock(&self.state);
        let oldest = state.oldest_shard().and_then(|shard| state.waiters[shard].front().map(|queued| queued.since));
        oldest.map(|since| now.saturating_duration_since(since)).unwrap_or_default()
    }

    /// Transactions this pool finished, in user space and in the kernel.
    pub fn transactions(&self) -> u64 {
        self.stats.transactions() + self.kernel_transactions()
    }

    /// The pool's statistics; a transaction the kernel released counts as one transaction and
    /// one query (the kernel counts transactions only), and the bytes it forwarded count as
    /// received and sent (bytes it passed up are counted by the user-space path that relays them).
    pub fn totals(&self) -> crate::stats::PoolTotals {
        let mut totals = self.stats.totals();
        if let Some(kernel) = self.kernel.get() {
            let counters = kernel.counters();
            totals.transactions += counters.transactions;
            totals.queries += counters.transactions;
            totals.bytes_received += counters.request_bytes_forwarded;
            totals.bytes_sent += counters.answer_bytes_forwarded;
            totals.kernel = Some(counters);
        }
        totals
    }

    /// Every idle server (those the kernel holds free included).
    pub fn idle_servers(&self) -> Vec<IdleServer> {
        let mut idle: Vec<(i32, Instant)> = self.kernel.get().map(|kernel| kernel.free_servers()).unwrap_or_default();
        let state = lock(&self.state);
        idle.extend(state.idle.iter().map(|server| (server.key.process_id, server.created_at)));
        let (now, wall) = (Instant::now(), std::time::SystemTime::now());
        idle.into_iter()
            .map(|(process_id, created_at)| IdleServer {
                process_id,
                opened_at: wall - now.saturating_duration_since(created_at),
                close_needed: state.retire_before.is_some_and(|before| created_at < before),
            })
            .collect()
    }

    /// Servers logging in now.
    pub fn logging_in(&self) -> u32 {
        self.logging_in.load(Ordering::Relaxed)
    }

    /// Servers RECONNECT marked that are still open (WAIT_CLOSE waits for 0).
    pub fn servers_to_close(&self) -> u32 {
        lock(&self.state).retiring
    }
}

/// The pool's side of its leases: a closed server's slot goes to a waiter, here or in a sibling
/// pool of the same database.
impl SlotOwner for Pool {
    fn slot_freed(&self, home: Option<usize>, opened_at: Instant) {
        let mut state = lock(&self.state);
        assert!(state.open > 0, "pool open count underflow");
        state.open -= 1;
        if state.retire_before.is_some_and(|before| opened_at < before) {
            state.retiring = state.retiring.saturating_sub(1);
        }
        if let Some(home) = home {
            state.homed[home] -= 1;
        }
        self.shared_limits.give_back();
        let room = !state.paused && state.open < state.limits.size && self.successor.get().is_none();
        if room && state.waiting() > 0 && self.shared_limits.try_take() {
            state.open += 1;
            let (_, queued) = state.pop_oldest().expect("checked non-empty");
            self.sync_kernel_waiters(&state);
            queued.waiter.give(Grant::Connect);
            return;
        }
        drop(state);
        for sibling in self.shared_limits.owners() {
            if sibling.offer_slot() {
                return;
            }
        }
    }

    fn offer_slot(&self) -> bool {
        let mut state = lock(&self.state);
        if state.paused || state.waiting() == 0 || state.open >= state.limits.size || !self.shared_limits.try_take() {
            return false;
        }
        state.open += 1;
        let (_, queued) = state.pop_oldest().expect("checked non-empty");
        queued.waiter.give(Grant::Connect);
        true
    }

    fn close_one_idle(&self) -> bool {
        let reclaimed = || self.kernel.get().and_then(|kernel| kernel.reclaim());
        let victim = lock(&self.state).idle.pop().or_else(reclaimed);
        victim.is_some()
    }
}

impl Pool {
    /// Closes one idle server of another pool of this database so a slot frees up for us.
    fn evict_sibling_idle(&self) {
        for sibling in self.shared_limits.owners() {
            let sibling_address = Arc::as_ptr(&sibling) as *const ();
            if std::ptr::eq(sibling_address, (self as *const Pool).cast()) {
                continue;
            }
            if sibling.close_one_idle() {
                return;
            }
        }
    }
}

/// An idle server, for the console.
#[derive(Debug, Clone, Copy)]
pub struct IdleServer {
    pub process_id: i32,
    pub opened_at: std::time::SystemTime,
    /// RECONNECT marked it: it closes instead of serving again.
    pub close_needed: bool,
}

/// Counts a server login in progress until dropped (the login may end in an error or a
/// timeout).
struct LoginCount<'a>(&'a AtomicU32);

impl Drop for LoginCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Acquires from `pool` or, when a reload replaced it, from its successor; `pool` is updated to
/// the pool the server belongs to.
pub async fn acquire_current(
    pool: &mut Arc<Pool>,
    shard: usize,
    waiter: &Arc<Waiter>,
) -> Result<Box<ServerConn>, PoolerError> {
    loop {
        while let Some(next) = pool.successor() {
            *pool = next.clone();
        }
        if let Some(server) = pool.acquire(shard, waiter).await? {
            return Ok(server);
        }
    }
}

/// A granted server, moved to `shard`'s reactor if needed, if it is still usable.
fn usable(server: Box<ServerConn>, shard: usize) -> Option<Box<ServerConn>> {
    let mut server = match server.rehome(shard) {
        Ok(server) => server,
        Err(error) => {
            tracing::debug!(%error, "could not move a server between shards; closing it");
            return None;
        }
    };
    // Closed or spoke while idle: drop it, its lease frees the slot.
    server.is_clean().then_some(server)
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
        match self.pool.leave_queue(self.waiter) {
            Some(Grant::Server(server)) => self.pool.release(server),
            Some(Grant::Connect) => drop(self.pool.lease()),
            Some(Grant::Expired | Grant::Moved) | None => {}
        }
    }
}

/// True when this pool could open a server but its database is full.
fn state_needs_eviction(pool: &Pool) -> bool {
    if !pool.shared_limits.bounded() {
        return false;
    }
    let state = lock(&pool.state);
    state.open < state.limits.size
}
