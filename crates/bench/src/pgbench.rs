//! Driving `pgbench`: spawning it with a raised fd limit, reading its `-P 1` progress lines live
//! (taking a CPU [`Snapshot`] at each), enforcing a deadline, and parsing its final report.
//!
//! ```text
//!   pgbench ──stderr──► reader thread: "progress: ..." ──► Probe::snapshot() ─► Vec<Tick>
//!           ──stdout──► reader thread: final report ───► parse_summary()
//!   main thread: try_wait() every 100 ms; deadline or interrupt ⇒ SIGKILL (ChildGuard)
//! ```

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cpu::{Probe, Snapshot};
use crate::interrupt;

/// How often the main thread checks the child, the deadline and Ctrl-C.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Bytes of pgbench's non-progress stderr kept for error messages.
const STDERR_KEPT_MAX: usize = 8 * 1024;

/// One `-P` progress line of PostgreSQL 15's pgbench:
/// `progress: 5.0 s, 41234.5 tps, lat 1.210 ms stddev 0.300, 0 failed`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Seconds since pgbench's start, as printed.
    pub elapsed_s: f64,
    /// Transactions per second over the interval since the previous line.
    pub tps: f64,
    pub latency_ms: f64,
    pub failed: u64,
}

/// Parses a progress line; `None` for anything else.
pub fn parse_progress(line: &str) -> Option<Progress> {
    let rest = line.trim().strip_prefix("progress: ")?;
    let mut parts = rest.split(", ");
    let elapsed_s = parts.next()?.strip_suffix(" s")?.parse().ok()?;
    let tps = parts.next()?.strip_suffix(" tps")?.parse().ok()?;
    let latency_ms = parts.next()?.strip_prefix("lat ")?.split(' ').next()?.parse().unwrap_or(f64::NAN);
    let failed = parts.find_map(|part| part.strip_suffix(" failed")?.parse().ok()).unwrap_or(0);
    Some(Progress { elapsed_s, tps, latency_ms, failed })
}

/// pgbench's final report (stdout), the fields we use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// `tps = X (without initial connection time)`.
    pub tps: Option<f64>,
    /// `number of transactions actually processed: N`.
    pub processed: Option<u64>,
    /// `number of failed transactions: N (x%)`.
    pub failed: Option<u64>,
    /// `initial connection time = X ms`.
    pub initial_connection_ms: Option<f64>,
    /// `latency average = X ms`.
    pub latency_average_ms: Option<f64>,
}

/// Parses the final report; missing lines stay `None`.
pub fn parse_summary(text: &str) -> Summary {
    let mut summary = Summary::default();
    for line in text.lines().map(str::trim) {
        let first_number = |rest: &str| rest.split([' ', '/']).next().map(str::to_string);
        if let Some(rest) = line.strip_prefix("tps = ") {
            if rest.contains("without initial connection time") {
                summary.tps = first_number(rest).and_then(|n| n.parse().ok());
            }
        } else if let Some(rest) = line.strip_prefix("number of transactions actually processed: ") {
            summary.processed = first_number(rest).and_then(|n| n.parse().ok());
        } else if let Some(rest) = line.strip_prefix("number of failed transactions: ") {
            summary.failed = first_number(rest).and_then(|n| n.parse().ok());
        } else if let Some(rest) = line.strip_prefix("initial connection time = ") {
            summary.initial_connection_ms = first_number(rest).and_then(|n| n.parse().ok());
        } else if let Some(rest) = line.strip_prefix("latency average = ") {
            summary.latency_average_ms = first_number(rest).and_then(|n| n.parse().ok());
        }
    }
    summary
}

/// A progress line with the CPU counters read right when it arrived.
#[derive(Debug, Clone)]
pub struct Tick {
    pub progress: Progress,
    pub snapshot: Snapshot,
}

/// What one pgbench run produced.
#[derive(Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    /// Non-progress stderr (errors, warnings), possibly cut to its last few KiB.
    pub stderr: String,
    pub ticks: Vec<Tick>,
    pub summary: Summary,
    pub wall: Duration,
}

/// Kills and reaps the child on drop unless it already exited: no pgbench outlives an error.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Makes `command` raise its soft `RLIMIT_NOFILE` to the hard limit before exec: pgbench holds one
/// socket per client and the usual soft limit of 1024 is far below 10,000 clients.
pub fn raise_fd_limit_before_exec(command: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only calls getrlimit/setrlimit, which
    // are async-signal-safe and touch nothing but a stack struct; it allocates nothing.
    unsafe {
        command.pre_exec(|| {
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                limit.rlim_cur = limit.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
            Ok(())
        });
    }
}

