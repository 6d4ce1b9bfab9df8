//! `bypass bench pod`: the Tigon-style store against DS2PL+ and OCC+ on TPC-C and YCSB, and
//! Tigon's ablations, every point the median of several runs, measured and modelled side by side.
//!
//! ```text
//!  sweeps ─► points (config per series × x) ─► for each repetition, every point in turn
//!        (interleaved, so machine noise spreads over all series) ─► Pod::run ─► RunReport
//!  median per point ─► pod.json (everything) · pod.md (tables, ratios, claims) · pod.png (panels)
//! ```
//!
//! A failed run is recorded (its error) and the benchmark goes on.

mod load;
mod plot;
mod published;
mod recovery;
mod report;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use bypass_pod::coherence::{CoherenceBackend, SwccProtocol};
use bypass_pod::config::{PodConfig, Protocol};
use bypass_pod::launcher::{Pod, RunReport};
use bypass_pod::workload::tpcc::TpccConfig;
use bypass_pod::workload::ycsb::YcsbConfig;
use bypass_pod::workload::WorkloadConfig;

/// Arguments of `bypass bench pod`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Directory for pod.json, pod.md and pod.png.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Runs per point; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Warm-up per run (the design asks 5–10 s).
    #[arg(long, default_value_t = 5000)]
    pub warmup_ms: u64,
    /// Measured window per run (the design asks 20–30 s).
    #[arg(long, default_value_t = 20_000)]
    pub measure_ms: u64,
    /// Fewer points per sweep (ends and middle), to validate the harness quickly.
    #[arg(long)]
    pub quick: bool,
    /// How the secondary points run: every point that carries no headline figure (the headline
    /// points are TPC-C at Tigon's four published remote shares and YCSB 95/5 at 0% and 100%
    /// cross for all three protocols, SWcc WriteThrough and NoSWcc on YCSB, the pinned check and
    /// the recovery point with checkpoints; they always run with the windows and repetitions above).
    #[arg(long, value_enum, default_value_t = Secondary::Full)]
    pub secondary: Secondary,
    /// Warm-up of a shortened secondary point (`--secondary short`: one run each).
    #[arg(long, default_value_t = 1000)]
    pub short_warmup_ms: u64,
    /// Measured window of a shortened secondary point.
    #[arg(long, default_value_t = 3000)]
    pub short_measure_ms: u64,
    /// Sweeps to run, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Sweep>,
    /// TPC-C with small warehouses (60 customers per district, 1000 items).
    #[arg(long)]
    pub small_warehouses: bool,
    /// YCSB keys per host.
    #[arg(long, default_value_t = 100_000)]
    pub keys_per_host: u64,
    #[arg(long, default_value_t = 2)]
    pub hosts: usize,
    /// Where the runs' logs go (default: a fresh directory under the system temp dir).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Sweep {
    /// TPC-C throughput vs remote NewOrder/Payment percentages, three protocols.
    Tpcc,
    /// YCSB throughput vs cross-partition ratio, three protocols, plus read/write mixes.
    Ycsb,
    /// Tigon vs HWcc budget (fractions of its unconstrained footprint).
    Budget,
    /// SWcc protocol variants and NoSWcc.
    Swcc,
    /// Shortcut pointer on/off.
    Shortcut,
    /// Group-commit epoch length vs throughput and commit latency.
    Epoch,
    /// YCSB 95/5 at 100% cross with both hosts pinned to one core: does the model depend on
    /// how the cores time-slice the hosts? (Compared with the same point of the YCSB sweep.)
    Pinned,
    /// Whole-pod SIGKILL mid-run and recovery, with and without checkpoints: recovery time, log
    /// on disk, every acknowledged transaction accounted for.
    Recovery,
}

/// How `bypass bench pod` runs the points that carry no headline figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Secondary {
    /// As the headline points: the same windows and repetitions.
    Full,
    /// One run of `--short-warmup-ms` + `--short-measure-ms`.
    Short,
    /// Not run (the report lists them).
    Skip,
}

