//! `bypass up`: the embedded default. A private PostgreSQL 15 under `./.bypass/pgdata` (created on
//! first use, reused after), the pooler in front of it, a live status line, clean stop on Ctrl-C.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bypass_pooler::config::{AuthType, DatabaseEntry, PoolMode, PoolerSettings};
use bypass_pooler::{Config, Proxy, Shared};
use bypass_testkit::{Postgres, PostgresOptions};
use clap::Args;

/// The user the printed connection line uses, an admin of the embedded pooler's console.
const ADMIN_USER: &str = "postgres";

#[derive(Args)]
pub struct UpArgs {
    /// Folder for the private PostgreSQL cluster and its log.
    #[arg(long, default_value = ".bypass")]
    dir: PathBuf,
    /// Port the pooler listens on (loopback only).
    #[arg(long, default_value_t = 6432)]
    port: u16,
    /// Pool mode of the embedded pooler.
    #[arg(long, value_enum, default_value_t = Mode::Transaction)]
    pool_mode: Mode,
    /// Port of the Prometheus endpoint (`/metrics`, loopback only); 0 turns it off.
    #[arg(long, default_value_t = 9127)]
    metrics_port: u16,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Mode {
    Session,
    Transaction,
}

pub fn run(args: UpArgs) -> Result<()> {
    crate::raise_fd_limit();
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let _lock = lock_folder(&args.dir)?;
    refuse_running_cluster(&args.dir.join("pgdata"))?;
    let mut postgres = start_postgres(&args)?;
    let config = embedded_config(&args, postgres.port()).validate().context("embedded configuration")?;
    let result = serve(config, &postgres, args.port);
    eprintln!("\nbypass up: stopping PostgreSQL");
    postgres.stop().context("stopping PostgreSQL")?;
    result
}

/// Holds `<dir>/up.lock` (an exclusive `flock`) for this process's life, so a second `bypass
/// up` on the same folder stops here, before it touches the first one's PostgreSQL.
fn lock_folder(dir: &Path) -> Result<std::fs::File> {
    let path = dir.join("up.lock");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock only takes a lock on the descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        bail!(
            "another `bypass up` (pid {}) is running on {}: stop it (Ctrl-C in its terminal) or pass another --dir",
            holder.trim(),
            dir.display()
        );
    }
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}

/// Refuses to start when PostgreSQL already runs on the data folder (left by a `bypass up`
/// that was killed, or started by hand): starting a second one would fail and the clean-up
/// after it would stop the running one.
fn refuse_running_cluster(data_dir: &Path) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(data_dir.join("postmaster.pid")) else { return Ok(()) };
    let mut lines = text.lines();
    let Some(pid) = lines.next().and_then(|line| line.trim().parse::<i32>().ok()) else { return Ok(()) };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return Ok(()); // A stale file: PostgreSQL itself removes it at start.
    }
    let port = lines.nth(2).unwrap_or("?").trim();
    bail!(
        "PostgreSQL (pid {pid}, port {port}) is already running on {}; stop it with \
         `runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D {} stop` or pass another --dir",
        data_dir.display(),
        data_dir.display()
    )
}

fn start_postgres(args: &UpArgs) -> Result<Postgres> {
    let data_dir = std::fs::canonicalize(&args.dir)?.join("pgdata");
    let fresh = !data_dir.join("PG_VERSION").exists();
    eprintln!("bypass up: {} PostgreSQL 15 in {}", if fresh { "initializing" } else { "reusing" }, data_dir.display());
    let options = PostgresOptions { data_dir: Some(data_dir), max_connections: 100, ..PostgresOptions::default() };
    Postgres::start_with(options).context("starting the embedded PostgreSQL")
}

fn embedded_config(args: &UpArgs, postgres_port: u16) -> Config {
    let pooler = PoolerSettings {
        listen_addr: format!("127.0.0.1:{}", args.port),
        pool_mode: match args.pool_mode {
            Mode::Session => PoolMode::Session,
            Mode::Transaction => PoolMode::Transaction,
        },
        // Loopback only, on a developer's machine: no passwords, as PostgreSQL's own default.
        auth_type: AuthType::Trust,
        max_client_conn: 10_000,
        default_pool_size: 20,
        // The user the printed psql line logs in as may run the console (`SHOW POOLS`).
        admin_users: vec![ADMIN_USER.into()],
        metrics_addr: (args.metrics_port != 0).then(|| format!("127.0.0.1:{}", args.metrics_port)),
        ..PoolerSettings::default()
    };
    let backend = DatabaseEntry { host: "127.0.0.1".into(), port: postgres_port, ..DatabaseEntry::default() };
    Config { pooler, databases: [("*".to_owned(), backend)].into(), ..Config::default() }
}

fn serve(config: bypass_pooler::ValidConfig, postgres: &Postgres, port: u16) -> Result<()> {
    let proxy = Proxy::bind(config).with_context(|| format!("binding 127.0.0.1:{port}"))?;
    let metrics = proxy.metrics_addr();
    let running = proxy.start().context("starting the pooler")?;
    eprintln!("bypass up: PostgreSQL on 127.0.0.1:{}, pooler on 127.0.0.1:{port}", postgres.port());
    println!("psql \"host=127.0.0.1 port={port} user={ADMIN_USER} dbname=postgres\"");
    eprintln!("bypass up: admin console: psql -h 127.0.0.1 -p {port} -U {ADMIN_USER} bypass -c 'SHOW POOLS'");
    if let Some(metrics) = metrics {
        eprintln!("bypass up: metrics: curl http://{metrics}/metrics");
    }
    eprintln!("bypass up: Ctrl-C stops everything");
    let shared = running.shared();
    crate::control_runtime()?.block_on(async move {
        tokio::select! {
            _ = status_line(shared) => {}
            result = crate::stop_signal() => result?,
        }
        anyhow::Ok(())
    })?;
    running.stop();
    Ok(())
}

/// Prints one line of status each second: in place on a terminal, every ten seconds otherwise.
async fn status_line(shared: std::sync::Arc<Shared>) {
    let terminal = std::io::stderr().is_terminal();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    let mut last = (Instant::now(), shared.snapshot().transactions);
    let mut tick_count = 0u64;
    loop {
        ticks.tick().await;
        tick_count += 1;
        let now = Instant::now();
        let snapshot = shared.snapshot();
        let rate = (snapshot.transactions - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        last = (now, snapshot.transactions);
        let line = format!(
            "clients {} (waiting {}) | servers {} open, {} idle | {:.0} tx/s | {} tx | {} shard moves",
            snapshot.clients,
            snapshot.waiting,
            snapshot.servers_open,
            snapshot.servers_idle,
            rate,
            snapshot.transactions,
            snapshot.server_moves
        );
        let mut stderr = std::io::stderr();
        if terminal {
            let _ = write!(stderr, "\r\x1b[2K{line}");
        } else if tick_count.is_multiple_of(10) {
            let _ = writeln!(stderr, "{line}");
        }
        let _ = stderr.flush();
    }
}
