//! Integration tests for `Postgres`: real initdb/pg_ctl/psql processes.

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use anyhow::{ensure, Result};
use bypass_testkit::{pg_bin, AuthMethod, Postgres, PostgresOptions, TestUser};

/// Whether `psql` can log in as `user` with `password` and run `select 1`.
fn login_works(postgres: &Postgres, user: &str, password: &str) -> Result<bool> {
    let output = Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-w", "-h", postgres.host()])
        .args(["-p", &postgres.port().to_string(), "-U", user, "-d", "postgres"])
        .args(["-c", "select 1"])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(output.status.success() && stdout.trim() == "1")
}

fn accepts(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

// Goal: a default cluster answers queries; method: start, psql("select 1"), check accessors.
#[test]
fn starts_and_answers_queries() -> Result<()> {
    let postgres = Postgres::start()?;
    assert_eq!(postgres.psql("select 1")?, "1");
    assert_eq!(postgres.host(), "127.0.0.1");
    assert!(postgres.data_dir().join("PG_VERSION").exists());
    assert_eq!(
        postgres.connection_string("alice", "db"),
        format!("host=127.0.0.1 port={} user=alice dbname=db", postgres.port())
    );
    assert_eq!(postgres.psql("show fsync")?, "off");
    assert_eq!(postgres.psql("show listen_addresses")?, "127.0.0.1");
    Ok(())
}

// Goal: md5 and scram users really need their password, trust users do not; method: create
// one user per method, log in with psql + PGPASSWORD right and wrong, inspect pg_authid.
#[test]
fn users_authenticate_with_their_method() -> Result<()> {
    let postgres = Postgres::start_with(PostgresOptions {
        users: vec![
            TestUser::trust("trusty"),
            TestUser::md5("md5user", "md5-secret"),
            TestUser::scram("scramuser", "scram 'secret'"),
        ],
        ..PostgresOptions::default()
    })?;
    assert!(login_works(&postgres, "trusty", "anything")?);
    assert!(login_works(&postgres, "md5user", "md5-secret")?);
    assert!(!login_works(&postgres, "md5user", "wrong")?);
    assert!(login_works(&postgres, "scramuser", "scram 'secret'")?);
    assert!(!login_works(&postgres, "scramuser", "wrong")?);
    let md5_stored = postgres.psql("select rolpassword like 'md5%' from pg_authid where rolname = 'md5user'")?;
    assert_eq!(md5_stored, "t");
    let scram_stored =
        postgres.psql("select rolpassword like 'SCRAM-SHA-256$%' from pg_authid where rolname = 'scramuser'")?;
    assert_eq!(scram_stored, "t");
    assert_eq!(postgres.psql("select rolsuper from pg_roles where rolname = 'trusty'")?, "t");
    Ok(())
}

// Goal: options reach the server; method: set max_connections, shared_buffers and an extra
// line, then read them back with SHOW.
#[test]
fn options_reach_postgresql_conf() -> Result<()> {
    let postgres = Postgres::start_with(PostgresOptions {
        max_connections: 42,
        shared_buffers_mb: 32,
        extra_conf: vec!["synchronous_commit = off".to_string()],
        ..PostgresOptions::default()
    })?;
    assert_eq!(postgres.psql("show max_connections")?, "42");
    assert_eq!(postgres.psql("show shared_buffers")?, "32MB");
    assert_eq!(postgres.psql("show synchronous_commit")?, "off");
    Ok(())
}

// Goal: a crash and restart keeps committed data and the port; method: insert, kill(),
// check the port is closed, start_again(), select.
#[test]
fn kill_then_start_again_keeps_data() -> Result<()> {
    let mut postgres = Postgres::start()?;
    let port = postgres.port();
    postgres.psql("create table t(x int); insert into t values (7)")?;
    postgres.kill();
    postgres.kill(); // idempotent
    assert!(!accepts(port));
    assert!(postgres.psql("select 1").is_err());
    postgres.start_again()?;
    assert_eq!(postgres.port(), port);
    assert_eq!(postgres.psql("select x from t")?, "7");
    postgres.stop()?;
    postgres.stop()?; // idempotent
    assert!(!accepts(port));
    postgres.start_again()?;
    assert_eq!(postgres.psql("select count(*) from t")?, "1");
    Ok(())
}

// Goal: dropping a cluster stops it and removes its temp dir; method: drop, then check the
// data dir path and the port.
#[test]
fn drop_removes_dir_and_closes_port() -> Result<()> {
    let postgres = Postgres::start()?;
    let port = postgres.port();
    let data_dir = postgres.data_dir().to_path_buf();
    ensure!(data_dir.exists() && accepts(port), "cluster not up");
    drop(postgres);
    assert!(!data_dir.exists(), "{} still exists", data_dir.display());
    assert!(!accepts(port), "port {port} still accepts");
    Ok(())
}

// Goal: a cluster is cleaned up even when a test panics; method: panic inside
// catch_unwind while holding a cluster, then check dir and port.
#[test]
fn drop_during_unwinding_cleans_up() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let postgres = Postgres::start().expect("start cluster");
        tx.send((postgres.port(), postgres.data_dir().to_path_buf())).expect("send info");
        panic!("simulated test failure");
    });
    assert!(result.is_err());
    let (port, data_dir) = rx.recv().expect("cluster info");
    assert!(!data_dir.exists());
    assert!(!accepts(port));
}

