//! COPY FROM is all-or-nothing, like PostgreSQL: a CSV file with a bad row in the middle leaves
//! the table unchanged and the client gets an ErrorResponse with PostgreSQL's SQLSTATE.

use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;

mod common;

use bypass_engine::{server, Engine, EngineSettings};
use bypass_testkit::{pg_bin, Postgres};

/// Small chunks, so the failed rows span several new chunks and part of the last old one.
const CHUNK_ROWS: usize = 4;

const SCHEMA: &str = "create table t (a integer, b text, c numeric(5,2), d date)";
const SEED_ROWS: &str = "insert into t values (1, 'one', 1.00, '2020-01-01'), (2, 'two', 2.50, '2020-01-02'), \
     (3, 'three', 3.25, '2020-01-03'), (4, 'four', 4.00, '2020-01-04'), (5, 'five', 5.75, '2020-01-05'), \
     (6, 'six', 6.00, '2020-01-06')";
const CHECKS: [&str; 3] = [
    "select a, b, c, d from t order by a",
    "select count(*), count(c), sum(a), sum(c) from t",
    "select b, count(*) from t group by b order by b",
];

/// Good rows with fresh strings and NULLs (so the failed append interns text and creates
/// validity masks that must be undone), then `bad`, then more good rows.
fn csv_with_bad_row(bad: &str) -> String {
    let mut text = String::new();
    for i in 100..111 {
        let c = if i % 3 == 0 { String::new() } else { format!("{}.5", i % 50) };
        text.push_str(&format!("{i},new{i},{c},2021-02-{:02}\n", i % 28 + 1));
    }
    text.push_str(bad);
    text.push('\n');
    text.push_str("200,after,1.00,2022-01-01\n");
    text
}

/// Each bad row and the SQLSTATE PostgreSQL 15 gives it.
const BAD_ROWS: [(&str, &str); 7] = [
    ("111,x,1.00,notanint", "22007"),
    ("oops,x,1.00,2021-01-01", "22P02"),
    ("99999999999,x,1.00,2021-01-01", "22003"),
    ("111,x,1234.5,2021-01-01", "22003"),
    ("111,x,1.00,2021-13-01", "22008"),
    ("111,x,1.00,2021-01-01,extra", "22P04"),
    ("111,x", "22P04"),
];

/// Runs SQL through psql with verbose errors; returns (success, stdout, SQLSTATE of the error).
fn psql(address: SocketAddr, user: &str, database: &str, sql: &str) -> anyhow::Result<(bool, String, Option<String>)> {
    let output = Command::new(pg_bin("psql"))
        .env("PGPASSWORD", common::ENGINE_PASSWORD)
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose"])
        .args(["-h", &address.ip().to_string(), "-p", &address.port().to_string(), "-U", user, "-d", database])
        .args(["-c", sql])
        .env("PGCONNECT_TIMEOUT", "10")
        .env("LC_ALL", "C")
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    // Verbose errors read "ERROR:  22P02: invalid input syntax ...".
    let sqlstate = stderr
        .lines()
        .find_map(|line| line.strip_prefix("ERROR:"))
        .and_then(|rest| rest.trim().split(':').next())
        .map(str::to_string);
    Ok((output.status.success(), String::from_utf8(output.stdout)?, sqlstate))
}

struct Pair {
    postgres: Postgres,
    engine_address: SocketAddr,
    _server: server::Server,
}

impl Pair {
    fn postgres_address(&self) -> anyhow::Result<SocketAddr> {
        Ok(format!("127.0.0.1:{}", self.postgres.port()).parse()?)
    }

    /// The same statement in both systems; the outcomes (success, rows, SQLSTATE) must agree.
    fn both(&self, engine_sql: &str, postgres_sql: &str) -> anyhow::Result<(bool, String, Option<String>)> {
        let ours = psql(self.engine_address, common::ENGINE_USER, common::ENGINE_DATABASE, engine_sql)?;
        let theirs = psql(self.postgres_address()?, "postgres", "postgres", postgres_sql)?;
        assert_eq!(ours, theirs, "engine vs PostgreSQL for {engine_sql}");
        Ok(ours)
    }

    fn assert_tables_equal(&self, seed_rows: &[String]) -> anyhow::Result<()> {
        for (check, expected) in CHECKS.iter().zip(seed_rows) {
            let (ok, rows, _) = self.both(check, check)?;
            assert!(ok, "{check}");
            assert_eq!(&rows, expected, "the table changed: {check}");
        }
        Ok(())
    }
}

fn start() -> anyhow::Result<Pair> {
    let postgres = Postgres::start()?;
    let engine = Arc::new(Engine::new(EngineSettings { chunk_rows: CHUNK_ROWS, ..EngineSettings::default() })?);
    let server = common::start_server(engine)?;
    Ok(Pair { postgres, engine_address: server.address, _server: server })
}

// Goal: a COPY that fails on any row leaves the table exactly as before and reports
// PostgreSQL's SQLSTATE (22P02, 22003, 22007, 22008, 22P04); method: a real PostgreSQL 15 and
// the engine's wire server get the same table and the same CSV files through psql; after
// every failed COPY both tables must still equal the seed rows, and a final good COPY (which
// reuses strings and NULLs of the failed ones) must load identically in both.
#[test]
fn failed_copy_leaves_table_unchanged_with_postgres_sqlstate() -> anyhow::Result<()> {
    let pair = start()?;
    pair.both(SCHEMA, SCHEMA)?;
    pair.both(SEED_ROWS, SEED_ROWS)?;
    let seed_rows: Vec<String> =
        CHECKS.iter().map(|check| pair.both(check, check).map(|r| r.1)).collect::<anyhow::Result<_>>()?;
    assert!(seed_rows[0].lines().count() == 6, "seed rows loaded: {}", seed_rows[0]);
    for (bad, sqlstate) in BAD_ROWS {
        let mut file = tempfile::NamedTempFile::new()?;
        file.write_all(csv_with_bad_row(bad).as_bytes())?;
        file.flush()?;
        let path = file.path().display().to_string();
        let (ok, _, state) = pair.both(
            &format!("copy t from '{path}' with (format csv)"),
            &format!("\\copy t from '{path}' with (format csv)"),
        )?;
        assert!(!ok, "COPY with bad row {bad:?} must fail");
        assert_eq!(state.as_deref(), Some(sqlstate), "SQLSTATE for {bad:?}");
        pair.assert_tables_equal(&seed_rows)?;
    }
    let mut good = tempfile::NamedTempFile::new()?;
    good.write_all(csv_with_bad_row("111,new101,,2021-03-01").as_bytes())?;
    good.flush()?;
    let path = good.path().display().to_string();
    let (ok, _, _) = pair.both(
        &format!("copy t from '{path}' with (format csv)"),
        &format!("\\copy t from '{path}' with (format csv)"),
    )?;
    assert!(ok, "a good COPY loads after the failed ones");
    for check in CHECKS {
        pair.both(check, check)?;
    }
    let (_, count, _) = pair.both("select count(*) from t", "select count(*) from t")?;
    assert_eq!(count.trim(), "19", "6 seed rows + 13 loaded rows");
    Ok(())
}
