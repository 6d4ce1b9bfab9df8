//! `bypass bench engine`: the seed's runtime experiment, the allocator micro-benchmark and
//! TPC-H against DuckDB, DataFusion and Polars, in one run, written to
//! `bench/results/engine.{json,md,png}`.
//!
//! ```text
//!   nautdb grid (columns × rows per chunk) ── trials alternate specialized / plain ──┐
//!   allocator sizes ── arena / mimalloc / glibc, interleaved rounds ─────────────────┼─► report
//!   TPC-H SF n ── bypass (2 workers) ── CSV ─► peers.py (duckdb, datafusion, polars) ┘
//! ```

pub mod alloc;
pub mod nautdb;
mod report;
pub mod tpch;

use std::path::PathBuf;

use serde::Serialize;

use crate::runtime::RuntimeKind;

/// Column counts of the seed's grid.
pub const COLUMNS: [usize; 4] = [2, 8, 32, 128];
/// log2 of rows per chunk: 2^4 … 2^13.
pub const ROWS_LOG2: std::ops::RangeInclusive<u32> = 4..=13;
/// Untimed trials per cell and runtime before the measured ones: the specialized pool maps
/// and prefaults a new size class on its first use, a one-time start-up cost that would
/// otherwise land in trial 1 and dominate the CV; both runtimes get the same warm-up.
pub const WARMUP_TRIALS: usize = 1;
/// Bound on the specialized side's chunk pool (the largest cell needs about 2 GiB).
const EXPERIMENT_POOL_BYTES_MAX: usize = 6 << 30;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub trials: usize,
    pub columns: Vec<usize>,
    pub rows_log2: Vec<u32>,
    pub allocator_rounds: usize,
    pub allocator_sizes: Vec<(usize, usize)>,
    pub scale_factor: f64,
    pub threads: usize,
    pub runs: usize,
    pub python: Option<PathBuf>,
    pub out_dir: PathBuf,
    pub skip_nautdb: bool,
    pub skip_allocator: bool,
    pub skip_tpch: bool,
    /// The specialized side of the seed's grid runs under SCHED_FIFO.
    pub sched_fifo: bool,
}

/// Median, coefficient of variation and samples of one measured quantity.
#[derive(Debug, Clone, Serialize)]
pub struct Stat {
    pub median: f64,
    pub mean: f64,
    pub cv: f64,
}

impl Stat {
    pub fn of(values: &[f64]) -> Stat {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len().max(1) as f64;
        let mean = sorted.iter().sum::<f64>() / n;
        let variance = sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        Stat { median, mean, cv: if mean > 0.0 { variance.sqrt() / mean } else { 0.0 } }
    }
}

/// One (runtime, columns, rows) cell of the seed's grid.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub runtime: RuntimeKind,
    /// Trials ran under SCHED_FIFO (the specialized runtime's opt-in "no time-sharing").
    pub sched_fifo: bool,
    pub columns: usize,
    pub rows_per_chunk: usize,
    pub create_ms: Stat,
    pub row_sort_ms: Stat,
    pub column_sort_ms: Stat,
    pub select_ms: Stat,
    pub free_ms: Stat,
    pub page_faults: Stat,
    pub trials: Vec<nautdb::TrialTimes>,
}

fn cell(runtime: RuntimeKind, sched_fifo: bool, columns: usize, rows: usize, trials: Vec<nautdb::TrialTimes>) -> Cell {
    let ms = |f: fn(&nautdb::TrialTimes) -> u64| -> Stat {
        Stat::of(&trials.iter().map(|t| f(t) as f64 / 1e6).collect::<Vec<_>>())
    };
    Cell {
        runtime,
        sched_fifo,
        columns,
        rows_per_chunk: rows,
        create_ms: ms(|t| t.create_ns),
        row_sort_ms: ms(|t| t.row_sort_ns),
        column_sort_ms: ms(|t| t.column_sort_ns),
        select_ms: ms(|t| t.select_ns),
        free_ms: ms(|t| t.free_ns),
        page_faults: Stat::of(&trials.iter().map(|t| t.page_faults as f64).collect::<Vec<_>>()),
        trials,
    }
}

