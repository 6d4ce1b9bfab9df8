//! The epoll load generator against real PostgreSQL (directly and behind PgBouncer): what it
//! counts is what the server did.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bypass_lab::epoll_loadgen::{self, EpollLoadReport, EpollLoadSpec, NoObserver, Script, Statement, Zipfian};
use bypass_testkit::{PgBouncer, PgBouncerOptions, Postgres};
use bypass_wire::login::LoginRequest;

fn spec(port: u16, clients: usize, script: Script) -> EpollLoadSpec {
    EpollLoadSpec {
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        clients,
        threads: 2,
        login: LoginRequest::trust("postgres", "postgres"),
        script,
        warmup: Duration::from_millis(300),
        duration: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(30),
        drain_timeout: Duration::from_secs(10),
        seed: 1,
    }
}

fn number(postgres: &Postgres, sql: &str) -> anyhow::Result<u64> {
    Ok(postgres.psql(sql)?.trim().parse()?)
}

/// Waits until no other client backend is connected, so every backend has exited and flushed
/// its statistics; returns how many psql sessions the wait used.
fn wait_for_backends_to_exit(postgres: &Postgres) -> anyhow::Result<u64> {
    let sql = "select count(*) from pg_stat_activity where backend_type = 'client backend' and pid <> pg_backend_pid()";
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sessions = 0;
    loop {
        sessions += 1;
        if number(postgres, sql)? == 0 {
            return Ok(sessions);
        }
        anyhow::ensure!(Instant::now() < deadline, "backends still connected after 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What every clean run must show.
fn assert_clean(report: &EpollLoadReport, clients: usize) {
    assert_eq!(report.connected, clients, "{report:?}");
    assert_eq!((report.errors, report.failed_transactions, report.total_failed_transactions), (0, 0, 0), "{report:?}");
    assert_eq!(report.unfinished, 0, "{report:?}");
    assert!(report.transactions > 0 && report.total_transactions > report.transactions, "{report:?}");
    let tps = report.transactions as f64 / report.window_s;
    assert!((report.tps - tps).abs() < 1e-6 && report.window_s >= 2.0, "{report:?}");
    assert!(report.latency_p50_us > 0.0 && report.latency_p50_us <= report.latency_p99_us, "{report:?}");
    assert!(report.latency_p99_us <= report.latency_max_us, "{report:?}");
    assert!(report.slowest_transaction_us * 1.01 >= report.latency_max_us, "{report:?}");
    assert!(report.generator_cpu_s > 0.0 && report.generator_cpu_total_s >= report.generator_cpu_s, "{report:?}");
}

// Goal: 300 clients through PgBouncer (pool of 20) run SELECT 1 without a failure, and the
// transactions the generator counted are the ones PostgreSQL committed; method: the
// database's xact_commit before and after, once every backend exited (the only other
// transactions are the psql sessions of this test and PgBouncer's 20 server logins).
#[test]
fn select1_counts_agree_with_postgres_through_pgbouncer() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let bouncer = PgBouncer::start(PgBouncerOptions {
        backend_port: postgres.port(),
        pool_size: 20,
        ..PgBouncerOptions::default()
    })?;
    let xact_sql = "select xact_commit from pg_stat_database where datname = 'postgres'";
    let before = number(&postgres, xact_sql)?;
    let report = epoll_loadgen::run(&spec(bouncer.port(), 300, Script::fixed("SELECT 1")), &mut NoObserver)?;
    assert_clean(&report, 300);
    drop(bouncer);
    let sessions = wait_for_backends_to_exit(&postgres)?;
    let delta = number(&postgres, xact_sql)? - before;
    // Each psql session and each server login commits at most a few transactions of its own.
    let others_max = 3 * (sessions + 1 + 20);
    let committed = report.total_transactions;
    assert!(delta >= committed && delta <= committed + others_max, "xact_commit +{delta}, generator {committed}");
    Ok(())
}

// Goal: a weighted keyed mix runs as written — every transaction an UPDATE of one zipfian key,
// 3:1 between two columns — straight to PostgreSQL; method: the updated counters summed
// against the generator's count (exact), their ratio, and key 1 the hottest.
#[test]
fn a_weighted_zipfian_mix_updates_exactly_what_was_counted() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    postgres.psql(
        "create table counters (k int primary key, n bigint not null default 0, m bigint not null default 0); \
         insert into counters (k) select g from generate_series(1, 50) g",
    )?;
    let script = Script {
        statements: vec![
            Statement { weight: 3, sql: "UPDATE counters SET n = n + 1 WHERE k = :key".into() },
            Statement { weight: 1, sql: "UPDATE counters SET m = m + 1 WHERE k = :key".into() },
        ],
        keys: Some(Zipfian { keys: 50, exponent: 1.001 }),
    };
    let report = epoll_loadgen::run(&spec(postgres.port(), 40, script), &mut NoObserver)?;
    assert_clean(&report, 40);
    let n = number(&postgres, "select sum(n) from counters")?;
    let m = number(&postgres, "select sum(m) from counters")?;
    assert_eq!(n + m, report.total_transactions, "n {n} + m {m}");
    let ratio = n as f64 / m as f64;
    assert!((2.5..3.5).contains(&ratio), "n ÷ m = {ratio}");
    let hottest = number(&postgres, "select k from counters order by n + m desc limit 1")?;
    assert_eq!(hottest, 1);
    Ok(())
}
