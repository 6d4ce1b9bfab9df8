//! One run: start the contender, run pgbench against it, turn the outcome into a [`RunRecord`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bypass_testkit::{pg_bin, Postgres};
use serde::Serialize;

use super::contender::{self, Target, DATABASE, SHADOW_DATABASE};
use super::{Contender, Generator, Setup, Workload, SCALE};
use crate::bpf_stats::{self, BpfCost};
use crate::cpu::{self, Probe, Snapshot};
use crate::interrupt;
use crate::pgbench::{self, Outcome, Tick};
use crate::pgbench_log::{self, LatencySummary};
use crate::stats::median;

/// At and above this many clients only a sample of transactions is logged, to bound file size.
pub const SAMPLED_LOG_CLIENTS_MIN: u32 = 5_000;

/// `--sampling-rate` used at and above [`SAMPLED_LOG_CLIENTS_MIN`] clients.
const SAMPLED_LOG_RATE: f64 = 0.1;

/// Time allowed for pgbench beyond `-T`, covering the connection phase: a base plus a share per
/// client (10,000 clients through one PgBouncer can take tens of seconds to connect).
const CONNECT_ALLOWANCE_BASE_S: u64 = 120;
const CONNECT_ALLOWANCE_CLIENTS_PER_S: u32 = 50;

/// How long to wait for the previous run's backends to go away before starting the next one.
const IDLE_BACKENDS_TIMEOUT: Duration = Duration::from_secs(15);

/// An interval below this share of the median progress TPS counts as ramp-up.
const RAMP_UP_TPS_FRACTION: f64 = 0.8;

/// The file prefix of pgbench's per-transaction logs inside a run's temp dir.
const LOG_PREFIX: &str = "x";

/// Lines of pgbench's stderr quoted in an error.
const STDERR_LINES_IN_ERROR: usize = 3;

/// Rows of the YCSB-like `usertable`, each ~1 KB (ten 100-character fields).
pub const YCSB_ROWS: u32 = 100_000;

/// Characters per `usertable` field: YCSB's default field length.
const YCSB_FIELD_CHARS: u32 = 100;

/// The zipfian skew of YCSB keys: YCSB uses 0.99, but pgbench 15 accepts only s ∈ [1.001, 1000].
pub const YCSB_ZIPF_S: f64 = 1.001;

/// The statements of a YCSB read and update, `:key` a zipfian key: pgbench's scripts and the
/// epoll generator send the same text.
pub const YCSB_READ_SQL: &str = "SELECT * FROM usertable WHERE ycsb_key = :key;";
pub const YCSB_UPDATE_SQL: &str = "UPDATE usertable SET field0 = repeat(md5(random()::text), 3) WHERE ycsb_key = :key;";

/// Which run this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSpec {
    pub workload: Workload,
    pub clients: u32,
    pub contender: Contender,
    pub repetition: u32,
    pub generator: Generator,
}

/// Everything measured in one run. Fields are `None` when the run failed before producing them.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub workload: Workload,
    pub clients: u32,
    pub contender: Contender,
    pub repetition: u32,
    pub generator: Generator,
    /// Why the run failed or is suspect (pgbench exit status, stderr tail, failed transactions).
    pub error: Option<String>,
    /// pgbench's "tps = X (without initial connection time)".
    pub tps: Option<f64>,
    pub transactions: Option<u64>,
    pub failed_transactions: Option<u64>,
    pub initial_connection_ms: Option<f64>,
    /// From the per-transaction log, transactions completed inside the CPU window.
    pub latency: Option<LatencySummary>,
    pub latency_sampling_rate: f64,
    /// TPS × mean latency / clients; ≈ 1 in a closed loop when both are measured right.
    pub little_ratio: Option<f64>,
    pub cpu: Option<CpuWindow>,
    /// TPS of every `-P 1` interval, to spot stalls.
    pub progress_tps: Vec<f64>,
    pub pgbench_exit_code: Option<i32>,
    pub wall_s: f64,
    /// For the kernel fast path: verdict programs' cost and the kernel's own counters over the
    /// whole pgbench run (bpftool before and after).
    pub bpf: Option<BpfCost>,
    /// Why `bpf` is missing for a kernel contender (bpftool failed, programs not found).
    pub bpf_error: Option<String>,
    /// The epoll generator's own report (counts over every phase, clients left unanswered, its
    /// CPU); `None` with pgbench.
    pub epoll: Option<bypass_lab::epoll_loadgen::EpollLoadReport>,
}

