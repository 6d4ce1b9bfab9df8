//! Real clients against the engine's server: psql's catalog meta-commands and `\copy`,
//! psycopg (binary parameters, NULLs, COPY), SQLAlchemy reflection and a pandas round trip,
//! and DBeaver's metadata queries replayed through pgjdbc.

mod common;

use std::sync::Arc;

use bypass_engine::{Engine, EngineSettings};
use common::{engine_psql, start_server};

/// The table the psql and DBeaver tests browse: a primary key, a unique and a NOT NULL column,
/// a default; and its rows.
const ITEMS: [&str; 2] = [
    "create table items (id bigint primary key, code text unique, name text not null, qty integer default 7)",
    "insert into items values (1, 'a', 'first', 1), (2, 'b', 'second', default), (3, null, 'third', 3)",
];

/// A server holding [`ITEMS`].
fn server_with_items() -> anyhow::Result<bypass_engine::server::Server> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = start_server(engine)?;
    psql_ok(server.address, &["-c", ITEMS[0], "-c", ITEMS[1]])?;
    Ok(server)
}

fn psql_ok(address: std::net::SocketAddr, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["-v", "ON_ERROR_STOP=1"];
    all.extend_from_slice(args);
    let (ok, stdout, stderr) = engine_psql(address, &all)?;
    anyhow::ensure!(ok && !stderr.contains("ERROR"), "psql {args:?} failed: {stderr}");
    Ok(stdout)
}

// Goal: psql's describe commands work (\dt, \d, \d table, \l, \dn, \du, \di) and show the
// engine's tables, columns, NOT NULL, defaults and keys; method: real psql 15 meta-commands.
#[test]
fn psql_describe_commands() -> anyhow::Result<()> {
    let server = server_with_items()?;
    let address = server.address;
    psql_ok(address, &["-c", "create table notes (body text)"])?;
    let tables = psql_ok(address, &["-c", "\\dt"])?;
    assert!(tables.contains("items") && tables.contains("notes") && tables.contains("table"), "{tables}");
    let all = psql_ok(address, &["-c", "\\d"])?;
    assert!(all.contains("items") && all.contains("notes"), "{all}");
    let items = psql_ok(address, &["-c", "\\d items"])?;
    for expected in [
        "Table \"public.items\"",
        "id",
        "bigint",
        "not null",
        "text",
        "integer",
        "7",
        "items_pkey",
        "PRIMARY KEY",
        "items_code_key",
    ] {
        assert!(items.contains(expected), "\\d items lacks {expected:?}:\n{items}");
    }
    let databases = psql_ok(address, &["-c", "\\l"])?;
    assert!(databases.contains("bypass") && databases.contains("UTF8"), "{databases}");
    let schemas = psql_ok(address, &["-c", "\\dn"])?;
    assert!(schemas.contains("public"), "{schemas}");
    let roles = psql_ok(address, &["-c", "\\du"])?;
    assert!(roles.contains(common::ENGINE_USER), "{roles}");
    let indexes = psql_ok(address, &["-c", "\\di"])?;
    assert!(indexes.contains("items_pkey"), "{indexes}");
    Ok(())
}

// Goal: the size functions measure what the engine holds: a unique index (primary key, UNIQUE)
// reports the bytes of its key set and grows with its rows, an index that is not unique (a
// catalog entry only) reports 0, pg_indexes_size and pg_total_relation_size add them up;
// method: psql over a table with both kinds, before and after 2,000 more rows.
#[test]
fn relation_sizes_measure_unique_indexes() -> anyhow::Result<()> {
    let server = server_with_items()?;
    let address = server.address;
    psql_ok(address, &["-c", "create index items_name on items (name)"])?;
    let sizes = |address| -> anyhow::Result<Vec<i64>> {
        let sql = "select pg_relation_size('items_pkey'::regclass), pg_relation_size('items_code_key'::regclass), \
                   pg_relation_size('items_name'::regclass), pg_indexes_size('items'::regclass), \
                   pg_relation_size('items'::regclass), pg_total_relation_size('items'::regclass)";
        let line = psql_ok(address, &["-At", "-c", sql])?;
        line.trim().split('|').map(|v| Ok(v.parse::<i64>()?)).collect()
    };
    let before = sizes(address)?;
    let [primary, code, plain, indexes, table, total] = before[..] else { anyhow::bail!("{before:?}") };
    assert!(primary > 0 && code > 0, "unique indexes are measured: {before:?}");
    assert_eq!(plain, 0, "an index that is not unique holds nothing");
    assert_eq!(indexes, primary + code);
    assert_eq!(total, table + indexes);
    let rows: Vec<String> = (10..2010).map(|i| format!("({i}, 'code {i}', 'name {i}', {i})")).collect();
    psql_ok(address, &["-c", &format!("insert into items values {}", rows.join(", "))])?;
    let after = sizes(address)?;
    assert!(after[0] > primary && after[1] > code, "indexes grow with their keys: {before:?} then {after:?}");
    Ok(())
}

