//! The benchmark's results: JSON (everything), markdown (the tables, ratios and checks of the
//! issue) and the PNG plot.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::{BenchOptions, Contender, Point};
use crate::report::machine::Machine;

/// One acceptance check of the issue.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchResults {
    pub command: String,
    /// The machine, with the load average before the first and after the last point.
    pub machine: Machine,
    pub haproxy: String,
    pub link_rate_mbit: u32,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub hybrid_threshold_bytes: u64,
    pub sizes: Vec<u64>,
    pub contenders: Vec<Contender>,
    /// Median round per (contender, size).
    pub throughput: Vec<Point>,
    /// Every round, in the order measured.
    pub throughput_runs: Vec<Point>,
    pub latency: Vec<Point>,
    pub rounds: u32,
    /// How idle CPUs behaved during the run.
    pub cpu_idle: String,
    /// TCP resets sent in the whole lab while each contender ran.
    pub resets: Vec<(Contender, u64)>,
    /// (contender, hand-overs, of which on demand) over the whole sweep.
    pub handovers: Vec<(Contender, u64, u64)>,
    /// Smallest size at which hand-over-always beat relay-only.
    pub crossover_bytes: Option<u64>,
    pub checks: Vec<Check>,
}

impl BenchResults {
    pub fn new(
        options: &BenchOptions,
        throughput: Vec<Point>,
        latency: Vec<Point>,
        resets: Vec<(Contender, u64)>,
        load_average_before: String,
    ) -> Self {
        let mut results = BenchResults {
            command: options.command.clone(),
            machine: Machine { load_average_before, ..Machine::now() },
            haproxy: super::haproxy_version(),
            link_rate_mbit: options.link_rate_mbit,
            warmup_s: options.warmup.as_secs_f64(),
            duration_s: options.duration.as_secs_f64(),
            hybrid_threshold_bytes: options.threshold.unwrap_or(0),
            sizes: options.sizes.clone(),
            contenders: options.contenders.clone(),
            throughput,
            throughput_runs: Vec::new(),
            latency,
            rounds: options.rounds.max(1),
            cpu_idle: String::new(),
            resets,
            handovers: Vec::new(),
            crossover_bytes: None,
            checks: Vec::new(),
        };
        results.crossover_bytes = results.sizes.iter().copied().find(|&size| {
            match (results.gbit(Contender::Handover, size), results.gbit(Contender::Relay, size)) {
                (Some(handover), Some(relay)) => handover >= relay,
                _ => false,
            }
        });
        results.checks = results.evaluate();
        results
    }

    /// Aggregate throughput of a contender at a size.
    pub fn gbit(&self, contender: Contender, size: u64) -> Option<f64> {
        self.throughput
            .iter()
            .find(|p| p.contender == contender && p.report.size == size)
            .map(|p| p.report.throughput_gbit_s)
    }

    fn latency_mean(&self, contender: Contender) -> Option<f64> {
        self.latency.iter().find(|p| p.contender == contender).map(|p| p.report.latency_mean_us)
    }

    fn evaluate(&self) -> Vec<Check> {
        let mut checks = Vec::new();
        for size in [16 << 20, 128 << 20] {
            if let (Some(hybrid), Some(haproxy)) =
                (self.gbit(Contender::Hybrid, size), self.gbit(Contender::Haproxy, size))
            {
                let ratio = hybrid / haproxy;
                checks.push(check(
                    format!("hybrid ≥ 1.9× HAProxy at {}", size_label(size)),
                    ratio >= 1.9,
                    format!("{ratio:.2}×"),
                ));
            }
        }
        for &size in self.sizes.iter().filter(|&&s| s <= 4096) {
            if let (Some(hybrid), Some(relay)) = (self.gbit(Contender::Hybrid, size), self.gbit(Contender::Relay, size))
            {
                let ratio = hybrid / relay;
                checks.push(check(
                    format!("hybrid within 5% of relay at {}", size_label(size)),
                    ratio >= 0.95,
                    format!("{ratio:.3}×"),
                ));
            }
        }
        for &size in &self.sizes {
            let best = self
                .gbit(Contender::Relay, size)
                .into_iter()
                .chain(self.gbit(Contender::Handover, size))
                .fold(0.0, f64::max);
            if let Some(hybrid) = self.gbit(Contender::Hybrid, size).filter(|_| best > 0.0) {
                let ratio = hybrid / best;
                let name = format!("hybrid ≥ 0.95× best of relay/hand-over at {}", size_label(size));
                checks.push(check(name, ratio >= 0.95, format!("{ratio:.3}×")));
            }
        }
        if let (Some(hybrid), Some(relay)) = (self.latency_mean(Contender::Hybrid), self.latency_mean(Contender::Relay))
        {
            let ratio = hybrid / relay;
            let detail = format!("{hybrid:.0} µs vs {relay:.0} µs ({ratio:.3}×)");
            checks.push(check("1-byte latency of hybrid within 10% of relay".into(), ratio <= 1.10, detail));
        }
        checks
    }

