//! Serving like a server: results stream while other clients are answered, CancelRequest and
//! statement_timeout stop a running query, a client that disconnects stops its query, a memory
//! budget refuses a runaway query (53200) and the server stays up, and unauthenticated clients
//! are refused. Ordering is asserted, never wall time.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(not(feature = "global-mimalloc"))]
use bypass_engine::control::TrackingAllocator;
use bypass_engine::server::{self, ServerSettings};
use bypass_engine::{tpch, Engine, EngineSettings};
use tokio_postgres::{Client, NoTls};

// The memory budget is enforced by the allocator the `bypass` binary installs (the library
// installs it itself when a workspace build turns on `global-mimalloc`).
#[cfg(not(feature = "global-mimalloc"))]
#[global_allocator]
static ALLOCATOR: TrackingAllocator<std::alloc::System> = TrackingAllocator(std::alloc::System);

/// A self-join that runs for minutes at SF 0.01 (7 ship modes: ~500M pairs) with little memory.
const LONG_QUERY: &str = "select count(*) from lineitem l1 join lineitem l2 on l1.l_shipmode = l2.l_shipmode";
/// Bound on waits for something that happens within milliseconds when the feature works
/// (and after minutes when it does not): a generous limit, not a timing claim.
const EVENTUALLY: Duration = Duration::from_secs(30);

fn engine_with_tpch() -> anyhow::Result<Arc<Engine>> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    tpch::load(&engine, 0.01)?;
    Ok(engine)
}

async fn connect(conninfo: &str) -> anyhow::Result<(Client, tokio::task::JoinHandle<()>)> {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls).await?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// Waits until `done` holds or EVENTUALLY passes; returns whether it held.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < EVENTUALLY {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    done()
}

/// The server's message of a database error.
fn message(error: &tokio_postgres::Error) -> String {
    error.as_db_error().map_or_else(|| error.to_string(), |e| e.message().to_string())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

// Goal: a CancelRequest stops a running query with 57014 and the session goes on, and
// statement_timeout does the same by itself; method: start a query that would run for minutes,
// cancel it through tokio-postgres' cancel token once the server reports it running; then set
// a 100 ms statement_timeout and run it again.
#[test]
fn cancel_and_statement_timeout_stop_a_running_query() -> anyhow::Result<()> {
    let engine = engine_with_tpch()?;
    let server = common::start_server(engine)?;
    let conninfo = common::engine_conninfo(server.address);
    runtime()?.block_on(async {
        let (client, _connection) = connect(&conninfo).await?;
        let client = Arc::new(client);
        let token = client.cancel_token();
        let running = {
            let client = Arc::clone(&client);
            tokio::spawn(async move { client.simple_query(LONG_QUERY).await })
        };
        assert!(eventually(|| server.statements_running() == 1).await, "the query started");
        if let Err(error) = token.cancel_query(NoTls).await {
            anyhow::bail!("cancel: {error:?}");
        }
        let error = running.await?.expect_err("canceled");
        assert_eq!(error.code().map(|c| c.code()), Some("57014"), "{error}");
        assert!(message(&error).contains("user request"), "{error:?}");
        let one: i32 = client.query_one("select 1", &[]).await?.get(0);
        assert_eq!(one, 1, "the session goes on");

        client.simple_query("set statement_timeout = 100").await?;
        let error = client.simple_query(LONG_QUERY).await.expect_err("timed out");
        assert_eq!(error.code().map(|c| c.code()), Some("57014"), "{error}");
        assert!(message(&error).contains("statement timeout"), "{error:?}");
        assert_eq!(server.statements_running(), 0);
        anyhow::Ok(())
    })
}

// Goal: a query whose client disconnects stops (issue 21: one ran on for 50 s); method: start
// the long query, drop the client's connection while it runs, and wait for the server to report
// no running statement (the query alone would run for minutes).
#[test]
fn a_query_stops_when_its_client_disconnects() -> anyhow::Result<()> {
    let engine = engine_with_tpch()?;
    let server = common::start_server(engine)?;
    let conninfo = common::engine_conninfo(server.address);
    runtime()?.block_on(async {
        let (client, connection) = connect(&conninfo).await?;
        let query = tokio::spawn(async move { client.simple_query(LONG_QUERY).await.map(|_| ()) });
        assert!(eventually(|| server.statements_running() == 1).await, "the query started");
        connection.abort();
        query.abort();
        assert!(eventually(|| server.statements_running() == 0).await, "the query stopped after its client left");
        anyhow::Ok(())
    })
}

/// A minimal client on a raw socket (trust server): reads are under the test's control.
struct RawClient {
    socket: std::net::TcpStream,
    buffer: Vec<u8>,
}

impl RawClient {
    fn connect(address: std::net::SocketAddr) -> anyhow::Result<RawClient> {
        let mut socket = std::net::TcpStream::connect(address)?;
        socket.set_read_timeout(Some(EVENTUALLY))?;
        let mut startup = Vec::new();
        bypass_wire::startup::encode_startup(&mut startup, &[("user", "raw"), ("database", server::DATABASE_NAME)]);
        socket.write_all(&startup)?;
        let mut client = RawClient { socket, buffer: Vec::new() };
        while client.next_message()?.0 != b'Z' {}
        Ok(client)
    }

    fn query(&mut self, sql: &str) -> anyhow::Result<()> {
        let mut message = Vec::new();
        bypass_wire::frontend::build::query(&mut message, sql);
        Ok(self.socket.write_all(&message)?)
    }

    fn next_message(&mut self) -> anyhow::Result<(u8, Vec<u8>)> {
        loop {
            if self.buffer.len() >= 5 {
                let length =
                    u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]) as usize;
                if self.buffer.len() > length {
                    let message: Vec<u8> = self.buffer.drain(..length + 1).collect();
                    return Ok((message[0], message[5..].to_vec()));
                }
            }
            let mut chunk = [0u8; 65536];
            let read = self.socket.read(&mut chunk)?;
            anyhow::ensure!(read > 0, "server closed the connection");
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }
}

