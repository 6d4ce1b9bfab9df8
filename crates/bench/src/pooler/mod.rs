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
//!
//! This module is also the harness other pgbench-driven benchmarks reuse: a [`Setup`] (name,
//! pgbench and PostgreSQL knobs), a plan of [`measure::RunSpec`]s ([`matrix_plan`]), [`drive`]
//! (the loop above) and a [`Document`] that receives every run and rewrites its files.

pub(crate) mod contender;
pub(crate) mod epoll_run;
pub(crate) mod markdown;
pub(crate) mod measure;
pub(crate) mod plot;
pub(crate) mod report;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bypass_testkit::{Postgres, PostgresOptions};
use serde::Serialize;

use crate::{bpf_stats, interrupt};
use measure::{RunRecord, RunSpec};
use report::Results;

/// Most clients per run: pgbench needs a descriptor per client and the hard limit is 20,000.
pub const CLIENTS_MAX: u32 = 15_000;

/// Most repetitions per cell; more would only make a run last days.
pub const REPETITIONS_MAX: u32 = 50;

/// pgbench scale factor: 1M accounts rows, ~160 MB, fits in shared_buffers.
pub const SCALE: u32 = 10;

/// Seconds estimated per run beyond `--duration-s` (pooler start, connections, logs), for the
/// time estimate printed at start.
const RUN_OVERHEAD_ESTIMATE_S: u64 = 3;

/// Extra seconds estimated per run for every this many clients (connecting, closing, reading logs).
const CLIENTS_PER_EXTRA_ESTIMATE_S: u32 = 2_000;

/// Seconds estimated for starting PostgreSQL and loading the tables.
const SETUP_ESTIMATE_S: u64 = 40;

/// The same again per extra database or table set loaded (YCSB, the shadow database).
const LOAD_ESTIMATE_S: u64 = 20;

/// Arguments of `bypass bench pooler`.
#[derive(clap::Args, Debug, Clone)]
pub struct PoolerBenchArgs {
    /// Client counts, comma-separated. Direct PostgreSQL runs only at counts ≤ 50.
    #[arg(long, value_delimiter = ',', default_value = "50,1000,10000")]
    pub clients: Vec<u32>,
    /// Workloads, comma-separated: select1 (a script with `SELECT 1;`), select-only (pgbench -S),
    /// simple-update (pgbench -N), ycsb-a, ycsb-b, ycsb-c; all with -M simple.
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
    /// so_reuseport), bypass (one worker thread), bypass2 (two), bypass-kernel.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "direct,pgbouncer,pgbouncer2,bypass,bypass2")]
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
    /// pgbench -N: TPC-B-like without the teller and branch updates (BEGIN, UPDATE accounts,
    /// SELECT, INSERT history, END).
    SimpleUpdate,
    /// YCSB-like A on `usertable`: 50% reads, 50% updates, zipfian keys.
    YcsbA,
    /// YCSB-like B: 95% reads, 5% updates.
    YcsbB,
    /// YCSB-like C: reads only.
    YcsbC,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Select1 => "select1",
            Workload::SelectOnly => "select-only",
            Workload::SimpleUpdate => "simple-update",
            Workload::YcsbA => "ycsb-a",
            Workload::YcsbB => "ycsb-b",
            Workload::YcsbC => "ycsb-c",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Workload::Select1 => "`SELECT 1;` script, -M simple",
            Workload::SelectOnly => "pgbench -S (primary-key lookup, scale 10), -M simple",
            Workload::SimpleUpdate => "pgbench -N (update, select, insert in one transaction, scale 10), -M simple",
            Workload::YcsbA => "YCSB-like A: 50% read / 50% update of one row, zipfian keys, -M simple",
            Workload::YcsbB => "YCSB-like B: 95% read / 5% update of one row, zipfian keys, -M simple",
            Workload::YcsbC => "YCSB-like C: read one row, zipfian keys, -M simple",
        }
    }

    /// The share of transactions (in percent) that read one `usertable` row; `None` for the
    /// workloads that do not use `usertable`.
    pub fn ycsb_read_percent(self) -> Option<u32> {
        match self {
            Workload::YcsbA => Some(50),
            Workload::YcsbB => Some(95),
            Workload::YcsbC => Some(100),
            Workload::Select1 | Workload::SelectOnly | Workload::SimpleUpdate => None,
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
    /// The bypass binary (`bypass proxy`, `fast_path = "user"`) with one worker thread, as one
    /// PgBouncer process has, as a child process.
    Bypass,
    /// The same with two worker threads (`workers = 2`), against PgBouncer's two processes.
    Bypass2,
    /// The same with `fast_path = "kernel"` (transactions forwarded by eBPF in the kernel).
    #[value(name = "bypass-kernel")]
    #[serde(rename = "bypass-kernel")]
    BypassKernel,
    /// Bypass kernel with `fast_path_queue_behind = true`: a request that finds no free
    /// server is queued in the kernel behind a busy one instead of climbing to user space.
    #[value(name = "bypass-kernel-queue")]
    #[serde(rename = "bypass-kernel-queue")]
    BypassKernelQueue,
    /// Bypass user with every query of `postgres` mirrored to the `shadow` database in user space
    /// (only in `bench fastpath --mirroring`).
    #[value(skip)]
    #[serde(rename = "bypass-mirror")]
    BypassMirror,
    /// Bypass kernel with the mirror done in the kernel (only in `bench fastpath --mirroring`).
    #[value(skip)]
    #[serde(rename = "bypass-kernel-mirror")]
    BypassKernelMirror,
}

impl Contender {
    pub fn name(self) -> &'static str {
        match self {
            Contender::Direct => "direct",
            Contender::Pgbouncer => "pgbouncer",
            Contender::Pgbouncer2 => "pgbouncer2",
            Contender::Bypass => "bypass",
            Contender::Bypass2 => "bypass2",
            Contender::BypassKernel => "bypass-kernel",
            Contender::BypassKernelQueue => "bypass-kernel-queue",
            Contender::BypassMirror => "bypass-mirror",
            Contender::BypassKernelMirror => "bypass-kernel-mirror",
        }
    }

    /// The name in tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            Contender::Direct => "direct PG",
            Contender::Pgbouncer => "PgBouncer",
            Contender::Pgbouncer2 => "PgBouncer ×2",
            Contender::Bypass => "Bypass",
            Contender::Bypass2 => "Bypass ×2",
            Contender::BypassKernel => "Bypass kernel",
            Contender::BypassKernelQueue => "Bypass kernel + queue",
            Contender::BypassMirror => "Bypass + mirror",
            Contender::BypassKernelMirror => "Bypass kernel + mirror",
        }
    }

    /// Whether the eBPF fast path forwards this contender's transactions.
    pub fn is_kernel(self) -> bool {
        matches!(self, Contender::BypassKernel | Contender::BypassKernelQueue | Contender::BypassKernelMirror)
    }

    /// Whether this contender mirrors every query to the shadow database.
    pub fn mirrors(self) -> bool {
        matches!(self, Contender::BypassMirror | Contender::BypassKernelMirror)
    }

    /// Whether this contender runs at `clients`: direct PostgreSQL only up to `direct_clients_max`.
    pub fn runs_at(self, clients: u32, direct_clients_max: u32) -> bool {
        self != Contender::Direct || clients <= direct_clients_max
    }
}

