//! `bypass bench pooler`: pgbench through direct PostgreSQL, PgBouncer (1 and 2 processes) and
//! Bypass, in one run on one PostgreSQL, with results in JSON, markdown and PNG.
//!
//! ```text
//!   Postgres (testkit: max_connections 100, shared_buffers 256MB, synchronous_commit off)
//!     └─ pgbench -i -s 10, prewarm
//!   for workload × clients:                      ← one cell
//!     for repetition:
//!       for contender (direct ≤ 50 clients, pgbouncer, pgbouncer2, bypass):   ← interleaved
//!         start pooler (fresh) → pgbench -P 1 --log → CPU snapshots at progress lines → stop
//!         write pooler.json / pooler.md / pooler.png (an interrupted run keeps what it measured)
//! ```
//!
//! Every pooler is started fresh for its run and stopped right after, so no idle server
//! connections of one contender linger while another one runs (three poolers × 20 servers plus
//! 50 direct clients would not fit in max_connections 100) and no run inherits another's state.
//! A failing run is recorded as an error in its cell and the benchmark goes on; Ctrl-C stops it
//! and every child is still cleaned up.

mod contender;
mod markdown;
mod measure;
mod plot;
mod report;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bypass_testkit::{Postgres, PostgresOptions};
use serde::Serialize;

use crate::interrupt;
use measure::{RunRecord, RunSpec};
use report::Results;

/// Direct PostgreSQL runs only up to this many clients: max_connections is 100.
pub const DIRECT_CLIENTS_MAX: u32 = 50;

/// Most clients per run: pgbench needs a descriptor per client and the hard limit is 20,000.
const CLIENTS_MAX: u32 = 15_000;

/// Most repetitions per cell; more would only make a run last days.
const REPETITIONS_MAX: u32 = 50;

/// pgbench scale factor: 1M accounts rows, ~160 MB, fits in shared_buffers.
const SCALE: u32 = 10;

/// PostgreSQL settings identical for every contender (design §9).
const PG_MAX_CONNECTIONS: u32 = 100;
const PG_SHARED_BUFFERS_MB: u32 = 256;

/// Seconds estimated per run beyond `--duration-s` (pooler start, connections, logs), for the
/// time estimate printed at start.
const RUN_OVERHEAD_ESTIMATE_S: u64 = 3;

/// Arguments of `bypass bench pooler`.
#[derive(clap::Args, Debug, Clone)]
pub struct PoolerBenchArgs {
    /// Client counts, comma-separated. Direct PostgreSQL runs only at counts ≤ 50.
    #[arg(long, value_delimiter = ',', default_value = "50,1000,10000")]
    pub clients: Vec<u32>,
    /// Workloads, comma-separated: select1 (a script with `SELECT 1;`) and select-only
    /// (pgbench's builtin -S); both with -M simple.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "select1,select-only")]
    pub workloads: Vec<Workload>,
    /// Seconds each pgbench run lasts (-T), not counting the connection phase.
    #[arg(long, default_value_t = 30)]
    pub duration_s: u32,
    /// Runs per (workload, clients, contender); contenders are interleaved within a cell and the
    /// median is reported.
    #[arg(long, default_value_t = 1)]
    pub repetitions: u32,
    /// Directory for pooler.json, pooler.md and pooler.png.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Contenders, comma-separated: direct, pgbouncer, pgbouncer2 (two processes with
    /// so_reuseport), bypass.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "direct,pgbouncer,pgbouncer2,bypass")]
    pub contenders: Vec<Contender>,
    /// Server connections per pool, the same for every pooler.
    #[arg(long, default_value_t = 20)]
    pub pool_size: u32,
    /// pgbench threads (-j), capped at the client count.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
}

/// A pgbench workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// A script file with `SELECT 1;`: pure pooler and protocol overhead.
    Select1,
    /// pgbench -S: one primary-key lookup on pgbench_accounts.
    SelectOnly,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Select1 => "select1",
            Workload::SelectOnly => "select-only",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Workload::Select1 => "`SELECT 1;` script, -M simple",
            Workload::SelectOnly => "pgbench -S (primary-key lookup, scale 10), -M simple",
        }
    }
}

