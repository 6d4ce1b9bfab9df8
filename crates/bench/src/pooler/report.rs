//! The results document: provenance, every run, per-cell medians and Bypass-vs-peer ratios,
//! written as `<benchmark>.json`, `<benchmark>.md` and `<benchmark>.png`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use bypass_testkit::{pg_bin, Postgres};
use serde::Serialize;

use super::contender::MAX_CLIENT_CONN;
use super::measure::{sampling_rate, RunRecord, SAMPLED_LOG_CLIENTS_MIN, YCSB_ROWS, YCSB_ZIPF_S};
use super::{markdown, plot, Contender, Generator, Setup, Workload, SCALE};
use crate::report::machine::{self, Machine};
use crate::stats::median;

/// Where the testkit finds PgBouncer (Debian's package), asked for its version.
const PGBOUNCER_BIN: &str = "/usr/sbin/pgbouncer";

/// Versions of everything under test.
#[derive(Debug, Clone, Serialize)]
pub struct Versions {
    pub postgres: String,
    pub pgbench: String,
    pub pgbouncer: String,
    pub bypass: String,
    /// `git rev-parse --short HEAD` of the working directory, `-dirty` when modified.
    pub git_revision: Option<String>,
}

/// The knobs every contender shared.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub duration_s: u32,
    pub repetitions: u32,
    pub pool_mode: &'static str,
    pub pool_size: u32,
    pub auth_type: &'static str,
    pub max_client_conn: u32,
    pub pgbench_threads: u32,
    pub pgbench_scale: u32,
    /// Direct PostgreSQL runs only up to this many clients (max_connections less headroom).
    pub direct_clients_max: u32,
    /// e.g. `-n -M simple -c C -j 2 -T 30 -P 1 --log` (+ `--sampling-rate 0.1` at ≥ 5,000 clients).
    pub pgbench_flags: String,
    /// The YCSB-like table and key distribution (used only by the ycsb-* workloads).
    pub ycsb: String,
    pub postgres_conf: Vec<String>,
    pub cpu_window: &'static str,
}

/// Medians over the repetitions of one (workload, clients, contender).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CellSummary {
    pub workload: Workload,
    pub clients: u32,
    pub contender: Contender,
    pub runs: u32,
    /// Errors of the runs that had one.
    pub errors: Vec<String>,
    pub tps: Option<f64>,
    pub latency_mean_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub cpu_us_per_txn: Option<f64>,
    pub pooler_cpu_us_per_txn: Option<f64>,
    /// The load generator's own CPU (pgbench's process or the epoll generator's threads).
    pub generator_cpu_us_per_txn: Option<f64>,
    pub little_ratio: Option<f64>,
    pub initial_connection_ms: Option<f64>,
    /// Summed over the repetitions; must be 0.
    pub failed_transactions: u64,
    /// Kernel fast path only: ns per run of each verdict program (`fp_client`, `fp_server`).
    pub bpf_ns_per_run: BTreeMap<String, f64>,
    /// Kernel fast path only: BPF run time of both programs per transaction, and verdicts per
    /// transaction.
    pub bpf_ns_per_txn: Option<f64>,
    pub bpf_verdicts_per_txn: Option<f64>,
    /// Kernel fast path only: the `fp_counters` differences over a run (median per field).
    pub kernel_counters: BTreeMap<String, f64>,
    /// Kernel fast path only: transactions released in the kernel ÷ transactions completed, and
    /// passes to user space per transaction.
    pub kernel_transaction_share: Option<f64>,
    pub passes_per_txn: Option<f64>,
    /// Kernel fast path only: request (client→server) and answer (server→client) bytes the kernel
    /// forwarded ÷ all such bytes the fast path saw (the rest went through user space).
    pub request_bytes_in_kernel: Option<f64>,
    pub answer_bytes_in_kernel: Option<f64>,
    /// System-wide busy CPU-µs per transaction minus the load generator's own: what the pooler,
    /// PostgreSQL and the kernel work for them cost.
    pub non_generator_cpu_us_per_txn: Option<f64>,
}

/// A subject divided by a peer; > 1 is better for TPS, < 1 is better for latency and CPU.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Ratios {
    pub tps: Option<f64>,
    pub mean: Option<f64>,
    pub p99: Option<f64>,
    pub cpu_us_per_txn: Option<f64>,
}

