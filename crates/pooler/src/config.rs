//! `bypass.toml`: the pooler's settings and its `[databases]` table, PgBouncer-style.
//!
//! Every field has a documented unit and default; unknown keys are errors; [`Config::validate`]
//! reports every problem at once.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::auth_file::AuthFile;

/// This file's text, for the generated reference ([`crate::config_doc`]).
pub const SOURCE: &str = include_str!("config.rs");

/// `[pooler]` settings read at start only: a reload reports them as needing a restart.
pub const RESTART_ONLY: [&str; 15] = [
    "listen_addr",
    "fast_path",
    "mirror_interface",
    "workers",
    "pin_workers",
    "listen_backlog",
    "metrics_addr",
    "client_tls_sslmode",
    "client_tls_cert_file",
    "client_tls_key_file",
    "client_tls_ca_file",
    "server_tls_sslmode",
    "server_tls_ca_file",
    "server_tls_cert_file",
    "server_tls_key_file",
];

/// When a server goes back to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// A server is held by one client from login to disconnect, then reset.
    Session,
    /// A server is held for one transaction (ReadyForQuery 'I' with nothing outstanding).
    Transaction,
}

/// How clients prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum AuthType {
    #[serde(rename = "trust")]
    Trust,
    /// MD5 challenge; users whose stored secret is a SCRAM verifier get SCRAM instead (as PgBouncer).
    #[serde(rename = "md5")]
    Md5,
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub pooler: PoolerSettings,
    /// Client-visible database name → backend. The name `*` matches any database not listed.
    #[serde(default)]
    pub databases: BTreeMap<String, DatabaseEntry>,
}