/// Who sits between pgbench and PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Contender {
    /// No pooler: pgbench connects to PostgreSQL.
    Direct,
    /// PgBouncer, one process.
    Pgbouncer,
    /// PgBouncer, two processes sharing the port with so_reuseport.
    Pgbouncer2,
    /// The bypass binary (`bypass proxy`), as a child process.
    Bypass,
    /// The same with `fast_path = "kernel"` (transactions forwarded by eBPF in the kernel).
    #[value(name = "bypass-kernel")]
    #[serde(rename = "bypass-kernel")]
    BypassKernel,
}

impl Contender {
    pub fn name(self) -> &'static str {
        match self {
            Contender::Direct => "direct",
            Contender::Pgbouncer => "pgbouncer",
            Contender::Pgbouncer2 => "pgbouncer2",
            Contender::Bypass => "bypass",
            Contender::BypassKernel => "bypass-kernel",
        }
    }

    /// The name in tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            Contender::Direct => "direct PG",
            Contender::Pgbouncer => "PgBouncer",
            Contender::Pgbouncer2 => "PgBouncer ×2",
            Contender::Bypass => "Bypass",
            Contender::BypassKernel => "Bypass kernel",
        }
    }

    /// Whether this contender runs at `clients`.
    pub fn runs_at(self, clients: u32) -> bool {
        self != Contender::Direct || clients <= DIRECT_CLIENTS_MAX
    }
}

