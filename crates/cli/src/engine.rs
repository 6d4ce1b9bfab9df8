//! `bypass engine …` and `bypass bench engine`: argument parsing and wiring over bypass-engine and
//! bypass-bench.

use std::time::Instant;

use bypass_engine::engine::{Engine, EngineSettings};
use bypass_engine::exec::Tier;
use bypass_engine::runtime::{RuntimeKind, RuntimeSettings};
use bypass_engine::tpch;

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
        #[command(flatten)]
        access: AccessArgs,
    },
    /// Generate a data set in memory and report table sizes and the time it took.
    Load {
        /// Which data set (only `tpch`).
        dataset: String,
        /// TPC-H scale factor.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
    },
    /// Generate TPC-H as CSV files into a directory (what `serve --tpch-sf` runs in a child
    /// process: the generator keeps a 300 MiB text pool for the life of its process).
    #[command(hide = true)]
    ExportTpch {
        #[arg(long)]
        sf: f64,
        #[arg(long)]
        dir: std::path::PathBuf,
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

/// Who may connect to `bypass engine serve` and how.
#[derive(clap::Args, Clone)]
pub struct AccessArgs {
    /// Users and passwords, PgBouncer's userlist format (`"user" "password"`, the password in
    /// plaintext, `md5…` or `SCRAM-SHA-256$…` form). Required unless --no-auth.
    #[arg(long, required_unless_present = "no_auth")]
    pub auth_file: Option<std::path::PathBuf>,
    /// How clients prove their password: `scram-sha-256` or `md5` (a user whose secret is a
    /// SCRAM verifier always gets SCRAM).
    #[arg(long, value_enum, default_value_t = AuthMethod::ScramSha256)]
    pub auth_method: AuthMethod,
    /// Accept every client without a password (only for trusted, local networks).
    #[arg(long, conflicts_with = "auth_file")]
    pub no_auth: bool,
    /// TLS certificate (PEM). Without --tls-cert/--tls-key a self-signed certificate is made at
    /// start, so TLS is offered by default.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// TLS private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Refuse clients that do not use TLS.
    #[arg(long, conflicts_with = "no_tls")]
    pub tls_required: bool,
    /// Do not offer TLS (SSLRequest is answered 'N').
    #[arg(long)]
    pub no_tls: bool,
}

/// Password methods of `--auth-method`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AuthMethod {
    #[value(name = "scram-sha-256")]
    ScramSha256,
    Md5,
}

impl AccessArgs {
    /// The front door these flags describe; `scratch` holds a generated certificate.
    pub fn front_door(&self, scratch: &std::path::Path) -> anyhow::Result<bypass_frontdoor::FrontDoorConfig> {
        use bypass_frontdoor::{FrontDoorConfig, ServerTls, TlsFiles};
        use bypass_wire::auth::Method;
        use bypass_wire::auth_file::AuthFile;
        let users = match &self.auth_file {
            Some(path) => AuthFile::load(path).map_err(anyhow::Error::msg)?,
            None => AuthFile::default(),
        };
        let method = match (self.no_auth, self.auth_method) {
            (true, _) => Method::Trust,
            (false, AuthMethod::ScramSha256) => Method::ScramSha256,
            (false, AuthMethod::Md5) => Method::Md5,
        };
        let tls = if self.no_tls {
            None
        } else {
            let (certificate, key) = match (&self.tls_cert, &self.tls_key) {
                (Some(certificate), Some(key)) => (certificate.clone(), key.clone()),
                _ => self_signed_certificate(scratch)?,
            };
            let files = TlsFiles {
                certificate,
                key,
                client_ca: None,
                client_certificate_required: false,
                plaintext_refused: self.tls_required,
            };
            Some(ServerTls::from_files(&files).map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?)
        };
        let mock = self.auth_file.as_deref().map(bypass_frontdoor::mock_key).transpose()?;
        Ok(FrontDoorConfig { tls, method, mock, ..FrontDoorConfig::scram(users) })
    }
}

/// A self-signed certificate for `localhost` written to `folder` (certificate, key).
fn self_signed_certificate(folder: &std::path::Path) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let certificate = folder.join("engine-server.crt");
    let key = folder.join("engine-server.key");
    std::fs::write(&certificate, certified.cert.pem())?;
    std::fs::write(&key, certified.key_pair.serialize_pem())?;
    Ok((certificate, key))
}

/// Settings shared by the engine subcommands.
#[derive(clap::Args, Clone)]
pub struct EngineArgs {
    /// `specialized` (pinned workers, huge-page prefaulted pool, arenas) or `plain`.
    #[arg(long, value_enum, default_value_t = RuntimeArg::Specialized)]
    pub runtime: RuntimeArg,
    /// `compiled` (templates where they fit) or `interpreted` (oracle only).
    #[arg(long, value_enum, default_value_t = TierArg::Compiled)]
    pub tier: TierArg,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Run workers under SCHED_FIFO (root; can starve other threads on small machines).
    #[arg(long)]
    pub sched_fifo: bool,
    /// Most memory all running statements may hold together, e.g. `4GB` (default: 80% of the
    /// machine's memory or of the cgroup's memory.max); past it the statement asking for more
    /// is refused with 53200.
    #[arg(long, value_parser = parse_memory_size)]
    pub memory_budget: Option<usize>,
}

