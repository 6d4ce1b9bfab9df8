//! `bypass bench engine-regress`: PostgreSQL's own regression files for select, union, case,
//! join, aggregates, subselect and window (SQL the project did not write; issue 23 point 4)
//! run statement by statement against a real PostgreSQL 15 (the oracle) and the engine's
//! server, written to `bench/results/engine-regress.{json,md,png}`.
//!
//! ```text
//!   crates/bench/engine/regress/sql/<file>.sql ─► script::split (as psql cuts it)
//!     ├─ meta-command / PostgreSQL-only statement ─► out of scope, with its reason (scope.rs)
//!     └─ statement ─► PostgreSQL 15 (testkit) ─┐
//!                  └► engine server ───────────┴─► compare::judge ─► matched | refused | wrong
//!   test_setup.sql first (its tables: onek, tenk1, int4_tbl, …), reported apart from the share
//! ```
//!
//! Both servers get the same statements in the same order on one session per file (both
//! sides reconnect when a connection breaks). A refusal (0A000) counts as not run, never as
//! passed; the share is matched / in-scope statements.

pub mod compare;
mod report;
pub mod scope;
pub mod script;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use crate::report::machine::Machine;
use bypass_engine::{server, Engine, EngineSettings};
use bypass_testkit::Postgres;
use compare::{Answer, Outcome};
use script::Item;

/// The measured files, in the order of PostgreSQL's schedule.
pub const FILES: [&str; 7] = ["select", "union", "case", "join", "aggregates", "subselect", "window"];
/// The suite's setup file (its tables are what the measured files read).
pub const SETUP: &str = "test_setup";
/// Longest wait for one statement's answer before the connection is given up.
const CLIENT_DEADLINE: Duration = Duration::from_secs(120);
/// Login for the engine's server (a throwaway server on loopback).
const ENGINE_USER: &str = "regress";
const ENGINE_PASSWORD: &str = "regress-secret";
/// Characters of a statement's text kept in the report.
const SQL_SHOWN_MAX: usize = 200;

#[derive(clap::Args, Debug, Clone)]
pub struct RegressArgs {
    /// Files of src/test/regress/sql to measure, comma-separated (default: all seven).
    #[arg(long, value_delimiter = ',')]
    pub files: Vec<String>,
    /// Directory holding sql/ and data/ (default: the copy in crates/bench/engine/regress).
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Where engine-regress.{json,md,png} go.
    #[arg(long, default_value = "bench/results")]
    pub out_dir: PathBuf,
}

/// Statements counted by verdict.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Tally {
    pub statements: usize,
    pub out_of_scope: usize,
    /// In scope: sent to both servers.
    pub run: usize,
    pub matched: usize,
    pub refused: usize,
    pub wrong: usize,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        self.statements += 1;
        match outcome {
            Outcome::OutOfScope => self.out_of_scope += 1,
            Outcome::Matched => self.matched += 1,
            Outcome::Refused => self.refused += 1,
            Outcome::Wrong => self.wrong += 1,
        }
        if outcome != Outcome::OutOfScope {
            self.run += 1;
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.statements += other.statements;
        self.out_of_scope += other.out_of_scope;
        self.run += other.run;
        self.matched += other.matched;
        self.refused += other.refused;
        self.wrong += other.wrong;
    }

    /// Matched / in scope (refusals count as not matched).
    pub fn share(&self) -> f64 {
        if self.run == 0 {
            0.0
        } else {
            self.matched as f64 / self.run as f64
        }
    }
}

