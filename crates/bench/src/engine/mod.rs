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
pub mod alloc_profile;
pub mod nautdb;
pub mod regress;
mod report;
pub mod serving;
pub mod tpch;

use std::path::PathBuf;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::report::machine::{load_average, Machine};
use crate::report::stats::median;
use bypass_engine::runtime::RuntimeKind;

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
    /// Run only this section and merge it into the report already in `out_dir`.
    pub only: Option<Section>,
}

/// The report's three sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Section {
    /// The seed's grid (specialized vs plain runtime).
    Nautdb,
    /// The allocator micro-benchmark.
    Allocators,
    /// TPC-H against the peers.
    Tpch,
}

/// Median, coefficient of variation and samples of one measured quantity.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stat {
    pub median: f64,
    pub mean: f64,
    pub cv: f64,
}

impl Stat {
    pub fn of(values: &[f64]) -> Stat {
        let n = values.len().max(1) as f64;
        let mean = values.iter().sum::<f64>() / n;
        let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let median = median(values).unwrap_or(0.0);
        Stat { median, mean, cv: if mean > 0.0 { variance.sqrt() / mean } else { 0.0 } }
    }
}

/// One (runtime, columns, rows) cell of the seed's grid.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub command: String,
    pub started_unix_s: u64,
    pub machine: Machine,
    pub nautdb: Vec<Cell>,
    pub allocator: Vec<alloc::AllocatorResult>,
    pub tpch: Option<tpch::TpchReport>,
    /// Sections measured by a later `--only` run and merged in, with that run's command and load.
    #[serde(default)]
    pub separate_runs: BTreeMap<Section, SeparateRun>,
}

/// Where a section merged in by `--only` came from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeparateRun {
    pub command: String,
    pub started_unix_s: u64,
    pub load_average_before: String,
    pub load_average_after: String,
}

fn machine(load_before: String) -> Machine {
    Machine { load_average_before: load_before, ..Machine::now() }
}

/// Runs the planned sections and writes the report files; with `plan.only`, the one section
/// replaces its namesake in the report already in `out_dir` (or starts a new report).
pub fn run(plan: &Plan) -> anyhow::Result<Results> {
    let load_before = load_average();
    let started_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let wanted = |section: Section, skipped: bool| plan.only.map_or(!skipped, |only| only == section);
    let nautdb = if wanted(Section::Nautdb, plan.skip_nautdb) { run_nautdb(plan)? } else { Vec::new() };
    let allocator = if wanted(Section::Allocators, plan.skip_allocator) {
        eprintln!("allocators …");
        alloc::run(plan.allocator_rounds, &plan.allocator_sizes)?
    } else {
        Vec::new()
    };
    let tpch = if wanted(Section::Tpch, plan.skip_tpch) {
        eprintln!("TPC-H SF {} …", plan.scale_factor);
        Some(tpch::run(plan.scale_factor, plan.threads, plan.runs, plan.python.as_deref())?)
    } else {
        None
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut results = Results {
        command,
        started_unix_s,
        machine: machine(load_before),
        nautdb,
        allocator,
        tpch,
        separate_runs: BTreeMap::new(),
    };
    if let Some(section) = plan.only {
        results = merge_into_existing(&plan.out_dir.join("engine.json"), results, section)?;
    }
    let profile = read_profile(&plan.out_dir.join("engine-alloc-profile.json"))?;
    let markdown = report::markdown(&results, profile.as_ref());
    crate::report::write(&plan.out_dir, "engine", &results, &markdown, |png| report::plot(&results, png))?;
    Ok(results)
}

/// The allocator profile `scripts/engine-alloc-profile.sh` wrote, if it has run.
fn read_profile(path: &Path) -> anyhow::Result<Option<alloc_profile::Profile>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(anyhow::anyhow!("{}: {error}", path.display())),
    }
}