/// What drives the clients of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Generator {
    /// pgbench `-M simple`: one `ppoll` over all of a thread's sockets per wake-up, so its own
    /// cost per transaction grows with the clients.
    Pgbench,
    /// The epoll load generator of `bypass-lab`, in this process: the same simple queries, a
    /// cost per transaction that does not grow with the clients (select1 and ycsb-* only).
    Epoll,
}

impl Generator {
    pub fn name(self) -> &'static str {
        match self {
            Generator::Pgbench => "pgbench",
            Generator::Epoll => "epoll",
        }
    }

    /// The name in headings and plots.
    pub fn label(self) -> &'static str {
        match self {
            Generator::Pgbench => "pgbench",
            Generator::Epoll => "epoll generator",
        }
    }

    /// Whether this generator can run `workload` (the epoll generator sends one statement per
    /// transaction, with zipfian keys only).
    pub fn runs(self, workload: Workload) -> bool {
        self == Generator::Pgbench || epoll_run::script(workload).is_some()
    }
}

/// What every run of one benchmark shares: its name (file names, log prefix), the pgbench and
/// pool knobs, and the PostgreSQL shape.
#[derive(Debug, Clone)]
pub struct Setup {
    /// `pooler` or `fastpath`: names `<benchmark>.{json,md,png}` and prefixes progress lines.
    pub benchmark: &'static str,
    pub duration_s: u32,
    pub repetitions: u32,
    pub pool_size: u32,
    pub threads: u32,
    pub pg_max_connections: u32,
    pub pg_shared_buffers_mb: u32,
    /// Direct PostgreSQL runs only up to this many clients (max_connections less headroom).
    pub direct_clients_max: u32,
}

impl Setup {
    /// PostgreSQL settings identical for every contender (design §9).
    pub fn postgres_conf(&self) -> Vec<String> {
        vec![
            format!("max_connections = {}", self.pg_max_connections),
            format!("shared_buffers = {}MB", self.pg_shared_buffers_mb),
            "synchronous_commit = off".to_string(),
            "fsync = off (throwaway cluster)".to_string(),
        ]
    }

