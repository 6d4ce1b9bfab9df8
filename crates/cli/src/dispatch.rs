//! `bypass dispatch …`, `bypass agent`, `bypass lab …` and `bypass bench dispatch`: argument
//! parsing and wiring over bypass-dispatch, bypass-lab and bypass-bench.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use bypass_bench::dispatch::{self as bench, BenchOptions, Contender, Tuning, DEFAULT_SIZES};
use bypass_dispatch::config::{AgentConfig, DispatcherConfig};
use bypass_lab::lab::{Lab, LabSpec};

/// Subcommands of `bypass dispatch`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Run the dispatcher with a configuration file (see crates/dispatch/src/config.rs).
    Serve {
        /// Path to dispatch.toml.
        #[arg(long)]
        config: PathBuf,
        /// Network namespace to run in (e.g. the lab's `bypass-disp`).
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Validate a dispatch.toml and list every problem in it.
    CheckConfig {
        /// Path to dispatch.toml.
        file: PathBuf,
    },
}

/// Arguments of `bypass agent`.
#[derive(clap::Args)]
pub struct AgentArgs {
    /// Path to agent.toml; without it the flags below are used.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where dispatchers connect (loopback by default; open it to the dispatcher's network).
    #[arg(long, default_value = "127.0.0.1:7432")]
    pub listen: String,
    /// File with the key dispatchers must prove (the dispatcher's `agent_key_file`).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The PostgreSQL server beside the agent.
    #[arg(long, default_value = "127.0.0.1:5432")]
    pub postgres: String,
    /// Network namespace to run in (e.g. the lab's `bypass-be1`).
    #[arg(long)]
    pub namespace: Option<String>,
}

/// Which lab to act on.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Prefix of the lab's network namespaces (a-z, 0-9).
    #[arg(long, default_value = "bypass")]
    pub name: String,
    /// Rate of every shaped server link, in Mbit/s.
    #[arg(long, default_value_t = 1000)]
    pub link_rate_mbit: u32,
}

/// Subcommands of `bypass lab`.
#[derive(clap::Subcommand)]
pub enum LabCommand {
    /// Build the namespaces, bridge and shaped links of the lab (reuses a complete one).
    Up(LabArgs),
    /// Tear the lab down (every namespace named `<name>-…`).
    Down(LabArgs),
}

/// Arguments of `bypass bench dispatch`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Rate of every shaped server link, in Mbit/s.
    #[arg(long, default_value_t = 1000)]
    pub link_rate_mbit: u32,
    /// Measuring time per point, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub duration_s: f64,
    /// Warm-up per point, in seconds.
    #[arg(long, default_value_t = 1.0)]
    pub warmup_s: f64,
    /// Measuring time of the 1-byte latency run, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub latency_s: f64,
    /// Payload sizes in bytes, comma-separated (default: the sweep 1 B … 128 MB).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Contenders, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub contenders: Vec<Contender>,
    /// The hybrid policy's hand-over threshold, in bytes. Default: derived in the same run from
    /// the crossover of relay-only and hand-over-always (the geometric mean of the first size
    /// where hand-over wins and the size before it), else the configuration default.
    #[arg(long)]
    pub threshold: Option<u64>,
    /// Where dispatch.{json,md,png} go.
    #[arg(long, default_value = "bench/results")]
    pub out_dir: PathBuf,
    /// Measure and print, but write no result files (for validating the harness).
    #[arg(long)]
    pub dry_run: bool,
    /// Passes over all contenders; each point reports the median pass (small answers are
    /// latency-bound and vary run to run on a shared 2-core machine).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// The Bypass dispatchers' `busy_poll_us` (default: the configuration default).
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    /// The Bypass dispatchers' `workers` (default: the configuration default).
    #[arg(long)]
    pub dispatcher_workers: Option<usize>,
    /// HAProxy's `nbthread`.
    #[arg(long, default_value_t = 2)]
    pub haproxy_threads: usize,
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve { config, namespace } => {
            let config = DispatcherConfig::load(&config)?;
            let running = bypass_dispatch::dispatcher::start(config, namespace)?;
            tracing::info!(address = %running.ready.local_addr, "dispatcher running; Ctrl-C stops it");
            wait_for_ctrl_c()
        }
        Command::CheckConfig { file } => {
            let config = DispatcherConfig::load(&file)?;
            println!(
                "{}: valid ({} backends, {} databases)",
                file.display(),
                config.backends.len(),
                config.databases.len()
            );
            Ok(())
        }
    }
}

pub fn agent(args: AgentArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => AgentConfig::load(path)?,
        None => AgentConfig {
            listen_addr: args.listen,
            postgres_addr: args.postgres,
            key_file: args.key_file,
            ..AgentConfig::default()
        }
        .validate()?,
    };
    let running = bypass_dispatch::agent::start(config, args.namespace)?;
    tracing::info!(address = %running.ready, "agent running; Ctrl-C stops it");
    wait_for_ctrl_c()
}

fn wait_for_ctrl_c() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(tokio::signal::ctrl_c()).context("waiting for Ctrl-C")
}

pub fn lab(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Up(args) => {
            let spec = LabSpec { name: args.name, link_rate_mbit: args.link_rate_mbit, ..LabSpec::default() };
            let lab = Lab::up(spec)?;
            for host in lab.hosts() {
                println!("{:<5} {:<16} {}", host.short, host.namespace, host.address);
            }
            println!(
                "switch {} (client ports: {})",
                lab.switch_namespace(),
                lab.clients().iter().map(|c| c.switch_port.as_str()).collect::<Vec<_>>().join(", ")
            );
            Ok(())
        }
        LabCommand::Down(args) => {
            Lab::down(&args.name)?;
            println!("lab {} is down", args.name);
            Ok(())
        }
    }
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let options = BenchOptions {
        lab_name: "bypassbench".into(),
        link_rate_mbit: args.link_rate_mbit,
        sizes: if args.sizes.is_empty() { DEFAULT_SIZES.to_vec() } else { args.sizes },
        contenders: if args.contenders.is_empty() { Contender::ALL.to_vec() } else { args.contenders },
        warmup: Duration::from_secs_f64(args.warmup_s),
        duration: Duration::from_secs_f64(args.duration_s),
        latency_duration: Duration::from_secs_f64(args.latency_s),
        threshold: args.threshold,
        out_dir: args.out_dir,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        write: !args.dry_run,
        rounds: args.rounds,
        tuning: Tuning {
            busy_poll_us: args.busy_poll_us,
            dispatcher_workers: args.dispatcher_workers,
            haproxy_threads: args.haproxy_threads,
        },
    };
    let results = bench::run(&options)?;
    println!("{}", results.markdown());
    if options.write {
        results.write(&options.out_dir)?;
        println!("wrote {}/dispatch.{{json,md,png}}", options.out_dir.display());
    }
    Ok(())
}
