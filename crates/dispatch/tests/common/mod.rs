//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::Ordering;

/// Logs of the dispatcher and agents on stderr when `BYPASS_TEST_LOG` names a filter (e.g.
/// `bypass_dispatch=debug`); silent otherwise.
pub fn trace() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("BYPASS_TEST_LOG").is_some() {
            let filter = tracing_subscriber::EnvFilter::from_env("BYPASS_TEST_LOG");
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
        }
    });
}

pub use bypass_lab::lab::unique_name as unique_lab_name;

use std::net::SocketAddr;
use std::time::Duration;

use bypass_dispatch::config::{AgentConfig, BackendEntry, DatabaseEntry, DispatcherConfig, ValidDispatcherConfig};
use bypass_dispatch::pglogin::LoginRequest;
use bypass_dispatch::runtime::Running;
use bypass_lab::pgclient::PgConnection;

/// The agent key every test dispatcher and agent share.
pub const AGENT_KEY: &str = "bypass-dispatch-tests-agent-key-0123456789";
/// The password of `postgres` at every test dispatcher (SCRAM, from [`users_file`]).
pub const PASSWORD: &str = "dispatch-test-password";

/// An auth file with `postgres` and [`PASSWORD`], written once per test process.
pub fn users_file() -> std::path::PathBuf {
    static FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("bypass-dispatch-tests-{}.users", std::process::id()));
        std::fs::write(&path, format!("\"postgres\" \"{PASSWORD}\"\n")).expect("write the test auth file");
        path
    })
    .clone()
}

/// How test clients log in to a dispatcher.
pub fn login() -> LoginRequest {
    LoginRequest { password: Some(PASSWORD.into()), ..LoginRequest::trust("postgres", "postgres") }
}

/// Client authentication and the agent key of a test dispatcher.
pub fn secure(settings: &mut bypass_dispatch::config::DispatcherSettings) {
    settings.auth_file = Some(users_file());
    settings.agent_key = Some(AGENT_KEY.into());
}

/// Starts an agent on loopback in front of the PostgreSQL server on `postgres_port`.
pub fn start_agent(postgres_port: u16) -> anyhow::Result<Running<SocketAddr>> {
    let config = AgentConfig {
        listen_addr: "127.0.0.1:0".into(),
        postgres_addr: format!("127.0.0.1:{postgres_port}"),
        key: Some(AGENT_KEY.into()),
        ..AgentConfig::default()
    }
    .validate()?;
    Ok(bypass_dispatch::agent::start(config, None)?)
}

/// A dispatcher configuration on loopback: backends named b0, b1, … at `agents`; database `*`
/// with `primary` and `replicas` (indexes into `agents`).
pub fn dispatcher_config(
    agents: &[SocketAddr],
    primary: usize,
    replicas: &[usize],
) -> anyhow::Result<ValidDispatcherConfig> {
    let mut config = DispatcherConfig::default();
    config.dispatcher.listen_addr = "127.0.0.1:0".into();
    config.dispatcher.health_interval_ms = 100;
    config.dispatcher.health_timeout_ms = 1000;
    secure(&mut config.dispatcher);
    for (i, agent) in agents.iter().enumerate() {
        config.backends.insert(format!("b{i}"), BackendEntry { agent: agent.to_string(), postgres: None, mac: None });
    }
    let replicas = replicas.iter().map(|r| format!("b{r}")).collect();
    config.databases.insert("*".into(), DatabaseEntry { primary: format!("b{primary}"), replicas });
    Ok(config.validate()?)
}

/// A client connection to `address` as the superuser.
pub fn connect(address: SocketAddr) -> anyhow::Result<PgConnection> {
    Ok(PgConnection::connect(address, login(), Duration::from_secs(20))?)
}

/// Polls `ready` every 20 ms for up to `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    while !ready() {
        anyhow::ensure!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

use bypass_dispatch::config::Policy;
use bypass_dispatch::dispatcher::DispatcherInfo;
use bypass_lab::lab::{Lab, LabSpec, AGENT_PORT, SERVICE_PORT, VIP};
use bypass_lab::services::LabPostgres;