/// `subject ÷ peer` in one (workload, clients) cell.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CellRatios {
    pub workload: Workload,
    pub clients: u32,
    pub subject: Contender,
    pub peer: Contender,
    pub ratios: Ratios,
}

/// What a benchmark's tables show: rows, columns and ratio columns.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub workloads: Vec<Workload>,
    pub clients: Vec<u32>,
    pub contenders: Vec<Contender>,
    /// (subject, peer) pairs whose ratios are computed and shown, in column order.
    pub ratio_pairs: Vec<(Contender, Contender)>,
}

/// Everything `<benchmark>.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub benchmark: &'static str,
    /// What drove the clients of every run in this document.
    pub generator: Generator,
    pub command: String,
    pub date: String,
    /// The machine, with the load average when the benchmark started and after the last run.
    pub machine: Machine,
    pub versions: Versions,
    pub settings: Settings,
    pub workloads: Vec<Workload>,
    pub clients: Vec<u32>,
    pub contenders: Vec<Contender>,
    pub ratio_pairs: Vec<(Contender, Contender)>,
    pub runs: Vec<RunRecord>,
    pub cells: Vec<CellSummary>,
    pub ratios: Vec<CellRatios>,
}

impl Results {
    /// Provenance and settings; runs are added with [`Results::push`].
    pub fn new(
        setup: &Setup,
        matrix: Matrix,
        postgres: &Postgres,
        bypass_exe: &Path,
        load_average_start: String,
    ) -> Result<Results> {
        let versions = Versions {
            postgres: postgres.psql("select version()").context("asking PostgreSQL its version")?,
            pgbench: machine::version_of(&pg_bin("pgbench")),
            pgbouncer: machine::version_of(Path::new(PGBOUNCER_BIN)),
            bypass: machine::version_of(bypass_exe),
            git_revision: machine::git_revision(),
        };
        let flags = format!(
            "-n -M simple -c CLIENTS -j {} -T {} -P 1 --log (--sampling-rate {} at ≥ {} clients); \
             select1: -f select1.sql (SELECT 1;), select-only: -S, simple-update: -N, \
             ycsb-*: -f ycsb-read.sql@R -f ycsb-update.sql@U",
            setup.threads,
            setup.duration_s,
            sampling_rate(u32::MAX),
            SAMPLED_LOG_CLIENTS_MIN
        );
        Ok(Results {
            benchmark: setup.benchmark,
            generator: Generator::Pgbench,
            command: machine::command_line(),
            date: machine::iso8601_utc(crate::cpu::unix_micros() / 1_000_000),
            machine: Machine {
                load_average_after: load_average_start.clone(),
                load_average_before: load_average_start,
                ..Machine::now()
            },
            versions,
            settings: Settings {
                duration_s: setup.duration_s,
                repetitions: setup.repetitions,
                pool_mode: "transaction",
                pool_size: setup.pool_size,
                auth_type: "trust",
                max_client_conn: MAX_CLIENT_CONN,
                pgbench_threads: setup.threads,
                pgbench_scale: SCALE,
                direct_clients_max: setup.direct_clients_max,
                pgbench_flags: flags,
                ycsb: ycsb_description(),
                postgres_conf: setup.postgres_conf(),
                cpu_window: "steady state between pgbench's -P 1 progress lines: from the first line after ramp-up \
                             (leading seconds below 80% of the median TPS skipped) to the last one; the connection \
                             phase is excluded",
            },
            workloads: matrix.workloads,
            clients: matrix.clients,
            contenders: matrix.contenders,
            ratio_pairs: matrix.ratio_pairs,
            runs: Vec::new(),
            cells: Vec::new(),
            ratios: Vec::new(),
        })
    }

    /// Adds a run and recomputes the medians and ratios.
    pub fn push(&mut self, record: RunRecord) {
        self.runs.push(record);
        self.cells = summarize(&self.runs);
        self.ratios = ratios(&self.cells, &self.ratio_pairs);
        self.machine.finish();
    }

    /// Writes the JSON, the markdown and (when a font is available) the PNG into `out`.
    pub fn write(&self, out: &Path) -> Result<()> {
        crate::report::write(out, self.benchmark, self, &markdown::render(self), |png| self.draw(png))
    }

    /// Draws the TPS and p99 figure into `png`.
    pub fn draw(&self, png: &Path) -> Result<()> {
        plot::render(self, png)
    }

    pub fn direct_clients_max(&self) -> u32 {
        self.settings.direct_clients_max
    }