// Goal: backend_pids lists other client backends only; method: hold a psql session open
// with pg_sleep in the background and look for a pid that is not ours.
#[test]
fn backend_pids_sees_other_clients() -> Result<()> {
    let postgres = Postgres::start()?;
    assert!(postgres.backend_pids()?.is_empty());
    let mut sleeper = Command::new(pg_bin("psql"))
        .args(["-X", "-h", "127.0.0.1", "-p", &postgres.port().to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-c", "select pg_sleep(30)"])
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let mut pids = Vec::new();
    for _ in 0..100 {
        pids = postgres.backend_pids()?;
        if !pids.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    sleeper.kill()?;
    sleeper.wait()?;
    assert_eq!(pids.len(), 1, "pids: {pids:?}");
    Ok(())
}

// Goal: a persistent data dir survives drop and is reused without initdb; method: start on
// a dir, write, drop, start again on the same dir (new port), read, check fsync stays on.
#[test]
fn persistent_data_dir_is_reused() -> Result<()> {
    let parent = tempfile::tempdir()?;
    // The postgres OS user must traverse the parent; tempdir() makes it 0700 root.
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755))?;
    let dir = parent.path().join("pgdata");
    let options = || PostgresOptions {
        data_dir: Some(dir.clone()),
        users: vec![TestUser {
            name: "keeper".to_string(),
            password: Some("pw".to_string()),
            auth: AuthMethod::ScramSha256,
        }],
        ..PostgresOptions::default()
    };
    let first = Postgres::start_with(options())?;
    first.psql("create table kept(x int); insert into kept values (1)")?;
    assert_eq!(first.psql("show fsync")?, "on");
    let first_port = first.port();
    drop(first);
    assert!(dir.join("PG_VERSION").exists());
    let second = Postgres::start_with(options())?;
    assert_ne!(second.port(), first_port);
    assert_eq!(second.psql("select x from kept")?, "1");
    assert!(login_works(&second, "keeper", "pw")?);
    Ok(())
}

// Goal: a failed start reports the server log; method: pass an invalid setting and look
// for PostgreSQL's complaint in the error text.
#[test]
fn failed_start_quotes_the_log() {
    let error = Postgres::start_with(PostgresOptions {
        extra_conf: vec!["no_such_setting_xyz = 1".to_string()],
        port: Some(bypass_testkit::free_port()),
        ..PostgresOptions::default()
    })
    .expect_err("start must fail");
    let text = error.to_string();
    assert!(text.contains("no_such_setting_xyz"), "{text}");
}
