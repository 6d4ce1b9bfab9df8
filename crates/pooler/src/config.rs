//! `bypass.toml` as plain data: the pooler's settings and its `[databases]` table, PgBouncer-style.
//!
//! The bottom of the pooler: this module reads no file and builds no runtime object (TLS
//! contexts, hba rules and the auth file are built from it by [`crate::load`]). Each table is one
//! [`settings!`] declaration, which also yields the table's [`Setting`] list, so the reference
//! (`docs/config.md`), the console's `SHOW CONFIG` and the reload change check come from the same
//! lines: a setting cannot be added without saying whether a reload applies it.
//!
//! Every field has a documented unit and default; unknown keys are errors; [`Config::problems`]
//! lists every problem of the data itself at once.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// When a changed setting takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// At the next SIGHUP or `RELOAD` (for client timeouts: to clients that log in afterwards).
    Reload,
    /// At start only: a reload that changes it reports it as needing a restart.
    Restart,
}

/// One setting of a table, as declared.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub name: &'static str,
    /// The Rust type, as written in the declaration.
    pub kind: &'static str,
    /// The doc comment's lines.
    pub doc: &'static [&'static str],
    pub applies: Applies,
}

impl Setting {
    /// The doc comment as one line.
    pub fn description(&self) -> String {
        let lines: Vec<&str> = self.doc.iter().map(|line| line.trim()).collect();
        lines.join(" ")
    }
}

/// Declares a settings table: the struct (serde, `deny_unknown_fields`, defaults), its
/// `SETTINGS` list and its change check. Each field starts with `reload` or `restart` (see
/// [`Applies`]); a field without one does not compile.
macro_rules! settings {
    (
        $(#[doc = $struct_doc:literal])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $applies:ident $field:ident : $type:ty = $default:expr,
            )*
        }
    ) => {
        $(#[doc = $struct_doc])*
        #[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $type, )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $( $field: $default, )* }
            }
        }

        impl $name {
            /// Every setting of this table, in declaration order.
            pub const SETTINGS: &'static [Setting] = &[
                $( Setting {
                    name: stringify!($field),
                    kind: stringify!($type),
                    doc: &[$($doc),*],
                    applies: settings!(@applies $applies),
                }, )*
            ];

            /// The settings whose values differ between `self` and `new`, each with when it applies.
            pub fn changes(&self, new: &Self) -> Vec<(&'static str, Applies)> {
                let mut changed = Vec::new();
                $(
                    if self.$field != new.$field {
                        changed.push((stringify!($field), settings!(@applies $applies)));
                    }
                )*
                changed
            }

            /// The declaration of setting `name`, if it is one.
            pub fn setting(name: &str) -> Option<&'static Setting> {
                Self::SETTINGS.iter().find(|setting| setting.name == name)
            }
        }
    };
    (@applies reload) => { Applies::Reload };
    (@applies restart) => { Applies::Restart };
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
    /// Per-user settings (PgBouncer's `[users]`), by client user name.
    #[serde(default)]
    pub users: BTreeMap<String, UserEntry>,
}