fn parse_memory_size(text: &str) -> Result<usize, String> {
    bypass_engine::settings::parse_bytes(text).map_err(|e| e.to_string())
}

/// `--runtime`: the engine's [`RuntimeKind`] as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeArg {
    /// Pinned workers, huge-page prefaulted pool, per-worker arenas.
    Specialized,
    /// Unpinned threads, global allocator, demand paging.
    Plain,
}

/// `--tier`: the engine's [`Tier`] as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TierArg {
    /// Compiled (fused, monomorphized) pipelines where a template fits, else the interpreter.
    Compiled,
    /// The vectorized interpreter only (the oracle).
    Interpreted,
}

impl EngineArgs {
    pub fn settings(&self) -> EngineSettings {
        let kind = match self.runtime {
            RuntimeArg::Specialized => RuntimeKind::Specialized,
            RuntimeArg::Plain => RuntimeKind::Plain,
        };
        let tier = match self.tier {
            TierArg::Compiled => Tier::Compiled,
            TierArg::Interpreted => Tier::Interpreted,
        };
        let mut runtime = RuntimeSettings { kind, sched_fifo: self.sched_fifo, ..RuntimeSettings::default() };
        if let Some(workers) = self.workers {
            runtime.workers = workers;
        }
        let defaults = EngineSettings::default();
        let memory_budget = self.memory_budget.unwrap_or(defaults.memory_budget);
        EngineSettings { runtime, tier, memory_budget, ..defaults }
    }
}

/// Arguments of `bypass bench engine`: the seed's runtime experiment (specialized vs plain),
/// the allocator micro-benchmark and TPC-H against DuckDB, DataFusion and Polars.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// A short validation run (small grid, 3 trials, TPC-H SF 0.1); results go to --out-dir too.
    #[arg(long)]
    pub quick: bool,
    /// Trials per cell of the seed's grid.
    #[arg(long, default_value_t = 10)]
    pub trials: usize,
    /// TPC-H scale factor.
    #[arg(long, default_value_t = 1.0)]
    pub sf: f64,
    /// Worker threads for every engine.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Timed runs per query (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Python with duckdb, datafusion and polars (default: the venv of scripts/engine-venv.sh).
    #[arg(long)]
    pub python: Option<std::path::PathBuf>,
    /// Skip the peers (DuckDB, DataFusion, Polars).
    #[arg(long)]
    pub no_peers: bool,
    /// Skip the seed's grid.
    #[arg(long)]
    pub skip_nautdb: bool,
    /// Only these column counts of the seed's grid (default: 2, 8, 32, 128), e.g. `--columns 128`.
    #[arg(long, value_delimiter = ',')]
    pub columns: Vec<usize>,
    /// Only these log2 rows per chunk of the seed's grid (default: 4..=13), e.g. `--rows-log2 13`.
    #[arg(long, value_delimiter = ',')]
    pub rows_log2: Vec<u32>,
    /// Leave out the seed's grid's third variant, the specialized runtime under SCHED_FIFO (root;
    /// while a trial runs it takes its core from time-shared processes for up to 0.95 s a second).
    #[arg(long)]
    pub no_sched_fifo: bool,
    /// Skip the allocator micro-benchmark.
    #[arg(long)]
    pub skip_allocator: bool,
    /// Skip TPC-H.
    #[arg(long)]
    pub skip_tpch: bool,
    /// Run only this section and merge it into the engine.json already in --out-dir (the other
    /// sections, and their command and load, are kept; the section notes its own run).
    #[arg(long, value_enum, conflicts_with_all = ["skip_nautdb", "skip_allocator", "skip_tpch"])]
    pub only: Option<bypass_bench::engine::Section>,
    /// Where engine.{json,md,png} go.
    #[arg(long, default_value = "bench/results")]
    pub out_dir: std::path::PathBuf,
}

/// `bypass bench engine-serving`: the serving benchmark against a child `bypass engine serve`.
pub fn bench_serving(args: &bypass_bench::engine::serving::ServingArgs) -> anyhow::Result<()> {
    let python = if args.no_peers { None } else { args.python.clone().or_else(default_python) };
    let report = bypass_bench::engine::serving::run(args, &std::env::current_exe()?, python)?;
    println!(
        "first row {:?} ms, select 1 while streaming {:?} ms (median); results in {}",
        report.first_row.median_ms,
        report.select1_while_streaming.median_ms,
        args.out_dir.join("engine-serving.md").display()
    );
    Ok(())
}