impl Sweep {
    /// Sweeps with no headline point: under `--secondary skip` they are not run at all.
    fn all_secondary(self) -> bool {
        matches!(self, Sweep::Budget | Sweep::Shortcut | Sweep::Epoch)
    }

    const ALL: [Sweep; 8] = [
        Sweep::Tpcc,
        Sweep::Ycsb,
        Sweep::Pinned,
        Sweep::Budget,
        Sweep::Swcc,
        Sweep::Shortcut,
        Sweep::Epoch,
        Sweep::Recovery,
    ];
}

/// HWcc budget of the main runs: holds every key's metadata, not its data (Tigon: 200 MB of a
/// 2.4 GB YCSB dataset; here 16 MiB of 200 MB).
const MAIN_BUDGET_BYTES: u64 = 16 << 20;
/// Budget of the "unconstrained" run the budget sweep takes its footprint from.
const UNCONSTRAINED_BUDGET_BYTES: u64 = 256 << 20;
const BUDGET_FRACTIONS: [f64; 5] = [1.0, 0.75, 0.5, 0.25, 0.05];
/// The rows of Tigon's TPC-C table (pod.md §1.3), so every point has a published ratio beside it.
const TPCC_REMOTE: [(u32, u32); 4] = [(0, 0), (10, 15), (30, 45), (60, 90)];
const YCSB_CROSS: [u32; 4] = [0, 20, 50, 100];
const PROTOCOLS: [Protocol; 3] = [Protocol::Tigon, Protocol::Ds2pl, Protocol::Occ];

/// One point of a sweep: a series (curve) at an x value, and the configuration that measures it.
#[derive(Debug, Clone)]
pub struct Spec {
    pub sweep: Sweep,
    pub panel: &'static str,
    pub series: String,
    pub x: String,
    pub config: PodConfig,
    /// Runs of this point (the median is reported).
    pub repetitions: usize,
}

/// What one run contributed to a point.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub measured_tps: f64,
    pub modelled_tps: f64,
    pub seconds: f64,
    pub error: Option<String>,
    #[serde(skip)]
    pub report: Option<RunReport>,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repetitions >= 1, "--repetitions must be at least 1");
    let started = Instant::now();
    let other_work = load::OtherWork::start();
    let log_root = match &args.log_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("bypass-pod-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let sweeps = if args.only.is_empty() { Sweep::ALL.to_vec() } else { args.only.clone() };
    let mut results = report::Results::new(&args);
    results
        .skipped
        .extend(Sweep::ALL.iter().filter(|sweep| !sweeps.contains(sweep)).map(|&sweep| report::Skipped::sweep(sweep)));
    for sweep in sweeps {
        if sweep.all_secondary() && args.secondary == Secondary::Skip {
            results.skipped.push(report::Skipped::sweep(sweep));
            continue;
        }
        if sweep == Sweep::Recovery {
            results.recovery = recovery_runs(&args, &log_root, &mut results);
        } else {
            let specs = specs(&args, sweep, &log_root, &mut results)?;
            let specs = plan(&args, specs, &mut results);
            let runs = measure(&specs);
            results.add(specs, runs);
        }
        results.other_work_share = other_work.share(results.machine.nproc);
        results.write(&args.out)?;
        eprintln!("bench pod: {sweep:?} done after {:.0} s", started.elapsed().as_secs_f64());
    }
    results.other_work_share = other_work.share(results.machine.nproc);
    results.finish(started.elapsed().as_secs_f64());
    results.write(&args.out)?;
    let _ = std::fs::remove_dir_all(&log_root);
    println!("{}", results.summary());
    Ok(())
}