settings! {
    /// The `[pooler]` table.
    pub struct PoolerSettings {
        /// Address clients connect to. Default `127.0.0.1:6432`.
        restart listen_addr: String = "127.0.0.1:6432".into(),
        /// `session` or `transaction`. Default `session` (as PgBouncer).
        reload pool_mode: PoolMode = PoolMode::Session,
        /// `trust`, `md5` or `scram-sha-256`. Default `md5`.
        reload auth_type: AuthType = AuthType::Md5,
        /// PgBouncer-format user list (`"user" "secret"` per line); required unless `auth_type = trust`.
        reload auth_file: Option<PathBuf> = None,
        /// File keeping the key of the mock SCRAM exchange unknown users get (and of the salts of
        /// plaintext secrets in `auth_file`): 64 hex digits, mode 0600, created at the first start
        /// if missing. Kept across restarts, an unknown user's salt stays the same as a known
        /// user's does, so logins a restart apart cannot tell them apart (PostgreSQL keeps its
        /// mock nonce in pg_control). If it cannot be written the key is derived from `auth_file`
        /// (without one: a key per process, with a warning). Relative to the config file. Default
        /// `<auth_file>.mock-key`, without an auth file (users only through `auth_query`)
        /// `<config file>.mock-key`.
        restart mock_key_file: Option<PathBuf> = None,
        /// Most client connections at once; more are refused with SQLSTATE 53300. Default 100.
        reload max_client_conn: u32 = 100,
        /// Servers per (database, user) pool. Default 20.
        reload default_pool_size: u32 = 20,
        /// Servers each pool keeps open even when idle. Default 0.
        reload min_pool_size: u32 = 0,
        /// Most servers per database across all its pools; 0 = unlimited. Default 0.
        reload max_db_connections: u32 = 0,
        /// Most servers per user across all its pools; 0 = unlimited. Default 0.
        reload max_user_connections: u32 = 0,
        /// Servers a pool may open beyond its size for a client that has waited
        /// `reserve_pool_timeout_ms` (PgBouncer's reserve pool); they close again when nobody
        /// waits. 0 = none. Default 0.
        reload reserve_pool_size: u32 = 0,
        /// How long a client waits before the reserve pool is used for it, ms. Default 5000.
        reload reserve_pool_timeout_ms: u64 = 5_000,
        /// How long a client waits for a server before it is disconnected, ms; 0 = forever. Default 120000.
        reload query_wait_timeout_ms: u64 = 120_000,
        /// Idle servers older than this are closed, ms; 0 = never. Default 600000.
        reload server_idle_timeout_ms: u64 = 600_000,
        /// Servers older than this are closed when released, ms; 0 = never. Default 3600000.
        reload server_lifetime_ms: u64 = 3_600_000,
        /// Bound on connecting and logging in to a server, ms. Default 15000.
        reload server_connect_timeout_ms: u64 = 15_000,
        /// Clients idle (no server) longer than this are disconnected, ms; 0 = never. Default 0.
        /// This and the other client timeouts apply to clients that log in after a reload.
        reload client_idle_timeout_ms: u64 = 0,
        /// Clients idle inside a transaction longer than this are disconnected, ms; 0 = never. Default 0.
        reload idle_transaction_timeout_ms: u64 = 0,
        /// Bound on a client's startup and authentication, ms. Default 60000.
        reload client_login_timeout_ms: u64 = 60_000,
        /// Run on a server before another client gets it in session mode. Default `DISCARD ALL`.
        reload server_reset_query: String = "DISCARD ALL".into(),
        /// Largest message accepted from either side, bytes. Default 268435456 (256 MiB).
        reload message_size_max: u32 = bypass_wire::DEFAULT_MESSAGE_SIZE_MAX,
        /// Prepared statements kept per server in transaction mode, where the pooler prepares a
        /// client's named statements on whichever server it lands on; least recently used ones are
        /// closed. 0 turns this off (named statements then only work within one transaction).
        /// Default 200 (as PgBouncer 1.24).
        reload max_prepared_statements: u32 = 200,
        /// Shards: threads with their own runtime and listener (`SO_REUSEPORT`); 0 = one per CPU.
        /// Default 0.
        restart workers: u32 = 0,
        /// Pins shard `i`'s thread to the `i`-th CPU the process may run on (wrapping around), when
        /// there are two or more shards. An unpinned shard is pulled onto the CPU of whichever
        /// backend woke it and drags the backends it wakes onto its own, so shards end up sharing a
        /// CPU while another idles. Default true.
        restart pin_workers: bool = true,
        /// `listen()` backlog. Default 4096.
        restart listen_backlog: u32 = 4096,
        /// Folder of a Unix-domain socket clients may also use, `<folder>/.s.PGSQL.<port>` with the
        /// port of `listen_addr`, as PostgreSQL names it (`psql -h /run/bypass`); a lock file beside
        /// it refuses a second pooler. Unix-socket clients are served by the first shard, in user
        /// space, without TLS (as PostgreSQL). Unset = TCP only. Default unset.
        restart unix_socket_dir: Option<PathBuf> = None,
        /// Startup parameters a client may send that the pooler drops instead of refusing (PgBouncer's
        /// `ignore_startup_parameters`), e.g. `["extra_float_digits", "options"]`. Any other
        /// parameter outside those PostgreSQL reports (and `options`, see `pass_options`) is
        /// refused with 0A000 naming it. Default `["extra_float_digits"]`.
        reload ignore_startup_parameters: Vec<String> = vec!["extra_float_digits".into()],
        /// Passes a client's `options` startup parameter (e.g. `-c search_path=app`) to
        /// PostgreSQL: clients with the same `options` share pools whose servers were started
        /// with them, so the settings hold in both pool modes. Unless listed in
        /// `ignore_startup_parameters`, `options` is refused when this is off. Default false.
        reload pass_options: bool = false,
        /// Users allowed on the admin console (database `bypass`, alias `pgbouncer`): every command.
        /// They authenticate like everyone else. Default none.
        reload admin_users: Vec<String> = Vec::new(),
        /// Users allowed on the admin console for `SHOW` commands only. Default none.
        reload stats_users: Vec<String> = Vec::new(),
        /// Address of the Prometheus endpoint (`GET /metrics`), e.g. `127.0.0.1:9127`; unset = off.
        /// Default unset.
        restart metrics_addr: Option<String> = None,
        /// How long SIGTERM and `SHUTDOWN WAIT_FOR_SERVERS` wait for running transactions before
        /// closing everything, ms. Default 30000.
        reload shutdown_timeout_ms: u64 = 30_000,
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
        reload session_state: SessionStatePolicy = SessionStatePolicy::Track,
        /// TLS towards clients: `disable`, `allow`, `prefer`, `require`, `verify-ca` or `verify-full`
        /// (PgBouncer's meanings: `allow`/`prefer` use TLS when the client asks, `require` refuses
        /// plaintext clients with 28000, `verify-*` also require a client certificate signed by
        /// `client_tls_ca_file`). SSLRequest and PostgreSQL 17 direct TLS (ALPN `postgresql`) are
        /// both accepted. Default `disable`.
        restart client_tls_sslmode: ClientSslMode = ClientSslMode::Disable,
        /// PEM certificate chain the pooler presents to clients; required unless
        /// `client_tls_sslmode = "disable"`. Relative to the config file. Default none.
        restart client_tls_cert_file: Option<PathBuf> = None,
        /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `client_tls_cert_file`. Default none.
        restart client_tls_key_file: Option<PathBuf> = None,
        /// PEM CA certificates client certificates are checked against; required for `verify-ca` and
        /// `verify-full`, optional below (a certificate a client sends is then checked, for the hba
        /// method `cert`). Default none.
        restart client_tls_ca_file: Option<PathBuf> = None,
        /// TLS towards PostgreSQL: `disable` (no SSLRequest), `prefer` (TLS when the server offers
        /// it, certificate not checked), `require` (TLS or fail, certificate not checked),
        /// `verify-ca` (chain checked against `server_tls_ca_file`), `verify-full` (chain and the
        /// database entry's `host` name). Default `prefer` (as PgBouncer).
        restart server_tls_sslmode: ServerSslMode = ServerSslMode::Prefer,
        /// PEM CA certificates server certificates are checked against; required for `verify-ca`
        /// and `verify-full`. Default none.
        restart server_tls_ca_file: Option<PathBuf> = None,
        /// PEM certificate the pooler presents to servers that ask for one (PostgreSQL's `cert`
        /// method or `clientcert=`); set together with `server_tls_key_file`. Default none.
        restart server_tls_cert_file: Option<PathBuf> = None,
        /// PEM private key of `server_tls_cert_file`. Default none.
        restart server_tls_key_file: Option<PathBuf> = None,
        /// PgBouncer-style hba file (`host`, `hostssl`, `hostnossl` lines with database, user, CIDR
        /// and method `trust`, `reject`, `md5`, `scram-sha-256`, `password` or `cert`); when set it
        /// decides each client's method instead of `auth_type`, first matching line wins, no match
        /// is refused. Relative to the config file. Default none.
        reload auth_hba_file: Option<PathBuf> = None,
        /// User the pooler logs in to PostgreSQL as to look up clients missing from `auth_file`
        /// with `auth_query`; its own password comes from `auth_file` or the database entry.
        /// Default none (lookups off).
        reload auth_user: Option<String> = None,
        /// Query returning (user name, SCRAM verifier or MD5 hash) for `$1` = the client's user
        /// name, run as `auth_user` in the client's database. Default
        /// `SELECT usename, passwd FROM pg_shadow WHERE usename=$1` (as PgBouncer).
        reload auth_query: String = "SELECT usename, passwd FROM pg_shadow WHERE usename=$1".into(),
        /// Wait before answering a failed authentication, ms (as PostgreSQL's `auth_delay`): slows
        /// password guessing. 0 = answer at once. Default 0.
        reload auth_failure_delay_ms: u64 = 0,
        /// Failed logins one client address may have within `failed_login_window_ms` before its
        /// further logins are refused (28000, before any exchange) until the window passes;
        /// 0 = no limit. Default 0.
        reload failed_logins_per_address_max: u32 = 0,
        /// The window of `failed_logins_per_address_max`, ms. Default 60000.
        reload failed_login_window_ms: u64 = 60_000,
        /// Pools of a database not listed in `[databases]` (served by the `*` entry) are dropped,
        /// with that database's limit, once they have been unused (no client, no server in use)
        /// this long, ms; 0 = never. Default 3600000 (PgBouncer's `autodb_idle_timeout`).
        reload autodb_idle_timeout_ms: u64 = 3_600_000,
        /// Where steady-state bytes of transaction-mode plaintext clients move: `user` (the pooler
        /// relays them) or `kernel` (eBPF `sk_skb` programs forward them between client and server
        /// sockets and return servers to the pool inside the kernel; user space keeps login, TLS,
        /// cancel, waiting clients and named prepared statements). When the programs cannot load (no
        /// CAP_BPF/CAP_NET_ADMIN, old kernel) the pooler logs one line and serves in user space.
        /// Default `user`.
        restart fast_path: FastPathMode = FastPathMode::User,
        /// With `fast_path = "kernel"`: a client whose request finds no free server may have it
        /// redirected in the kernel at once to a busy server whose current transaction is one
        /// autocommit statement (`SELECT`, `INSERT`, `UPDATE`, `DELETE`, `VALUES`, no second
        /// statement) that the pooler wrote; the server turns to it at that statement's
        /// ReadyForQuery. One client queues behind a server at a time. Such a client skips the
        /// clients waiting in the pooler's queue and waits behind that statement however long
        /// it runs (no `query_wait_timeout`). Default false.
        restart fast_path_queue_behind: bool = false,
        /// Network interface mirrored clients reach the pooler on, where the kernel copies their
        /// bytes for `mirror` (with `fast_path = "kernel"`): `lo` for local clients, else the
        /// Ethernet interface (which needs `net.ipv4.conf.<interface>.route_localnet = 1`). When the
        /// kernel cannot mirror there, clients are mirrored in user space. Default `lo`.
        restart mirror_interface: String = "lo".into(),
        /// Bound on connecting and logging in to a client's shadow server (`mirror`), ms: a shadow
        /// slower than this is given up (the client is served unmirrored, `mirror_failures` counts
        /// it), so a dead shadow delays a login by at most this much. Default 1000.
        reload mirror_connect_timeout_ms: u64 = 1_000,
        /// Logs each client login (`login`, with database, user and address) at info. Default
        /// true (as PgBouncer).
        reload log_connections: bool = true,
        /// Logs each client disconnect (`closing client`, with its reason and how long it was
        /// connected) and each server connection the pooler closes (`closing server`, with why)
        /// at info. Failures (a server that ended a session, a timeout, a failed server login) are
        /// logged at warn whatever this says. Default true (as PgBouncer).
        reload log_disconnections: bool = true,
        /// Period of the `stats` log line (transactions, queries, bytes and average transaction
        /// and wait times since the previous line, over every pool), ms; 0 = off. Default 60000
        /// (as PgBouncer's `stats_period`).
        reload stats_period_ms: u64 = 60_000,

    }
}

