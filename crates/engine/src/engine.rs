//! The engine facade: SQL text in, results out. Owns the catalog and the runtime.

use std::io::BufRead;
use std::sync::{Arc, Mutex, RwLock};

use sqlparser::ast;
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::{Parser, ParserError};

use crate::bind::{cast_expr, identifier, object_name, sql_type, ExprBinder, Scope};
use crate::error::{EngineError, Result};
use crate::exec::{Executor, Tier};
use crate::explain::explain_plan;
use crate::expr::evaluate_constant;
use crate::query::QueryBinder;
use crate::runtime::{Runtime, RuntimeSettings};
use crate::storage::{Catalog, ColumnDef, Table, TableBuilder, CHUNK_ROWS_DEFAULT};
use crate::types::{parse_date, parse_decimal, DataType, Value};
use crate::vector::Batch;

/// Longest SQL text accepted (bytes).
pub const SQL_BYTES_MAX: usize = 1 << 20;
/// Longest CSV line accepted by COPY (bytes).
pub const CSV_LINE_BYTES_MAX: usize = 1 << 20;

/// Output column names and types of a statement.
pub type Description = (Vec<String>, Vec<DataType>);

/// The result of one statement.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// Column names (empty for commands).
    pub names: Vec<String>,
    pub types: Vec<DataType>,
    pub batches: Vec<Batch>,
    /// PostgreSQL command tag, e.g. `SELECT 4`, `CREATE TABLE`.
    pub tag: String,
    /// Whether the statement returns rows (a query or EXPLAIN).
    pub returns_rows: bool,
}

impl QueryResult {
    fn command(tag: impl Into<String>) -> QueryResult {
        QueryResult { names: Vec::new(), types: Vec::new(), batches: Vec::new(), tag: tag.into(), returns_rows: false }
    }

    pub fn row_count(&self) -> usize {
        self.batches.iter().map(|b| b.rows).sum()
    }

    /// All rows as values (tests and small results).
    pub fn rows(&self) -> Vec<Vec<Value>> {
        self.batches.iter().flat_map(|b| (0..b.rows).map(move |r| b.row(r))).collect()
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub runtime: RuntimeSettings,
    pub tier: Tier,
    pub chunk_rows: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings { runtime: RuntimeSettings::default(), tier: Tier::Compiled, chunk_rows: CHUNK_ROWS_DEFAULT }
    }
}

/// An in-memory database.
pub struct Engine {
    runtime: Runtime,
    catalog: RwLock<Catalog>,
    tier: Mutex<Tier>,
    chunk_rows: usize,
}

impl Engine {
    pub fn new(settings: EngineSettings) -> Result<Engine> {
        Ok(Engine {
            runtime: Runtime::new(settings.runtime)?,
            catalog: RwLock::new(Catalog::default()),
            tier: Mutex::new(settings.tier),
            chunk_rows: settings.chunk_rows,
        })
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
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

    pub fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.catalog.read().unwrap_or_else(|p| p.into_inner()).get(name)
    }

    pub fn table_names(&self) -> Vec<String> {
        self.catalog.read().unwrap_or_else(|p| p.into_inner()).names()
    }

    /// Adds a finished table (loaders), replacing one with the same name.
    pub fn put_table(&self, table: Table) {
        self.catalog.write().unwrap_or_else(|p| p.into_inner()).insert(table);
    }

    pub fn parse(sql: &str) -> Result<Vec<ast::Statement>> {
        if sql.len() > SQL_BYTES_MAX {
            return Err(EngineError::LimitExceeded(format!("SQL text above {SQL_BYTES_MAX} bytes")));
        }
        let dialect = PostgreSqlDialect {};
        let parser = Parser::new(&dialect).with_recursion_limit(crate::depth::parser_recursion_limit());
        parser.try_with_sql(sql).and_then(|mut p| p.parse_statements()).map_err(|e| match e {
            ParserError::RecursionLimitExceeded => crate::depth::too_deep("the statement nests too deeply".into()),
            other => EngineError::Syntax(other.to_string()),
        })
    }

