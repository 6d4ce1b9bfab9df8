//! Limits and lifecycle: max_client_conn, min_pool_size, server_idle_timeout, server_lifetime,
//! client_idle_timeout, idle_transaction_timeout, max_db_connections, the session-mode reset and
//! parameter sync between clients that share servers.

mod common;

use std::time::Duration;

use bypass_pooler::config::{DatabaseEntry, PoolMode};
use bypass_testkit::Postgres;
use common::*;

/// Backends the pooler holds open (all connections except the test's own psql).
fn pooled_backends(postgres: &Postgres) -> usize {
    postgres
        .psql("select count(*) from pg_stat_activity where backend_type = 'client backend' and pid <> pg_backend_pid()")
        .expect("count")
        .parse()
        .expect("number")
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..100 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen within 10 s");
}

#[tokio::test(flavor = "multi_thread")]
async fn max_client_conn_refuses_the_extra_client() {
    // Goal: the client limit holds with a clear 53300. Method: max_client_conn 3; the fourth
    // concurrent client is refused; once one leaves, a new one gets in.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 2);
    config.pooler.max_client_conn = 3;
    let pooler = Pooler::start(config);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(connect_ok(pooler.port).await);
    }
    let error = connect(pooler.port, "postgres", None).await.expect_err("fourth client refused");
    assert_eq!(sqlstate(&error).as_deref(), Some("53300"), "{error}");
    drop(clients.pop());
    eventually("a slot frees up", || pooler.shared.client_connections.load(std::sync::atomic::Ordering::Acquire) == 2)
        .await;
    connect_ok(pooler.port).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn min_pool_size_idle_timeout_and_lifetime() {
    // Goal: the pool keeps min_pool_size servers, closes idle ones above it after
    // server_idle_timeout, and replaces servers older than server_lifetime. Method: count
    // backends in pg_stat_activity as the pooler's maintenance runs.
    let postgres = postgres();
    let mut settings = config(&postgres, PoolMode::Transaction, 5);
    settings.pooler.min_pool_size = 2;
    settings.pooler.server_idle_timeout_ms = 500;
    let pooler = Pooler::start(settings);
    let clients = [connect_ok(pooler.port).await, connect_ok(pooler.port).await, connect_ok(pooler.port).await];
    for client in &clients {
        client.batch_execute("begin").await.expect("begin");
    }
    assert!(pooled_backends(&postgres) >= 3);
    for client in &clients {
        client.batch_execute("commit").await.expect("commit");
    }
    eventually("idle servers above min_pool_size close", || pooled_backends(&postgres) == 2).await;

    drop(clients);
    drop(pooler);
    let mut settings = config(&postgres, PoolMode::Transaction, 2);
    settings.pooler.server_lifetime_ms = 300;
    let pooler = Pooler::start(settings);
    let client = connect_ok(pooler.port).await;
    let first: i32 = client.query_one("select pg_backend_pid()", &[]).await.expect("pid").get(0);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let second: i32 = client.query_one("select pg_backend_pid()", &[]).await.expect("pid").get(0);
    assert_ne!(first, second, "a server past its lifetime was reused");
}

#[tokio::test(flavor = "multi_thread")]
async fn client_idle_and_idle_transaction_timeouts_disconnect() {
    // Goal: idle clients and clients idle inside a transaction are disconnected with the right
    // SQLSTATE and their server is freed. Method: 400 ms timeouts, then wait past them.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 1);
    config.pooler.client_idle_timeout_ms = 400;
    config.pooler.idle_transaction_timeout_ms = 400;
    let pooler = Pooler::start(config);

    let idle = RawClient::login(pooler.port);
    let mut idle = idle;
    let message = idle.read_message().expect("an error before the close");
    assert_eq!((message.0, error_code(&message.1)), (b'E', "57P05".to_owned()));
    assert!(idle.is_closed());

    let mut in_transaction = RawClient::login(pooler.port);
    let mut begin = Vec::new();
    bypass_wire::frontend::build::query(&mut begin, "begin");
    in_transaction.send(&begin);
    in_transaction.read_until(b'Z');
    let message = in_transaction.read_until(b'E').pop().expect("an error");
    assert_eq!(error_code(&message.1), "25P03");
    assert!(in_transaction.is_closed());
    let output = psql(pooler.port, "postgres", None, "select 'server was freed'");
    assert_eq!(stdout(&output), "server was freed", "{}", stderr(&output));
}