/// The variants of the grid: (runtime, SCHED_FIFO). The specialized runtime runs with and
/// without SCHED_FIFO (the design brief: "measure CV on/off"); both share one side (pool,
/// arena) so the FIFO variant costs no extra memory.
fn variants(plan: &Plan) -> Vec<(RuntimeKind, bool)> {
    let mut variants = vec![(RuntimeKind::Specialized, false), (RuntimeKind::Plain, false)];
    if plan.sched_fifo {
        variants.push((RuntimeKind::Specialized, true));
    }
    variants
}

/// Runs the grid; trials rotate through the variants (which goes first rotates too) so drift
/// on a shared machine hits all alike.
pub fn run_nautdb(plan: &Plan) -> anyhow::Result<Vec<Cell>> {
    let mut specialized = nautdb::Side::new(RuntimeKind::Specialized, EXPERIMENT_POOL_BYTES_MAX)?;
    let mut plain = nautdb::Side::new(RuntimeKind::Plain, 0)?;
    let variants = variants(plan);
    let mut cells = Vec::new();
    for &columns in &plan.columns {
        for &log2 in &plan.rows_log2 {
            let rows = 1usize << log2;
            let mut trials: Vec<Vec<nautdb::TrialTimes>> = vec![Vec::new(); variants.len()];
            for warmup in 0..WARMUP_TRIALS {
                let seed = 0x5EED + warmup as u64;
                specialized.trial(columns, rows, seed, false)?;
                plain.trial(columns, rows, seed, false)?;
            }
            for trial in 0..plan.trials {
                let seed = (trial as u64 + 1) * 0x9E37_79B9;
                for turn in 0..variants.len() {
                    let index = (trial + turn) % variants.len();
                    let (kind, fifo) = variants[index];
                    let side = if kind == RuntimeKind::Specialized { &mut specialized } else { &mut plain };
                    trials[index].push(side.trial(columns, rows, seed, fifo)?);
                }
            }
            eprintln!("nautdb: {columns:>3} columns × 2^{log2:<2} rows done");
            for ((kind, fifo), trials) in variants.iter().zip(trials) {
                cells.push(cell(*kind, *fifo, columns, rows, trials));
            }
        }
    }
    Ok(cells)
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub command: String,
    pub started_unix_s: u64,
    pub machine: Machine,
    pub nautdb: Vec<Cell>,
    pub allocator: Vec<alloc::AllocatorResult>,
    pub tpch: Option<tpch::TpchReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub load_average_before: String,
    pub load_average_after: String,
    pub kernel: String,
    pub transparent_hugepages: String,
    pub hugetlb_pages: String,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
}

fn machine(load_before: String) -> Machine {
    Machine {
        cores: crate::runtime::online_cores(),
        load_average_before: load_before,
        load_average_after: read_trimmed("/proc/loadavg"),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        transparent_hugepages: read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled"),
        hugetlb_pages: read_trimmed("/proc/sys/vm/nr_hugepages"),
    }
}

/// Runs the whole benchmark and writes the report files.
pub fn run(plan: &Plan) -> anyhow::Result<Results> {
    let load_before = read_trimmed("/proc/loadavg");
    let started_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let nautdb = if plan.skip_nautdb { Vec::new() } else { run_nautdb(plan)? };
    let allocator = if plan.skip_allocator {
        Vec::new()
    } else {
        eprintln!("allocators …");
        alloc::run(plan.allocator_rounds, &plan.allocator_sizes)?
    };
    let tpch = if plan.skip_tpch {
        None
    } else {
        eprintln!("TPC-H SF {} …", plan.scale_factor);
        Some(tpch::run(plan.scale_factor, plan.threads, plan.runs, plan.python.as_deref())?)
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let results = Results { command, started_unix_s, machine: machine(load_before), nautdb, allocator, tpch };
    std::fs::create_dir_all(&plan.out_dir)?;
    std::fs::write(plan.out_dir.join("engine.json"), serde_json::to_string_pretty(&results)?)?;
    std::fs::write(plan.out_dir.join("engine.md"), report::markdown(&results))?;
    report::plot(&results, &plan.out_dir.join("engine.png"))?;
    Ok(results)
}
