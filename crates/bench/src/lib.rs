//! Benchmark drivers and reports for Bypass.
//!
//! Benchmarks compare Bypass with the peer users would pick, in the same run on the same
//! machine, and write JSON + markdown + a PNG plot (house style, design §9). [`pooler`] is the
//! harness and `bench pooler` (pgbench through direct PostgreSQL, PgBouncer one and two
//! processes, and the `bypass` binary); [`fastpath`] is `bench fastpath` (issue 4): the same
//! harness with the kernel fast path, YCSB-like workloads, BPF cost and mirroring; [`engine`]
//! is `bench engine` (the seed's runtime grid, allocators, TPC-H against DuckDB, DataFusion and
//! Polars); [`pod`] is `bench pod` (Tigon against DS2PL+ and OCC+ on TPC-C and YCSB);
//! [`dispatch`] is `bench dispatch` (relay, hand-over and hybrid against HAProxy in the lab of
//! `bypass-lab`).
//!
//! ```text
//!   pooler::run ──┐                 ┌─► contender (testkit PgBouncer / bypass child / nothing)
//!   fastpath::run ┴─► pooler::drive ┼─► pgbench (spawn, -P 1 progress ─► cpu::Probe snapshots)
//!                        │          │   pgbench_log (per-transaction latencies) ─► stats
//!                        │          ├─► or bypass_lab::epoll_loadgen in-process (snapshots at its
//!                        │          │   window's edges, its threads' CPU clocks): --generator
//!                        │          └─► bpf_stats (bpftool before/after a kernel run)
//!                        └─ Document (pooler Results / FastpathDocument) ─► <name>.json/.md/.png
//! ```
//!
//! Invariants:
//! - Every child process (pgbench, poolers, PostgreSQL) is owned by a value whose `Drop` stops
//!   it, so errors, panics and Ctrl-C (turned into a polled flag by [`interrupt`]) leave nothing
//!   running; BPF run-time statistics are switched off the same way (a descriptor, not the
//!   shared sysctl).
//! - A failing run is a recorded result (its `error` field), never the end of the benchmark.
//! - Parsers of pgbench, `/proc` and bpftool output are pure functions with unit tests.

mod bpf_stats;
mod cpu;
pub mod dispatch;
pub mod engine;
pub mod fastpath;
mod interrupt;
mod pgbench;
mod pgbench_log;
pub mod pod;
pub mod pooler;
pub mod report;

// Short paths for the harness modules written before `report` gathered them.
use report::{machine, stats};
