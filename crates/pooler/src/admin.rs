//! The admin console: the virtual database `bypass` (alias `pgbouncer`, so PgBouncer tooling
//! works), spoken over the simple query protocol.
//!
//! ```text
//!  login (database bypass|pgbouncer, user in admin_users/stats_users) ─► Console
//!    'Q' "SHOW POOLS; PAUSE app" ─► one command per statement ─► rows + CommandComplete … 'Z'
//! ```
//! Column names follow PgBouncer's where the two overlap. `stats_users` may only run `SHOW`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bypass_wire::backend::build;
use bypass_wire::tag;
use bypass_wire::{Severity, SqlState, TransactionStatus};

use crate::cancel::Registration;
use crate::client::ClientSide;
use crate::config::{Applies, PoolMode, PoolerSettings};
use crate::error::PoolerError;
use crate::io::{body, read_message, ReadFailure};
use crate::pool::Pool;
use crate::shared::{Shared, StopRequest};

/// How long `PAUSE` waits for servers in use to come back before it reports a timeout.
const PAUSE_WAIT_MAX: Duration = Duration::from_secs(60);
const PAUSE_POLL: Duration = Duration::from_millis(20);
/// Statements in one console query.
const STATEMENTS_MAX: usize = 64;

/// True when a client asked for the console instead of a database.
pub fn is_console(database: &str) -> bool {
    database == "bypass" || database == "pgbouncer"
}

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every command.
    Admin,
    /// `SHOW` only.
    Stats,
}

/// The console access `user` has, if any.
pub fn access(settings: &PoolerSettings, user: &str) -> Option<Access> {
    if settings.admin_users.iter().any(|admin| admin == user) {
        Some(Access::Admin)
    } else if settings.stats_users.iter().any(|stats| stats == user) {
        Some(Access::Stats)
    } else {
        None
    }
}

/// The end of a console login: AuthenticationOk, a few parameters, the key, ReadyForQuery.
pub async fn welcome(client: &mut ClientSide, registration: &Registration) -> Result<(), PoolerError> {
    client.out.clear();
    build::authentication(&mut client.out, &bypass_wire::Authentication::Ok);
    let version = format!("15.0 (bypass {})", env!("CARGO_PKG_VERSION"));
    let parameters = [
        ("server_version", version.as_str()),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
    ];
    for (name, value) in parameters {
        build::parameter_status(&mut client.out, name.as_bytes(), value.as_bytes());
    }
    build::backend_key_data(&mut client.out, registration.entry.process_id, &registration.entry.secret);
    build::ready_for_query(&mut client.out, TransactionStatus::Idle);
    client.flush().await
}

/// A logged-in console client.
pub struct Console {
    shared: Arc<Shared>,
    access: Access,
    registration: Registration,
}

/// A result set: column names and rows of text values.
struct Table {
    columns: &'static [&'static str],
    rows: Vec<Vec<String>>,
}

/// What one console statement produced.
enum Outcome {
    Rows(Table),
    Done(&'static str),
}

impl Console {
    pub fn new(shared: Arc<Shared>, access: Access, registration: Registration) -> Self {
        Console { shared, access, registration }
    }

    /// Who the console user is (for log lines).
    pub fn client(&self) -> &crate::cancel::ClientInfo {
        &self.registration.entry.info
    }

    /// Answers queries until the client leaves.
    pub async fn run(self, client: &mut ClientSide) -> Result<(), PoolerError> {
        let limit = self.shared.live().settings.message_size_max;
        loop {
            let header = match read_message(&mut client.stream, &mut client.buffer, limit).await {
                Ok(header) => header,
                Err(ReadFailure::Io(_)) => return Ok(()),
                Err(ReadFailure::Protocol(error)) => return Err(PoolerError::ClientProtocol(error)),
            };
            let sql = String::from_utf8_lossy(body(&client.buffer, header)).trim_end_matches('\0').to_owned();
            client.buffer.consume(header.frame_len());
            client.out.clear();
            match header.tag {
                tag::frontend::QUERY => self.query(&sql, &mut client.out).await,
                tag::frontend::TERMINATE => return Ok(()),
                tag::frontend::SYNC => build::ready_for_query(&mut client.out, TransactionStatus::Idle),
                tag::frontend::FLUSH => {}
                _ => error(
                    &mut client.out,
                    SqlState::FEATURE_NOT_SUPPORTED,
                    "the admin console speaks the simple query protocol only",
                ),
            }
            client.flush().await?;
        }
    }

