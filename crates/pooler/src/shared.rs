//! State every session shares: the configuration in force (swapped whole by a reload), pools by
//! (database, user), cancel keys, and the stop request the admin console can raise.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bypass_wire::SqlState;
use tokio::sync::watch;

use crate::auth_file::{AuthFile, Secret};
use crate::cancel::CancelRegistry;
use crate::config::{Applies, Config, DatabaseEntry, PoolerSettings, UserEntry};
use crate::error::PoolerError;
use crate::load::{ConfigError, ValidConfig};
use crate::pool::{ConnectionLimit, Pool, PoolIdentity, PoolKey, PoolLimits, PoolSettings, SharedLimits};
use crate::prepared::StatementRegistry;
use crate::server::{send_cancel, Credential, LoginTarget};
use crate::stats::ErrorCounters;

/// Settings a running pooler cannot change: they take effect after a restart.
fn restart_only_changes(old: &PoolerSettings, new: &PoolerSettings) -> Vec<String> {
    let changes = old.changes(new).into_iter();
    changes.filter(|(_, applies)| *applies == Applies::Restart).map(|(name, _)| name.to_owned()).collect()
}

/// Bound on pools; each is a (database, user) pair that authenticated (pools are created only
/// after a client proved its identity, so strangers cannot fill the table).
const POOLS_MAX: usize = 10_000;

/// The configuration in force. A reload replaces it whole; sessions read it at login.
#[derive(Debug)]
pub struct Live {
    pub settings: PoolerSettings,
    pub databases: BTreeMap<String, DatabaseEntry>,
    pub auth: AuthFile,
    /// Client access rules from `auth_hba_file`.
    pub hba: Option<crate::hba::Hba>,
    /// Per-user settings (`[users]`).
    pub users: BTreeMap<String, UserEntry>,
}

impl Live {
    fn new(config: Config, auth: AuthFile, hba: Option<crate::hba::Hba>) -> Live {
        Live { settings: config.pooler, databases: config.databases, auth, hba, users: config.users }
    }
}

/// How the process should stop, when asked by the admin console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopRequest {
    /// Close everything now (SIGINT, `SHUTDOWN`).
    Immediate,
    /// Stop taking clients and wait for running transactions (SIGTERM, `SHUTDOWN WAIT_FOR_SERVERS`).
    Graceful,
}

/// What a reload did.
#[derive(Debug, Default)]
pub struct ReloadReport {
    /// Pools whose backend, credential or mode changed: their clients move to a new pool.
    pub replaced_pools: usize,
    /// Pools whose database left the configuration: their clients stay until they leave.
    pub dropped_pools: usize,
    /// Settings that only take effect after a restart.
    pub needs_restart: Vec<String>,
}

