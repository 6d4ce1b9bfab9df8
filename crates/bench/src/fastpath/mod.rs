//! `bypass bench fastpath` (issue 4): the kernel fast path against direct PostgreSQL, PgBouncer
//! (one process and two with so_reuseport) and Bypass in user space, on pgbench's and YCSB-like
//! workloads, plus the added latency at 1 client and the cost of mirroring.
//!
//! It is the `bench pooler` machinery ([`crate::pooler::drive`]: fresh pooler per run, pgbench
//! with per-transaction logs, steady-state CPU from `/proc/stat`) with this issue's matrix and
//! document. What it adds: BPF run time per verdict program and per transaction
//! ([`crate::bpf_stats`]), the share of request and answer bytes the kernel carried, CPU per
//! transaction without the load generator, the YCSB table, the mirrored contenders and the
//! "Done when" tables of issues 4 and 24.
//!
//! ```text
//!   plan = added latency: select1 × {1, 10} clients × {direct, PgBouncer, Bypass, Bypass kernel}
//!        + matrix:        workloads × clients × contenders (direct only ≤ 100 clients)
//!        + direct:        workloads × pool-size clients (CPU per transaction without a pooler)
//!        + --mirroring:   simple-update × {10, 100} × {Bypass, + mirror, Bypass kernel, + mirror}
//!        (a run already in the plan is not repeated)
//!   × --generator: the plan with pgbench, then the same with the epoll generator (select1 and
//!        ycsb-* only; its cost per transaction does not grow with the clients as pgbench's does)
//!   drive(plan) ─► FastpathDocument (one FastpathResults per generator)
//!               ─► fastpath.json / fastpath.md / fastpath.png after every run
//! ```
//!
//! PostgreSQL gets max_connections 150 so that 100 direct clients fit with headroom; the poolers
//! (20 servers each, 40 for PgBouncer ×2 or a mirrored pool) are started fresh per run and
//! stopped after, so their servers never coexist with the direct clients.

mod markdown;
mod report;

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::pooler::measure::RunSpec;
use crate::pooler::report::{Matrix, Results};
use crate::pooler::{self, Contender, Generator, Setup, Workload};
use report::FastpathDocument;

/// PostgreSQL settings of `bench fastpath`: room for 100 direct clients plus headroom, and
/// shared_buffers that hold pgbench's scale-10 tables and the YCSB table of both databases.
const PG_MAX_CONNECTIONS: u32 = 150;
const PG_SHARED_BUFFERS_MB: u32 = 1024;

/// Direct PostgreSQL runs only up to this many clients.
pub const DIRECT_CLIENTS_MAX: u32 = 100;

/// Connections kept free for psql probes and superuser_reserved_connections when checking the
/// pool size against max_connections.
const CONNECTION_HEADROOM: u32 = 10;

/// The client counts of the added-latency runs: one client (every query waits for the previous
/// one) and ten (below the pool size, so no client waits for a server).
pub const ADDED_LATENCY_CLIENTS: [u32; 2] = [1, 10];

/// The workload of the added-latency runs.
pub const ADDED_LATENCY_WORKLOAD: Workload = Workload::Select1;

/// The workload of the mirroring runs: writes, so the shadow really does work.
pub const MIRROR_WORKLOAD: Workload = Workload::SimpleUpdate;

