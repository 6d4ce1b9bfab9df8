//! The admin console: the virtual database `bypass` (alias `pgbouncer`, so PgBouncer tooling
//! works), spoken over the simple query protocol.
//!
//! ```text
//!  login (database bypass|pgbouncer, user in admin_users/stats_users) ─► Console
//!    'Q' "SHOW POOLS; PAUSE app" ─► one command per statement ─► rows + CommandComplete … 'Z'
//! ```
//! `SHOW` tables ([`show`]) carry PgBouncer 1.25's column sets. `stats_users` may only run `SHOW`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bypass_wire::backend::build;
use bypass_wire::tag;
use bypass_wire::{Severity, SqlState, TransactionStatus};

use crate::cancel::Registration;
use crate::client::ClientSide;
use crate::config::PoolerSettings;
use crate::error::PoolerError;
use crate::io::{body, read_message, ReadFailure};
use crate::pool::Pool;
use crate::shared::{Shared, StopRequest};

pub mod show;
use show::Table;

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

/// What one console statement produced.
enum Outcome {
    Rows(Table),
    Done(&'static str),
    /// A NOTICE, then the command tag (`SHOW HELP`).
    Notice(String, &'static str),
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
                Ok(Outcome::Notice(text, tag)) => {
                    build::notice(out, SqlState::SUCCESSFUL_COMPLETION, &text);
                    build::command_complete(out, tag);
                }
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
            return self.show(what);
        }
        if self.access != Access::Admin {
            return Err((SqlState::INSUFFICIENT_PRIVILEGE, "admin access needed: only SHOW is allowed".into()));
        }
        match command {
            "PAUSE" => self.pause(argument).await.map(|_| Outcome::Done("PAUSE")),
            "RESUME" => self.resume(argument).map(|_| Outcome::Done("RESUME")),
            "SUSPEND" => self.suspend().await.map(|_| Outcome::Done("SUSPEND")),
            "DISABLE" | "ENABLE" => self
                .enable(command == "ENABLE", argument)
                .map(|_| Outcome::Done(if command == "ENABLE" { "ENABLE" } else { "DISABLE" })),
            "RECONNECT" => self.each_pool(argument, Pool::reconnect).map(|_| Outcome::Done("RECONNECT")),
            "WAIT_CLOSE" => self.wait_close(argument).await.map(|_| Outcome::Done("WAIT_CLOSE")),
            "KILL" => self.kill(argument).map(|_| Outcome::Done("KILL")),
            "RELOAD" => self.reload().map(|_| Outcome::Done("RELOAD")),
            "SHUTDOWN" => {
                let graceful = words.get(1).is_some_and(|word| word == "WAIT_FOR_SERVERS");
                self.shared.request_stop(if graceful { StopRequest::Graceful } else { StopRequest::Immediate });
                Ok(Outcome::Done("SHUTDOWN"))
            }
            _ => Err((SqlState::SYNTAX_ERROR, format!("unknown admin command: {statement} (SHOW HELP lists them)"))),
        }
    }

    fn show(&self, what: &str) -> Result<Outcome, (SqlState, String)> {
        let shared = &self.shared;
        let table = match what {
            "HELP" => return Ok(Outcome::Notice(help(), "SHOW")),
            "POOLS" => show::pools(shared),
            "CLIENTS" => show::clients(shared),
            "SERVERS" => show::servers(shared),
            "STATS" => show::stats(shared),
            "STATS_TOTALS" => show::stats_totals(shared),
            "STATS_AVERAGES" => show::stats_averages(shared),
            "TOTALS" => show::totals(shared),
            "DATABASES" => show::databases(shared),
            "USERS" => show::users(shared),
            "LISTS" => show::lists(shared),
            "MEM" => show::mem(shared),
            "SOCKETS" => show::sockets(shared, false),
            "ACTIVE_SOCKETS" => show::sockets(shared, true),
            "STATE" => show::state(shared),
            "DNS_HOSTS" => show::empty(&["hostname", "ttl", "addrs"]),
            "DNS_ZONES" => show::empty(&["zonename", "serial", "count"]),
            "CONFIG" => show::config(&shared.live().settings),
            "VERSION" => Table::new(&["version"], vec![vec![show::version()]]),
            "FDS" => {
                return Err((
                    SqlState::FEATURE_NOT_SUPPORTED,
                    "SHOW FDS lists sockets for PgBouncer's online restart by descriptor passing, which Bypass \
                     does not do; SHOW SOCKETS lists every connection"
                        .into(),
                ))
            }
            _ => return Err((SqlState::SYNTAX_ERROR, format!("unknown SHOW item: {what} (SHOW HELP lists them)"))),
        };
        Ok(Outcome::Rows(table))
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

    /// RESUME [db]: resumes paused pools; without a database also a SUSPEND.
    fn resume(&self, database: Option<&str>) -> Result<(), (SqlState, String)> {
        if database.is_none() {
            self.shared.set_suspended(false);
        }
        self.each_pool(database, |pool| pool.set_paused(false))
    }

    /// SUSPEND: stops accepting new clients and pauses every pool, waiting for servers in use to
    /// come back (as PAUSE); RESUME undoes both.
    async fn suspend(&self) -> Result<(), (SqlState, String)> {
        self.shared.set_suspended(true);
        self.pause(None).await
    }

    /// ENABLE/DISABLE db: a disabled database refuses new logins; connected clients stay.
    fn enable(&self, enable: bool, database: Option<&str>) -> Result<(), (SqlState, String)> {
        let verb = if enable { "ENABLE" } else { "DISABLE" };
        let database = database.ok_or((SqlState::SYNTAX_ERROR, format!("{verb} needs a database name")))?;
        self.pools(Some(database))?;
        self.shared.set_disabled(database, !enable);
        Ok(())
    }

    /// WAIT_CLOSE [db]: waits until every server RECONNECT or a reload marked for closing is gone.
    async fn wait_close(&self, database: Option<&str>) -> Result<(), (SqlState, String)> {
        let pools = self.pools(database)?;
        let deadline = Instant::now() + PAUSE_WAIT_MAX;
        loop {
            let left: u32 =
                pools.iter().map(|pool| pool.servers_to_close()).sum::<u32>() + self.shared.replaced_servers(database);
            if left == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err((SqlState::QUERY_CANCELED, format!("WAIT_CLOSE timed out: {left} servers still open")));
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
        let values: Vec<Option<&[u8]>> = row.iter().map(|value| value.as_deref().map(str::as_bytes)).collect();
        build::data_row(out, &values);
    }
    build::command_complete(out, "SHOW");
}

/// The text of `SHOW HELP`.
fn help() -> String {
    format!(
        "Console usage\n\tSHOW {}\n\tSHOW FDS (refused: no descriptor passing)\n\tPAUSE [db]\n\tRESUME [db]\n\t\
         SUSPEND\n\tDISABLE db\n\tENABLE db\n\tRECONNECT [db]\n\tWAIT_CLOSE [db]\n\tKILL db\n\tRELOAD\n\t\
         SHUTDOWN [WAIT_FOR_SERVERS]",
        show::ITEMS.iter().filter(|item| **item != "FDS").copied().collect::<Vec<_>>().join("|")
    )
}
