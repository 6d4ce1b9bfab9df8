//! The engine facade: the runtime, the database (committed table versions) and embedded use
//! (`execute`: SQL text in, materialized results out, each statement in its own transaction).
//! Clients of the server get a [`Session`] each; see `session`.

use std::sync::{Arc, Mutex};

use sqlparser::ast;
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};

use crate::catalog::{Catalog, Database};
use crate::control::MemoryBudget;
use crate::error::{EngineError, Result};
use crate::exec::{Executor, Tier};
use crate::query::{BoundQuery, QueryBinder};
use crate::runtime::{Runtime, RuntimeSettings};
use crate::session::Session;
use crate::storage::{Table, CHUNK_ROWS_DEFAULT};
use crate::stream::CollectSink;
use crate::types::{DataType, Value};
use crate::vector::Batch;

/// Longest SQL text accepted (bytes).
pub const SQL_BYTES_MAX: usize = 1 << 20;
/// What the parser's tokens and syntax tree take at most: per token (whitespace included), per
/// SELECT (a query block's node is large), per statement and per byte of text (literals and
/// names are copied). Measured worst cases use about 80% of the bound
/// (`tests/depth.rs::parse_memory_stays_within_its_bound`: FROM lists, subqueries, literals).
const PARSE_BYTES_PER_TOKEN: usize = 1536;
const PARSE_BYTES_PER_SELECT: usize = 12 << 10;
const PARSE_BYTES_PER_STATEMENT: usize = 16 << 10;
const PARSE_BYTES_PER_TEXT_BYTE: usize = 8;

/// An upper bound of the memory parsing `sql`, tokenized as `tokens`, takes.
fn parse_tree_bytes_max(sql: &str, tokens: &[TokenWithSpan]) -> usize {
    let (mut selects, mut statements) = (0usize, 1usize);
    for token in tokens {
        match &token.token {
            Token::Word(word) if word.keyword == Keyword::SELECT => selects += 1,
            Token::SemiColon => statements += 1,
            _ => {}
        }
    }
    [
        (tokens.len(), PARSE_BYTES_PER_TOKEN),
        (selects, PARSE_BYTES_PER_SELECT),
        (statements, PARSE_BYTES_PER_STATEMENT),
        (sql.len(), PARSE_BYTES_PER_TEXT_BYTE),
    ]
    .iter()
    .fold(0usize, |sum, &(count, bytes)| sum.saturating_add(count.saturating_mul(bytes)))
}

/// The type of a result column: an engine type, or a PostgreSQL type of a catalog query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Engine(DataType),
    Catalog(crate::pg_catalog::PgType),
}

impl ColumnType {
    /// The type OID clients see.
    pub fn oid(self) -> u32 {
        match self {
            ColumnType::Engine(data_type) => data_type.pg_oid(),
            ColumnType::Catalog(pg_type) => pg_type.oid(),
        }
    }
}

/// Output column names and types of a statement.
pub type Description = (Vec<String>, Vec<ColumnType>);

/// A description of engine-typed columns.
pub fn describe_columns(names: Vec<String>, types: &[DataType]) -> Description {
    (names, types.iter().map(|t| ColumnType::Engine(*t)).collect())
}

/// The result of one statement.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// Column names (empty for commands).
    pub names: Vec<String>,
    pub types: Vec<DataType>,
    pub batches: Vec<Batch>,
    /// PostgreSQL command tag, e.g. `SELECT 4`, `CREATE TABLE`.
    pub tag: String,
    /// Whether the statement returns rows (a query, EXPLAIN, SHOW, … RETURNING).
    pub returns_rows: bool,
}

impl QueryResult {
    pub fn row_count(&self) -> usize {
        self.batches.iter().map(|b| b.rows).sum()
    }

    /// All rows as values (tests and small results).
    pub fn rows(&self) -> Vec<Vec<Value>> {
        self.batches.iter().flat_map(|b| (0..b.rows).map(move |r| b.output_row(r))).collect()
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub runtime: RuntimeSettings,
    pub tier: Tier,
    pub chunk_rows: usize,
    /// Most memory one statement may hold (bytes); sessions may lower it, never raise it.
    pub memory_limit: usize,
    /// Most memory all running statements may hold together (bytes).
    pub memory_budget: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            runtime: RuntimeSettings::default(),
            tier: Tier::Compiled,
            chunk_rows: CHUNK_ROWS_DEFAULT,
            memory_limit: crate::control::default_memory_limit(),
            memory_budget: crate::control::default_memory_limit(),
        }
    }
}

/// An in-memory database.
pub struct Engine {
    runtime: Runtime,
    database: Database,
    tier: Mutex<Tier>,
    chunk_rows: usize,
    memory_limit: usize,
    memory_budget: Arc<MemoryBudget>,
}