    /// Runs each `;`-separated statement; the first error ends the query, as in PostgreSQL.
    async fn query(&self, sql: &str, out: &mut Vec<u8>) {
        let statements: Vec<&str> = sql.split(';').map(str::trim).filter(|s| !s.is_empty()).collect();
        if statements.is_empty() {
            bypass_wire::BackendMessage::EmptyQueryResponse.encode(out);
        } else if statements.len() > STATEMENTS_MAX {
            error(out, SqlState::PROGRAM_LIMIT_EXCEEDED, "too many statements in one query");
        }
        for statement in statements.iter().take(STATEMENTS_MAX) {
            match self.execute(statement).await {
                Ok(Outcome::Rows(table)) => write_table(out, &table),
                Ok(Outcome::Done(tag)) => build::command_complete(out, tag),
                Err((code, text)) => {
                    error(out, code, &text);
                    break;
                }
            }
        }
        build::ready_for_query(out, TransactionStatus::Idle);
    }

    async fn execute(&self, statement: &str) -> Result<Outcome, (SqlState, String)> {
        let words: Vec<String> = statement.split_whitespace().map(str::to_ascii_uppercase).collect();
        let (command, argument) = (words[0].as_str(), statement.split_whitespace().nth(1));
        if command == "SHOW" {
            let what = words.get(1).map(String::as_str).unwrap_or("");
            return self.show(what).map(Outcome::Rows);
        }
        if self.access != Access::Admin {
            return Err((SqlState::INSUFFICIENT_PRIVILEGE, "admin access needed: only SHOW is allowed".into()));
        }
        match command {
            "PAUSE" => self.pause(argument).await.map(|_| Outcome::Done("PAUSE")),
            "RESUME" => self.each_pool(argument, |pool| pool.set_paused(false)).map(|_| Outcome::Done("RESUME")),
            "RECONNECT" => self.each_pool(argument, Pool::reconnect).map(|_| Outcome::Done("RECONNECT")),
            "KILL" => self.kill(argument).map(|_| Outcome::Done("KILL")),
            "RELOAD" => self.reload().map(|_| Outcome::Done("RELOAD")),
            "SHUTDOWN" => {
                let graceful = words.get(1).is_some_and(|word| word == "WAIT_FOR_SERVERS");
                self.shared.request_stop(if graceful { StopRequest::Graceful } else { StopRequest::Immediate });
                Ok(Outcome::Done("SHUTDOWN"))
            }
            _ => Err((SqlState::SYNTAX_ERROR, format!("unknown admin command: {statement}"))),
        }
    }

    fn show(&self, what: &str) -> Result<Table, (SqlState, String)> {
        match what {
            "POOLS" => Ok(show_pools(&self.shared)),
            "CLIENTS" => Ok(show_clients(&self.shared)),
            "SERVERS" => Ok(show_servers(&self.shared)),
            "STATS" => Ok(show_stats(&self.shared)),
            "DATABASES" => Ok(show_databases(&self.shared)),
            "CONFIG" => Ok(show_config(&self.shared.live().settings)),
            "VERSION" => Ok(Table { columns: &["version"], rows: vec![vec![version()]] }),
            _ => Err((SqlState::SYNTAX_ERROR, format!("unknown SHOW item: {what}"))),
        }
    }