/// Arguments of `bypass bench fastpath`.
#[derive(clap::Args, Debug, Clone)]
pub struct FastpathBenchArgs {
    /// Client counts, comma-separated. Direct PostgreSQL runs only at counts ≤ 100.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    pub clients: Vec<u32>,
    /// Workloads, comma-separated: select1, select-only (pgbench -S), simple-update (pgbench -N),
    /// ycsb-a (50/50 read/update), ycsb-b (95/5), ycsb-c (read only); all with -M simple.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "select1,select-only,simple-update,ycsb-a,ycsb-b,ycsb-c"
    )]
    pub workloads: Vec<Workload>,
    /// Contenders, comma-separated: direct, pgbouncer, pgbouncer2 (two processes with
    /// so_reuseport), bypass (fast_path = "user"), bypass-kernel (fast_path = "kernel").
    #[arg(long, value_enum, value_delimiter = ',', default_value = "direct,pgbouncer,pgbouncer2,bypass,bypass-kernel")]
    pub contenders: Vec<Contender>,
    /// Seconds each pgbench run lasts (-T, which includes the connection phase).
    #[arg(long, default_value_t = 15)]
    pub duration_s: u32,
    /// Runs per (workload, clients, contender); contenders are interleaved within a cell and the
    /// median is reported.
    #[arg(long, default_value_t = 1)]
    pub repetitions: u32,
    /// Directory for fastpath.json, fastpath.md and fastpath.png.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Also measure mirroring: pgbench -N with and without `mirror = "shadow"`, in user space
    /// and in the kernel (needs a pooler that accepts `mirror`).
    #[arg(long)]
    pub mirroring: bool,
    /// Client counts of the mirroring runs, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    pub mirror_clients: Vec<u32>,
    /// Skip the 1-client `SELECT 1` runs that measure the latency added over direct PostgreSQL.
    #[arg(long)]
    pub skip_added_latency: bool,
    /// Print the runs in order and the time estimate, then stop without running anything.
    #[arg(long)]
    pub plan_only: bool,
    /// Server connections per pool, the same for every pooler.
    #[arg(long, default_value_t = 20)]
    pub pool_size: u32,
    /// pgbench threads (-j), capped at the client count; also the epoll generator's threads.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// The load generator: pgbench, epoll (the epoll generator of bypass-lab, whose cost per
    /// transaction does not grow with the clients; select1 and ycsb-* only) or both (every run
    /// of the plan with pgbench, then the same with epoll; one set of tables per generator).
    #[arg(long, value_enum, default_value = "pgbench")]
    pub generator: GeneratorChoice,
}

/// `--generator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GeneratorChoice {
    Pgbench,
    Epoll,
    Both,
}

impl GeneratorChoice {
    pub fn generators(self) -> Vec<Generator> {
        match self {
            GeneratorChoice::Pgbench => vec![Generator::Pgbench],
            GeneratorChoice::Epoll => vec![Generator::Epoll],
            GeneratorChoice::Both => vec![Generator::Pgbench, Generator::Epoll],
        }
    }
}

/// Runs the benchmark and writes its results under `args.out`.
pub fn run(args: FastpathBenchArgs, bypass_exe: &Path) -> Result<()> {
    let args = validated(args)?;
    let setup = setup(&args);
    let plan = plan(&args);
    if args.plan_only {
        print!("{}", plan_text(&setup, &plan));
        return Ok(());
    }
    pooler::drive(&setup, &plan, bypass_exe, &args.out, |postgres, load_average| {
        let base = Results::new(&setup, matrix(&args), postgres, bypass_exe, load_average)?;
        Ok(FastpathDocument::new(base, &args))
    })
}

fn setup(args: &FastpathBenchArgs) -> Setup {
    Setup {
        benchmark: "fastpath",
        duration_s: args.duration_s,
        repetitions: args.repetitions,
        pool_size: args.pool_size,
        threads: args.threads,
        pg_max_connections: PG_MAX_CONNECTIONS,
        pg_shared_buffers_mb: PG_SHARED_BUFFERS_MB,
        direct_clients_max: DIRECT_CLIENTS_MAX,
    }
}

/// The tables' rows and columns, and the issue's ratios: Bypass kernel over each PgBouncer shape
/// and over Bypass in user space, and the same for the kernel path with queueing when it runs.
fn matrix(args: &FastpathBenchArgs) -> Matrix {
    let peers = [Contender::Pgbouncer, Contender::Pgbouncer2, Contender::Bypass];
    let mut ratio_pairs: Vec<(Contender, Contender)> = peers.map(|peer| (Contender::BypassKernel, peer)).to_vec();
    if args.contenders.contains(&Contender::BypassKernelQueue) {
        ratio_pairs.extend(peers.map(|peer| (Contender::BypassKernelQueue, peer)));
    }
    Matrix {
        workloads: args.workloads.clone(),
        clients: args.clients.clone(),
        contenders: args.contenders.clone(),
        ratio_pairs,
    }
}

