//! `dispatch.toml` and `agent.toml`: settings of the dispatcher and of an agent.
//!
//! ```toml
//! [dispatcher]
//! listen_addr = "10.0.0.100:5432"
//! policy = "hybrid"              # relay | handover | hybrid
//! handover_min_bytes = 262144
//! auth_file = "userlist.txt"     # clients log in with SCRAM-SHA-256 by default
//! agent_key_file = "agent.key"   # the same key as every agent's key_file
//!
//! [backends.be1]
//! agent = "10.0.0.3:7432"
//! postgres = "10.0.0.3:5432"     # relayed answers come straight from the server
//! mac = "02:00:0a:00:00:03"
//!
//! [databases."*"]
//! primary = "be1"
//! replicas = ["be2"]
//! ```
//! Unknown keys are errors; `validate` lists every problem at once.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use bypass_wire::auth::Method;
use bypass_wire::auth_file::AuthFile;
use bypass_wire::hba::Hba;
use serde::{Deserialize, Serialize};

use crate::agent::key::LinkKey;
use crate::error::{DispatchError, Result};

/// How clients prove who they are when no hba file decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum AuthType {
    /// Anyone who names a user is that user: only for benchmarks and closed networks.
    #[serde(rename = "trust")]
    Trust,
    /// MD5 challenge; users whose secret is a SCRAM verifier get SCRAM.
    #[serde(rename = "md5")]
    Md5,
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
}

impl AuthType {
    pub fn method(self) -> Method {
        match self {
            AuthType::Trust => Method::Trust,
            AuthType::Md5 => Method::Md5,
            AuthType::ScramSha256 => Method::ScramSha256,
        }
    }
}

/// When a result leaves the dispatcher's relay for a direct path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Every byte through the dispatcher (the Hyrise-dispatcher baseline).
    Relay,
    /// Hand the client's connection to the backend for every read.
    Handover,
    /// Relay; hand over when the result is expected to exceed `handover_min_bytes`, or on demand
    /// when the agent sees it pass that size.
    Hybrid,
}

/// The `[dispatcher]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatcherSettings {
    /// Where clients connect. Default `127.0.0.1:6543`.
    pub listen_addr: String,
    /// Local address for connections to agents (must not be the VIP, which backends own on
    /// `lo`). Default: chosen by the kernel.
    pub source_addr: Option<Ipv4Addr>,
    /// Default `relay`.
    pub policy: Policy,
    /// Results expected (or seen) to pass this many bytes are handed over. Default 262144,
    /// from the measured crossover (see bench/results/dispatch.md).
    pub handover_min_bytes: u64,
    /// A replica whose replay lag exceeds this gets no reads, in ms. Default 1000.
    pub replica_lag_max_ms: u64,
    /// Time between health checks of each backend, in ms. Default 500.
    pub health_interval_ms: u64,
    /// A health check (connect + query) slower than this fails, in ms. Default 2000.
    pub health_timeout_ms: u64,
    /// Role and database the health checks log in as. Default `postgres`/`postgres`.
    pub health_user: String,
    pub health_database: String,
    /// Idle links kept per backend, user and database. Default 64.
    pub link_idle_max: usize,
    /// Most client connections at once. Default 1000.
    pub clients_max: usize,
    /// Network namespace of the switch whose client ports get the steering program; required
    /// for the hand-over policies (the dispatcher is the switch's controller).
    pub steer_namespace: Option<String>,
    /// Client-facing switch ports (interface names inside `steer_namespace`).
    pub steer_ports: Vec<String>,
    /// Longest wait for the client to acknowledge what it was sent before its connection
    /// moves, in ms; after it, unacknowledged bytes move with the connection. Default 50.
    pub drain_wait_ms: u64,
    /// Longest wait, after the switch blocked a moving connection, for segments it had already
    /// let through to reach the dispatcher's socket, in ms. Only a segment lost on the way
    /// makes the wait last this long. Default 50.
    pub settle_wait_ms: u64,
    /// Distinct statement shapes whose last answer size is remembered for the hybrid policy.
    /// Default 4096.
    pub size_history_max: usize,
    /// Worker threads, each with its own single-threaded runtime; a client connection stays on
    /// the thread that takes it. Default 2.
    pub workers: usize,
    /// Password for roles the backends' PostgreSQL servers do not trust, used by links straight
    /// to a server (`backends.NAME.postgres`); the same for every role. Default none.
    pub postgres_password: Option<String>,
    /// While a session waits for a backend's answer or for its client's next request, its
    /// worker polls for up to this long (µs) before it sleeps. Each wake-up of a sleeping worker
    /// costs a context switch (and on a VM an interrupt) — more than relaying a small answer —
    /// while polling costs CPU time other work could use. Default 0 (sleep at once).
    pub busy_poll_us: u64,
    /// `scram-sha-256`, `md5` or `trust`: how clients log in when `auth_hba_file` is unset.
    /// Default `scram-sha-256`.
    pub auth_type: AuthType,
    /// PgBouncer-format user list (`"user" "secret"` per line: plaintext, `md5…` or a SCRAM
    /// verifier); required unless `auth_type = "trust"`. Relative to the config file.
    pub auth_file: Option<PathBuf>,
    /// hba file (`host`/`hostnossl` lines, methods `trust`, `reject`, `md5`, `scram-sha-256`,
    /// `password`); when set it decides each client's method. Default none.
    pub auth_hba_file: Option<PathBuf>,
    /// File holding the key agents check (the same text as each agent's `key_file`, at least 32
    /// bytes). Relative to the config file. Required unless `agent_key` is set.
    pub agent_key_file: Option<PathBuf>,
    /// The agent key itself, instead of `agent_key_file` (keeps a secret in the config).
    pub agent_key: Option<String>,
    /// Bound on a client's negotiation, startup and authentication, ms. Default 60000.
    pub client_login_timeout_ms: u64,
    /// Wait before answering a failed authentication, ms; 0 = none. Default 0.
    pub auth_failure_delay_ms: u64,
    /// Failed logins one client address may have within `failed_login_window_ms` before its
    /// further logins are refused (28000) until the window passes; 0 = no limit. Default 0.
    pub failed_logins_per_address_max: u32,
    /// See `failed_logins_per_address_max`, ms. Default 60000.
    pub failed_login_window_ms: u64,
}