// Goal: one client's large result streams without stalling others: while a client has sent a
// query for ~840,000 rows and reads nothing, the server is still producing (so rows were not
// all built before sending), another client's `select 1` is answered, and afterwards the first
// client still receives every row, the first of them before the statement finished; method: a
// raw-socket client that pauses reading, a second client through tokio-postgres.
#[test]
fn a_large_result_streams_while_another_client_is_answered() -> anyhow::Result<()> {
    let engine = engine_with_tpch()?;
    let server = server::start(Arc::clone(&engine), ServerSettings::trust("127.0.0.1:0".parse()?))?;
    let big = "select l1.l_comment, l2.l_comment, l1.l_orderkey from lineitem l1 join lineitem l2 \
               on l1.l_shipmode = l2.l_shipmode where l2.l_orderkey < 100";
    let count_sql = big.replace("select l1.l_comment, l2.l_comment, l1.l_orderkey", "select count(*)");
    let expected = engine.query(&count_sql)?.rows()[0][0].as_f64().unwrap_or(0.0) as i64;
    assert!(expected > 500_000, "a large result: {expected} rows");
    let mut streaming = RawClient::connect(server.address)?;
    streaming.query(big)?;
    let (tag, _) = streaming.next_message()?;
    assert_eq!(tag, b'T', "RowDescription first");
    let (tag, _) = streaming.next_message()?;
    assert_eq!(tag, b'D', "a first row");
    runtime()?.block_on(async {
        assert_eq!(server.statements_running(), 1, "the first row arrived while the statement still runs");
        let (other, _connection) = connect(&common::engine_conninfo(server.address)).await?;
        let one: i32 = other.query_one("select 1", &[]).await?.get(0);
        assert_eq!(one, 1);
        assert_eq!(server.statements_running(), 1, "answered while the large result is still being sent");
        anyhow::Ok(())
    })?;
    let mut rows: i64 = 1;
    loop {
        match streaming.next_message()? {
            (b'D', _) => rows += 1,
            (b'C', _) => break,
            (tag, body) => anyhow::bail!("unexpected message {} {:?}", tag as char, String::from_utf8_lossy(&body)),
        }
    }
    assert_eq!(rows, expected, "every row arrived");
    Ok(())
}

// Goal: a query that would need more than memory_limit is refused with 53200 instead of growing
// without bound (issue 21: two low-cardinality equi-joins grew past 8 GB), and the server goes
// on; method: a 64 MB limit and a self-join on a 3-value key whose pairs need far more.
#[test]
fn a_memory_limit_refuses_a_runaway_join() -> anyhow::Result<()> {
    let engine = engine_with_tpch()?;
    let server = common::start_server(engine)?;
    runtime()?.block_on(async {
        let (client, _connection) = connect(&common::engine_conninfo(server.address)).await?;
        client.simple_query("set memory_limit = '64MB'").await?;
        let error = client
            .simple_query("select l1.l_orderkey, l2.l_orderkey from lineitem l1 join lineitem l2 on l1.l_returnflag = l2.l_returnflag order by 1, 2")
            .await
            .expect_err("over budget");
        assert_eq!(error.code().map(|c| c.code()), Some("53200"), "{error}");
        let one: i32 = client.query_one("select 1", &[]).await?.get(0);
        assert_eq!(one, 1, "the session and the server go on");
        anyhow::Ok(())
    })
}

