//! `dispatch.toml` and `agent.toml`: settings of the dispatcher and of an agent.
//!
//! ```toml
//! [dispatcher]
//! listen_addr = "10.0.0.100:5432"
//! policy = "hybrid"              # relay | handover | hybrid
//! handover_min_bytes = 262144
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
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{DispatchError, Result};

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
        let config: DispatcherConfig =
            toml::from_str(&text).map_err(|e| DispatchError::Config(vec![format!("{}: {e}", path.display())]))?;
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
        match (problems.is_empty(), listen_addr) {
            (true, Some(listen_addr)) => {
                Ok(ValidDispatcherConfig { settings: self.dispatcher, listen_addr, backends, databases })
            }
            _ => Err(DispatchError::Config(problems)),
        }
    }
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
    /// Where dispatchers connect. Default `0.0.0.0:7432`.
    pub listen_addr: String,
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
            listen_addr: "0.0.0.0:7432".into(),
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
}

impl AgentConfig {
    pub fn load(path: &Path) -> Result<ValidAgentConfig> {
        let text =
            std::fs::read_to_string(path).map_err(|e| DispatchError::io(format!("reading {}", path.display()), e))?;
        let config: AgentConfig =
            toml::from_str(&text).map_err(|e| DispatchError::Config(vec![format!("{}: {e}", path.display())]))?;
        config.validate()
    }

    pub fn validate(self) -> Result<ValidAgentConfig> {
        let mut problems = Vec::new();
        let listen = parse_address(&self.listen_addr, "listen_addr", &mut problems);
        let postgres = parse_address(&self.postgres_addr, "postgres_addr", &mut problems);
        if !(1..=64).contains(&self.workers) {
            problems.push(format!("workers must be 1 to 64, not {}", self.workers));
        }
        match (problems.is_empty(), listen, postgres) {
            (true, Some(listen_addr), Some(postgres_addr)) => {
                Ok(ValidAgentConfig { listen_addr, postgres_addr, settings: self })
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
        let config: DispatcherConfig = toml::from_str(text).expect("parses");
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

    // Goal: MAC parsing is strict; method: good and bad inputs.
    #[test]
    fn mac_parsing_is_strict() {
        assert_eq!(parse_mac("02:00:0a:00:00:ff"), Some([2, 0, 10, 0, 0, 255]));
        assert_eq!(parse_mac("02:00:0a:00:00"), None);
        assert_eq!(parse_mac("02:00:0a:00:00:00:01"), None);
        assert_eq!(parse_mac("zz:00:0a:00:00:00"), None);
    }
}
