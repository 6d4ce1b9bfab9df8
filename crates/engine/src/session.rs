//! A client's session: its settings and its transaction, and the dispatch of one statement.
//!
//! ```text
//!   Idle ──statement──► Open(implicit) ──ok──► commit ──► Idle        (autocommit)
//!     │                      └──error──► roll back ──► Idle
//!     └─BEGIN─► Open(explicit) ──COMMIT──► commit ──► Idle
//!                   │  └──ROLLBACK──► roll back ──► Idle
//!                   └──error──► Failed ──(anything but COMMIT/ROLLBACK: 25P02)
//!                                  └──COMMIT/ROLLBACK──► roll back ──► Idle
//!   implicit block (a multi-statement Query message, or an extended-protocol batch up to Sync):
//!   statements share one implicit transaction, committed when the block ends
//! ```
//!
//! Reads take a snapshot per statement (READ COMMITTED) or per transaction (REPEATABLE READ);
//! writes lock the table name, build the next version from the newest committed one, and keep
//! it in the transaction until COMMIT publishes it (see `catalog`).

use std::sync::Arc;

use sqlparser::ast;

use crate::catalog::{Catalog, CatalogVersion, Changes, LockMode, TransactionId};
use crate::control::{MemoryBudget, QueryControl};
use crate::engine::{describe_columns, ColumnType, Description, Engine, QueryResult};
use crate::error::{EngineError, Result};
use crate::explain::explain_plan;
use crate::settings::{Isolation, Settings};
use crate::storage::Table;
use crate::stream::{CollectSink, ResultShape, ResultSink};
use crate::types::{DataType, Value};
use crate::vector::{Batch, Vector};

/// How a statement ended.
pub enum Outcome {
    /// Finished; the command tag (`SELECT 3`, `INSERT 0 1`, `BEGIN`).
    Done(String),
    /// COPY … FROM STDIN waits for the client's data; finish it with the `copy_in_*` calls.
    CopyIn(Box<crate::copy::CopyIn>),
}

/// A query bound under the session's transaction that streams without the session: a portal
/// suspended under a row limit keeps it while the session runs other statements (as
/// PostgreSQL keeps several portals open). It reads the table versions it was bound to.
pub struct DetachedQuery {
    bound: crate::query::BoundQuery,
}

impl DetachedQuery {
    /// Streams the rows to `sink`; the command tag.
    pub fn stream(&self, engine: &Engine, sink: &dyn ResultSink) -> Result<String> {
        let types = self.bound.plan.output_types();
        let origins = crate::stream::column_origins(&self.bound.plan);
        sink.start(ResultShape::Rows { names: &self.bound.names, types: &types, origins: &origins })?;
        let rows = crate::stream::stream_plan(&engine.executor(), &self.bound.plan, sink)?;
        Ok(format!("SELECT {rows}"))
    }
}

/// A transaction in progress.
pub struct Transaction {
    pub(crate) id: TransactionId,
    explicit: bool,
    isolation: Isolation,
    /// The snapshot every statement reads (REPEATABLE READ), taken at the first statement.
    snapshot: Option<Arc<CatalogVersion>>,
    pub(crate) changes: Changes,
    /// Whether the isolation level may still change (no statement has run yet).
    fresh: bool,
    /// Savepoints, oldest first: their names and the changes as they were.
    savepoints: Vec<(String, Changes)>,
}

enum State {
    Idle,
    Open(Transaction),
    Failed(Transaction),
}

/// The ReadyForQuery status of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Idle,
    InTransaction,
    Failed,
}

/// One client's state.
pub struct Session {
    pub settings: Settings,
    /// Who is logged in and to which database (`current_user`, `current_database()`).
    pub user: String,
    pub database: String,
    state: State,
    /// Statements share one implicit transaction until `end_implicit_block`.
    implicit_block: bool,
    /// Warnings for the client (NoticeResponse), drained by the server after each statement.
    notices: Vec<Notice>,
    /// Prepared statements DEALLOCATE named (`None`: all), drained by the server, which keeps
    /// the protocol's prepared statements.
    deallocations: Vec<Option<String>>,
    /// The server-wide budget its statements' memory counts against.
    memory_budget: Option<Arc<MemoryBudget>>,
    /// Prefix of the keys of this session's temporary tables (see `catalog`).
    temp_namespace: String,
}

/// Numbers sessions for their temporary tables' keys.
static SESSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A NoticeResponse for the client.
#[derive(Debug, Clone)]
pub struct Notice {
    pub severity: &'static str,
    pub code: &'static str,
    pub message: String,
}