    /// Writes dispatch.json, dispatch.md and dispatch.png into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        crate::report::write(dir, "dispatch", self, &self.markdown(), |png| super::plot::render(self, png))
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# Dispatcher benchmark: relay, hand-over and hybrid vs HAProxy\n");
        let _ = writeln!(md, "Command: `{}`  ", self.command);
        let _ = writeln!(
            md,
            "Machine: {}; links shaped to {} Mbit/s (tbf) on every server link, so the dispatcher's link is the \
             bottleneck; 2 clients × 1 persistent connection, 2 backends (stock PostgreSQL 15 + agent); every \
             payload byte verified. Warm-up {} s, {} s per point, median of {} rounds (contender order rotated \
             between rounds); {}. {}. Load average before: {}, after: {}.\n",
            self.machine.headline(),
            self.link_rate_mbit,
            self.warmup_s,
            self.duration_s,
            self.rounds,
            self.cpu_idle,
            self.haproxy,
            self.machine.load_average_before,
            self.machine.load_average_after
        );
        self.throughput_table(&mut md);
        self.latency_table(&mut md);
        let crossover = self.crossover_bytes.map_or("not reached".to_string(), size_label);
        let _ = writeln!(
            md,
            "\nMeasured crossover (hand-over-always ≥ relay-only): {crossover}; hybrid threshold used: {}.\n",
            size_label(self.hybrid_threshold_bytes)
        );
        let _ = writeln!(md, "## Checks (issue 5, \"done when\")\n\n| check | result | value |\n|---|---|---|");
        for check in &self.checks {
            let _ =
                writeln!(md, "| {} | {} | {} |", check.name, if check.passed { "pass" } else { "FAIL" }, check.detail);
        }
        let moves: Vec<String> =
            self.handovers.iter().map(|(c, n, d)| format!("{} {n} ({d} on demand)", c.name())).collect();
        let _ = writeln!(md, "\nHand-overs over the sweep: {}  ", moves.join(", "));
        let _ = writeln!(
            md,
            "TCP resets sent in the lab per contender: {}",
            self.resets.iter().map(|(c, n)| format!("{} {n}", c.name())).collect::<Vec<_>>().join(", ")
        );
        md
    }

    fn throughput_table(&self, md: &mut String) {
        let _ = writeln!(md, "## Aggregate throughput (Gbit/s of payload; ratio to HAProxy)\n");
        let header: Vec<&str> = self.contenders.iter().map(|c| c.name()).collect();
        let _ = writeln!(md, "| payload | {} |", header.join(" | "));
        let _ = writeln!(md, "|---|{}", "---|".repeat(header.len()));
        for &size in &self.sizes {
            let haproxy = self.gbit(Contender::Haproxy, size);
            let cells: Vec<String> = self
                .contenders
                .iter()
                .map(|&c| match (self.gbit(c, size), haproxy) {
                    (Some(v), Some(h)) if h > 0.0 => format!("{} ({:.2}×)", gbit_label(v), v / h),
                    (Some(v), _) => gbit_label(v),
                    (None, _) => "–".into(),
                })
                .collect();
            let _ = writeln!(md, "| {} | {} |", size_label(size), cells.join(" | "));
        }
    }

    fn latency_table(&self, md: &mut String) {
        let _ = writeln!(md, "\n## 1-byte query latency (one connection, µs)\n\n| contender | mean | p50 | p99 | p99.9 | queries |\n|---|---|---|---|---|---|");
        for point in &self.latency {
            let r = &point.report;
            let _ = writeln!(
                md,
                "| {} | {:.0} | {} | {} | {} | {} |",
                point.contender.name(),
                r.latency_mean_us,
                r.latency_p50_us,
                r.latency_p99_us,
                r.latency_p999_us,
                r.queries
            );
        }
    }
}

fn check(name: String, passed: bool, detail: String) -> Check {
    Check { name, passed, detail }
}

/// `1 B`, `4 KB`, `16 MB` (binary units, as the issue writes them).
pub fn size_label(size: u64) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KB", s >> 10),
        s => format!("{s} B"),
    }
}

fn gbit_label(value: f64) -> String {
    if value >= 0.1 {
        format!("{value:.3}")
    } else {
        format!("{:.4} (={:.2} Mb/s)", value, value * 1000.0)
    }
}