    /// Runs every statement of `sql`; stops at the first error. Long texts run on a thread
    /// whose stack fits their syntax tree (`depth`).
    pub fn execute(&self, sql: &str) -> Result<Vec<QueryResult>> {
        crate::depth::with_statement_stack(sql, || {
            Engine::parse(sql)?.iter().map(|s| self.execute_statement(s)).collect()
        })?
    }

    /// Runs a single query and returns its rows (tests, benchmarks).
    pub fn query(&self, sql: &str) -> Result<QueryResult> {
        let mut results = self.execute(sql)?;
        results.pop().ok_or_else(|| EngineError::Syntax("empty query".into()))
    }

    /// Like [`Engine::describe`] for a statement whose parameters were replaced by
    /// [`crate::bind::PARAMETER_SENTINEL`] literals; also returns the inferred parameter types.
    pub fn describe_with_parameters(
        &self,
        sql: &str,
    ) -> Result<(Option<Description>, std::collections::BTreeMap<usize, DataType>)> {
        // Parameter types are collected per thread: infer them on the thread that binds.
        let (described, types) =
            crate::depth::with_statement_stack(sql, || crate::bind::infer_parameter_types(|| self.describe_here(sql)))?;
        Ok((described?, types))
    }

    /// Output names and types of a query without running it (`None` for other statements).
    pub fn describe(&self, sql: &str) -> Result<Option<Description>> {
        crate::depth::with_statement_stack(sql, || self.describe_here(sql))?
    }

    fn describe_here(&self, sql: &str) -> Result<Option<Description>> {
        let statements = Engine::parse(sql)?;
        match statements.as_slice() {
            [ast::Statement::Query(query)] => {
                let bound = self.bind(query)?;
                let types = bound.plan.output_types();
                Ok(Some((bound.names, types)))
            }
            [ast::Statement::Explain { .. }] => Ok(Some((vec!["QUERY PLAN".into()], vec![DataType::Text]))),
            _ => Ok(None),
        }
    }

    pub fn execute_statement(&self, statement: &ast::Statement) -> Result<QueryResult> {
        self.dispatch(statement)
    }

    fn dispatch(&self, statement: &ast::Statement) -> Result<QueryResult> {
        match statement {
            ast::Statement::Query(query) => self.run_query(query),
            ast::Statement::Explain { statement, analyze: false, .. } => self.explain(statement),
            ast::Statement::CreateTable(create) => self.create_table(create),
            ast::Statement::Drop { object_type: ast::ObjectType::Table, if_exists, names, .. } => {
                self.drop_tables(names, *if_exists)
            }
            ast::Statement::Insert(insert) => self.insert(insert),
            ast::Statement::Copy {
                source,
                to: false,
                target: ast::CopyTarget::File { filename },
                options,
                legacy_options,
                ..
            } => self.copy_from(source, filename, options, legacy_options),
            ast::Statement::StartTransaction { .. } => Ok(QueryResult::command("BEGIN")),
            ast::Statement::Commit { .. } => Ok(QueryResult::command("COMMIT")),
            ast::Statement::Rollback { .. } => Ok(QueryResult::command("ROLLBACK")),
            ast::Statement::Set(_) => Ok(QueryResult::command("SET")),
            other => {
                let text = other.to_string();
                let feature: String = text.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
                Err(EngineError::unsupported(format!("statement {feature}")))
            }
        }
    }

    fn bind(&self, query: &ast::Query) -> Result<crate::query::BoundQuery> {
        let catalog = self.catalog.read().unwrap_or_else(|p| p.into_inner());
        QueryBinder::new(&catalog).bind_query(query)
    }

