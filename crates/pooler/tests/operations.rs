//! Operating the pooler: the admin console, `/metrics`, reload and graceful stop, against a real
//! PostgreSQL 15.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use bypass_pooler::config::PoolMode;
use common::*;
use tokio_postgres::{Client, SimpleQueryMessage};

/// Connects tokio-postgres to the admin console.
async fn console(port: u16, user: &str) -> Result<Client, tokio_postgres::Error> {
    console_with(port, user, None).await
}

async fn console_with(port: u16, user: &str, password: Option<&str>) -> Result<Client, tokio_postgres::Error> {
    connect_db(port, user, password, "bypass").await
}

/// Rows of a console command as (column → value) lists.
async fn rows(client: &Client, sql: &str) -> Vec<Vec<(String, String)>> {
    let messages = client.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    messages
        .into_iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(
                row.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name().to_owned(), row.get(i).unwrap_or_default().to_owned()))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

fn value<'a>(row: &'a [(String, String)], column: &str) -> &'a str {
    row.iter().find(|(name, _)| name == column).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no {column}"))
}

fn admin_config(postgres: &bypass_testkit::Postgres, pool_size: u32) -> bypass_pooler::Config {
    let mut config = config(postgres, PoolMode::Transaction, pool_size);
    config.pooler.admin_users = vec!["postgres".into()];
    config.pooler.stats_users = vec!["watcher".into()];
    config
}

#[test]
fn psql_runs_every_show_command_and_outsiders_are_refused() {
    // Goal: the console answers PgBouncer's SHOW commands under both names and refuses users not
    // listed. Method: psql against `bypass` and `pgbouncer` after some traffic; check columns and
    // the pool's row; an unlisted user gets 28000, a stats user cannot PAUSE (42501).
    let postgres = postgres();
    let pooler = Pooler::start(admin_config(&postgres, 4));
    assert!(psql(pooler.port, "postgres", None, "select 1").status.success());
    let pools = psql_db(pooler.port, "postgres", None, "bypass", "SHOW POOLS");
    assert!(pools.status.success(), "{}", stderr(&pools));
    assert!(stdout(&pools).lines().any(|line| line.starts_with("postgres|postgres|")), "{}", stdout(&pools));
    for command in ["SHOW CLIENTS", "SHOW SERVERS", "SHOW STATS", "SHOW DATABASES", "SHOW CONFIG", "SHOW VERSION"] {
        let output = psql_db(pooler.port, "postgres", None, "pgbouncer", command);
        assert!(output.status.success(), "{command}: {}", stderr(&output));
        assert!(!stdout(&output).is_empty(), "{command} printed nothing");
    }
    let version = stdout(&psql_db(pooler.port, "postgres", None, "bypass", "SHOW VERSION"));
    assert!(version.starts_with("Bypass "), "{version}");
    let outsider = psql_db(pooler.port, "intruder", None, "bypass", "SHOW POOLS");
    assert!(!outsider.status.success());
    assert!(stderr(&outsider).contains("not allowed to use the admin console"), "{}", stderr(&outsider));
    assert!(stderr(&outsider).contains("admin_users"), "the refusal names the setting: {}", stderr(&outsider));
    let watcher = psql_db(pooler.port, "watcher", None, "bypass", "SHOW STATS");
    assert!(watcher.status.success(), "{}", stderr(&watcher));
    let refused = psql_db(pooler.port, "watcher", None, "bypass", "PAUSE");
    assert!(stderr(&refused).contains("admin access needed"), "{}", stderr(&refused));
}