/// Runs `command` (a pgbench with `-P 1`) until it exits, `deadline` passes or the user
/// interrupts. `probe` says which processes to account; pgbench's own pid is added to it.
pub fn run(mut command: Command, probe: &Probe, deadline: Duration) -> Result<Outcome> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let child = command.spawn().context("spawning pgbench")?;
    let mut guard = ChildGuard(child);
    let stdout = guard.0.stdout.take().context("pgbench stdout pipe")?;
    let stderr = guard.0.stderr.take().context("pgbench stderr pipe")?;
    let pgbench_pid = guard.0.id();
    let mut probe = probe.clone();
    probe.pgbench.push(pgbench_pid);
    std::thread::scope(|scope| {
        let stdout_reader = scope.spawn(move || read_all(stdout));
        let stderr_reader = scope.spawn(|| read_progress(stderr, &probe, pgbench_pid));
        let waited = wait_with_deadline(&mut guard.0, started, deadline);
        if waited.is_err() {
            // Closing the pipes needs the child gone; the guard would do it later, too late
            // for the reader threads we are about to join.
            let _ = guard.0.kill();
            let _ = guard.0.wait();
        }
        let stdout = stdout_reader.join().unwrap_or_default();
        let (ticks, stderr) = stderr_reader.join().unwrap_or_default();
        let status = waited?;
        let summary = parse_summary(&stdout);
        Ok(Outcome { status, stderr, ticks, summary, wall: started.elapsed() })
    })
}

fn wait_with_deadline(child: &mut Child, started: Instant, deadline: Duration) -> Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().context("waiting for pgbench")? {
            return Ok(status);
        }
        if interrupt::requested() {
            bail!("interrupted");
        }
        if started.elapsed() > deadline {
            bail!("pgbench still running after {} s: killed", deadline.as_secs());
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

fn read_all(mut pipe: impl Read) -> String {
    let mut bytes = Vec::new();
    let _ = pipe.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Reads stderr line by line: progress lines become ticks (with a CPU snapshot taken at once),
/// everything else is kept, bounded, for error messages. A snapshot taken after pgbench exited
/// (this thread fell behind on a saturated machine) would stretch the window over idle time and
/// lose the exited processes' counters, so such ticks are dropped.
fn read_progress(pipe: impl Read, probe: &Probe, pgbench_pid: u32) -> (Vec<Tick>, String) {
    let mut ticks = Vec::new();
    let mut other = String::new();
    for line in BufReader::new(pipe).lines() {
        let Ok(line) = line else { break };
        match parse_progress(&line) {
            Some(progress) => {
                if let Ok(snapshot) = probe.snapshot() {
                    if snapshot.pgbench.contains_key(&pgbench_pid) {
                        ticks.push(Tick { progress, snapshot });
                    }
                }
            }
            None => {
                other.push_str(&line);
                other.push('\n');
                if other.len() > STDERR_KEPT_MAX {
                    let cut = other.len() - STDERR_KEPT_MAX / 2;
                    let cut = (cut..other.len()).find(|&i| other.is_char_boundary(i)).unwrap_or(other.len());
                    other.replace_range(..cut, "…");
                }
            }
        }
    }
    (ticks, other)
}

/// The last non-empty lines of pgbench's stderr, for an error cell.
pub fn stderr_tail(stderr: &str, lines_max: usize) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|line| !line.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(lines_max)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: PG15 progress lines parse with and without extras; other lines do not; method: literals.
    #[test]
    fn parses_progress_lines() {
        let line = "progress: 5.0 s, 41234.5 tps, lat 1.210 ms stddev 0.300, 0 failed";
        let expected = Progress { elapsed_s: 5.0, tps: 41234.5, latency_ms: 1.21, failed: 0 };
        assert_eq!(parse_progress(line), Some(expected));
        let lagged = parse_progress("progress: 12.0 s, 10.0 tps, lat 3.000 ms stddev 1.0, 2 failed, lag 0.1 ms");
        assert_eq!(lagged.map(|p| (p.elapsed_s, p.failed)), Some((12.0, 2)));
        let pg14 = parse_progress("progress: 1.0 s, 99.0 tps, lat 0.500 ms stddev 0.100");
        assert_eq!(pg14.map(|p| p.failed), Some(0));
        assert_eq!(parse_progress("pgbench: error: connection to server failed"), None);
    }

    // Goal: the final report's numbers are found; method: a PG15 report excerpt.
    #[test]
    fn parses_final_report() {
        let report = "transaction type: <builtin: select only>\n\
            number of clients: 50\n\
            number of transactions actually processed: 201234\n\
            number of failed transactions: 3 (0.001%)\n\
            latency average = 1.234 ms\n\
            initial connection time = 31.500 ms\n\
            tps = 40246.801234 (without initial connection time)\n";
        let summary = parse_summary(report);
        assert_eq!(summary.tps, Some(40246.801234));
        assert_eq!(summary.processed, Some(201234));
        assert_eq!(summary.failed, Some(3));
        assert_eq!(summary.initial_connection_ms, Some(31.5));
        assert_eq!(summary.latency_average_ms, Some(1.234));
        assert_eq!(parse_summary("pgbench: error: nope"), Summary::default());
    }

    // Goal: stderr tails keep the last non-empty lines; method: literal text.
    #[test]
    fn stderr_tail_keeps_last_lines() {
        assert_eq!(stderr_tail("a\n\nb\nc\n", 2), "b | c");
        assert_eq!(stderr_tail("", 3), "");
    }
}