/// Checks the arguments, dropping duplicates while keeping the given order.
fn validated(mut args: FastpathBenchArgs) -> Result<FastpathBenchArgs> {
    pooler::dedup_keep_order(&mut args.clients);
    pooler::dedup_keep_order(&mut args.workloads);
    pooler::dedup_keep_order(&mut args.contenders);
    pooler::dedup_keep_order(&mut args.mirror_clients);
    if args.clients.is_empty() || args.workloads.is_empty() || args.contenders.is_empty() {
        bail!("--clients, --workloads and --contenders must each name at least one value");
    }
    if args.generator == GeneratorChoice::Epoll && !args.workloads.iter().any(|&w| Generator::Epoll.runs(w)) {
        bail!("the epoll generator runs select1 and ycsb-* only: name one of them in --workloads");
    }
    if args.mirroring && args.mirror_clients.is_empty() {
        bail!("--mirror-clients must name at least one count with --mirroring");
    }
    let all_clients: Vec<u32> = args.clients.iter().chain(&args.mirror_clients).copied().collect();
    pooler::validate_common(&all_clients, args.duration_s, args.repetitions, args.threads)?;
    let pool_size_max = (PG_MAX_CONNECTIONS - CONNECTION_HEADROOM) / 2;
    if args.pool_size == 0 || args.pool_size > pool_size_max {
        bail!("--pool-size must be 1..={pool_size_max} (PgBouncer ×2 and a mirrored pool open two pools)");
    }
    Ok(args)
}

/// Every run in execution order: the plan of one generator (see [`generator_plan`]) for each
/// generator chosen, keeping the workloads that generator runs.
fn plan(args: &FastpathBenchArgs) -> Vec<RunSpec> {
    let runs = generator_plan(args);
    let mut plan = Vec::new();
    for generator in args.generator.generators() {
        let runnable = runs.iter().filter(|run| generator.runs(run.workload));
        plan.extend(runnable.map(|run| RunSpec { generator, ..*run }));
    }
    plan
}

/// The added-latency runs, the matrix, then the mirroring runs; a run already planned (same
/// workload, clients, contender, repetition) is not repeated.
fn generator_plan(args: &FastpathBenchArgs) -> Vec<RunSpec> {
    let repetitions = args.repetitions;
    let mut runs = Vec::new();
    if !args.skip_added_latency {
        let contenders =
            chosen(args, &[Contender::Direct, Contender::Pgbouncer, Contender::Bypass, Contender::BypassKernel]);
        runs.extend(pooler::matrix_plan(
            &[ADDED_LATENCY_WORKLOAD],
            &ADDED_LATENCY_CLIENTS,
            &contenders,
            repetitions,
            DIRECT_CLIENTS_MAX,
        ));
    }
    runs.extend(pooler::matrix_plan(&args.workloads, &args.clients, &args.contenders, repetitions, DIRECT_CLIENTS_MAX));
    // Direct PostgreSQL with as many clients as the pool has servers: the CPU a transaction
    // costs with no pooler at all, beside the poolers' at any client count.
    let direct = chosen(args, &[Contender::Direct]);
    runs.extend(pooler::matrix_plan(&args.workloads, &[args.pool_size], &direct, repetitions, DIRECT_CLIENTS_MAX));
    if args.mirroring {
        let contenders = mirror_contenders(args);
        let workloads = [MIRROR_WORKLOAD];
        runs.extend(pooler::matrix_plan(
            &workloads,
            &args.mirror_clients,
            &contenders,
            repetitions,
            DIRECT_CLIENTS_MAX,
        ));
    }
    let mut seen = Vec::with_capacity(runs.len());
    runs.retain(|run| {
        let key = (run.workload, run.clients, run.contender, run.repetition);
        let fresh = !seen.contains(&key);
        seen.push(key);
        fresh
    });
    runs
}

/// The plan as `--plan-only` prints it: one line per run, then the estimate.
fn plan_text(setup: &Setup, plan: &[RunSpec]) -> String {
    let mut text = String::new();
    for (index, run) in plan.iter().enumerate() {
        let line = format!(
            "{:>3}. {} clients={} {} rep={} {}\n",
            index + 1,
            run.workload.name(),
            run.clients,
            run.contender.name(),
            run.repetition + 1,
            run.generator.name()
        );
        text.push_str(&line);
    }
    let minutes = setup.estimate_s(plan).div_ceil(60);
    text.push_str(&format!("{} runs of {} s, roughly {minutes} min\n", plan.len(), setup.duration_s));
    text
}