settings! {
    /// One `[databases.NAME]` entry. A reload that changes an entry replaces its pools (clients
    /// move to the new ones at their next transaction).
    pub struct DatabaseEntry {
        /// Backend host name or address. Default `127.0.0.1`.
        reload host: String = "127.0.0.1".into(),
        /// Backend port. Default 5432.
        reload port: u16 = 5432,
        /// Backend database name; default: the client-visible name.
        reload dbname: Option<String> = None,
        /// Log in to the backend as this user instead of the client's user.
        reload user: Option<String> = None,
        /// Backend password for `user` (plaintext, `md5…` or a SCRAM verifier is not usable here).
        reload password: Option<String> = None,
        /// Overrides `default_pool_size`.
        reload pool_size: Option<u32> = None,
        /// Overrides `min_pool_size`.
        reload min_pool_size: Option<u32> = None,
        /// Overrides `pool_mode`.
        reload pool_mode: Option<PoolMode> = None,
        /// Overrides `max_db_connections`.
        reload max_db_connections: Option<u32> = None,
        /// Overrides `reserve_pool_size`.
        reload reserve_pool_size: Option<u32> = None,
        /// Another `[databases]` entry that receives a copy of every byte this database's clients
        /// send (workload mirroring, as Tigger's "replication"): each client gets its own session on
        /// that entry's backend (same user), whose replies are discarded; the client's own answers
        /// never wait on it. The entry must exist, differ from this one, not be `*`, and not be
        /// mirrored itself. Default none.
        reload mirror: Option<String> = None,

    }
}