/// The venv made by scripts/engine-venv.sh (`make test` runs it in setup).
fn venv_python() -> anyhow::Result<std::path::PathBuf> {
    let default = std::env::var("HOME").map(|h| format!("{h}/.cache/bypass/engine-venv"))?;
    let venv = std::env::var("BYPASS_ENGINE_VENV").unwrap_or(default);
    let python = std::path::PathBuf::from(venv).join("bin/python");
    anyhow::ensure!(python.exists(), "no engine venv at {}: run scripts/engine-venv.sh", python.display());
    Ok(python)
}

/// Runs a Python script with the connection string as argv[1]; it must print "ok".
fn python(script: &str, conninfo: &str) -> anyhow::Result<()> {
    let output = std::process::Command::new(venv_python()?).args(["-c", script, conninfo]).output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "python failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

const PSYCOPG: &str = r#"
import sys, datetime, decimal
import psycopg
with psycopg.connect(sys.argv[1]) as conn:
    conn.execute("create table t (i integer, b bigint, f double precision, n numeric(12,3), d date, s text, ok boolean)")
    row = (7, 2**40, 1.25, decimal.Decimal("-12.345"), datetime.date(2024, 2, 29), "it's", True)
    nulls = (None,) * 7
    with conn.cursor(binary=True) as cur:
        cur.execute("insert into t values (%s, %s, %s, %s, %s, %s, %s)", row)
        cur.execute("insert into t values (%s, %s, %s, %s, %s, %s, %s)", nulls)
        cur.execute("select * from t where i = %s and d = %s and n = %s", (7, datetime.date(2024, 2, 29), decimal.Decimal("-12.345")))
        assert cur.fetchall() == [row], "binary parameters and results"
        cur.execute("select count(*) from t where s is null and %s is null", (None,))
        assert cur.fetchone() == (1,), "a NULL parameter"
    assert conn.execute("select * from t where i is null").fetchall() == [nulls], "text results with NULLs"
    with conn.cursor() as cur:
        with cur.copy("copy t (i, s, d) from stdin") as copy:
            for i in range(1000):
                copy.write_row((i, f"row {i}", datetime.date(2020, 1, 1) + datetime.timedelta(days=i)))
    assert conn.execute("select count(*), sum(i) from t where s like 'row %'").fetchone() == (1000, 499500)
    with conn.cursor() as cur:
        with cur.copy("copy (select i, s from t where i < 3 order by i) to stdout") as copy:
            got = [tuple(r) for r in copy.rows()]
    assert got == [("0", "row 0"), ("1", "row 1"), ("2", "row 2")], got
    conn.commit()
print("ok")
"#;

// Goal: psycopg 3 works end to end: binary parameters and results for every engine type, NULL
// parameters, COPY FROM STDIN (write_row) and COPY TO STDOUT; method: a script in the venv.
#[test]
fn psycopg_binary_nulls_and_copy() -> anyhow::Result<()> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = start_server(engine)?;
    python(PSYCOPG, &common::engine_conninfo(server.address))
}

const SQLALCHEMY_PANDAS: &str = r#"
import sys
import pandas as pd
import sqlalchemy as sa
conninfo = dict(part.split("=", 1) for part in sys.argv[1].split())
url = sa.engine.URL.create("postgresql+psycopg", username=conninfo["user"], password=conninfo["password"],
                           host=conninfo["host"], port=int(conninfo["port"]), database=conninfo["dbname"])