/// One statement (or meta-command) and its verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatementResult {
    pub file: String,
    pub line: usize,
    /// SELECT / WITH / VALUES / TABLE (the rest: DDL, DML, settings, transactions).
    pub query: bool,
    pub outcome: Outcome,
    /// Why out of scope, the refusal's message, or what differed.
    pub detail: String,
    pub sql: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileReport {
    pub file: String,
    /// test_setup.sql: run first, not part of the share.
    pub setup: bool,
    pub all: Tally,
    pub queries: Tally,
    pub out_of_scope_reasons: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegressReport {
    pub command: String,
    pub started_unix_s: u64,
    pub machine: Machine,
    pub postgres_version: String,
    pub corpus: String,
    pub files: Vec<FileReport>,
    /// Over the measured files (setup excluded).
    pub total: Tally,
    pub total_queries: Tally,
    pub statements: Vec<StatementResult>,
}

/// Runs the corpus and writes the report.
pub fn run(args: &RegressArgs) -> anyhow::Result<RegressReport> {
    let corpus = args.corpus.clone().unwrap_or_else(default_corpus);
    let files = if args.files.is_empty() { FILES.iter().map(|f| f.to_string()).collect() } else { args.files.clone() };
    let mut machine = Machine::now();
    let started_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let plan: Vec<(String, bool)> =
        std::iter::once((SETUP.to_string(), true)).chain(files.into_iter().map(|f| (f, false))).collect();
    let (postgres_version, reports, statements) = measure(&corpus, &plan)?;
    machine.finish();
    let mut total = Tally::default();
    let mut total_queries = Tally::default();
    for file in reports.iter().filter(|f| !f.setup) {
        total.merge(&file.all);
        total_queries.merge(&file.queries);
    }
    let report = RegressReport {
        command: crate::report::machine::command_line(),
        started_unix_s,
        machine,
        postgres_version,
        corpus: "PostgreSQL 15.18 src/test/regress (crates/bench/engine/regress)".into(),
        files: reports,
        total,
        total_queries,
        statements,
    };
    let markdown = report::markdown(&report);
    crate::report::write(&args.out_dir, "engine-regress", &report, &markdown, |png| report::plot(&report, png))?;
    Ok(report)
}

/// Runs `plan`'s files (name, is setup) in order on one pair of servers: PostgreSQL's version,
/// each file's report, every statement's verdict.
fn measure(corpus: &Path, plan: &[(String, bool)]) -> anyhow::Result<(String, Vec<FileReport>, Vec<StatementResult>)> {
    let staged = stage(corpus)?;
    let servers = Servers::start()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let version = servers.postgres_version().await?;
        let mut statements = Vec::new();
        let mut reports = Vec::new();
        for (file, setup) in plan {
            let path = corpus.join("sql").join(format!("{file}.sql"));
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            eprintln!("engine-regress: {file}.sql …");
            let report = run_file(&servers, file, *setup, &text, staged.path(), &mut statements).await?;
            let all = &report.all;
            eprintln!(
                "engine-regress: {file}: {} in scope, {} matched, {} refused, {} wrong, {} out of scope",
                all.run, all.matched, all.refused, all.wrong, all.out_of_scope
            );
            reports.push(report);
        }
        anyhow::Ok((version, reports, statements))
    })
}

/// The corpus shipped with the crate.
pub fn default_corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/regress")
}

/// A directory both servers can read (PostgreSQL runs as its own OS user): the data files,
/// and later the rows of COPY … FROM stdin.
fn stage(corpus: &Path) -> anyhow::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let staged = tempfile::Builder::new().prefix("bypass-regress-").tempdir()?;
    let data = staged.path().join("data");
    std::fs::create_dir(&data)?;
    for dir in [staged.path(), data.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    let source = corpus.join("data");
    for entry in std::fs::read_dir(&source).with_context(|| format!("reading {}", source.display()))? {
        let entry = entry?;
        let target = data.join(entry.file_name());
        std::fs::copy(entry.path(), &target)?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(staged)
}

/// The oracle and the engine's server.
struct Servers {
    postgres: Postgres,
    _engine_server: server::Server,
    engine_address: SocketAddr,
}

impl Servers {
    fn start() -> anyhow::Result<Servers> {
        let postgres = Postgres::start().context("starting PostgreSQL 15")?;
        let engine = Arc::new(Engine::new(EngineSettings::default())?);
        let settings = server::ServerSettings::with_password("127.0.0.1:0".parse()?, ENGINE_USER, ENGINE_PASSWORD);
        let engine_server = server::start(engine, settings)?;
        let engine_address = engine_server.address;
        Ok(Servers { postgres, _engine_server: engine_server, engine_address })
    }

    fn postgres_conninfo(&self) -> String {
        self.postgres.connection_string("postgres", "postgres")
    }

    fn engine_conninfo(&self) -> String {
        format!(
            "host={} port={} user={ENGINE_USER} password={ENGINE_PASSWORD} dbname={}",
            self.engine_address.ip(),
            self.engine_address.port(),
            server::DATABASE_NAME
        )
    }

    async fn postgres_version(&self) -> anyhow::Result<String> {
        let client = connect(&self.postgres_conninfo()).await?;
        match ask(&client, "show server_version").await {
            Answer::Rows { rows, .. } => Ok(rows.first().and_then(|r| r[0].clone()).unwrap_or_default()),
            other => anyhow::bail!("PostgreSQL did not say its version: {other:?}"),
        }
    }
}

async fn connect(conninfo: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls).await?;
    tokio::spawn(async move {
        // Ends with the client; its error is seen as a lost answer by the next statement.
        let _ = connection.await;
    });
    Ok(client)
}