/// Runs every spec its repetitions, repetitions outermost so noise spreads across series.
fn measure(specs: &[Spec]) -> Vec<Vec<Run>> {
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); specs.len()];
    let rounds = specs.iter().map(|spec| spec.repetitions).max().unwrap_or(0);
    for repetition in 0..rounds {
        for (spec, runs) in specs.iter().zip(runs.iter_mut()).filter(|(spec, _)| repetition < spec.repetitions) {
            let mut config = spec.config.clone();
            config.seed = 1 + repetition as u64;
            let started = Instant::now();
            let outcome = Pod::run(config);
            let seconds = started.elapsed().as_secs_f64();
            let run = match outcome {
                Ok(report) => Run {
                    measured_tps: report.throughput_tps,
                    modelled_tps: report.modelled_tps,
                    seconds,
                    error: None,
                    report: Some(report),
                },
                Err(error) => {
                    Run { measured_tps: 0.0, modelled_tps: 0.0, seconds, error: Some(error.to_string()), report: None }
                }
            };
            eprintln!(
                "  {:?} {} {} #{}: {:.0} measured, {:.0} modelled txn/s{}",
                spec.sweep,
                spec.series,
                spec.x,
                repetition + 1,
                run.measured_tps,
                run.modelled_tps,
                run.error.as_deref().map(|e| format!(" — {e}")).unwrap_or_default()
            );
            runs.push(run);
        }
    }
    runs
}

/// Whether a point carries a headline figure: the issue's claims (TPC-C 0/0 and 60/90, YCSB 95/5
/// at 100% cross, SWcc ÷ NoSWcc, the pinned check) and Tigon's published ratios at the main
/// sweeps' shares (TPC-C 0/0 … 60/90, YCSB 0% and 100%). The recovery point with checkpoints is
/// the other headline point ([`recovery_runs`]).
fn is_headline(spec: &Spec) -> bool {
    match spec.panel {
        "tpcc" | "pinned" => true,
        "ycsb" => spec.x == "0%" || spec.x == "100%",
        "swcc_ycsb" => {
            spec.x == format!("{:?}", SwccProtocol::WriteThrough) || spec.x == format!("{:?}", SwccProtocol::NoSwcc)
        }
        _ => false,
    }
}

/// Applies `--secondary` to a sweep's points: headline points keep the full windows and
/// repetitions; secondary ones are kept, shortened or left out (and listed as such).
fn plan(args: &BenchArgs, specs: Vec<Spec>, results: &mut report::Results) -> Vec<Spec> {
    let mut planned = Vec::new();
    for mut spec in specs {
        if !is_headline(&spec) {
            match args.secondary {
                Secondary::Full => {}
                Secondary::Short => {
                    shorten(args, &mut spec.config);
                    spec.repetitions = 1;
                }
                Secondary::Skip => {
                    results.skipped.push(report::Skipped::point(&spec));
                    continue;
                }
            }
        }
        planned.push(spec);
    }
    planned
}

/// The short windows of a secondary point under `--secondary short` (run once).
fn shorten(args: &BenchArgs, config: &mut PodConfig) {
    config.warmup_ms = args.short_warmup_ms;
    config.measure_ms = args.short_measure_ms;
}

fn base(args: &BenchArgs, workload: WorkloadConfig, protocol: Protocol, log_dir: &std::path::Path) -> PodConfig {
    let mut config = PodConfig::new(workload);
    config.hosts = args.hosts;
    config.protocol = protocol;
    config.coherence = CoherenceBackend::X86Flush;
    config.hwcc_budget_bytes = MAIN_BUDGET_BYTES;
    config.swcc_bytes_per_host = 1 << 30;
    config.warmup_ms = args.warmup_ms;
    config.measure_ms = args.measure_ms;
    config.log_dir = Some(log_dir.to_path_buf());
    config.epoch_ms = 10;
    config.pre_migrate = protocol == Protocol::Tigon;
    // The comparison points run without checkpoints, as Tigon's runs do (it has none); the
    // recovery point measures them.
    config.checkpoint_log_bytes = 0;
    config
}

fn tpcc(args: &BenchArgs, new_order: u32, payment: u32) -> WorkloadConfig {
    WorkloadConfig::Tpcc(if args.small_warehouses {
        TpccConfig::small(new_order, payment)
    } else {
        TpccConfig::standard(new_order, payment)
    })
}

fn ycsb(args: &BenchArgs, read_percent: u32, cross_percent: u32, theta: f64) -> WorkloadConfig {
    WorkloadConfig::Ycsb(YcsbConfig {
        keys_per_host: args.keys_per_host,
        value_bytes: 1000,
        ops_per_txn: 10,
        theta,
        read_percent,
        cross_percent,
    })
}

