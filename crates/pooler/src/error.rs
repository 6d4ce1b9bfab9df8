//! The pooler's error: what failed, whose fault it is, and what the client is told.

use std::io;

use bypass_wire::{SqlState, WireError};
use thiserror::Error;

/// Whose side a failure came from; also the `kind` label of error metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The client's connection or input.
    Client,
    /// A PostgreSQL server's connection or answer.
    Server,
    /// The pooler's own limits or state.
    Pooler,
}

#[derive(Debug, Error)]
pub enum PoolerError {
    /// The client's socket failed or closed; there is no one left to tell.
    #[error("client connection: {0}")]
    ClientIo(#[source] io::Error),
    /// The client sent bytes that are not valid protocol.
    #[error("client protocol violation: {0}")]
    ClientProtocol(#[source] WireError),
    /// The client is refused with this SQLSTATE and message (auth, unknown database, limits).
    #[error("{message}")]
    Refused { code: SqlState, message: String },
    /// Opening a connection to a server failed.
    #[error("cannot connect to server {address}: {source}")]
    ServerConnect { address: String, source: io::Error },
    /// A server's socket failed or closed.
    #[error("server connection lost: {0}")]
    ServerIo(#[source] io::Error),
    /// A server sent bytes that are not valid protocol.
    #[error("server protocol violation: {0}")]
    ServerProtocol(#[source] WireError),
    /// A server refused our login; its SQLSTATE and message are passed on.
    #[error("server login failed: {message}")]
    ServerLogin { code: String, message: String },
    /// A server answered our own query (reset, parameter sync) with an error.
    #[error("server rejected {what}: {message}")]
    ServerQuery { what: &'static str, code: String, message: String },
    /// A server ended the session with a FATAL error that was already passed to the client, or
    /// failed while the client was mid-message: the client is closed without another report.
    #[error("server ended the session")]
    ServerTerminated,
    /// A bounded wait ran out.
    #[error("{0}")]
    Timeout(TimeoutKind),
}

/// Which limit a [`PoolerError::Timeout`] hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum TimeoutKind {
    #[error("query_wait_timeout: no server became free in time")]
    QueryWait,
    #[error("client_idle_timeout: client was idle too long")]
    ClientIdle,
    #[error("idle_transaction_timeout: client was idle in a transaction too long")]
    IdleTransaction,
    #[error("client_login_timeout: login took too long")]
    ClientLogin,
    #[error("server_connect_timeout: server login took too long")]
    ServerConnect,
}

impl PoolerError {
    pub fn refused(code: SqlState, message: impl Into<String>) -> Self {
        PoolerError::Refused { code, message: message.into() }
    }

    pub fn blame(&self) -> Blame {
        match self {
            PoolerError::ClientIo(_) | PoolerError::ClientProtocol(_) | PoolerError::Refused { .. } => Blame::Client,
            PoolerError::ServerConnect { .. }
            | PoolerError::ServerIo(_)
            | PoolerError::ServerProtocol(_)
            | PoolerError::ServerLogin { .. }
            | PoolerError::ServerQuery { .. }
            | PoolerError::ServerTerminated => Blame::Server,
            PoolerError::Timeout(_) => Blame::Pooler,
        }
    }

    /// The SQLSTATE and text a client gets, or `None` when the client cannot be told (it is gone).
    /// Texts name the failure without secrets or server addresses.
    pub fn client_report(&self) -> Option<(String, String)> {
        let (code, text) = match self {
            PoolerError::ClientIo(_) | PoolerError::ServerTerminated => return None,
            PoolerError::ClientProtocol(error) => {
                (SqlState::PROTOCOL_VIOLATION.code().into(), format!("protocol violation: {error}"))
            }
            PoolerError::Refused { code, message } => (code.code().into(), message.clone()),
            PoolerError::ServerConnect { .. } => {
                (SqlState::CONNECTION_FAILURE.code().into(), "pooler could not connect to the server".into())
            }
            PoolerError::ServerIo(_) => (SqlState::CONNECTION_FAILURE.code().into(), "server connection lost".into()),
            PoolerError::ServerProtocol(_) => {
                (SqlState::PROTOCOL_VIOLATION.code().into(), "server sent an invalid message".into())
            }
            PoolerError::ServerLogin { code, message } => (code.clone(), message.clone()),
            PoolerError::ServerQuery { code, message, .. } => (code.clone(), message.clone()),
            PoolerError::Timeout(kind) => (kind.sqlstate().code().into(), kind.to_string()),
        };
        Some((code, text))
    }
}

impl TimeoutKind {
    pub fn sqlstate(self) -> SqlState {
        match self {
            TimeoutKind::QueryWait | TimeoutKind::ClientLogin => SqlState::CONNECTION_FAILURE,
            TimeoutKind::ServerConnect => SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
            TimeoutKind::ClientIdle => SqlState::IDLE_SESSION_TIMEOUT,
            TimeoutKind::IdleTransaction => SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
        }
    }
}
