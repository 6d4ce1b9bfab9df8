//! Shared helpers for the engine's integration tests: a real PostgreSQL loaded with the same
//! rows as the engine, result formatting and tolerant comparison.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::process::Command;

use bypass_engine::types::Value;
use bypass_engine::{tpch, Engine};
use bypass_testkit::{pg_bin, Postgres};

/// Field separator for psql output (ASCII unit separator: never inside TPC-H text).
const SEPARATOR: &str = "\x1f";

/// Relative tolerance for numbers: PostgreSQL computes AVG and decimal division in arbitrary
/// precision numeric, the engine in float64 (documented in the crate docs).
pub const RELATIVE_TOLERANCE: f64 = 1e-9;

/// Runs SQL in PostgreSQL and returns rows of text cells (NULL as "").
pub fn postgres_rows(postgres: &Postgres, sql: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let output = Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-F", SEPARATOR, "-v", "ON_ERROR_STOP=1", "-h", postgres.host()])
        .args(["-p", &postgres.port().to_string(), "-U", "postgres", "-d", "postgres", "-c", sql])
        .env("LC_ALL", "C")
        .output()?;
    anyhow::ensure!(output.status.success(), "psql failed: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout)?;
    Ok(text.lines().filter(|l| !l.is_empty()).map(|l| l.split(SEPARATOR).map(str::to_string).collect()).collect())
}

/// Runs SQL in the engine and returns rows of text cells in PostgreSQL's text format.
pub fn engine_rows(engine: &Engine, sql: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let result = engine.query(sql)?;
    Ok(result.rows().iter().map(|row| row.iter().map(Value::to_string).collect()).collect())
}

/// Equal cells: identical text, or numbers within [`RELATIVE_TOLERANCE`].
pub fn cells_match(ours: &str, theirs: &str) -> bool {
    if ours == theirs {
        return true;
    }
    match (ours.parse::<f64>(), theirs.parse::<f64>()) {
        (Ok(a), Ok(b)) => (a - b).abs() <= RELATIVE_TOLERANCE * a.abs().max(b.abs()).max(1.0),
        _ => false,
    }
}

/// Compares two result sets row by row (the queries have a total ORDER BY, or are sorted
/// first when `sort` is set); returns a description of the first difference.
pub fn compare(ours: &[Vec<String>], theirs: &[Vec<String>], sort: bool) -> Result<(), String> {
    let (mut ours, mut theirs) = (ours.to_vec(), theirs.to_vec());
    if sort {
        ours.sort();
        theirs.sort();
    }
    if ours.len() != theirs.len() {
        return Err(format!(
            "{} rows vs {} rows; first rows {:?} vs {:?}",
            ours.len(),
            theirs.len(),
            ours.first(),
            theirs.first()
        ));
    }
    for (index, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        if a.len() != b.len() || !a.iter().zip(b).all(|(x, y)| cells_match(x, y)) {
            return Err(format!("row {index}: engine {a:?} vs postgres {b:?}"));
        }
    }
    Ok(())
}

/// CSV text of a value for PostgreSQL's COPY … CSV (NULL = empty unquoted field).
fn csv_cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::Text(s) => format!("\"{}\"", s.replace('"', "\"\"")),
        other => other.to_string(),
    }
}

/// Copies every row of an engine table into a PostgreSQL table of the same name via CSV.
pub fn copy_table_to_postgres(engine: &Engine, postgres: &Postgres, name: &str, ddl: &str) -> anyhow::Result<()> {
    postgres.psql(ddl)?;
    let table = engine.table(name)?;
    let mut file = tempfile::NamedTempFile::new()?;
    {
        let mut writer = std::io::BufWriter::new(file.as_file_mut());
        for (chunk_index, chunk) in table.chunks.iter().enumerate() {
            for row in 0..chunk.rows {
                let cells: Vec<String> = table.row_values(chunk_index, row).iter().map(csv_cell).collect();
                writeln!(writer, "{}", cells.join(","))?;
            }
        }
        writer.flush()?;
    }
    let copy = format!("\\copy {name} from '{}' with (format csv)", file.path().display());
    let status = Command::new(pg_bin("psql"))
        .args(["-X", "-v", "ON_ERROR_STOP=1", "-h", postgres.host(), "-p", &postgres.port().to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-c", &copy])
        .output()?;
    anyhow::ensure!(status.status.success(), "COPY {name} failed: {}", String::from_utf8_lossy(&status.stderr));
    Ok(())
}

/// The TPC-H keys as PostgreSQL indexes.
const POSTGRES_TPCH_INDEXES: &str = "alter table part add primary key (p_partkey);
alter table supplier add primary key (s_suppkey);
alter table partsupp add primary key (ps_partkey, ps_suppkey);
alter table customer add primary key (c_custkey);
alter table orders add primary key (o_orderkey);
alter table lineitem add primary key (l_orderkey, l_linenumber);
create index on lineitem (l_partkey, l_suppkey);
create index on orders (o_custkey);";

/// Loads TPC-H at `scale_factor` into the engine and the same rows into PostgreSQL.
pub fn load_tpch_both(engine: &Engine, postgres: &Postgres, scale_factor: f64) -> anyhow::Result<()> {
    tpch::load(engine, scale_factor)?;
    for name in tpch::TABLES {
        let ddl = tpch::postgres_ddl(name).expect("known table");
        copy_table_to_postgres(engine, postgres, name, &ddl)?;
    }
    // PostgreSQL runs correlated subqueries once per outer row (Q2, Q17, Q20): without these
    // indexes each run scans a whole table and the oracle takes hours.
    postgres.psql(POSTGRES_TPCH_INDEXES)?;
    postgres.psql("analyze")?;
    Ok(())
}

/// The user and password the engine's test servers accept (SCRAM-SHA-256).
pub const ENGINE_USER: &str = "engine_test";
pub const ENGINE_PASSWORD: &str = "engine-test-secret";
/// The engine's one database.
pub const ENGINE_DATABASE: &str = bypass_engine::server::DATABASE_NAME;

/// Starts the engine's server on a free port; clients log in as ENGINE_USER.
pub fn start_server(engine: std::sync::Arc<Engine>) -> anyhow::Result<bypass_engine::server::Server> {
    let settings =
        bypass_engine::server::ServerSettings::with_password("127.0.0.1:0".parse()?, ENGINE_USER, ENGINE_PASSWORD);
    Ok(bypass_engine::server::start(engine, settings)?)
}

/// psql against the engine's server, logged in, unaligned tuples-only output; returns
/// (success, stdout, stderr).
pub fn engine_psql(address: std::net::SocketAddr, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let output = Command::new(pg_bin("psql"))
        .args(["-X", "-h", &address.ip().to_string(), "-p", &address.port().to_string()])
        .args(["-U", ENGINE_USER, "-d", ENGINE_DATABASE])
        .args(args)
        .env("PGPASSWORD", ENGINE_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("LC_ALL", "C")
        .output()?;
    Ok((output.status.success(), String::from_utf8(output.stdout)?, String::from_utf8(output.stderr)?))
}

/// A libpq connection string for the engine's server.
pub fn engine_conninfo(address: std::net::SocketAddr) -> String {
    format!(
        "host={} port={} user={ENGINE_USER} password={ENGINE_PASSWORD} dbname={ENGINE_DATABASE}",
        address.ip(),
        address.port()
    )
}