/// The `[pooler]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolerSettings {
    /// Address clients connect to. Default `127.0.0.1:6432`.
    pub listen_addr: String,
    /// `session` or `transaction`. Default `session` (as PgBouncer).
    pub pool_mode: PoolMode,
    /// `trust`, `md5` or `scram-sha-256`. Default `md5`.
    pub auth_type: AuthType,
    /// PgBouncer-format user list (`"user" "secret"` per line); required unless `auth_type = trust`.
    pub auth_file: Option<PathBuf>,
    /// Most client connections at once; more are refused with SQLSTATE 53300. Default 100.
    pub max_client_conn: u32,
    /// Servers per (database, user) pool. Default 20.
    pub default_pool_size: u32,
    /// Servers each pool keeps open even when idle. Default 0.
    pub min_pool_size: u32,
    /// Most servers per database across all its pools; 0 = unlimited. Default 0.
    pub max_db_connections: u32,
    /// How long a client waits for a server before it is disconnected, ms; 0 = forever. Default 120000.
    pub query_wait_timeout_ms: u64,
    /// Idle servers older than this are closed, ms; 0 = never. Default 600000.
    pub server_idle_timeout_ms: u64,
    /// Servers older than this are closed when released, ms; 0 = never. Default 3600000.
    pub server_lifetime_ms: u64,
    /// Bound on connecting and logging in to a server, ms. Default 15000.
    pub server_connect_timeout_ms: u64,
    /// Clients idle (no server) longer than this are disconnected, ms; 0 = never. Default 0.
    /// This and the other client timeouts apply to clients that log in after a reload.
    pub client_idle_timeout_ms: u64,
    /// Clients idle inside a transaction longer than this are disconnected, ms; 0 = never. Default 0.
    pub idle_transaction_timeout_ms: u64,
    /// Bound on a client's startup and authentication, ms. Default 60000.
    pub client_login_timeout_ms: u64,
    /// Run on a server before another client gets it in session mode. Default `DISCARD ALL`.
    pub server_reset_query: String,
    /// Largest message accepted from either side, bytes. Default 268435456 (256 MiB).
    pub message_size_max: u32,
    /// Prepared statements kept per server in transaction mode, where the pooler prepares a
    /// client's named statements on whichever server it lands on; least recently used ones are
    /// closed. 0 turns this off (named statements then only work within one transaction).
    /// Default 200 (as PgBouncer 1.24).
    pub max_prepared_statements: u32,
    /// Shards: threads with their own runtime and listener (`SO_REUSEPORT`); 0 = one per CPU.
    /// Default 0.
    pub workers: u32,
    /// Pins shard `i`'s thread to the `i`-th CPU the process may run on (wrapping around), when
    /// there are two or more shards. An unpinned shard is pulled onto the CPU of whichever
    /// backend woke it and drags the backends it wakes onto its own, so shards end up sharing a
    /// CPU while another idles. Default true.
    pub pin_workers: bool,
    /// `listen()` backlog. Default 4096.
    pub listen_backlog: u32,
    /// Users allowed on the admin console (database `bypass`, alias `pgbouncer`): every command.
    /// They authenticate like everyone else. Default none.
    pub admin_users: Vec<String>,
    /// Users allowed on the admin console for `SHOW` commands only. Default none.
    pub stats_users: Vec<String>,
    /// Address of the Prometheus endpoint (`GET /metrics`), e.g. `127.0.0.1:9127`; unset = off.
    /// Default unset.
    pub metrics_addr: Option<String>,
    /// How long SIGTERM and `SHUTDOWN WAIT_FOR_SERVERS` wait for running transactions before
    /// closing everything, ms. Default 30000.
    pub shutdown_timeout_ms: u64,
    /// What transaction mode does with statements that change session state (`SET` other than
    /// `SET LOCAL`, `SET ROLE`, `LISTEN`, SQL `PREPARE`, `DECLARE … WITH HOLD`, temporary tables,
    /// `LOAD`), which would otherwise
    /// stay on the server for the next client: `track` replays `SET`s of tracked parameters (those
    /// PostgreSQL 15 reports: client_encoding, DateStyle, IntervalStyle, TimeZone, application_name,
    /// standard_conforming_strings) on whichever server the client gets and warns about the rest
    /// (search_path included: PostgreSQL 15 does not report it); `warn` lets every such statement
    /// run with a WARNING; `error` refuses the untracked ones with SQLSTATE 0A000
    /// (in simple queries; through the extended protocol they get the WARNING). In every mode a
    /// server whose session state was changed is reset (`DISCARD ALL`) before another client gets
    /// it. Default `track`. With `fast_path = "kernel"`, `warn` and `error` keep clients in user
    /// space (only the relay reads every statement); under `track` the kernel sends statements
    /// that start with a state-changing keyword to the relay and closes, instead of reusing, a
    /// server on which it saw state change in a statement it forwarded (no warning then).
    pub session_state: SessionStatePolicy,
    /// TLS towards clients: `disable`, `allow`, `prefer`, `require`, `verify-ca` or `verify-full`
    /// (PgBouncer's meanings: `allow`/`prefer` use TLS when the client asks, `require` refuses
    /// plaintext clients with 28000, `verify-*` also require a client certificate signed by
    /// `client_tls_ca_file`). SSLRequest and PostgreSQL 17 direct TLS (ALPN `postgresql`) are
    /// both accepted. Default `disable`.
    pub client_tls_sslmode: crate::tls::ClientSslMode,
    /// PEM certificate chain the pooler presents to clients; required unless
    /// `client_tls_sslmode = "disable"`. Relative to the config file. Default none.
    pub client_tls_cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `client_tls_cert_file`. Default none.
    pub client_tls_key_file: Option<PathBuf>,
    /// PEM CA certificates client certificates are checked against; required for `verify-ca` and
    /// `verify-full`, optional below (a certificate a client sends is then checked, for the hba
    /// method `cert`). Default none.
    pub client_tls_ca_file: Option<PathBuf>,
    /// TLS towards PostgreSQL: `disable` (no SSLRequest), `prefer` (TLS when the server offers
    /// it, certificate not checked), `require` (TLS or fail, certificate not checked),
    /// `verify-ca` (chain checked against `server_tls_ca_file`), `verify-full` (chain and the
    /// database entry's `host` name). Default `prefer` (as PgBouncer).
    pub server_tls_sslmode: crate::tls::ServerSslMode,
    /// PEM CA certificates server certificates are checked against; required for `verify-ca`
    /// and `verify-full`. Default none.
    pub server_tls_ca_file: Option<PathBuf>,
    /// PEM certificate the pooler presents to servers that ask for one (PostgreSQL's `cert`
    /// method or `clientcert=`); set together with `server_tls_key_file`. Default none.
    pub server_tls_cert_file: Option<PathBuf>,
    /// PEM private key of `server_tls_cert_file`. Default none.
    pub server_tls_key_file: Option<PathBuf>,
    /// PgBouncer-style hba file (`host`, `hostssl`, `hostnossl` lines with database, user, CIDR
    /// and method `trust`, `reject`, `md5`, `scram-sha-256`, `password` or `cert`); when set it
    /// decides each client's method instead of `auth_type`, first matching line wins, no match
    /// is refused. Relative to the config file. Default none.
    pub auth_hba_file: Option<PathBuf>,
    /// User the pooler logs in to PostgreSQL as to look up clients missing from `auth_file`
    /// with `auth_query`; its own password comes from `auth_file` or the database entry.
    /// Default none (lookups off).
    pub auth_user: Option<String>,
    /// Query returning (user name, SCRAM verifier or MD5 hash) for `$1` = the client's user
    /// name, run as `auth_user` in the client's database. Default
    /// `SELECT usename, passwd FROM pg_shadow WHERE usename=$1` (as PgBouncer).
    pub auth_query: String,
    /// Where steady-state bytes of transaction-mode plaintext clients move: `user` (the pooler
    /// relays them) or `kernel` (eBPF `sk_skb` programs forward them between client and server
    /// sockets and return servers to the pool inside the kernel; user space keeps login, TLS,
    /// cancel, waiting clients and named prepared statements). When the programs cannot load (no
    /// CAP_BPF/CAP_NET_ADMIN, old kernel) the pooler logs one line and serves in user space.
    /// Default `user`.
    pub fast_path: FastPathMode,
    /// Network interface mirrored clients reach the pooler on, where the kernel copies their
    /// bytes for `mirror` (with `fast_path = "kernel"`): `lo` for local clients, else the
    /// Ethernet interface (which needs `net.ipv4.conf.<interface>.route_localnet = 1`). When the
    /// kernel cannot mirror there, clients are mirrored in user space. Default `lo`.
    pub mirror_interface: String,
    /// Bound on connecting and logging in to a client's shadow server (`mirror`), ms: a shadow
    /// slower than this is given up (the client is served unmirrored, `mirror_failures` counts
    /// it), so a dead shadow delays a login by at most this much. Default 1000.
    pub mirror_connect_timeout_ms: u64,
}