    /// Rough wall time of `plan` in seconds, for the estimate printed at start.
    pub fn estimate_s(&self, plan: &[RunSpec]) -> u64 {
        let runs: u64 = plan
            .iter()
            .map(|spec| {
                u64::from(self.duration_s)
                    + RUN_OVERHEAD_ESTIMATE_S
                    + u64::from(spec.clients / CLIENTS_PER_EXTRA_ESTIMATE_S)
            })
            .sum();
        let loads = u64::from(plan.iter().any(|spec| spec.workload.ycsb_read_percent().is_some()))
            + 2 * u64::from(plan.iter().any(|spec| spec.contender.mirrors()));
        SETUP_ESTIMATE_S + LOAD_ESTIMATE_S * loads + runs
    }
}

/// Where the runs of a benchmark go: the document is updated after every run and rewritten, so
/// an interrupted or crashed benchmark keeps what it measured.
pub trait Document {
    fn push(&mut self, record: RunRecord);
    fn write(&self, out: &Path) -> Result<()>;
}

impl Document for Results {
    fn push(&mut self, record: RunRecord) {
        Results::push(self, record);
    }

    fn write(&self, out: &Path) -> Result<()> {
        Results::write(self, out)
    }
}

/// Runs the benchmark and writes its results under `args.out`.
pub fn run(args: PoolerBenchArgs, bypass_exe: &Path) -> Result<()> {
    let args = validated(args)?;
    let setup = Setup {
        benchmark: "pooler",
        duration_s: args.duration_s,
        repetitions: args.repetitions,
        pool_size: args.pool_size,
        threads: args.threads,
        pg_max_connections: PG_MAX_CONNECTIONS,
        pg_shared_buffers_mb: PG_SHARED_BUFFERS_MB,
        direct_clients_max: DIRECT_CLIENTS_MAX,
    };
    let plan = plan(&args);
    drive(&setup, &plan, bypass_exe, &args.out, |postgres, load_average| {
        let matrix = report::Matrix {
            workloads: args.workloads.clone(),
            clients: args.clients.clone(),
            contenders: args.contenders.clone(),
            // Like against like: one pooler thread against one PgBouncer process, two against two;
            // and Bypass as it runs by default here (one shard per core: two) against PgBouncer
            // as it runs by default (one process).
            ratio_pairs: vec![
                (Contender::Bypass, Contender::Pgbouncer),
                (Contender::Bypass2, Contender::Pgbouncer2),
                (Contender::Bypass2, Contender::Pgbouncer),
            ],
        };
        Results::new(&setup, matrix, postgres, bypass_exe, load_average)
    })
}

/// Direct PostgreSQL runs only up to this many clients in `bench pooler`: max_connections is 100.
pub const DIRECT_CLIENTS_MAX: u32 = 50;

/// PostgreSQL settings of `bench pooler` (design §9).
const PG_MAX_CONNECTIONS: u32 = 100;
const PG_SHARED_BUFFERS_MB: u32 = 256;

