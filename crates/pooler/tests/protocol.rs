//! Clients through the pooler against real PostgreSQL, in session and transaction mode: drivers,
//! psql, pgbench and pipelined requests.

mod common;

use bypass_pooler::config::PoolMode;
use common::*;
use futures_util::future::try_join_all;

#[tokio::test(flavor = "multi_thread")]
async fn tokio_postgres_simple_and_extended_protocol_in_both_modes() {
    // Goal: simple and extended queries return the right rows. Method: tokio-postgres through the
    // pooler in each mode, with text, parameters, NULLs and a multi-row result.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let pooler = Pooler::start(config(&postgres, mode, 4));
        let client = connect_ok(pooler.port).await;
        let simple = client.simple_query("select 1 as a, 'x' as b; select 2").await.expect("simple query");
        let rows: Vec<_> = simple
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).expect("value").to_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(rows, vec!["1", "2"], "{mode:?}");
        let row = client.query_one("select $1::int + 1, $2::text", &[&41i32, &"hi"]).await.expect("extended query");
        assert_eq!((row.get::<_, i32>(0), row.get::<_, &str>(1)), (42, "hi"));
        let null: Option<i32> = client.query_one("select null::int", &[]).await.expect("null").get(0);
        assert_eq!(null, None);
        let many = client.query("select g from generate_series(1, 50000) g", &[]).await.expect("big result");
        assert_eq!(many.len(), 50_000);
        assert_eq!(many[49_999].get::<_, i32>(0), 50_000);
        let statement = client.prepare("select $1::bigint * 2").await.expect("prepare");
        for i in 0..20i64 {
            assert_eq!(client.query_one(&statement, &[&i]).await.expect("execute").get::<_, i64>(0), i * 2);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn transactions_keep_their_server_in_transaction_mode() {
    // Goal: statements of one transaction run on one backend, and its writes are atomic. Method:
    // 8 clients on a pool of 2 each run BEGIN / insert / pg_backend_pid twice / COMMIT.
    let postgres = postgres();
    postgres.psql("create table t (client int, value int)").expect("create");
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 2));
    let work = (0..8).map(|id| async move {
        let mut client = connect_ok(pooler.port).await;
        for round in 0..25 {
            let tx = client.transaction().await?;
            let first: i32 = tx.query_one("select pg_backend_pid()", &[]).await?.get(0);
            tx.execute("insert into t values ($1, $2)", &[&id, &round]).await?;
            let second: i32 = tx.query_one("select pg_backend_pid()", &[]).await?.get(0);
            assert_eq!(first, second, "a transaction moved between backends");
            tx.commit().await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    });
    try_join_all(work).await.expect("all transactions succeed");
    assert_eq!(postgres.psql("select count(*) from t").expect("count"), "200");
}

#[test]
fn psql_works_in_both_modes() {
    // Goal: the reference client works. Method: psql -c with several statements, in each mode.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let pooler = Pooler::start(config(&postgres, mode, 2));
        let output = psql(pooler.port, "postgres", None, "select 6 * 7");
        assert!(output.status.success(), "{mode:?}: {}", stderr(&output));
        assert_eq!(stdout(&output), "42");
        let output = psql(pooler.port, "postgres", None, "select current_setting('application_name')");
        assert_eq!(stdout(&output), "psql", "application_name from the startup packet reaches the server");
    }
}

#[test]
fn pgbench_runs_without_failures_in_every_protocol_mode() {
    // Goal: zero failed transactions under concurrency. Method: pgbench TPC-B-like and select-only
    // runs with -M simple and extended in both modes, and -M prepared in session mode.
    let postgres = postgres();
    let port = postgres.port().to_string();
    let init = std::process::Command::new(bypass_testkit::pg_bin("pgbench"))
        .args(["-i", "-q", "-s", "1", "-h", "127.0.0.1", "-U", "postgres", "-p", &port, "postgres"])
        .output()
        .expect("pgbench -i");
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    for mode in BOTH_MODES {
        let pooler = Pooler::start(config(&postgres, mode, 5));
        let mut protocols = vec!["simple", "extended"];
        if mode == PoolMode::Session {
            protocols.push("prepared");
        }
        for protocol in protocols {
            for script in [&["-b", "tpcb-like"][..], &["-S"][..]] {
                let mut args = vec!["-c", "10", "-j", "2", "-t", "200", "-M", protocol];
                if mode == PoolMode::Session {
                    args[1] = "5"; // session mode holds one server per client
                }
                args.extend_from_slice(script);
                let (processed, failed, text) = pgbench(pooler.port, &args);
                assert_eq!(failed, 0, "{mode:?} {protocol} {script:?}:\n{text}");
                assert!(processed >= 1000, "{mode:?} {protocol} {script:?}:\n{text}");
            }
        }
    }
}