/// See [`PoolerSettings::fast_path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FastPathMode {
    User,
    Kernel,
}

/// See [`PoolerSettings::session_state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatePolicy {
    Track,
    Warn,
    Error,
}

impl Default for PoolerSettings {
    fn default() -> Self {
        PoolerSettings {
            listen_addr: "127.0.0.1:6432".into(),
            pool_mode: PoolMode::Session,
            auth_type: AuthType::Md5,
            auth_file: None,
            max_client_conn: 100,
            default_pool_size: 20,
            min_pool_size: 0,
            max_db_connections: 0,
            query_wait_timeout_ms: 120_000,
            server_idle_timeout_ms: 600_000,
            server_lifetime_ms: 3_600_000,
            server_connect_timeout_ms: 15_000,
            client_idle_timeout_ms: 0,
            idle_transaction_timeout_ms: 0,
            client_login_timeout_ms: 60_000,
            server_reset_query: "DISCARD ALL".into(),
            message_size_max: bypass_wire::DEFAULT_MESSAGE_SIZE_MAX,
            max_prepared_statements: 200,
            workers: 0,
            pin_workers: true,
            listen_backlog: 4096,
            admin_users: Vec::new(),
            stats_users: Vec::new(),
            metrics_addr: None,
            shutdown_timeout_ms: 30_000,
            session_state: SessionStatePolicy::Track,
            client_tls_sslmode: crate::tls::ClientSslMode::Disable,
            client_tls_cert_file: None,
            client_tls_key_file: None,
            client_tls_ca_file: None,
            server_tls_sslmode: crate::tls::ServerSslMode::Prefer,
            server_tls_ca_file: None,
            server_tls_cert_file: None,
            server_tls_key_file: None,
            auth_hba_file: None,
            auth_user: None,
            auth_query: "SELECT usename, passwd FROM pg_shadow WHERE usename=$1".into(),
            fast_path: FastPathMode::User,
            mirror_interface: "lo".into(),
            mirror_connect_timeout_ms: 1_000,
        }
    }
}

/// One `[databases.NAME]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseEntry {
    /// Backend host name or address. Default `127.0.0.1`.
    pub host: String,
    /// Backend port. Default 5432.
    pub port: u16,
    /// Backend database name; default: the client-visible name.
    pub dbname: Option<String>,
    /// Log in to the backend as this user instead of the client's user.
    pub user: Option<String>,
    /// Backend password for `user` (plaintext, `md5…` or a SCRAM verifier is not usable here).
    pub password: Option<String>,
    /// Overrides `default_pool_size`.
    pub pool_size: Option<u32>,
    /// Overrides `min_pool_size`.
    pub min_pool_size: Option<u32>,
    /// Overrides `pool_mode`.
    pub pool_mode: Option<PoolMode>,
    /// Overrides `max_db_connections`.
    pub max_db_connections: Option<u32>,
    /// Another `[databases]` entry that receives a copy of every byte this database's clients
    /// send (workload mirroring, as Tigger's "replication"): each client gets its own session on
    /// that entry's backend (same user), whose replies are discarded; the client's own answers
    /// never wait on it. The entry must exist, differ from this one, not be `*`, and not be
    /// mirrored itself. Default none.
    pub mirror: Option<String>,
}

