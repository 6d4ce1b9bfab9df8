//! The one error type of the engine crate.

use thiserror::Error;

/// Everything that can go wrong in the engine, by kind. Each kind maps to one SQLSTATE so the
/// server can answer with the right ErrorResponse (see [`EngineError::sqlstate`]).
#[derive(Debug, Error)]
pub enum EngineError {
    /// The SQL text does not parse.
    #[error("syntax error: {0}")]
    Syntax(String),
    /// Valid SQL that this engine does not implement; names the feature.
    #[error("feature not supported: {0}")]
    Unsupported(String),
    /// A table that does not exist.
    #[error("relation \"{0}\" does not exist")]
    UnknownTable(String),
    /// A FROM item that reads one it may not see (a LATERAL reference across a RIGHT or FULL JOIN).
    #[error("invalid reference to FROM-clause entry for table \"{0}\"")]
    InvalidFromReference(String),
    /// A qualified column whose qualifier names no FROM item.
    #[error("missing FROM-clause entry for table \"{0}\"")]
    MissingFromEntry(String),
    /// A FROM clause naming two items alike.
    #[error("{0}")]
    DuplicateAlias(String),
    /// A table that already exists.
    #[error("relation \"{0}\" already exists")]
    TableExists(String),
    /// A column that does not exist (or is ambiguous, see the message).
    #[error("column {0}")]
    UnknownColumn(String),
    /// Operands of the wrong type.
    #[error("type mismatch: {0}")]
    Type(String),
    /// A literal or input value that cannot be read as its type.
    #[error("invalid input: {0}")]
    InvalidValue(String),
    /// A date that does not parse (PostgreSQL's invalid_datetime_format).
    #[error("invalid input: {0}")]
    InvalidDatetime(String),
    /// A date whose fields are out of range, such as month 13 (datetime_field_overflow).
    #[error("date/time field value out of range: {0}")]
    DatetimeOutOfRange(String),
    /// A string longer than its character(n) / character varying(n) column.
    #[error("{0}")]
    StringTooLong(String),
    /// COPY input that does not have the table's shape: missing or extra fields.
    #[error("bad COPY file format: {0}")]
    CopyFormat(String),
    /// An error in one line of COPY input; it keeps the SQLSTATE of its cause.
    #[error("COPY line {line}: {source}")]
    CopyLine { line: usize, source: Box<EngineError> },
    /// Integer or decimal overflow.
    #[error("numeric value out of range: {0}")]
    Overflow(String),
    /// Division by zero.
    #[error("division by zero")]
    DivisionByZero,
    /// A configured bound was exceeded (memory pool, rows, message size).
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    /// A file could not be read or written.
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// A worker thread panicked or failed to start.
    #[error("runtime failure: {0}")]
    Runtime(String),
    /// The statement was canceled (CancelRequest, statement_timeout, client gone).
    #[error("{0}")]
    QueryCanceled(String),
    /// The statement needed more memory than `memory_limit` allows.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// A statement in a transaction that already failed.
    #[error("current transaction is aborted, commands ignored until end of transaction block")]
    InFailedTransaction,
    /// A statement that may not run in (or outside) a transaction block, or at this point of one.
    #[error("{0}")]
    TransactionState(String),
    /// A NULL in a NOT NULL column.
    #[error("null value in column \"{column}\" of relation \"{table}\" violates not-null constraint")]
    NotNullViolation { table: String, column: String },
    /// A duplicate key in a PRIMARY KEY or UNIQUE constraint.
    #[error("duplicate key value violates unique constraint \"{constraint}\"")]
    UniqueViolation { constraint: String },
    /// A concurrent transaction changed what this one read or wants to write; retry.
    #[error("could not serialize access due to concurrent update")]
    SerializationFailure,
    /// Two transactions wait for each other's locks; this one was chosen to fail.
    #[error("deadlock detected: {0}")]
    DeadlockDetected(String),
    /// A lock was not granted within lock_timeout.
    #[error("canceling statement due to lock timeout")]
    LockTimeout,
    /// An unknown configuration parameter (SET, SHOW).
    #[error("unrecognized configuration parameter \"{0}\"")]
    UnknownSetting(String),
    /// A setting or option given a value it cannot take.
    #[error("{0}")]
    InvalidParameterValue(String),
    /// A prepared statement that does not exist (or already exists, see the message).
    #[error("{0}")]
    PreparedStatement(String),
    /// A portal that does not exist.
    #[error("portal \"{0}\" does not exist")]
    UnknownPortal(String),
    /// An object others depend on (an index a constraint needs).
    #[error("{0}")]
    DependentObjects(String),
    /// A statement that needs a transaction block outside one.
    #[error("{0}")]
    NoTransaction(String),
    /// A savepoint that does not exist.
    #[error("{0}")]
    NoSavepoint(String),
    /// A named object (a type, a schema) that does not exist.
    #[error("{0}")]
    UnknownObject(String),
    /// A database other than the server's one.
    #[error("database \"{0}\" does not exist")]
    UnknownDatabase(String),
    /// Text that is not valid UTF-8.
    #[error("{0}")]
    CharacterNotInRepertoire(String),
    /// A message that breaks the protocol's rules.
    #[error("{0}")]
    Protocol(String),
    /// A cast between types that have none (PostgreSQL's cannot_coerce).
    #[error("{0}")]
    CannotCast(String),
    /// An expression or query nested deeper than the engine evaluates (PostgreSQL's
    /// statement_too_complex family: stack depth limit exceeded).
    #[error("stack depth limit exceeded: {0}")]
    StackDepth(String),
    /// A negative LIMIT (`offset` false) or OFFSET.
    #[error("{} must not be negative", if *offset { "OFFSET" } else { "LIMIT" })]
    NegativeRowCount { offset: bool },
    /// A scalar subquery that returned more than one row.
    #[error("more than one row returned by a subquery used as an expression")]
    CardinalityViolation,
    /// A column outside GROUP BY in an aggregated query, or an aggregate where none may be.
    #[error("{0}")]
    Grouping(String),
    /// A reference that does not fit where it stands (DISTINCT ON against ORDER BY: 42P10).
    #[error("{0}")]
    InvalidColumnReference(String),
    /// A window function where none may be, or a frame PostgreSQL rejects (42P20).
    #[error("{0}")]
    Windowing(String),
    /// A function or operator with no variant for these argument types.
    #[error("{0}")]
    UndefinedFunction(String),
    /// A column name that more than one relation in scope has.
    #[error("column reference \"{0}\" is ambiguous")]
    AmbiguousColumn(String),
    /// A column named twice where names must differ (JOIN USING).
    #[error("{0}")]
    DuplicateColumn(String),
    /// A statement on the wrong kind of relation, such as DROP VIEW of a table.
    #[error("{0}")]
    WrongObjectType(String),
    /// A definition that cannot replace the existing one (CREATE OR REPLACE VIEW).
    #[error("{0}")]
    InvalidTableDefinition(String),
    /// A view that reads itself.
    #[error("{0}")]
    InfiniteRecursion(String),
    /// A relation twice where it may appear once (a parent inherited twice, circular
    /// inheritance): 42P07 with PostgreSQL's own message.
    #[error("{0}")]
    DuplicateTable(String),
    /// ON CONFLICT DO UPDATE meeting one row twice (21000).
    #[error("ON CONFLICT DO UPDATE command cannot affect row a second time")]
    UpsertTwice,
    /// A row outside its partition's bounds, or no partition for it (23514).
    #[error("{0}")]
    CheckViolation(String),
    /// A definition that contradicts another object (overlapping partitions: 42P17).
    #[error("{0}")]
    InvalidObjectDefinition(String),
    /// A window frame offset that is NULL (22004) or negative (22013).
    #[error("{message}")]
    FrameOffset { message: String, null: bool },
}