pub struct Shared {
    live: RwLock<Arc<Live>>,
    /// The file `RELOAD` and SIGHUP read, if the configuration came from one.
    pub config_path: Mutex<Option<PathBuf>>,
    pub cancel: Arc<CancelRegistry>,
    /// Connected client sockets, against `max_client_conn`.
    pub client_connections: AtomicU32,
    /// Sessions that ended in an error, by kind (for `/metrics`).
    pub errors: ErrorCounters,
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    /// `max_db_connections` by database and `max_user_connections` by user.
    database_limits: Mutex<HashMap<String, Arc<ConnectionLimit>>>,
    user_limits: Mutex<HashMap<String, Arc<ConnectionLimit>>>,
    /// Pools a reload replaced, while they still hold servers (for WAIT_CLOSE).
    replaced: Mutex<Vec<std::sync::Weak<Pool>>>,
    /// SUSPEND: no new client is accepted until RESUME.
    suspended: watch::Sender<bool>,
    /// DISABLE: databases that refuse new logins.
    disabled: Mutex<std::collections::BTreeSet<String>>,
    /// STATS averages of the last `stats_period_ms`, by database.
    averages: Mutex<BTreeMap<String, crate::stats::Averages>>,
    stop: watch::Sender<Option<StopRequest>>,
    /// TLS of both sides (`None` where disabled); read at start only.
    pub tls: crate::tls::TlsContexts,
    /// Secrets recently found with `auth_query`.
    pub auth_cache: crate::auth_cache::AuthCache,
    /// The kernel fast path when `fast_path = "kernel"` and the programs loaded.
    pub fastpath: Option<Arc<bypass_fastpath::FastPath>>,
    /// Pools running in the kernel, by kernel index (for the handoff ring).
    pub kernel_pools: Arc<crate::pool::KernelPools>,
    /// Workload mirroring: whether the kernel mirrors, and the counters.
    pub mirror: crate::mirror::MirrorState,
    /// Failed-login accounting: the log line, `auth_failure_delay_ms`, the per-address bound.
    pub guard: bypass_frontdoor::LoginGuard,
    /// The key of mock exchanges with unknown users and of plaintext salts, kept across
    /// restarts in `mock_key_file` (see [`mock_key`]).
    pub mock: bypass_frontdoor::MockKey,
    /// Databases served by the `*` entry whose pools are all unused, since when.
    autodb_unused_since: Mutex<HashMap<String, std::time::Instant>>,
}

/// A point-in-time summary for the status line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub clients: u32,
    pub waiting: u32,
    pub servers_open: u32,
    pub servers_idle: u32,
    pub transactions: u64,
    pub server_moves: u64,
    pub pools: u32,
}