fn pick<T: Copy>(args: &BenchArgs, all: &[T], quick: &[usize]) -> Vec<T> {
    if args.quick {
        quick.iter().map(|&index| all[index]).collect()
    } else {
        all.to_vec()
    }
}

/// The points of one sweep.
fn specs(
    args: &BenchArgs,
    sweep: Sweep,
    log_root: &std::path::Path,
    results: &mut report::Results,
) -> anyhow::Result<Vec<Spec>> {
    let logs = log_root.join(format!("{sweep:?}").to_lowercase());
    Ok(match sweep {
        Sweep::Tpcc => tpcc_specs(args, &logs),
        Sweep::Ycsb => ycsb_specs(args, &logs),
        Sweep::Budget => budget_specs(args, &logs, results)?,
        Sweep::Swcc => swcc_specs(args, &logs),
        Sweep::Shortcut => shortcut_specs(args, &logs),
        Sweep::Epoch => epoch_specs(args, &logs),
        Sweep::Pinned => pinned_specs(args, &logs),
        Sweep::Recovery => unreachable!("the recovery point is not a sweep of specs"),
    })
}

fn spec(
    args: &BenchArgs,
    sweep: Sweep,
    panel: &'static str,
    series: impl Into<String>,
    x: impl Into<String>,
    config: PodConfig,
) -> Spec {
    Spec { sweep, panel, series: series.into(), x: x.into(), config, repetitions: args.repetitions }
}

fn tpcc_specs(args: &BenchArgs, logs: &std::path::Path) -> Vec<Spec> {
    let mut specs = Vec::new();
    for (new_order, payment) in pick(args, &TPCC_REMOTE, &[0, 3]) {
        for protocol in PROTOCOLS {
            let mut config = base(args, tpcc(args, new_order, payment), protocol, logs);
            // Tigon pre-migrates CUSTOMER and STOCK ("NonPart") except at 0% remote.
            config.pre_migrate &= new_order > 0;
            specs.push(spec(args, Sweep::Tpcc, "tpcc", protocol.label(), format!("{new_order}/{payment}"), config));
        }
    }
    specs
}

fn ycsb_specs(args: &BenchArgs, logs: &std::path::Path) -> Vec<Spec> {
    let mut specs = Vec::new();
    for cross in pick(args, &YCSB_CROSS, &[0, 3]) {
        for protocol in PROTOCOLS {
            let mut config = base(args, ycsb(args, 95, cross, 0.7), protocol, logs);
            config.pre_migrate &= cross > 0;
            specs.push(spec(args, Sweep::Ycsb, "ycsb", protocol.label(), format!("{cross}%"), config));
        }
    }
    let mixes: &[(u32, f64, &str)] =
        &[(100, 0.7, "100/0"), (50, 0.7, "50/50"), (0, 0.7, "0/100"), (50, 0.99, "50/50 θ0.99")];
    for &(read, theta, label) in if args.quick { &mixes[1..2] } else { mixes } {
        for protocol in PROTOCOLS {
            let config = base(args, ycsb(args, read, 100, theta), protocol, logs);
            specs.push(spec(args, Sweep::Ycsb, "ycsb_mix", protocol.label(), label, config));
        }
    }
    specs
}

fn swcc_specs(args: &BenchArgs, logs: &std::path::Path) -> Vec<Spec> {
    let mut specs = Vec::new();
    for (panel, workload) in [("swcc_ycsb", ycsb(args, 95, 100, 0.7)), ("swcc_tpcc", tpcc(args, 60, 90))] {
        for variant in
            [SwccProtocol::WriteThrough, SwccProtocol::NoSharedReader, SwccProtocol::NonTemporal, SwccProtocol::NoSwcc]
        {
            let mut config = base(args, workload.clone(), Protocol::Tigon, logs);
            config.swcc = variant;
            specs.push(spec(args, Sweep::Swcc, panel, panel_workload(panel), format!("{variant:?}"), config));
        }
    }
    specs
}