    fn run_query(&self, query: &ast::Query) -> Result<QueryResult> {
        let bound = self.bind(query)?;
        let executor = Executor { runtime: &self.runtime, tier: self.tier() };
        crate::exec::subquery::prepare(&executor, &bound.plan)?;
        let batches = executor.execute(&bound.plan)?;
        let types = bound.plan.output_types();
        let rows: usize = batches.iter().map(|b| b.rows).sum();
        Ok(QueryResult { names: bound.names, types, batches, tag: format!("SELECT {rows}"), returns_rows: true })
    }

    fn explain(&self, statement: &ast::Statement) -> Result<QueryResult> {
        let ast::Statement::Query(query) = statement else {
            return Err(EngineError::unsupported("EXPLAIN of a non-query statement"));
        };
        let bound = self.bind(query)?;
        let text = explain_plan(&bound.plan, self.tier());
        let lines: Vec<Value> = text.lines().map(|l| Value::Text(l.to_string())).collect();
        let mut vector = crate::vector::Vector::empty(DataType::Text);
        for line in &lines {
            vector.append(&crate::vector::Vector::broadcast(line, DataType::Text, 1));
        }
        let batch = Batch::new(vec![vector], lines.len());
        Ok(QueryResult {
            names: vec!["QUERY PLAN".into()],
            types: vec![DataType::Text],
            batches: vec![batch],
            tag: "EXPLAIN".into(),
            returns_rows: true,
        })
    }

    fn create_table(&self, create: &ast::CreateTable) -> Result<QueryResult> {
        let name = object_name(&create.name)?;
        if create.query.is_some() {
            return Err(EngineError::unsupported("CREATE TABLE AS"));
        }
        let mut schema = Vec::new();
        for column in &create.columns {
            let column_name = identifier(&column.name);
            if schema.iter().any(|c: &ColumnDef| c.name == column_name) {
                return Err(EngineError::Syntax(format!("column \"{column_name}\" specified more than once")));
            }
            schema.push(ColumnDef { name: column_name, data_type: sql_type(&column.data_type)? });
        }
        let mut catalog = self.catalog.write().unwrap_or_else(|p| p.into_inner());
        if catalog.contains(&name) {
            if create.if_not_exists {
                return Ok(QueryResult::command("CREATE TABLE"));
            }
            return Err(EngineError::TableExists(name));
        }
        catalog.insert(TableBuilder::new(Arc::clone(self.runtime.pool()), &name, schema, self.chunk_rows).finish());
        Ok(QueryResult::command("CREATE TABLE"))
    }

    fn drop_tables(&self, names: &[ast::ObjectName], if_exists: bool) -> Result<QueryResult> {
        let mut catalog = self.catalog.write().unwrap_or_else(|p| p.into_inner());
        for name in names {
            let name = object_name(name)?;
            if catalog.remove(&name).is_none() && !if_exists {
                return Err(EngineError::UnknownTable(name));
            }
        }
        Ok(QueryResult::command("DROP TABLE"))
    }

    /// Takes a table out of the catalog for appending; fails if a running query still reads it.
    fn take_for_append(&self, name: &str) -> Result<TableBuilder> {
        let mut catalog = self.catalog.write().unwrap_or_else(|p| p.into_inner());
        let table = catalog.remove(name).ok_or_else(|| EngineError::UnknownTable(name.to_string()))?;
        match Arc::try_unwrap(table) {
            Ok(table) => Ok(TableBuilder::from_table(Arc::clone(self.runtime.pool()), table)),
            Err(shared) => {
                catalog.insert_arc(shared);
                Err(EngineError::Runtime(format!("table \"{name}\" is being read by a running query; retry")))
            }
        }
    }