impl Engine {
    pub fn new(settings: EngineSettings) -> Result<Engine> {
        Ok(Engine {
            runtime: Runtime::new(settings.runtime)?,
            database: Database::default(),
            tier: Mutex::new(settings.tier),
            chunk_rows: settings.chunk_rows,
            memory_limit: settings.memory_limit,
            memory_budget: MemoryBudget::new(settings.memory_budget),
        })
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    pub fn database(&self) -> &Database {
        &self.database
    }

    pub fn set_tier(&self, tier: Tier) {
        *self.tier.lock().unwrap_or_else(|p| p.into_inner()) = tier;
    }

    pub fn tier(&self) -> Tier {
        *self.tier.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn chunk_rows(&self) -> usize {
        self.chunk_rows
    }

    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// The server-wide budget of this engine's running statements.
    pub fn memory_budget(&self) -> &Arc<MemoryBudget> {
        &self.memory_budget
    }

    pub(crate) fn executor(&self) -> Executor<'_> {
        Executor { runtime: &self.runtime, tier: self.tier() }
    }

    /// The newest committed version of a table.
    pub fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.committed().get(name)
    }

    pub fn table_names(&self) -> Vec<String> {
        self.committed().names()
    }

    /// What a new statement outside any transaction sees.
    pub fn committed(&self) -> Catalog {
        Catalog::new(self.database.snapshot(), Default::default())
    }

    /// Adds a finished table (loaders), replacing one with the same name, in a transaction of
    /// its own.
    pub fn put_table(&self, mut table: Table) {
        if table.oid == 0 {
            table.oid = self.database.new_oid();
        }
        let transaction = self.database.new_transaction_id();
        let name = table.name.clone();
        // Without a timeout or a statement control, the lock waits for any writer to finish.
        if self.database.lock(transaction, &name, None).is_ok() {
            self.database.publish([(name, Some(Arc::new(table)))].into_iter().collect());
        }
        self.database.unlock_all(transaction);
    }

    /// Parses `sql` into statements. The syntax tree is built in one step no control check can
    /// interrupt, so its size bound (from the tokens, [`parse_tree_bytes_max`]) is reserved
    /// from the current statement's memory_limit and the server's budget first: a text whose
    /// tree might not fit is refused (53200) before the tree is built.
    pub fn parse(sql: &str) -> Result<Vec<ast::Statement>> {
        if sql.len() > SQL_BYTES_MAX {
            return Err(EngineError::LimitExceeded(format!("SQL text above {SQL_BYTES_MAX} bytes")));
        }
        let dialect = PostgreSqlDialect {};
        let tokens = Tokenizer::new(&dialect, sql)
            .with_unescape(true)
            .tokenize_with_location()
            .map_err(|e| EngineError::Syntax(ParserError::from(e).to_string()))?;
        let tokens = crate::pg_syntax::rewrite(tokens)?;
        let bound = parse_tree_bytes_max(sql, &tokens);
        let parsed = crate::control::with_reserved(bound, || {
            Parser::new(&dialect)
                .with_recursion_limit(crate::depth::parser_recursion_limit())
                .with_tokens_with_locations(tokens)
                .parse_statements()
        })?;
        parsed.map_err(|e| match e {
            ParserError::RecursionLimitExceeded => crate::depth::too_deep("the statement nests too deeply".into()),
            other => EngineError::Syntax(other.to_string()),
        })
    }

    /// A session with this engine's default settings.
    pub fn session(&self) -> Session {
        Session::new(self.memory_limit).within_budget(Arc::clone(&self.memory_budget))
    }

    /// Runs every statement of `sql` in one session, each in its own transaction unless the
    /// text opens one; stops at the first error. Long texts run on a thread whose stack fits
    /// their syntax tree (`depth`).
    pub fn execute(&self, sql: &str) -> Result<Vec<QueryResult>> {
        crate::depth::with_statement_stack(sql, || {
            let mut session = self.session();
            let results = Engine::parse(sql)
                .and_then(|statements| statements.iter().map(|s| session.execute_collect(self, s)).collect());
            session.close(self);
            results
        })?
    }

    /// Runs a single query and returns its rows (tests, benchmarks).
    pub fn query(&self, sql: &str) -> Result<QueryResult> {
        let mut results = self.execute(sql)?;
        results.pop().ok_or_else(|| EngineError::Syntax("empty query".into()))
    }

    /// Output names and types of a query without running it (`None` for other statements).
    pub fn describe(&self, sql: &str) -> Result<Option<Description>> {
        crate::depth::with_statement_stack(sql, || {
            let statements = Engine::parse(sql)?;
            match statements.as_slice() {
                [statement] => self.session().describe(self, statement),
                _ => Ok(None),
            }
        })?
    }

    pub(crate) fn bind(&self, catalog: &Catalog, query: &ast::Query) -> Result<BoundQuery> {
        QueryBinder::new(catalog).bind_query(query)
    }

    /// Runs a query to completion under `catalog` (INSERT … SELECT, tests).
    pub(crate) fn collect_query(&self, catalog: &Catalog, query: &ast::Query) -> Result<QueryResult> {
        let bound = self.bind(catalog, query)?;
        let sink = CollectSink::default();
        let rows = crate::stream::stream_plan(&self.executor(), &bound.plan, &sink)?;
        Ok(QueryResult {
            types: bound.plan.output_types(),
            names: bound.names,
            batches: sink.into_batches(),
            tag: format!("SELECT {rows}"),
            returns_rows: true,
        })
    }
}