fn shortcut_specs(args: &BenchArgs, logs: &std::path::Path) -> Vec<Spec> {
    let mut specs = Vec::new();
    for workload in [tpcc(args, 60, 90), ycsb(args, 95, 100, 0.7)] {
        for shortcut in [true, false] {
            let mut config = base(args, workload.clone(), Protocol::Tigon, logs);
            config.shortcut = shortcut;
            specs.push(spec(
                args,
                Sweep::Shortcut,
                "shortcut",
                workload.label(),
                if shortcut { "on" } else { "off" },
                config,
            ));
        }
    }
    specs
}

fn epoch_specs(args: &BenchArgs, logs: &std::path::Path) -> Vec<Spec> {
    let mut specs = Vec::new();
    for epoch in [None, Some(1), Some(10), Some(20), Some(50)] {
        let mut config = base(args, tpcc(args, 60, 90), Protocol::Tigon, logs);
        match epoch {
            Some(ms) => config.epoch_ms = ms,
            None => config.log_dir = None,
        }
        let x = epoch.map_or("no log".to_string(), |ms| format!("{ms} ms"));
        specs.push(spec(args, Sweep::Epoch, "epoch", "TPC-C 60/90", x, config));
    }
    specs
}

/// The point of the YCSB sweep (Tigon-style, 95/5, 100% cross) again, with every host process
/// pinned to CPU 0.
fn pinned_specs(args: &BenchArgs, logs: &std::path::Path) -> Vec<Spec> {
    let mut config = base(args, ycsb(args, 95, 100, 0.7), Protocol::Tigon, logs);
    config.pin_cpu = Some(0);
    vec![spec(args, Sweep::Pinned, "pinned", Protocol::Tigon.label(), "100%", config)]
}

/// The recovery point with checkpoints (a headline point) and, as `--secondary` says, without.
fn recovery_runs(
    args: &BenchArgs,
    log_root: &std::path::Path,
    results: &mut report::Results,
) -> Vec<recovery::RecoveryRun> {
    let mut runs = Vec::new();
    // A checkpoint every 64 MiB of log (the default is 256 MiB) so that a 25 s run takes several.
    for (label, checkpoint_log_bytes) in [("checkpoints every 64 MiB of log", 64 << 20), ("no checkpoints", 0)] {
        let dir = log_root.join(format!("recovery-{checkpoint_log_bytes}"));
        let mut config = base(args, ycsb(args, 95, 100, 0.7), Protocol::Tigon, &dir);
        config.checkpoint_log_bytes = checkpoint_log_bytes;
        let headline = checkpoint_log_bytes > 0;
        match args.secondary {
            Secondary::Short if !headline => shorten(args, &mut config),
            Secondary::Skip if !headline => {
                results.skipped.push(report::Skipped { panel: "recovery".into(), x: label.into() });
                continue;
            }
            _ => {}
        }
        let run = recovery::crash_and_recover(label, config, &dir);
        eprintln!(
            "  Recovery {label}: {} ms, {} MiB of log on disk, acked {} lost {}{}",
            run.recovery_ms,
            run.log_bytes_on_disk >> 20,
            run.acked_recorded,
            run.acked_lost,
            run.error.as_deref().map(|e| format!(" — {e}")).unwrap_or_default()
        );
        let _ = std::fs::remove_dir_all(&dir);
        runs.push(run);
    }
    runs
}

fn panel_workload(panel: &str) -> &'static str {
    if panel.ends_with("tpcc") {
        "TPC-C 60/90"
    } else {
        "YCSB 95/5 100%"
    }
}

