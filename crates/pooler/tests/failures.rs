//! Failure handling against real PostgreSQL: cancel, pool exhaustion and the wait queue, servers
//! killed mid-transaction, a restarted database, and malformed or oversized input.

mod common;

use std::time::{Duration, Instant};

use bypass_pooler::config::PoolMode;
use common::*;

#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_a_long_query_in_both_modes() {
    // Goal: CancelRequest reaches the backend running the client's query. Method: pg_sleep(10)
    // through the pooler, cancel with the key the pooler issued, expect 57014 well before 10 s.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let pooler = Pooler::start(config(&postgres, mode, 2));
        let client = connect_ok(pooler.port).await;
        let token = client.cancel_token();
        let started = Instant::now();
        let canceller = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            token.cancel_query(tokio_postgres::NoTls).await
        });
        let error = client.simple_query("select pg_sleep(10)").await.expect_err("cancelled");
        canceller.await.expect("task").expect("cancel sent");
        assert_eq!(sqlstate(&error).as_deref(), Some("57014"), "{mode:?}: {error}");
        assert!(started.elapsed() < Duration::from_secs(5), "{mode:?}: took {:?}", started.elapsed());
        let row = client.query_one("select 1", &[]).await.expect("client still usable");
        assert_eq!(row.get::<_, i32>(0), 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exhausted_pool_queues_then_times_out() {
    // Goal: with every server busy a client waits its turn, and gives up with a clear error after
    // query_wait_timeout. Method: pool of 1 held by an open transaction; a second client first
    // waits and succeeds when the transaction ends, then waits past the timeout and fails.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 1);
    config.pooler.query_wait_timeout_ms = 1_500;
    let pooler = Pooler::start(config);
    let holder = connect_ok(pooler.port).await;
    let waiter = connect_ok(pooler.port).await;
    holder.batch_execute("begin").await.expect("begin");
    let queued = tokio::spawn(async move { waiter.query_one("select 7", &[]).await.map(|r| r.get::<_, i32>(0)) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pooler.shared.snapshot().waiting, 1, "the second client is queued");
    holder.batch_execute("commit").await.expect("commit");
    assert_eq!(queued.await.expect("task").expect("served after commit"), 7);

    holder.batch_execute("begin").await.expect("begin again");
    let late = connect_ok(pooler.port).await;
    let started = Instant::now();
    let error = late.query_one("select 1", &[]).await.expect_err("times out");
    assert!(started.elapsed() >= Duration::from_millis(1_400), "gave up too early: {:?}", started.elapsed());
    let db_error = error.as_db_error().expect("an ErrorResponse, not a dropped connection");
    assert!(db_error.message().contains("query_wait_timeout"), "{db_error:?}");
    assert_eq!(db_error.code().code(), "08006");
    holder.batch_execute("commit").await.expect("holder unaffected");
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_clients_are_served_first_come_first_served() {
    // Goal: FIFO fairness. Method: pool of 1 held; five clients queue one after another, each
    // inserting its id into a table with a serial column; the single server runs them in service
    // order, so the serial order is the order the queue handed out the server. Each client sends
    // exactly one simple query: a driver's extra round trips (prepare, close) would re-queue it
    // and measure the driver's timing instead of the queue.
    let postgres = postgres();
    postgres.psql("create table served (seq serial, id int)").expect("create");
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 1));
    let holder = connect_ok(pooler.port).await;
    holder.batch_execute("begin").await.expect("begin");
    let mut tasks = Vec::new();
    for id in 0..5i32 {
        let client = connect_ok(pooler.port).await;
        tasks.push(tokio::spawn(async move {
            client.simple_query(&format!("insert into served (id) values ({id})")).await.expect("served");
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(pooler.shared.snapshot().waiting, 5);
    holder.batch_execute("commit").await.expect("commit");
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(postgres.psql("select string_agg(id::text, ',' order by seq) from served").expect("order"), "0,1,2,3,4");
}

#[tokio::test(flavor = "multi_thread")]
async fn backend_killed_mid_transaction() {
    // Goal: a server dying mid-transaction costs only its client; the pooler goes on and opens
    // new servers. Method: pg_terminate_backend on a client's backend inside BEGIN; that client
    // gets an error; new and other clients keep working on the same pool.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let pooler = Pooler::start(config(&postgres, mode, 2));
        let victim = connect_ok(pooler.port).await;
        let bystander = connect_ok(pooler.port).await;
        victim.batch_execute("begin").await.expect("begin");
        let pid: i32 = victim.query_one("select pg_backend_pid()", &[]).await.expect("pid").get(0);
        postgres.psql(&format!("select pg_terminate_backend({pid})")).expect("terminate");
        let error = victim.query_one("select 1", &[]).await.expect_err("its server is gone");
        assert!(error.as_db_error().is_some() || error.is_closed(), "{mode:?}: {error}");
        assert_eq!(bystander.query_one("select 2", &[]).await.expect("bystander").get::<_, i32>(0), 2);
        let fresh = connect_ok(pooler.port).await;
        assert_eq!(fresh.query_one("select 3", &[]).await.expect("new client").get::<_, i32>(0), 3);
    }
}

#[test]
fn a_server_fatal_while_idle_in_a_transaction_reaches_the_client() {
    // Goal: when PostgreSQL ends a session on its own while the client is idle in a transaction
    // (idle_in_transaction_session_timeout, pg_terminate_backend), the client gets the server's
    // FATAL with its SQLSTATE, as direct PostgreSQL and PgBouncer give it, never 08P01. Method:
    // raw client, BEGIN and then silence; the server's timeout fires (25P03) or the backend is
    // terminated (57P01); read what arrives, in both pool modes.
    let postgres = postgres();
    for mode in BOTH_MODES {
        let pooler = Pooler::start(config(&postgres, mode, 2));
        let mut client = RawClient::login(pooler.port);
        client.send(&query("begin; set local idle_in_transaction_session_timeout = 300"));
        client.read_until(b'Z');
        let (code, message) = fatal_after_silence(&mut client);
        assert_eq!(code, "25P03", "{mode:?}: {message}");
        assert!(message.contains("idle-in-transaction timeout"), "{mode:?}: {message}");

        let mut client = RawClient::login(pooler.port);
        client.send(&query("begin; select pg_backend_pid()"));
        let answer = client.read_until(b'Z');
        let pid = answer.iter().find(|(tag, _)| *tag == b'D').map(|(_, body)| data_row_text(body)).expect("a pid");
        postgres.psql(&format!("select pg_terminate_backend({pid})")).expect("terminate");
        let (code, message) = fatal_after_silence(&mut client);
        assert_eq!(code, "57P01", "{mode:?}: {message}");
        assert!(message.contains("administrator command"), "{mode:?}: {message}");
    }
}

/// A simple Query message.
fn query(sql: &str) -> Vec<u8> {
    let mut message = vec![b'Q'];
    message.extend_from_slice(&(4 + sql.len() as u32 + 1).to_be_bytes());
    message.extend_from_slice(sql.as_bytes());
    message.push(0);
    message
}

/// The first column of a DataRow, as text.
fn data_row_text(body: &[u8]) -> String {
    let length = i32::from_be_bytes([body[2], body[3], body[4], body[5]]) as usize;
    String::from_utf8_lossy(&body[6..6 + length]).into_owned()
}

/// Waits without sending; returns the SQLSTATE and message of the ErrorResponse that arrives,
/// after checking it is the only message and the connection then closes.
fn fatal_after_silence(client: &mut RawClient) -> (String, String) {
    let (tag, body) = client.read_message().expect("an ErrorResponse before the connection closes");
    assert_eq!(tag, b'E', "expected an ErrorResponse, got {:?}", tag as char);
    let next = client.read_message();
    assert!(next.is_none(), "nothing may follow the server's FATAL, got {next:?}");
    (error_code(&body), error_field(&body, b'M'))
}

#[tokio::test(flavor = "multi_thread")]
async fn database_restart_is_survived() {
    // Goal: after PostgreSQL restarts, pooled servers that died are not handed out. Method: fill
    // the pool, kill and restart PostgreSQL, then run queries: they must all succeed.
    let mut postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 3));
    {
        let clients = [connect_ok(pooler.port).await, connect_ok(pooler.port).await, connect_ok(pooler.port).await];
        for client in &clients {
            client.batch_execute("begin").await.expect("begin");
        }
        for client in &clients {
            client.batch_execute("commit").await.expect("commit");
        }
    }
    postgres.kill();
    postgres.start_again().expect("restart");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = connect_ok(pooler.port).await;
    for i in 0..10 {
        let row = client.query_one("select $1::int", &[&i]).await.expect("query after restart");
        assert_eq!(row.get::<_, i32>(0), i);
    }
}

#[test]
fn garbage_and_oversized_packets_are_refused_without_harm() {
    // Goal: malformed input gets an ErrorResponse (08P01) and a closed connection, and nobody
    // else notices. Method: raw TCP clients send garbage startups, a huge length, an unknown
    // message type and an oversized query while a psql loop keeps working.
    let postgres = postgres();
    let mut config = config(&postgres, PoolMode::Transaction, 2);
    config.pooler.message_size_max = 64 * 1024;
    let pooler = Pooler::start(config);
    let port = pooler.port;

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes as startup", b"\x00\x00\x00\x10GARBAGE!GARBAGE".to_vec()),
        ("startup length too small", vec![0, 0, 0, 2]),
        ("startup length huge", vec![0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0]),
        ("protocol 2", vec![0, 0, 0, 9, 0, 2, 0, 0, 0]),
    ];
    for (what, bytes) in cases {
        let mut raw = RawClient::connect(port);
        raw.send(&bytes);
        let reply = raw.read_message().unwrap_or_else(|| panic!("{what}: no reply"));
        assert_eq!(reply.0, b'E', "{what}");
        assert_eq!(error_code(&reply.1), "08P01", "{what}");
        assert!(raw.is_closed(), "{what}: connection stays open");
    }

    let mut after_login: Vec<(&str, Vec<u8>)> = vec![("unknown message type", b"!\x00\x00\x00\x04".to_vec())];
    let mut oversized = vec![b'Q'];
    oversized.extend_from_slice(&(1_000_000u32).to_be_bytes());
    after_login.push(("oversized query", oversized));
    after_login.push(("negative length", b"Q\xff\xff\xff\xf0".to_vec()));
    for (what, bytes) in after_login {
        let mut raw = RawClient::login(port);
        raw.send(&bytes);
        let reply = raw.read_message().unwrap_or_else(|| panic!("{what}: no reply"));
        assert_eq!((reply.0, error_code(&reply.1)), (b'E', "08P01".to_owned()), "{what}");
        assert!(raw.is_closed(), "{what}");
    }

    // A half-sent startup followed by a hang-up must not disturb anything either.
    let mut raw = RawClient::connect(port);
    raw.send(&[0, 0, 0, 40, 0, 3]);
    drop(raw);

    let output = psql(port, "postgres", None, "select 'still fine'");
    assert_eq!(stdout(&output), "still fine", "{}", stderr(&output));
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_does_not_disturb_concurrent_clients() {
    // Goal: other clients are unaffected while bad clients come and go. Method: a tokio-postgres
    // client runs 500 queries while a thread opens 100 connections that send garbage.
    let postgres = postgres();
    let pooler = Pooler::start(config(&postgres, PoolMode::Transaction, 2));
    let port = pooler.port;
    let vandal = std::thread::spawn(move || {
        for i in 0..100u32 {
            let mut raw = RawClient::connect(port);
            let mut bytes = (8 + i % 7).to_be_bytes().to_vec();
            bytes.extend_from_slice(&i.to_le_bytes().repeat(3));
            let _ = std::io::Write::write_all(&mut raw.stream, &bytes);
        }
    });
    let client = connect_ok(port).await;
    for i in 0..500i32 {
        assert_eq!(client.query_one("select $1::int", &[&i]).await.expect("query").get::<_, i32>(0), i);
    }
    vandal.join().expect("vandal thread");
}

/// Inserts rows through the pooler until `stop`, reconnecting after every failure; returns the
/// ids whose INSERT was acknowledged (CommandComplete and ReadyForQuery reached the client).
async fn insert_until_stopped(
    port: u16,
    writer: i64,
    acked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<i64> {
    use std::sync::atomic::Ordering;
    let mut mine = Vec::new();
    let mut next = writer * 1_000_000;
    let mut client = None;
    while !stop.load(Ordering::Relaxed) {
        let Some(connected) = client.as_ref() else {
            client = connect(port, "postgres", None).await.ok();
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            continue;
        };
        next += 1;
        match connected.simple_query(&format!("insert into acked values ({next}, {writer})")).await {
            Ok(_) => {
                mine.push(next);
                acked.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => client = None,
        }
    }
    mine
}

/// Waits until `count` grew by `more` since the call (the load goes on through a disruption).
async fn progress(count: &std::sync::atomic::AtomicUsize, more: usize, what: &str) {
    let target = count.load(std::sync::atomic::Ordering::Relaxed) + more;
    let started = Instant::now();
    while count.load(std::sync::atomic::Ordering::Relaxed) < target {
        assert!(started.elapsed() < Duration::from_secs(120), "no progress after {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_rows_survive_backend_kills_and_a_restart_under_load() {
    // Goal: under load, kill -9 of a backend (PostgreSQL then resets every backend), termination
    // of every backend and a PostgreSQL crash and restart lose no row whose INSERT the pooler
    // acknowledged, and the pooler keeps serving. Method: 8 clients insert numbered rows through
    // the pooler (transaction mode: a pool of 4) and keep the ids that were acknowledged; between disruptions the
    // load must make progress; at the end every acknowledged id must be in the table, both modes.
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    const WRITERS: i64 = 8;
    let mut postgres = postgres();
    postgres.psql("create table acked (id bigint primary key, writer int)").expect("table");
    for mode in BOTH_MODES {
        postgres.psql("truncate acked").expect("empty table");
        // Session mode holds a server per client: as many as there are writers.
        let pool_size = if mode == PoolMode::Session { WRITERS as u32 } else { 4 };
        let pooler = Pooler::start(config(&postgres, mode, pool_size));
        let (acked, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| tokio::spawn(insert_until_stopped(pooler.port, writer, acked.clone(), stop.clone())))
            .collect();
        progress(&acked, 200, "the start").await;
        let victim = *postgres.backend_pids().expect("pids").first().expect("a backend serves the load");
        let killed = std::process::Command::new("kill").args(["-9", &victim.to_string()]).status().expect("kill");
        assert!(killed.success(), "kill -9 {victim}");
        progress(&acked, 200, "kill -9 of a backend").await;
        // PostgreSQL may still be resetting its backends after the kill: retry while it refuses.
        let terminate = "select pg_terminate_backend(pid) from pg_stat_activity \
                         where backend_type = 'client backend' and pid <> pg_backend_pid()";
        let started = Instant::now();
        while let Err(error) = postgres.psql(terminate) {
            assert!(started.elapsed() < Duration::from_secs(60), "terminate: {error}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        progress(&acked, 200, "pg_terminate_backend of every backend").await;
        postgres.kill();
        postgres.start_again().expect("PostgreSQL starts again");
        progress(&acked, 200, "a PostgreSQL crash and restart").await;
        stop.store(true, Ordering::Relaxed);
        let mut acknowledged = Vec::new();
        for writer in writers {
            acknowledged.extend(writer.await.expect("writer"));
        }
        let stored: std::collections::HashSet<i64> = postgres
            .psql("select id from acked")
            .expect("rows")
            .lines()
            .map(|line| line.trim().parse().expect("an id"))
            .collect();
        let lost: Vec<i64> = acknowledged.iter().copied().filter(|id| !stored.contains(id)).collect();
        assert!(lost.is_empty(), "{mode:?}: {} of {} acknowledged rows lost: {lost:?}", lost.len(), acknowledged.len());
        eprintln!("{mode:?}: {} acknowledged rows, {} stored, none lost", acknowledged.len(), stored.len());
        let client = connect_ok(pooler.port).await;
        assert_eq!(client.query_one("select 7", &[]).await.expect("still serving").get::<_, i32>(0), 7);
    }
}
