//! The subcommands of the `bypass` binary that wire a part's library to its arguments: argument
//! parsing (clap) and printing only; the logic lives in the part's crate.
//!
//! ```text
//!   main.rs ── proxy, config-reference, up, fastpath, bench pooler|fastpath
//!     ├─ pooler    ── bypass check-config, import-pgbouncer             ─► bypass-pooler
//!     ├─ engine    ── bypass engine serve|load|query, bench engine    ─► bypass-engine, bypass-bench
//!     ├─ pod       ── bypass pod run|recover|layout, bench pod        ─► bypass-pod, bypass-bench
//!     └─ dispatch  ── bypass dispatch serve|check-config, agent, lab,  ─► bypass-dispatch, bypass-lab,
//!                     bench dispatch                                      bypass-bench
//! ```

pub mod dispatch;
pub mod engine;
pub mod pod;
pub mod pooler;