/// The report at `path` with `section` taken from `fresh` (and `fresh`'s command and load
/// recorded for it); `fresh` itself when there is no report yet.
fn merge_into_existing(path: &Path, fresh: Results, section: Section) -> anyhow::Result<Results> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(fresh),
        Err(error) => return Err(anyhow::anyhow!("{}: {error}", path.display())),
    };
    let mut merged: Results =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: not an engine report: {e}", path.display()))?;
    merge_section(&mut merged, fresh, section);
    Ok(merged)
}

fn merge_section(merged: &mut Results, fresh: Results, section: Section) {
    match section {
        Section::Nautdb => merged.nautdb = fresh.nautdb,
        Section::Allocators => merged.allocator = fresh.allocator,
        Section::Tpch => merged.tpch = fresh.tpch,
    }
    let run = SeparateRun {
        command: fresh.command,
        started_unix_s: fresh.started_unix_s,
        load_average_before: fresh.machine.load_average_before,
        load_average_after: fresh.machine.load_average_after,
    };
    merged.separate_runs.insert(section, run);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(command: &str, allocator_sizes: &[(usize, usize)]) -> Results {
        Results {
            command: command.to_string(),
            started_unix_s: 1,
            machine: machine("0.00 0.00 0.00 1/1 1".to_string()),
            nautdb: Vec::new(),
            allocator: alloc::run(1, allocator_sizes).expect("arenas map"),
            tpch: None,
            separate_runs: BTreeMap::new(),
        }
    }

    // Goal: `--only allocators` replaces the allocator section of the report on disk, keeps the
    // other sections and the original header, and records its own run; method: write a report
    // with a nautdb cell, merge a fresh allocator-only run into it, and read the result.
    #[test]
    fn an_only_run_replaces_its_section_and_keeps_the_rest() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("engine.json");
        let mut original = report("full run", &[(16, 1 << 12)]);
        original.nautdb = vec![cell(RuntimeKind::Plain, false, 2, 16, vec![nautdb::TrialTimes::default()])];
        std::fs::write(&path, serde_json::to_string(&original).expect("serializes")).expect("writes");
        let fresh = report("only allocators", &[(64, 1 << 12)]);
        let merged = merge_into_existing(&path, fresh, Section::Allocators).expect("merges");
        assert_eq!(merged.command, "full run", "the header stays the full run's");
        assert_eq!(merged.nautdb.len(), 1, "the grid is kept");
        assert_eq!(merged.allocator.len(), 1);
        assert_eq!(merged.allocator[0].size_bytes, 64, "the allocator section is the fresh one");
        assert_eq!(merged.separate_runs[&Section::Allocators].command, "only allocators");
        let markdown = report::markdown(&merged, None);
        assert!(markdown.contains("Measured separately from the other sections: `only allocators`"), "{markdown}");
    }

    // Goal: a missing report is started fresh and a corrupt one is an error, not overwritten;
    // method: merge into a path that does not exist, then into one holding garbage.
    #[test]
    fn merging_starts_fresh_or_refuses_a_corrupt_report() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let missing = directory.path().join("engine.json");
        let merged = merge_into_existing(&missing, report("only", &[(16, 1 << 12)]), Section::Allocators);
        assert_eq!(merged.expect("a fresh report").command, "only");
        std::fs::write(&missing, "not json").expect("writes");
        let error = merge_into_existing(&missing, report("only", &[(16, 1 << 12)]), Section::Allocators)
            .expect_err("garbage is refused");
        assert!(error.to_string().contains("not an engine report"), "{error}");
    }

    // Goal: the committed report stays readable, so `--only` runs can merge into it; method:
    // parse bench/results/engine.json with the report's own types.
    #[test]
    fn the_committed_report_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results/engine.json");
        let text = std::fs::read_to_string(&path).expect("bench/results/engine.json is committed");
        let results: Results = serde_json::from_str(&text).expect("the committed report parses");
        assert!(!results.allocator.is_empty(), "it has an allocator section");
    }
}