/// `bypass bench engine-regress`: PostgreSQL's regression queries, the engine against PostgreSQL.
pub fn bench_regress(args: &bypass_bench::engine::regress::RegressArgs) -> anyhow::Result<()> {
    let report = bypass_bench::engine::regress::run(args)?;
    println!(
        "matched {} of {} in-scope statements ({:.1}%; {} refused, {} wrong, {} out of scope); results in {}",
        report.total.matched,
        report.total.run,
        100.0 * report.total.share(),
        report.total.refused,
        report.total.wrong,
        report.total.out_of_scope,
        args.out_dir.join("engine-regress.md").display()
    );
    Ok(())
}

fn default_python() -> Option<std::path::PathBuf> {
    let venv = std::env::var("BYPASS_ENGINE_VENV")
        .ok()
        .or_else(|| std::env::var("HOME").ok().map(|home| format!("{home}/.cache/bypass/engine-venv")))?;
    let python = std::path::PathBuf::from(venv).join("bin/python");
    python.exists().then_some(python)
}

impl BenchArgs {
    fn plan(&self) -> bypass_bench::engine::Plan {
        let python = if self.no_peers { None } else { self.python.clone().or_else(default_python) };
        let (trials, mut columns, mut rows_log2, rounds, sf, runs) = if self.quick {
            (3, vec![2, 32], vec![4, 8, 12], 3, 0.1, 3)
        } else {
            (
                self.trials,
                bypass_bench::engine::COLUMNS.to_vec(),
                bypass_bench::engine::ROWS_LOG2.collect(),
                10,
                self.sf,
                self.runs,
            )
        };
        if !self.columns.is_empty() {
            columns.clone_from(&self.columns);
        }
        if !self.rows_log2.is_empty() {
            rows_log2.clone_from(&self.rows_log2);
        }
        bypass_bench::engine::Plan {
            trials,
            columns,
            rows_log2,
            allocator_rounds: rounds,
            allocator_sizes: bypass_bench::engine::alloc::SIZES.to_vec(),
            scale_factor: sf,
            threads: self.threads,
            runs,
            python,
            out_dir: self.out_dir.clone(),
            skip_nautdb: self.skip_nautdb,
            skip_allocator: self.skip_allocator,
            skip_tpch: self.skip_tpch,
            sched_fifo: !self.no_sched_fifo,
            only: self.only,
        }
    }
}

/// TPC-H generated by a child process (`bypass engine export-tpch`) and loaded by COPY: the
/// generator's static text pool (300 MiB) dies with the child instead of staying in the server.
fn load_tpch_from_child(engine: &Engine, sf: f64) -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["engine", "export-tpch", "--sf", &sf.to_string(), "--dir"])
        .arg(data.path())
        .status()?;
    anyhow::ensure!(status.success(), "generating TPC-H SF {sf} failed ({status})");
    for statement in bypass_bench::engine::serving::tpch_csv_statements(data.path()) {
        engine.execute(&statement)?;
    }
    bypass_engine::storage::release_free_heap();
    Ok(())
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve { listen, tpch_sf, engine, access } => {
            let scratch = tempfile::tempdir()?;
            let front_door = access.front_door(scratch.path())?;
            let engine = std::sync::Arc::new(Engine::new(engine.settings())?);
            if tpch_sf > 0.0 {
                let started = Instant::now();
                load_tpch_from_child(&engine, tpch_sf)?;
                println!("generated and loaded TPC-H SF {tpch_sf} in {:.1} s", started.elapsed().as_secs_f64());
            }
            let settings = bypass_engine::server::ServerSettings::with_front_door(listen, front_door);
            let server = bypass_engine::server::start(engine, settings)?;
            println!(
                "bypass engine listening on {} (psql -h {} -p {} -d {})",
                server.address,
                server.address.ip(),
                server.address.port(),
                bypass_engine::server::DATABASE_NAME
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
        Command::ExportTpch { sf, dir } => bypass_bench::engine::serving::export_tpch(sf, &dir),
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

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let plan = args.plan();
    // Bounded like the seed's grid: 2^13 rows × 128 columns × 256 chunks is already 1 GiB a table.
    anyhow::ensure!(
        plan.rows_log2.iter().all(|log2| bypass_bench::engine::ROWS_LOG2.contains(log2)),
        "--rows-log2 values must lie in {:?}",
        bypass_bench::engine::ROWS_LOG2
    );
    anyhow::ensure!(plan.columns.iter().all(|&c| (1..=128).contains(&c)), "--columns values must lie in 1..=128");
    let runs_tpch = plan.only.map_or(!plan.skip_tpch, |only| only == bypass_bench::engine::Section::Tpch);
    if plan.python.is_none() && runs_tpch {
        eprintln!("bench engine: no Python venv with the peers (run scripts/engine-venv.sh); TPC-H runs bypass only");
    }
    bypass_bench::engine::run(&plan)?;
    println!("wrote {}/engine.{{json,md,png}}", plan.out_dir.display());
    Ok(())
}