impl Session {
    pub fn new(memory_limit: usize) -> Session {
        Session {
            settings: Settings::new(memory_limit),
            user: "bypass".into(),
            database: crate::server::DATABASE_NAME.into(),
            state: State::Idle,
            implicit_block: false,
            notices: Vec::new(),
            deallocations: Vec::new(),
            memory_budget: None,
            temp_namespace: format!(
                "{}pg_temp_{}.",
                crate::catalog::TEMP_KEY_START,
                SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
        }
    }

    pub fn status(&self) -> Status {
        match self.state {
            State::Idle => Status::Idle,
            State::Open(ref t) if !t.explicit && !self.implicit_block => Status::Idle,
            State::Open(_) => Status::InTransaction,
            State::Failed(_) => Status::Failed,
        }
    }

    /// Inside BEGIN … COMMIT (failed or not): what outlives a Sync, such as a suspended portal.
    pub fn in_explicit_transaction(&self) -> bool {
        matches!(&self.state, State::Open(t) | State::Failed(t) if t.explicit)
    }

    /// Prepared statements DEALLOCATE removed since the last call (`None`: all of them).
    pub fn take_deallocations(&mut self) -> Vec<Option<String>> {
        std::mem::take(&mut self.deallocations)
    }

    /// Notices and warnings raised since the last call.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// The session's statements count against `budget` too.
    pub fn within_budget(mut self, budget: Arc<MemoryBudget>) -> Session {
        self.memory_budget = Some(budget);
        self
    }

    /// A control for the next statement, with this session's timeout and memory limit and the
    /// server's budget.
    pub fn new_control(&self) -> Arc<QueryControl> {
        let budget = self.memory_budget.clone();
        QueryControl::with_budget(self.settings.statement_timeout, self.settings.memory_limit, budget)
    }

    /// Parses `sql` under a control of its own with this session's memory_limit and the
    /// server's budget, so a text whose syntax tree might not fit is refused (53200) before
    /// the tree is built (see [`Engine::parse`]).
    pub fn parse(&self, sql: &str) -> Result<Vec<ast::Statement>> {
        crate::control::enter(&self.new_control(), || Engine::parse(sql))
    }

    /// Starts an implicit block: statements until `end_implicit_block` share one transaction.
    pub fn begin_implicit_block(&mut self) {
        self.implicit_block = true;
    }

    /// Ends an implicit block: commits its implicit transaction if one is open.
    pub fn end_implicit_block(&mut self, engine: &Engine) -> Result<()> {
        self.implicit_block = false;
        match &self.state {
            State::Open(t) if !t.explicit => self.commit_open(engine),
            _ => Ok(()),
        }
    }

    /// Ends the session: an open transaction is rolled back.
    pub fn close(&mut self, engine: &Engine) {
        self.implicit_block = false;
        self.roll_back(engine);
        crate::ddl::drop_temporary_tables(self, engine);
    }

    /// The key a new temporary table `name` is stored under.
    pub(crate) fn temp_key(&self, name: &str) -> String {
        format!("{}{name}", self.temp_namespace)
    }

    /// Opens a transaction for work outside a statement (dropping temporary tables at the end).
    pub(crate) fn open_internal_transaction(&mut self, engine: &Engine) {
        if matches!(self.state, State::Idle) {
            self.state = State::Open(self.new_transaction(engine, false));
        }
    }

    /// Commits what `open_internal_transaction` opened.
    pub(crate) fn commit_internal_transaction(&mut self, engine: &Engine) {
        let _ = self.commit_open(engine);
    }

    /// What binding reads from the session besides the catalog: its TimeZone, which decides
    /// whether `timestamp with time zone` may be used (`datetime::check_time_zone`).
    fn enter_statement(&self) {
        crate::datetime::set_session_time_zone(&self.settings.time_zone);
    }

    /// Runs one statement, streaming its rows (if any) to `sink`.
    pub fn execute(&mut self, engine: &Engine, statement: &ast::Statement, sink: &dyn ResultSink) -> Result<Outcome> {
        self.enter_statement();
        if let Some(done) = self.transaction_control(engine, statement)? {
            return Ok(Outcome::Done(done));
        }
        if matches!(self.state, State::Failed(_)) {
            return Err(EngineError::InFailedTransaction);
        }
        if matches!(self.state, State::Idle) {
            self.state = State::Open(self.new_transaction(engine, false));
        }
        let outcome = self.share_lock_reads(engine, statement).and_then(|()| self.dispatch(engine, statement, sink));
        self.after_statement(engine, outcome)
    }

    /// Binds a plain query to stream apart from the session ([`DetachedQuery`]); `None` for
    /// other statements (catalog queries included), which run with [`Session::execute`].
    /// An error leaves the transaction to the caller to fail (as a failed statement).
    pub fn bind_detached(&mut self, engine: &Engine, statement: &ast::Statement) -> Result<Option<DetachedQuery>> {
        let ast::Statement::Query(query) = statement else { return Ok(None) };
        if crate::pg_catalog::handles(query) {
            return Ok(None);
        }
        self.enter_statement();
        if matches!(self.state, State::Failed(_)) {
            return Err(EngineError::InFailedTransaction);
        }
        if matches!(self.state, State::Idle) {
            self.state = State::Open(self.new_transaction(engine, false));
        }
        let bound = engine.bind(&self.catalog(engine), query)?;
        if let State::Open(t) = &mut self.state {
            t.fresh = false;
        }
        Ok(Some(DetachedQuery { bound }))
    }

    /// Runs one statement and collects its rows (embedded use, tests).
    pub fn execute_collect(&mut self, engine: &Engine, statement: &ast::Statement) -> Result<QueryResult> {
        let sink = RecordingSink::default();
        let tag = match self.execute(engine, statement, &sink)? {
            Outcome::Done(tag) => tag,
            Outcome::CopyIn(copy) => {
                self.copy_in_fail(engine, copy, "COPY FROM STDIN needs a client connection");
                return Err(EngineError::unsupported("COPY FROM STDIN outside a client connection"));
            }
        };
        let (names, types) = sink.shape.into_inner().unwrap_or_else(|p| p.into_inner()).unwrap_or_default();
        let types: Vec<DataType> = types.into_iter().map(crate::stream::engine_type).collect();
        Ok(QueryResult {
            returns_rows: !names.is_empty() || !types.is_empty(),
            names,
            types,
            batches: sink.rows.into_batches(),
            tag,
        })
    }

    fn after_statement(&mut self, engine: &Engine, outcome: Result<Outcome>) -> Result<Outcome> {
        match outcome {
            Ok(Outcome::Done(tag)) => {
                if let State::Open(t) = &mut self.state {
                    t.fresh = false;
                    if !t.explicit && !self.implicit_block {
                        self.commit_open(engine)?;
                    }
                }
                Ok(Outcome::Done(tag))
            }
            Ok(copy @ Outcome::CopyIn(_)) => Ok(copy),
            Err(error) => {
                self.fail(engine);
                Err(error)
            }
        }
    }

    /// An error outside a statement (a protocol message that failed) ends the transaction as a
    /// failed statement would.
    pub fn abort(&mut self, engine: &Engine) {
        self.fail(engine);
    }

    /// A failed statement: an explicit transaction fails until ROLLBACK, an implicit one is
    /// rolled back at once.
    fn fail(&mut self, engine: &Engine) {
        match std::mem::replace(&mut self.state, State::Idle) {
            // Locks and changes stay until ROLLBACK (or ROLLBACK TO a savepoint), as PostgreSQL
            // keeps them; COMMIT of a failed transaction rolls it back.
            State::Open(t) | State::Failed(t) if t.explicit => self.state = State::Failed(t),
            State::Open(t) | State::Failed(t) => {
                engine.database().unlock_all(t.id);
                self.implicit_block = false;
            }
            State::Idle => {}
        }
    }

    fn new_transaction(&self, engine: &Engine, explicit: bool) -> Transaction {
        Transaction {
            id: engine.database().new_transaction_id(),
            explicit,
            isolation: self.settings.default_isolation,
            snapshot: None,
            changes: Changes::new(),
            fresh: true,
            savepoints: Vec::new(),
        }
    }

    fn commit_open(&mut self, engine: &Engine) -> Result<()> {
        let State::Open(transaction) = std::mem::replace(&mut self.state, State::Idle) else { return Ok(()) };
        let dropped = transaction.changes.values().any(Option::is_none);
        engine.database().publish(transaction.changes);
        engine.database().unlock_all(transaction.id);
        if dropped {
            // The dropped tables' chunks go back to the pool once no reader holds them; give the
            // pages of free blocks (and the heap their dictionaries held) back to the kernel.
            engine.runtime().pool().trim();
            crate::storage::release_free_heap();
        }
        Ok(())
    }

    fn roll_back(&mut self, engine: &Engine) {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Open(t) | State::Failed(t) => engine.database().unlock_all(t.id),
            State::Idle => {}
        }
    }