    /// The pools of `database` (or all), or an error naming an unknown database.
    fn pools(&self, database: Option<&str>) -> Result<Vec<Arc<Pool>>, (SqlState, String)> {
        let pools: Vec<Arc<Pool>> =
            self.shared.pools().into_iter().filter(|pool| database.is_none_or(|db| pool.key.database == db)).collect();
        let known = database.is_none_or(|db| self.shared.live().databases.contains_key(db) || !pools.is_empty());
        match known {
            true => Ok(pools),
            false => Err((SqlState::INVALID_CATALOG_NAME, format!("no such database: {}", database.unwrap_or("")))),
        }
    }

    fn each_pool(&self, database: Option<&str>, action: impl Fn(&Pool)) -> Result<(), (SqlState, String)> {
        self.pools(database)?.iter().for_each(|pool| action(pool));
        Ok(())
    }

    /// Pauses the pools, then waits until none of their servers is in use (as PgBouncer).
    async fn pause(&self, database: Option<&str>) -> Result<(), (SqlState, String)> {
        let pools = self.pools(database)?;
        pools.iter().for_each(|pool| pool.set_paused(true));
        let deadline = Instant::now() + PAUSE_WAIT_MAX;
        loop {
            let busy: u32 = pools.iter().map(|pool| pool.active_servers()).sum();
            if busy == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err((SqlState::QUERY_CANCELED, format!("PAUSE timed out: {busy} servers still in use")));
            }
            tokio::time::sleep(PAUSE_POLL).await;
        }
    }

    /// Disconnects every client of the database and closes its servers.
    fn kill(&self, database: Option<&str>) -> Result<(), (SqlState, String)> {
        let database = database.ok_or((SqlState::SYNTAX_ERROR, "KILL needs a database name".to_owned()))?;
        let pools = self.pools(Some(database))?;
        self.shared.cancel.kill(|client| client.database == database);
        pools.iter().for_each(|pool| pool.reconnect());
        Ok(())
    }

    fn reload(&self) -> Result<(), (SqlState, String)> {
        match self.shared.reload_from_file() {
            Ok(report) => {
                tracing::info!(?report, "configuration reloaded from the console");
                Ok(())
            }
            Err(problem) => {
                Err((SqlState::CONFIG_FILE_ERROR, format!("reload refused, configuration unchanged: {problem}")))
            }
        }
    }
}

fn error(out: &mut Vec<u8>, code: SqlState, text: &str) {
    build::error(out, Severity::Error, code, text);
}

fn write_table(out: &mut Vec<u8>, table: &Table) {
    build::text_row_description(out, table.columns);
    for row in &table.rows {
        let values: Vec<Option<&[u8]>> = row.iter().map(|value| Some(value.as_bytes())).collect();
        build::data_row(out, &values);
    }
    build::command_complete(out, "SHOW");
}

fn version() -> String {
    format!("Bypass {}", env!("CARGO_PKG_VERSION"))
}

fn mode_name(mode: PoolMode) -> String {
    match mode {
        PoolMode::Session => "session".into(),
        PoolMode::Transaction => "transaction".into(),
    }
}

fn unix_seconds(at: SystemTime) -> String {
    at.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default().to_string()
}

fn show_pools(shared: &Shared) -> Table {
    let now = Instant::now();
    let rows = sorted_pools(shared)
        .iter()
        .map(|pool| {
            let (open, idle, waiting) = pool.counts();
            let clients = pool.stats.clients.load(std::sync::atomic::Ordering::Relaxed);
            let wait = pool.longest_wait(now);
            vec![
                pool.key.database.clone(),
                pool.key.user.clone(),
                clients.saturating_sub(waiting).to_string(),
                waiting.to_string(),
                (open - idle).to_string(),
                idle.to_string(),
                wait.as_secs().to_string(),
                wait.subsec_micros().to_string(),
                mode_name(pool.settings.mode),
                if pool.is_paused() { "yes".into() } else { "no".into() },
            ]
        })
        .collect();
    let columns = &[
        "database",
        "user",
        "cl_active",
        "cl_waiting",
        "sv_active",
        "sv_idle",
        "maxwait",
        "maxwait_us",
        "pool_mode",
        "paused",
    ];
    Table { columns, rows }
}

