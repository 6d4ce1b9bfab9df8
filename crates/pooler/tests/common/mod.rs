//! Shared harness for the pooler's integration tests: a real PostgreSQL from the testkit, the
//! pooler running in-process on its own runtime thread, and client helpers (tokio-postgres, psql,
//! pgbench, raw TCP).
#![allow(dead_code)] // Each test binary uses a different subset.

pub mod certs;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use bypass_pooler::config::{AuthType, DatabaseEntry, PoolMode, PoolerSettings};
use bypass_pooler::{Config, Proxy, RunningProxy, Shared};
use bypass_testkit::{pg_bin, Postgres, PostgresOptions, TestUser};
use tokio_postgres::{Client, NoTls};

/// A pooler serving on a free loopback port until dropped, on two shards as in production.
pub struct Pooler {
    pub port: u16,
    pub shared: Arc<Shared>,
    /// Where `/metrics` is served, when `metrics_addr` is set.
    pub metrics: Option<std::net::SocketAddr>,
    running: Option<RunningProxy>,
}

impl Pooler {
    pub fn start(mut config: Config) -> Pooler {
        config.pooler.listen_addr = "127.0.0.1:0".into();
        if config.pooler.workers == 0 {
            config.pooler.workers = 2;
        }
        Pooler::run(config.validate().expect("test configuration is valid"))
    }

    /// Starts with `workers` as given (0: one shard per CPU, pinned).
    pub fn start_as_configured(mut config: Config) -> Pooler {
        config.pooler.listen_addr = "127.0.0.1:0".into();
        Pooler::run(config.validate().expect("test configuration is valid"))
    }

    /// Starts from a file (which must listen on port 0), so RELOAD can read it again.
    pub fn start_from_file(path: &std::path::Path) -> Pooler {
        let pooler = Pooler::run(Config::load(path).expect("test configuration file is valid"));
        *pooler.shared.config_path.lock().expect("not poisoned") = Some(path.to_owned());
        pooler
    }

    fn run(mut valid: bypass_pooler::ValidConfig) -> Pooler {
        let forced = fast_path_override();
        if let Some(mode) = forced {
            valid.config.pooler.fast_path = mode;
        }
        if std::env::var("BYPASS_TEST_FAST_PATH").as_deref() == Ok("kernel-queue") {
            valid.config.pooler.fast_path_queue_behind = true;
        }
        let proxy = Proxy::bind(valid).expect("bind");
        let metrics = proxy.metrics_addr();
        let running = proxy.start().expect("start shards");
        // The kernel-mode run proves nothing if the programs quietly failed to load (the pooler
        // then serves everyone in user space): it must fail instead.
        if forced == Some(bypass_pooler::config::FastPathMode::Kernel) {
            assert!(
                running.shared().fastpath.is_some(),
                "BYPASS_TEST_FAST_PATH=kernel but the fast-path programs did not load (needs root, Linux 6.x)"
            );
        }
        Pooler { port: running.local_addr().port(), shared: running.shared(), metrics, running: Some(running) }
    }

    /// The running pooler, for a test that stops it.
    pub fn take_running(&mut self) -> RunningProxy {
        self.running.take().expect("still running")
    }
}

/// A trust configuration that sends every database to `postgres`.
pub fn config(postgres: &Postgres, mode: PoolMode, pool_size: u32) -> Config {
    Config {
        pooler: PoolerSettings {
            pool_mode: mode,
            auth_type: AuthType::Trust,
            default_pool_size: pool_size,
            max_client_conn: 2_000,
            query_wait_timeout_ms: 20_000,
            ..PoolerSettings::default()
        },
        databases: [("*".to_owned(), DatabaseEntry { port: postgres.port(), ..DatabaseEntry::default() })].into(),
        users: Default::default(),
    }
}

/// `BYPASS_TEST_FAST_PATH=kernel` runs the whole suite with the kernel fast path (scripts/test.sh
/// runs the pooler's tests once more that way); `kernel-queue` also turns on
/// `fast_path_queue_behind`.
pub fn fast_path_override() -> Option<bypass_pooler::config::FastPathMode> {
    match std::env::var("BYPASS_TEST_FAST_PATH").ok()?.as_str() {
        "kernel" | "kernel-queue" => Some(bypass_pooler::config::FastPathMode::Kernel),
        "user" => Some(bypass_pooler::config::FastPathMode::User),
        other => panic!("BYPASS_TEST_FAST_PATH must be kernel, kernel-queue or user, not {other}"),
    }
}

pub fn postgres() -> Postgres {
    Postgres::start().expect("PostgreSQL starts")
}

pub fn postgres_with_users(users: Vec<TestUser>) -> Postgres {
    Postgres::start_with(PostgresOptions { users, ..PostgresOptions::default() }).expect("PostgreSQL starts")
}

pub const BOTH_MODES: [PoolMode; 2] = [PoolMode::Session, PoolMode::Transaction];