    /// BEGIN, COMMIT, ROLLBACK and SET TRANSACTION; `None` for other statements.
    fn transaction_control(&mut self, engine: &Engine, statement: &ast::Statement) -> Result<Option<String>> {
        Ok(Some(match statement {
            ast::Statement::StartTransaction { modes, statements, exception, .. } => {
                if !statements.is_empty() || exception.is_some() {
                    return Err(EngineError::unsupported("BEGIN … END blocks"));
                }
                self.begin(engine, modes)?;
                "BEGIN".into()
            }
            ast::Statement::Commit { chain: true, .. } | ast::Statement::Rollback { chain: true, .. } => {
                return Err(EngineError::unsupported("AND CHAIN"));
            }
            ast::Statement::Commit { .. } => self.commit(engine)?,
            ast::Statement::Rollback { savepoint: Some(name), .. } => {
                self.rollback_to(&crate::bind::identifier(name))?;
                "ROLLBACK".into()
            }
            ast::Statement::Rollback { .. } => {
                if matches!(self.status(), Status::Idle) {
                    self.warning("25P01", "there is no transaction in progress");
                }
                self.implicit_block = false;
                self.roll_back(engine);
                "ROLLBACK".into()
            }
            ast::Statement::Savepoint { name } => {
                self.savepoint(crate::bind::identifier(name))?;
                "SAVEPOINT".into()
            }
            ast::Statement::ReleaseSavepoint { name } => {
                self.release(&crate::bind::identifier(name))?;
                "RELEASE".into()
            }
            ast::Statement::Set(ast::Set::SetTransaction { modes, snapshot: None, session }) => {
                if matches!(self.state, State::Failed(_)) {
                    return Err(EngineError::InFailedTransaction);
                }
                self.set_transaction(modes, *session)?;
                "SET".into()
            }
            _ => return Ok(None),
        }))
    }