impl Default for DatabaseEntry {
    fn default() -> Self {
        DatabaseEntry {
            host: "127.0.0.1".into(),
            port: 5432,
            dbname: None,
            user: None,
            password: None,
            pool_size: None,
            min_pool_size: None,
            pool_mode: None,
            max_db_connections: None,
            mirror: None,
        }
    }
}

/// Why a configuration could not be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
}

/// A configuration that passed validation, with its auth file loaded.
#[derive(Debug, Clone)]
pub struct ValidConfig {
    pub config: Config,
    pub listen_addr: SocketAddr,
    pub auth: AuthFile,
    /// Certificates and keys of both sides, loaded.
    pub tls: crate::tls::TlsContexts,
    /// The parsed `auth_hba_file`, if one is set.
    pub hba: Option<crate::hba::Hba>,
}

impl Config {
    /// Reads, parses and validates a TOML file; relative paths inside resolve against its folder.
    pub fn load(path: &Path) -> Result<ValidConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let mut config: Config = toml::from_str(&text)
            .map_err(|source| ConfigError::Parse { path: path.into(), source: Box::new(source) })?;
        if let (Some(auth_file), Some(folder)) = (&config.pooler.auth_file, path.parent()) {
            config.pooler.auth_file = Some(folder.join(auth_file));
        }
        if let Some(folder) = path.parent() {
            config.pooler.resolve_security_paths(folder);
        }
        config.validate()
    }

    /// Checks every setting and loads the auth file; lists all problems at once.
    pub fn validate(self) -> Result<ValidConfig, ConfigError> {
        let mut problems = Vec::new();
        let listen_addr = resolve(&self.pooler.listen_addr, "pooler.listen_addr", &mut problems);
        if let Some(metrics_addr) = &self.pooler.metrics_addr {
            resolve(metrics_addr, "pooler.metrics_addr", &mut problems);
        }
        self.pooler.check(&mut problems);
        if self.databases.is_empty() {
            problems.push("[databases] is empty: no client could connect anywhere".into());
        }
        for (name, entry) in &self.databases {
            entry.check(name, &self.pooler, &mut problems);
        }
        self.check_mirrors(&mut problems);
        let auth = self.load_auth_file(&mut problems);
        let tls = crate::tls::TlsContexts::load(&self.pooler, &mut problems);
        let hba = self.pooler.auth_hba_file.as_deref().and_then(|path| {
            crate::hba::Hba::load(path).map_err(|mut file_problems| problems.append(&mut file_problems)).ok()
        });
        match (problems.is_empty(), listen_addr) {
            (true, Some(listen_addr)) => Ok(ValidConfig { config: self, listen_addr, auth, tls, hba }),
            _ => Err(ConfigError::Invalid(problems)),
        }
    }

    /// A mirror names another plain entry: not itself, not `*`, not one that mirrors again (a
    /// chain or a cycle would copy a workload twice, or forever).
    fn check_mirrors(&self, problems: &mut Vec<String>) {
        for (name, entry) in &self.databases {
            let Some(mirror) = &entry.mirror else { continue };
            let problem = match self.databases.get(mirror) {
                _ if mirror == name => Some("names its own entry".to_owned()),
                _ if mirror == "*" => Some("names the wildcard entry `*`; name a database".to_owned()),
                None => Some("names no [databases] entry".to_owned()),
                Some(target) => target.mirror.as_ref().map(|next| {
                    format!("names an entry that is mirrored itself (databases.{mirror}.mirror = {next:?}); mirrors do not chain")
                }),
            };
            if let Some(problem) = problem {
                problems.push(format!("databases.{name}.mirror = {mirror:?} {problem}"));
            }
        }
        if self.databases.values().any(|entry| entry.mirror.is_some()) && self.pooler.mirror_interface.is_empty() {
            problems.push("pooler.mirror_interface is empty".into());
        }
    }

    fn load_auth_file(&self, problems: &mut Vec<String>) -> AuthFile {
        match (&self.pooler.auth_file, self.pooler.auth_type) {
            (None, AuthType::Trust) => AuthFile::default(),
            (None, _) => {
                problems.push("pooler.auth_file is required unless auth_type = \"trust\"".into());
                AuthFile::default()
            }
            (Some(path), _) => AuthFile::load(path).unwrap_or_else(|error| {
                problems.push(format!("pooler.auth_file: {error}"));
                AuthFile::default()
            }),
        }
    }
}

