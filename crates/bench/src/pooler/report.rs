//! The results document: provenance, every run, per-cell medians and Bypass-vs-PgBouncer ratios,
//! written as `pooler.json`, `pooler.md` and `pooler.png`.

use std::path::Path;

use anyhow::{Context, Result};
use bypass_testkit::{pg_bin, Postgres};
use serde::Serialize;

use super::contender::MAX_CLIENT_CONN;
use super::measure::{sampling_rate, RunRecord, SAMPLED_LOG_CLIENTS_MIN};
use super::{markdown, plot, Contender, PoolerBenchArgs, Workload, PG_MAX_CONNECTIONS, PG_SHARED_BUFFERS_MB, SCALE};
use crate::machine::{self, MachineInfo};
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
    /// e.g. `-n -M simple -c C -j 2 -T 30 -P 1 --log` (+ `--sampling-rate 0.1` at ≥ 5,000 clients).
    pub pgbench_flags: String,
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
    pub cpu_us_per_txn: Option<f64>,
    pub pooler_cpu_us_per_txn: Option<f64>,
    pub pgbench_cpu_us_per_txn: Option<f64>,
    pub little_ratio: Option<f64>,
    pub initial_connection_ms: Option<f64>,
    /// Summed over the repetitions; must be 0.
    pub failed_transactions: u64,
}

/// Bypass divided by a peer; > 1 is better for TPS, < 1 is better for p99 and CPU.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Ratios {
    pub tps: Option<f64>,
    pub p99: Option<f64>,
    pub cpu_us_per_txn: Option<f64>,
}

/// The ratios of one (workload, clients) cell.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CellRatios {
    pub workload: Workload,
    pub clients: u32,
    pub bypass_vs_pgbouncer: Option<Ratios>,
    pub bypass_vs_pgbouncer2: Option<Ratios>,
}

/// Everything `pooler.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub benchmark: &'static str,
    pub command: String,
    pub date: String,
    pub machine: MachineInfo,
    pub versions: Versions,
    pub settings: Settings,
    pub workloads: Vec<Workload>,
    pub clients: Vec<u32>,
    pub contenders: Vec<Contender>,
    pub runs: Vec<RunRecord>,
    pub cells: Vec<CellSummary>,
    pub ratios: Vec<CellRatios>,
}

impl Results {
    /// Provenance and settings; runs are added with [`Results::push`].
    pub fn new(args: &PoolerBenchArgs, postgres: &Postgres, bypass_exe: &Path) -> Result<Results> {
        let versions = Versions {
            postgres: postgres.psql("select version()").context("asking PostgreSQL its version")?,
            pgbench: machine::version_of(&pg_bin("pgbench")),
            pgbouncer: machine::version_of(Path::new(PGBOUNCER_BIN)),
            bypass: machine::version_of(bypass_exe),
            git_revision: machine::git_revision(),
        };
        let flags = format!(
            "-n -M simple -c CLIENTS -j {} -T {} -P 1 --log (--sampling-rate {} at ≥ {} clients); \
             select1: -f select1.sql (SELECT 1;), select-only: -S",
            args.threads,
            args.duration_s,
            sampling_rate(u32::MAX),
            SAMPLED_LOG_CLIENTS_MIN
        );
        Ok(Results {
            benchmark: "pooler",
            command: machine::command_line(),
            date: machine::iso8601_utc(crate::cpu::unix_micros() / 1_000_000),
            machine: machine::machine_info(),
            versions,
            settings: Settings {
                duration_s: args.duration_s,
                repetitions: args.repetitions,
                pool_mode: "transaction",
                pool_size: args.pool_size,
                auth_type: "trust",
                max_client_conn: MAX_CLIENT_CONN,
                pgbench_threads: args.threads,
                pgbench_scale: SCALE,
                pgbench_flags: flags,
                postgres_conf: vec![
                    format!("max_connections = {PG_MAX_CONNECTIONS}"),
                    format!("shared_buffers = {PG_SHARED_BUFFERS_MB}MB"),
                    "synchronous_commit = off".to_string(),
                    "fsync = off (throwaway cluster)".to_string(),
                ],
                cpu_window: "steady state between pgbench's -P 1 progress lines: from the first line after ramp-up \
                             (leading seconds below 80% of the median TPS skipped) to the last one; the connection \
                             phase is excluded",
            },
            workloads: args.workloads.clone(),
            clients: args.clients.clone(),
            contenders: args.contenders.clone(),
            runs: Vec::new(),
            cells: Vec::new(),
            ratios: Vec::new(),
        })
    }

