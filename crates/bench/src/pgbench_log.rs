//! pgbench's per-transaction log (`--log --log-prefix P`): parsing and latency summaries.
//!
//! PostgreSQL 15 writes one line per transaction (or per sampled transaction with
//! `--sampling-rate`) into `P.<pid>` for the first thread and `P.<pid>.<n>` for the others:
//!
//! ```text
//! client_id transaction_no time script_no time_epoch time_us [schedule_lag] [retries]
//! ```
//!
//! `time` is the transaction's latency in µs, or `failed` / `skipped`; `time_epoch.time_us` is
//! when it completed (Unix time).

use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::stats::percentile_sorted;

/// One log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogEntry {
    /// A completed transaction: latency and completion time, both in µs.
    Done { latency_us: u64, completed_unix_us: u64 },
    /// `failed` or `skipped` in the time field.
    NotDone,
}

/// Parses one log line; `None` for lines that are not in the documented format.
pub fn parse_log_line(line: &str) -> Option<LogEntry> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 6 {
        return None;
    }
    let Ok(latency_us) = fields[2].parse::<u64>() else {
        return matches!(fields[2], "failed" | "skipped").then_some(LogEntry::NotDone);
    };
    let epoch_s: u64 = fields[4].parse().ok()?;
    let micros: u64 = fields[5].parse().ok()?;
    Some(LogEntry::Done { latency_us, completed_unix_us: epoch_s * 1_000_000 + micros })
}

/// Latencies (µs) of the transactions completed inside `[from_us, to_us]` (Unix µs), plus the
/// count of failed/skipped lines, over every log file in `dir` whose name starts with `prefix.`.
pub fn read_latencies(dir: &Path, prefix: &str, window: Option<(u64, u64)>) -> Result<(Vec<u64>, u64)> {
    let mut latencies = Vec::new();
    let mut not_done = 0;
    let file_prefix = format!("{prefix}.");
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry.context("reading a directory entry")?.path();
        let is_log = path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with(&file_prefix));
        if !is_log {
            continue;
        }
        let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        for line in BufReader::new(file).lines() {
            match parse_log_line(&line.with_context(|| format!("reading {}", path.display()))?) {
                Some(LogEntry::Done { latency_us, completed_unix_us }) => {
                    let inside = window.is_none_or(|(from, to)| (from..=to).contains(&completed_unix_us));
                    if inside {
                        latencies.push(latency_us);
                    }
                }
                Some(LogEntry::NotDone) => not_done += 1,
                None => {}
            }
        }
    }
    Ok((latencies, not_done))
}

/// Latency statistics of one run, in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Log lines used (after sampling and the steady-state window).
    pub samples: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// Summarises latencies in µs; `None` when there are none. Sorts the input in place.
pub fn summarize(latencies_us: &mut [u64]) -> Option<LatencySummary> {
    if latencies_us.is_empty() {
        return None;
    }
    latencies_us.sort_unstable();
    let to_ms = |percent: f64| percentile_sorted(latencies_us, percent).map_or(f64::NAN, |us| us as f64 / 1000.0);
    let total: u128 = latencies_us.iter().map(|&us| u128::from(us)).sum();
    Some(LatencySummary {
        samples: latencies_us.len() as u64,
        mean_ms: total as f64 / latencies_us.len() as f64 / 1000.0,
        p50_ms: to_ms(50.0),
        p95_ms: to_ms(95.0),
        p99_ms: to_ms(99.0),
        p999_ms: to_ms(99.9),
        max_ms: to_ms(100.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the PG15 line format parses, failed lines are counted, junk is ignored; method: literals.
    #[test]
    fn parses_pg15_log_lines() {
        let done = parse_log_line("0 199 2241 0 1175850568 995598");
        assert_eq!(done, Some(LogEntry::Done { latency_us: 2241, completed_unix_us: 1_175_850_568_995_598 }));
        let with_lag = parse_log_line("3 7 1500 0 1700000000 5 120 0");
        assert_eq!(with_lag, Some(LogEntry::Done { latency_us: 1500, completed_unix_us: 1_700_000_000_000_005 }));
        assert_eq!(parse_log_line("1 2 failed 0 1700000000 5"), Some(LogEntry::NotDone));
        assert_eq!(parse_log_line("1 2 skipped 0 1700000000 5"), Some(LogEntry::NotDone));
        assert_eq!(parse_log_line("garbage"), None);
        assert_eq!(parse_log_line("1 2 x 0 1700000000 5"), None);
    }

    // Goal: files of every thread are read and the window filters by completion time;
    // method: write two thread files and a foreign file into a temp dir.
    #[test]
    fn reads_all_thread_files_within_window() {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
        write("x.123", "0 0 1000 0 100 0\n0 1 2000 0 101 0\n");
        write("x.123.1", "1 0 3000 0 102 500000\n1 1 failed 0 102 600000\n");
        write("other.txt", "0 0 9999 0 101 0\n");
        let (mut all, failed) = read_latencies(dir.path(), "x", None).expect("read");
        all.sort_unstable();
        assert_eq!((all, failed), (vec![1000, 2000, 3000], 1));
        let (inside, _) = read_latencies(dir.path(), "x", Some((101_000_000, 102_000_000))).expect("read");
        assert_eq!(inside, vec![2000]);
    }

    // Goal: summaries convert µs to ms with nearest-rank percentiles; method: 1..=1000 µs.
    #[test]
    fn summarizes_latencies() {
        let mut latencies: Vec<u64> = (1..=1000).rev().collect();
        let summary = summarize(&mut latencies).expect("non-empty");
        assert_eq!(summary.samples, 1000);
        assert!((summary.mean_ms - 0.5005).abs() < 1e-9);
        assert_eq!(summary.p50_ms, 0.5);
        assert_eq!(summary.p99_ms, 0.99);
        assert_eq!(summary.p999_ms, 0.999);
        assert_eq!(summary.max_ms, 1.0);
        assert!(summarize(&mut []).is_none());
    }
}
