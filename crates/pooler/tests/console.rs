//! The admin console as PgBouncer tooling uses it: prometheus-community's pgbouncer_exporter
//! query set replayed column by column, and the commands operators script (SUSPEND, RESUME,
//! DISABLE/ENABLE, WAIT_CLOSE, SHOW HELP), against real PostgreSQL.

mod common;

use std::time::Duration;

use bypass_pooler::config::PoolMode;
use common::*;
use tokio_postgres::{Client, SimpleQueryMessage};

/// The columns pgbouncer_exporter (collector.go, `metricMaps`) reads from each `SHOW`: labels
/// must be text, the rest numbers. `reserve_pool` and `reserve_pool_size` name one metric (old
/// and new PgBouncer): exactly one of them may be present, or the exporter reports it twice.
const EXPORTER_DATABASES: [(&str, bool); 12] = [
    ("name", true),
    ("host", true),
    ("port", true),
    ("database", true),
    ("force_user", true),
    ("pool_size", false),
    ("reserve_pool_size", false),
    ("pool_mode", true),
    ("max_connections", false),
    ("current_connections", false),
    ("paused", false),
    ("disabled", false),
];
const EXPORTER_STATS_TOTALS: [(&str, bool); 12] = [
    ("database", true),
    ("query_count", false),
    ("query_time", false),
    ("bytes_received", false),
    ("bytes_sent", false),
    ("wait_time", false),
    ("xact_count", false),
    ("xact_time", false),
    ("client_parse_count", false),
    ("server_parse_count", false),
    ("bind_count", false),
    ("server_assignment_count", false),
];
const EXPORTER_POOLS: [(&str, bool); 14] = [
    ("database", true),
    ("user", true),
    ("cl_active", false),
    ("cl_active_cancel_req", false),
    ("cl_waiting", false),
    ("cl_waiting_cancel_req", false),
    ("sv_active", false),
    ("sv_active_cancel", false),
    ("sv_being_canceled", false),
    ("sv_idle", false),
    ("sv_used", false),
    ("sv_tested", false),
    ("sv_login", false),
    ("maxwait", false),
];
/// The `SHOW LISTS` rows the exporter turns into metrics.
const EXPORTER_LISTS: [&str; 11] = [
    "databases",
    "users",
    "pools",
    "free_clients",
    "used_clients",
    "login_clients",
    "free_servers",
    "used_servers",
    "dns_names",
    "dns_zones",
    "dns_queries",
];

/// Runs one console query; returns (column names, rows), or the error text.
async fn show(console: &Client, sql: &str) -> Result<(Vec<String>, Vec<Vec<Option<String>>>), String> {
    let messages = console.simple_query(sql).await.map_err(|error| describe(&error))?;
    let mut columns = Vec::new();
    let mut rows = Vec::new();
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(description) => {
                columns = description.iter().map(|column| column.name().to_owned()).collect();
            }
            SimpleQueryMessage::Row(row) => {
                rows.push((0..row.len()).map(|index| row.get(index).map(str::to_owned)).collect());
            }
            _ => {}
        }
    }
    Ok((columns, rows))
}

/// An error's server message (tokio-postgres' Display says only "db error").
fn describe(error: &tokio_postgres::Error) -> String {
    error.as_db_error().map(|db| format!("{}: {}", db.code().code(), db.message())).unwrap_or_else(|| error.to_string())
}

/// Runs a console command that must succeed.
async fn run(console: &Client, sql: &str) {
    if let Err(error) = console.simple_query(sql).await {
        panic!("{sql}: {}", describe(&error));
    }
}

fn column(columns: &[String], name: &str) -> Option<usize> {
    columns.iter().position(|column| column == name)
}

