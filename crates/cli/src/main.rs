//! The `bypass` binary: subcommands that wire the crates together. No logic lives here.

mod logging;
mod up;

use std::path::PathBuf;

use anyhow::{Context, Result};
use bypass_pooler::{Config, Proxy, ValidConfig};
use clap::{Parser, Subcommand};

/// Bypass: a PostgreSQL data path with the layers taken out.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as `text` (colour only on a terminal) or `json` (one object per line);
    /// default: BYPASS_LOG_FORMAT, else text. BYPASS_LOG (or RUST_LOG) sets the level.
    #[arg(long, global = true, value_enum)]
    log_format: Option<logging::Format>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the connection pooler with a configuration file. SIGHUP reloads the file, SIGTERM
    /// stops after running transactions (shutdown_timeout_ms), SIGINT stops at once.
    Proxy {
        /// Path to bypass.toml.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the configuration reference (docs/config.md) generated from the code.
    ConfigReference,
    /// Validate a configuration file and list every problem in it.
    CheckConfig {
        /// Path to bypass.toml.
        file: PathBuf,
    },
    /// Translate a pgbouncer.ini into an equivalent bypass.toml and list what has no equivalent.
    ImportPgbouncer(bypass_cli::pooler::ImportArgs),
    /// Start a private PostgreSQL 15 under ./.bypass and the pooler in front of it on port 6432.
    Up(up::UpArgs),
    /// Run a benchmark and write its results under bench/results/.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// The compiled columnar engine (serve, load, query).
    #[command(subcommand)]
    Engine(bypass_cli::engine::Command),
    /// The multi-host pod store (start hosts, run workloads, recover).
    #[command(subcommand)]
    Pod(bypass_cli::pod::Command),
    /// The query dispatcher with TCP hand-over.
    #[command(subcommand)]
    Dispatch(bypass_cli::dispatch::Command),
    /// The agent beside a backend that receives handed-over client connections.
    Agent(bypass_cli::dispatch::AgentArgs),
    /// The network-namespace lab for the dispatcher (clients, dispatcher, backends).
    #[command(subcommand)]
    Lab(bypass_cli::dispatch::LabCommand),
    /// The pooler's kernel fast path.
    #[command(subcommand)]
    Fastpath(FastpathCommand),
}

#[derive(Subcommand)]
enum FastpathCommand {
    /// Loaded verdict programs (runs, ns per run), their maps and the kernel's counters (root).
    Status,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// pgbench through direct PostgreSQL, PgBouncer (1 and 2 processes) and Bypass.
    Pooler(bypass_bench::pooler::PoolerBenchArgs),
    /// The kernel fast path (issue 4): direct PostgreSQL, PgBouncer (1 and 2 processes), Bypass
    /// user and Bypass kernel on SELECT 1, pgbench -S/-N and YCSB-like A/B/C, with BPF cost and
    /// (--mirroring) the cost of mirroring.
    Fastpath(bypass_bench::fastpath::FastpathBenchArgs),
    /// The engine against DuckDB, DataFusion and Polars, and the runtime experiments.
    Engine(bypass_cli::engine::BenchArgs),
    /// The engine as a server: first-row latency of a large scan, `select 1` while another
    /// client streams, resident memory against DuckDB, memory after DROP TABLE.
    EngineServing(bypass_bench::engine::serving::ServingArgs),
    /// The engine on PostgreSQL's own regression files (select, union, case, join, aggregates,
    /// subselect, window) with a real PostgreSQL 15 as the oracle: share run and matched.
    EngineRegress(bypass_bench::engine::regress::RegressArgs),
    /// The pod store against 2PL+2PC and OCC on TPC-C and YCSB.
    Pod(bypass_cli::pod::BenchArgs),
    /// The dispatcher (relay, hand-over, hybrid) against HAProxy in the lab.
    Dispatch(bypass_cli::dispatch::BenchArgs),
}

/// Errors end the process with their message and exit code 1, never a Rust backtrace: they are
/// the operator's to read (a configuration problem, a port in use), not a crash.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bypass: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match cli.command {
        Command::Proxy { config } => run_proxy(load(&config)?, config),
        Command::CheckConfig { file } => bypass_cli::pooler::check_config(&file),
        Command::ImportPgbouncer(args) => bypass_cli::pooler::import(args),
        Command::ConfigReference => {
            print!("{}", bypass_pooler::config_doc::reference());
            Ok(())
        }
        Command::Up(args) => up::run(args),
        Command::Bench { which: BenchCommand::Pooler(args) } => {
            bypass_bench::pooler::run(args, &std::env::current_exe()?)
        }
        Command::Fastpath(FastpathCommand::Status) => {
            print!("{}", bypass_fastpath::status::status()?.render());
            Ok(())
        }
        Command::Bench { which: BenchCommand::Fastpath(args) } => {
            bypass_bench::fastpath::run(args, &std::env::current_exe()?)
        }
        Command::Bench { which: BenchCommand::Engine(args) } => bypass_cli::engine::bench(args),
        Command::Bench { which: BenchCommand::EngineServing(args) } => bypass_cli::engine::bench_serving(&args),
        Command::Bench { which: BenchCommand::EngineRegress(args) } => bypass_cli::engine::bench_regress(&args),
        Command::Bench { which: BenchCommand::Pod(args) } => bypass_cli::pod::bench(args),
        Command::Engine(command) => bypass_cli::engine::run(command),
        Command::Pod(command) => bypass_cli::pod::run(command),
        Command::Bench { which: BenchCommand::Dispatch(args) } => bypass_cli::dispatch::bench(args),
        Command::Dispatch(command) => bypass_cli::dispatch::run(command),
        Command::Agent(args) => bypass_cli::dispatch::agent(args),
        Command::Lab(command) => bypass_cli::dispatch::lab(command),
    }
}

fn load(path: &std::path::Path) -> Result<ValidConfig> {
    Config::load(path).map_err(|error| anyhow::anyhow!("{}", bypass_cli::pooler::describe(path, &error)))
}

/// A single-threaded runtime for the main thread's own waiting (signals, status line); the pooler
/// runs on its shard threads.
pub fn control_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the control runtime")
}

fn run_proxy(config: ValidConfig, path: std::path::PathBuf) -> Result<()> {
    raise_fd_limit();
    let proxy = Proxy::bind(config).context("binding the listen address")?;
    tracing::info!(address = %proxy.local_addr(), metrics = ?proxy.metrics_addr(), "pooler listening");
    *proxy.shared().config_path.lock().unwrap_or_else(|p| p.into_inner()) = Some(path);
    let running = proxy.start().context("starting the shards")?;
    control_runtime()?.block_on(bypass_pooler::proxy::serve_until_stopped(running)).context("waiting for signals")
}

/// Waits for SIGINT (Ctrl-C), SIGTERM or SIGHUP (terminal closed): each stops us cleanly.
pub async fn stop_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for Ctrl-C")?,
        _ = terminate.recv() => {}
        _ = hangup.recv() => {}
    }
    Ok(())
}

/// Many clients need many descriptors: take the hard limit.
pub fn raise_fd_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