/// CPU use between the first and the last progress line (steady state, connection phase
/// excluded), per transaction completed in that window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CpuWindow {
    /// Wall-clock length of the window between our snapshots.
    pub window_s: f64,
    /// The same window by pgbench's progress timestamps; differs from `window_s` by how far
    /// our reading of the progress lines lagged.
    pub progress_window_s: f64,
    /// Transactions completed in the window (per-transaction log ÷ sampling rate).
    pub transactions: f64,
    /// The same by progress lines (Σ tps × interval), as a cross-check.
    pub progress_transactions: f64,
    pub tps: f64,
    /// Busy share of all cores (1.0 = every core busy the whole window).
    pub system_busy_fraction: f64,
    /// The primary metric: system-wide busy CPU-µs per transaction.
    pub system_us_per_txn: f64,
    /// The pooler's own processes; `None` for direct PostgreSQL.
    pub pooler_us_per_txn: Option<f64>,
    /// The load generator's own CPU: pgbench's process, or the epoll generator's threads.
    pub generator_us_per_txn: f64,
    /// The postmaster and its children (backends, background workers).
    pub postgres_us_per_txn: f64,
}

/// Shared state of all runs: the database, the script files, where bypass lives.
pub struct Bench<'a> {
    pub(super) setup: &'a Setup,
    pub(super) postgres: &'a Postgres,
    pub(super) bypass_exe: &'a Path,
    work_dir: &'a Path,
    scripts: Scripts,
    pub(super) postmaster_pid: Option<u32>,
}

/// The custom pgbench scripts, written once into the work dir.
struct Scripts {
    select1: PathBuf,
    ycsb_read: PathBuf,
    ycsb_update: PathBuf,
}