/// The whole lab: PostgreSQL and an agent on each backend, the dispatcher on the VIP.
pub struct LabCluster {
    pub dispatcher: Running<DispatcherInfo>,
    pub agents: Vec<Running<SocketAddr>>,
    pub postgres: Vec<LabPostgres>,
    pub lab: Lab,
}

impl LabCluster {
    /// Primary be1, replicas be1 and be2.
    pub fn start(tag: &str, policy: Policy, handover_min_bytes: u64) -> anyhow::Result<LabCluster> {
        LabCluster::start_with(tag, policy, handover_min_bytes, &["be1", "be2"])
    }

    pub fn start_with(
        tag: &str,
        policy: Policy,
        handover_min_bytes: u64,
        replicas: &[&str],
    ) -> anyhow::Result<LabCluster> {
        LabCluster::start_tuned(tag, policy, handover_min_bytes, replicas, |_, _| {})
    }

    /// [`LabCluster::start_with`], with agent and dispatcher settings adjusted by `tune`.
    pub fn start_tuned(
        tag: &str,
        policy: Policy,
        handover_min_bytes: u64,
        replicas: &[&str],
        tune: impl Fn(&mut AgentConfig, &mut bypass_dispatch::config::DispatcherSettings),
    ) -> anyhow::Result<LabCluster> {
        trace();
        let lab = Lab::up_owned(LabSpec { name: unique_lab_name(tag), ..LabSpec::default() })?;
        let mut postgres = Vec::new();
        let mut agents = Vec::new();
        for backend in lab.backends() {
            postgres.push(LabPostgres::start(&backend.namespace, backend.address, None)?);
            let mut config = AgentConfig {
                listen_addr: format!("0.0.0.0:{AGENT_PORT}"),
                key: Some(AGENT_KEY.into()),
                ..AgentConfig::default()
            };
            tune(&mut config, &mut DispatcherConfig::default().dispatcher);
            agents.push(bypass_dispatch::agent::start(config.validate()?, Some(backend.namespace.clone()))?);
        }
        let mut config = DispatcherConfig::default();
        let settings = &mut config.dispatcher;
        settings.listen_addr = format!("{VIP}:{SERVICE_PORT}");
        settings.source_addr = Some(lab.dispatcher().address);
        settings.policy = policy;
        settings.handover_min_bytes = handover_min_bytes;
        settings.steer_namespace = Some(lab.switch_namespace());
        settings.steer_ports = lab.clients().iter().map(|c| c.switch_port.clone()).collect();
        secure(settings);
        for backend in lab.backends() {
            let entry = BackendEntry {
                agent: format!("{}:{AGENT_PORT}", backend.address),
                postgres: Some(format!("{}:{}", backend.address, bypass_lab::lab::POSTGRES_PORT)),
                mac: Some(bypass_lab::lab::format_mac(backend.mac)),
            };
            config.backends.insert(backend.short.clone(), entry);
        }
        let replicas = replicas.iter().map(|r| r.to_string()).collect();
        config.databases.insert("*".into(), DatabaseEntry { primary: "be1".into(), replicas });
        tune(&mut AgentConfig::default(), &mut config.dispatcher);
        let dispatcher = bypass_dispatch::dispatcher::start(config.validate()?, Some(lab.dispatcher().namespace))?;
        Ok(LabCluster { dispatcher, agents, postgres, lab })
    }

    pub fn service(&self) -> SocketAddr {
        SocketAddr::from((VIP, SERVICE_PORT))
    }

    pub fn shared(&self) -> &bypass_dispatch::dispatcher::Shared {
        &self.dispatcher.ready.shared
    }

    pub fn stat(&self, read: impl Fn(&bypass_dispatch::dispatcher::Stats) -> &std::sync::atomic::AtomicU64) -> u64 {
        read(&self.dispatcher.ready.shared.stats).load(Ordering::Relaxed)
    }
}

/// TCP resets sent in every host namespace of the lab, with the PAWS rejections.
pub fn resets(lab: &Lab) -> anyhow::Result<(u64, u64)> {
    let mut resets = 0;
    let mut paws = 0;
    for host in lab.hosts() {
        let counters = bypass_lab::lab::tcp_counters(&host.namespace)?;
        resets += counters.get("OutRsts").copied().unwrap_or(0);
        paws += counters.get("PAWSEstabRejected").copied().unwrap_or(0);
    }
    Ok((resets, paws))
}