    /// The ratios of `subject ÷ peer` in one cell, if both ran.
    pub fn ratio(&self, workload: Workload, clients: u32, subject: Contender, peer: Contender) -> Option<&Ratios> {
        self.ratios
            .iter()
            .find(|r| (r.workload, r.clients, r.subject, r.peer) == (workload, clients, subject, peer))
            .map(|r| &r.ratios)
    }

    /// The summary of one cell and contender, if it ran.
    pub fn cell(&self, workload: Workload, clients: u32, contender: Contender) -> Option<&CellSummary> {
        self.cells.iter().find(|cell| (cell.workload, cell.clients, cell.contender) == (workload, clients, contender))
    }
}

/// The YCSB-like table and key distribution, for the settings and the report.
pub fn ycsb_description() -> String {
    format!(
        "usertable(ycsb_key int primary key, field0..field9 text): {YCSB_ROWS} rows × 10 fields of 100 \
         characters (~1 KB); one statement per transaction: SELECT * by key or UPDATE field0 by key; keys \
         random_zipfian(1, {YCSB_ROWS}, {YCSB_ZIPF_S}) — YCSB's 0.99 is below pgbench 15's minimum s = 1.001"
    )
}

/// Medians per (workload, clients, contender), in first-seen order.
pub fn summarize(runs: &[RunRecord]) -> Vec<CellSummary> {
    let mut keys: Vec<(Workload, u32, Contender)> = Vec::new();
    for run in runs {
        let key = (run.workload, run.clients, run.contender);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(workload, clients, contender)| {
            let group: Vec<&RunRecord> = runs
                .iter()
                .filter(|run| (run.workload, run.clients, run.contender) == (workload, clients, contender))
                .collect();
            summarize_group(workload, clients, contender, &group)
        })
        .collect()
}

/// Medians over the runs without an error: an aborted pgbench still prints partial numbers,
/// which must not pass for a result. The raw runs stay in the JSON.
fn summarize_group(workload: Workload, clients: u32, contender: Contender, runs: &[&RunRecord]) -> CellSummary {
    let median_of = |value: &dyn Fn(&RunRecord) -> Option<f64>| {
        median(&runs.iter().filter(|run| run.error.is_none()).filter_map(|run| value(run)).collect::<Vec<f64>>())
    };
    CellSummary {
        workload,
        clients,
        contender,
        runs: runs.len() as u32,
        errors: runs.iter().filter_map(|run| run.error.clone()).collect(),
        tps: median_of(&|run| run.tps),
        latency_mean_ms: median_of(&|run| run.latency.as_ref().map(|l| l.mean_ms)),
        p50_ms: median_of(&|run| run.latency.as_ref().map(|l| l.p50_ms)),
        p99_ms: median_of(&|run| run.latency.as_ref().map(|l| l.p99_ms)),
        p999_ms: median_of(&|run| run.latency.as_ref().map(|l| l.p999_ms)),
        cpu_us_per_txn: median_of(&|run| run.cpu.as_ref().map(|c| c.system_us_per_txn)),
        pooler_cpu_us_per_txn: median_of(&|run| run.cpu.as_ref().and_then(|c| c.pooler_us_per_txn)),
        generator_cpu_us_per_txn: median_of(&|run| run.cpu.as_ref().map(|c| c.generator_us_per_txn)),
        little_ratio: median_of(&|run| run.little_ratio),
        initial_connection_ms: median_of(&|run| run.initial_connection_ms),
        failed_transactions: runs.iter().filter_map(|run| run.failed_transactions).sum(),
        bpf_ns_per_run: bpf_medians(runs, |run, out| {
            for program in run.bpf.iter().flat_map(|bpf| &bpf.programs) {
                if let Some(ns) = program.ns_per_run {
                    out.push((program.name.clone(), ns));
                }
            }
        }),
        bpf_ns_per_txn: median_of(&|run| run.bpf.as_ref().map(|bpf| bpf.ns_per_txn)),
        bpf_verdicts_per_txn: median_of(&|run| run.bpf.as_ref().map(|bpf| bpf.verdicts_per_txn)),
        kernel_transaction_share: median_of(&|run| run.bpf.as_ref().and_then(|bpf| bpf.kernel_transaction_share)),
        passes_per_txn: median_of(&|run| run.bpf.as_ref().and_then(|bpf| bpf.passes_per_txn)),
        request_bytes_in_kernel: median_of(&|run| run.bpf.as_ref().and_then(|bpf| bpf.request_bytes_in_kernel)),
        answer_bytes_in_kernel: median_of(&|run| run.bpf.as_ref().and_then(|bpf| bpf.answer_bytes_in_kernel)),
        non_generator_cpu_us_per_txn: median_of(&|run| {
            run.cpu.as_ref().map(|cpu| cpu.system_us_per_txn - cpu.generator_us_per_txn)
        }),
        kernel_counters: bpf_medians(runs, |run, out| {
            for (field, &value) in run.bpf.iter().flat_map(|bpf| &bpf.kernel_counters) {
                out.push((field.clone(), value as f64));
            }
        }),
    }
}

