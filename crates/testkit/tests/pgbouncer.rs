//! Integration tests for `PgBouncer`: real pgbouncer processes in front of a real cluster.

use std::process::Command;

use anyhow::Result;
use bypass_testkit::{pg_bin, PgBouncer, PgBouncerOptions, Postgres};

/// Runs `select 1` through `port` as `user` with `password`; true when it printed 1.
fn select_one(port: u16, user: &str, password: &str) -> Result<bool> {
    let output = Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-w", "-h", "127.0.0.1"])
        .args(["-p", &port.to_string(), "-U", user, "-d", "postgres"])
        .args(["-c", "select 1"])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(output.status.success() && stdout.trim() == "1")
}

/// Whether a pid names a live process whose executable is pgbouncer.
fn is_pgbouncer(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|comm| comm.trim() == "pgbouncer").unwrap_or(false)
}

fn trust_options(postgres: &Postgres, processes: u32) -> PgBouncerOptions {
    PgBouncerOptions { backend_port: postgres.port(), processes, ..PgBouncerOptions::default() }
}

// Goal: one trust-mode process proxies queries and dies on drop; method: psql select 1 and
// the admin console through it, check the pid is pgbouncer's, drop, check pid and dir gone.
#[test]
fn single_process_proxies_queries() -> Result<()> {
    let postgres = Postgres::start()?;
    let bouncer = PgBouncer::start(trust_options(&postgres, 1))?;
    assert!(select_one(bouncer.port(), "postgres", "")?);
    let admin = Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-h", "127.0.0.1", "-p", &bouncer.port().to_string()])
        .args(["-U", "postgres", "-d", "pgbouncer", "-c", "show version"])
        .output()?;
    let version = String::from_utf8_lossy(&admin.stdout);
    assert!(version.contains("PgBouncer 1.18"), "admin console: {version:?}");
    let pids = bouncer.pids();
    assert_eq!(pids.len(), 1);
    assert!(is_pgbouncer(pids[0]));
    let dir = bouncer.dir().to_path_buf();
    drop(bouncer);
    assert!(!is_pgbouncer(pids[0]));
    assert!(!dir.exists());
    Ok(())
}

// Goal: two processes share the port via so_reuseport and serve; method: check both pids
// are pgbouncer, run several psql sessions, check both processes logged a listening socket.
#[test]
fn two_processes_share_the_port() -> Result<()> {
    let postgres = Postgres::start()?;
    let bouncer = PgBouncer::start(trust_options(&postgres, 2))?;
    let pids = bouncer.pids();
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|&pid| is_pgbouncer(pid)));
    for _ in 0..8 {
        assert!(select_one(bouncer.port(), "postgres", "")?);
    }
    assert!(pids.iter().all(|&pid| is_pgbouncer(pid)));
    for index in 0..2 {
        let log = std::fs::read_to_string(bouncer.dir().join(format!("pgbouncer-{index}.log")))?;
        let listening = format!("listening on 127.0.0.1:{}", bouncer.port());
        assert!(log.contains(&listening), "process {index} log: {log}");
    }
    Ok(())
}

// Goal: md5 auth in PgBouncer checks the userlist password; method: right password works,
// wrong password and unknown user fail.
#[test]
fn md5_auth_rejects_wrong_password() -> Result<()> {
    let postgres = Postgres::start()?;
    let bouncer = PgBouncer::start(PgBouncerOptions {
        backend_port: postgres.port(),
        auth_type: "md5".to_string(),
        users: vec![("postgres".to_string(), "bouncer-pw".to_string())],
        ..PgBouncerOptions::default()
    })?;
    assert!(select_one(bouncer.port(), "postgres", "bouncer-pw")?);
    assert!(!select_one(bouncer.port(), "postgres", "wrong")?);
    assert!(!select_one(bouncer.port(), "nobody", "bouncer-pw")?);
    Ok(())
}

// Goal: a config PgBouncer rejects is reported with its log; method: a taken fixed port.
#[test]
fn failed_start_reports_the_log() -> Result<()> {
    let postgres = Postgres::start()?;
    let error = PgBouncer::start(PgBouncerOptions {
        backend_port: postgres.port(),
        port: Some(postgres.port()),
        ..PgBouncerOptions::default()
    })
    .expect_err("the port is taken by PostgreSQL");
    let text = error.to_string();
    assert!(text.contains("PgBouncer on port"), "{text}");
    Ok(())
}
