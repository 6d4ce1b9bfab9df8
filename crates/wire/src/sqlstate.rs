//! SQLSTATE codes the project emits, with PostgreSQL's own condition names
//! (from `src/backend/utils/errcodes.txt`). Only codes we use are listed; add more as needed.

/// A five-character SQLSTATE code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SqlState(pub &'static str);

impl SqlState {
    pub const SUCCESSFUL_COMPLETION: SqlState = SqlState("00000");
    pub const WARNING: SqlState = SqlState("01000");
    pub const CONNECTION_EXCEPTION: SqlState = SqlState("08000");
    pub const CONNECTION_FAILURE: SqlState = SqlState("08006");
    pub const SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION: SqlState = SqlState("08001");
    pub const PROTOCOL_VIOLATION: SqlState = SqlState("08P01");
    pub const FEATURE_NOT_SUPPORTED: SqlState = SqlState("0A000");
    pub const INVALID_AUTHORIZATION_SPECIFICATION: SqlState = SqlState("28000");
    pub const INVALID_PASSWORD: SqlState = SqlState("28P01");
    pub const INVALID_CATALOG_NAME: SqlState = SqlState("3D000");
    pub const SYNTAX_ERROR: SqlState = SqlState("42601");
    pub const INSUFFICIENT_PRIVILEGE: SqlState = SqlState("42501");
    pub const CONFIG_FILE_ERROR: SqlState = SqlState("F0000");
    pub const TOO_MANY_CONNECTIONS: SqlState = SqlState("53300");
    pub const PROGRAM_LIMIT_EXCEEDED: SqlState = SqlState("54000");
    pub const QUERY_CANCELED: SqlState = SqlState("57014");
    pub const ADMIN_SHUTDOWN: SqlState = SqlState("57P01");
    pub const CANNOT_CONNECT_NOW: SqlState = SqlState("57P03");
    pub const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: SqlState = SqlState("25P03");
    pub const IDLE_SESSION_TIMEOUT: SqlState = SqlState("57P05");
    pub const INTERNAL_ERROR: SqlState = SqlState("XX000");

    /// The code as text, e.g. `"28P01"`.
    pub fn code(self) -> &'static str {
        self.0
    }
}

const _: () = assert!(SqlState::INVALID_PASSWORD.0.len() == 5);