settings! {
    /// One `[users.NAME]` entry: limits and mode for every pool of that client user (PgBouncer's
    /// `[users]`). Where set they win over the database entry and `[pooler]`.
    pub struct UserEntry {
        /// Servers per pool of this user; overrides the database's `pool_size`.
        reload pool_size: Option<u32> = None,
        /// Pool mode of this user's pools; overrides the database's `pool_mode`.
        reload pool_mode: Option<PoolMode> = None,
        /// Most servers of this user across all databases; overrides `max_user_connections`.
        reload max_user_connections: Option<u32> = None,
    }
}

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

/// TLS towards clients, PgBouncer's `client_tls_sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientSslMode {
    /// Plaintext only: SSLRequest is answered 'N'.
    #[default]
    Disable,
    /// TLS when the client asks for it.
    Allow,
    /// TLS when the client asks for it (the same as `allow` on the accepting side).
    Prefer,
    /// TLS required: plaintext clients are refused with 28000 after their startup packet.
    Require,
    /// TLS with a client certificate signed by `client_tls_ca_file` required.
    VerifyCa,
    /// As `verify-ca` (PgBouncer's meaning: the pooler cannot check a client's host name).
    VerifyFull,
}

/// TLS towards PostgreSQL, PgBouncer's `server_tls_sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerSslMode {
    /// Plaintext, no SSLRequest.
    Disable,
    /// TLS if the server offers it, without checking its certificate; plaintext otherwise.
    #[default]
    Prefer,
    /// TLS required, certificate not checked.
    Require,
    /// TLS required, certificate chain checked against `server_tls_ca_file`.
    VerifyCa,
    /// As `verify-ca`, and the certificate must name the database entry's `host`.
    VerifyFull,
}