impl Default for DispatcherSettings {
    fn default() -> Self {
        DispatcherSettings {
            listen_addr: "127.0.0.1:6543".into(),
            source_addr: None,
            policy: Policy::Relay,
            handover_min_bytes: 262_144,
            replica_lag_max_ms: 1000,
            health_interval_ms: 500,
            health_timeout_ms: 2000,
            health_user: "postgres".into(),
            health_database: "postgres".into(),
            link_idle_max: 64,
            clients_max: 1000,
            steer_namespace: None,
            steer_ports: Vec::new(),
            drain_wait_ms: 50,
            settle_wait_ms: 50,
            size_history_max: 4096,
            workers: 2,
            postgres_password: None,
            busy_poll_us: 0,
            auth_type: AuthType::ScramSha256,
            auth_file: None,
            auth_hba_file: None,
            agent_key_file: None,
            agent_key: None,
            client_login_timeout_ms: 60_000,
            auth_failure_delay_ms: 0,
            failed_logins_per_address_max: 0,
            failed_login_window_ms: 60_000,
        }
    }
}

/// One `[backends.NAME]` entry: an agent beside a PostgreSQL server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendEntry {
    /// The agent's `host:port`.
    pub agent: String,
    /// The PostgreSQL server's own `host:port`. When set, requests whose answers are relayed go
    /// straight to the server, and only answers that may be handed over pass through the agent
    /// (one hop less per relayed query). Default none: everything through the agent.
    #[serde(default)]
    pub postgres: Option<String>,
    /// MAC of the backend host's interface, for steering handed-over flows (`aa:bb:…`).
    pub mac: Option<String>,
}

/// One `[databases.NAME]` entry; `*` matches every database not listed.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseEntry {
    /// Backend name that takes writes.
    pub primary: String,
    /// Backend names that take reads outside transactions.
    #[serde(default)]
    pub replicas: Vec<String>,
}

/// The whole `dispatch.toml`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DispatcherConfig {
    #[serde(default)]
    pub dispatcher: DispatcherSettings,
    #[serde(default)]
    pub backends: BTreeMap<String, BackendEntry>,
    #[serde(default)]
    pub databases: BTreeMap<String, DatabaseEntry>,
}

/// A backend after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    pub name: String,
    pub agent: SocketAddr,
    pub postgres: Option<SocketAddr>,
    pub mac: Option<[u8; 6]>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct ValidDispatcherConfig {
    pub settings: DispatcherSettings,
    pub listen_addr: SocketAddr,
    /// Index = backend id used everywhere else.
    pub backends: Vec<BackendSpec>,
    /// Database name → (primary id, replica ids).
    pub databases: BTreeMap<String, (usize, Vec<usize>)>,
    /// Clients' secrets from `auth_file` (empty under trust without a file).
    pub users: AuthFile,
    /// Rules from `auth_hba_file`.
    pub hba: Option<Hba>,
    /// What links prove to agents.
    pub agent_key: LinkKey,
}

