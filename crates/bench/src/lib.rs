//! Benchmark drivers and reports for Bypass.
//!
//! Benchmarks compare Bypass with the peer users would pick, in the same run on the same
//! machine, and write JSON + markdown + a PNG plot (house style, design §9). The one benchmark
//! so far is [`pooler`]: pgbench through direct PostgreSQL, PgBouncer (one and two processes)
//! and the `bypass` binary.
//!
//! ```text
//!   pooler ── measure ──► contender (testkit PgBouncer / bypass child / nothing)
//!     │          └──────► pgbench (spawn, -P 1 progress ─► cpu::Probe snapshots)
//!     │                   pgbench_log (per-transaction latencies) ─► stats
//!     └─ report ─► pooler.json, markdown ─► pooler.md, plot ─► pooler.png
//! ```
//!
//! Invariants:
//! - Every child process (pgbench, poolers, PostgreSQL) is owned by a value whose `Drop` stops
//!   it, so errors, panics and Ctrl-C (turned into a polled flag by [`interrupt`]) leave nothing
//!   running.
//! - A failing run is a recorded result (its `error` field), never the end of the benchmark.
//! - Parsers of pgbench and `/proc` output are pure functions with unit tests.

mod bpf_stats;
mod cpu;
pub mod fastpath;
mod interrupt;
mod machine;
mod pgbench;
mod pgbench_log;
pub mod pooler;
mod stats;