#[test]
fn pgbench_pipeline_script_in_transaction_mode() {
    // Goal: pipelined requests are not cut at the first ReadyForQuery. Method: a pgbench script
    // with \startpipeline and four statements, 20 clients on a pool of 2.
    let postgres = postgres();
    postgres.psql("create table counter (n int); insert into counter values (0)").expect("setup");
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 2));
    let script = std::env::temp_dir().join(format!("pipeline-{}.sql", std::process::id()));
    std::fs::write(
        &script,
        "\\startpipeline\nselect 1;\nupdate counter set n = n + 1;\nselect pg_backend_pid();\nselect 2;\n\\endpipeline\n",
    )
    .expect("script");
    let script_path = script.to_string_lossy().into_owned();
    let (processed, failed, text) =
        pgbench(pooler.port, &["-c", "20", "-j", "2", "-t", "100", "-M", "extended", "-f", &script_path]);
    let _ = std::fs::remove_file(&script);
    assert_eq!((processed, failed), (2000, 0), "{text}");
    assert_eq!(postgres.psql("select n from counter").expect("count"), "2000");
}

#[test]
fn pipelined_batches_hold_the_server_until_the_last_answer() {
    // Goal: a server returns to the pool only when every pipelined Sync has been answered.
    // Method: pool of 1; client A sends two Sync-terminated batches in one write, the second slow;
    // client B queries meanwhile. If the server were released after A's first ReadyForQuery, B's
    // query would be sent to it while A's second batch runs and the answers would cross.
    let postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 1));
    let mut a = RawClient::login(pooler.port);
    let mut batch = Vec::new();
    for sql in ["select 'first'", "select pg_sleep(0.5)::text || 'second'"] {
        bypass_wire::frontend::build::parse(&mut batch, "", sql, &[]);
        bypass_wire::frontend::build::bind(&mut batch, "", "", &[]);
        bypass_wire::FrontendMessage::Execute { portal: b"", max_rows: 0 }.encode(&mut batch);
        bypass_wire::frontend::build::sync(&mut batch);
    }
    a.send(&batch);
    let b_thread = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mut b = RawClient::login(pooler.port);
        let mut query = Vec::new();
        bypass_wire::frontend::build::query(&mut query, "select 'b-answer'");
        b.send(&query);
        let answer = b.read_until(b'Z');
        (answer, pooler)
    });
    let first = a.read_until(b'Z');
    let second = a.read_until(b'Z');
    let (b_answer, _pooler) = b_thread.join().expect("client B");
    let rows = |messages: &[(u8, Vec<u8>)]| -> Vec<String> {
        messages
            .iter()
            .filter(|(t, _)| *t == b'D')
            .map(|(_, body)| String::from_utf8_lossy(&body[6..]).into_owned())
            .collect()
    };
    assert_eq!(rows(&first), vec!["first"]);
    assert_eq!(rows(&second), vec!["second"]);
    assert_eq!(rows(&b_answer), vec!["b-answer"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn tokio_postgres_pipelines_concurrent_queries() {
    // Goal: a driver that pipelines (tokio-postgres sends queries without waiting) gets every
    // answer in order. Method: 200 concurrent queries on one connection, pool of 1.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let pooler = Pooler::start(config(&postgres, mode, 1));
        let client = connect_ok(pooler.port).await;
        let queries = (0..200i32).map(|i| {
            let client = &client;
            async move { client.query_one("select $1::int * 3", &[&i]).await.map(|row| (i, row.get::<_, i32>(0))) }
        });
        for (i, tripled) in try_join_all(queries).await.expect("pipelined queries") {
            assert_eq!(tripled, i * 3, "{mode:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_in_and_out_through_the_pooler() {
    // Goal: the COPY sub-protocol passes through and releases the server only after it ends.
    // Method: COPY FROM STDIN of 10,000 rows then COPY TO STDOUT, pool of 1, transaction mode.
    use futures_util::{SinkExt, StreamExt};
    let postgres = postgres();
    postgres.psql("create table c (n int, s text)").expect("create");
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 1));
    let client = connect_ok(pooler.port).await;
    let sink = client.copy_in("copy c from stdin").await.expect("copy in");
    futures_util::pin_mut!(sink);
    let mut data = String::new();
    for n in 0..10_000 {
        data.push_str(&format!("{n}\trow {n}\n"));
    }
    sink.send(bytes::Bytes::from(data)).await.expect("send rows");
    assert_eq!(sink.finish().await.expect("finish"), 10_000);
    let stream = client.copy_out("copy (select n from c order by n) to stdout").await.expect("copy out");
    let chunks: Vec<_> = stream.collect().await;
    let text: String = chunks.into_iter().map(|c| String::from_utf8_lossy(&c.expect("chunk")).into_owned()).collect();
    assert_eq!(text.lines().count(), 10_000);
    assert_eq!(client.query_one("select count(*) from c", &[]).await.expect("count").get::<_, i64>(0), 10_000);
}
