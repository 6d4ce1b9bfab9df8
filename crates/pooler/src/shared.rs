//! State every session shares: settings, the user list, pools by (database, user), cancel keys.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bypass_wire::SqlState;

use crate::auth_file::{AuthFile, Secret};
use crate::cancel::CancelRegistry;
use crate::config::{DatabaseEntry, PoolerSettings, ValidConfig};
use crate::error::PoolerError;
use crate::pool::{DatabaseLimit, Pool, PoolKey, PoolSettings};
use crate::server::{send_cancel, Credential, LoginTarget};

/// Bound on pools; each is a (database, user) pair that logged in successfully or is trying to.
const POOLS_MAX: usize = 10_000;

pub struct Shared {
    pub settings: PoolerSettings,
    pub databases: BTreeMap<String, DatabaseEntry>,
    pub auth: AuthFile,
    pub cancel: Arc<CancelRegistry>,
    /// Connected client sockets, against `max_client_conn`.
    pub client_connections: AtomicU32,
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    limits: Mutex<HashMap<String, Arc<DatabaseLimit>>>,
    /// TLS of both sides (`None` where disabled).
    pub tls: crate::tls::TlsContexts,
    /// Client access rules from `auth_hba_file`.
    pub hba: Option<crate::hba::Hba>,
    /// Secrets recently found with `auth_query`.
    pub auth_cache: crate::auth_query::AuthCache,
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

impl Shared {
    pub fn new(config: ValidConfig) -> Arc<Self> {
        Arc::new(Shared {
            settings: config.config.pooler,
            databases: config.config.databases,
            auth: config.auth,
            cancel: Arc::new(CancelRegistry::default()),
            client_connections: AtomicU32::new(0),
            pools: Mutex::new(HashMap::new()),
            limits: Mutex::new(HashMap::new()),
            tls: config.tls,
            hba: config.hba,
            auth_cache: crate::auth_query::AuthCache::default(),
        })
    }

    /// The pool for a client's (database, user), created on first use.
    pub fn pool_for(&self, database: &str, user: &str) -> Result<Arc<Pool>, PoolerError> {
        let key = PoolKey { database: database.to_owned(), user: user.to_owned() };
        if let Some(pool) = self.pools.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(pool.clone());
        }
        let entry = self.databases.get(database).or_else(|| self.databases.get("*")).ok_or_else(|| {
            PoolerError::refused(SqlState::INVALID_CATALOG_NAME, format!("no such database: {database}"))
        })?;
        let target = self.login_target(database, user, entry)?;
        let credential = self.credential(entry, &target.user);
        let limit = self.database_limit(database, entry);
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if pools.len() >= POOLS_MAX {
            return Err(PoolerError::refused(SqlState::TOO_MANY_CONNECTIONS, "too many pools"));
        }
        let settings = self.pool_settings(entry);
        let pool = pools.entry(key.clone()).or_insert_with(|| Pool::new(key, target, settings, credential, limit));
        Ok(pool.clone())
    }

    fn login_target(&self, database: &str, user: &str, entry: &DatabaseEntry) -> Result<LoginTarget, PoolerError> {
        let address = resolve(&entry.host, entry.port).ok_or_else(|| PoolerError::ServerConnect {
            address: format!("{}:{}", entry.host, entry.port),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "host name does not resolve"),
        })?;
        Ok(LoginTarget {
            address,
            dbname: entry.backend_dbname(database).to_owned(),
            user: entry.user.clone().unwrap_or_else(|| user.to_owned()),
            host: entry.host.clone(),
            tls: self.tls.server.clone(),
        })
    }

    /// The backend password: the database entry's, else the backend user's entry in the auth file.
    fn credential(&self, entry: &DatabaseEntry, backend_user: &str) -> Credential {
        if let Some(password) = &entry.password {
            return match bypass_wire::md5::is_stored_hash(password) {
                true => Credential::Md5Hash(password.clone()),
                false => Credential::Password(password.clone()),
            };
        }
        match self.auth.get(backend_user) {
            Some(Secret::Plain { password, .. }) => Credential::Password(password.clone()),
            Some(Secret::Md5(hash)) => Credential::Md5Hash(hash.clone()),
            Some(Secret::Scram(_)) | None => Credential::None,
        }
    }

    fn database_limit(&self, database: &str, entry: &DatabaseEntry) -> Arc<DatabaseLimit> {
        let max = entry.max_db_connections.unwrap_or(self.settings.max_db_connections);
        let mut limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        limits.entry(database.to_owned()).or_insert_with(|| DatabaseLimit::new(max)).clone()
    }

    fn pool_settings(&self, entry: &DatabaseEntry) -> PoolSettings {
        let s = &self.settings;
        PoolSettings {
            mode: entry.pool_mode.unwrap_or(s.pool_mode),
            size: entry.pool_size.unwrap_or(s.default_pool_size),
            min_size: entry.min_pool_size.unwrap_or(s.min_pool_size),
            query_wait_timeout_ms: s.query_wait_timeout_ms,
            server_idle_timeout_ms: s.server_idle_timeout_ms,
            server_lifetime_ms: s.server_lifetime_ms,
            server_connect_timeout_ms: s.server_connect_timeout_ms,
            message_size_max: s.message_size_max,
            reset_query: s.server_reset_query.clone(),
            shards: s.worker_count(),
            max_prepared_statements: s.max_prepared_statements,
        }
    }

    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Sends a client's cancel on to the server it is using, in the background.
    pub fn forward_cancel(&self, process_id: i32, secret: &[u8]) {
        let Some(route) = self.cancel.route_for(process_id, secret) else {
            tracing::debug!(process_id, "cancel request for an unknown key or an idle client ignored");
            return;
        };
        tokio::spawn(async move {
            if let Err(error) = send_cancel(route.address, route.key).await {
                tracing::warn!(%error, "could not forward a cancel request");
            }
        });
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for pool in self.pools() {
            let (open, idle, waiting) = pool.counts();
            snapshot.clients += pool.stats.clients.load(Ordering::Relaxed);
            snapshot.waiting += waiting;
            snapshot.servers_open += open;
            snapshot.servers_idle += idle;
            snapshot.transactions += pool.stats.transactions();
            snapshot.server_moves += pool.stats.server_moves.load(Ordering::Relaxed);
            snapshot.pools += 1;
        }
        snapshot
    }
}

fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    (host, port).to_socket_addrs().ok()?.next()
}