/// The loop every benchmark shares: start PostgreSQL, load the tables the plan needs, measure
/// every run in order, update and rewrite the document after each. `new_document` gets the
/// running PostgreSQL (for its version) and the load average at the start.
pub fn drive<D: Document>(
    setup: &Setup,
    plan: &[RunSpec],
    bypass_exe: &Path,
    out: &Path,
    new_document: impl FnOnce(&Postgres, String) -> Result<D>,
) -> Result<()> {
    interrupt::install();
    let name = setup.benchmark;
    let load_average = crate::machine::load_average();
    eprintln!(
        "bench {name}: {} runs, roughly {} min (load average now {load_average}; pgbench -T includes the connection phase)",
        plan.len(),
        setup.estimate_s(plan).div_ceil(60)
    );
    if let Err(error) = crate::report::plot::check_font() {
        eprintln!("bench {name}: warning: {error:#}");
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    // Held for the whole benchmark; dropping it (also on an error or Ctrl-C) turns BPF
    // statistics off again unless another process holds them on.
    let _bpf_stats = match plan.iter().any(|spec| spec.contender.is_kernel()) {
        true => Some(bpf_stats::StatsSwitch::enable().context("enabling BPF run-time statistics")?),
        false => None,
    };
    let postgres = start_postgres(setup)?;
    let work_dir = tempfile::Builder::new().prefix("bypass-bench-").tempdir().context("creating a work dir")?;
    let bench = measure::Bench::new(setup, plan, &postgres, bypass_exe, work_dir.path())?;
    let mut document = new_document(&postgres, load_average)?;
    let started = Instant::now();
    for (index, spec) in plan.iter().enumerate() {
        let partial = || format!("stopped; the finished runs are in {}", out.display());
        if interrupt::requested() {
            bail!("interrupted; {}", partial());
        }
        let record = bench.measure(spec).with_context(partial)?;
        log_progress(name, index, plan.len(), &record, started);
        document.push(record);
        document.write(out)?;
    }
    eprintln!("bench {name}: done in {:.1} min; wrote {}", started.elapsed().as_secs_f64() / 60.0, out.display());
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
    validate_common(&args.clients, args.duration_s, args.repetitions, args.threads)?;
    if args.pool_size == 0 || args.pool_size >= PG_MAX_CONNECTIONS / 2 {
        bail!("--pool-size must be 1..{} (two PgBouncer processes each open a pool)", PG_MAX_CONNECTIONS / 2);
    }
    Ok(args)
}

/// The checks every benchmark's arguments share.
pub fn validate_common(clients: &[u32], duration_s: u32, repetitions: u32, threads: u32) -> Result<()> {
    if let Some(&bad) = clients.iter().find(|&&clients| clients == 0 || clients > CLIENTS_MAX) {
        bail!("--clients {bad}: each count must be 1..={CLIENTS_MAX}");
    }
    if duration_s < 2 {
        bail!("--duration-s must be at least 2: the CPU window lies between the first and last progress lines");
    }
    if repetitions == 0 || repetitions > REPETITIONS_MAX {
        bail!("--repetitions must be 1..={REPETITIONS_MAX}");
    }
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    Ok(())
}

pub fn dedup_keep_order<T: PartialEq + Copy>(values: &mut Vec<T>) {
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
    matrix_plan(&args.workloads, &args.clients, &args.contenders, args.repetitions, DIRECT_CLIENTS_MAX)
}

/// The interleaved plan of a (workloads × clients) matrix; see [`plan`].
pub fn matrix_plan(
    workloads: &[Workload],
    clients: &[u32],
    contenders: &[Contender],
    repetitions: u32,
    direct_clients_max: u32,
) -> Vec<RunSpec> {
    let mut runs = Vec::new();
    for &workload in workloads {
        for &clients in clients {
            for repetition in 0..repetitions {
                for &contender in contenders.iter().filter(|c| c.runs_at(clients, direct_clients_max)) {
                    runs.push(RunSpec { workload, clients, contender, repetition, generator: Generator::Pgbench });
                }
            }
        }
    }
    runs
}

fn start_postgres(setup: &Setup) -> Result<Postgres> {
    eprintln!("bench {}: starting PostgreSQL", setup.benchmark);
    Postgres::start_with(PostgresOptions {
        max_connections: setup.pg_max_connections,
        shared_buffers_mb: setup.pg_shared_buffers_mb,
        extra_conf: vec!["synchronous_commit = off".to_string()],
        ..PostgresOptions::default()
    })
    .context("starting PostgreSQL")
}

/// Characters of a run's error on its progress line; the documents keep it whole.
const CONSOLE_ERROR_CHARS_MAX: usize = 300;

/// `text` on one line, cut to `chars_max` characters.
fn one_line(text: &str, chars_max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(chars_max) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

fn log_progress(name: &str, index: usize, total: usize, record: &RunRecord, started: Instant) {
    let outcome = match (&record.error, record.tps) {
        (Some(error), _) => format!("ERROR {}", one_line(error, CONSOLE_ERROR_CHARS_MAX)),
        (None, Some(tps)) => format!("{tps:.0} tps"),
        (None, None) => "no tps".to_string(),
    };
    let p99 = record.latency.as_ref().map_or(String::new(), |latency| format!(", p99 {:.2} ms", latency.p99_ms));
    let cpu = record.cpu.as_ref().map_or(String::new(), |cpu| format!(", {:.1} CPU-µs/txn", cpu.system_us_per_txn));
    let bpf = record.bpf.as_ref().map_or(String::new(), |bpf| format!(", BPF {:.0} ns/txn", bpf.ns_per_txn));
    eprintln!(
        "bench {name}: [{}/{total}] {} {} clients={} rep={}: {outcome}{p99}{cpu}{bpf} (elapsed {:.1} min)",
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
        let all =
            vec![Contender::Direct, Contender::Pgbouncer, Contender::Pgbouncer2, Contender::Bypass, Contender::Bypass2];
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
            for name in ["direct", "pgbouncer", "pgbouncer2", "bypass", "bypass2"] {
                expected.push((50, name, repetition));
            }
        }
        for repetition in 0..2 {
            for name in ["pgbouncer", "pgbouncer2", "bypass", "bypass2"] {
                expected.push((1000, name, repetition));
            }
        }
        assert_eq!(order, expected);
    }

    // Goal: console errors are one bounded line; method: a multi-line error and a short one.
    #[test]
    fn console_errors_are_one_short_line() {
        assert_eq!(
            one_line("bypass exited\n  config: unknown field `mirror`", 300),
            "bypass exited config: unknown field `mirror`"
        );
        assert_eq!(one_line("abcdef", 3), "abc…");
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