    fn begin(&mut self, engine: &Engine, modes: &[ast::TransactionMode]) -> Result<()> {
        match &mut self.state {
            State::Open(t) if t.explicit => {
                self.warning("25001", "there is already a transaction in progress");
            }
            State::Failed(_) => return Err(EngineError::InFailedTransaction),
            // BEGIN inside an implicit block turns it into a transaction block, as PostgreSQL does.
            State::Open(t) => t.explicit = true,
            State::Idle => self.state = State::Open(self.new_transaction(engine, true)),
        }
        if let State::Open(t) = &mut self.state {
            apply_modes(t, modes)?;
        }
        Ok(())
    }

    /// The explicit transaction savepoints need, or PostgreSQL's 25P01.
    fn block(&mut self, statement: &str) -> Result<&mut Transaction> {
        match &mut self.state {
            State::Open(t) | State::Failed(t) if t.explicit => Ok(t),
            _ => Err(EngineError::NoTransaction(format!("{statement} can only be used in transaction blocks"))),
        }
    }

    fn savepoint(&mut self, name: String) -> Result<()> {
        if matches!(self.state, State::Failed(_)) {
            return Err(EngineError::InFailedTransaction);
        }
        let transaction = self.block("SAVEPOINT")?;
        let changes = transaction.changes.clone();
        transaction.savepoints.push((name, changes));
        Ok(())
    }

    fn savepoint_index(transaction: &Transaction, name: &str) -> Result<usize> {
        transaction
            .savepoints
            .iter()
            .rposition(|(n, _)| n == name)
            .ok_or_else(|| EngineError::NoSavepoint(format!("savepoint \"{name}\" does not exist")))
    }

    /// RELEASE: forgets the savepoint and the ones after it; the changes stay.
    fn release(&mut self, name: &str) -> Result<()> {
        if matches!(self.state, State::Failed(_)) {
            return Err(EngineError::InFailedTransaction);
        }
        let transaction = self.block("RELEASE SAVEPOINT")?;
        let index = Session::savepoint_index(transaction, name)?;
        transaction.savepoints.truncate(index);
        Ok(())
    }

