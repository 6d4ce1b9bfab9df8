//! Bypass engine: an in-memory columnar SQL engine whose pipelines run as fused, monomorphized
//! loops on pinned morsel-driven workers in a "specialized" runtime (huge-page prefaulted chunk
//! pool, per-worker scratch arenas (`arena`: one prefaulted region, bump frames), optional SCHED_FIFO), after NautDB (seed 002). It speaks the
//! PostgreSQL protocol (`server`) and loads TPC-H in-process (`tpch`). Its benchmark against a
//! plain runtime and DuckDB, DataFusion and Polars is `bypass-bench`'s `engine` module; its
//! subcommands are in `bypass-cli`.
//!
//! ```text
//!   SQL ─► sqlparser ─► query/bind (scope, types, casts) ─► joins (pushdown, greedy order)
//!       ─► Plan ─► exec: pipelines split at breakers ─► runtime.run_morsels (per-core deques)
//!                     ├─ compiled tier: fused scan→filter→aggregate loops (templates)
//!                     └─ interpreter: vectors of 2048 rows, selection vectors, hash agg/join
//!   storage: Table ─ chunks (morsels) ─ column chunks in 64-byte-aligned pool buffers
//! ```
//!
//! Invariants:
//! - Every column of a table is chunked at the same row boundaries; chunk i is morsel i.
//! - The interpreter is the oracle: the compiled tier must produce identical results, and both
//!   runtimes must too (tests check every supported TPC-H query both ways).
//! - Kernels only see operands of one physical type: the binder inserts the casts.
//! - Every buffer, queue and table is bounded by a named constant or setting.
//! - COPY reads CSV/text and Parquet (`parquet_file`) through the same row builder as INSERT.
//! - INSERT and COPY are all-or-nothing: a failure part-way rolls the builder back to its mark
//!   (chunks, validity masks, interned strings), and the error keeps PostgreSQL's SQLSTATE.
//! - Unsupported SQL is an `EngineError::Unsupported` (SQLSTATE 0A000) naming the feature.

#[cfg(feature = "global-mimalloc")]
#[global_allocator]
static GLOBAL: control::TrackingAllocator<mimalloc::MiMalloc> = control::TrackingAllocator(mimalloc::MiMalloc);

pub mod arena;
pub mod bind;
pub mod cast;
pub mod catalog;
pub mod compiled;
pub mod control;
pub mod copy;
pub mod datetime;
pub mod ddl;
pub mod decorrelate;
pub mod depth;
pub mod dml;
pub mod engine;
pub mod error;
pub mod exec;
pub mod explain;
pub mod expr;
pub mod family;
pub mod frame_syntax;
pub mod from;
pub mod functions;
pub mod interval;
pub mod joins;
pub mod lateral;
pub mod numeric;
pub mod ordered_set;
pub mod parquet_file;
pub mod pg_catalog;
pub mod pg_syntax;
pub mod plan;
pub mod pool;
pub mod query;
pub mod runtime;
pub mod server;
pub mod session;
pub mod settings;
pub mod statistics;
pub mod storage;
pub mod stream;
pub mod table_functions;
pub mod tpch;
pub mod types;
pub mod upsert;
pub mod vector;
pub mod view;
pub mod window;
pub mod window_bind;
pub mod window_frame;

pub use engine::{Engine, EngineSettings, QueryResult};
pub use error::EngineError;
pub use exec::Tier;
pub use runtime::{RuntimeKind, RuntimeSettings};
