//! The one error type of the crate.

use std::process::ExitStatus;

use bypass_wire::WireError;
use thiserror::Error;

/// Everything that can fail in the lab, the load generator, the dispatcher and the agent.
///
/// Variants name *what* failed; the text carries the command's stderr, the server's SQLSTATE or
/// the exact byte offset, so a failing test explains itself.
#[derive(Debug, Error)]
pub enum DispatchError {
    /// A system call or file operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// An external command (`ip`, `tc`, `bridge`, `haproxy`, …) exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command { command: String, status: ExitStatus, stderr: String },

    /// The lab cannot be built or used as asked.
    #[error("lab: {0}")]
    Lab(String),

    /// A required kernel feature is missing; tests fail loudly on this instead of skipping.
    #[error("kernel feature missing: {0}")]
    KernelFeature(String),

    /// A peer broke the PostgreSQL protocol or sent a message we cannot handle.
    #[error("protocol: {0}")]
    Protocol(String),

    /// The codec rejected bytes.
    #[error("wire: {0}")]
    Wire(#[from] WireError),

    /// The server answered with an ErrorResponse.
    #[error("server error {code}: {message}")]
    Server { code: String, message: String },

    /// A result differed from the deterministic payload it should carry.
    #[error("payload mismatch in query {query} at byte {offset}: {detail}")]
    PayloadMismatch { query: u64, offset: u64, detail: String },

    /// The configuration is invalid; every problem is listed.
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Config(Vec<String>),

    /// A TCP connection could not be exported or imported with `TCP_REPAIR`.
    #[error("tcp repair ({step}): {source}")]
    Repair {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The eBPF steering program or its map failed.
    #[error("steering: {0}")]
    Steering(String),

    /// Something did not happen in time.
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout { what: String, waited_ms: u64 },
}

impl DispatchError {
    /// Wraps an I/O error with a sentence saying what was being attempted.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DispatchError::Io { context: context.into(), source }
    }

    /// The error of the last failed system call, with context.
    pub fn last_os(context: impl Into<String>) -> Self {
        DispatchError::io(context, std::io::Error::last_os_error())
    }
}

/// The crate's result type.
pub type Result<T, E = DispatchError> = std::result::Result<T, E>;