impl ValidDispatcherConfig {
    /// The primary and replicas serving `database`.
    pub fn route_set(&self, database: &str) -> Option<&(usize, Vec<usize>)> {
        self.databases.get(database).or_else(|| self.databases.get("*"))
    }
}

impl DispatcherConfig {
    pub fn load(path: &Path) -> Result<ValidDispatcherConfig> {
        let text =
            std::fs::read_to_string(path).map_err(|e| DispatchError::io(format!("reading {}", path.display()), e))?;
        let mut config: DispatcherConfig =
            toml::from_str(&text).map_err(|e| DispatchError::Config(vec![format!("{}: {e}", path.display())]))?;
        if let Some(folder) = path.parent() {
            let settings = &mut config.dispatcher;
            for file in [&mut settings.auth_file, &mut settings.auth_hba_file, &mut settings.agent_key_file] {
                if let Some(file) = file.as_mut() {
                    *file = folder.join(&*file);
                }
            }
        }
        config.validate()
    }

    /// Checks every setting; lists all problems at once.
    pub fn validate(self) -> Result<ValidDispatcherConfig> {
        let mut problems = Vec::new();
        let listen_addr = parse_address(&self.dispatcher.listen_addr, "dispatcher.listen_addr", &mut problems);
        let settings = &self.dispatcher;
        if settings.handover_min_bytes == 0 {
            problems.push("dispatcher.handover_min_bytes must be at least 1".into());
        }
        if settings.policy != Policy::Relay && (settings.steer_namespace.is_none() || settings.steer_ports.is_empty()) {
            problems.push(
                "dispatcher.steer_namespace and steer_ports are required for the handover and hybrid policies".into(),
            );
        }
        if !(1..=64).contains(&settings.workers) {
            problems.push(format!("dispatcher.workers must be 1 to 64, not {}", settings.workers));
        }
        if settings.health_interval_ms == 0 || settings.health_timeout_ms == 0 {
            problems.push("dispatcher.health_interval_ms and health_timeout_ms must be positive".into());
        }
        let backends: Vec<BackendSpec> = self
            .backends
            .iter()
            .filter_map(|(name, entry)| backend_spec(name, entry, settings.policy, &mut problems))
            .collect();
        let id = |name: &str, problems: &mut Vec<String>| {
            let found = backends.iter().position(|b| b.name == name);
            if found.is_none() {
                problems.push(format!("unknown backend {name:?}"));
            }
            found
        };
        let mut databases = BTreeMap::new();
        for (name, entry) in &self.databases {
            let primary = id(&entry.primary, &mut problems);
            let replicas: Vec<usize> = entry.replicas.iter().filter_map(|r| id(r, &mut problems)).collect();
            if let Some(primary) = primary {
                databases.insert(name.clone(), (primary, replicas));
            }
        }
        if databases.is_empty() {
            problems.push("[databases] is empty: no client could connect anywhere".into());
        }
        let (users, hba) = load_client_auth(settings, &mut problems);
        let agent_key = load_key(
            (settings.agent_key.as_deref(), settings.agent_key_file.as_deref()),
            ("dispatcher.agent_key", "dispatcher.agent_key_file"),
            &mut problems,
        );
        match (problems.is_empty(), listen_addr, agent_key) {
            (true, Some(listen_addr), Some(agent_key)) => Ok(ValidDispatcherConfig {
                settings: self.dispatcher,
                listen_addr,
                backends,
                databases,
                users,
                hba,
                agent_key,
            }),
            _ => Err(DispatchError::Config(problems)),
        }
    }
}

/// The auth file and hba rules clients are checked against; every problem is listed.
fn load_client_auth(settings: &DispatcherSettings, problems: &mut Vec<String>) -> (AuthFile, Option<Hba>) {
    let users = match (&settings.auth_file, settings.auth_type) {
        (Some(path), _) => AuthFile::load(path).unwrap_or_else(|error| {
            problems.push(format!("dispatcher.auth_file: {error}"));
            AuthFile::default()
        }),
        (None, AuthType::Trust) => AuthFile::default(),
        (None, _) => {
            problems.push(
                "dispatcher.auth_file is required unless auth_type = \"trust\": clients must prove who they are".into(),
            );
            AuthFile::default()
        }
    };
    let hba = settings.auth_hba_file.as_deref().and_then(|path| {
        Hba::load(path)
            .map_err(|file_problems| {
                problems.extend(file_problems.into_iter().map(|p| format!("dispatcher.auth_hba_file: {p}")))
            })
            .ok()
    });
    (users, hba)
}

