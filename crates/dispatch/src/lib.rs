//! Per-query routing across PostgreSQL backends, and TCP connection hand-over so large results
//! flow from the backend straight to the client (Prism, seed 004).
//!
//! Work in progress; the parts are built in the order of issue 5.
//!
//! - [`lab`]: network namespaces for clients, the dispatcher and backends, joined by a bridge
//!   with shaped links (`bypass lab up|down`).
//! - [`netns`]: entering a namespace from a thread; running commands in one.
//! - [`payload`], [`pgclient`], [`pglogin`], [`loadgen`]: the load generator — persistent
//!   PostgreSQL connections asking stock PostgreSQL for deterministic payloads (1 B … 128 MB)
//!   that are verified byte by byte, with HDR latency histograms.

pub mod agent;
pub mod bench;
pub mod buffer;
pub mod cli;
pub mod config;
pub mod dispatcher;
pub mod error;
pub mod handover;
pub mod lab;
pub mod link;
pub mod loadgen;
pub mod netns;
pub mod payload;
pub mod pgclient;
pub mod pglogin;
pub mod routing;
pub mod runtime;
pub mod services;
pub mod steer;

pub use error::{DispatchError, Result};