#[tokio::test(flavor = "multi_thread")]
async fn console_errors_carry_sqlstates_and_columns_match_pgbouncer() {
    // Goal: errors are proper ErrorResponses and the common columns have PgBouncer's names.
    // Method: tokio-postgres on the console: unknown command → 42601, unlisted user → 28000;
    // SHOW POOLS/STATS column names and counts after 10 transactions.
    let postgres = postgres();
    let pooler = Pooler::start(admin_config(&postgres, 4));
    let app = connect_ok(pooler.port).await;
    for _ in 0..10 {
        app.simple_query("select 1").await.expect("query");
    }
    let admin = console(pooler.port, "postgres").await.expect("console login");
    let error = admin.simple_query("FROBNICATE").await.expect_err("unknown command");
    assert_eq!(sqlstate(&error).as_deref(), Some("42601"));
    let outsider = console(pooler.port, "intruder").await.expect_err("refused");
    assert_eq!(sqlstate(&outsider).as_deref(), Some("28000"));
    let pools = rows(&admin, "SHOW POOLS").await;
    let pool = pools.iter().find(|row| value(row, "database") == "postgres").expect("pool row");
    assert_eq!(value(pool, "cl_active"), "1");
    assert_eq!(value(pool, "cl_waiting"), "0");
    assert_eq!(value(pool, "pool_mode"), "transaction");
    let stats = rows(&admin, "SHOW STATS").await;
    let stat = stats.iter().find(|row| value(row, "database") == "postgres").expect("stats row");
    assert!(value(stat, "total_xact_count").parse::<u64>().expect("number") >= 10);
    assert!(value(stat, "total_received").parse::<u64>().expect("number") > 0);
    let clients = rows(&admin, "SHOW CLIENTS").await;
    assert!(clients.iter().any(|row| value(row, "database") == "postgres" && value(row, "user") == "postgres"));
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_holds_new_transactions_and_resume_releases_them() {
    // Goal: PAUSE waits for running transactions, then queues clients; RESUME serves them.
    // Method: a client inside a transaction; PAUSE (concurrently) completes only after its COMMIT;
    // a query sent while paused is still pending 300 ms later and answers after RESUME.
    let postgres = postgres();
    let pooler = Pooler::start(admin_config(&postgres, 2));
    let admin = console(pooler.port, "postgres").await.expect("console");
    let app = connect_ok(pooler.port).await;
    app.simple_query("begin; select 1").await.expect("begin");
    let pausing = tokio::spawn(async move { admin.simple_query("PAUSE").await.map(|_| admin) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pausing.is_finished(), "PAUSE returned while a transaction was running");
    app.simple_query("commit").await.expect("commit");
    let admin = pausing.await.expect("task").expect("PAUSE completes after the commit");
    let paused_query =
        tokio::spawn(async move { app.query_one("select 42", &[]).await.map(|row| row.get::<_, i32>(0)) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!paused_query.is_finished(), "a query ran while the pool was paused");
    admin.simple_query("RESUME").await.expect("RESUME");
    assert_eq!(paused_query.await.expect("task").expect("query after RESUME"), 42);
}

#[tokio::test(flavor = "multi_thread")]
async fn reconnect_replaces_servers_and_kill_disconnects_clients() {
    // Goal: RECONNECT closes servers as they come back; KILL drops a database's clients at once.
    // Method: the backend pid before and after RECONNECT differs; after KILL the client's next
    // query fails and a new client still works.
    let postgres = postgres();
    let pooler = Pooler::start(admin_config(&postgres, 1));
    let admin = console(pooler.port, "postgres").await.expect("console");
    let app = connect_ok(pooler.port).await;
    let pid = |row: tokio_postgres::Row| row.get::<_, i32>(0);
    let before = pid(app.query_one("select pg_backend_pid()", &[]).await.expect("pid"));
    admin.simple_query("RECONNECT").await.expect("RECONNECT");
    let after = pid(app.query_one("select pg_backend_pid()", &[]).await.expect("pid"));
    assert_ne!(before, after, "RECONNECT kept the old server");
    admin.simple_query("KILL postgres").await.expect("KILL");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(app.simple_query("select 1").await.is_err(), "a killed client could still query");
    let fresh = connect_ok(pooler.port).await;
    fresh.simple_query("select 1").await.expect("a new client works after KILL");
    let error = admin.simple_query("KILL nosuchdb").await.expect_err("unknown database");
    assert_eq!(sqlstate(&error).as_deref(), Some("3D000"));
}

#[tokio::test(flavor = "multi_thread")]
async fn default_workers_serve_clients_on_every_pinned_shard() {
    // Goal: with `workers = 0` (one pinned shard per CPU, as `bypass up` runs) a pool created by
    // a login on any shard counts every shard. Method: 16 clients (the kernel spreads them over
    // the shards) each log in and query through a pool of 2, so some queue.
    let postgres = postgres();
    let mut config = admin_config(&postgres, 2);
    config.pooler.workers = 0;
    let pooler = Pooler::start_as_configured(config);
    let mut clients = Vec::new();
    for _ in 0..16 {
        clients.push(connect_ok(pooler.port).await);
    }
    let queries = clients.iter().map(|client| client.simple_query("select pg_sleep(0.01)"));
    for result in futures_util::future::join_all(queries).await {
        result.expect("every client is served");
    }
}

fn http_get(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).expect("metrics connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
}

/// The value of one sample line `name{labels} value`.
fn sample(text: &str, prefix: &str) -> f64 {
    let line = text.lines().find(|line| line.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in:\n{text}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("numeric sample")
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_endpoint_exposes_the_series() {
    // Goal: /metrics shows per-pool clients, servers, waiting, transactions, queries, bytes,
    // errors by kind and both latency histograms. Method: 20 transactions and one refused login,
    // then scrape and read the samples; another path gets 404.
    let postgres = postgres();
    let mut config = admin_config(&postgres, 2);
    config.pooler.metrics_addr = Some("127.0.0.1:0".into());
    let pooler = Pooler::start(config);
    let app = connect_ok(pooler.port).await;
    for _ in 0..20 {
        app.simple_query("select 1").await.expect("query");
    }
    let _ = console(pooler.port, "intruder").await;
    let address = pooler.metrics.expect("metrics listener");
    let text = http_get(address, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let labels = "{database=\"postgres\",user=\"postgres\"}";
    assert_eq!(sample(&text, &format!("bypass_clients_active{labels}")), 1.0);
    assert_eq!(sample(&text, &format!("bypass_clients_waiting{labels}")), 0.0);
    assert!(sample(&text, &format!("bypass_servers_idle{labels}")) >= 1.0);
    assert!(sample(&text, &format!("bypass_transactions_total{labels}")) >= 20.0);
    assert!(sample(&text, &format!("bypass_queries_total{labels}")) >= 20.0);
    assert!(sample(&text, &format!("bypass_sent_bytes_total{labels}")) > 0.0);
    if pooler.shared.fastpath.is_some() {
        // The kernel releases transactions without timing them: its own series count them.
        assert!(sample(&text, "bypass_kernel_transactions_total{}") >= 1.0, "{text}");
        assert!(sample(&text, "bypass_kernel_verdicts_total{}") >= 1.0);
        let forwarded = "bypass_kernel_pool_bytes_total{database=\"postgres\",user=\"postgres\",direction=\"answer\",path=\"kernel\"}";
        assert!(sample(&text, forwarded) > 0.0, "{text}");
    } else {
        assert!(sample(&text, "bypass_transaction_seconds_count{database=\"postgres\"") >= 20.0);
        assert!(
            sample(&text, "bypass_wait_seconds_bucket{database=\"postgres\",user=\"postgres\",le=\"+Inf\"}") >= 20.0
        );
    }
    assert_eq!(sample(&text, "bypass_errors_total{kind=\"auth\"}"), 1.0);
    assert!(http_get(address, "/other").starts_with("HTTP/1.1 404"));
}

fn write_config(path: &std::path::Path, port: u16, pool_size: u32, extra: &str) {
    let text = format!(
        "[pooler]\nlisten_addr = \"127.0.0.1:0\"\nworkers = 2\npool_mode = \"transaction\"\nauth_type = \"md5\"\n\
         auth_file = \"users.txt\"\ndefault_pool_size = {pool_size}\nadmin_users = [\"postgres\"]\n\
         query_wait_timeout_ms = 30000\nmax_client_conn = 500\n{extra}\n\
         [databases.postgres]\nport = {port}\nuser = \"postgres\"\n"
    );
    std::fs::write(path, text).expect("write config");
}

/// Servers PostgreSQL sees from pgbench's database user.
fn backend_count(postgres: &bypass_testkit::Postgres) -> u32 {
    let sql = "select count(*) from pg_stat_activity where backend_type = 'client backend' and query not like '%pg_stat_activity%'";
    postgres.psql(sql).expect("count").trim().parse().expect("number")
}

#[test]
fn reload_grows_a_pool_under_load_and_rejects_a_bad_file() {
    // Goal: RELOAD applies a new pool size while clients run, and a bad file changes nothing.
    // Method: pgbench (20 clients, 8 s) on a pool of 2; after 2 s rewrite the file with 6 and
    // RELOAD; PostgreSQL then sees 6 servers, pgbench ends with zero failures; a file with an
    // unknown key is refused with every problem listed and the pool size stays 6.
    let postgres = postgres();
    init_pgbench(&postgres);
    let folder = tempfile::tempdir().expect("tempdir");
    let path = folder.path().join("bypass.toml");
    std::fs::write(folder.path().join("users.txt"), "\"postgres\" \"secret\"\n").expect("users");
    write_config(&path, postgres.port(), 2, "");
    let pooler = Pooler::start_from_file(&path);
    let port = pooler.port;
    let load = std::thread::spawn(move || {
        std::env::set_var("PGPASSWORD", "secret");
        pgbench(port, &["-c", "20", "-j", "2", "-T", "8", "-S"])
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(backend_count(&postgres) <= 2, "the pool was larger than 2 before the reload");
    write_config(&path, postgres.port(), 6, "");
    let reload = psql_db(port, "postgres", Some("secret"), "bypass", "RELOAD");
    assert!(reload.status.success(), "{}", stderr(&reload));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(backend_count(&postgres), 6, "the pool did not grow to 6");
    write_config(&path, postgres.port(), 3, "pool_mdoe = \"session\"");
    let refused = psql_db(port, "postgres", Some("secret"), "bypass", "RELOAD");
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("pool_mdoe"), "{}", stderr(&refused));
    write_config(&path, postgres.port(), 3, "min_pool_size = 50\nmessage_size_max = 10");
    let refused = psql_db(port, "postgres", Some("secret"), "bypass", "RELOAD");
    let problems = stderr(&refused);
    assert!(problems.contains("min_pool_size") && problems.contains("message_size_max"), "{problems}");
    let (processed, failed, text) = load.join().expect("pgbench thread");
    assert_eq!(failed, 0, "{text}");
    assert!(processed > 0, "{text}");
    let pools = pooler.shared.pools();
    assert_eq!(pools[0].limits().size, 6, "the refused file changed the running configuration");
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_adds_databases_and_users_and_moves_clients_to_a_new_backend_name() {
    // Goal: new users and databases work after RELOAD without a restart, and a changed backend
    // database moves connected clients at their next transaction. Method: md5 auth; a user is
    // added to the auth file, a database `fresh` is added and the `postgres` entry is pointed at
    // `template1`; after RELOAD a client connected before sees current_database() = template1,
    // and the new user logs in to both databases.
    let postgres = postgres();
    postgres.psql("create role newbie login password 'fresh'").expect("role");
    let folder = tempfile::tempdir().expect("tempdir");
    let path = folder.path().join("bypass.toml");
    std::fs::write(folder.path().join("users.txt"), "\"postgres\" \"secret\"\n").expect("users");
    write_config(&path, postgres.port(), 2, "");
    let pooler = Pooler::start_from_file(&path);
    let client = connect(pooler.port, "postgres", Some("secret")).await.expect("login");
    let database = |row: tokio_postgres::Row| row.get::<_, String>(0);
    assert_eq!(database(client.query_one("select current_database()", &[]).await.expect("q")), "postgres");
    assert!(connect(pooler.port, "newbie", Some("fresh")).await.is_err(), "unknown user logged in");
    std::fs::write(folder.path().join("users.txt"), "\"postgres\" \"secret\"\n\"newbie\" \"fresh\"\n").expect("users");
    let text = std::fs::read_to_string(&path)
        .expect("read")
        .replace("[databases.postgres]", "[databases.postgres]\ndbname = \"template1\"");
    let text =
        format!("{text}\n[databases.fresh]\nport = {}\ndbname = \"postgres\"\nuser = \"postgres\"\n", postgres.port());
    std::fs::write(&path, text).expect("write");
    let admin = console_with(pooler.port, "postgres", Some("secret")).await.expect("console login");
    admin.simple_query("RELOAD").await.expect("RELOAD");
    assert_eq!(database(client.query_one("select current_database()", &[]).await.expect("q")), "template1");
    let newbie = connect(pooler.port, "newbie", Some("fresh")).await.expect("the new user logs in");
    newbie.simple_query("select 1").await.expect("new user's query");
    let fresh = connect_db(pooler.port, "newbie", Some("fresh"), "fresh").await.expect("the new database is served");
    assert_eq!(database(fresh.query_one("select current_database()", &[]).await.expect("q")), "postgres");
}

#[test]
fn graceful_stop_waits_for_the_running_transaction() {
    // Goal: a graceful stop lets a running transaction commit, then stops. Method: BEGIN + INSERT
    // through the pooler, start stop_gracefully(10 s) on another thread, COMMIT 300 ms later:
    // the commit succeeds, the row is in PostgreSQL, and the stop returns soon after.
    let postgres = postgres();
    postgres.psql("create table graceful (x int)").expect("table");
    let mut pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 2));
    let mut client = RawClient::login(pooler.port);
    simple_query(&mut client, "begin; insert into graceful values (1)");
    let running = pooler.take_running();
    let started = std::time::Instant::now();
    let stopper = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(running.stop_gracefully(Duration::from_secs(10)));
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!stopper.is_finished(), "the stop did not wait for the transaction");
    simple_query(&mut client, "commit");
    stopper.join().expect("stopper");
    assert!(started.elapsed() < Duration::from_secs(9), "the stop waited for its timeout");
    assert_eq!(postgres.psql("select count(*) from graceful").expect("count").trim(), "1");
}

/// Sends a simple query on a raw client and reads to ReadyForQuery; panics on an ErrorResponse.
fn simple_query(client: &mut RawClient, sql: &str) {
    let mut message = Vec::new();
    bypass_wire::frontend::build::query(&mut message, sql);
    client.send(&message);
    let answers = client.read_until(b'Z');
    assert!(answers.iter().any(|(tag, _)| *tag == b'Z'), "no ReadyForQuery for {sql}");
    if let Some((_, body)) = answers.iter().find(|(tag, _)| *tag == b'E') {
        panic!("{sql}: {}", error_code(body));
    }
}
