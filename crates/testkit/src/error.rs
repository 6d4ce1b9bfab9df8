//! The one error type of the crate.

use std::process::ExitStatus;

use thiserror::Error;

/// Everything that can go wrong while starting, driving or stopping a throwaway server.
///
/// Each variant names *what* failed; messages carry the command's stderr or the server log tail
/// so a failing test explains itself without digging through temp directories.
#[derive(Debug, Error)]
pub enum TestkitError {
    /// A file-system or process-spawn operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// An external command ran but exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command { command: String, status: ExitStatus, stderr: String },

    /// A server process did not come up; `log_tail` is the end of its log file.
    #[error("{what} failed to start: {detail}\n--- log tail ---\n{log_tail}")]
    Startup { what: String, detail: String, log_tail: String },

    /// Something did not happen within its time limit.
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout { what: String, waited_ms: u64 },

    /// An option value is unusable (unknown mode, forbidden character, zero processes, ...).
    #[error("invalid option: {0}")]
    InvalidOption(String),

    /// The OS user that must own the server processes does not exist.
    #[error("OS user `{0}` not found in /etc/passwd")]
    UserNotFound(String),
}

impl TestkitError {
    /// Wraps an I/O error with a sentence saying what was being attempted.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TestkitError::Io { context: context.into(), source }
    }
}
