//! TPC-H at SF 0.1: the engine's answers equal PostgreSQL's on the same rows.

mod common;

use bypass_engine::{tpch, Engine, EngineSettings};
use bypass_testkit::Postgres;

// Goal: all 22 TPC-H queries answer like PostgreSQL; method: generate SF 0.1 in the engine,
// COPY the same rows into a real PostgreSQL 15, run every query (the specification's text and
// validation parameters) in both, compare row by row (numbers within 1e-9 relative).
#[test]
fn tpch_answers_equal_postgres() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let engine = Engine::new(EngineSettings::default())?;
    // BYPASS_TPCH_CHECK_SF=1 runs the same comparison at another scale factor (by hand: SF 1
    // takes minutes in a release build).
    let scale_factor = std::env::var("BYPASS_TPCH_CHECK_SF").ok().and_then(|s| s.parse().ok()).unwrap_or(0.1);
    common::load_tpch_both(&engine, &postgres, scale_factor)?;
    let mut failures = Vec::new();
    for number in tpch::SUPPORTED_QUERIES {
        let sql = tpch::query(number).expect("supported");
        let theirs = common::postgres_rows(&postgres, sql)?;
        let ours = common::engine_rows(&engine, sql)?;
        assert!(!theirs.is_empty(), "Q{number} returns rows in PostgreSQL");
        if let Err(difference) = common::compare(&ours, &theirs, false) {
            failures.push(format!("Q{number}: {difference}"));
        }
    }
    assert!(failures.is_empty(), "differences:\n{}", failures.join("\n"));
    Ok(())
}