// Goal: the server refuses clients without the right password (28P01) and serves those with
// it; method: tokio-postgres with no, a wrong and the right password.
#[test]
fn unauthenticated_clients_are_refused() -> anyhow::Result<()> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = common::start_server(engine)?;
    let right = common::engine_conninfo(server.address);
    runtime()?.block_on(async {
        for wrong in [right.replace(common::ENGINE_PASSWORD, "not-the-password"), right.replace("password=", "x=")] {
            let wrong = wrong.replace(&format!(" x={}", common::ENGINE_PASSWORD), "");
            let error = tokio_postgres::connect(&wrong, NoTls).await.err().expect("refused");
            let code = error.as_db_error().map(|e| e.code().code().to_string());
            // Without a password the client gives up by itself when the server asks for one.
            assert!(
                code.as_deref() == Some("28P01") || error.to_string().contains("invalid configuration"),
                "{wrong}: {error}"
            );
        }
        let (client, _connection) = connect(&right).await?;
        let one: i32 = client.query_one("select 1", &[]).await?.get(0);
        assert_eq!(one, 1);
        anyhow::Ok(())
    })
}

// Goal: Execute with a row limit streams (PortalSuspended, resumed by the next Execute) instead
// of building the whole result first, and a suspended portal lives through Sync inside a
// transaction, survives another statement in between, and closes without failing the
// transaction; method: tokio-postgres' portals (Bind, then Execute with max_rows and Sync per
// fetch) over lineitem. The proof of streaming is behavioural: the last rows divide by zero,
// so a server that computed the whole result before sending would fail the first fetch; a
// streaming one answers the first fetches and fails only when the fetches reach those rows.
#[test]
fn a_portal_with_a_row_limit_streams_and_suspends() -> anyhow::Result<()> {
    let engine = engine_with_tpch()?;
    let server = common::start_server(engine)?;
    let conninfo = common::engine_conninfo(server.address);
    runtime()?.block_on(async {
        let (mut client, _connection) = connect(&conninfo).await?;
        let total: i64 = client.query_one("select count(*) from lineitem", &[]).await?.get(0);
        let last: i64 = client.query_one("select max(l_orderkey) from lineitem", &[]).await?.get(0);

        // Every row, 1,000 at a time, in order, with a statement in between.
        let transaction = client.transaction().await?;
        let statement = transaction.prepare("select l_orderkey, l_linenumber from lineitem").await?;
        let portal = transaction.bind(&statement, &[]).await?;
        let (mut fetched, mut fetches, mut previous) = (0i64, 0, (0i64, 0i32));
        loop {
            let rows = transaction.query_portal(&portal, 1000).await?;
            if rows.is_empty() {
                break;
            }
            assert!(rows.len() <= 1000, "at most max_rows per Execute");
            for row in &rows {
                let key: (i64, i32) = (row.get(0), row.get(1));
                assert!(key > previous, "rows in order: {key:?} after {previous:?}");
                previous = key;
            }
            fetched += rows.len() as i64;
            fetches += 1;
            if fetches == 3 {
                // Another statement while the portal is suspended.
                let count: i64 = transaction.query_one("select count(*) from orders", &[]).await?.get(0);
                assert!(count > 0);
            }
        }
        assert_eq!(fetched, total, "all rows through the portal");
        assert!(fetches > 3);

        // Closing a suspended portal ends its statement without failing the transaction.
        let portal = transaction.bind(&statement, &[]).await?;
        assert_eq!(transaction.query_portal(&portal, 10).await?.len(), 10);
        drop(portal);
        let count: i64 = transaction.query_one("select count(*) from region", &[]).await?.get(0);
        assert_eq!(count, 5);
        transaction.commit().await?;

        // Rows past the first fetches are computed only when fetched.
        let transaction = client.transaction().await?;
        let failing = transaction.prepare(&format!("select l_orderkey / (l_orderkey - {last}) from lineitem")).await?;
        let portal = transaction.bind(&failing, &[]).await?;
        let first = transaction.query_portal(&portal, 100).await?;
        assert_eq!(first.len(), 100, "the first fetch answers before the failing rows are computed");
        let mut error = None;
        for _ in 0..total {
            match transaction.query_portal(&portal, 5000).await {
                Ok(rows) if rows.is_empty() => break,
                Ok(_) => {}
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        let error = error.expect("the fetches reach the rows that divide by zero");
        assert_eq!(error.code().map(|c| c.code()), Some("22012"), "{error}");
        drop(transaction);
        let count: i64 = client.query_one("select count(*) from nation", &[]).await?.get(0);
        assert_eq!(count, 25, "the connection goes on after the rollback");
        Ok(())
    })
}