impl<'a> Bench<'a> {
    /// Writes the scripts and loads the tables `plan` needs, once: pgbench's always, the YCSB
    /// table when a YCSB workload runs, and a `shadow` database with the same tables when a
    /// contender mirrors.
    pub fn new(
        setup: &'a Setup,
        plan: &[RunSpec],
        postgres: &'a Postgres,
        bypass_exe: &'a Path,
        work_dir: &'a Path,
    ) -> Result<Bench<'a>> {
        let scripts = Scripts {
            select1: work_dir.join("select1.sql"),
            ycsb_read: work_dir.join("ycsb-read.sql"),
            ycsb_update: work_dir.join("ycsb-update.sql"),
        };
        std::fs::write(&scripts.select1, "SELECT 1;\n").context("writing the select1 script")?;
        std::fs::write(&scripts.ycsb_read, ycsb_read_script()).context("writing the YCSB read script")?;
        std::fs::write(&scripts.ycsb_update, ycsb_update_script()).context("writing the YCSB update script")?;
        let postmaster_pid = read_postmaster_pid(postgres.data_dir());
        let bench = Bench { setup, postgres, bypass_exe, work_dir, scripts, postmaster_pid };
        let ycsb = plan.iter().any(|spec| spec.workload.ycsb_read_percent().is_some());
        bench.initialise_tables(DATABASE, ycsb)?;
        if plan.iter().any(|spec| spec.contender.mirrors()) {
            psql_in(postgres, DATABASE, &[format!("create database {SHADOW_DATABASE}")])?;
            bench.initialise_tables(SHADOW_DATABASE, ycsb)?;
        }
        Ok(bench)
    }

    fn initialise_tables(&self, database: &str, ycsb: bool) -> Result<()> {
        let name = self.setup.benchmark;
        eprintln!("bench {name}: pgbench -i -s {SCALE} in {database}");
        let mut command = Command::new(pg_bin("pgbench"));
        command.args(["-i", "-q", "-s", &SCALE.to_string()]).args(connection_args(self.postgres.port(), database));
        let output = command.env("LC_ALL", "C").output().context("spawning pgbench -i")?;
        if !output.status.success() {
            bail!("pgbench -i failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
        }
        let mut prewarmed = vec!["pgbench_accounts", "pgbench_accounts_pkey"];
        if ycsb {
            eprintln!("bench {name}: loading usertable ({YCSB_ROWS} rows × ~1 KB) in {database}");
            psql_in(self.postgres, database, &ycsb_load_sql())?;
            prewarmed.extend(["usertable", "usertable_pkey"]);
        }
        // Loading goes through a small ring buffer; read the tables and indexes into
        // shared_buffers so the first run is not the only one paying for cold pages.
        let reads: Vec<String> = prewarmed.iter().map(|relation| format!("pg_prewarm('{relation}')")).collect();
        let prewarm = ["create extension if not exists pg_prewarm".to_string(), format!("select {}", reads.join(", "))];
        if let Err(error) = psql_in(self.postgres, database, &prewarm) {
            eprintln!("bench {name}: warning: prewarm failed ({error:#}); the first runs start cold");
        }
        Ok(())
    }

    /// Runs one spec. Failures become the record's `error`; only an interrupt is an `Err`.
    pub fn measure(&self, spec: &RunSpec) -> Result<RunRecord> {
        let sampling_rate = sampling_rate(spec.clients);
        let measured = match spec.generator {
            Generator::Pgbench => self.try_measure(spec, sampling_rate),
            Generator::Epoll => self.try_measure_epoll(spec),
        };
        // A Ctrl-C also reaches pgbench, whose broken run must not be recorded as a result.
        if interrupt::requested() {
            bail!("interrupted");
        }
        Ok(measured.unwrap_or_else(|error| RunRecord::failed(spec, sampling_rate, format!("{error:#}"))))
    }

    fn try_measure(&self, spec: &RunSpec, sampling_rate: f64) -> Result<RunRecord> {
        self.wait_for_idle_backends();
        let target = contender::start(spec.contender, self.postgres.port(), self.setup.pool_size, self.bypass_exe)?;
        let log_dir =
            tempfile::Builder::new().prefix("run-").tempdir_in(self.work_dir).context("creating a log dir")?;
        let command = self.pgbench_command(spec, &target, &log_dir.path().join(LOG_PREFIX), sampling_rate);
        let probe = Probe { pooler: target.pooler_pids.clone(), pgbench: Vec::new(), postmaster: self.postmaster_pid };
        let bpf_before = spec.contender.is_kernel().then(|| bpf_stats::sample(&target.pooler_pids));
        let outcome = pgbench::run(command, &probe, self.deadline(spec.clients))?;
        let bpf_after = spec.contender.is_kernel().then(|| bpf_stats::sample(&target.pooler_pids));
        drop(target);
        let steady = steady_ticks(&outcome.ticks);
        let window = steady_window(steady);
        let (mut latencies, _not_done) = pgbench_log::read_latencies(log_dir.path(), LOG_PREFIX, window)?;
        let logged_transactions = window.map(|_| latencies.len() as f64 / sampling_rate);
        let cpu = cpu_window(steady, cpu::clock_ticks_per_second(), logged_transactions);
        let latency = pgbench_log::summarize(&mut latencies);
        let mut record = RunRecord::from_outcome(spec, sampling_rate, &outcome, latency, cpu);
        record.attach_bpf(bpf_before.zip(bpf_after), outcome.summary.processed.unwrap_or(0));
        Ok(record)
    }

    fn pgbench_command(&self, spec: &RunSpec, target: &Target, log_prefix: &Path, sampling_rate: f64) -> Command {
        let mut command = Command::new(pg_bin("pgbench"));
        command.args(pgbench_args(spec, self.setup.duration_s, self.setup.threads));
        command.arg("--log-prefix").arg(log_prefix);
        if sampling_rate < 1.0 {
            command.arg(format!("--sampling-rate={sampling_rate}"));
        }
        match spec.workload {
            Workload::Select1 => command.arg("-f").arg(&self.scripts.select1),
            Workload::SelectOnly => command.arg("-S"),
            Workload::SimpleUpdate => command.arg("-N"),
            Workload::YcsbA | Workload::YcsbB | Workload::YcsbC => command.args(self.ycsb_script_args(spec.workload)),
        };
        command.args(connection_args(target.port, DATABASE));
        command.env("LC_ALL", "C").env_remove("PGOPTIONS").env_remove("PGSERVICE");
        pgbench::raise_fd_limit_before_exec(&mut command);
        command
    }

    /// `-f read@R -f update@U`: pgbench picks one script per transaction by weight, so each
    /// transaction is one statement and the mix holds over the run.
    fn ycsb_script_args(&self, workload: Workload) -> Vec<String> {
        let read_percent = workload.ycsb_read_percent().unwrap_or(100);
        let weighted = |path: &Path, weight: u32| format!("{}@{weight}", path.display());
        let mut args = vec!["-f".to_string(), weighted(&self.scripts.ycsb_read, read_percent)];
        if read_percent < 100 {
            args.extend(["-f".to_string(), weighted(&self.scripts.ycsb_update, 100 - read_percent)]);
        }
        args
    }

    pub(super) fn deadline(&self, clients: u32) -> Duration {
        let connect_s = CONNECT_ALLOWANCE_BASE_S + u64::from(clients / CONNECT_ALLOWANCE_CLIENTS_PER_S);
        Duration::from_secs(u64::from(self.setup.duration_s) + connect_s)
    }

    /// Waits until no client backend is left from the previous run (a stopped pooler's servers
    /// exit asynchronously), so direct runs never hit max_connections. Gives up quietly.
    pub(super) fn wait_for_idle_backends(&self) {
        let sql = "select count(*) from pg_stat_activity \
                   where backend_type = 'client backend' and pid <> pg_backend_pid()";
        let deadline = std::time::Instant::now() + IDLE_BACKENDS_TIMEOUT;
        while std::time::Instant::now() < deadline {
            if self.postgres.psql(sql).is_ok_and(|count| count == "0") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let name = self.setup.benchmark;
        eprintln!("bench {name}: warning: client backends still connected after {IDLE_BACKENDS_TIMEOUT:?}");
    }
}

/// bpftool samples before and after a run.
pub(super) type BpfSamples = (Result<bpf_stats::Sample>, Result<bpf_stats::Sample>);

/// The fast path's cost over a run from the samples before and after it; a missing figure is
/// an error for the record, never for the run.
fn bpf_cost(before: Result<bpf_stats::Sample>, after: Result<bpf_stats::Sample>, transactions: u64) -> Result<BpfCost> {
    bpf_stats::cost(&before?, &after?, transactions)
        .context("no fp_client/fp_server program of this pooler, or no transaction completed")
}

/// The arguments common to every measured pgbench run, without the workload and connection.
pub fn pgbench_args(spec: &RunSpec, duration_s: u32, threads: u32) -> Vec<String> {
    let threads = threads.min(spec.clients).max(1);
    let mut args: Vec<String> = vec!["-n".into(), "-M".into(), "simple".into()];
    args.extend(["-c".into(), spec.clients.to_string(), "-j".into(), threads.to_string()]);
    args.extend(["-T".into(), duration_s.to_string(), "-P".into(), "1".into(), "--log".into()]);
    args
}

fn connection_args(port: u16, database: &str) -> Vec<String> {
    ["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", database].map(String::from).to_vec()
}

/// Runs `statements` in `database` as the superuser, each in its own transaction (one `-c`
/// each, so VACUUM and CREATE DATABASE work); the testkit's `psql` knows only `postgres`.
fn psql_in(postgres: &Postgres, database: &str, statements: &[String]) -> Result<()> {
    let mut command = Command::new(pg_bin("psql"));
    command.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres"]).args([
        "-p",
        &postgres.port().to_string(),
        "-d",
        database,
    ]);
    for statement in statements {
        command.arg("-c").arg(statement);
    }
    let output = command.env("LC_ALL", "C").env_remove("PGOPTIONS").output().context("spawning psql")?;
    if !output.status.success() {
        bail!("psql in {database} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// Creates and fills `usertable` with one INSERT … SELECT: ten fields of exactly
/// [`YCSB_FIELD_CHARS`] characters derived from the key, so a row is ~1 KB and stays inline
/// (below the 2 KB TOAST threshold).
pub fn ycsb_load_sql() -> [String; 4] {
    let columns: Vec<String> = (0..10).map(|field| format!("field{field} text")).collect();
    let values: Vec<String> =
        (0..10).map(|field| format!("rpad(md5(key::text || '{field}'), {YCSB_FIELD_CHARS}, md5(key::text))")).collect();
    [
        "drop table if exists usertable".to_string(),
        format!("create table usertable (ycsb_key int primary key, {})", columns.join(", ")),
        format!("insert into usertable select key, {} from generate_series(1, {YCSB_ROWS}) as key", values.join(", ")),
        "vacuum analyze usertable".to_string(),
    ]
}

/// One YCSB read: a whole row by a zipfian key.
pub fn ycsb_read_script() -> String {
    format!("\\set key random_zipfian(1, {YCSB_ROWS}, {YCSB_ZIPF_S})\n{YCSB_READ_SQL}\n")
}

/// One YCSB update: one field of a row by a zipfian key, a fresh 96-character value.
pub fn ycsb_update_script() -> String {
    format!("\\set key random_zipfian(1, {YCSB_ROWS}, {YCSB_ZIPF_S})\n{YCSB_UPDATE_SQL}\n")
}

/// Log every transaction below [`SAMPLED_LOG_CLIENTS_MIN`] clients, a sample above.
pub fn sampling_rate(clients: u32) -> f64 {
    if clients >= SAMPLED_LOG_CLIENTS_MIN {
        SAMPLED_LOG_RATE
    } else {
        1.0
    }
}

fn read_postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// The progress ticks after ramp-up: leading intervals below 80% of the median TPS are
/// skipped (the first second after a 10,000-client connection phase runs at a fraction of the
/// steady rate), keeping at least two ticks when there are two.
pub fn steady_ticks(ticks: &[Tick]) -> &[Tick] {
    let interval_tps: Vec<f64> = ticks.iter().skip(1).map(|tick| tick.progress.tps).collect();
    let Some(median_tps) = median(&interval_tps) else {
        return ticks;
    };
    // Tick i starts the window when the interval ending at tick i + 1 is at full speed.
    let start = (0..ticks.len().saturating_sub(1))
        .find(|&index| ticks[index + 1].progress.tps >= median_tps * RAMP_UP_TPS_FRACTION)
        .unwrap_or(0);
    &ticks[start.min(ticks.len().saturating_sub(2))..]
}

/// Wall-clock bounds (Unix µs) of the first and last progress lines, when there are two.
fn steady_window(ticks: &[Tick]) -> Option<(u64, u64)> {
    match ticks {
        [first, .., last] => Some((first.snapshot.wall_us, last.snapshot.wall_us)),
        _ => None,
    }
}

/// CPU per transaction between the first and last progress lines.
///
/// The window is timed by our own snapshots, and `logged_transactions` (transactions that
/// completed inside it by the per-transaction log, scaled by the sampling rate) is preferred as
/// the divisor because it refers to exactly that wall-clock window. Without it, the sum of each
/// later progress line's tps × interval is used (pgbench's clock, off by our reading lag).
pub fn cpu_window(ticks: &[Tick], clock_ticks_per_s: u64, logged_transactions: Option<f64>) -> Option<CpuWindow> {
    let (first, last) = (ticks.first()?, ticks.last()?);
    let progress_transactions: f64 = ticks
        .windows(2)
        .map(|pair| pair[1].progress.tps * (pair[1].progress.elapsed_s - pair[0].progress.elapsed_s))
        .sum();
    let transactions = logged_transactions.filter(|&n| n > 0.0).unwrap_or(progress_transactions);
    let window = cpu_between(&first.snapshot, &last.snapshot, clock_ticks_per_s, transactions)?;
    Some(CpuWindow {
        progress_window_s: last.progress.elapsed_s - first.progress.elapsed_s,
        progress_transactions,
        ..window
    })
}

/// CPU per transaction between two snapshots, `transactions` completed in between; the
/// generator's share is pgbench's processes (the epoll path overrides it with its threads').
pub fn cpu_between(start: &Snapshot, end: &Snapshot, clock_ticks_per_s: u64, transactions: f64) -> Option<CpuWindow> {
    let window_s = end.wall_us.saturating_sub(start.wall_us) as f64 / 1e6;
    if transactions <= 0.0 || window_s <= 0.0 {
        return None;
    }
    let per_txn = |ticks: u64| ticks as f64 * 1e6 / clock_ticks_per_s as f64 / transactions;
    let busy = end.system.busy.saturating_sub(start.system.busy);
    let idle = end.system.idle.saturating_sub(start.system.idle);
    Some(CpuWindow {
        window_s,
        progress_window_s: window_s,
        transactions,
        progress_transactions: transactions,
        tps: transactions / window_s,
        system_busy_fraction: if busy + idle == 0 { 0.0 } else { busy as f64 / (busy + idle) as f64 },
        system_us_per_txn: per_txn(busy),
        pooler_us_per_txn: (!start.pooler.is_empty()).then(|| per_txn(cpu::group_delta(&start.pooler, &end.pooler))),
        generator_us_per_txn: per_txn(cpu::group_delta(&start.pgbench, &end.pgbench)),
        postgres_us_per_txn: per_txn(cpu::group_delta(&start.postgres, &end.postgres)),
    })
}

impl RunRecord {
    pub(super) fn failed(spec: &RunSpec, sampling_rate: f64, error: String) -> RunRecord {
        RunRecord {
            workload: spec.workload,
            clients: spec.clients,
            contender: spec.contender,
            repetition: spec.repetition,
            generator: spec.generator,
            error: Some(error),
            tps: None,
            transactions: None,
            failed_transactions: None,
            initial_connection_ms: None,
            latency: None,
            latency_sampling_rate: sampling_rate,
            little_ratio: None,
            cpu: None,
            progress_tps: Vec::new(),
            pgbench_exit_code: None,
            wall_s: 0.0,
            bpf: None,
            bpf_error: None,
            epoll: None,
        }
    }

    /// The fast path's cost over the run from bpftool samples before and after it, when the
    /// contender is the kernel one; a missing figure is noted, never fatal.
    pub(super) fn attach_bpf(&mut self, samples: Option<BpfSamples>, transactions: u64) {
        let Some((before, after)) = samples else { return };
        match bpf_cost(before, after, transactions) {
            Ok(cost) => self.bpf = Some(cost),
            Err(error) => self.bpf_error = Some(format!("{error:#}")),
        }
    }

    fn from_outcome(
        spec: &RunSpec,
        sampling_rate: f64,
        outcome: &Outcome,
        latency: Option<LatencySummary>,
        cpu: Option<CpuWindow>,
    ) -> RunRecord {
        let summary = &outcome.summary;
        // Little's law on the same window as the latencies when there is one.
        let tps_for_little = cpu.as_ref().map(|cpu| cpu.tps).or(summary.tps);
        let little_ratio = match (tps_for_little, &latency) {
            (Some(tps), Some(latency)) => Some(tps * latency.mean_ms / 1000.0 / f64::from(spec.clients)),
            _ => None,
        };
        RunRecord {
            error: run_error(outcome),
            tps: summary.tps,
            transactions: summary.processed,
            failed_transactions: summary.failed,
            initial_connection_ms: summary.initial_connection_ms,
            latency,
            little_ratio,
            cpu,
            progress_tps: outcome.ticks.iter().map(|tick| tick.progress.tps).collect(),
            pgbench_exit_code: outcome.status.code(),
            wall_s: outcome.wall.as_secs_f64(),
            ..RunRecord::failed(spec, sampling_rate, String::new())
        }
    }
}

/// Why a finished pgbench run does not count as clean, if it does not.
fn run_error(outcome: &Outcome) -> Option<String> {
    let tail = pgbench::stderr_tail(&outcome.stderr, STDERR_LINES_IN_ERROR);
    if !outcome.status.success() {
        return Some(format!("pgbench exited with {}: {tail}", outcome.status));
    }
    if outcome.summary.tps.is_none() {
        return Some(format!("pgbench printed no tps: {tail}"));
    }
    match outcome.summary.failed {
        Some(failed) if failed > 0 => Some(format!("{failed} failed transactions: {tail}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{Snapshot, SystemTicks};
    use crate::pgbench::Progress;
    use std::collections::BTreeMap;

    fn tick(elapsed_s: f64, tps: f64, busy: u64, idle: u64, pooler: Option<u64>) -> Tick {
        let snapshot = Snapshot {
            wall_us: (elapsed_s * 1e6) as u64,
            system: SystemTicks { busy, idle },
            pooler: pooler.map(|ticks| BTreeMap::from([(7, ticks)])).unwrap_or_default(),
            pgbench: BTreeMap::from([(8, busy / 4)]),
            postgres: BTreeMap::new(),
        };
        Tick { progress: Progress { elapsed_s, tps, latency_ms: 1.0, failed: 0 }, snapshot }
    }

    // Goal: CPU per transaction uses only the window after the first progress line;
    // method: three ticks 1 s apart at 10k tps with 200 busy ticks (2 s of CPU) in between.
    #[test]
    fn cpu_window_counts_transactions_after_first_line() {
        let ticks = [
            tick(1.0, 999_999.0, 1000, 0, Some(10)),
            tick(2.0, 10_000.0, 1100, 100, Some(40)),
            tick(3.0, 10_000.0, 1200, 200, Some(70)),
        ];
        let window = cpu_window(&ticks, 100, None).expect("window");
        assert_eq!(window.transactions, 20_000.0);
        assert_eq!(window.progress_transactions, 20_000.0);
        assert_eq!(window.window_s, 2.0);
        assert_eq!(window.tps, 10_000.0);
        assert_eq!(window.system_busy_fraction, 0.5);
        // 200 ticks = 2 s = 2e6 µs over 20k transactions.
        assert_eq!(window.system_us_per_txn, 100.0);
        assert_eq!(window.pooler_us_per_txn, Some(30.0));
        assert_eq!(window.generator_us_per_txn, 25.0);
        assert!(cpu_window(&ticks[..1], 100, None).is_none());
        // The log's count, when there is one, is the divisor.
        let logged = cpu_window(&ticks, 100, Some(40_000.0)).expect("window");
        assert_eq!((logged.system_us_per_txn, logged.tps), (50.0, 20_000.0));
        let direct = [tick(1.0, 1.0, 0, 0, None), tick(2.0, 1.0, 1, 1, None)];
        assert_eq!(cpu_window(&direct, 100, None).expect("window").pooler_us_per_txn, None);
    }

    // Goal: ramp-up intervals are skipped but a flat run is kept whole; method: tick lists.
    #[test]
    fn steady_ticks_skip_ramp_up() {
        let tps = |values: &[f64]| -> Vec<Tick> {
            values.iter().enumerate().map(|(i, &tps)| tick(i as f64 + 1.0, tps, 0, 0, None)).collect()
        };
        let ramp = tps(&[0.0, 0.0, 15_000.0, 27_000.0, 29_000.0, 28_000.0]);
        // Intervals: 0, 15k, 27k, 29k, 28k → median 27k; the 15k interval ends at tick 2.
        assert_eq!(steady_ticks(&ramp)[0].progress.elapsed_s, 3.0);
        let flat = tps(&[30_000.0, 29_000.0, 31_000.0]);
        assert_eq!(steady_ticks(&flat).len(), 3);
        let dead = tps(&[0.0, 0.0, 0.0]);
        assert_eq!(steady_ticks(&dead).len(), 3);
        assert_eq!(steady_ticks(&ramp[..1]).len(), 1);
    }

    // Goal: pgbench gets the protocol's flags, threads capped by clients; method: render args.
    #[test]
    fn pgbench_args_follow_protocol() {
        let spec = RunSpec {
            workload: Workload::Select1,
            clients: 1,
            contender: Contender::Bypass,
            repetition: 0,
            generator: Generator::Pgbench,
        };
        let args = pgbench_args(&spec, 30, 2).join(" ");
        assert_eq!(args, "-n -M simple -c 1 -j 1 -T 30 -P 1 --log");
        assert_eq!(sampling_rate(10_000), 0.1);
        assert_eq!(sampling_rate(1_000), 1.0);
    }

    // Goal: the YCSB scripts use pgbench 15's zipfian over every key, one statement each, and
    // the load gives 100k rows of ten 100-character fields; method: inspect the generated text.
    #[test]
    fn ycsb_scripts_and_load() {
        let read = ycsb_read_script();
        assert!(read.starts_with("\\set key random_zipfian(1, 100000, 1.001)\n"), "{read}");
        assert_eq!(read.matches(';').count(), 1, "{read}");
        let update = ycsb_update_script();
        assert!(update.contains("UPDATE usertable SET field0 = "), "{update}");
        assert_eq!(update.matches(';').count(), 1, "{update}");
        let load = ycsb_load_sql().join("; ");
        assert!(load.contains("create table usertable (ycsb_key int primary key, field0 text,"), "{load}");
        assert!(load.contains("field9 text)"), "{load}");
        assert_eq!(load.matches("rpad(md5(key::text").count(), 10, "{load}");
        assert!(load.contains("generate_series(1, 100000)"), "{load}");
    }
}