/// `wanted` in its order, keeping those the user asked for.
fn chosen(args: &FastpathBenchArgs, wanted: &[Contender]) -> Vec<Contender> {
    wanted.iter().copied().filter(|contender| args.contenders.contains(contender)).collect()
}

/// Each Bypass mode the user asked for, without and with a mirror.
pub fn mirror_contenders(args: &FastpathBenchArgs) -> Vec<Contender> {
    let mut contenders = Vec::new();
    if args.contenders.contains(&Contender::Bypass) {
        contenders.extend([Contender::Bypass, Contender::BypassMirror]);
    }
    if args.contenders.contains(&Contender::BypassKernel) {
        contenders.extend([Contender::BypassKernel, Contender::BypassKernelMirror]);
    }
    contenders
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: FastpathBenchArgs,
    }

    pub(super) fn parse(argv: &[&str]) -> FastpathBenchArgs {
        Cli::try_parse_from(std::iter::once("fastpath").chain(argv.iter().copied())).expect("valid arguments").args
    }

    // Goal: the defaults are the issue's matrix; method: parse an empty command line.
    #[test]
    fn defaults_are_the_issue_matrix() {
        let args = parse(&[]);
        assert_eq!(args.clients, vec![100, 1000, 10_000]);
        let workloads = [
            Workload::Select1,
            Workload::SelectOnly,
            Workload::SimpleUpdate,
            Workload::YcsbA,
            Workload::YcsbB,
            Workload::YcsbC,
        ];
        assert_eq!(args.workloads, workloads);
        let contenders = [
            Contender::Direct,
            Contender::Pgbouncer,
            Contender::Pgbouncer2,
            Contender::Bypass,
            Contender::BypassKernel,
        ];
        assert_eq!(args.contenders, contenders);
        assert_eq!((args.duration_s, args.repetitions, args.pool_size, args.threads), (15, 1, 20, 2));
        assert_eq!(args.generator, GeneratorChoice::Pgbench, "today's behaviour by default");
        assert_eq!(
            (args.mirroring, args.mirror_clients.clone(), args.skip_added_latency),
            (false, vec![10, 100], false)
        );
        assert!(!args.plan_only);
        assert_eq!(args.out, PathBuf::from("bench/results"));
        // The mirrored contenders are internal: they cannot be named on the command line.
        let cli = Cli::try_parse_from(["fastpath", "--contenders", "bypass-mirror"]);
        assert!(cli.is_err());
    }

    // Goal: the plan runs the added-latency cells first, the matrix with direct only ≤ 100
    // clients, direct at pool-size clients, then mirroring without repeating runs already
    // planned; method: plan a small matrix with --mirroring and list it.
    #[test]
    fn plan_adds_latency_and_mirroring_cells_once() {
        let argv =
            ["--clients", "100,1000", "--workloads", "simple-update", "--mirroring", "--mirror-clients", "10,100"];
        let args = validated(parse(&argv)).expect("valid");
        let order: Vec<(&str, u32, &str)> =
            plan(&args).iter().map(|run| (run.workload.name(), run.clients, run.contender.name())).collect();
        let expected = vec![
            ("select1", 1, "direct"),
            ("select1", 1, "pgbouncer"),
            ("select1", 1, "bypass"),
            ("select1", 1, "bypass-kernel"),
            ("select1", 10, "direct"),
            ("select1", 10, "pgbouncer"),
            ("select1", 10, "bypass"),
            ("select1", 10, "bypass-kernel"),
            ("simple-update", 100, "direct"),
            ("simple-update", 100, "pgbouncer"),
            ("simple-update", 100, "pgbouncer2"),
            ("simple-update", 100, "bypass"),
            ("simple-update", 100, "bypass-kernel"),
            ("simple-update", 1000, "pgbouncer"),
            ("simple-update", 1000, "pgbouncer2"),
            ("simple-update", 1000, "bypass"),
            ("simple-update", 1000, "bypass-kernel"),
            ("simple-update", 20, "direct"),
            ("simple-update", 10, "bypass"),
            ("simple-update", 10, "bypass-mirror"),
            ("simple-update", 10, "bypass-kernel"),
            ("simple-update", 10, "bypass-kernel-mirror"),
            ("simple-update", 100, "bypass-mirror"),
            ("simple-update", 100, "bypass-kernel-mirror"),
        ];
        assert_eq!(order, expected);
        let quiet =
            validated(parse(&["--clients", "100", "--workloads", "ycsb-b", "--skip-added-latency"])).expect("valid");
        let direct_at_pool_size = |run: &RunSpec| run.contender == Contender::Direct && run.clients == 20;
        assert!(plan(&quiet)
            .iter()
            .all(|run| run.workload == Workload::YcsbB && (run.clients == 100 || direct_at_pool_size(run))));
        let user_only = parse(&["--contenders", "pgbouncer,bypass"]);
        assert_eq!(mirror_contenders(&user_only), vec![Contender::Bypass, Contender::BypassMirror]);
    }

    // Goal: `--generator both` runs the pgbench plan, then the same runs with the epoll generator
    // where it can (not select-only), and `epoll` alone keeps only those; method: plan both.
    #[test]
    fn generators_repeat_the_plan() {
        let argv = ["--clients", "1000", "--workloads", "select1,select-only", "--skip-added-latency"];
        let both = validated(parse(&[&argv[..], &["--generator", "both"]].concat())).expect("valid");
        let order: Vec<(&str, &str, &str)> =
            plan(&both).iter().map(|run| (run.generator.name(), run.workload.name(), run.contender.name())).collect();
        let pgbench = order.iter().filter(|run| run.0 == "pgbench").count();
        assert_eq!(pgbench, 2 * 4 + 2, "two workloads at 1,000 clients (4 poolers) and direct at 20");
        assert!(order[..pgbench].iter().all(|run| run.0 == "pgbench"), "pgbench's runs come first: {order:?}");
        let epoll: Vec<_> = order[pgbench..].iter().map(|run| (run.1, run.2)).collect();
        let expected = ["pgbouncer", "pgbouncer2", "bypass", "bypass-kernel", "direct"].map(|name| ("select1", name));
        assert_eq!(epoll, expected.to_vec());
        let only = validated(parse(&[&argv[..], &["--generator", "epoll"]].concat())).expect("valid");
        assert!(plan(&only).iter().all(|run| run.generator == Generator::Epoll && run.workload == Workload::Select1));
        assert!(validated(parse(&["--workloads", "select-only", "--generator", "epoll"])).is_err());
    }

    // Goal: nonsense arguments are refused before anything starts; method: a few bad lines.
    #[test]
    fn validation_rejects_bad_arguments() {
        assert!(validated(parse(&["--clients", "0"])).is_err());
        assert!(validated(parse(&["--clients", "20000"])).is_err());
        assert!(validated(parse(&["--mirroring", "--mirror-clients", "0"])).is_err());
        assert!(validated(parse(&["--duration-s", "1"])).is_err());
        assert!(validated(parse(&["--repetitions", "0"])).is_err());
        assert!(validated(parse(&["--pool-size", "71"])).is_err());
        assert!(validated(parse(&["--pool-size", "70"])).is_ok());
        assert!(validated(parse(&["--threads", "0"])).is_err());
        let deduped = validated(parse(&["--clients", "100,100,10"])).expect("valid");
        assert_eq!(deduped.clients, vec![100, 10]);
    }

    // Goal: the default matrix fits the ≈35-minute budget at 15 s per run; method: estimate
    // the default plan (and check mirroring adds only its new runs).
    #[test]
    fn default_plan_fits_the_time_budget() {
        let args = validated(parse(&[])).expect("valid");
        let runs = plan(&args);
        // 6 workloads × (5 at 100 clients + 4 at 1,000 + 4 at 10,000 + direct at 20) + 8
        // added-latency runs (4 contenders at 1 and 10 clients).
        assert_eq!(runs.len(), 6 * 14 + 8);
        let minutes = setup(&args).estimate_s(&runs).div_ceil(60);
        assert!(minutes <= 35, "default plan estimated at {minutes} min");
        let mirrored = validated(parse(&["--mirroring"])).expect("valid");
        assert_eq!(plan(&mirrored).len(), runs.len() + 6, "bypass and bypass-kernel at 100 clients are reused");
        let text = plan_text(&setup(&args), &runs);
        assert!(text.starts_with("  1. select1 clients=1 direct rep=1 pgbench\n"), "{text}");
        assert!(text.ends_with(&format!("92 runs of 15 s, roughly {minutes} min\n")), "{text}");
    }
}