/// Medians by name of the (name, value) pairs `collect` finds in each clean run.
fn bpf_medians(runs: &[&RunRecord], collect: impl Fn(&RunRecord, &mut Vec<(String, f64)>)) -> BTreeMap<String, f64> {
    let mut pairs = Vec::new();
    for run in runs.iter().filter(|run| run.error.is_none()) {
        collect(run, &mut pairs);
    }
    let mut by_name: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (name, value) in pairs {
        by_name.entry(name).or_default().push(value);
    }
    by_name.into_iter().filter_map(|(name, values)| Some((name, median(&values)?))).collect()
}

/// `subject ÷ peer` for every pair and every (workload, clients) cell where both ran.
pub fn ratios(cells: &[CellSummary], pairs: &[(Contender, Contender)]) -> Vec<CellRatios> {
    let mut out: Vec<CellRatios> = Vec::new();
    for subject_cell in cells {
        for &(subject, peer) in pairs.iter().filter(|(subject, _)| *subject == subject_cell.contender) {
            let key = (subject_cell.workload, subject_cell.clients, peer);
            let Some(peer_cell) = cells.iter().find(|cell| (cell.workload, cell.clients, cell.contender) == key) else {
                continue;
            };
            out.push(CellRatios {
                workload: subject_cell.workload,
                clients: subject_cell.clients,
                subject,
                peer,
                ratios: Ratios {
                    tps: divide(subject_cell.tps, peer_cell.tps),
                    mean: divide(subject_cell.latency_mean_ms, peer_cell.latency_mean_ms),
                    p99: divide(subject_cell.p99_ms, peer_cell.p99_ms),
                    cpu_us_per_txn: divide(subject_cell.cpu_us_per_txn, peer_cell.cpu_us_per_txn),
                },
            });
        }
    }
    out
}