    fn insert(&self, insert: &ast::Insert) -> Result<QueryResult> {
        let ast::TableObject::TableName(name) = &insert.table else {
            return Err(EngineError::unsupported("INSERT into a table function"));
        };
        let name = object_name(name)?;
        let source =
            insert.source.as_ref().ok_or_else(|| EngineError::unsupported("INSERT without VALUES or SELECT"))?;
        let schema = self.table(&name)?.schema.clone();
        let targets = target_columns(&schema, &insert.columns)?;
        let rows = match source.body.as_ref() {
            ast::SetExpr::Values(values) => values_rows(&values.rows, &targets, &schema)?,
            _ => self.run_query(source)?.rows(),
        };
        let count = rows.len();
        let mut builder = self.take_for_append(&name)?;
        let outcome = all_or_nothing(&mut builder, |builder| append_rows(builder, &schema, &targets, rows));
        self.put_table(builder.finish());
        outcome?;
        Ok(QueryResult::command(format!("INSERT 0 {count}")))
    }

    fn copy_from(
        &self,
        source: &ast::CopySource,
        filename: &str,
        options: &[ast::CopyOption],
        legacy: &[ast::CopyLegacyOption],
    ) -> Result<QueryResult> {
        let ast::CopySource::Table { table_name, columns } = source else {
            return Err(EngineError::unsupported("COPY (query) FROM"));
        };
        let name = object_name(table_name)?;
        let parquet = is_parquet_format(options, legacy)?;
        let format = if parquet { None } else { Some(CsvFormat::from_options(options, legacy)?) };
        let schema = self.table(&name)?.schema.clone();
        let columns: Vec<ast::ObjectName> = columns.iter().map(|c| ast::ObjectName::from(vec![c.clone()])).collect();
        let targets = target_columns(&schema, &columns)?;
        let mut builder = self.take_for_append(&name)?;
        let outcome = all_or_nothing(&mut builder, |builder| match format {
            None => crate::parquet_file::load(filename, &schema, &targets, builder),
            Some(format) => std::fs::File::open(filename)
                .map_err(|e| EngineError::io(format!("opening {filename}"), e))
                .and_then(|file| copy_lines(std::io::BufReader::new(file), &format, &schema, &targets, builder)),
        });
        self.put_table(builder.finish());
        Ok(QueryResult::command(format!("COPY {}", outcome?)))
    }
}

impl Catalog {
    fn insert_arc(&mut self, table: Arc<Table>) {
        self.insert_shared(table);
    }
}

/// Runs an append and undoes it if it fails part-way, so a statement that fails leaves the
/// table unchanged (PostgreSQL's statement atomicity for INSERT and COPY).
fn all_or_nothing<T>(builder: &mut TableBuilder, append: impl FnOnce(&mut TableBuilder) -> Result<T>) -> Result<T> {
    let mark = builder.mark();
    let outcome = append(builder);
    if outcome.is_err() {
        builder.roll_back(&mark);
    }
    outcome
}

fn target_columns(schema: &[ColumnDef], columns: &[ast::ObjectName]) -> Result<Vec<usize>> {
    if columns.is_empty() {
        return Ok((0..schema.len()).collect());
    }
    columns
        .iter()
        .map(|c| {
            let name = object_name(c)?;
            schema
                .iter()
                .position(|d| d.name == name)
                .ok_or_else(|| EngineError::UnknownColumn(format!("\"{name}\" does not exist")))
        })
        .collect()
}

fn values_rows(
    rows: &[ast::Parens<Vec<ast::Expr>>],
    targets: &[usize],
    schema: &[ColumnDef],
) -> Result<Vec<Vec<Value>>> {
    let scope = Scope::default();
    let binder = ExprBinder::new(&scope);
    rows.iter()
        .map(|row| {
            if row.content.len() != targets.len() {
                return Err(EngineError::Syntax(format!(
                    "INSERT has {} values for {} columns",
                    row.content.len(),
                    targets.len()
                )));
            }
            row.content
                .iter()
                .zip(targets)
                .map(|(expr, &column)| evaluate_constant(&cast_expr(binder.bind(expr)?, schema[column].data_type)?))
                .collect()
        })
        .collect()
}

