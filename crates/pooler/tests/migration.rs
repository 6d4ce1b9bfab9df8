//! What an operator coming from PgBouncer configures: per-user limits (`[users]`,
//! `max_user_connections`), the reserve pool, a Unix-socket listener, startup parameters to
//! ignore or pass on (`options`), and /metrics as scrapers read it; against real PostgreSQL.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bypass_pooler::config::{PoolMode, UserEntry};
use bypass_testkit::{pg_bin, Postgres, TestUser};
use common::*;

/// Backends `user` holds open.
fn backends_of(postgres: &Postgres, user: &str) -> usize {
    let sql =
        format!("select count(*) from pg_stat_activity where usename = '{user}' and backend_type = 'client backend'");
    postgres.psql(&sql).expect("count").parse().expect("number")
}

#[tokio::test(flavor = "multi_thread")]
async fn per_user_pool_size_and_max_user_connections() {
    // Goal: a `[users]` pool_size overrides the database's, and max_user_connections bounds a
    // user's servers across databases, in both pool modes. Method: user `capped` with pool_size 1
    // and max_user_connections 1 holds a transaction on one database; a second client of the
    // same user on another database waits (and times out); the default user is unaffected.
    let postgres = postgres_with_users(vec![TestUser::trust("capped")]);
    postgres.psql("create database other").expect("second database");
    for mode in BOTH_MODES {
        let mut config = config(&postgres, mode, 5);
        config.pooler.query_wait_timeout_ms = 1_000;
        config.users.insert(
            "capped".into(),
            UserEntry { pool_size: Some(1), max_user_connections: Some(1), ..UserEntry::default() },
        );
        let pooler = Pooler::start(config);
        let holder = connect(pooler.port, "capped", None).await.expect("capped connects");
        holder.batch_execute("begin; select 1").await.expect("holds its one server");
        let started = Instant::now();
        let second = connect_db(pooler.port, "capped", None, "other").await;
        let outcome = match second {
            Ok(client) => client.batch_execute("select 1").await.err(),
            Err(error) => Some(error),
        };
        let error = outcome.expect("the second server of `capped` is refused by max_user_connections");
        assert!(
            error.to_string().contains("query_wait_timeout") || format!("{error:?}").contains("query_wait_timeout")
        );
        assert!(started.elapsed() >= Duration::from_millis(900), "{mode:?}: it waited");
        assert!(backends_of(&postgres, "capped") <= 1, "{mode:?}: max_user_connections exceeded");
        let free = connect_ok(pooler.port).await;
        free.batch_execute("select 1").await.expect("other users are not capped");
        holder.batch_execute("commit").await.expect("commit");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reserve_pool_serves_a_client_that_waited() {
    // Goal: with every server busy, a client that waited reserve_pool_timeout gets a reserve
    // server (beyond the pool size) instead of waiting for query_wait_timeout; the reserve server
    // closes again once nobody waits. Method: pool 1 + reserve 1, timeout 300 ms; one client
    // holds the server, a second must be served within about the reserve timeout.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 1);
    config.pooler.reserve_pool_size = 1;
    config.pooler.reserve_pool_timeout_ms = 300;
    config.pooler.query_wait_timeout_ms = 10_000;
    let pooler = Pooler::start(config);
    let holder = connect_ok(pooler.port).await;
    holder.batch_execute("begin; select 1").await.expect("holds the pool's server");
    let waiter = connect_ok(pooler.port).await;
    let started = Instant::now();
    waiter.batch_execute("select 2").await.expect("served from the reserve");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250), "it waited the reserve timeout first: {waited:?}");
    assert!(waited < Duration::from_secs(5), "the reserve served it, not the holder's commit: {waited:?}");
    assert!(backends_of(&postgres, "postgres") >= 2, "a reserve server was opened");
    holder.batch_execute("commit").await.expect("commit");
}

