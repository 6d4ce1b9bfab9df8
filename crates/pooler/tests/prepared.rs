//! Prepared statements in transaction mode: a client's named statements work on whichever server
//! its transaction lands on, names never collide between clients, and every answer reaches the
//! client in the order PostgreSQL itself would send it.

mod common;

use bypass_pooler::config::PoolMode;
use bypass_wire::frontend::build;
use bypass_wire::FrontendMessage;
use common::*;
use futures_util::future::try_join_all;

#[test]
fn pgbench_prepared_100_clients_on_a_pool_of_10() {
    // Goal: the classic failure of other poolers does not happen. Method: pgbench -M prepared, 100
    // clients on 10 servers in transaction mode, TPC-B-like and select-only: zero failures.
    // One pgbench thread per client: pgbench prepares with the blocking PQprepare, so with fewer
    // threads a client waiting for a server would stall the thread whose client holds one.
    let postgres = postgres();
    init_pgbench(&postgres);
    let mut config = config(&postgres, PoolMode::Transaction, 10);
    config.pooler.max_client_conn = 500;
    let pooler = Pooler::start(config);
    for script in [&["-b", "tpcb-like"][..], &["-S"][..]] {
        let mut args = vec!["-c", "100", "-j", "100", "-t", "50", "-M", "prepared"];
        args.extend_from_slice(script);
        let (processed, failed, text) = pgbench(pooler.port, &args);
        assert_eq!((processed, failed), (5000, 0), "{script:?}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn same_statement_name_different_sql_in_two_clients() {
    // Goal: statement names are private to each client. Method: two tokio-postgres clients both
    // prepare their first statement (both named "s0" by the driver) with different SQL, on a pool
    // of one server, and execute them in alternation.
    let postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 1));
    let one = connect_ok(pooler.port).await;
    let two = connect_ok(pooler.port).await;
    let add = one.prepare("select $1::int + 1").await.expect("prepare");
    let mul = two.prepare("select $1::int * 10").await.expect("prepare");
    for i in 0..20i32 {
        assert_eq!(one.query_one(&add, &[&i]).await.expect("add").get::<_, i32>(0), i + 1);
        assert_eq!(two.query_one(&mul, &[&i]).await.expect("mul").get::<_, i32>(0), i * 10);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn statements_survive_eviction_and_many_servers() {
    // Goal: a server's statement cache is bounded and eviction is invisible to clients. Method:
    // max_prepared_statements = 2; 8 clients each use 5 statements across transactions on 3
    // servers; every answer is checked, and no server ever holds more than 2 of our statements.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 3);
    config.pooler.max_prepared_statements = 2;
    let pooler = Pooler::start(config);
    let work = (0..8).map(|client_id: i32| async move {
        let client = connect_ok(pooler.port).await;
        let mut statements = Vec::new();
        for k in 0..5i32 {
            statements.push(client.prepare(&format!("select $1::int * {k} + {client_id}")).await?);
        }
        for round in 0..10i32 {
            for (k, statement) in statements.iter().enumerate() {
                let value: i32 = client.query_one(statement, &[&round]).await?.get(0);
                assert_eq!(value, round * k as i32 + client_id);
            }
            let ours: i64 = client
                .query_one("select count(*) from pg_prepared_statements where name like '\\_bypass\\_p%'", &[])
                .await?
                .get(0);
            assert!(ours <= 2, "a server holds {ours} statements");
        }
        Ok::<_, tokio_postgres::Error>(())
    });
    try_join_all(work).await.expect("all clients succeed");
}

/// Reads messages up to and including the `count`-th ReadyForQuery; returns their tags.
fn tags_until_ready(raw: &mut RawClient, count: usize) -> Vec<u8> {
    let mut tags = Vec::new();
    let mut seen = 0;
    while seen < count {
        let (tag, _) = raw.read_message().expect("answer");
        tags.push(tag);
        seen += usize::from(tag == b'Z');
    }
    tags
}

fn extended(buf: &mut Vec<u8>, name: &str, sql: Option<&str>, sync: bool) {
    if let Some(sql) = sql {
        build::parse(buf, name, sql, &[]);
    }
    build::bind(buf, "", name, &[]);
    FrontendMessage::Execute { portal: b"", max_rows: 0 }.encode(buf);
    if sync {
        build::sync(buf);
    }
}

#[test]
fn answers_keep_postgres_order_when_parse_is_skipped() {
    // Goal: a Parse the pooler does not send still gets its ParseComplete in the right place.
    // Method: pool of one server; client A prepares "s" (the server learns it); client B sends the
    // same text under its own name, pipelined behind a statement the server does not have yet. B
    // must see exactly the tags PostgreSQL sends for that pipeline.
    let postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 1));
    let mut a = RawClient::login(pooler.port);
    let mut request = Vec::new();
    extended(&mut request, "s", Some("select 1"), true);
    a.send(&request);
    assert_eq!(tags_until_ready(&mut a, 1), b"12DCZ");

    let mut b = RawClient::login(pooler.port);
    let mut pipeline = Vec::new();
    extended(&mut pipeline, "fresh", Some("select 2"), false);
    extended(&mut pipeline, "mine", Some("select 1"), true);
    extended(&mut pipeline, "mine", None, true);
    b.send(&pipeline);
    assert_eq!(tags_until_ready(&mut b, 2), b"12DC12DCZ2DCZ");
}