fn append_rows(
    builder: &mut TableBuilder,
    schema: &[ColumnDef],
    targets: &[usize],
    rows: Vec<Vec<Value>>,
) -> Result<()> {
    for row in rows {
        let mut full = vec![Value::Null; schema.len()];
        for (value, &column) in row.into_iter().zip(targets) {
            full[column] = coerce_value(value, schema[column].data_type)?;
        }
        builder.push_row(&full)?;
    }
    Ok(())
}

/// Converts a value to a column's type (INSERT … SELECT and VALUES).
pub fn coerce_value(value: Value, to: DataType) -> Result<Value> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    let data_type = match &value {
        Value::Bool(_) => DataType::Bool,
        Value::Int32(_) => DataType::Int32,
        Value::Int64(_) => DataType::Int64,
        Value::Float64(_) => DataType::Float64,
        Value::Date(_) => DataType::Date,
        Value::Decimal { scale, .. } => DataType::Decimal { precision: 18, scale: *scale },
        Value::Text(_) => DataType::Text,
        Value::Numeric(_) => DataType::Numeric,
        Value::Null => unreachable!("handled above"),
    };
    evaluate_constant(&cast_expr(crate::expr::Expr::literal(value, data_type), to)?)
}

/// Whether COPY reads Parquet (`FORMAT parquet`); Parquet files carry their own schema and
/// encoding, so no other option applies to them.
fn is_parquet_format(options: &[ast::CopyOption], legacy: &[ast::CopyLegacyOption]) -> Result<bool> {
    let parquet = options
        .iter()
        .any(|o| matches!(o, ast::CopyOption::Format(ident) if ident.value.eq_ignore_ascii_case("parquet")));
    if parquet && (options.len() > 1 || !legacy.is_empty()) {
        return Err(EngineError::unsupported("COPY options other than FORMAT with FORMAT parquet"));
    }
    Ok(parquet)
}

/// COPY's CSV options.
struct CsvFormat {
    delimiter: char,
    header: bool,
    quote: char,
    null: String,
}

impl CsvFormat {
    fn from_options(options: &[ast::CopyOption], legacy: &[ast::CopyLegacyOption]) -> Result<CsvFormat> {
        let mut format = CsvFormat { delimiter: '\t', header: false, quote: '"', null: "\\N".into() };
        let mut csv = false;
        for option in options {
            match option {
                ast::CopyOption::Format(ident) if ident.value.eq_ignore_ascii_case("csv") => csv = true,
                ast::CopyOption::Format(ident) if ident.value.eq_ignore_ascii_case("text") => {}
                ast::CopyOption::Delimiter(c) => format.delimiter = *c,
                ast::CopyOption::Header(h) => format.header = *h,
                ast::CopyOption::Quote(c) => format.quote = *c,
                ast::CopyOption::Null(n) => format.null = n.clone(),
                other => return Err(EngineError::unsupported(format!("COPY option {other}"))),
            }
        }
        for option in legacy {
            match option {
                ast::CopyLegacyOption::Csv(_) => csv = true,
                ast::CopyLegacyOption::Delimiter(c) => format.delimiter = *c,
                ast::CopyLegacyOption::Null(n) => format.null = n.clone(),
                other => return Err(EngineError::unsupported(format!("COPY option {other}"))),
            }
        }
        if csv {
            if !options.iter().any(|o| matches!(o, ast::CopyOption::Delimiter(_)))
                && !legacy.iter().any(|o| matches!(o, ast::CopyLegacyOption::Delimiter(_)))
            {
                format.delimiter = ',';
            }
            if !options.iter().any(|o| matches!(o, ast::CopyOption::Null(_))) {
                format.null = String::new();
            }
        }
        Ok(format)
    }
}

