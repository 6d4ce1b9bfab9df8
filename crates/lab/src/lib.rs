//! The dispatcher's network lab and its verifying load generator: measuring, not product.
//!
//! ```text
//!   lab::Lab ── network namespaces, bridge, shaped veth links (`bypass lab up|down`)
//!     └─ services::LabPostgres ── a throwaway PostgreSQL (testkit) inside a backend namespace
//!   loadgen::run ── clients in their namespaces ── pgclient::PgConnection ── payload::query
//!                                                   (sans-I/O login from bypass-dispatch)
//!                                                   payload::Verifier checks every byte back
//!   epoll_loadgen::run ── thousands of clients on a few epoll threads, closed loop of simple
//!                         queries (SELECT 1, a weighted keyed mix), latency, TPS, its own CPU
//! ```
//!
//! Used by `bypass lab`, `bypass bench dispatch` (crates/bench) and the dispatcher's lab tests;
//! `epoll_loadgen` by `bypass bench fastpath --generator epoll`.
//! Entering a namespace (`bypass_dispatch::netns`) stays in the product: `bypass dispatch serve
//! --namespace` and `bypass agent --namespace` need it.
//!
//! Invariants:
//! - Every namespace a lab creates carries the lab's name as prefix and is deleted by
//!   `Lab::down`, so a crashed run never blocks the next one.
//! - The load generator verifies every answer it receives (`payload::Verifier`): a wrong byte is
//!   an error, never a fast result.

pub mod epoll_loadgen;
pub mod lab;
pub mod loadgen;
pub mod payload;
pub mod pgclient;
pub mod services;

pub use lab::{Lab, LabSpec};