    /// ROLLBACK TO: the changes as they were at the savepoint; a failed transaction goes on.
    fn rollback_to(&mut self, name: &str) -> Result<()> {
        let transaction = self.block("ROLLBACK TO SAVEPOINT")?;
        let index = Session::savepoint_index(transaction, name)?;
        transaction.changes = transaction.savepoints[index].1.clone();
        transaction.savepoints.truncate(index + 1);
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Failed(t) | State::Open(t) => self.state = State::Open(t),
            State::Idle => unreachable!("block() found a transaction"),
        }
        Ok(())
    }

    fn commit(&mut self, engine: &Engine) -> Result<String> {
        self.implicit_block = false;
        match &self.state {
            State::Failed(_) => {
                self.roll_back(engine);
                Ok("ROLLBACK".into())
            }
            State::Idle => {
                self.warning("25P01", "there is no transaction in progress");
                Ok("COMMIT".into())
            }
            State::Open(_) => {
                self.commit_open(engine)?;
                Ok("COMMIT".into())
            }
        }
    }

    fn set_transaction(&mut self, modes: &[ast::TransactionMode], session: bool) -> Result<()> {
        if session {
            for mode in modes {
                if let ast::TransactionMode::IsolationLevel(level) = mode {
                    self.settings.default_isolation = isolation(level)?;
                } else {
                    check_access_mode(mode)?;
                }
            }
            return Ok(());
        }
        match &mut self.state {
            State::Open(t) if t.explicit && t.fresh => apply_modes(t, modes),
            State::Open(t) if t.explicit => Err(EngineError::TransactionState(
                "SET TRANSACTION ISOLATION LEVEL must be called before any query".into(),
            )),
            _ => {
                self.warning("25P01", "SET TRANSACTION can only be used in transaction blocks");
                Ok(())
            }
        }
    }

    fn transaction(&mut self) -> &mut Transaction {
        match &mut self.state {
            State::Open(t) => t,
            _ => unreachable!("statements run inside an open transaction"),
        }
    }

    /// What the current statement reads.
    pub(crate) fn catalog(&mut self, engine: &Engine) -> Catalog {
        let transaction = self.transaction();
        let snapshot = match transaction.isolation {
            Isolation::RepeatableRead => {
                Arc::clone(transaction.snapshot.get_or_insert_with(|| engine.database().snapshot()))
            }
            Isolation::ReadCommitted => engine.database().snapshot(),
        };
        Catalog::new(snapshot, transaction.changes.clone()).with_temp_namespace(&self.temp_namespace)
    }

    /// Locks `name` for writing and returns the version to build on: this transaction's own,
    /// or the newest committed one. Under REPEATABLE READ a table changed since the
    /// transaction's snapshot cannot be written (40001, as PostgreSQL).
    pub(crate) fn table_for_write(&mut self, engine: &Engine, name: &str) -> Result<Option<Arc<Table>>> {
        let lock_timeout = self.settings.lock_timeout;
        let _ = self.catalog(engine);
        let transaction = self.transaction();
        engine.database().lock(transaction.id, name, lock_timeout)?;
        if let Some(change) = transaction.changes.get(name) {
            return Ok(change.clone());
        }
        let newest = engine.database().snapshot().get(name).cloned();
        if let Some(snapshot) = &transaction.snapshot {
            let seen = snapshot.get(name);
            let same = match (&newest, seen) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if !same && transaction.isolation == Isolation::RepeatableRead {
                return Err(EngineError::SerializationFailure);
            }
        }
        Ok(newest)
    }

    /// Share-locks every existing table `statement` names, before it takes its snapshot, until
    /// the transaction ends: a DROP or TRUNCATE of them waits for this transaction (catalog.rs).
    /// Names of no table (CTEs, typos) are not locked, so a transaction's locks stay bounded by
    /// the tables there are; nor are temporary tables (no other session sees them).
    fn share_lock_reads(&mut self, engine: &Engine, statement: &ast::Statement) -> Result<()> {
        let names = crate::catalog::named_tables(statement);
        if names.is_empty() {
            return Ok(());
        }
        let lock_timeout = self.settings.lock_timeout;
        let namespace = self.temp_namespace.clone();
        let transaction = self.transaction();
        let newest = Catalog::new(engine.database().snapshot(), transaction.changes.clone());
        let newest = newest.with_temp_namespace(&namespace);
        for name in names {
            // A temporary table is the session's own: no other transaction can drop it.
            if newest.key_of(&name) == name && newest.contains(&name) {
                engine.database().lock_mode(transaction.id, &name, LockMode::Share, lock_timeout)?;
            }
        }
        Ok(())
    }

    /// Like [`Session::table_for_write`], for replacing the table whole (DROP, TRUNCATE): also
    /// waits until no other transaction that read the table is open.
    pub(crate) fn table_for_drop(&mut self, engine: &Engine, name: &str) -> Result<Option<Arc<Table>>> {
        let lock_timeout = self.settings.lock_timeout;
        let transaction = self.transaction().id;
        engine.database().lock_mode(transaction, name, LockMode::Exclusive, lock_timeout)?;
        self.table_for_write(engine, name)
    }

    /// Like [`Session::table_for_write`], but takes the transaction's own version out of it, so
    /// that a builder can own it (no copy); the statement writes the next version back.
    pub(crate) fn take_for_write(&mut self, engine: &Engine, name: &str) -> Result<Option<Arc<Table>>> {
        let table = self.table_for_write(engine, name)?;
        let changes = &mut self.transaction().changes;
        if matches!(changes.get(name), Some(Some(_))) {
            changes.remove(name);
        }
        Ok(table)
    }

    /// A NOTICE for the client.
    pub(crate) fn notice(&mut self, code: &'static str, message: String) {
        self.notices.push(Notice { severity: "NOTICE", code, message });
    }

    fn warning(&mut self, code: &'static str, message: &str) {
        self.notices.push(Notice { severity: "WARNING", code, message: message.to_string() });
    }

    /// Keeps a new version (or a drop) of a locked table in the transaction.
    pub(crate) fn write(&mut self, name: &str, table: Option<Table>) {
        self.transaction().changes.insert(name.to_string(), table.map(Arc::new));
    }

    /// Output names and types of a statement without running it (`None` if it returns no rows).
    pub fn describe(&mut self, engine: &Engine, statement: &ast::Statement) -> Result<Option<Description>> {
        Ok(self.describe_with_origins(engine, statement)?.map(|(description, _)| description))
    }

    /// [`Session::describe`], with the table column each output column is (RowDescription).
    pub fn describe_with_origins(
        &mut self,
        engine: &Engine,
        statement: &ast::Statement,
    ) -> Result<Option<(Description, Vec<Option<crate::stream::ColumnOrigin>>)>> {
        let idle = matches!(self.state, State::Idle | State::Failed(_));
        let saved = if idle {
            let transaction = self.new_transaction(engine, false);
            Some(std::mem::replace(&mut self.state, State::Open(transaction)))
        } else {
            None
        };
        let described = self.describe_open(engine, statement);
        if let Some(saved) = saved {
            self.state = saved;
        }
        described
    }

    fn describe_open(
        &mut self,
        engine: &Engine,
        statement: &ast::Statement,
    ) -> Result<Option<(Description, Vec<Option<crate::stream::ColumnOrigin>>)>> {
        if let ast::Statement::Query(query) = statement {
            if !crate::pg_catalog::handles(query) {
                self.enter_statement();
                let bound = engine.bind(&self.catalog(engine), query)?;
                let types = bound.plan.output_types();
                let origins = crate::stream::column_origins(&bound.plan);
                return Ok(Some((describe_columns(bound.names, &types), origins)));
            }
        }
        let described = match statement {
            ast::Statement::Query(query) if crate::pg_catalog::handles(query) => {
                let output = self.catalog_query(engine, query)?;
                let (names, types) = output.columns.into_iter().map(|(n, t)| (n, ColumnType::Catalog(t))).unzip();
                Some((names, types))
            }
            ast::Statement::Explain { .. } => Some(describe_columns(vec!["QUERY PLAN".into()], &[DataType::Text])),
            ast::Statement::ShowVariable { variable } => {
                Some(describe_columns(vec![show_name(variable)], &[DataType::Text]))
            }
            ast::Statement::Insert(_) | ast::Statement::Update(_) | ast::Statement::Delete(_) => {
                crate::dml::describe_returning(self, engine, statement)?
            }
            _ => None,
        };
        Ok(described.map(|description| (description, Vec::new())))
    }

    /// Parameter types a statement's `$n` sentinels were bound to (extended protocol Describe).
    pub fn describe_parameters(
        &mut self,
        engine: &Engine,
        statement: &ast::Statement,
    ) -> (Result<Option<Description>>, std::collections::BTreeMap<usize, DataType>) {
        crate::bind::infer_parameter_types(|| self.describe(engine, statement))
    }

    fn dispatch(&mut self, engine: &Engine, statement: &ast::Statement, sink: &dyn ResultSink) -> Result<Outcome> {
        let done = |tag: String| Ok(Outcome::Done(tag));
        match statement {
            ast::Statement::Query(query) if crate::pg_catalog::handles(query) => {
                let output = self.catalog_query(engine, query)?;
                sink.values(&output.columns, &output.rows)?;
                done(format!("SELECT {}", output.rows.len()))
            }
            ast::Statement::Query(query) => {
                let catalog = self.catalog(engine);
                let bound = engine.bind(&catalog, query)?;
                let types = bound.plan.output_types();
                let origins = crate::stream::column_origins(&bound.plan);
                sink.start(ResultShape::Rows { names: &bound.names, types: &types, origins: &origins })?;
                let rows = crate::stream::stream_plan(&engine.executor(), &bound.plan, sink)?;
                done(format!("SELECT {rows}"))
            }
            ast::Statement::Explain { statement, analyze: false, .. } => self.explain(engine, statement, sink),
            ast::Statement::CreateTable(create) => done(crate::ddl::create_table(self, engine, create)?),
            ast::Statement::Drop {
                object_type: ast::ObjectType::Table,
                if_exists,
                names,
                cascade,
                restrict: _,
                ..
            } => done(crate::ddl::drop_tables(self, engine, names, *if_exists, *cascade)?),
            ast::Statement::CreateView(create) => done(crate::view::create_view(self, engine, create)?),
            ast::Statement::Drop {
                object_type: ast::ObjectType::View, if_exists, names, cascade, restrict: _, ..
            } => done(crate::view::drop_views(self, engine, names, *if_exists, *cascade)?),
            ast::Statement::Truncate(truncate) => done(crate::ddl::truncate(self, engine, truncate)?),
            ast::Statement::CreateIndex(create) => done(crate::ddl::create_index(self, engine, create)?),
            ast::Statement::AlterTable(alter) if crate::ddl::inherited_parent(alter).is_some() => {
                done(crate::ddl::alter_inherit(self, engine, alter)?)
            }
            ast::Statement::Drop { object_type: ast::ObjectType::Index, if_exists, names, cascade: false, .. } => {
                done(crate::ddl::drop_indexes(self, engine, names, *if_exists)?)
            }
            ast::Statement::Insert(insert) => done(crate::dml::insert(self, engine, insert, sink)?),
            ast::Statement::Update(update) => done(crate::dml::update(self, engine, update, sink)?),
            ast::Statement::Delete(delete) => done(crate::dml::delete(self, engine, delete, sink)?),
            ast::Statement::Copy { source, to, target, options, legacy_options, values } => {
                if !values.is_empty() {
                    return Err(EngineError::Syntax("COPY data inline in the query text".into()));
                }
                crate::copy::start(
                    self,
                    engine,
                    crate::copy::CopyStatement { source, to: *to, target, options, legacy_options },
                    sink,
                )
            }
            ast::Statement::Set(set) => done(self.set(set)?),
            ast::Statement::ShowVariable { variable } => self.show(variable, sink),
            ast::Statement::Reset(reset) => done(self.reset(reset)?),
            ast::Statement::Deallocate { name, .. } => {
                let name = crate::bind::identifier(name);
                self.deallocations.push((!name.eq_ignore_ascii_case("all")).then_some(name));
                done("DEALLOCATE".into())
            }
            other => {
                let text = other.to_string();
                let feature: String = text.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
                Err(EngineError::unsupported(format!("statement {feature}")))
            }
        }
    }

    /// Runs a query of the system catalogs over this statement's view of the tables.
    fn catalog_query(&mut self, engine: &Engine, query: &ast::Query) -> Result<crate::pg_catalog::Output> {
        let catalog = self.catalog(engine);
        let context = crate::pg_catalog::Context {
            catalog: &catalog,
            settings: &self.settings,
            user: &self.user,
            database: &self.database,
        };
        crate::pg_catalog::run(query, &context)
    }

    fn explain(&mut self, engine: &Engine, statement: &ast::Statement, sink: &dyn ResultSink) -> Result<Outcome> {
        let ast::Statement::Query(query) = statement else {
            return Err(EngineError::unsupported("EXPLAIN of a non-query statement"));
        };
        let bound = engine.bind(&self.catalog(engine), query)?;
        let text = explain_plan(&bound.plan, engine.tier());
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        send_text_rows(sink, "QUERY PLAN", &lines)?;
        Ok(Outcome::Done("EXPLAIN".into()))
    }

    fn set(&mut self, set: &ast::Set) -> Result<String> {
        match set {
            ast::Set::SingleAssignment { scope, hivevar: false, variable, values } => {
                if matches!(scope, Some(ast::ContextModifier::Local | ast::ContextModifier::Global)) {
                    return Err(EngineError::unsupported("SET LOCAL and SET GLOBAL"));
                }
                let name = variable.to_string();
                let value = setting_value(values)?;
                self.settings.set(&name, value.as_deref())?;
            }
            ast::Set::SetTimeZone { local: false, value } => {
                let value = setting_value(std::slice::from_ref(value))?;
                self.settings.set("timezone", value.as_deref())?;
            }
            ast::Set::SetNames { charset_name, collation_name: None } => {
                self.settings.set("client_encoding", Some(&charset_name.value))?;
            }
            other => return Err(EngineError::unsupported(format!("{other}"))),
        }
        Ok("SET".into())
    }

    fn reset(&mut self, reset: &ast::ResetStatement) -> Result<String> {
        match &reset.reset {
            ast::Reset::ALL => {
                let limit = self.settings.memory_limit_max;
                self.settings = Settings::new(limit);
            }
            ast::Reset::ConfigurationParameter(name) => self.settings.set(&name.to_string(), None)?,
            ast::Reset::SessionAuthorization => return Err(EngineError::unsupported("RESET SESSION AUTHORIZATION")),
        }
        Ok("RESET".into())
    }

    fn show(&mut self, variable: &[ast::Ident], sink: &dyn ResultSink) -> Result<Outcome> {
        let name = show_name(variable);
        if name.eq_ignore_ascii_case("all") {
            return Err(EngineError::unsupported("SHOW ALL"));
        }
        let value = match name.as_str() {
            "transaction_isolation" | "transaction isolation level" => match &self.state {
                State::Open(t) | State::Failed(t) => t.isolation.name().to_string(),
                State::Idle => self.settings.default_isolation.name().to_string(),
            },
            other => self.settings.show(other)?,
        };
        send_text_rows(sink, &name, &[value])?;
        Ok(Outcome::Done("SHOW".into()))
    }

    /// Feeds COPY FROM STDIN data.
    pub fn copy_in_data(&mut self, engine: &Engine, copy: &mut Box<crate::copy::CopyIn>, data: &[u8]) -> Result<()> {
        self.enter_statement();
        let outcome = copy.data(data);
        if outcome.is_err() {
            self.fail(engine);
        }
        outcome
    }

    /// Finishes COPY FROM STDIN: the rows become part of the transaction (and are committed
    /// unless a transaction block is open).
    pub fn copy_in_done(&mut self, engine: &Engine, copy: Box<crate::copy::CopyIn>) -> Result<String> {
        let outcome = copy.finish().map(|(name, table, rows)| {
            self.write(&name, Some(table));
            Outcome::Done(format!("COPY {rows}"))
        });
        match self.after_statement(engine, outcome)? {
            Outcome::Done(tag) => Ok(tag),
            Outcome::CopyIn(_) => unreachable!("a finished COPY is done"),
        }
    }

    /// Abandons COPY FROM STDIN (CopyFail, an error, a lost client).
    pub fn copy_in_fail(&mut self, engine: &Engine, copy: Box<crate::copy::CopyIn>, reason: &str) -> EngineError {
        drop(copy);
        self.fail(engine);
        EngineError::QueryCanceled(format!("COPY from stdin failed: {reason}"))
    }
}