/// The link key from its inline or file setting (exactly one of them).
fn load_key(
    sources: (Option<&str>, Option<&Path>),
    names: (&str, &str),
    problems: &mut Vec<String>,
) -> Option<LinkKey> {
    let loaded = match sources {
        (Some(text), None) => LinkKey::from_text(text).map_err(|e| format!("{}: {e}", names.0)),
        (None, Some(path)) => LinkKey::load(path).map_err(|e| format!("{}: {e}", names.1)),
        (Some(_), Some(_)) => Err(format!("set {} or {}, not both", names.0, names.1)),
        (None, None) => Err(format!(
            "{} is required: agents accept links only from a dispatcher holding their key \
             (make one with `head -c 32 /dev/urandom | base64 > agent.key`)",
            names.1
        )),
    };
    loaded.map_err(|problem| problems.push(problem)).ok()
}

fn backend_spec(name: &str, entry: &BackendEntry, policy: Policy, problems: &mut Vec<String>) -> Option<BackendSpec> {
    let agent = parse_address(&entry.agent, &format!("backends.{name}.agent"), problems)?;
    let postgres = match &entry.postgres {
        Some(text) => Some(parse_address(text, &format!("backends.{name}.postgres"), problems)?),
        None => None,
    };
    let mac = match &entry.mac {
        Some(text) => match parse_mac(text) {
            Some(mac) => Some(mac),
            None => {
                problems.push(format!("backends.{name}.mac = {text:?} is not a MAC address"));
                return None;
            }
        },
        None if policy != Policy::Relay => {
            problems.push(format!("backends.{name}.mac is required for hand-over"));
            None
        }
        None => None,
    };
    Some(BackendSpec { name: name.to_string(), agent, postgres, mac })
}

fn parse_address(text: &str, field: &str, problems: &mut Vec<String>) -> Option<SocketAddr> {
    let parsed = text.parse().ok();
    if parsed.is_none() {
        problems.push(format!("{field} = {text:?} is not an ip:port address"));
    }
    parsed
}

/// `aa:bb:cc:dd:ee:ff` → bytes.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// `agent.toml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Where dispatchers connect. Default `127.0.0.1:7432` (loopback: open it to the
    /// dispatcher's network explicitly).
    pub listen_addr: String,
    /// File holding the key a dispatcher must prove before the agent logs in to PostgreSQL for
    /// it (at least 32 bytes of text). Relative to the config file. Required unless `key` is set.
    pub key_file: Option<PathBuf>,
    /// The key itself, instead of `key_file`.
    pub key: Option<String>,
    /// The PostgreSQL server beside the agent. Default `127.0.0.1:5432`.
    pub postgres_addr: String,
    /// Password for roles the server does not trust (the same for every role). Default none.
    pub password: Option<String>,
    /// The address clients reach the service at; handed-over sockets are bound to it.
    pub vip: Option<Ipv4Addr>,
    /// Most dispatcher links at once. Default 512.
    pub links_max: usize,
    /// After writing a handed-over answer, how long to wait for the client's next request
    /// before handing the connection back anyway, in ms. Waiting lets the next request travel
    /// back inside the connection instead of meeting the blocked switch. Default 5.
    pub handback_wait_ms: u64,
    /// Longest wait for the client to acknowledge the answer before handing back, in ms.
    /// Default 200.
    pub drain_wait_ms: u64,
    /// Longest wait, after the switch blocked a connection on its way home, for the segments
    /// the switch had let through to reach the agent's socket, in ms. Default 50.
    pub settle_wait_ms: u64,
    /// Worker threads of the runtime. Default 1.
    pub workers: usize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            listen_addr: "127.0.0.1:7432".into(),
            key_file: None,
            key: None,
            postgres_addr: "127.0.0.1:5432".into(),
            password: None,
            vip: None,
            links_max: 512,
            handback_wait_ms: 5,
            drain_wait_ms: 200,
            settle_wait_ms: 50,
            workers: 1,
        }
    }
}

/// A validated agent configuration.
#[derive(Debug, Clone)]
pub struct ValidAgentConfig {
    pub listen_addr: SocketAddr,
    pub postgres_addr: SocketAddr,
    pub settings: AgentConfig,
    /// What dispatchers must prove.
    pub key: LinkKey,
}

impl AgentConfig {
    pub fn load(path: &Path) -> Result<ValidAgentConfig> {
        let text =
            std::fs::read_to_string(path).map_err(|e| DispatchError::io(format!("reading {}", path.display()), e))?;
        let mut config: AgentConfig =
            toml::from_str(&text).map_err(|e| DispatchError::Config(vec![format!("{}: {e}", path.display())]))?;
        if let (Some(folder), Some(file)) = (path.parent(), config.key_file.as_mut()) {
            *file = folder.join(&*file);
        }
        config.validate()
    }