/// The mock key from `mock_key_file` (a configuration file's loader always sets it), else from
/// beside the auth file; a configuration built in code with neither gets a key for this process.
fn mock_key(settings: &PoolerSettings) -> bypass_frontdoor::MockKey {
    let auth_file = settings.auth_file.as_deref();
    let key_file = settings.mock_key_file.clone().or_else(|| auth_file.map(bypass_frontdoor::mock::mock_key_path));
    let Some(key_file) = key_file else { return bypass_frontdoor::MockKey::random() };
    bypass_frontdoor::mock_key_in(&key_file, auth_file).unwrap_or_else(|error| {
        tracing::warn!(path = %key_file.display(), %error, "mock key not kept; a key for this process only (set pooler.mock_key_file)");
        bypass_frontdoor::MockKey::random()
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn new(config: ValidConfig) -> Arc<Self> {
        let ValidConfig { config: parsed, auth, tls, hba, .. } = config;
        let live = Live::new(parsed, auth, hba);
        let live_settings = live.settings.clone();
        let fastpath =
            (live.settings.fast_path == crate::config::FastPathMode::Kernel).then(crate::kernel::load).flatten();
        if let Some(fast) = &fastpath {
            fast.set_queue_behind(live.settings.fast_path_queue_behind);
        }
        Arc::new(Shared {
            fastpath,
            kernel_pools: Arc::default(),
            mirror: crate::mirror::MirrorState::default(),
            live: RwLock::new(Arc::new(live)),
            config_path: Mutex::new(None),
            cancel: Arc::new(CancelRegistry::default()),
            client_connections: AtomicU32::new(0),
            errors: ErrorCounters::default(),
            pools: Mutex::new(HashMap::new()),
            database_limits: Mutex::new(HashMap::new()),
            user_limits: Mutex::new(HashMap::new()),
            replaced: Mutex::new(Vec::new()),
            suspended: watch::channel(false).0,
            disabled: Mutex::new(Default::default()),
            averages: Mutex::new(BTreeMap::new()),
            stop: watch::channel(None).0,
            tls,
            auth_cache: crate::auth_cache::AuthCache::default(),
            guard: bypass_frontdoor::LoginGuard::new(guard_settings(&live_settings)),
            mock: mock_key(&live_settings),
            autodb_unused_since: Mutex::default(),
        })
    }

    /// The configuration in force.
    pub fn live(&self) -> Arc<Live> {
        self.live.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Where the pool of a client's (database, user) would log in, without creating it (the
    /// `auth_query` lookup runs there before the client has proven anything); `None` when no
    /// `[databases]` entry, `*` included, serves the database.
    pub fn login_target(&self, database: &str, user: &str) -> Option<Result<LoginTarget, PoolerError>> {
        let live = self.live();
        let entry = live.databases.get(database).or_else(|| live.databases.get("*"))?;
        let key = PoolKey { database: database.to_owned(), user: user.to_owned(), options: None };
        Some(identity(&live, &self.tls, key, entry).map(|identity| identity.target))
    }

    /// Removes a pool whose first login failed (its server refused the user, or was down) when
    /// nothing else uses it: a pool exists for working (database, user) pairs only.
    pub fn forget_unused_pool(&self, pool: &Arc<Pool>) {
        let mut pools = lock(&self.pools);
        let unused = pool_unused(pool);
        if unused && pools.get(&pool.key).is_some_and(|current| Arc::ptr_eq(current, pool)) {
            pools.remove(&pool.key);
            self.forget_limits_unused(&pools, &pool.key.database, Some(&pool.key.user));
        }
    }

    /// Drops the connection limits of a database (and a user) no pool serves any more.
    fn forget_limits_unused(&self, pools: &HashMap<PoolKey, Arc<Pool>>, database: &str, user: Option<&str>) {
        if !pools.keys().any(|key| key.database == database) {
            lock(&self.database_limits).remove(database);
        }
        if let Some(user) = user.filter(|user| !pools.keys().any(|key| key.user == *user)) {
            lock(&self.user_limits).remove(user);
        }
    }

    /// Drops the pools of databases served by `*` (not listed in `[databases]`) once all of them
    /// have been unused for `autodb_idle_timeout_ms` (PgBouncer's `autodb_idle_timeout`); runs
    /// once a second. Returns how many pools were dropped.
    pub fn sweep_autodb(&self, now: std::time::Instant) -> usize {
        let live = self.live();
        let timeout = std::time::Duration::from_millis(live.settings.autodb_idle_timeout_ms);
        let mut unused_by_database: HashMap<String, bool> = HashMap::new();
        for pool in self.pools() {
            if !live.databases.contains_key(&pool.key.database) {
                *unused_by_database.entry(pool.key.database.clone()).or_insert(true) &= pool_unused(&pool);
            }
        }
        let mut since = lock(&self.autodb_unused_since);
        since.retain(|database, _| unused_by_database.get(database) == Some(&true));
        let mut expired = Vec::new();
        for (database, unused) in unused_by_database {
            if !unused {
                continue;
            }
            let first_seen = *since.entry(database.clone()).or_insert(now);
            if !timeout.is_zero() && now.duration_since(first_seen) >= timeout {
                expired.push(database);
            }
        }
        let mut dropped = 0;
        for database in expired {
            since.remove(&database);
            let mut pools = lock(&self.pools);
            let before = pools.len();
            let mut users = Vec::new();
            pools.retain(|key, pool| {
                let drop = key.database == database && pool_unused(pool);
                if drop {
                    users.push(key.user.clone());
                }
                !drop
            });
            dropped += before - pools.len();
            self.forget_limits_unused(&pools, &database, None);
            for user in users {
                self.forget_limits_unused(&pools, &database, Some(&user));
            }
            tracing::info!(%database, "auto-created database dropped after autodb_idle_timeout_ms");
        }
        dropped
    }

    /// The pool for a client's (database, user), created on first use. Call only after the
    /// client authenticated.
    pub fn pool_for(&self, database: &str, user: &str) -> Result<Arc<Pool>, PoolerError> {
        self.pool_with_options(database, user, None)
    }

    /// The pool for a client's (database, user) whose servers start with `options` (the
    /// client's `options` startup parameter, with `pass_options`), created on first use.
    pub fn pool_with_options(
        &self,
        database: &str,
        user: &str,
        options: Option<&str>,
    ) -> Result<Arc<Pool>, PoolerError> {
        let live = self.live();
        let key = PoolKey { database: database.to_owned(), user: user.to_owned(), options: options.map(str::to_owned) };
        if let Some(pool) = lock(&self.pools).get(&key) {
            return Ok(pool.clone());
        }
        let entry = live.databases.get(database).or_else(|| live.databases.get("*")).ok_or_else(|| {
            PoolerError::refused(SqlState::INVALID_CATALOG_NAME, format!("no such database: {database}"))
        })?;
        let identity = identity(&live, &self.tls, key.clone(), entry)?;
        let shared_limits = self.shared_limits(&live, database, user, entry);
        let mut pools = lock(&self.pools);
        if pools.len() >= POOLS_MAX {
            return Err(PoolerError::refused(SqlState::TOO_MANY_CONNECTIONS, "too many pools"));
        }
        let limits = pool_limits(&live, entry, user);
        let pool = pools.entry(key).or_insert_with(|| {
            let pool = Pool::new(identity, limits, shared_limits, Arc::new(StatementRegistry::default()));
            self.run_in_kernel(&pool);
            pool
        });
        Ok(pool.clone())
    }

    /// Where a client of `database` logging in as `user` is mirrored: the `mirror` entry's
    /// backend and credential (`None` when the database has no mirror). Built per login, as a
    /// pool identity is, so a reload applies to the next login.
    pub fn mirror_target(&self, database: &str, user: &str) -> Option<Result<(LoginTarget, Credential), PoolerError>> {
        let live = self.live();
        let entry = live.databases.get(database).or_else(|| live.databases.get("*"))?;
        let mirror = entry.mirror.as_deref()?;
        let Some(mirror_entry) = live.databases.get(mirror) else {
            return Some(Err(PoolerError::refused(
                SqlState::INVALID_CATALOG_NAME,
                format!("no such database: {mirror}"),
            )));
        };
        let key = PoolKey { database: mirror.to_owned(), user: user.to_owned(), options: None };
        Some(identity(&live, &self.tls, key, mirror_entry).map(|identity| (identity.target, identity.credential)))
    }

    /// Lets a transaction-mode pool run in the kernel when the fast path is loaded.
    fn run_in_kernel(&self, pool: &Arc<Pool>) {
        let Some(fast) = &self.fastpath else { return };
        // TLS servers are refused one by one when lent (only plaintext sockets enter the maps).
        if pool.settings.mode != crate::config::PoolMode::Transaction {
            return;
        }
        let mut pools = lock(&self.kernel_pools);
        let Some(index) = fast.pool_index(&format!("{}/{}#{}", pool.key.database, pool.key.user, pools.len())) else {
            return tracing::warn!(database = %pool.key.database, "no kernel pool index left; this pool stays in user space");
        };
        let wanted = pools.len().max(index as usize + 1);
        pools.resize(wanted, std::sync::Weak::new());
        pools[index as usize] = Arc::downgrade(pool);
        pool.enable_kernel(crate::kernel::KernelPool::new(fast.clone(), index), self.kernel_pools.clone());
    }

    /// The database's and the user's connection limits, created on first use.
    fn shared_limits(&self, live: &Live, database: &str, user: &str, entry: &DatabaseEntry) -> SharedLimits {
        let database_max = entry.max_db_connections.unwrap_or(live.settings.max_db_connections);
        let user_max = user_connections_max(live, user);
        let mut database_limits = lock(&self.database_limits);
        let database = database_limits.entry(database.to_owned()).or_insert_with(|| ConnectionLimit::new(database_max));
        let mut user_limits = lock(&self.user_limits);
        let user = user_limits.entry(user.to_owned()).or_insert_with(|| ConnectionLimit::new(user_max));
        SharedLimits { database: database.clone(), user: user.clone() }
    }

    /// SUSPEND (true) or RESUME (false) accepting new clients.
    pub fn set_suspended(&self, suspended: bool) {
        self.suspended.send_replace(suspended);
    }

    pub fn is_suspended(&self) -> bool {
        *self.suspended.borrow()
    }

    /// Waits while the pooler is suspended.
    pub async fn accepting(&self) {
        let mut receiver = self.suspended.subscribe();
        let _ = receiver.wait_for(|suspended| !suspended).await;
    }

    /// DISABLE (true) or ENABLE (false) new logins to `database`.
    pub fn set_disabled(&self, database: &str, disabled: bool) {
        let mut set = lock(&self.disabled);
        match disabled {
            true => set.insert(database.to_owned()),
            false => set.remove(database),
        };
    }

    pub fn is_disabled(&self, database: &str) -> bool {
        lock(&self.disabled).contains(database)
    }

    /// Refuses a login to a database the console disabled.
    pub fn refuse_disabled(&self, database: &str) -> Result<(), PoolerError> {
        match self.is_disabled(database) {
            true => Err(PoolerError::refused(
                SqlState::CANNOT_CONNECT_NOW,
                format!("database \"{database}\" is disabled (the console's DISABLE; ENABLE lets clients in again)"),
            )),
            false => Ok(()),
        }
    }

    /// STATS averages of the last period, by database.
    pub fn averages(&self) -> BTreeMap<String, crate::stats::Averages> {
        lock(&self.averages).clone()
    }

    pub fn set_averages(&self, averages: BTreeMap<String, crate::stats::Averages>) {
        *lock(&self.averages) = averages;
    }

    /// Servers still open in pools a reload replaced (of `database`, or all).
    pub fn replaced_servers(&self, database: Option<&str>) -> u32 {
        let mut replaced = lock(&self.replaced);
        replaced.retain(|pool| pool.upgrade().is_some_and(|pool| pool.counts().0 > 0));
        let alive = replaced.iter().filter_map(std::sync::Weak::upgrade);
        alive.filter(|pool| database.is_none_or(|db| pool.key.database == db)).map(|pool| pool.counts().0).sum()
    }

    /// Reads the configuration file again and applies it (SIGHUP, `RELOAD`). A bad file changes
    /// nothing and its problems are returned, all of them.
    pub fn reload_from_file(&self) -> Result<ReloadReport, ConfigError> {
        let path = lock(&self.config_path)
            .clone()
            .ok_or_else(|| ConfigError::Invalid(vec!["the pooler was not started from a configuration file".into()]))?;
        Ok(self.reload(Config::load(&path)?))
    }

    /// Applies a new configuration without dropping clients: pools get their new sizes and
    /// timeouts at once, pools whose backend changed are replaced (clients move over at their
    /// next transaction), new databases and users work at the next login.
    pub fn reload(&self, config: ValidConfig) -> ReloadReport {
        let ValidConfig { config, auth, hba, .. } = config;
        let live = Arc::new(Live::new(config, auth, hba));
        let mut report = ReloadReport {
            needs_restart: restart_only_changes(&self.live().settings, &live.settings),
            ..ReloadReport::default()
        };
        *self.live.write().unwrap_or_else(|p| p.into_inner()) = live.clone();
        self.guard.set_settings(guard_settings(&live.settings));
        for (database, limit) in lock(&self.database_limits).iter() {
            if let Some(entry) = live.databases.get(database).or_else(|| live.databases.get("*")) {
                limit.set_max(entry.max_db_connections.unwrap_or(live.settings.max_db_connections));
            }
        }
        for (user, limit) in lock(&self.user_limits).iter() {
            limit.set_max(user_connections_max(&live, user));
        }
        let mut pools = lock(&self.pools);
        let keys: Vec<PoolKey> = pools.keys().cloned().collect();
        for key in keys {
            let entry = live.databases.get(&key.database).or_else(|| live.databases.get("*"));
            let identity = entry.map(|entry| identity(&live, &self.tls, key.clone(), entry));
            let (Some(entry), Some(Ok(identity))) = (entry, identity) else {
                pools.remove(&key);
                report.dropped_pools += 1;
                continue;
            };
            let pool = pools[&key].clone();
            let limits = pool_limits(&live, entry, &key.user);
            if pool.is(&identity) {
                pool.set_limits(limits);
            } else {
                let shared_limits = self.shared_limits(&live, &key.database, &key.user, entry);
                let successor = Pool::new(identity, limits, shared_limits, pool.statements.clone());
                lock(&self.replaced).push(Arc::downgrade(&pool));
                pool.replace_with(successor.clone());
                pools.insert(key, successor);
                report.replaced_pools += 1;
            }
        }
        report
    }

    /// Asks the process to stop (admin `SHUTDOWN`); [`Shared::stop_requested`] reports it.
    pub fn request_stop(&self, request: StopRequest) {
        self.stop.send_replace(Some(request));
    }

    /// Waits until a stop is requested.
    pub async fn stop_requested(&self) -> StopRequest {
        let mut receiver = self.stop.subscribe();
        loop {
            if let Some(request) = *receiver.borrow_and_update() {
                return request;
            }
            if receiver.changed().await.is_err() {
                return StopRequest::Immediate;
            }
        }
    }

    pub fn pools(&self) -> Vec<Arc<Pool>> {
        lock(&self.pools).values().cloned().collect()
    }

    /// Sends a client's cancel on to the server it is using, in the background.
    pub fn forward_cancel(&self, process_id: i32, secret: &[u8]) {
        let entry = self.cancel.entry_for(process_id, secret);
        let Some(route) = entry.and_then(|entry| entry.route().or_else(|| self.kernel_route(&entry))) else {
            tracing::debug!(process_id, "cancel request for an unknown key or an idle client ignored");
            return;
        };
        tokio::spawn(async move {
            if let Err(error) = send_cancel(route.address, route.key).await {
                tracing::warn!(%error, "could not forward a cancel request");
            }
        });
    }

    /// The server the kernel has linked to a fast-path client right now. The link can end the
    /// moment after it is read, as a user-space link can: the same race PostgreSQL's own
    /// cancel has (a cancel that arrives late hits whatever that server runs next is the
    /// documented risk of out-of-band cancellation).
    fn kernel_route(&self, entry: &crate::cancel::CancelEntry) -> Option<crate::cancel::CancelRoute> {
        let (fast, client) = (self.fastpath.as_ref()?, *entry.kernel_slot.get()?);
        let (server, _) = fast.link(client)?;
        // A client queued behind another's statement (`fast_path_queue_behind`) has not started:
        // the server runs the other client's statement, which its cancel must not hit.
        if fast.server(server).peer.load(Ordering::Acquire) != client.0 {
            return None;
        }
        let pool = lock(&self.kernel_pools).get(server.pool() as usize)?.upgrade()?;
        let key = pool.kernel()?.key_of(server)?;
        Some(crate::cancel::CancelRoute { address: pool.target.address, key })
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for pool in self.pools() {
            let (open, idle, waiting) = pool.counts();
            snapshot.clients += pool.stats.clients.load(Ordering::Relaxed);
            snapshot.waiting += waiting;
            snapshot.servers_open += open;
            snapshot.servers_idle += idle;
            snapshot.transactions += pool.transactions();
            snapshot.server_moves += pool.stats.server_moves.load(Ordering::Relaxed);
            snapshot.pools += 1;
        }
        snapshot
    }
}

/// No client, no waiter, no server in use: a pool that can go without anyone noticing.
fn pool_unused(pool: &Pool) -> bool {
    let (open, idle, waiting) = pool.counts();
    pool.stats.clients.load(Ordering::Relaxed) == 0 && waiting == 0 && open == idle
}

/// The front door's failed-login settings from the pooler's.
fn guard_settings(settings: &PoolerSettings) -> bypass_frontdoor::GuardSettings {
    bypass_frontdoor::GuardSettings {
        failure_delay: std::time::Duration::from_millis(settings.auth_failure_delay_ms),
        failures_per_address_max: settings.failed_logins_per_address_max,
        failure_window: std::time::Duration::from_millis(settings.failed_login_window_ms),
    }
}

/// What a pool for `key` under `entry` is: backend address, database, user, credential, mode.
fn identity(
    live: &Live,
    tls: &crate::tls::TlsContexts,
    key: PoolKey,
    entry: &DatabaseEntry,
) -> Result<PoolIdentity, PoolerError> {
    let address = resolve(&entry.host, entry.port).ok_or_else(|| PoolerError::ServerConnect {
        address: format!("{}:{}", entry.host, entry.port),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "host name does not resolve"),
    })?;
    let target = LoginTarget {
        address,
        dbname: entry.backend_dbname(&key.database).to_owned(),
        user: entry.user.clone().unwrap_or_else(|| key.user.clone()),
        host: entry.host.clone(),
        tls: tls.server.clone(),
        options: key.options.clone(),
    };
    let credential = credential(&live.auth, entry, &target.user);
    let settings = pool_settings(live, entry, &key.user);
    Ok(PoolIdentity { key, target, settings, credential })
}

/// The backend password: the database entry's, else the backend user's entry in the auth file.
fn credential(auth: &AuthFile, entry: &DatabaseEntry, backend_user: &str) -> Credential {
    if let Some(password) = &entry.password {
        return match bypass_wire::md5::is_stored_hash(password) {
            true => Credential::Md5Hash(password.clone()),
            false => Credential::Password(password.clone()),
        };
    }
    match auth.get(backend_user) {
        Some(Secret::Plain { password, .. }) => Credential::Password(password.clone()),
        Some(Secret::Md5(hash)) => Credential::Md5Hash(hash.clone()),
        Some(Secret::Scram(_)) | None => Credential::None,
    }
}

/// A user's `max_user_connections`: its `[users]` entry's, else the global one.
fn user_connections_max(live: &Live, user: &str) -> u32 {
    let entry = live.users.get(user).and_then(|entry| entry.max_user_connections);
    entry.unwrap_or(live.settings.max_user_connections)
}

fn pool_settings(live: &Live, entry: &DatabaseEntry, user: &str) -> PoolSettings {
    let s = &live.settings;
    let user_mode = live.users.get(user).and_then(|user| user.pool_mode);
    PoolSettings {
        mode: user_mode.or(entry.pool_mode).unwrap_or(s.pool_mode),
        message_size_max: s.message_size_max,
        reset_query: s.server_reset_query.clone(),
        shards: s.worker_count(),
        max_prepared_statements: s.max_prepared_statements,
    }
}

/// Sizes and timeouts of a pool: the user's `pool_size`, else the database's, else the default.
fn pool_limits(live: &Live, entry: &DatabaseEntry, user: &str) -> PoolLimits {
    let s = &live.settings;
    let user_size = live.users.get(user).and_then(|user| user.pool_size);
    PoolLimits {
        size: user_size.or(entry.pool_size).unwrap_or(s.default_pool_size),
        min_size: entry.min_pool_size.unwrap_or(s.min_pool_size),
        query_wait_timeout_ms: s.query_wait_timeout_ms,
        server_idle_timeout_ms: s.server_idle_timeout_ms,
        server_lifetime_ms: s.server_lifetime_ms,
        server_connect_timeout_ms: s.server_connect_timeout_ms,
        log_disconnections: s.log_disconnections,
        reserve_size: entry.reserve_pool_size.unwrap_or(s.reserve_pool_size),
        reserve_timeout_ms: s.reserve_pool_timeout_ms,
    }
}

fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    (host, port).to_socket_addrs().ok()?.next()
}