fn resolve(address: &str, field: &str, problems: &mut Vec<String>) -> Option<SocketAddr> {
    match address.to_socket_addrs().map(|mut addrs| addrs.next()) {
        Ok(Some(addr)) => Some(addr),
        _ => {
            problems.push(format!("{field} = {address:?} is not a host:port address"));
            None
        }
    }
}

impl PoolerSettings {
    fn check(&self, problems: &mut Vec<String>) {
        let mut require = |ok: bool, text: &str| {
            if !ok {
                problems.push(text.to_owned());
            }
        };
        require(self.max_client_conn > 0, "pooler.max_client_conn must be at least 1");
        require(self.default_pool_size > 0, "pooler.default_pool_size must be at least 1");
        require(self.min_pool_size <= self.default_pool_size, "pooler.min_pool_size exceeds default_pool_size");
        require(self.message_size_max >= 1024, "pooler.message_size_max must be at least 1024 bytes");
        require(self.message_size_max <= i32::MAX as u32, "pooler.message_size_max must fit PostgreSQL's 2 GiB limit");
        require(self.server_connect_timeout_ms > 0, "pooler.server_connect_timeout_ms must be positive");
        require(self.client_login_timeout_ms > 0, "pooler.client_login_timeout_ms must be positive");
        require(self.mirror_connect_timeout_ms > 0, "pooler.mirror_connect_timeout_ms must be positive");
        require(self.workers <= 256, "pooler.workers must be at most 256");
        require(!self.server_reset_query.contains('\0'), "pooler.server_reset_query contains NUL");
    }

    /// Worker threads to start.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => process_cpus(),
            n => n as usize,
        }
    }
}

impl DatabaseEntry {
    fn check(&self, name: &str, pooler: &PoolerSettings, problems: &mut Vec<String>) {
        if name.is_empty() || name.contains('\0') {
            problems.push(format!("databases.{name:?}: invalid database name"));
        }
        if self.host.is_empty() {
            problems.push(format!("databases.{name}.host is empty"));
        }
        if self.pool_size == Some(0) {
            problems.push(format!("databases.{name}.pool_size must be at least 1"));
        }
        let size = self.pool_size.unwrap_or(pooler.default_pool_size);
        if self.min_pool_size.unwrap_or(pooler.min_pool_size) > size {
            problems.push(format!("databases.{name}.min_pool_size exceeds its pool size"));
        }
        if self.password.is_some() && self.user.is_none() {
            problems.push(format!("databases.{name}.password is set without databases.{name}.user"));
        }
    }

    /// The backend database for a client-visible name.
    pub fn backend_dbname<'a>(&'a self, client_name: &'a str) -> &'a str {
        self.dbname.as_deref().unwrap_or(client_name)
    }
}

/// The CPUs the process may run on, read once: after a shard thread pins itself it sees only its
/// own CPU, and a pool created there (at a client's login, or a reload from the console) must
/// still count every shard.
fn process_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_rejected() {
        let error = toml::from_str::<Config>("[pooler]\npool_mdoe = \"session\"\n").expect_err("typo must fail");
        assert!(error.to_string().contains("pool_mdoe"), "{error}");
    }

    #[test]
    fn validation_lists_every_problem() {
        let text = "[pooler]\nlisten_addr = \"nowhere\"\ndefault_pool_size = 0\nauth_type = \"md5\"\n";
        let config: Config = toml::from_str(text).expect("parses");
        let Err(ConfigError::Invalid(problems)) = config.validate() else { panic!("must be invalid") };
        assert!(problems.len() >= 4, "{problems:?}");
    }

    #[test]
    fn minimal_trust_config_is_valid() {
        let text = "[pooler]\nauth_type = \"trust\"\n[databases.app]\nport = 5433\n";
        let valid = toml::from_str::<Config>(text).expect("parses").validate().expect("valid");
        assert_eq!(valid.config.databases["app"].backend_dbname("app"), "app");
        assert_eq!(valid.listen_addr.port(), 6432);
    }
}