/// Budget sweep: one unconstrained run per workload gives the HWcc footprint; the points are
/// fractions of it. Tigon's budget sweeps ran 120 s with 60 s of warm-up and no pre-migration;
/// our seconds-long runs pre-migrate instead (until the budget is full) to start near steady state.
fn budget_specs(args: &BenchArgs, logs: &std::path::Path, results: &mut report::Results) -> anyhow::Result<Vec<Spec>> {
    let mut specs = Vec::new();
    for workload in [tpcc(args, 60, 90), ycsb(args, 95, 100, 0.7)] {
        let mut config = base(args, workload.clone(), Protocol::Tigon, logs);
        config.hwcc_budget_bytes = UNCONSTRAINED_BUDGET_BYTES;
        if args.secondary == Secondary::Short {
            shorten(args, &mut config);
        }
        let report = Pod::run(config.clone()).context("unconstrained run of the budget sweep")?;
        let footprint = report.per_host.iter().map(|host| host.hwcc_peak_bytes).max().unwrap_or(0) * args.hosts as u64;
        results.footprints.push((workload.label(), footprint));
        for fraction in pick(args, &BUDGET_FRACTIONS, &[0, 2, 4]) {
            let mut point = config.clone();
            point.hwcc_budget_bytes = ((footprint as f64 * fraction) as u64).max(1);
            specs.push(spec(
                args,
                Sweep::Budget,
                "budget",
                workload.label(),
                format!("{:.0}%", fraction * 100.0),
                point,
            ));
        }
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn planned(flags: &[&str]) -> (Vec<Spec>, report::Results) {
        let args = Cli::parse_from(std::iter::once("bench").chain(flags.iter().copied())).args;
        let mut results = report::Results::new(&args);
        let logs = std::path::Path::new("unused");
        let mut kept = Vec::new();
        for sweep in [Sweep::Tpcc, Sweep::Ycsb, Sweep::Swcc, Sweep::Pinned] {
            let specs = specs(&args, sweep, logs, &mut results).expect("specs of a sweep without runs");
            kept.extend(plan(&args, specs, &mut results));
        }
        (kept, results)
    }

    #[test]
    fn secondary_skip_keeps_exactly_the_headline_points_at_full_length() {
        // Goal: the short quiet run keeps every point a headline figure comes from, at the
        // design's length, and lists what it leaves out. Method: plan the sweeps without running.
        let (kept, results) = planned(&["--secondary", "skip"]);
        let names: Vec<String> = kept.iter().map(|spec| format!("{} {} {}", spec.panel, spec.series, spec.x)).collect();
        assert_eq!(kept.len(), 4 * 3 + 2 * 3 + 2 + 1, "{names:#?}");
        for spec in &kept {
            assert_eq!((spec.config.warmup_ms, spec.config.measure_ms, spec.repetitions), (5000, 20_000, 3));
        }
        let tigon = Protocol::Tigon.label();
        for (panel, series, x) in [
            ("tpcc", tigon, "0/0"),
            ("tpcc", Protocol::Occ.label(), "60/90"),
            ("ycsb", Protocol::Ds2pl.label(), "100%"),
            ("swcc_ycsb", "YCSB 95/5 100%", "NoSwcc"),
            ("pinned", tigon, "100%"),
        ] {
            assert!(names.contains(&format!("{panel} {series} {x}")), "{panel} {series} {x} missing");
        }
        let skipped: Vec<String> = results.skipped.iter().map(|s| format!("{} {}", s.panel, s.x)).collect();
        assert!(skipped.contains(&"ycsb 20%".to_string()) && skipped.contains(&"swcc_tpcc WriteThrough".to_string()));
        assert!(!skipped.iter().any(|s| s.starts_with("tpcc") || s == "ycsb 100%"), "{skipped:?}");
    }

    #[test]
    fn secondary_short_runs_the_other_points_once_with_the_short_windows() {
        let (kept, results) =
            planned(&["--secondary", "short", "--short-warmup-ms", "100", "--short-measure-ms", "300"]);
        assert!(results.skipped.is_empty());
        let short: Vec<&Spec> = kept.iter().filter(|spec| !is_headline(spec)).collect();
        assert_eq!(short.len(), 2 * 3 + 4 * 3 + 2 + 4, "YCSB 20/50%, the mixes, two SWcc variants, SWcc on TPC-C");
        for spec in short {
            assert_eq!((spec.config.warmup_ms, spec.config.measure_ms, spec.repetitions), (100, 300, 1));
        }
    }
}