/// One session on each server, reconnected when its connection breaks.
struct Sessions<'a> {
    servers: &'a Servers,
    postgres: Client,
    engine: Client,
}

impl<'a> Sessions<'a> {
    async fn open(servers: &'a Servers) -> anyhow::Result<Sessions<'a>> {
        let postgres = connect(&servers.postgres_conninfo()).await?;
        let engine = connect(&servers.engine_conninfo()).await?;
        Ok(Sessions { servers, postgres, engine })
    }

    async fn both(&mut self, sql: &str) -> anyhow::Result<(Answer, Answer)> {
        if self.postgres.is_closed() {
            self.postgres = connect(&self.servers.postgres_conninfo()).await?;
        }
        if self.engine.is_closed() {
            self.engine = connect(&self.servers.engine_conninfo()).await?;
        }
        let theirs = ask(&self.postgres, sql).await;
        let ours = ask(&self.engine, sql).await;
        if matches!(ours, Answer::Lost(_)) {
            // A statement past the deadline may still run: a new session starts clean.
            self.engine = connect(&self.servers.engine_conninfo()).await?;
        }
        Ok((theirs, ours))
    }
}

async fn ask(client: &Client, sql: &str) -> Answer {
    match tokio::time::timeout(CLIENT_DEADLINE, client.simple_query(sql)).await {
        Err(_) => Answer::Lost(format!("no answer within {} s", CLIENT_DEADLINE.as_secs())),
        Ok(Err(error)) => match error.as_db_error() {
            Some(db) => Answer::Error { code: db.code().code().to_string(), message: db.message().to_string() },
            None => Answer::Lost(error.to_string()),
        },
        Ok(Ok(messages)) => answer_of(messages),
    }
}

fn answer_of(messages: Vec<SimpleQueryMessage>) -> Answer {
    let mut columns = None;
    let mut rows = Vec::new();
    let mut count = 0;
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(description) => columns = Some(description.len()),
            SimpleQueryMessage::Row(row) => {
                columns.get_or_insert(row.len());
                rows.push((0..row.len()).map(|i| row.get(i).map(str::to_string)).collect());
            }
            SimpleQueryMessage::CommandComplete(n) => count = n,
            _ => {}
        }
    }
    match columns {
        Some(columns) => Answer::Rows { columns, rows },
        None => Answer::Done { count },
    }
}

/// psql's variables as far as the corpus uses them: `\getenv abs_srcdir` (the staged corpus)
/// and `\set name :var 'text' …` (concatenation).
#[derive(Default)]
struct Variables {
    values: HashMap<String, String>,
}

impl Variables {
    fn meta(&mut self, command: &str, staged: &Path) {
        let mut words = command.split_whitespace();
        match (words.next(), words.next()) {
            (Some("getenv"), Some("abs_srcdir")) => {
                self.values.insert("abs_srcdir".into(), staged.display().to_string());
            }
            (Some("set"), Some(name)) => {
                let mut value = String::new();
                for part in words {
                    if let Some(variable) = part.strip_prefix(':') {
                        let Some(known) = self.values.get(variable) else { return };
                        value.push_str(known);
                    } else {
                        value.push_str(part.trim_matches('\''));
                    }
                }
                self.values.insert(name.to_string(), value);
            }
            _ => {}
        }
    }

