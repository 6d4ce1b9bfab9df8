//! Real clients against the engine's server: psql's catalog meta-commands and `\copy`,
//! psycopg (binary parameters, NULLs, COPY), SQLAlchemy reflection and a pandas round trip.

mod common;

use std::sync::Arc;

use bypass_engine::{Engine, EngineSettings};
use common::{engine_psql, start_server};

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
    let engine = Arc::new(Engine::new(EngineSettings::default())?);
    let server = start_server(engine)?;
    let address = server.address;
    psql_ok(
        address,
        &[
            "-c",
            "create table items (id bigint primary key, code text unique, name text not null, qty integer default 7)",
        ],
    )?;
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
