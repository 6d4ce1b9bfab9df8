//! COPY: FROM STDIN and FROM a server file (text, CSV, Parquet), TO STDOUT (text, CSV).
//!
//! ```text
//!   COPY t FROM STDIN ─► lock t ─► CopyIn { builder on the newest version, record parser }
//!        CopyData* ─► records (CSV records may span lines) ─► fields ─► push_row (constraints)
//!        CopyDone  ─► the new version joins the transaction    CopyFail / error ─► dropped
//!   COPY t|(query) TO STDOUT ─► the streaming executor, one CopyData message per row
//! ```
//!
//! Invariants: nothing is half loaded (the new version reaches the transaction only when the
//! whole input was read without error); an error names the input line it came from; one record
//! is at most COPY_RECORD_BYTES_MAX bytes; input must be UTF-8.

use std::io::Read;
use std::sync::Arc;

use sqlparser::ast;

use crate::bind::{cast_expr, identifier, object_name};
use crate::ddl::user_table_name;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::expr::evaluate_constant;
use crate::session::{Outcome, Session};
use crate::storage::{ColumnDef, TableBuilder};
use crate::stream::{ResultShape, ResultSink};
use crate::types::{parse_date, parse_decimal, DataType, Value};
use crate::vector::Batch;

/// Longest COPY record accepted (bytes).
pub const COPY_RECORD_BYTES_MAX: usize = 1 << 20;
/// Bytes of a server-side file read at a time.
const FILE_READ_BYTES: usize = 1 << 20;

/// The parts of a COPY statement.
pub struct CopyStatement<'a> {
    pub source: &'a ast::CopySource,
    pub to: bool,
    pub target: &'a ast::CopyTarget,
    pub options: &'a [ast::CopyOption],
    pub legacy_options: &'a [ast::CopyLegacyOption],
}

/// COPY's text and CSV options.
#[derive(Debug, Clone)]
pub struct CopyFormat {
    pub csv: bool,
    pub delimiter: char,
    pub header: bool,
    pub quote: char,
    pub escape: char,
    pub null: String,
}

impl CopyFormat {
    /// Reads WITH (…) and legacy options; `parquet` is reported separately.
    fn from_options(options: &[ast::CopyOption], legacy: &[ast::CopyLegacyOption]) -> Result<(CopyFormat, bool)> {
        let (mut csv, mut parquet) = (false, false);
        let (mut delimiter, mut null, mut quote, mut escape, mut header) = (None, None, None, None, false);
        for option in options {
            match option {
                ast::CopyOption::Format(ident) => match ident.value.to_lowercase().as_str() {
                    "csv" => csv = true,
                    "text" => {}
                    "parquet" => parquet = true,
                    other => return Err(EngineError::unsupported(format!("COPY format {other}"))),
                },
                ast::CopyOption::Delimiter(c) => delimiter = Some(*c),
                ast::CopyOption::Header(h) => header = *h,
                ast::CopyOption::Quote(c) => quote = Some(*c),
                ast::CopyOption::Escape(c) => escape = Some(*c),
                ast::CopyOption::Null(n) => null = Some(n.clone()),
                ast::CopyOption::Encoding(e) if e.eq_ignore_ascii_case("utf8") || e.eq_ignore_ascii_case("utf-8") => {}
                other => return Err(EngineError::unsupported(format!("COPY option {other}"))),
            }
        }
        for option in legacy {
            match option {
                ast::CopyLegacyOption::Csv(csv_options) if csv_options.is_empty() => csv = true,
                ast::CopyLegacyOption::Csv(csv_options) => {
                    csv = true;
                    for csv_option in csv_options {
                        match csv_option {
                            ast::CopyLegacyCsvOption::Header => header = true,
                            ast::CopyLegacyCsvOption::Quote(c) => quote = Some(*c),
                            ast::CopyLegacyCsvOption::Escape(c) => escape = Some(*c),
                            other => return Err(EngineError::unsupported(format!("COPY option {other}"))),
                        }
                    }
                }
                ast::CopyLegacyOption::Delimiter(c) => delimiter = Some(*c),
                ast::CopyLegacyOption::Null(n) => null = Some(n.clone()),
                other => return Err(EngineError::unsupported(format!("COPY option {other}"))),
            }
        }
        if header && !csv {
            return Err(EngineError::unsupported("COPY HEADER in text format"));
        }
        if !csv && (quote.is_some() || escape.is_some()) {
            return Err(EngineError::unsupported("COPY QUOTE and ESCAPE outside CSV mode"));
        }
        let quote = quote.unwrap_or('"');
        let format = CopyFormat {
            csv,
            delimiter: delimiter.unwrap_or(if csv { ',' } else { '\t' }),
            header,
            quote,
            escape: escape.unwrap_or(quote),
            null: null.unwrap_or_else(|| if csv { String::new() } else { "\\N".into() }),
        };
        if parquet && (options.len() > 1 || !legacy.is_empty()) {
            return Err(EngineError::unsupported("COPY options other than FORMAT with FORMAT parquet"));
        }
        Ok((format, parquet))
    }
}