/// Runs the benchmark and writes its results under `args.out`.
pub fn run(args: PoolerBenchArgs, bypass_exe: &Path) -> Result<()> {
    let args = validated(args)?;
    interrupt::install();
    let plan = plan(&args);
    let estimate_s = plan.len() as u64 * (u64::from(args.duration_s) + RUN_OVERHEAD_ESTIMATE_S);
    eprintln!(
        "bench pooler: {} runs, roughly {} min (pgbench -T includes the connection phase)",
        plan.len(),
        estimate_s.div_ceil(60)
    );
    if let Err(error) = plot::check_font() {
        eprintln!("bench pooler: warning: {error:#}");
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let postgres = start_postgres()?;
    let work_dir = tempfile::Builder::new().prefix("bypass-bench-").tempdir().context("creating a work dir")?;
    let bench = measure::Bench::new(&args, &postgres, bypass_exe, work_dir.path())?;
    let mut results = Results::new(&args, &postgres, bypass_exe)?;
    let started = Instant::now();
    for (index, spec) in plan.iter().enumerate() {
        let partial = || format!("stopped; the finished runs are in {}", args.out.display());
        if interrupt::requested() {
            bail!("interrupted; {}", partial());
        }
        let record = bench.measure(spec).with_context(partial)?;
        log_progress(index, plan.len(), &record, started);
        results.push(record);
        // Written after every run, so an interrupted or crashed benchmark keeps what it measured.
        results.write(&args.out)?;
    }
    eprintln!("bench pooler: done in {:.1} min; wrote {}", started.elapsed().as_secs_f64() / 60.0, args.out.display());
    Ok(())
}

/// Checks the arguments, dropping duplicates while keeping the given order.
fn validated(mut args: PoolerBenchArgs) -> Result<PoolerBenchArgs> {
    dedup_keep_order(&mut args.clients);
    dedup_keep_order(&mut args.workloads);
    dedup_keep_order(&mut args.contenders);
    if args.clients.is_empty() || args.workloads.is_empty() || args.contenders.is_empty() {
        bail!("--clients, --workloads and --contenders must each name at least one value");
    }
    if let Some(&bad) = args.clients.iter().find(|&&clients| clients == 0 || clients > CLIENTS_MAX) {
        bail!("--clients {bad}: each count must be 1..={CLIENTS_MAX}");
    }
    if args.duration_s < 2 {
        bail!("--duration-s must be at least 2: the CPU window lies between the first and last progress lines");
    }
    if args.repetitions == 0 || args.repetitions > REPETITIONS_MAX {
        bail!("--repetitions must be 1..={REPETITIONS_MAX}");
    }
    if args.pool_size == 0 || args.pool_size >= PG_MAX_CONNECTIONS / 2 || args.threads == 0 {
        bail!(
            "--pool-size must be 1..{} (two PgBouncer processes each open a pool) and --threads ≥ 1",
            PG_MAX_CONNECTIONS / 2
        );
    }
    Ok(args)
}

fn dedup_keep_order<T: PartialEq + Copy>(values: &mut Vec<T>) {
    let mut seen = Vec::with_capacity(values.len());
    values.retain(|value| {
        let fresh = !seen.contains(value);
        seen.push(*value);
        fresh
    });
}

/// Every run in execution order: cells in (workload, clients) order; inside a cell the
/// repetitions, and inside each repetition the contenders in the given order (A B C D A B C D).
fn plan(args: &PoolerBenchArgs) -> Vec<RunSpec> {
    let mut runs = Vec::new();
    for &workload in &args.workloads {
        for &clients in &args.clients {
            for repetition in 0..args.repetitions {
                for &contender in args.contenders.iter().filter(|c| c.runs_at(clients)) {
                    runs.push(RunSpec { workload, clients, contender, repetition });
                }
            }
        }
    }
    runs
}

fn start_postgres() -> Result<Postgres> {
    eprintln!("bench pooler: starting PostgreSQL");
    Postgres::start_with(PostgresOptions {
        max_connections: PG_MAX_CONNECTIONS,
        shared_buffers_mb: PG_SHARED_BUFFERS_MB,
        extra_conf: vec!["synchronous_commit = off".to_string()],
        ..PostgresOptions::default()
    })
    .context("starting PostgreSQL")
}

fn log_progress(index: usize, total: usize, record: &RunRecord, started: Instant) {
    let outcome = match (&record.error, record.tps) {
        (Some(error), _) => format!("ERROR {error}"),
        (None, Some(tps)) => format!("{tps:.0} tps"),
        (None, None) => "no tps".to_string(),
    };
    let p99 = record.latency.as_ref().map_or(String::new(), |latency| format!(", p99 {:.2} ms", latency.p99_ms));
    let cpu = record.cpu.as_ref().map_or(String::new(), |cpu| format!(", {:.1} CPU-µs/txn", cpu.system_us_per_txn));
    eprintln!(
        "bench pooler: [{}/{total}] {} {} clients={} rep={}: {outcome}{p99}{cpu} (elapsed {:.1} min)",
        index + 1,
        record.contender.name(),
        record.workload.name(),
        record.clients,
        record.repetition + 1,
        started.elapsed().as_secs_f64() / 60.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PoolerBenchArgs,
    }

    fn parse(argv: &[&str]) -> PoolerBenchArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(argv.iter().copied())).expect("valid arguments").args
    }

    // Goal: the defaults are the documented ones; method: parse an empty command line.
    #[test]
    fn defaults_match_the_protocol() {
        let args = parse(&[]);
        assert_eq!(args.clients, vec![50, 1000, 10_000]);
        assert_eq!(args.workloads, vec![Workload::Select1, Workload::SelectOnly]);
        let all = vec![Contender::Direct, Contender::Pgbouncer, Contender::Pgbouncer2, Contender::Bypass];
        assert_eq!(args.contenders, all);
        assert_eq!((args.duration_s, args.repetitions, args.pool_size), (30, 1, 20));
        assert_eq!(args.out, PathBuf::from("bench/results"));
    }

    // Goal: contenders interleave inside a cell and direct is skipped above 50 clients;
    // method: plan two repetitions at 50 and 1000 clients.
    #[test]
    fn plan_interleaves_and_skips_direct() {
        let args =
            validated(parse(&["--clients", "50,1000", "--workloads", "select1", "--repetitions", "2"])).expect("valid");
        let order: Vec<(u32, &str, u32)> =
            plan(&args).iter().map(|run| (run.clients, run.contender.name(), run.repetition)).collect();
        let mut expected = Vec::new();
        for repetition in 0..2 {
            for name in ["direct", "pgbouncer", "pgbouncer2", "bypass"] {
                expected.push((50, name, repetition));
            }
        }
        for repetition in 0..2 {
            for name in ["pgbouncer", "pgbouncer2", "bypass"] {
                expected.push((1000, name, repetition));
            }
        }
        assert_eq!(order, expected);
    }

    // Goal: nonsense arguments are refused before anything starts; method: a few bad lines.
    #[test]
    fn validation_rejects_bad_arguments() {
        assert!(validated(parse(&["--clients", "0"])).is_err());
        assert!(validated(parse(&["--clients", "20000"])).is_err());
        assert!(validated(parse(&["--duration-s", "1"])).is_err());
        assert!(validated(parse(&["--repetitions", "0"])).is_err());
        assert!(validated(parse(&["--pool-size", "60"])).is_err());
        let deduped = validated(parse(&["--clients", "50,50,10"])).expect("valid");
        assert_eq!(deduped.clients, vec![50, 10]);
    }
}
