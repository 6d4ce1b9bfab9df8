//! The binary's log subscriber (libraries only emit `tracing` events). Lines go to stderr; colour
//! only when stderr is a terminal (a log file or a pipe gets plain text); `--log-format json`
//! (or `BYPASS_LOG_FORMAT=json`) writes one JSON object per line. The filter comes from
//! `BYPASS_LOG`, else `RUST_LOG`, else `info` (e.g. `BYPASS_LOG=debug`).
//!
//! Conventions for the events the crates emit (so lines can be grepped and parsed alike):
//! the message is a short fixed phrase (`login`, `closing client`, `server connect failed`,
//! `server ended the session`, `closing server`, `stats`, `login failed`); details are fields:
//! `client` (peer address), `database`, `user`, `server` (backend address), `backend_pid`,
//! `sqlstate`, `reason` or `error`. Failures an operator must see are `warn`; ordinary
//! connects and disconnects are `info` behind `log_connections` / `log_disconnections`; query
//! text and secrets never appear at info or above.

use std::io::IsTerminal;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process's subscriber. `format` from the command line wins over
/// `BYPASS_LOG_FORMAT`.
pub fn init(format: Option<Format>) {
    let format = format.or_else(format_from_env).unwrap_or(Format::Text);
    let filter = tracing_subscriber::EnvFilter::try_from_env("BYPASS_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_writer(std::io::stderr);
    match format {
        Format::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        Format::Json => builder.json().flatten_event(true).with_ansi(false).init(),
    }
}

fn format_from_env() -> Option<Format> {
    match std::env::var("BYPASS_LOG_FORMAT").ok()?.to_ascii_lowercase().as_str() {
        "json" => Some(Format::Json),
        "text" => Some(Format::Text),
        _ => None,
    }
}