#[test]
fn errors_mid_pipeline_drop_what_postgres_would_skip() {
    // Goal: after an error, no made-up answer leaks out for requests the server skipped. Method:
    // a pipeline of [bad Parse, Parse of a known statement, Bind, Execute, Sync] then a valid
    // request: PostgreSQL answers only E Z, then 1 2 D C Z.
    let postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 1));
    let mut a = RawClient::login(pooler.port);
    let mut warm = Vec::new();
    extended(&mut warm, "known", Some("select 7"), true);
    a.send(&warm);
    assert_eq!(tags_until_ready(&mut a, 1), b"12DCZ");
    let mut pipeline = Vec::new();
    build::parse(&mut pipeline, "bad", "selec nonsense", &[]);
    extended(&mut pipeline, "again", Some("select 7"), true);
    extended(&mut pipeline, "later", Some("select 8"), true);
    a.send(&pipeline);
    assert_eq!(tags_until_ready(&mut a, 2), b"EZ12DCZ");
}

#[test]
fn close_and_deallocate_forget_client_names() {
    // Goal: Close and DEALLOCATE ALL behave as on a plain server. Method: after Close of "s" a
    // Bind of "s" fails with 26000; after DEALLOCATE ALL, "t" is gone too; re-preparing works.
    let postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 2));
    let mut raw = RawClient::login(pooler.port);
    let mut request = Vec::new();
    extended(&mut request, "s", Some("select 1"), true);
    extended(&mut request, "t", Some("select 2"), true);
    raw.send(&request);
    tags_until_ready(&mut raw, 2);

    let mut close = Vec::new();
    FrontendMessage::Close { kind: bypass_wire::frontend::DescribeKind::Statement, name: b"s" }.encode(&mut close);
    build::sync(&mut close);
    extended(&mut close, "s", None, true);
    raw.send(&close);
    let answers: Vec<(u8, Vec<u8>)> = (0..4).map(|_| raw.read_message().expect("answer")).collect();
    let tags: Vec<u8> = answers.iter().map(|(tag, _)| *tag).collect();
    assert_eq!(tags, b"3ZEZ");
    assert_eq!(error_code(&answers[2].1), "26000");

    let mut deallocate = Vec::new();
    build::query(&mut deallocate, "DEALLOCATE ALL");
    extended(&mut deallocate, "t", None, true);
    extended(&mut deallocate, "t", Some("select 3"), true);
    raw.send(&deallocate);
    assert_eq!(tags_until_ready(&mut raw, 3), b"CZEZ12DCZ");
}
