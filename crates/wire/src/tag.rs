//! Message type bytes by name. The same byte means different messages in the two directions
//! (`'E'` is Execute from a client and ErrorResponse from a server), so each direction has its
//! own module: code says `tag::backend::READY_FOR_QUERY`, never `b'Z'`.

/// Type bytes of messages a client sends.
pub mod frontend {
    pub const BIND: u8 = b'B';
    pub const CLOSE: u8 = b'C';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_FAIL: u8 = b'f';
    pub const DESCRIBE: u8 = b'D';
    pub const EXECUTE: u8 = b'E';
    pub const FLUSH: u8 = b'H';
    pub const FUNCTION_CALL: u8 = b'F';
    pub const PARSE: u8 = b'P';
    /// PasswordMessage, SASLInitialResponse and SASLResponse share this byte.
    pub const PASSWORD: u8 = b'p';
    pub const QUERY: u8 = b'Q';
    pub const SYNC: u8 = b'S';
    pub const TERMINATE: u8 = b'X';

    /// Whether a logged-in client may send a message of this type (PostgreSQL's main loop
    /// accepts these; anything else is "invalid frontend message type").
    pub fn after_login(tag: u8) -> bool {
        matches!(
            tag,
            BIND | CLOSE
                | COPY_DATA
                | COPY_DONE
                | COPY_FAIL
                | DESCRIBE
                | EXECUTE
                | FLUSH
                | FUNCTION_CALL
                | PARSE
                | QUERY
                | SYNC
                | TERMINATE
        )
    }
}

/// Type bytes of messages a server sends.
pub mod backend {
    pub const AUTHENTICATION: u8 = b'R';
    pub const BACKEND_KEY_DATA: u8 = b'K';
    pub const BIND_COMPLETE: u8 = b'2';
    pub const CLOSE_COMPLETE: u8 = b'3';
    pub const COMMAND_COMPLETE: u8 = b'C';
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_IN_RESPONSE: u8 = b'G';
    pub const COPY_OUT_RESPONSE: u8 = b'H';
    pub const DATA_ROW: u8 = b'D';
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    pub const ERROR_RESPONSE: u8 = b'E';
    pub const FUNCTION_CALL_RESPONSE: u8 = b'V';
    pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
    pub const NO_DATA: u8 = b'n';
    pub const NOTICE_RESPONSE: u8 = b'N';
    pub const NOTIFICATION_RESPONSE: u8 = b'A';
    pub const PARAMETER_DESCRIPTION: u8 = b't';
    pub const PARAMETER_STATUS: u8 = b'S';
    pub const PARSE_COMPLETE: u8 = b'1';
    pub const PORTAL_SUSPENDED: u8 = b's';
    pub const READY_FOR_QUERY: u8 = b'Z';
    pub const ROW_DESCRIPTION: u8 = b'T';
}

/// Field codes inside ErrorResponse and NoticeResponse.
pub mod field {
    pub const SEVERITY: u8 = b'S';
    /// The severity never translated (PostgreSQL 9.6 and later).
    pub const SEVERITY_NONLOCALIZED: u8 = b'V';
    pub const CODE: u8 = b'C';
    pub const MESSAGE: u8 = b'M';
    pub const DETAIL: u8 = b'D';
    pub const HINT: u8 = b'H';
}

/// The one-byte answers to SSLRequest and GSSENCRequest.
pub mod encryption {
    /// The server will start TLS (or GSS) next.
    pub const ACCEPT: u8 = b'S';
    /// The server goes on in plaintext.
    pub const REFUSE: u8 = b'N';
    /// The first byte of a TLS handshake record: a client using PostgreSQL 17's direct TLS.
    pub const TLS_HANDSHAKE: u8 = 0x16;
}

/// The byte of ReadyForQuery's status and of Describe/Close targets.
pub mod status {
    pub const IDLE: u8 = b'I';
    pub const IN_TRANSACTION: u8 = b'T';
    pub const FAILED: u8 = b'E';
    pub const STATEMENT: u8 = b'S';
    pub const PORTAL: u8 = b'P';
}