fn apply_modes(transaction: &mut Transaction, modes: &[ast::TransactionMode]) -> Result<()> {
    for mode in modes {
        match mode {
            ast::TransactionMode::IsolationLevel(level) => transaction.isolation = isolation(level)?,
            other => check_access_mode(other)?,
        }
    }
    Ok(())
}

fn check_access_mode(mode: &ast::TransactionMode) -> Result<()> {
    match mode {
        ast::TransactionMode::AccessMode(ast::TransactionAccessMode::ReadWrite) => Ok(()),
        other => Err(EngineError::unsupported(format!("transaction mode {other}"))),
    }
}

fn isolation(level: &ast::TransactionIsolationLevel) -> Result<Isolation> {
    Isolation::parse(&match level {
        ast::TransactionIsolationLevel::ReadUncommitted => "read uncommitted".to_string(),
        ast::TransactionIsolationLevel::ReadCommitted => "read committed".into(),
        ast::TransactionIsolationLevel::RepeatableRead => "repeatable read".into(),
        ast::TransactionIsolationLevel::Serializable => "serializable".into(),
        ast::TransactionIsolationLevel::Snapshot => "snapshot".into(),
    })
}

fn show_name(variable: &[ast::Ident]) -> String {
    variable.iter().map(|i| i.value.to_lowercase()).collect::<Vec<_>>().join(" ")
}