    pub fn validate(self) -> Result<ValidAgentConfig> {
        let mut problems = Vec::new();
        let listen = parse_address(&self.listen_addr, "listen_addr", &mut problems);
        let postgres = parse_address(&self.postgres_addr, "postgres_addr", &mut problems);
        if !(1..=64).contains(&self.workers) {
            problems.push(format!("workers must be 1 to 64, not {}", self.workers));
        }
        let key = load_key((self.key.as_deref(), self.key_file.as_deref()), ("key", "key_file"), &mut problems);
        match (problems.is_empty(), listen, postgres, key) {
            (true, Some(listen_addr), Some(postgres_addr), Some(key)) => {
                Ok(ValidAgentConfig { listen_addr, postgres_addr, settings: self, key })
            }
            _ => Err(DispatchError::Config(problems)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a full config parses into backend ids; method: parse a literal TOML.
    #[test]
    fn parses_backends_and_databases() {
        let text = r#"
            [dispatcher]
            listen_addr = "10.0.0.100:5432"
            policy = "hybrid"
            steer_namespace = "lab-sw"
            steer_ports = ["v-cli1"]
            [backends.be1]
            agent = "10.0.0.3:7432"
            mac = "02:00:0a:00:00:03"
            [backends.be2]
            agent = "10.0.0.4:7432"
            mac = "02:00:0a:00:00:04"
            [databases."*"]
            primary = "be1"
            replicas = ["be1", "be2"]
        "#;
        let text = text.replace(
            "[dispatcher]",
            &format!("[dispatcher]\nauth_type = \"trust\"\nagent_key = \"{}\"", "k".repeat(32)),
        );
        let config: DispatcherConfig = toml::from_str(&text).expect("parses");
        let valid = config.validate().expect("valid");
        assert_eq!(valid.backends[1].mac, Some([2, 0, 10, 0, 0, 4]));
        assert_eq!(valid.route_set("anything"), Some(&(0, vec![0, 1])));
    }

    // Goal: every problem is reported at once; method: a config with four mistakes.
    #[test]
    fn lists_every_problem() {
        let text = r#"
            [dispatcher]
            listen_addr = "nowhere"
            policy = "handover"
            [backends.be1]
            agent = "10.0.0.3"
            [databases.shop]
            primary = "be9"
        "#;
        let config: DispatcherConfig = toml::from_str(text).expect("parses");
        let Err(DispatchError::Config(problems)) = config.validate() else { panic!("must fail") };
        assert!(problems.len() >= 5, "{problems:#?}");
        assert!(toml::from_str::<DispatcherConfig>("[dispatcher]\nbogus = 1").is_err(), "unknown keys are errors");
    }

    // Goal: a default dispatcher and agent refuse to start without client auth and a link key;
    // the agent binds loopback by default. Method: validate defaults.
    #[test]
    fn authentication_is_required_by_default() {
        let mut config = DispatcherConfig::default();
        config
            .backends
            .insert("be1".into(), BackendEntry { agent: "127.0.0.1:7432".into(), postgres: None, mac: None });
        config.databases.insert("*".into(), DatabaseEntry { primary: "be1".into(), replicas: Vec::new() });
        let Err(DispatchError::Config(problems)) = config.validate() else { panic!("must fail") };
        let joined = problems.join("\n");
        assert!(joined.contains("dispatcher.auth_file is required"), "{joined}");
        assert!(joined.contains("dispatcher.agent_key_file is required"), "{joined}");
        let Err(DispatchError::Config(problems)) = AgentConfig::default().validate() else { panic!("must fail") };
        assert!(problems.join("\n").contains("key_file is required"), "{problems:?}");
        assert_eq!(AgentConfig::default().listen_addr, "127.0.0.1:7432");
        let short = AgentConfig { key: Some("short".into()), ..AgentConfig::default() };
        assert!(short.validate().is_err(), "a short key is refused");
    }

    // Goal: MAC parsing is strict; method: good and bad inputs.
    #[test]
    fn mac_parsing_is_strict() {
        assert_eq!(parse_mac("02:00:0a:00:00:ff"), Some([2, 0, 10, 0, 0, 255]));
        assert_eq!(parse_mac("02:00:0a:00:00"), None);
        assert_eq!(parse_mac("02:00:0a:00:00:00:01"), None);
        assert_eq!(parse_mac("zz:00:0a:00:00:00"), None);
    }
}