/// Starts a COPY statement: finishes COPY FROM a file and COPY TO STDOUT at once, returns
/// the pending COPY FROM STDIN.
pub fn start(
    session: &mut Session,
    engine: &Engine,
    copy: CopyStatement<'_>,
    sink: &dyn ResultSink,
) -> Result<Outcome> {
    let (format, parquet) = CopyFormat::from_options(copy.options, copy.legacy_options)?;
    if copy.to {
        if !matches!(copy.target, ast::CopyTarget::Stdout) {
            return Err(EngineError::unsupported("COPY TO a server file or program (use TO STDOUT)"));
        }
        if parquet {
            return Err(EngineError::unsupported("COPY TO with FORMAT parquet"));
        }
        return Ok(Outcome::Done(copy_to_stdout(session, engine, copy.source, format, sink)?));
    }
    let ast::CopySource::Table { table_name, columns } = copy.source else {
        return Err(EngineError::unsupported("COPY (query) FROM"));
    };
    let name = crate::ddl::storage_key(session, engine, &user_table_name(table_name)?);
    if let Some(target) = session.catalog(engine).find(&name) {
        crate::view::check_not_view(&target, "COPY FROM")?;
        // Rows would have to be routed (or checked against the partition's bounds).
        if crate::family::is_partitioned(&target) || target.constraints.family.bound.is_some() {
            return Err(EngineError::unsupported(format!(
                "COPY FROM into partitioned table or partition \"{}\"",
                target.name
            )));
        }
    }
    let base = session.take_for_write(engine, &name)?.ok_or_else(|| EngineError::UnknownTable(name.clone()))?;
    let columns: Vec<ast::ObjectName> = columns.iter().map(|c| ast::ObjectName::from(vec![c.clone()])).collect();
    let targets = target_columns(&base.schema, &columns)?;
    let builder = TableBuilder::from_version(Arc::clone(engine.runtime().pool()), base);
    let mut pending = CopyIn { name, builder, targets, parser: RecordParser::new(format), rows: 0 };
    match copy.target {
        ast::CopyTarget::Stdin => Ok(Outcome::CopyIn(Box::new(pending))),
        ast::CopyTarget::File { filename } if parquet => {
            let schema = pending.builder.schema().to_vec();
            pending.rows = crate::parquet_file::load(filename, &schema, &pending.targets, &mut pending.builder)?;
            finish_now(session, pending)
        }
        ast::CopyTarget::File { filename } => {
            let mut file =
                std::fs::File::open(filename).map_err(|e| EngineError::io(format!("opening {filename}"), e))?;
            let mut buffer = vec![0; FILE_READ_BYTES];
            loop {
                let read = file.read(&mut buffer).map_err(|e| EngineError::io(format!("reading {filename}"), e))?;
                if read == 0 {
                    break;
                }
                pending.data(&buffer[..read])?;
            }
            finish_now(session, pending)
        }
        _ => Err(EngineError::unsupported("COPY FROM a program")),
    }
}