/// The exporter's namespace check: every mapped column present, numbers parse.
fn check_mapping(what: &str, columns: &[String], rows: &[Vec<Option<String>>], mapping: &[(&str, bool)]) {
    assert!(!rows.is_empty(), "SHOW {what} returned no rows");
    for (name, is_label) in mapping {
        let index = column(columns, name).unwrap_or_else(|| panic!("SHOW {what} lacks column {name}: {columns:?}"));
        for row in rows {
            let value = row[index].as_deref().unwrap_or_else(|| panic!("SHOW {what}.{name} is NULL"));
            if !is_label {
                assert!(value.parse::<f64>().is_ok(), "SHOW {what}.{name} = {value:?} is not a number");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pgbouncer_exporter_queries_read_every_column() {
    // Goal: prometheus-community's pgbouncer_exporter would report pgbouncer_up 1 and every
    // metric it knows. Method: replay its queries (SHOW STATS as its ping, then VERSION, LISTS,
    // CONFIG, CLIENTS, DATABASES, STATS_TOTALS, POOLS, with its trailing `;`) after some traffic,
    // in both pool modes, and apply its checks to each answer.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let mut config = config(&postgres, mode, 2);
        config.pooler.admin_users = vec!["postgres".into()];
        let pooler = Pooler::start(config);
        let client = connect_ok(pooler.port).await;
        client.query_one("select $1::int", &[&1i32]).await.expect("extended query");
        client.batch_execute("begin; select 1; commit").await.expect("a transaction");
        let console = connect_db(pooler.port, "postgres", None, "pgbouncer").await.expect("console");
        show(&console, "SHOW STATS").await.expect("the exporter's ping");

        let (columns, rows) = show(&console, "SHOW VERSION;").await.expect("version");
        assert_eq!(columns, ["version"], "{mode:?}");
        assert_eq!(rows.len(), 1);

        let (columns, rows) = show(&console, "SHOW LISTS;").await.expect("lists");
        assert_eq!(columns.len(), 2, "{columns:?}");
        for list in EXPORTER_LISTS {
            let row =
                rows.iter().find(|row| row[0].as_deref() == Some(list)).unwrap_or_else(|| panic!("no list {list}"));
            assert!(row[1].as_deref().and_then(|items| items.parse::<f64>().ok()).is_some(), "{list}: {row:?}");
        }

        let (columns, rows) = show(&console, "SHOW CONFIG;").await.expect("config");
        assert!(matches!(columns.len(), 3 | 4), "{columns:?}");
        for key in ["max_client_conn", "max_user_connections"] {
            let row = rows.iter().find(|row| row[0].as_deref() == Some(key)).unwrap_or_else(|| panic!("no {key}"));
            assert!(row[1].as_deref().and_then(|value| value.parse::<f64>().ok()).is_some(), "{key}: {row:?}");
        }

        let (columns, rows) = show(&console, "SHOW CLIENTS;").await.expect("clients");
        for name in ["database", "user", "state", "application_name"] {
            assert!(column(&columns, name).is_some(), "SHOW CLIENTS lacks {name}: {columns:?}");
        }
        assert!(rows.len() >= 2, "the client and the console: {rows:?}");

        let (columns, rows) = show(&console, "SHOW DATABASES;").await.expect("databases");
        check_mapping("DATABASES", &columns, &rows, &EXPORTER_DATABASES);
        assert!(column(&columns, "reserve_pool").is_none(), "reserve_pool and reserve_pool_size would clash");
        let (columns, rows) = show(&console, "SHOW STATS_TOTALS;").await.expect("stats_totals");
        check_mapping("STATS_TOTALS", &columns, &rows, &EXPORTER_STATS_TOTALS);
        let xacts: u64 = rows
            .iter()
            .map(|row| {
                row[column(&columns, "xact_count").expect("xact_count")]
                    .as_deref()
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
            })
            .sum();
        assert!(xacts >= 2, "{mode:?}: transactions counted: {rows:?}");
        let (columns, rows) = show(&console, "SHOW POOLS;").await.expect("pools");
        check_mapping("POOLS", &columns, &rows, &EXPORTER_POOLS);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_show_item_answers_with_pgbouncers_columns() {
    // Goal: each SHOW item PgBouncer has answers (FDS with a clear refusal), with PgBouncer's
    // first columns. Method: run them all on the console after some traffic.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 2);
    config.pooler.admin_users = vec!["postgres".into()];
    let pooler = Pooler::start(config);
    let client = connect_ok(pooler.port).await;
    client.batch_execute("select 1").await.expect("traffic");
    let console = connect_db(pooler.port, "postgres", None, "bypass").await.expect("console");
    let expected: [(&str, &[&str]); 12] = [
        ("STATS", &["database", "total_server_assignment_count", "total_xact_count"]),
        ("STATS_AVERAGES", &["database", "server_assignment_count", "xact_count"]),
        ("TOTALS", &["name", "value"]),
        ("USERS", &["name"]),
        ("MEM", &["name", "size", "used", "free", "memtotal"]),
        ("SOCKETS", &["type", "user", "database", "state"]),
        ("ACTIVE_SOCKETS", &["type", "user", "database", "state"]),
        ("SERVERS", &["type", "user", "database", "state", "addr", "port"]),
        ("STATE", &["key", "value"]),
        ("DNS_HOSTS", &["hostname", "ttl", "addrs"]),
        ("DNS_ZONES", &["zonename", "serial", "count"]),
        ("CLIENTS", &["type", "user", "database", "state", "addr", "port", "local_addr", "local_port"]),
    ];
    for (item, first) in expected {
        let (columns, _) =
            show(&console, &format!("SHOW {item}")).await.unwrap_or_else(|error| panic!("{item}: {error}"));
        assert_eq!(&columns[..first.len()], first, "SHOW {item}");
    }
    let (_, sockets) = show(&console, "SHOW SOCKETS").await.expect("sockets");
    assert!(sockets.iter().any(|row| row[3].as_deref() == Some("sv_idle")), "{sockets:?}");
    let refusal = show(&console, "SHOW FDS").await.expect_err("FDS is refused");
    assert!(refusal.contains("SHOW SOCKETS"), "{refusal}");
    run(&console, "SHOW HELP").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn suspend_disable_and_wait_close_do_what_pgbouncer_does() {
    // Goal: SUSPEND stops new clients until RESUME; DISABLE refuses new logins to one database
    // while its connected clients carry on, ENABLE lets them in again; WAIT_CLOSE returns once
    // the servers RECONNECT marked are closed. Method: real clients around each command.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 2);
    config.pooler.admin_users = vec!["postgres".into()];
    let pooler = Pooler::start(config);
    let console = connect_db(pooler.port, "postgres", None, "bypass").await.expect("console");
    let connected = connect_ok(pooler.port).await;
    connected.batch_execute("select 1").await.expect("traffic");

    run(&console, "DISABLE postgres").await;
    let refused = connect(pooler.port, "postgres", None).await.expect_err("disabled database");
    assert!(describe(&refused).contains("disabled"), "{}", describe(&refused));
    connected.batch_execute("select 2").await.expect("connected clients carry on");
    let (columns, rows) = show(&console, "SHOW DATABASES").await.expect("databases");
    let disabled = column(&columns, "disabled").expect("column");
    assert!(rows.iter().any(|row| row[disabled].as_deref() == Some("1")), "{rows:?}");
    run(&console, "ENABLE postgres").await;
    connect_ok(pooler.port).await;

    run(&console, "SUSPEND").await;
    let port = pooler.port;
    let late = tokio::spawn(async move { connect(port, "postgres", None).await.map(drop) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!late.is_finished(), "a client connecting during SUSPEND waits");
    run(&console, "RESUME").await;
    tokio::time::timeout(Duration::from_secs(10), late)
        .await
        .expect("served after RESUME")
        .expect("task")
        .expect("login");

    run(&console, "RECONNECT postgres").await;
    connected.batch_execute("select 3").await.expect("still served");
    tokio::time::timeout(Duration::from_secs(30), console.simple_query("WAIT_CLOSE postgres"))
        .await
        .expect("WAIT_CLOSE returns")
        .expect("wait_close");
    let (columns, rows) = show(&console, "SHOW SERVERS").await.expect("servers");
    let close_needed = column(&columns, "close_needed").expect("column");
    assert!(rows.iter().all(|row| row[close_needed].as_deref() == Some("0")), "{rows:?}");
}