engine = sa.create_engine(url)
frame = pd.DataFrame({"id": [1, 2, 3], "name": ["a", None, "c"], "price": [1.5, 2.25, None], "flag": [True, False, True]})
frame.to_sql("frame", engine, index=True, if_exists="replace")
back = pd.read_sql("select id, name, price, flag from frame order by id", engine)
assert back["id"].tolist() == [1, 2, 3], back
assert back["name"].tolist() == ["a", None, "c"], back
assert back["price"].tolist()[:2] == [1.5, 2.25] and pd.isna(back["price"][2]), back
assert back["flag"].tolist() == [True, False, True], back
frame.to_sql("frame", engine, index=False, if_exists="append")
assert pd.read_sql("select count(*) as n from frame", engine)["n"][0] == 6
inspector = sa.inspect(engine)
assert "frame" in inspector.get_table_names()
assert [c["name"] for c in inspector.get_columns("frame")] == ["index", "id", "name", "price", "flag"]
assert [i["name"] for i in inspector.get_indexes("frame")] == ["ix_frame_index"]
with engine.begin() as conn:
    conn.exec_driver_sql("create table keyed (id integer primary key, code text unique, v numeric(10,2) not null default 0)")
keyed = sa.Table("keyed", sa.MetaData(), autoload_with=engine)
assert [c.name for c in keyed.primary_key.columns] == ["id"]
assert keyed.c.v.nullable is False
with engine.begin() as conn:
    conn.execute(keyed.insert(), [{"id": 1, "code": "x"}])
    conn.execute(keyed.insert(), [{"id": 2, "code": "y", "v": 2.5}, {"id": 4, "code": "z", "v": 4}])
try:
    with engine.begin() as conn:
        conn.execute(keyed.insert(), [{"id": 3, "code": "x"}])
    raise AssertionError("duplicate accepted")
except sa.exc.IntegrityError:
    pass
assert pd.read_sql("select v from keyed order by id", engine)["v"].tolist() == [0, 2.5, 4]
print("ok")
"#;

// Goal: SQLAlchemy 2 + pandas round trip: to_sql (replace with an index, append), read_sql,
// reflection of columns, indexes, primary key and NOT NULL, ORM-style inserts in a
// transaction and a unique violation surfacing as IntegrityError; method: a venv script.
#[test]
fn sqlalchemy_and_pandas_round_trip() -> anyhow::Result<()> {
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = start_server(engine)?;
    python(SQLALCHEMY_PANDAS, &common::engine_conninfo(server.address))
}

// Goal: psql's \copy loads a CSV file, a file with a bad row loads nothing and the error names
// its line, and \copy … to writes the rows back; method: real psql with temporary files.
#[test]
fn psql_copy_in_and_out() -> anyhow::Result<()> {
    use std::io::Write;
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = start_server(engine)?;
    let address = server.address;
    psql_ok(address, &["-c", "create table loaded (id integer primary key, name text, amount numeric(8,2))"])?;
    let mut good = tempfile::NamedTempFile::new()?;
    for i in 0..500 {
        writeln!(good, "{i},\"name, {i}\",{}.25", i % 97)?;
    }
    good.flush()?;
    let copy = format!("\\copy loaded from '{}' with (format csv)", good.path().display());
    let out = psql_ok(address, &["-c", &copy])?;
    assert!(out.contains("COPY 500"), "{out}");
    let mut bad = tempfile::NamedTempFile::new()?;
    writeln!(bad, "1000,fine,1.00")?;
    writeln!(bad, "1001,also fine,2.00")?;
    writeln!(bad, "oops,broken,3.00")?;
    bad.flush()?;
    let copy = format!("\\copy loaded from '{}' with (format csv)", bad.path().display());
    let (ok, _, stderr) = engine_psql(address, &["-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-c", &copy])?;
    assert!(!ok && stderr.contains("22P02") && stderr.contains("line 3"), "{stderr}");
    let count = psql_ok(address, &["-A", "-t", "-c", "select count(*), sum(amount) from loaded"])?;
    assert_eq!(count.trim(), "500|23510.00", "the bad file loaded nothing");
    let out_file = tempfile::NamedTempFile::new()?;
    let copy = format!(
        "\\copy (select id, name from loaded where id < 3 order by id) to '{}' with (format csv, header)",
        out_file.path().display()
    );
    psql_ok(address, &["-c", &copy])?;
    let written = std::fs::read_to_string(out_file.path())?;
    assert_eq!(written, "id,name\n0,\"name, 0\"\n1,\"name, 1\"\n2,\"name, 2\"\n");
    Ok(())
}