impl Config {
    /// Every problem of the data itself (no file is read, no name resolved): sizes, timeouts,
    /// database entries and mirrors. [`crate::load`] adds the problems of the files it names.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        self.pooler.check(&mut problems);
        if self.databases.is_empty() {
            problems.push("[databases] is empty: no client could connect anywhere".into());
        }
        for (name, entry) in &self.databases {
            entry.check(name, &self.pooler, &mut problems);
        }
        for (name, entry) in &self.users {
            if entry.pool_size == Some(0) {
                problems.push(format!("users.{name}.pool_size must be at least 1"));
            }
        }
        self.check_mirrors(&mut problems);
        problems
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
    fn every_restart_only_setting_is_compared_on_reload() {
        // Goal: no restart-only setting can be changed by a reload unnoticed (fast_path once
        // was). Method: change each restart-only setting alone and ask for the changes.
        let restart: Vec<&str> = PoolerSettings::SETTINGS
            .iter()
            .filter(|setting| setting.applies == Applies::Restart)
            .map(|setting| setting.name)
            .collect();
        assert!(restart.contains(&"fast_path") && restart.contains(&"listen_addr"), "{restart:?}");
        let text = |name: &str| {
            let old = PoolerSettings::default();
            let value = match toml::Value::try_from(&old).expect("serializes").get(name) {
                Some(toml::Value::String(_)) | None => toml::Value::String("changed".into()),
                Some(toml::Value::Integer(number)) => toml::Value::Integer(number + 1),
                Some(toml::Value::Boolean(flag)) => toml::Value::Boolean(!flag),
                Some(other) => panic!("{name}: add a changed value for {other:?}"),
            };
            let mut table = toml::Table::new();
            table.insert(name.to_owned(), value);
            table
        };
        for name in &restart {
            let mut table = text(name);
            if *name == "fast_path" {
                table.insert("fast_path".into(), "kernel".into());
            }
            if name.ends_with("sslmode") {
                table.insert((*name).into(), "require".into());
            }
            let new: PoolerSettings = table.try_into().unwrap_or_else(|error| panic!("{name}: {error}"));
            let changes = PoolerSettings::default().changes(&new);
            assert_eq!(changes, vec![(*name, Applies::Restart)], "{name}");
        }
    }

    #[test]
    fn every_setting_has_a_description() {
        for setting in PoolerSettings::SETTINGS.iter().chain(DatabaseEntry::SETTINGS) {
            assert!(!setting.description().is_empty(), "{} is undocumented", setting.name);
        }
    }
}