/// The text of a SET value: `TO DEFAULT` is `None`; lists are joined with ", ".
fn setting_value(values: &[ast::Expr]) -> Result<Option<String>> {
    let mut parts = Vec::new();
    for value in values {
        match value {
            ast::Expr::Value(v) => match &v.value {
                ast::Value::SingleQuotedString(s) | ast::Value::DoubleQuotedString(s) => parts.push(s.clone()),
                ast::Value::Number(n, _) => parts.push(n.clone()),
                ast::Value::Boolean(b) => parts.push(if *b { "on" } else { "off" }.into()),
                other => return Err(EngineError::InvalidParameterValue(format!("invalid setting value {other}"))),
            },
            ast::Expr::Identifier(ident) if ident.value.eq_ignore_ascii_case("default") => return Ok(None),
            ast::Expr::Identifier(ident) => parts.push(ident.value.clone()),
            ast::Expr::UnaryOp { op: ast::UnaryOperator::Minus, expr } => {
                parts.push(format!("-{}", setting_value(std::slice::from_ref(expr))?.unwrap_or_default()))
            }
            other => parts.push(other.to_string()),
        }
    }
    Ok(Some(parts.join(", ")))
}

/// Sends one text column of rows (SHOW, EXPLAIN).
pub(crate) fn send_text_rows(sink: &dyn ResultSink, name: &str, lines: &[String]) -> Result<()> {
    let names = [name.to_string()];
    sink.start(ResultShape::Rows { names: &names, types: &[DataType::Text], origins: &[] })?;
    let mut vector = Vector::empty(DataType::Text);
    for line in lines {
        vector.append(&Vector::broadcast(&Value::Text(line.clone()), DataType::Text, 1));
    }
    sink.emit(sink.encode(Batch::new(vec![vector], lines.len()))?).map(|_| ())
}

