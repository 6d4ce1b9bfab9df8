//! `bypass up`: the embedded default. A private PostgreSQL 15 under `./.bypass/pgdata` (created on
//! first use, reused after), the pooler in front of it, a live status line, clean stop on Ctrl-C.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bypass_pooler::config::{AuthType, DatabaseEntry, PoolMode, PoolerSettings};
use bypass_pooler::{Config, Proxy, Shared};
use bypass_testkit::{Postgres, PostgresOptions};
use clap::Args;

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
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Mode {
    Session,
    Transaction,
}

pub fn run(args: UpArgs) -> Result<()> {
    crate::raise_fd_limit();
    let mut postgres = start_postgres(&args)?;
    let config = embedded_config(&args, postgres.port()).validate().context("embedded configuration")?;
    let result = serve(config, &postgres, args.port);
    eprintln!("\nbypass up: stopping PostgreSQL");
    postgres.stop().context("stopping PostgreSQL")?;
    result
}

fn start_postgres(args: &UpArgs) -> Result<Postgres> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.dir)?.join("pgdata");
    let fresh = !data_dir.join("PG_VERSION").exists();
    eprintln!("bypass up: {} PostgreSQL 15 in {}", if fresh { "initializing" } else { "reusing" }, data_dir.display());
    let options = PostgresOptions { data_dir: Some(data_dir), max_connections: 100, ..PostgresOptions::default() };
    Postgres::start_with(options).context("starting the embedded PostgreSQL (is another `bypass up` running?)")
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
        ..PoolerSettings::default()
    };
    let backend = DatabaseEntry { host: "127.0.0.1".into(), port: postgres_port, ..DatabaseEntry::default() };
    Config { pooler, databases: [("*".to_owned(), backend)].into() }
}

fn serve(config: bypass_pooler::ValidConfig, postgres: &Postgres, port: u16) -> Result<()> {
    let proxy = Proxy::bind(config).with_context(|| format!("binding 127.0.0.1:{port}"))?;
    let running = proxy.start().context("starting the pooler")?;
    eprintln!("bypass up: PostgreSQL on 127.0.0.1:{}, pooler on 127.0.0.1:{port}", postgres.port());
    println!("psql \"host=127.0.0.1 port={port} user=postgres dbname=postgres\"");
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