/// Splits one CSV line into fields; `None` for NULL (unquoted field equal to the NULL string).
fn split_csv(line: &str, format: &CsvFormat) -> Vec<Option<String>> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let (mut quoted, mut in_quotes) = (false, false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if in_quotes {
            if c == format.quote {
                if chars.peek() == Some(&format.quote) {
                    field.push(c);
                    chars.next();
                } else {
                    in_quotes = false;
                }
            } else {
                field.push(c);
            }
        } else if c == format.quote {
            in_quotes = true;
            quoted = true;
        } else if c == format.delimiter {
            fields.push(if !quoted && field == format.null { None } else { Some(std::mem::take(&mut field)) });
            field.clear();
            quoted = false;
        } else {
            field.push(c);
        }
    }
    fields.push(if !quoted && field == format.null { None } else { Some(field) });
    fields
}

/// Parses a text field as a column type.
pub fn parse_field(text: &str, data_type: DataType) -> Result<Value> {
    let invalid = || EngineError::InvalidValue(format!("\"{text}\" is not a valid {}", data_type.sql_name()));
    Ok(match data_type {
        DataType::Bool => match text.trim() {
            "t" | "true" | "1" | "yes" | "on" => Value::Bool(true),
            "f" | "false" | "0" | "no" | "off" => Value::Bool(false),
            _ => return Err(invalid()),
        },
        DataType::Int32 => Value::Int32(parse_integer(text, data_type)?),
        DataType::Int64 => Value::Int64(parse_integer(text, data_type)?),
        DataType::Float64 => Value::Float64(text.trim().parse().map_err(|_| invalid())?),
        DataType::Date => Value::Date(parse_date(text)?),
        DataType::Decimal { precision, scale } => {
            let value = parse_decimal(text, scale)?;
            // numeric(p, s) holds fewer than 10^p units of 10^-s; PostgreSQL rejects the rest.
            if u128::from(value.unsigned_abs()) >= 10u128.pow(u32::from(precision)) {
                return Err(EngineError::Overflow(format!("numeric field overflow: \"{text}\"")));
            }
            Value::Decimal { value, scale }
        }
        DataType::Text => Value::Text(text.to_string()),
        DataType::Numeric => Value::Numeric(crate::numeric::Numeric::parse(text)?),
    })
}

/// Parses an integer field; out-of-range values are overflow (22003), like PostgreSQL.
fn parse_integer<T: std::str::FromStr<Err = std::num::ParseIntError>>(text: &str, data_type: DataType) -> Result<T> {
    text.trim().parse().map_err(|e: std::num::ParseIntError| match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
            EngineError::Overflow(format!("value \"{text}\" is out of range for type {}", data_type.sql_name()))
        }
        _ => EngineError::InvalidValue(format!("invalid input syntax for type {}: \"{text}\"", data_type.sql_name())),
    })
}

fn copy_lines(
    reader: impl BufRead,
    format: &CsvFormat,
    schema: &[ColumnDef],
    targets: &[usize],
    builder: &mut TableBuilder,
) -> Result<usize> {
    let mut count = 0;
    for (number, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| EngineError::io("reading COPY input", e))?;
        if number == 0 && format.header {
            continue;
        }
        if line.len() > CSV_LINE_BYTES_MAX {
            return Err(EngineError::LimitExceeded(format!(
                "COPY line {} above {CSV_LINE_BYTES_MAX} bytes",
                number + 1
            )));
        }
        if line.is_empty() {
            continue;
        }
        let fields = split_csv(&line, format);
        let at_line = |source| EngineError::CopyLine { line: number + 1, source: Box::new(source) };
        if fields.len() != targets.len() {
            let shape =
                if fields.len() > targets.len() { "extra data after last expected column" } else { "missing data" };
            let detail = format!("{shape}: {} fields, expected {}", fields.len(), targets.len());
            return Err(at_line(EngineError::CopyFormat(detail)));
        }
        let mut row = vec![Value::Null; schema.len()];
        for (field, &column) in fields.into_iter().zip(targets) {
            if let Some(text) = field {
                row[column] = parse_field(&text, schema[column].data_type).map_err(at_line)?;
            }
        }
        builder.push_row(&row).map_err(at_line)?;
        count += 1;
    }
    Ok(count)
}