    /// Adds a run and recomputes the medians and ratios.
    pub fn push(&mut self, record: RunRecord) {
        self.runs.push(record);
        self.cells = summarize(&self.runs);
        self.ratios = ratios(&self.cells);
    }

    /// Writes the JSON, the markdown and (when a font is available) the PNG into `out`.
    pub fn write(&self, out: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).context("serialising results")?;
        write_file(&out.join("pooler.json"), &(json + "\n"))?;
        write_file(&out.join("pooler.md"), &markdown::render(self))?;
        if let Err(error) = plot::render(self, &out.join("pooler.png")) {
            eprintln!("bench pooler: warning: no plot: {error:#}");
        }
        Ok(())
    }

    /// The summary of one cell and contender, if it ran.
    pub fn cell(&self, workload: Workload, clients: u32, contender: Contender) -> Option<&CellSummary> {
        self.cells.iter().find(|cell| (cell.workload, cell.clients, cell.contender) == (workload, clients, contender))
    }
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
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
        cpu_us_per_txn: median_of(&|run| run.cpu.as_ref().map(|c| c.system_us_per_txn)),
        pooler_cpu_us_per_txn: median_of(&|run| run.cpu.as_ref().and_then(|c| c.pooler_us_per_txn)),
        pgbench_cpu_us_per_txn: median_of(&|run| run.cpu.as_ref().map(|c| c.pgbench_us_per_txn)),
        little_ratio: median_of(&|run| run.little_ratio),
        initial_connection_ms: median_of(&|run| run.initial_connection_ms),
        failed_transactions: runs.iter().filter_map(|run| run.failed_transactions).sum(),
    }
}

/// Bypass over PgBouncer and over PgBouncer ×2 per (workload, clients) cell.
pub fn ratios(cells: &[CellSummary]) -> Vec<CellRatios> {
    let mut out: Vec<CellRatios> = Vec::new();
    for bypass in cells.iter().filter(|cell| cell.contender == Contender::Bypass) {
        let peer = |contender: Contender| {
            let other = cells.iter().find(|cell| {
                (cell.workload, cell.clients, cell.contender) == (bypass.workload, bypass.clients, contender)
            })?;
            Some(Ratios {
                tps: divide(bypass.tps, other.tps),
                p99: divide(bypass.p99_ms, other.p99_ms),
                cpu_us_per_txn: divide(bypass.cpu_us_per_txn, other.cpu_us_per_txn),
            })
        };
        out.push(CellRatios {
            workload: bypass.workload,
            clients: bypass.clients,
            bypass_vs_pgbouncer: peer(Contender::Pgbouncer),
            bypass_vs_pgbouncer2: peer(Contender::Pgbouncer2),
        });
    }
    out
}

fn divide(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() => Some(n / d),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::machine::MachineInfo;
    use crate::pgbench_log::LatencySummary;
    use crate::pooler::measure::CpuWindow;

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
            pgbench_us_per_txn: 0.5e6 / tps,
            postgres_us_per_txn: 0.5e6 / tps,
        };
        RunRecord {
            workload,
            clients,
            contender,
            repetition: 0,
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
        }
    }

    /// Results as a run with these records would have them, with fixed provenance.
    pub(crate) fn sample_results(runs: Vec<RunRecord>) -> Results {
        let mut results = Results {
            benchmark: "pooler",
            command: "bypass bench pooler --clients 50,1000".to_string(),
            date: "2026-01-02T03:04:05Z".to_string(),
            machine: MachineInfo {
                nproc: 2,
                cpu_model: "Test CPU".to_string(),
                memory_mib: 1024,
                kernel: "Linux 6.18".to_string(),
                somaxconn: "4096".to_string(),
                ip_local_port_range: "32768-60999".to_string(),
                note: "2-core machine".to_string(),
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
                pgbench_flags: String::new(),
                postgres_conf: Vec::new(),
                cpu_window: "steady",
            },
            workloads: vec![Workload::Select1],
            clients: vec![50, 1000],
            contenders: vec![Contender::Direct, Contender::Pgbouncer, Contender::Pgbouncer2, Contender::Bypass],
            runs: Vec::new(),
            cells: Vec::new(),
            ratios: Vec::new(),
        };
        for run in runs {
            results.push(run);
        }
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
        let ratios = ratios(&summarize(&runs));
        assert_eq!(ratios.len(), 1);
        let versus = ratios[0].bypass_vs_pgbouncer.expect("pgbouncer ran");
        assert_eq!(versus.tps, Some(1.5));
        assert_eq!(versus.p99, Some(0.5));
        assert!((versus.cpu_us_per_txn.expect("cpu") - 100.0 / 150.0).abs() < 1e-12);
        assert_eq!(ratios[0].bypass_vs_pgbouncer2, None);
    }
}
