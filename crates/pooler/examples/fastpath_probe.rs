//! A quick side-by-side probe of `fast_path = "user"` versus `"kernel"` (not the benchmark:
//! `bypass bench pooler --contenders pgbouncer,bypass,bypass-kernel` is). Starts a throwaway
//! PostgreSQL, runs `pgbench -S -c CLIENTS -T SECONDS` through each mode, prints TPS.
//! Usage: cargo run --release -p bypass-pooler --example fastpath_probe -- [clients] [seconds] [user|kernel]

use std::process::Command;

use bypass_pooler::config::{AuthType, DatabaseEntry, FastPathMode, PoolMode, PoolerSettings};
use bypass_pooler::{Config, Proxy};
use bypass_testkit::{pg_bin, Postgres};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: u32 = args.next().map_or(Ok(100), |a| a.parse())?;
    let seconds: u32 = args.next().map_or(Ok(10), |a| a.parse())?;
    let modes: Vec<FastPathMode> = match args.next().as_deref() {
        Some("user") => vec![FastPathMode::User],
        Some("kernel") => vec![FastPathMode::Kernel],
        _ => vec![FastPathMode::User, FastPathMode::Kernel, FastPathMode::User, FastPathMode::Kernel],
    };
    let postgres = Postgres::start()?;
    let port = postgres.port().to_string();
    let init = Command::new(pg_bin("pgbench"))
        .args(["-i", "-q", "-s", "10", "-h", "127.0.0.1", "-U", "postgres", "-p", &port, "postgres"])
        .output()?;
    anyhow::ensure!(init.status.success(), "pgbench -i failed");
    for mode in modes {
        let config = Config {
            pooler: PoolerSettings {
                listen_addr: "127.0.0.1:0".into(),
                pool_mode: PoolMode::Transaction,
                auth_type: AuthType::Trust,
                default_pool_size: 20,
                max_client_conn: 11_000,
                fast_path: mode,
                ..PoolerSettings::default()
            },
            databases: [("*".to_owned(), DatabaseEntry { port: postgres.port(), ..DatabaseEntry::default() })].into(),
            users: Default::default(),
        };
        let running = Proxy::bind(config.validate()?)?.start()?;
        let pooler_port = running.local_addr().port().to_string();
        let output = Command::new(pg_bin("pgbench"))
            .args(["-n", "-S", "-h", "127.0.0.1", "-U", "postgres", "-p", &pooler_port, "-j", "2"])
            .args(["-c", &clients.to_string(), "-T", &seconds.to_string(), "postgres"])
            .output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let tps = text.lines().find(|line| line.starts_with("tps")).unwrap_or("no tps line");
        let latency = text.lines().find(|line| line.starts_with("latency average")).unwrap_or("");
        let counters = running.shared().fastpath.as_ref().map(|fast| fast.counters());
        println!("{mode:?}: {tps} | {latency}");
        if let Some(counters) = counters {
            println!("  kernel counters: {counters:?}");
        }
        running.stop();
    }
    Ok(())
}