impl EngineError {
    /// The PostgreSQL SQLSTATE code for this kind of error.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            EngineError::Syntax(_) => "42601",
            EngineError::Unsupported(_) => "0A000",
            EngineError::UnknownTable(_) | EngineError::MissingFromEntry(_) => "42P01",
            EngineError::TableExists(_) => "42P07",
            EngineError::UnknownColumn(_) => "42703",
            EngineError::Type(_) => "42804",
            EngineError::InvalidValue(_) => "22P02",
            EngineError::InvalidDatetime(_) => "22007",
            EngineError::DatetimeOutOfRange(_) => "22008",
            EngineError::StringTooLong(_) => "22001",
            EngineError::CopyFormat(_) => "22P04",
            EngineError::CopyLine { source, .. } => source.sqlstate(),
            EngineError::Overflow(_) => "22003",
            EngineError::DivisionByZero => "22012",
            EngineError::LimitExceeded(_) => "54000",
            EngineError::Io { .. } => "58030",
            EngineError::Runtime(_) => "XX000",
            EngineError::QueryCanceled(_) => "57014",
            EngineError::OutOfMemory(_) => "53200",
            EngineError::InFailedTransaction => "25P02",
            EngineError::TransactionState(_) => "25001",
            EngineError::NotNullViolation { .. } => "23502",
            EngineError::UniqueViolation { .. } => "23505",
            EngineError::SerializationFailure => "40001",
            EngineError::DeadlockDetected(_) => "40P01",
            EngineError::LockTimeout => "55P03",
            EngineError::UnknownSetting(_) => "42704",
            EngineError::InvalidParameterValue(_) => "22023",
            EngineError::PreparedStatement(message) if message.contains("already exists") => "42P05",
            EngineError::PreparedStatement(_) => "26000",
            EngineError::UnknownPortal(_) => "34000",
            EngineError::CharacterNotInRepertoire(_) => "22021",
            EngineError::UnknownDatabase(_) => "3D000",
            EngineError::UnknownObject(_) => "42704",
            EngineError::NoTransaction(_) => "25P01",
            EngineError::DependentObjects(_) => "2BP01",
            EngineError::NoSavepoint(_) => "3B001",
            EngineError::Protocol(_) => "08P01",
            EngineError::CannotCast(_) => "42846",
            EngineError::StackDepth(_) => "54001",
            EngineError::NegativeRowCount { offset: false } => "2201W",
            EngineError::NegativeRowCount { offset: true } => "2201X",
            EngineError::CardinalityViolation => "21000",
            EngineError::Grouping(_) => "42803",
            EngineError::Windowing(_) => "42P20",
            EngineError::InvalidColumnReference(_) | EngineError::InvalidFromReference(_) => "42P10",
            EngineError::DuplicateAlias(_) => "42712",
            EngineError::UndefinedFunction(_) => "42883",
            EngineError::AmbiguousColumn(_) => "42702",
            EngineError::DuplicateColumn(_) => "42701",
            EngineError::WrongObjectType(_) => "42809",
            EngineError::InvalidTableDefinition(_) => "42P16",
            EngineError::InfiniteRecursion(_) => "42P17",
            EngineError::CheckViolation(_) => "23514",
            EngineError::UpsertTwice => "21000",
            EngineError::DuplicateTable(_) => "42P07",
            EngineError::InvalidObjectDefinition(_) => "42P17",
            EngineError::FrameOffset { null: true, .. } => "22004",
            EngineError::FrameOffset { null: false, .. } => "22013",
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> EngineError {
        EngineError::Io { context: context.into(), source }
    }

    pub(crate) fn unsupported(feature: impl Into<String>) -> EngineError {
        EngineError::Unsupported(feature.into())
    }
}

/// `bytes` as text, or PostgreSQL's 22021 naming the first invalid sequence
/// (`invalid byte sequence for encoding "UTF8": 0xc3 0x28`).
pub fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|error| {
        let rest = &bytes[error.valid_up_to()..];
        // As PostgreSQL: as many bytes as the lead byte announces, at most those present.
        let announced = match rest.first().copied().unwrap_or(0) {
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => 1,
        };
        let shown: Vec<String> = rest.iter().take(announced).map(|b| format!("0x{b:02x}")).collect();
        EngineError::CharacterNotInRepertoire(format!(
            "invalid byte sequence for encoding \"UTF8\": {}",
            shown.join(" ")
        ))
    })
}

/// Result alias used throughout the crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
