//! Transactions, constraints and DML through the engine's server, side by side with a real
//! PostgreSQL 15: the same statements must give the same rows, command tags and SQLSTATEs.

mod common;

use std::sync::Arc;

use bypass_engine::{Engine, EngineSettings};
use bypass_testkit::Postgres;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

async fn connect(conninfo: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// What one statement did: its rows (as text) and command tag, or its SQLSTATE.
#[derive(Debug, PartialEq)]
enum Outcome {
    Done { rows: Vec<Vec<Option<String>>>, tag: u64 },
    Failed(String),
}

async fn run(client: &Client, sql: &str) -> Outcome {
    match client.simple_query(sql).await {
        Ok(messages) => {
            let mut rows = Vec::new();
            let mut tag = 0;
            for message in messages {
                match message {
                    SimpleQueryMessage::Row(row) => {
                        rows.push((0..row.len()).map(|i| row.get(i).map(str::to_string)).collect())
                    }
                    SimpleQueryMessage::CommandComplete(count) => tag = count,
                    _ => {}
                }
            }
            Outcome::Done { rows, tag }
        }
        Err(error) => {
            Outcome::Failed(error.code().map_or_else(|| format!("no SQLSTATE: {error}"), |c| c.code().to_string()))
        }
    }
}

/// Two sessions on each side: the engine's and PostgreSQL's.
struct Sides {
    engine: [Client; 2],
    postgres: [Client; 2],
}

impl Sides {
    /// Runs `sql` in session `which` of both systems and requires the same outcome.
    async fn both(&self, which: usize, sql: &str) -> Outcome {
        let ours = run(&self.engine[which], sql).await;
        let theirs = run(&self.postgres[which], sql).await;
        assert_eq!(ours, theirs, "engine vs PostgreSQL, session {which}: {sql}");
        ours
    }
}

async fn sides(
    engine: &Arc<Engine>,
    postgres: &Postgres,
    server: &bypass_engine::server::Server,
) -> anyhow::Result<Sides> {
    let _ = engine;
    let ours = common::engine_conninfo(server.address);
    let theirs = postgres.connection_string("postgres", "postgres");
    Ok(Sides {
        engine: [connect(&ours).await?, connect(&ours).await?],
        postgres: [connect(&theirs).await?, connect(&theirs).await?],
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

// Goal: uncommitted rows are invisible to other sessions, ROLLBACK discards them, COMMIT
// publishes them, a failed statement aborts the transaction with 25P02 until ROLLBACK, and
// COMMIT of a failed transaction rolls back; method: two sessions on the engine and two on a
// real PostgreSQL run the same script and must see the same rows and SQLSTATEs at every step.
#[test]
fn rollback_isolation_and_aborted_transactions_match_postgres() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = common::start_server(Arc::clone(&engine))?;
    runtime()?.block_on(async {
        let s = sides(&engine, &postgres, &server).await?;
        s.both(0, "create table accounts (id integer primary key, owner text not null, balance numeric(12,2))").await;
        s.both(0, "insert into accounts values (1, 'ann', 100.00), (2, 'bob', 50.00)").await;
        s.both(0, "begin").await;
        s.both(0, "insert into accounts values (3, 'cyd', 10.00)").await;
        s.both(0, "update accounts set balance = balance - 25 where owner = 'ann'").await;
        let inside = s.both(0, "select id, balance from accounts order by id").await;
        assert!(matches!(&inside, Outcome::Done { rows, .. } if rows.len() == 3), "own writes are visible: {inside:?}");
        let outside = s.both(1, "select id, balance from accounts order by id").await;
        assert!(matches!(&outside, Outcome::Done { rows, .. } if rows.len() == 2), "not to others: {outside:?}");
        s.both(0, "rollback").await;
        s.both(1, "select id, owner, balance from accounts order by id").await;
        s.both(0, "select id, owner, balance from accounts order by id").await;
        s.both(0, "begin").await;
        s.both(0, "delete from accounts where id = 2 returning id, owner").await;
        s.both(0, "select count(*) from accounts").await;
        assert_eq!(s.both(0, "select no_such_column from accounts").await, Outcome::Failed("42703".into()));
        assert_eq!(s.both(0, "select 1").await, Outcome::Failed("25P02".into()));
        s.both(0, "commit").await;
        s.both(1, "select id, owner, balance from accounts order by id").await;
        s.both(0, "begin").await;
        s.both(0, "insert into accounts (id, owner) values (4, 'dee') returning id, owner, balance").await;
        s.both(0, "commit").await;
        s.both(1, "select id, owner, balance from accounts order by id").await;
        s.both(1, "commit").await;
        s.both(1, "rollback").await;
        anyhow::Ok(())
    })
}

// Goal: NOT NULL, PRIMARY KEY and UNIQUE are enforced with PostgreSQL's SQLSTATEs (23502,
// 23505) on INSERT, UPDATE and COPY-free multi-row inserts, and a violating statement changes
// nothing; constraints we do not enforce are refused (0A000) instead of ignored; method: the
// same statements on both systems (the refusals only on the engine, which PostgreSQL accepts).
#[test]
fn constraints_match_postgres() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = common::start_server(Arc::clone(&engine))?;
    runtime()?.block_on(async {
        let s = sides(&engine, &postgres, &server).await?;
        s.both(
            0,
            "create table items (id bigint primary key, code text unique, name text not null, qty integer default 7)",
        )
        .await;
        s.both(0, "insert into items (id, code, name) values (1, 'a', 'one'), (2, 'b', 'two')").await;
        assert_eq!(s.both(0, "insert into items values (1, 'c', 'dup', 1)").await, Outcome::Failed("23505".into()));
        assert_eq!(
            s.both(0, "insert into items values (3, 'a', 'dup code', 1)").await,
            Outcome::Failed("23505".into())
        );
        assert_eq!(s.both(0, "insert into items values (3, 'c', null, 1)").await, Outcome::Failed("23502".into()));
        assert_eq!(s.both(0, "insert into items values (null, 'c', 'x', 1)").await, Outcome::Failed("23502".into()));
        assert_eq!(
            s.both(0, "insert into items values (3, 'c', 'three', 1), (4, 'c', 'four', 1)").await,
            Outcome::Failed("23505".into()),
            "a duplicate inside one statement"
        );
        s.both(0, "insert into items values (3, null, 'three', 1), (4, null, 'four', 1)").await;
        assert_eq!(s.both(0, "update items set code = 'a' where id = 2").await, Outcome::Failed("23505".into()));
        assert_eq!(s.both(0, "update items set name = null where id = 2").await, Outcome::Failed("23502".into()));
        s.both(0, "update items set id = id + 10 where id < 3 returning id, code, qty").await;
        s.both(0, "delete from items where code is null").await;
        s.both(0, "select id, code, name, qty from items order by id").await;
        for refused in [
            "create table c1 (a integer check (a > 0))",
            "create table c2 (a integer references items (id))",
            "create table c3 (a integer generated always as identity)",
            "create temporary table c4 (a integer) on commit drop",
        ] {
            assert_eq!(run(&s.engine[0], refused).await, Outcome::Failed("0A000".into()), "{refused}");
        }
        assert_eq!(
            run(&s.engine[0], "select count(*) from c1").await,
            Outcome::Failed("42P01".into()),
            "nothing was created"
        );
        anyhow::Ok(())
    })
}

// Goal: two writers of one table take turns (the second waits for the first's commit, as
// PostgreSQL makes it wait for the rows), a lock cycle is a deadlock (40P01), and under
// REPEATABLE READ writing a table that changed since the snapshot is a serialization failure
// (40001); readers never wait; method: two engine sessions on one runtime.
#[test]
fn writers_wait_deadlocks_and_serialization_failures() -> anyhow::Result<()> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = common::start_server(Arc::clone(&engine))?;
    let conninfo = common::engine_conninfo(server.address);
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(async {
        let a = connect(&conninfo).await?;
        let b = Arc::new(connect(&conninfo).await?);
        run(&a, "create table x (v integer); create table y (v integer)").await;
        run(&a, "begin; insert into x values (1)").await;
        let waiting = {
            let b = Arc::clone(&b);
            tokio::spawn(async move { run(&b, "insert into x values (2)").await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "the second writer waits for the first");
        run(&a, "commit").await;
        assert!(matches!(waiting.await?, Outcome::Done { tag: 1, .. }), "then it goes ahead");
        assert_eq!(
            run(&a, "select count(*) from x").await,
            Outcome::Done { rows: vec![vec![Some("2".into())]], tag: 1 }
        );

        run(&a, "begin; insert into x values (3)").await;
        run(&b, "begin; insert into y values (3)").await;
        let blocked = {
            let b = Arc::clone(&b);
            tokio::spawn(async move { run(&b, "insert into x values (4)").await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let deadlock = run(&a, "insert into y values (4)").await;
        assert_eq!(deadlock, Outcome::Failed("40P01".into()));
        run(&a, "rollback").await;
        assert!(matches!(blocked.await?, Outcome::Done { .. }));
        run(&b, "commit").await;

        run(&a, "begin isolation level repeatable read; select count(*) from x").await;
        run(&b, "insert into x values (5)").await;
        assert_eq!(
            run(&a, "select count(*) from x").await,
            Outcome::Done { rows: vec![vec![Some("3".into())]], tag: 1 },
            "the snapshot holds"
        );
        assert_eq!(run(&a, "insert into x values (6)").await, Outcome::Failed("40001".into()));
        run(&a, "rollback").await;
        anyhow::Ok(())
    })
}