fn sorted_pools(shared: &Shared) -> Vec<Arc<Pool>> {
    let mut pools = shared.pools();
    pools.sort_by(|a, b| (&a.key.database, &a.key.user).cmp(&(&b.key.database, &b.key.user)));
    pools
}

fn show_clients(shared: &Shared) -> Table {
    let mut entries = shared.cancel.entries();
    entries.sort_by_key(|entry| entry.info.connected_at);
    let rows = entries
        .iter()
        .map(|entry| {
            let info = &entry.info;
            let state = if entry.route().is_some() { "active" } else { "idle" };
            vec![
                "C".into(),
                info.user.clone(),
                info.database.clone(),
                state.into(),
                info.peer.map(|a| a.ip().to_string()).unwrap_or_default(),
                info.peer.map(|a| a.port().to_string()).unwrap_or_default(),
                info.local.map(|a| a.ip().to_string()).unwrap_or_default(),
                info.local.map(|a| a.port().to_string()).unwrap_or_default(),
                unix_seconds(info.connected_at),
                entry.process_id.to_string(),
                entry.route().map(|route| route.key.process_id.to_string()).unwrap_or_default(),
            ]
        })
        .collect();
    let columns = &[
        "type",
        "user",
        "database",
        "state",
        "addr",
        "port",
        "local_addr",
        "local_port",
        "connect_time",
        "ptr",
        "link",
    ];
    Table { columns, rows }
}

fn show_servers(shared: &Shared) -> Table {
    let mut rows = Vec::new();
    for entry in shared.cancel.entries() {
        if let Some(route) = entry.route() {
            let info = &entry.info;
            rows.push(server_row(
                &info.user,
                &info.database,
                "active",
                route.address,
                route.key.process_id,
                entry.process_id,
            ));
        }
    }
    for pool in sorted_pools(shared) {
        for (process_id, _) in pool.idle_servers() {
            rows.push(server_row(&pool.key.user, &pool.key.database, "idle", pool.target.address, process_id, 0));
        }
    }
    Table { columns: &["type", "user", "database", "state", "addr", "port", "remote_pid", "link"], rows }
}

fn server_row(
    user: &str,
    database: &str,
    state: &str,
    address: std::net::SocketAddr,
    pid: i32,
    link: i32,
) -> Vec<String> {
    let link = if link == 0 { String::new() } else { link.to_string() };
    vec![
        "S".into(),
        user.into(),
        database.into(),
        state.into(),
        address.ip().to_string(),
        address.port().to_string(),
        pid.to_string(),
        link,
    ]
}

