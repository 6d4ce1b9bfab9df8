//! One run with the epoll load generator (`bypass_lab::epoll_loadgen`) instead of pgbench: the
//! same contender start, the same CPU accounting from `/proc` (snapshots at the edges of the
//! generator's measured window instead of at pgbench's progress lines), and the generator's own
//! CPU from its threads' clocks.
//!
//! ```text
//!   contender::start ─► bpftool before ─► epoll_loadgen::run ─┬─ Edge::Start ─► Probe::snapshot
//!                                                             └─ Edge::End ───► Probe::snapshot
//!   bpftool after ─► stop the contender ─► RunRecord (window TPS, latencies, CPU, BPF)
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bypass_lab::epoll_loadgen::{self, Edge, EpollLoadReport, EpollLoadSpec, Observer, Script, Statement, Zipfian};
use bypass_wire::login::LoginRequest;

use super::contender::{self, DATABASE};
use super::measure::{
    cpu_between, Bench, CpuWindow, RunRecord, RunSpec, YCSB_READ_SQL, YCSB_ROWS, YCSB_UPDATE_SQL, YCSB_ZIPF_S,
};
use super::{Setup, Workload};
use crate::bpf_stats;
use crate::cpu::{self, Probe, Snapshot};
use crate::interrupt;
use crate::pgbench_log::LatencySummary;

/// Time between every client being logged in and the measured window; the window is the rest
/// of `--duration-s` (pgbench's -T also includes its ramp-up).
pub const WARMUP: Duration = Duration::from_secs(1);

/// How long clients may take to finish their last transaction after the window.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The seed of the key and statement draws: every run draws the same sequence.
const SEED: u64 = 24;

/// Takes a CPU snapshot at each edge of the measured window; stops the run on Ctrl-C.
struct WindowSnapshots<'a> {
    probe: &'a Probe,
    start: Option<Snapshot>,
    end: Option<Snapshot>,
}

impl Observer for WindowSnapshots<'_> {
    fn edge(&mut self, edge: Edge) {
        let snapshot = self.probe.snapshot().ok();
        match edge {
            Edge::Start => self.start = snapshot,
            Edge::End => self.end = snapshot,
        }
    }

    fn interrupted(&self) -> bool {
        interrupt::requested()
    }
}

impl Bench<'_> {
    /// Runs one spec with the epoll generator; failures become the record's error.
    pub(super) fn try_measure_epoll(&self, spec: &RunSpec) -> Result<RunRecord> {
        let script = script(spec.workload).context("the epoll generator runs select1 and ycsb-* only")?;
        self.wait_for_idle_backends();
        let target = contender::start(spec.contender, self.postgres.port(), self.setup.pool_size, self.bypass_exe)?;
        let probe = Probe { pooler: target.pooler_pids.clone(), pgbench: Vec::new(), postmaster: self.postmaster_pid };
        let mut snapshots = WindowSnapshots { probe: &probe, start: None, end: None };
        let load = load_spec(spec, self.setup, target.port, script, self.deadline(spec.clients));
        let kernel = spec.contender.is_kernel();
        let bpf_before = kernel.then(|| bpf_stats::sample(&target.pooler_pids));
        let started = Instant::now();
        let report = epoll_loadgen::run(&load, &mut snapshots);
        let bpf_after = kernel.then(|| bpf_stats::sample(&target.pooler_pids));
        drop(target);
        let report = report.context("epoll load generator")?;
        let cpu = match (&snapshots.start, &snapshots.end) {
            (Some(start), Some(end)) => cpu_window(start, end, &report),
            _ => None,
        };
        let mut record = record(spec, &report, cpu, started.elapsed());
        record.attach_bpf(bpf_before.zip(bpf_after), report.total_transactions);
        Ok(record)
    }
}

/// The workload as the epoll generator sends it: pgbench's statements, keys and weights.
pub fn script(workload: Workload) -> Option<Script> {
    if workload == Workload::Select1 {
        return Some(Script::fixed("SELECT 1;"));
    }
    let read_percent = workload.ycsb_read_percent()?;
    let mut statements = vec![Statement { weight: read_percent, sql: YCSB_READ_SQL.to_string() }];
    if read_percent < 100 {
        statements.push(Statement { weight: 100 - read_percent, sql: YCSB_UPDATE_SQL.to_string() });
    }
    Some(Script { statements, keys: Some(Zipfian { keys: YCSB_ROWS, exponent: YCSB_ZIPF_S }) })
}

/// The measured window of a run of `duration_s` (`--duration-s`): what the warm-up leaves, at
/// least 1 s.
pub fn window(duration_s: u32) -> Duration {
    Duration::from_secs(u64::from(duration_s)).saturating_sub(WARMUP).max(Duration::from_secs(1))
}