#[test]
fn psql_reaches_the_pooler_through_its_unix_socket() {
    // Goal: `psql -h <unix_socket_dir>` works as with PostgreSQL and PgBouncer. Method: a
    // pooler with unix_socket_dir, psql with the folder as host and the pooler's port, in both
    // pool modes; a second pooler on the same socket is refused.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let folder = tempfile::tempdir().expect("tempdir");
        let mut config = config(&postgres, mode, 2);
        config.pooler.unix_socket_dir = Some(folder.path().to_owned());
        let pooler = Pooler::start(config.clone());
        assert!(folder.path().join(format!(".s.PGSQL.{}", pooler.port)).exists());
        let output = std::process::Command::new(pg_bin("psql"))
            .args(["-X", "-A", "-t", "-U", "postgres", "-d", "postgres", "-c", "select 40 + 2"])
            .arg("-h")
            .arg(folder.path())
            .arg("-p")
            .arg(pooler.port.to_string())
            .output()
            .expect("psql runs");
        assert!(output.status.success(), "{mode:?}: {}", stderr(&output));
        assert_eq!(stdout(&output), "42");
        config.pooler.listen_addr = format!("127.0.0.1:{}", pooler.port);
        let second = config.validate().map(bypass_pooler::Proxy::bind);
        let error = match second {
            Ok(Err(error)) => error,
            other => panic!("a second pooler on the socket must be refused: {:?}", other.map(|bound| bound.is_ok())),
        };
        assert!(error.to_string().contains("already served"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn startup_options_are_refused_ignored_or_passed_on() {
    // Goal: a client's `options` is refused by default (naming the settings), dropped when
    // listed in ignore_startup_parameters, and applied on the server with pass_options, in both
    // pool modes. Method: tokio-postgres with options `-c search_path=custom_path`.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let connect_with_options = |port: u16| async move {
            let mut config = tokio_postgres::Config::new();
            config.host("127.0.0.1").port(port).user("postgres").dbname("postgres");
            config.options("-c search_path=custom_path");
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            Ok::<_, tokio_postgres::Error>(client)
        };
        let pooler = Pooler::start(config(&postgres, mode, 2));
        let Err(refused) = connect_with_options(pooler.port).await else { panic!("options refused by default") };
        let text = refused.as_db_error().map(|db| db.message().to_owned()).unwrap_or_default();
        assert!(text.contains("options") && text.contains("pass_options"), "{mode:?}: {text}");

        let mut ignoring = config(&postgres, mode, 2);
        ignoring.pooler.ignore_startup_parameters = vec!["extra_float_digits".into(), "options".into()];
        let pooler = Pooler::start(ignoring);
        let client = connect_with_options(pooler.port).await.expect("options ignored");
        let path: String = client.query_one("show search_path", &[]).await.expect("query").get(0);
        assert!(!path.contains("custom_path"), "{mode:?}: ignored means not applied: {path}");

        let mut passing = config(&postgres, mode, 2);
        passing.pooler.pass_options = true;
        let pooler = Pooler::start(passing);
        let client = connect_with_options(pooler.port).await.expect("options passed on");
        let path: String = client.query_one("show search_path", &[]).await.expect("query").get(0);
        assert_eq!(path, "custom_path", "{mode:?}");
        let plain = connect_ok(pooler.port).await;
        let path: String = plain.query_one("show search_path", &[]).await.expect("query").get(0);
        assert!(!path.contains("custom_path"), "{mode:?}: a client without options gets its own pool: {path}");
    }
}

fn http(port: u16, request: &str) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(request.as_bytes()).expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_answer_head_and_carry_build_process_and_limits() {
    // Goal: /metrics has build info, process metrics, configured limits as gauges and the
    // finer latency buckets, and answers HEAD with headers only. Method: scrape after traffic.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 3);
    config.pooler.metrics_addr = Some("127.0.0.1:0".into());
    config.pooler.reserve_pool_size = 2;
    let pooler = Pooler::start(config);
    connect_ok(pooler.port).await.batch_execute("select 1").await.expect("traffic");
    let port = pooler.metrics.expect("metrics address").port();
    let body = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    for expected in [
        "bypass_build_info{version=\"",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "bypass_config_max_client_connections 2000",
        "bypass_pool_size{database=\"postgres\",user=\"postgres\"} 3",
        "bypass_pool_reserve_size{database=\"postgres\",user=\"postgres\"} 2",
        "le=\"0.001\"",
        "le=\"0.0025\"",
        "le=\"0.25\"",
        "le=\"2.5\"",
        "le=\"5\"",
    ] {
        assert!(body.contains(expected), "{expected} missing from:\n{body}");
    }
    let head = http(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("Content-Length: "))
        .and_then(|value| value.trim().parse().ok())
        .expect("a length");
    assert!(length > 1000, "HEAD tells the body's length: {length}");
    let post = http(port, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
}