/// pgjdbc from Debian's libpostgresql-jdbc-java (scripts/setup.sh installs it).
const PGJDBC_JAR: &str = "/usr/share/java/postgresql.jar";

/// One answer of the DBeaver replay: column names, rows as name → text, or an error.
#[derive(Debug, Default)]
struct Answer {
    columns: Vec<String>,
    /// Per column, pgjdbc's ResultSetMetaData `getTableName:isNullable` (0 no NULLs, 1 NULLs,
    /// 2 unknown).
    origins: Vec<String>,
    rows: Vec<std::collections::HashMap<String, String>>,
    error: Option<String>,
}

impl Answer {
    fn has_row(&self, pairs: &[(&str, &str)]) -> bool {
        self.rows.iter().any(|row| pairs.iter().all(|(k, v)| row.get(*k).map(String::as_str) == Some(*v)))
    }
}

/// Compiles and runs tests/dbeaver/DbeaverReplay.java against `address`; answers by label.
fn replay_dbeaver(address: std::net::SocketAddr) -> anyhow::Result<Vec<(String, Answer)>> {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dbeaver");
    anyhow::ensure!(std::path::Path::new(PGJDBC_JAR).exists(), "{PGJDBC_JAR} is missing: run scripts/setup.sh");
    let classes = tempfile::tempdir()?;
    let javac = std::process::Command::new("javac")
        .arg("-d")
        .arg(classes.path())
        .arg(here.join("DbeaverReplay.java"))
        .output()?;
    anyhow::ensure!(javac.status.success(), "javac failed: {}", String::from_utf8_lossy(&javac.stderr));
    let url =
        format!("jdbc:postgresql://{}:{}/{}?sslmode=disable", address.ip(), address.port(), common::ENGINE_DATABASE);
    let output = std::process::Command::new("java")
        .args(["-Duser.timezone=UTC", "-cp"])
        .arg(format!("{}:{PGJDBC_JAR}", classes.path().display()))
        .arg("DbeaverReplay")
        .arg(here.join("queries.sql"))
        .args([&url, common::ENGINE_USER, common::ENGINE_PASSWORD])
        .output()?;
    let stdout = String::from_utf8(output.stdout)?;
    anyhow::ensure!(output.status.success(), "java failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let mut answers: Vec<(String, Answer)> = Vec::new();
    for line in stdout.lines() {
        if let Some(label) = line.strip_prefix("== ") {
            answers.push((label.to_string(), Answer::default()));
            continue;
        }
        let Some((_, answer)) = answers.last_mut() else { continue };
        if let Some(columns) = line.strip_prefix("columns: ") {
            answer.columns = columns.split(',').map(|c| c.split(':').next().unwrap_or_default().to_string()).collect();
        } else if let Some(origins) = line.strip_prefix("origins: ") {
            answer.origins = origins.split(',').map(str::to_string).collect();
        } else if let Some(row) = line.strip_prefix("row: ") {
            let cells =
                row.split('|').filter_map(|cell| cell.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string()));
            answer.rows.push(cells.collect());
        } else if let Some(error) = line.strip_prefix("error: ") {
            answer.error = Some(error.to_string());
        }
    }
    Ok(answers)
}