fn load_spec(spec: &RunSpec, setup: &Setup, port: u16, script: Script, connect_timeout: Duration) -> EpollLoadSpec {
    EpollLoadSpec {
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        clients: spec.clients as usize,
        threads: setup.threads as usize,
        login: LoginRequest::trust("postgres", DATABASE),
        script,
        warmup: WARMUP,
        duration: window(setup.duration_s),
        connect_timeout,
        drain_timeout: DRAIN_TIMEOUT,
        seed: SEED,
    }
}

/// CPU per transaction over the generator's window, with the generator's own CPU from its
/// threads' clocks.
fn cpu_window(start: &Snapshot, end: &Snapshot, report: &EpollLoadReport) -> Option<CpuWindow> {
    let window = cpu_between(start, end, cpu::clock_ticks_per_second(), report.transactions as f64)?;
    Some(CpuWindow {
        progress_window_s: report.window_s,
        generator_us_per_txn: report.generator_cpu_us_per_txn,
        ..window
    })
}

fn record(spec: &RunSpec, report: &EpollLoadReport, cpu: Option<CpuWindow>, wall: Duration) -> RunRecord {
    let latency = (report.transactions > 0).then(|| LatencySummary {
        samples: report.transactions,
        mean_ms: report.latency_mean_us / 1000.0,
        p50_ms: report.latency_p50_us / 1000.0,
        p95_ms: report.latency_p95_us / 1000.0,
        p99_ms: report.latency_p99_us / 1000.0,
        p999_ms: report.latency_p999_us / 1000.0,
        max_ms: report.latency_max_us / 1000.0,
    });
    let little_ratio = latency.as_ref().map(|latency| report.tps * latency.mean_ms / 1000.0 / f64::from(spec.clients));
    RunRecord {
        error: run_error(report),
        tps: Some(report.tps),
        transactions: Some(report.total_transactions),
        failed_transactions: Some(report.total_failed_transactions),
        initial_connection_ms: Some(report.connect_s * 1000.0),
        latency,
        little_ratio,
        cpu,
        wall_s: wall.as_secs_f64(),
        epoll: Some(report.clone()),
        ..RunRecord::failed(spec, 1.0, String::new())
    }
}

/// Why a finished generator run does not count as clean, if it does not.
fn run_error(report: &EpollLoadReport) -> Option<String> {
    let samples = report.error_samples.iter().take(3).cloned().collect::<Vec<_>>().join(" | ");
    if report.connected < report.clients {
        return Some(format!("{} of {} clients logged in: {samples}", report.connected, report.clients));
    }
    if report.errors > 0 || report.total_failed_transactions > 0 {
        let failed = report.total_failed_transactions;
        return Some(format!("{} clients lost, {failed} failed transactions: {samples}", report.errors));
    }
    if report.unfinished > 0 {
        let waited = DRAIN_TIMEOUT.as_secs();
        return Some(format!("{} clients still unanswered {waited} s after the window", report.unfinished));
    }
    (report.transactions == 0).then(|| "no transaction completed in the window".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the epoll generator sends pgbench's statements with the same weights and keys;
    // method: the scripts of select1 and the three YCSB mixes.
    #[test]
    fn scripts_match_pgbench_workloads() {
        assert_eq!(script(Workload::Select1), Some(Script::fixed("SELECT 1;")));
        let mix = script(Workload::YcsbB).expect("ycsb-b runs");
        let weights: Vec<u32> = mix.statements.iter().map(|statement| statement.weight).collect();
        assert_eq!(weights, vec![95, 5]);
        assert!(mix.statements[0].sql.starts_with("SELECT * FROM usertable WHERE ycsb_key = :key"));
        assert_eq!(mix.keys, Some(Zipfian { keys: 100_000, exponent: 1.001 }));
        assert_eq!(script(Workload::YcsbC).expect("ycsb-c runs").statements.len(), 1);
        assert!(script(Workload::SelectOnly).is_none() && script(Workload::SimpleUpdate).is_none());
    }

    // Goal: a run with lost clients or failed transactions is an error, a clean one is not;
    // method: reports with each problem.
    #[test]
    fn unclean_runs_are_errors() {
        let clean = EpollLoadReport { clients: 10, connected: 10, transactions: 5, ..EpollLoadReport::default() };
        assert_eq!(run_error(&clean), None);
        let lost = EpollLoadReport { connected: 9, ..clean.clone() };
        assert!(run_error(&lost).expect("error").starts_with("9 of 10 clients"));
        let failed = EpollLoadReport { total_failed_transactions: 2, ..clean.clone() };
        assert!(run_error(&failed).expect("error").contains("2 failed transactions"));
        let stalled = EpollLoadReport { unfinished: 3, ..clean.clone() };
        assert!(run_error(&stalled).expect("error").starts_with("3 clients still unanswered"));
        let idle = EpollLoadReport { transactions: 0, ..clean };
        assert!(run_error(&idle).is_some());
    }
}