fn finish_now(session: &mut Session, pending: CopyIn) -> Result<Outcome> {
    let (name, table, rows) = pending.finish()?;
    session.write(&name, Some(table));
    Ok(Outcome::Done(format!("COPY {rows}")))
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

/// A COPY FROM in progress.
pub struct CopyIn {
    name: String,
    builder: TableBuilder,
    targets: Vec<usize>,
    parser: RecordParser,
    rows: usize,
}

impl CopyIn {
    /// Columns of the CopyInResponse.
    pub fn columns(&self) -> usize {
        self.targets.len()
    }

    /// Takes more input; loads every complete record in it.
    pub fn data(&mut self, bytes: &[u8]) -> Result<()> {
        self.parser.feed(bytes)?;
        while let Some((line, fields)) = self.parser.next_record(false)? {
            self.load(line, fields)?;
        }
        Ok(())
    }

    /// Loads what is left (a last record without a newline) and yields the new version.
    pub fn finish(mut self) -> Result<(String, crate::storage::Table, usize)> {
        while let Some((line, fields)) = self.parser.next_record(true)? {
            self.load(line, fields)?;
        }
        Ok((self.name, self.builder.finish(), self.rows))
    }

    fn load(&mut self, line: usize, fields: Vec<Option<String>>) -> Result<()> {
        let at_line = |source| EngineError::CopyLine { line, source: Box::new(source) };
        if fields.len() != self.targets.len() {
            let shape = if fields.len() > self.targets.len() {
                "extra data after last expected column"
            } else {
                "missing data for a column"
            };
            return Err(at_line(EngineError::CopyFormat(format!(
                "{shape}: {} fields, expected {}",
                fields.len(),
                self.targets.len()
            ))));
        }
        let schema = self.builder.schema();
        let mut row: Vec<Value> =
            self.builder.constraints().defaults.iter().map(|d| d.clone().unwrap_or(Value::Null)).collect();
        for (field, &column) in fields.into_iter().zip(&self.targets) {
            row[column] = match field {
                Some(text) => parse_field(&text, schema[column].data_type).map_err(at_line)?,
                None => Value::Null,
            };
        }
        self.builder.push_row(&row).map_err(at_line)?;
        self.rows += 1;
        if self.rows.is_multiple_of(crate::vector::VECTOR_ROWS) {
            crate::control::check()?;
        }
        Ok(())
    }
}

/// Splits COPY input into records and fields, across arbitrary chunk boundaries.
struct RecordParser {
    format: CopyFormat,
    pending: Vec<u8>,
    /// Input line of the next record (1-based).
    line: usize,
    /// The text-format end marker `\.` was seen: ignore the rest.
    ended: bool,
    header_pending: bool,
}

impl RecordParser {
    fn new(format: CopyFormat) -> RecordParser {
        let header_pending = format.header;
        RecordParser { format, pending: Vec::new(), line: 1, ended: false, header_pending }
    }

    fn feed(&mut self, bytes: &[u8]) -> Result<()> {
        if !self.ended {
            self.pending.extend_from_slice(bytes);
        }
        Ok(())
    }

    /// The next complete record: its first line number and its fields (`None` = NULL).
    /// At the end of input (`last`) a final record without a newline counts too.
    fn next_record(&mut self, last: bool) -> Result<Option<(usize, Vec<Option<String>>)>> {
        loop {
            if self.ended {
                return Ok(None);
            }
            let Some((end, lines)) = self.record_end(last) else {
                if self.pending.len() > COPY_RECORD_BYTES_MAX {
                    return Err(EngineError::CopyLine {
                        line: self.line,
                        source: Box::new(EngineError::LimitExceeded(format!(
                            "record above {COPY_RECORD_BYTES_MAX} bytes"
                        ))),
                    });
                }
                return Ok(None);
            };
            let raw: Vec<u8> = self.pending.drain(..end).collect();
            let line = self.line;
            self.line += lines;
            let mut text =
                crate::error::utf8(&raw).map_err(|error| EngineError::CopyLine { line, source: Box::new(error) })?;
            text = text.strip_suffix('\n').unwrap_or(text);
            text = text.strip_suffix('\r').unwrap_or(text);
            if self.header_pending {
                self.header_pending = false;
                continue;
            }
            if !self.format.csv && text == "\\." {
                self.ended = true;
                self.pending.clear();
                return Ok(None);
            }
            if text.is_empty() && last && self.pending.is_empty() && raw.is_empty() {
                return Ok(None);
            }
            let fields = if self.format.csv { split_csv(text, &self.format) } else { split_text(text, &self.format) };
            let fields = fields.map_err(|source| EngineError::CopyLine { line, source: Box::new(source) })?;
            return Ok(Some((line, fields)));
        }
    }

    /// Where the first complete record ends (after its newline) and how many lines it spans.
    fn record_end(&self, last: bool) -> Option<(usize, usize)> {
        let mut in_quotes = false;
        let mut lines = 0;
        let quote = self.format.quote as u32;
        let escape = self.format.escape as u32;
        let mut index = 0;
        while index < self.pending.len() {
            let byte = self.pending[index];
            if self.format.csv && u32::from(byte) == quote && quote < 128 {
                if in_quotes && escape == quote && self.pending.get(index + 1) == Some(&byte) {
                    index += 2;
                    continue;
                }
                in_quotes = !in_quotes;
            } else if self.format.csv && in_quotes && u32::from(byte) == escape && escape < 128 {
                index += 2;
                continue;
            } else if byte == b'\n' {
                lines += 1;
                if !in_quotes {
                    return Some((index + 1, lines));
                }
            }
            index += 1;
        }
        (last && !self.pending.is_empty()).then_some((self.pending.len(), lines.max(1)))
    }
}

/// Fields of one text-format record: backslash escapes, `\N` (or the NULL string) for NULL.
fn split_text(line: &str, format: &CopyFormat) -> Result<Vec<Option<String>>> {
    line.split(format.delimiter)
        .map(|raw| if raw == format.null { Ok(None) } else { unescape_text(raw).map(Some) })
        .collect()
}

fn unescape_text(raw: &str) -> Result<String> {
    if !raw.contains('\\') {
        return Ok(raw.to_string());
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('v') => out.push('\u{b}'),
            Some('x') => {
                let digits: String = std::iter::from_fn(|| chars.next_if(|d| d.is_ascii_hexdigit())).take(2).collect();
                let code = u8::from_str_radix(&digits, 16)
                    .map_err(|_| EngineError::InvalidValue("invalid \\x escape in COPY data".into()))?;
                out.push(char::from(code));
            }
            Some(d @ '0'..='7') => {
                let mut code = d.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.next_if(|c| ('0'..='7').contains(c)) {
                        Some(next) => code = code * 8 + next.to_digit(8).unwrap_or(0),
                        None => break,
                    }
                }
                out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
            }
            Some(other) => out.push(other),
            None => return Err(EngineError::CopyFormat("end-of-copy marker corrupt".into())),
        }
    }
    Ok(out)
}

