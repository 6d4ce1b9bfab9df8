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