/// Connects with tokio-postgres and drives the connection in the background.
pub async fn connect(port: u16, user: &str, password: Option<&str>) -> Result<Client, tokio_postgres::Error> {
    connect_db(port, user, password, "postgres").await
}

/// [`connect`] to another database (the admin console is `bypass`).
pub async fn connect_db(
    port: u16,
    user: &str,
    password: Option<&str>,
    database: &str,
) -> Result<Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(port).user(user).dbname(database).connect_timeout(Duration::from_secs(30));
    if let Some(password) = password {
        config.password(password);
    }
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

pub async fn connect_ok(port: u16) -> Client {
    connect(port, "postgres", None).await.expect("connects through the pooler")
}

/// The SQLSTATE of a failed call, as text.
pub fn sqlstate(error: &tokio_postgres::Error) -> Option<String> {
    error.as_db_error().map(|db| db.code().code().to_owned())
}

pub fn psql(port: u16, user: &str, password: Option<&str>, sql: &str) -> Output {
    psql_db(port, user, password, "postgres", sql)
}

pub fn psql_db(port: u16, user: &str, password: Option<&str>, database: &str, sql: &str) -> Output {
    let mut command = Command::new(pg_bin("psql"));
    command.args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", user, "-d", database, "-c", sql]);
    command.arg("-p").arg(port.to_string());
    command.env("PGCONNECT_TIMEOUT", "20");
    match password {
        Some(password) => command.env("PGPASSWORD", password),
        None => command.env_remove("PGPASSWORD"),
    };
    command.output().expect("psql runs")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).trim().to_owned()
}

/// Creates pgbench's tables (scale 1) directly in PostgreSQL.
pub fn init_pgbench(postgres: &bypass_testkit::Postgres) {
    let port = postgres.port().to_string();
    let init = std::process::Command::new(bypass_testkit::pg_bin("pgbench"))
        .args(["-i", "-q", "-s", "1", "-h", "127.0.0.1", "-U", "postgres", "-p", &port, "postgres"])
        .output()
        .expect("pgbench -i");
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
}

/// Runs pgbench against `port` and returns (processed transactions, failed transactions, output).
pub fn pgbench(port: u16, args: &[&str]) -> (u64, u64, String) {
    let output = Command::new(pg_bin("pgbench"))
        .args(["-n", "-h", "127.0.0.1", "-U", "postgres"])
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .arg("postgres")
        .output()
        .expect("pgbench runs");
    let text = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "pgbench failed:\n{text}");
    let number_after = |label: &str| -> u64 {
        text.lines()
            .find_map(|line| line.trim().strip_prefix(label))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.split('/').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("pgbench output lacks {label:?}:\n{text}"))
    };
    (number_after("number of transactions actually processed:"), number_after("number of failed transactions:"), text)
}

/// A raw TCP client for sending bytes no driver would.
pub struct RawClient {
    pub stream: TcpStream,
}

impl RawClient {
    pub fn connect(port: u16) -> RawClient {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("raw connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        RawClient { stream }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("raw send");
    }

    /// Logs in as `postgres` with trust and reads up to ReadyForQuery.
    pub fn login(port: u16) -> RawClient {
        let mut client = RawClient::connect(port);
        let mut startup = Vec::new();
        bypass_wire::startup::encode_startup(&mut startup, &[("user", "postgres"), ("database", "postgres")]);
        client.send(&startup);
        let messages = client.read_until(b'Z');
        assert!(messages.iter().any(|(tag, _)| *tag == b'R'), "no authentication message");
        client
    }

    /// Reads messages until one with `tag` (inclusive) or EOF; returns (tag, body) pairs.
    pub fn read_until(&mut self, tag: u8) -> Vec<(u8, Vec<u8>)> {
        let mut messages = Vec::new();
        while let Some(message) = self.read_message() {
            let done = message.0 == tag;
            messages.push(message);
            if done {
                break;
            }
        }
        messages
    }

    /// Reads one message; `None` on EOF.
    pub fn read_message(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut header = [0u8; 5];
        self.stream.read_exact(&mut header).ok()?;
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; length - 4];
        self.stream.read_exact(&mut body).ok()?;
        Some((header[0], body))
    }

    /// True once the peer has closed the connection (EOF after draining what is left).
    pub fn is_closed(&mut self) -> bool {
        let mut sink = [0u8; 1024];
        loop {
            match self.stream.read(&mut sink) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
    }
}

/// The SQLSTATE (field 'C') of an ErrorResponse body.
pub fn error_code(body: &[u8]) -> String {
    error_field(body, b'C')
}

/// One field of an ErrorResponse body ('C' SQLSTATE, 'M' message, 'S' severity); empty if absent.
pub fn error_field(body: &[u8], wanted: u8) -> String {
    let mut rest = body;
    while let Some((&field, tail)) = rest.split_first() {
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        if field == wanted {
            return String::from_utf8_lossy(&tail[..end]).into_owned();
        }
        rest = tail.get(end + 1..).unwrap_or_default();
    }
    String::new()
}