#[tokio::test(flavor = "multi_thread")]
async fn max_db_connections_is_shared_by_the_pools_of_a_database() {
    // Goal: two users' pools of one database never hold more servers together than
    // max_db_connections, and a waiting pool gets a slot from the other's idle servers.
    // Method: limit 2, pool size 2 each; user A parks 2 idle servers; user B must still be served.
    let postgres = postgres_with_users(vec![bypass_testkit::TestUser::trust("userb")]);
    let mut config = config(&postgres, PoolMode::Transaction, 2);
    config.pooler.max_db_connections = 2;
    let pooler = Pooler::start(config);
    let a1 = connect_ok(pooler.port).await;
    let a2 = connect_ok(pooler.port).await;
    a1.batch_execute("begin").await.expect("begin");
    a2.batch_execute("begin").await.expect("begin");
    a1.batch_execute("commit").await.expect("commit");
    a2.batch_execute("commit").await.expect("commit");
    let b = connect(pooler.port, "userb", None).await.expect("user b connects");
    let who: String = b.query_one("select current_user::text", &[]).await.expect("user b served").get(0);
    assert_eq!(who, "userb");
    assert!(pooled_backends(&postgres) <= 2, "max_db_connections exceeded");
}

#[tokio::test(flavor = "multi_thread")]
async fn session_mode_resets_a_server_before_reuse() {
    // Goal: nothing a session left behind reaches the next client. Method: pool of 1 in session
    // mode; client 1 prepares a statement and sets a GUC, then leaves; client 2 gets the same
    // backend and finds neither.
    let postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Session, 1));
    let first = connect_ok(pooler.port).await;
    let pid: i32 = first.query_one("select pg_backend_pid()", &[]).await.expect("pid").get(0);
    first.batch_execute("prepare leftover as select 1; set work_mem = '7MB'").await.expect("session state");
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = connect_ok(pooler.port).await;
    let second_pid: i32 = second.query_one("select pg_backend_pid()", &[]).await.expect("pid").get(0);
    assert_eq!(pid, second_pid, "the server was reused");
    let error = second.batch_execute("execute leftover").await.expect_err("statement discarded");
    assert_eq!(sqlstate(&error).as_deref(), Some("26000"));
    let work_mem: String = second.query_one("show work_mem", &[]).await.expect("show").get(0);
    assert_eq!(work_mem, "4MB");
}

#[tokio::test(flavor = "multi_thread")]
async fn parameters_follow_each_client_across_shared_servers() {
    // Goal: each client sees its own application_name and TimeZone although they share one
    // server. Method: two clients with different startup values alternate on a pool of 1.
    let postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 1));
    let connect_as = |name: &'static str, zone: &'static str| async move {
        let mut config = tokio_postgres::Config::new();
        config.host("127.0.0.1").port(pooler.port).user("postgres").dbname("postgres").application_name(name);
        config.options(""); // tokio-postgres sends it even when empty; the pooler accepts that
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        client.batch_execute(&format!("set timezone = '{zone}'")).await.expect("set timezone");
        client
    };
    let tokyo = connect_as("tokyo-app", "Asia/Tokyo").await;
    let lima = connect_as("lima-app", "America/Lima").await;
    for _ in 0..5 {
        for (client, name, zone) in [(&tokyo, "tokyo-app", "Asia/Tokyo"), (&lima, "lima-app", "America/Lima")] {
            let row = client
                .query_one("select current_setting('application_name'), current_setting('TimeZone')", &[])
                .await
                .expect("settings");
            assert_eq!((row.get::<_, &str>(0), row.get::<_, &str>(1)), (name, zone));
        }
    }
}

#[test]
fn unknown_database_is_refused_with_3d000() {
    // Goal: a database missing from [databases] gets a clear error. Method: only "app" is
    // configured; psql asks for "postgres".
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 1);
    config.databases = [("app".to_owned(), DatabaseEntry { port: postgres.port(), ..DatabaseEntry::default() })].into();
    let pooler = Pooler::start(config);
    let output = psql(pooler.port, "postgres", None, "select 1");
    assert!(stderr(&output).contains("no such database: postgres"), "{}", stderr(&output));
}