    /// `:'name'` replaced by the quoted value of each known variable.
    fn substitute(&self, sql: &str) -> String {
        let mut sql = sql.to_string();
        for (name, value) in &self.values {
            sql = sql.replace(&format!(":'{name}'"), &format!("'{}'", value.replace('\'', "''")));
        }
        sql
    }
}

/// Errors that follow from an earlier refusal are refusals too (the statement was not run as
/// written): a relation whose CREATE the engine refused, a transaction a refusal aborted, and
/// any wrong answer of a statement that reads a relation whose INSERT or COPY the engine
/// refused (its rows are not PostgreSQL's).
#[derive(Default)]
struct Cascade {
    refused_relations: std::collections::BTreeSet<String>,
    incomplete_relations: std::collections::BTreeSet<String>,
    aborted_by_refusal: bool,
}

impl Cascade {
    fn follow(&mut self, sql: &str, theirs: &Answer, ours: &Answer, verdict: (Outcome, String)) -> (Outcome, String) {
        let postgres_ok = !matches!(theirs, Answer::Error { .. } | Answer::Lost(_));
        let (outcome, detail) = verdict;
        let refused = matches!(ours, Answer::Error { code, .. } if code == compare::REFUSED);
        if outcome == Outcome::Wrong && postgres_ok && !refused {
            let words = scope::words(sql);
            if let Some(relation) = self.incomplete_relations.iter().find(|r| words.contains(r)) {
                return (Outcome::Refused, format!("reads {relation}, whose INSERT or COPY the engine refused"));
            }
        }
        let Answer::Error { code, message } = ours else {
            self.aborted_by_refusal = false;
            return (outcome, detail);
        };
        if code == compare::REFUSED {
            self.aborted_by_refusal = true;
            if postgres_ok {
                self.refused_relations.extend(created_relation(sql));
                self.incomplete_relations.extend(written_relation(sql));
            }
            return (outcome, detail);
        }
        if outcome != Outcome::Wrong || !postgres_ok {
            self.aborted_by_refusal &= code == "25P02";
            return (outcome, detail);
        }
        if code == "25P02" && self.aborted_by_refusal {
            return (Outcome::Refused, "transaction aborted in the engine by an earlier refusal".into());
        }
        self.aborted_by_refusal = false;
        let missing = self.refused_relations.iter().find(|r| message.contains(&format!("\"{r}\"")));
        match (code.as_str(), missing) {
            ("42P01", Some(relation)) => {
                // A CREATE that fails for want of a refused relation is refused too (CREATE
                // TABLE c () INHERITS (p) of a refused p): what reads c follows from it.
                let relation = relation.clone();
                self.refused_relations.extend(created_relation(sql));
                (Outcome::Refused, format!("needs {relation}, whose CREATE the engine refused"))
            }
            _ => (outcome, detail),
        }
    }
}

/// The relation `CREATE [TEMP] TABLE|VIEW [IF NOT EXISTS] name …` creates.
fn created_relation(sql: &str) -> Option<String> {
    let words = scope::words(sql);
    if words.first().map(String::as_str) != Some("create") {
        return None;
    }
    let kind = words.iter().position(|w| w == "table" || w == "view")?;
    words[kind + 1..].iter().find(|w| !matches!(w.as_str(), "if" | "not" | "exists")).cloned()
}

/// The relation `INSERT INTO name …` or `COPY name … FROM …` adds rows to.
fn written_relation(sql: &str) -> Option<String> {
    let words = scope::words(sql);
    match words.as_slice() {
        [insert, into, name, ..] if insert == "insert" && into == "into" => Some(name.clone()),
        [copy, name, rest @ ..] if copy == "copy" && rest.iter().any(|w| w == "from") => Some(name.clone()),
        _ => None,
    }
}

fn is_query(sql: &str) -> bool {
    let first = scope::words(sql).into_iter().next().unwrap_or_default();
    matches!(first.as_str(), "select" | "with" | "values" | "table") || sql.trim_start().starts_with('(')
}