// Goal: DBeaver can connect and browse the engine: every query its PostgreSQL driver sends to
// connect, list databases, schemas, data types, roles, tables, columns, constraints and indexes
// runs, and the answers describe the table created here as DBeaver reads them (names, types,
// NOT NULL, default, primary key and unique constraints with their columns, their indexes);
// method: the query set of tests/dbeaver/queries.sql, taken from DBeaver's source, replayed
// through pgjdbc (prepared statements, typed parameters, every column read with getObject).
#[test]
fn dbeaver_metadata_queries_through_pgjdbc() -> anyhow::Result<()> {
    let server = server_with_items()?;
    let address = server.address;
    let fixture =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dbeaver/queries.sql"))?;
    let expected = fixture.lines().filter(|l| l.starts_with("-- query: ")).count();
    let answers = replay_dbeaver(address)?;
    assert_eq!(answers.len(), expected, "every query answered: {answers:?}");
    let errors: Vec<String> =
        answers.iter().filter_map(|(label, a)| a.error.as_ref().map(|e| format!("{label}: {e}"))).collect();
    assert!(errors.is_empty(), "DBeaver's queries failed:\n{}", errors.join("\n"));
    let answer = |prefix: &str| -> &Answer {
        let named = |label: &String| *label == prefix || label.starts_with(&format!("{prefix} ("));
        &answers.iter().find(|(label, _)| named(label)).unwrap_or_else(|| panic!("no {prefix}")).1
    };
    assert!(answer("version").rows[0]["version"].starts_with("PostgreSQL 15"));
    assert!(answer("databases").has_row(&[("datname", "bypass"), ("datallowconn", "true")]));
    assert!(answer("setting").has_row(&[("name", "standard_conforming_strings"), ("setting", "on")]));
    assert!(answer("context defaults").has_row(&[("current_schema", "public"), ("session_user", common::ENGINE_USER)]));
    let schemas = answer("schemas");
    assert!(schemas.has_row(&[("nspname", "public")]) && schemas.has_row(&[("nspname", "pg_catalog")]));
    let types = answer("data types");
    for (name, oid) in [("int8", "20"), ("text", "25"), ("int4", "23"), ("bool", "16"), ("numeric", "1700")] {
        assert!(types.has_row(&[("typname", name), ("oid", oid)]), "data type {name}");
    }
    assert!(answer("roles").has_row(&[("rolname", common::ENGINE_USER)]));
    assert!(answer("access methods").has_row(&[("amname", "btree")]));
    let tables = answer("tables");
    assert!(tables.has_row(&[("relname", "items"), ("relkind", "r")]), "{tables:?}");
    let table_oid = tables.rows.iter().find(|r| r["relname"] == "items").map(|r| r["oid"].clone()).expect("items");
    let statistics = answer("table statistics");
    let sizes = statistics.rows.iter().find(|r| r["oid"] == table_oid).expect("statistics of items");
    assert!(sizes["rel_size"].parse::<i64>()? > 0, "{sizes:?}");
    let columns = answer("columns");
    let names: Vec<&str> = columns.rows.iter().map(|r| r["attname"].as_str()).collect();
    assert_eq!(names, ["id", "code", "name", "qty"], "{columns:?}");
    for (name, type_oid, not_null) in
        [("id", "20", "true"), ("code", "25", "false"), ("name", "25", "true"), ("qty", "23", "false")]
    {
        assert!(
            columns.has_row(&[("attname", name), ("atttypid", type_oid), ("attnotnull", not_null)]),
            "column {name}"
        );
    }
    assert!(columns.has_row(&[("attname", "qty"), ("def_value", "7")]), "{columns:?}");
    let constraints = answer("constraints");
    assert!(constraints.has_row(&[("conname", "items_pkey"), ("contype", "p"), ("tabrelname", "items")]));
    assert!(constraints.has_row(&[("conname", "items_code_key"), ("contype", "u"), ("tabrelname", "items")]));
    let indexes = answer("indexes");
    assert!(indexes.has_row(&[("relname", "items_pkey"), ("indisprimary", "true"), ("indisunique", "true")]));
    assert!(indexes.has_row(&[("relname", "items_code_key"), ("indisprimary", "false"), ("tabrelname", "items")]));
    assert!(answer("row count").has_row(&[("count", "3")]));
    let data = answer("data");
    assert_eq!(data.columns, ["id", "code", "name", "qty"]);
    assert!(data.has_row(&[("id", "2"), ("code", "b"), ("name", "second"), ("qty", "7")]) && data.rows.len() == 3);
    // RowDescription names each plain column's table and column number, so pgjdbc's
    // ResultSetMetaData finds the table and the NOT NULL columns (as DBeaver's editor uses them).
    assert_eq!(data.origins, ["items:0", "items:1", "items:0", "items:1"], "{data:?}");
    assert_eq!(answer("result origins").origins, ["items:0", ":2", "items:1"]);
    Ok(())
}
