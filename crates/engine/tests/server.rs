//! The PostgreSQL-protocol server: psql (simple query), tokio-postgres (extended query,
//! binary results) and psycopg (extended query with parameters) against a real engine.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;

mod common;

use bypass_engine::{server, tpch, Engine, EngineSettings};
use common::{engine_conninfo, engine_psql, start_server};

fn start() -> anyhow::Result<(server::Server, Arc<Engine>)> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    tpch::load(&engine, 0.01)?;
    Ok((start_server(Arc::clone(&engine))?, engine))
}

fn psql(address: SocketAddr, sql: &str) -> anyhow::Result<(bool, String, String)> {
    engine_psql(address, &["-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
}

// Goal: psql works over the simple query protocol, DDL/DML/queries included, and an
// unsupported feature is an ErrorResponse with SQLSTATE 0A000 after which the session goes on;
// method: real psql binary against the server.
#[test]
fn psql_simple_query() -> anyhow::Result<()> {
    let (server, _engine) = start()?;
    let (ok, out, err) = psql(server.address, tpch::query(6).expect("supported"))?;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1193053.2253", "TPC-H Q6 at SF 0.01");
    let script =
        "create table t (a int, b text, c numeric(10,2)); insert into t values (1, 'x', 1.50), (2, 'y', null); \
                  select a, b, c from t order by a";
    let (ok, out, err) = psql(server.address, script)?;
    assert!(ok, "{err}");
    assert!(out.trim().ends_with("1|x|1.50\n2|y|"), "{out}");
    let (ok, _, err) = psql(server.address, "with recursive r (n) as (select 1) select n from r")?;
    assert!(!ok, "WITH RECURSIVE is not supported");
    assert!(err.contains("not supported") && err.contains("WITH RECURSIVE"), "names the feature: {err}");
    let (_, stdout, stderr) = engine_psql(
        server.address,
        &["-v", "VERBOSITY=verbose", "-c", "select a from t group by rollup (a)", "-c", "select 41 + 1"],
    )?;
    assert!(stderr.contains("0A000"), "SQLSTATE 0A000: {stderr}");
    assert!(stdout.contains("42"), "the session survives the error");
    Ok(())
}

// Goal: the extended protocol with binary results works for a Rust driver (types: int, bigint,
// numeric, date, text, float, bool) and errors carry SQLSTATEs; method: tokio-postgres.
#[test]
fn tokio_postgres_extended_query() -> anyhow::Result<()> {
    let (server, _engine) = start()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(&engine_conninfo(server.address), tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("connection: {e}");
            }
        });
        eprintln!("connected");
        let rows = client
            .query(
                "select n_nationkey, n_name, n_regionkey from nation where n_nationkey < $1 order by n_nationkey",
                &[&3i64],
            )
            .await?;
        assert_eq!(rows.len(), 3);
        let name: String = rows[1].get(1);
        assert_eq!(name, "ARGENTINA");
        let key: i64 = rows[2].get(0);
        assert_eq!(key, 2);
        let row = client
            .query_one(
                "select count(*), avg(l_quantity)::float8, max(l_shipdate) > date '1998-01-01' from lineitem",
                &[],
            )
            .await?;
        let count: i64 = row.get(0);
        assert_eq!(count, 60175);
        let average: f64 = row.get(1);
        assert!((average - 25.5).abs() < 0.5, "{average}");
        let late: bool = row.get(2);
        assert!(late);
        let error = client.query("select * from missing_table", &[]).await.expect_err("unknown table");
        assert_eq!(error.code().map(|c| c.code()), Some("42P01"));
        let row = client.query_one("select 1 + 1", &[]).await?;
        let two: i32 = row.get(0);
        assert_eq!(two, 2, "the connection survives errors");
        anyhow::Ok(())
    })?;
    Ok(())
}

/// The venv made by scripts/engine-venv.sh, if present.
fn venv_python() -> Option<std::path::PathBuf> {
    let default = std::env::var("HOME").ok().map(|h| format!("{h}/.cache/bypass/engine-venv"));
    let venv = std::env::var("BYPASS_ENGINE_VENV").ok().or(default)?;
    let python = std::path::PathBuf::from(venv).join("bin/python");
    python.exists().then_some(python)
}

// Goal: psycopg 3 (extended protocol, server-side parameters) works; method: a Python script
// in the venv of scripts/engine-venv.sh (made by `make test`'s setup) runs a parameterized query
// and checks the answer.
#[test]
fn psycopg_parameters() -> anyhow::Result<()> {
    let python = venv_python().ok_or_else(|| anyhow::anyhow!("no engine venv: run scripts/engine-venv.sh"))?;
    let (server, _engine) = start()?;
    let script = format!(
        "import psycopg\n\
         with psycopg.connect('{}') as conn:\n\
         \x20   rows = conn.execute('select r_name from region where r_regionkey >= %s order by r_regionkey', (3,)).fetchall()\n\
         \x20   assert rows == [('EUROPE',), ('MIDDLE EAST',)], rows\n\
         \x20   (n,) = conn.execute('select count(*) from orders where o_orderpriority = %s', ('1-URGENT',)).fetchone()\n\
         \x20   assert n > 0, n\n\
         print('ok')\n",
        engine_conninfo(server.address)
    );
    let output = Command::new(python).args(["-c", &script]).output()?;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8(output.stdout)?.trim(), "ok");
    Ok(())
}
