//! The `bypass engine` subcommands and `bypass bench engine`, owned by this crate.

use std::time::Instant;

use crate::engine::{Engine, EngineSettings};
use crate::exec::Tier;
use crate::runtime::{RuntimeKind, RuntimeSettings};
use crate::tpch;

/// Subcommands of `bypass engine`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Serve the engine over the PostgreSQL protocol (psql, psycopg, any driver).
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:5433")]
        listen: std::net::SocketAddr,
        /// TPC-H scale factor to generate at start (0 = start empty).
        #[arg(long, default_value_t = 0.0)]
        tpch_sf: f64,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Generate a data set in memory and report table sizes and the time it took.
    Load {
        /// Which data set (only `tpch`).
        dataset: String,
        /// TPC-H scale factor.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
    },
    /// Run SQL statements against an in-memory TPC-H database and print the results.
    Query {
        /// SQL text (several statements separated by `;`).
        sql: String,
        /// TPC-H scale factor to load first (0 = no data).
        #[arg(long, default_value_t = 0.01)]
        tpch_sf: f64,
        #[command(flatten)]
        engine: EngineArgs,
    },
}

/// Settings shared by the engine subcommands.
#[derive(clap::Args, Clone)]
pub struct EngineArgs {
    /// `specialized` (pinned workers, huge-page prefaulted pool, arenas) or `plain`.
    #[arg(long, value_enum, default_value_t = RuntimeKind::Specialized)]
    pub runtime: RuntimeKind,
    /// `compiled` (templates where they fit) or `interpreted` (oracle only).
    #[arg(long, value_enum, default_value_t = Tier::Compiled)]
    pub tier: Tier,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Run workers under SCHED_FIFO (root; can starve other threads on small machines).
    #[arg(long)]
    pub sched_fifo: bool,
}

impl EngineArgs {
    pub fn settings(&self) -> EngineSettings {
        let mut runtime =
            RuntimeSettings { kind: self.runtime, sched_fifo: self.sched_fifo, ..RuntimeSettings::default() };
        if let Some(workers) = self.workers {
            runtime.workers = workers;
        }
        EngineSettings { runtime, tier: self.tier, ..EngineSettings::default() }
    }
}

/// Arguments of `bypass bench engine`.
#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve { listen, tpch_sf, engine } => {
            let engine = std::sync::Arc::new(Engine::new(engine.settings())?);
            if tpch_sf > 0.0 {
                let started = Instant::now();
                tpch::load(&engine, tpch_sf)?;
                println!("generated TPC-H SF {tpch_sf} in {:.1} s", started.elapsed().as_secs_f64());
            }
            let server = crate::server::start(engine, listen)?;
            println!(
                "bypass engine listening on {} (psql -h {} -p {})",
                server.address,
                server.address.ip(),
                server.address.port()
            );
            loop {
                // The network thread serves; this thread only keeps the server alive until the
                // process is interrupted.
                std::thread::park();
            }
        }
        Command::Load { dataset, sf } => {
            anyhow::ensure!(dataset == "tpch", "unknown data set {dataset:?} (only tpch)");
            let engine = Engine::new(EngineSettings::default())?;
            let started = Instant::now();
            tpch::load(&engine, sf)?;
            println!("generated TPC-H SF {sf} in {:.1} s", started.elapsed().as_secs_f64());
            for name in engine.table_names() {
                let table = engine.table(&name)?;
                println!("{name:>10}: {:>10} rows in {:>4} chunks", table.rows(), table.chunks.len());
            }
            Ok(())
        }
        Command::Query { sql, tpch_sf, engine } => {
            let engine = Engine::new(engine.settings())?;
            if tpch_sf > 0.0 {
                tpch::load(&engine, tpch_sf)?;
            }
            for result in engine.execute(&sql)? {
                if result.returns_rows {
                    println!("{}", result.names.join(" | "));
                    for row in result.rows() {
                        let cells: Vec<String> = row.iter().map(|v| v.to_string()).collect();
                        println!("{}", cells.join(" | "));
                    }
                }
                println!("{}", result.tag);
            }
            Ok(())
        }
    }
}

pub fn bench(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("bypass bench engine is not built yet")
}