pub fn divide(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() => Some(n / d),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pgbench_log::LatencySummary;
    use crate::pooler::measure::CpuWindow;
    use crate::report::machine::Machine;

    /// A successful run with the given headline numbers, for report tests.
    pub(crate) fn run(workload: Workload, clients: u32, contender: Contender, tps: f64, p99: f64) -> RunRecord {
        let latency = LatencySummary {
            samples: 1000,
            mean_ms: p99 / 2.0,
            p50_ms: p99 / 3.0,
            p95_ms: p99 / 1.5,
            p99_ms: p99,
            p999_ms: p99 * 1.2,
            max_ms: p99 * 2.0,
        };
        let cpu = CpuWindow {
            window_s: 29.0,
            progress_window_s: 29.0,
            transactions: tps * 29.0,
            progress_transactions: tps * 29.0,
            tps,
            system_busy_fraction: 1.0,
            system_us_per_txn: 2e6 / tps,
            pooler_us_per_txn: (contender != Contender::Direct).then_some(1e6 / tps),
            generator_us_per_txn: 0.5e6 / tps,
            postgres_us_per_txn: 0.5e6 / tps,
        };
        RunRecord {
            workload,
            clients,
            contender,
            repetition: 0,
            generator: Generator::Pgbench,
            error: None,
            tps: Some(tps),
            transactions: Some((tps * 30.0) as u64),
            failed_transactions: Some(0),
            initial_connection_ms: Some(10.0),
            latency: Some(latency),
            latency_sampling_rate: 1.0,
            little_ratio: Some(1.0),
            cpu: Some(cpu),
            progress_tps: vec![tps; 3],
            pgbench_exit_code: Some(0),
            wall_s: 31.0,
            bpf: None,
            bpf_error: None,
            epoll: None,
        }
    }

    /// Results as a run with these records would have them, with fixed provenance.
    pub(crate) fn sample_results(runs: Vec<RunRecord>) -> Results {
        let mut results = Results {
            benchmark: "pooler",
            generator: Generator::Pgbench,
            command: "bypass bench pooler --clients 50,1000".to_string(),
            date: "2026-01-02T03:04:05Z".to_string(),
            machine: Machine {
                nproc: 2,
                cpu_model: "Test CPU".to_string(),
                memory_mib: 1024,
                kernel: "Linux 6.18".to_string(),
                somaxconn: "4096".to_string(),
                ip_local_port_range: "32768-60999".to_string(),
                load_average_before: "0.10 0.20 0.30".to_string(),
                load_average_after: "1.10 1.20 1.30".to_string(),
                note: "2-core machine".to_string(),
                ..Machine::default()
            },
            versions: Versions {
                postgres: "PostgreSQL 15.18 on x86_64".to_string(),
                pgbench: "pgbench (PostgreSQL) 15.18".to_string(),
                pgbouncer: "PgBouncer 1.18.0".to_string(),
                bypass: "bypass 0.1.0".to_string(),
                git_revision: Some("abc123".to_string()),
            },
            settings: Settings {
                duration_s: 30,
                repetitions: 1,
                pool_mode: "transaction",
                pool_size: 20,
                auth_type: "trust",
                max_client_conn: 11_000,
                pgbench_threads: 2,
                pgbench_scale: 10,
                direct_clients_max: 50,
                pgbench_flags: String::new(),
                ycsb: String::new(),
                postgres_conf: Vec::new(),
                cpu_window: "steady",
            },
            workloads: vec![Workload::Select1],
            clients: vec![50, 1000],
            contenders: vec![Contender::Direct, Contender::Pgbouncer, Contender::Pgbouncer2, Contender::Bypass],
            ratio_pairs: vec![(Contender::Bypass, Contender::Pgbouncer), (Contender::Bypass, Contender::Pgbouncer2)],
            runs: Vec::new(),
            cells: Vec::new(),
            ratios: Vec::new(),
        };
        for run in runs {
            results.runs.push(run);
        }
        results.cells = summarize(&results.runs);
        results.ratios = ratios(&results.cells, &results.ratio_pairs);
        results
    }

    // Goal: medians are taken per cell across repetitions and errors are kept;
    // method: three bypass repetitions, one of them failed.
    #[test]
    fn summarize_takes_medians_and_keeps_errors() {
        // An aborted run keeps its partial numbers in the record but not in the medians.
        let mut failed = run(Workload::Select1, 50, Contender::Bypass, 1e6, 0.001);
        failed.error = Some("boom".to_string());
        let runs = vec![
            run(Workload::Select1, 50, Contender::Bypass, 100.0, 4.0),
            run(Workload::Select1, 50, Contender::Bypass, 300.0, 2.0),
            failed,
            run(Workload::Select1, 50, Contender::Pgbouncer, 50.0, 8.0),
        ];
        let cells = summarize(&runs);
        assert_eq!(cells.len(), 2);
        let bypass = &cells[0];
        assert_eq!((bypass.contender, bypass.runs), (Contender::Bypass, 3));
        assert_eq!(bypass.tps, Some(200.0));
        assert_eq!(bypass.p99_ms, Some(3.0));
        assert_eq!(bypass.errors, vec!["boom".to_string()]);
    }

    // Goal: ratios divide Bypass by each PgBouncer shape and tolerate a missing peer;
    // method: a cell with PgBouncer but without PgBouncer ×2.
    #[test]
    fn ratios_divide_bypass_by_peers() {
        let runs = vec![
            run(Workload::SelectOnly, 1000, Contender::Pgbouncer, 100.0, 10.0),
            run(Workload::SelectOnly, 1000, Contender::Bypass, 150.0, 5.0),
        ];
        let pairs = [(Contender::Bypass, Contender::Pgbouncer), (Contender::Bypass, Contender::Pgbouncer2)];
        let ratios = ratios(&summarize(&runs), &pairs);
        assert_eq!(ratios.len(), 1, "no ratio without PgBouncer ×2");
        assert_eq!((ratios[0].subject, ratios[0].peer), (Contender::Bypass, Contender::Pgbouncer));
        let versus = ratios[0].ratios;
        assert_eq!(versus.tps, Some(1.5));
        assert_eq!(versus.p99, Some(0.5));
        assert_eq!(versus.mean, Some(0.5));
        assert!((versus.cpu_us_per_txn.expect("cpu") - 100.0 / 150.0).abs() < 1e-12);
    }
}