/// Fields of one CSV record; `None` for NULL (an unquoted field equal to the NULL string).
fn split_csv(record: &str, format: &CopyFormat) -> Result<Vec<Option<String>>> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let (mut quoted, mut in_quotes) = (false, false);
    let mut chars = record.chars().peekable();
    while let Some(c) = chars.next() {
        if in_quotes {
            let escaped = c == format.escape && chars.peek().is_some_and(|&n| n == format.quote || n == format.escape);
            if escaped {
                field.extend(chars.next());
            } else if c == format.quote {
                in_quotes = false;
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
    if in_quotes {
        return Err(EngineError::CopyFormat("unterminated CSV quoted field".into()));
    }
    fields.push(if !quoted && field == format.null { None } else { Some(field) });
    Ok(fields)
}

/// Parses a text field as a column type.
pub fn parse_field(text: &str, data_type: DataType) -> Result<Value> {
    let invalid =
        || EngineError::InvalidValue(format!("invalid input syntax for type {}: \"{text}\"", data_type.sql_name()));
    Ok(match data_type {
        DataType::Bool => match text.trim().to_ascii_lowercase().as_str() {
            "t" | "true" | "1" | "yes" | "y" | "on" => Value::Bool(true),
            "f" | "false" | "0" | "no" | "n" | "off" => Value::Bool(false),
            _ => return Err(invalid()),
        },
        DataType::Int16
        | DataType::Float32
        | DataType::Char(_)
        | DataType::Varchar(_)
        | DataType::Timestamp
        | DataType::Interval => crate::cast::parse_value(text, data_type)?,
        DataType::TimestampTz => {
            crate::datetime::check_time_zone()?;
            crate::cast::parse_value(text, data_type)?
        }
        DataType::Int32 => Value::Int32(parse_integer(text, data_type)?),
        DataType::Int64 => Value::Int64(parse_integer(text, data_type)?),
        DataType::Float64 => Value::Float64(parse_float(text).ok_or_else(invalid)?),
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

/// PostgreSQL's float8 input: numbers, and NaN / Infinity in any case.
fn parse_float(text: &str) -> Option<f64> {
    let trimmed = text.trim();
    match trimmed.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "infinity" | "+infinity" | "inf" | "+inf" => Some(f64::INFINITY),
        "-infinity" | "-inf" => Some(f64::NEG_INFINITY),
        _ => trimmed.parse().ok().filter(|v: &f64| v.is_finite()),
    }
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

/// Converts a value to a column's type (INSERT … SELECT and VALUES).
pub fn coerce_value(value: Value, to: DataType) -> Result<Value> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    let data_type = match &value {
        Value::Bool(_) => DataType::Bool,
        Value::Int32(_) => DataType::Int32,
        Value::Int64(_) => DataType::Int64,
        Value::Float32(_) => DataType::Float32,
        Value::Float64(_) => DataType::Float64,
        Value::Date(_) => DataType::Date,
        Value::Decimal { scale, .. } => DataType::Decimal { precision: 18, scale: *scale },
        Value::Text(_) => DataType::Text,
        Value::Numeric(_) => DataType::Numeric,
        Value::Timestamp(_) => DataType::Timestamp,
        Value::TimestampTz(_) => DataType::TimestampTz,
        Value::Interval(_) => DataType::Interval,
        Value::Null => unreachable!("handled above"),
    };
    if data_type == to {
        return Ok(value);
    }
    evaluate_constant(&cast_expr(crate::expr::Expr::literal(value, data_type), to)?)
}

/// COPY t [(columns)] | (query) TO STDOUT.
fn copy_to_stdout(
    session: &mut Session,
    engine: &Engine,
    source: &ast::CopySource,
    format: CopyFormat,
    sink: &dyn ResultSink,
) -> Result<String> {
    let query = match source {
        ast::CopySource::Query(query) => (**query).clone(),
        ast::CopySource::Table { table_name, columns } => {
            let key = crate::ddl::storage_key(session, engine, &user_table_name(table_name)?);
            if session.catalog(engine).find(&key).is_some_and(|t| t.view.is_some()) {
                return Err(EngineError::WrongObjectType(format!("cannot copy from view \"{table_name}\"")));
            }
            if session.catalog(engine).find(&key).is_some_and(|t| crate::family::is_partitioned(&t)) {
                return Err(EngineError::WrongObjectType(format!(
                    "cannot copy from partitioned table \"{table_name}\""
                )));
            }
            let list = if columns.is_empty() {
                "*".to_string()
            } else {
                columns
                    .iter()
                    .map(|c| format!("\"{}\"", identifier(c).replace('"', "\"\"")))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            // COPY t TO reads t's own rows, not its inheritance children's.
            let sql = format!("SELECT {list} FROM ONLY {table_name}");
            match Engine::parse(&sql)?.pop() {
                Some(ast::Statement::Query(query)) => *query,
                _ => return Err(EngineError::Syntax("COPY source".into())),
            }
        }
    };
    let catalog = session.catalog(engine);
    let bound = engine.bind(&catalog, &query)?;
    sink.start(ResultShape::CopyOut { names: &bound.names, format: &format })?;
    let rows = crate::stream::stream_plan(&engine.executor(), &bound.plan, sink)?;
    Ok(format!("COPY {rows}"))
}

/// Appends one COPY data line per row of `batch` (no message framing) via `line`.
pub fn encode_rows(batch: &Batch, format: &CopyFormat, mut line: impl FnMut(&[u8])) {
    let mut text = String::new();
    for row in 0..batch.rows {
        text.clear();
        for (index, column) in batch.columns.iter().enumerate() {
            if index > 0 {
                text.push(format.delimiter);
            }
            let value = column.output_value(row);
            if value.is_null() {
                text.push_str(&format.null);
            } else if format.csv {
                push_csv_field(&mut text, &value.to_string(), format);
            } else {
                push_text_field(&mut text, &value.to_string(), format.delimiter);
            }
        }
        text.push('\n');
        line(text.as_bytes());
    }
}

/// The CSV header line (column names).
pub fn header_line(names: &[String], format: &CopyFormat) -> Vec<u8> {
    let mut text = String::new();
    for (index, name) in names.iter().enumerate() {
        if index > 0 {
            text.push(format.delimiter);
        }
        push_csv_field(&mut text, name, format);
    }
    text.push('\n');
    text.into_bytes()
}

fn push_csv_field(out: &mut String, value: &str, format: &CopyFormat) {
    // Quoted when it could read back as NULL or as several fields or records.
    let needs_quotes =
        value == format.null || value.contains([format.delimiter, format.quote, format.escape, '\n', '\r']);
    if !needs_quotes {
        out.push_str(value);
        return;
    }
    out.push(format.quote);
    for c in value.chars() {
        if c == format.quote || c == format.escape {
            out.push(format.escape);
        }
        out.push(c);
    }
    out.push(format.quote);
}

fn push_text_field(out: &mut String, value: &str, delimiter: char) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' if delimiter == '\t' => out.push_str("\\t"),
            c if c == delimiter => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv() -> CopyFormat {
        CopyFormat { csv: true, delimiter: ',', header: false, quote: '"', escape: '"', null: String::new() }
    }

    fn text() -> CopyFormat {
        CopyFormat { csv: false, delimiter: '\t', header: false, quote: '"', escape: '"', null: "\\N".into() }
    }

    fn records(format: CopyFormat, chunks: &[&str]) -> Vec<(usize, Vec<Option<String>>)> {
        let mut parser = RecordParser::new(format);
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk.as_bytes()).expect("fits");
            while let Some(record) = parser.next_record(false).expect("valid") {
                out.push(record);
            }
        }
        while let Some(record) = parser.next_record(true).expect("valid") {
            out.push(record);
        }
        out
    }

    // Goal: CSV records split anywhere, quoted fields with delimiters, quotes and newlines,
    // NULL vs empty string, CRLF, and a last line without newline; method: fixed input cut
    // into awkward chunks.
    #[test]
    fn csv_records_across_chunks() {
        let got = records(csv(), &["1,\"a,b\",x\r\n2,\"say \"\"hi", "\"\"\",\n3,\"multi\nline\",\"\"\n4,", "last"]);
        let want: Vec<(usize, Vec<Option<String>>)> = vec![
            (1, vec![Some("1".into()), Some("a,b".into()), Some("x".into())]),
            (2, vec![Some("2".into()), Some("say \"hi\"".into()), None]),
            (3, vec![Some("3".into()), Some("multi\nline".into()), Some(String::new())]),
            (5, vec![Some("4".into()), Some("last".into())]),
        ];
        assert_eq!(got, want);
    }

    // Goal: text format unescapes backslash sequences, \N is NULL and \. ends the data;
    // method: fixed input.
    #[test]
    fn text_records_unescape() {
        let got = records(text(), &["a\\tb\t\\N\tc\\\\d\n", "\\101\t\\x41\t\n\\.\nignored\n"]);
        assert_eq!(got[0].1, vec![Some("a\tb".into()), None, Some("c\\d".into())]);
        assert_eq!(got[1].1, vec![Some("A".into()), Some("A".into()), Some(String::new())]);
        assert_eq!(got.len(), 2);
    }

    // Goal: encoding is the inverse of parsing for awkward values; method: encode then parse.
    #[test]
    fn encode_round_trips() {
        use crate::vector::Vector;
        for format in [csv(), text()] {
            let values = ["plain", "with,comma", "with\"quote", "tab\there", "new\nline", "back\\slash", ""];
            let mut vector = Vector::empty(DataType::Text);
            for v in values {
                vector.append(&Vector::broadcast(&Value::Text(v.into()), DataType::Text, 1));
            }
            vector.append(&Vector::broadcast(&Value::Null, DataType::Text, 1));
            let batch = Batch::new(vec![vector], values.len() + 1);
            let mut bytes = Vec::new();
            encode_rows(&batch, &format, |line| bytes.extend_from_slice(line));
            let parsed = records(format, &[std::str::from_utf8(&bytes).expect("utf8")]);
            let got: Vec<Option<String>> = parsed.into_iter().map(|(_, mut f)| f.remove(0)).collect();
            let mut want: Vec<Option<String>> = values.iter().map(|v| Some(v.to_string())).collect();
            want.push(None);
            assert_eq!(got, want);
        }
    }
}