/// PgBouncer's columns, then where the kernel fast path moved the bytes: `kernel_*` were
/// forwarded socket to socket inside the kernel, `passed_*` were handed up to user space (which
/// read and relayed them); request bytes and messages run client to server, answer bytes and
/// messages server to client; `*_requests` count Query, Sync and FunctionCall messages (each
/// asks for a ReadyForQuery), `*_answers` the ReadyForQuery messages. Pools that do not run in
/// the kernel show zeros there.
fn show_stats(shared: &Shared) -> Table {
    let mut by_database: std::collections::BTreeMap<String, crate::stats::PoolTotals> = Default::default();
    for pool in shared.pools() {
        let totals = pool.totals();
        let sum = by_database.entry(pool.key.database.clone()).or_default();
        sum.transactions += totals.transactions;
        sum.queries += totals.queries;
        sum.bytes_received += totals.bytes_received;
        sum.bytes_sent += totals.bytes_sent;
        sum.transaction_time.sum_us += totals.transaction_time.sum_us;
        sum.wait.sum_us += totals.wait.sum_us;
        sum.wait.count += totals.wait.count;
        if let Some(kernel) = &totals.kernel {
            sum.kernel.get_or_insert_with(Default::default).add(kernel);
        }
    }
    let average = |sum: u64, count: u64| sum.checked_div(count).unwrap_or(0);
    let rows = by_database
        .into_iter()
        .map(|(database, t)| {
            let k = t.kernel.unwrap_or_default();
            let mut row = vec![
                database,
                t.transactions.to_string(),
                t.queries.to_string(),
                t.bytes_received.to_string(),
                t.bytes_sent.to_string(),
                t.transaction_time.sum_us.to_string(),
                t.wait.sum_us.to_string(),
                average(t.transaction_time.sum_us, t.transactions).to_string(),
                average(t.wait.sum_us, t.wait.count).to_string(),
            ];
            row.extend(
                [
                    k.request_bytes_forwarded,
                    k.request_messages_forwarded,
                    k.requests_forwarded,
                    k.request_bytes_passed,
                    k.request_messages_passed,
                    k.requests_passed,
                    k.answer_bytes_forwarded,
                    k.answer_messages_forwarded,
                    k.answers_forwarded,
                    k.answer_bytes_passed,
                    k.answer_messages_passed,
                    k.answers_passed,
                ]
                .map(|value| value.to_string()),
            );
            row
        })
        .collect();
    let columns = &[
        "database",
        "total_xact_count",
        "total_query_count",
        "total_received",
        "total_sent",
        "total_xact_time",
        "total_wait_time",
        "avg_xact_time",
        "avg_wait_time",
        "kernel_request_bytes",
        "kernel_request_msgs",
        "kernel_requests",
        "passed_request_bytes",
        "passed_request_msgs",
        "passed_requests",
        "kernel_answer_bytes",
        "kernel_answer_msgs",
        "kernel_answers",
        "passed_answer_bytes",
        "passed_answer_msgs",
        "passed_answers",
    ];
    Table { columns, rows }
}

fn show_databases(shared: &Shared) -> Table {
    let live = shared.live();
    let pools = shared.pools();
    let rows = live
        .databases
        .iter()
        .map(|(name, entry)| {
            let ours: Vec<&Arc<Pool>> = pools.iter().filter(|pool| &pool.key.database == name).collect();
            let current: u32 = ours.iter().map(|pool| pool.counts().0).sum();
            let paused = !ours.is_empty() && ours.iter().all(|pool| pool.is_paused());
            vec![
                name.clone(),
                entry.host.clone(),
                entry.port.to_string(),
                entry.dbname.clone().unwrap_or_else(|| name.clone()),
                entry.user.clone().unwrap_or_default(),
                entry.pool_size.unwrap_or(live.settings.default_pool_size).to_string(),
                entry.min_pool_size.unwrap_or(live.settings.min_pool_size).to_string(),
                mode_name(entry.pool_mode.unwrap_or(live.settings.pool_mode)),
                entry.max_db_connections.unwrap_or(live.settings.max_db_connections).to_string(),
                current.to_string(),
                if paused { "1".into() } else { "0".into() },
            ]
        })
        .collect();
    let columns = &[
        "name",
        "host",
        "port",
        "database",
        "force_user",
        "pool_size",
        "min_pool_size",
        "pool_mode",
        "max_connections",
        "current_connections",
        "paused",
    ];
    Table { columns, rows }
}

/// Settings as key, value, default, changeable (by RELOAD).
fn show_config(settings: &PoolerSettings) -> Table {
    let current = toml::Value::try_from(settings).unwrap_or(toml::Value::Table(Default::default()));
    let defaults = toml::Value::try_from(PoolerSettings::default()).unwrap_or(toml::Value::Table(Default::default()));
    let empty = toml::map::Map::new();
    let rows = current
        .as_table()
        .unwrap_or(&empty)
        .iter()
        .map(|(key, value)| {
            let default = defaults.get(key).map(toml_text).unwrap_or_default();
            let restart = PoolerSettings::setting(key).is_some_and(|setting| setting.applies == Applies::Restart);
            let changeable = if restart { "no" } else { "yes" };
            vec![key.clone(), toml_text(value), default, changeable.into()]
        })
        .collect();
    Table { columns: &["key", "value", "default", "changeable"], rows }
}

fn toml_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}