fn shown(sql: &str) -> String {
    let one_line = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > SQL_SHOWN_MAX {
        format!("{}…", one_line.chars().take(SQL_SHOWN_MAX).collect::<String>())
    } else {
        one_line
    }
}

/// `COPY … FROM stdin` with its rows written to a staged file: `COPY … FROM '<file>'`.
fn copy_from_file(sql: &str, data: &str, staged: &Path, name: &str) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = staged.join(name);
    std::fs::write(&path, data)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    let lower = sql.to_ascii_lowercase();
    let at = lower.find("stdin").context("COPY FROM stdin without stdin")?;
    Ok(format!("{}'{}'{}", &sql[..at], path.display(), &sql[at + "stdin".len()..]))
}

async fn run_file(
    servers: &Servers,
    file: &str,
    setup: bool,
    text: &str,
    staged: &Path,
    statements: &mut Vec<StatementResult>,
) -> anyhow::Result<FileReport> {
    let mut sessions = Sessions::open(servers).await?;
    let mut report = FileReport {
        file: file.to_string(),
        setup,
        all: Tally::default(),
        queries: Tally::default(),
        out_of_scope_reasons: BTreeMap::new(),
    };
    let mut variables = Variables::default();
    let mut defined = scope::Defined::default();
    let mut cascade = Cascade::default();
    for item in script::split(text) {
        let (line, sql, outcome, detail) = match item {
            Item::Meta { command, line } => {
                variables.meta(&command, staged);
                (line, format!("\\{command}"), Outcome::OutOfScope, scope::meta_reason(&command))
            }
            Item::Statement { sql, line, copy_data, sent_by } => {
                let sql = variables.substitute(&sql);
                match defined.reason(&sql, sent_by.as_deref()) {
                    Some(reason) => (line, sql, Outcome::OutOfScope, reason),
                    None => {
                        let sent = match &copy_data {
                            Some(data) => copy_from_file(&sql, data, staged, &format!("{file}-{line}.data"))?,
                            None => sql.clone(),
                        };
                        let (theirs, ours) = sessions.both(&sent).await?;
                        let verdict = compare::judge(&theirs, &ours, compare::ordered(&sql));
                        let (outcome, detail) = cascade.follow(&sql, &theirs, &ours, verdict);
                        (line, sql, outcome, detail)
                    }
                }
            }
        };
        report.all.add(outcome);
        let query = is_query(&sql);
        if query {
            report.queries.add(outcome);
        }
        if outcome == Outcome::OutOfScope {
            *report.out_of_scope_reasons.entry(detail.clone()).or_default() += 1;
        }
        statements.push(StatementResult { file: file.to_string(), line, query, outcome, detail, sql: shown(&sql) });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the corpus's one use of psql variables (a data file's path) reaches both servers
    // as a COPY from the staged file; method: the meta-commands of test_setup.sql.
    #[test]
    fn data_file_variables() {
        let mut variables = Variables::default();
        let staged = Path::new("/tmp/staged");
        variables.meta("getenv abs_srcdir PG_ABS_SRCDIR", staged);
        variables.meta("set filename :abs_srcdir '/data/onek.data'", staged);
        variables.meta("set regresslib :libdir '/regress' :dlsuffix", staged);
        assert_eq!(variables.substitute("COPY onek FROM :'filename'"), "COPY onek FROM '/tmp/staged/data/onek.data'");
        assert_eq!(variables.substitute("AS :'regresslib'"), "AS :'regresslib'", "an unknown variable stays");
    }

    // Goal: an error that follows from a refusal counts as refused, not wrong; method: a
    // refused CREATE TEMP TABLE, then a query of that table and a statement in the aborted
    // transaction.
    #[test]
    fn refusals_cascade() {
        let mut cascade = Cascade::default();
        let refused = Answer::Error { code: compare::REFUSED.into(), message: "CREATE TEMPORARY TABLE".into() };
        let done = Answer::Done { count: 0 };
        let verdict = compare::judge(&done, &refused, false);
        assert_eq!(cascade.follow("create temp table foo (a int)", &done, &refused, verdict).0, Outcome::Refused);
        let missing = Answer::Error { code: "42P01".into(), message: "relation \"foo\" does not exist".into() };
        let rows = Answer::Rows { columns: 1, rows: Vec::new() };
        let verdict = compare::judge(&rows, &missing, false);
        assert_eq!(cascade.follow("select * from foo", &rows, &missing, verdict.clone()).0, Outcome::Refused);
        // A child of the refused foo cannot be created, and what reads it follows from that.
        let verdict = compare::judge(&done, &missing, false);
        assert_eq!(cascade.follow("create table kid () inherits (foo)", &done, &missing, verdict).0, Outcome::Refused);
        let no_kid = Answer::Error { code: "42P01".into(), message: "relation \"kid\" does not exist".into() };
        let verdict = compare::judge(&rows, &no_kid, false);
        assert_eq!(cascade.follow("select * from kid", &rows, &no_kid, verdict).0, Outcome::Refused);
        let other = Answer::Error { code: "42P01".into(), message: "relation \"bar\" does not exist".into() };
        let verdict = compare::judge(&rows, &other, false);
        assert_eq!(cascade.follow("select * from bar", &rows, &other, verdict).0, Outcome::Wrong);
        let verdict = compare::judge(&done, &refused, false);
        cascade.follow("insert into bar values ('infinity')", &done, &refused, verdict);
        let short = Answer::Rows { columns: 1, rows: vec![vec![Some("1".into())]] };
        let verdict = compare::judge(&short, &rows, false);
        assert_eq!(cascade.follow("select * from bar", &short, &rows, verdict).0, Outcome::Refused);
        let verdict = compare::judge(&done, &refused, false);
        cascade.follow("begin; create temp table t ()", &done, &refused, verdict);
        let aborted = Answer::Error { code: "25P02".into(), message: "aborted".into() };
        let verdict = compare::judge(&rows, &aborted, false);
        assert_eq!(cascade.follow("select 1", &rows, &aborted, verdict).0, Outcome::Refused);
    }

    // Goal: every vendored file splits, and the setup file keeps its COPY statements in scope;
    // method: split the shipped corpus and classify test_setup.sql.
    #[test]
    fn the_shipped_corpus_splits() {
        let corpus = default_corpus();
        for file in std::iter::once(SETUP).chain(FILES) {
            let text = std::fs::read_to_string(corpus.join("sql").join(format!("{file}.sql"))).expect("shipped");
            let items = script::split(&text);
            assert!(items.len() > 20, "{file}: {} items", items.len());
        }
        let text = std::fs::read_to_string(corpus.join("sql/test_setup.sql")).expect("shipped");
        let mut variables = Variables::default();
        let mut defined = scope::Defined::default();
        let mut copies = 0;
        for item in script::split(&text) {
            match item {
                Item::Meta { command, .. } => variables.meta(&command, Path::new("/s")),
                Item::Statement { sql, sent_by, .. } => {
                    let sql = variables.substitute(&sql);
                    if sql.starts_with("COPY") {
                        assert_eq!(defined.reason(&sql, sent_by.as_deref()), None, "{sql}");
                        copies += 1;
                    }
                }
            }
        }
        assert_eq!(copies, 7, "onek, tenk1, person, emp, student, stud_emp, road");
    }

    // Goal: the runner works end to end on the real servers (a smoke test; the full corpus is
    // `bypass bench engine-regress`, minutes long); method: case.sql, which needs no setup,
    // against PostgreSQL 15 and the engine: every statement gets a verdict, the counts add up,
    // and the first plain CASE query matches.
    #[test]
    fn case_sql_against_postgres_and_the_engine() {
        let plan = [("case".to_string(), false)];
        let (version, reports, statements) = measure(&default_corpus(), &plan).expect("runs");
        assert!(version.starts_with("15"), "{version}");
        let all = reports[0].all;
        assert_eq!(all.statements, statements.len());
        assert_eq!(all.run, all.matched + all.refused + all.wrong);
        assert_eq!(all.statements, all.run + all.out_of_scope);
        let first_case = statements.iter().find(|s| s.sql.contains("\"Simple WHEN\"")).expect("case.sql's first query");
        assert_eq!(first_case.outcome, Outcome::Matched, "{first_case:?}");
        assert!(all.matched >= 20, "{all:?}");
    }
}