/// Collects rows and remembers the shape (embedded use).
#[derive(Default)]
struct RecordingSink {
    rows: CollectSink,
    shape: std::sync::Mutex<Option<Description>>,
}

impl ResultSink for RecordingSink {
    fn start(&self, shape: ResultShape<'_>) -> Result<()> {
        if let ResultShape::Rows { names, types, .. } = shape {
            *self.shape.lock().unwrap_or_else(|p| p.into_inner()) = Some(describe_columns(names.to_vec(), types));
        }
        Ok(())
    }

    fn values(
        &self,
        columns: &[(String, crate::pg_catalog::PgType)],
        rows: &[Vec<crate::pg_catalog::Datum>],
    ) -> Result<()> {
        let (names, types): (Vec<String>, Vec<ColumnType>) =
            columns.iter().map(|(n, t)| (n.clone(), ColumnType::Catalog(*t))).unzip();
        *self.shape.lock().unwrap_or_else(|p| p.into_inner()) = Some((names, types));
        self.rows.values(columns, rows)
    }

    fn encode(&self, batch: Batch) -> Result<crate::stream::Piece> {
        self.rows.encode(batch)
    }

    fn emit(&self, piece: crate::stream::Piece) -> Result<bool> {
        self.rows.emit(piece)
    }
}
