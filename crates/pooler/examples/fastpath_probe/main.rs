//! A quick side-by-side probe of `fast_path = "user"` versus `"kernel"` (not the benchmark:
//! `bypass bench fastpath` is). Starts a throwaway PostgreSQL, runs `pgbench -S -c CLIENTS -T
//! SECONDS` through each mode, prints TPS, and profiles a window in the middle of each run: what
//! the whole machine spent per transaction (softirqs, interrupts and IPIs, context switches,
//! kworker runs, CPU by process, the fast-path programs' run time; see profile.rs).
//! Usage: cargo run --release -p bypass-pooler --example fastpath_probe -- [clients] [seconds] [runs]
//! `runs`: comma-separated modes run one after the other on the same PostgreSQL, of `user`,
//! `kernel`, `kernel-wake` (every handoff wakes user space: quiet handoffs off, for an A/B of
//! the handoff ring) and `kernel-queue` (`fast_path_queue_behind = true`); default
//! `user,kernel,user,kernel`.
//! Program run times need `sysctl kernel.bpf_stats_enabled=1`. The window is the middle half of
//! the run, or the command in FASTPATH_PROBE_WINDOW (run with `sh -c`, e.g. `perf stat -a -e
//! sched:sched_wakeup -- sleep 5`), started a quarter into the run.

mod profile;

use std::process::{Command, Stdio};
use std::time::Duration;

use bypass_pooler::config::{AuthType, DatabaseEntry, FastPathMode, PoolMode, PoolerSettings};
use bypass_pooler::{Config, Proxy, RunningProxy};
use bypass_testkit::{pg_bin, Postgres};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: u32 = args.next().map_or(Ok(100), |a| a.parse())?;
    let seconds: u32 = args.next().map_or(Ok(10), |a| a.parse())?;
    let runs = args.next().unwrap_or_else(|| "user,kernel,user,kernel".into());
    let runs: Vec<&str> = runs.split(',').collect();
    anyhow::ensure!(
        runs.iter().all(|run| ["user", "kernel", "kernel-wake", "kernel-queue"].contains(run)),
        "unknown run in {runs:?}"
    );
    let postgres = Postgres::start()?;
    let port = postgres.port().to_string();
    let init = Command::new(pg_bin("pgbench"))
        .args(["-i", "-q", "-s", "10", "-h", "127.0.0.1", "-U", "postgres", "-p", &port, "postgres"])
        .output()?;
    anyhow::ensure!(init.status.success(), "pgbench -i failed");
    for run in runs {
        let mode = if run == "user" { FastPathMode::User } else { FastPathMode::Kernel };
        let mut config = config(&postgres, mode);
        config.pooler.fast_path_queue_behind = run == "kernel-queue";
        let running = Proxy::bind(config.validate()?)?.start()?;
        if let Some(fast) = running.shared().fastpath.as_ref().filter(|_| run == "kernel-wake") {
            fast.set_handoff_quiet_from(0);
        }
        let pooler_port = running.local_addr().port().to_string();
        let pgbench = Command::new(pg_bin("pgbench"))
            .args(["-n", "-S", "-h", "127.0.0.1", "-U", "postgres", "-p", &pooler_port, "-j", "2"])
            .args(["-c", &clients.to_string(), "-T", &seconds.to_string(), "postgres"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let window = profile_window(&running, pgbench.id(), seconds);
        let output = pgbench.wait_with_output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let tps = text.lines().find(|line| line.starts_with("tps")).unwrap_or("no tps line");
        let latency = text.lines().find(|line| line.starts_with("latency average")).unwrap_or("");
        println!("{run}: {tps} | {latency}");
        if let Some(counters) = running.shared().fastpath.as_ref().map(|fast| fast.counters()) {
            println!("  kernel counters: {counters:?}");
        }
        for kernel in running.shared().pools().iter().filter_map(|pool| pool.kernel()) {
            let counts = kernel.counters();
            let share = |value: Option<f64>| value.map_or("-".into(), |share| format!("{:.1}%", share * 100.0));
            println!(
                "  request bytes in the kernel {}, answer bytes {}",
                share(counts.request_bytes_share()),
                share(counts.answer_bytes_share())
            );
        }
        if let Some((before, after)) = window {
            profile::report(&before, &after);
        }
        running.stop();
    }
    Ok(())
}

fn config(postgres: &Postgres, mode: FastPathMode) -> Config {
    Config {
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
    }
}

/// Snapshots before and after the profile window (see the module docs); None if the window
/// command failed to start.
fn profile_window(
    running: &RunningProxy,
    pgbench: u32,
    seconds: u32,
) -> Option<(profile::Snapshot, profile::Snapshot)> {
    std::thread::sleep(Duration::from_millis(u64::from(seconds) * 250));
    let before = profile::Snapshot::take(running, pgbench);
    match std::env::var("FASTPATH_PROBE_WINDOW") {
        Ok(command) => {
            let status = Command::new("sh").args(["-c", &command]).status().ok()?;
            if !status.success() {
                eprintln!("window command failed: {status}");
            }
        }
        Err(_) => std::thread::sleep(Duration::from_millis(u64::from(seconds) * 500)),
    }
    Some((before, profile::Snapshot::take(running, pgbench)))
}
