//! TPC-H at SF 0.1: the engine's answers equal PostgreSQL's on the same rows.

mod common;

use bypass_engine::{tpch, Engine, EngineSettings};
use bypass_testkit::Postgres;

// Goal: every supported TPC-H query answers like PostgreSQL; method: generate SF 0.1 in the
// engine, COPY the same rows into a real PostgreSQL 15, run Q1 Q3 Q5 Q6 Q10 Q12 Q14 Q19 in
// both, compare row by row (numbers within 1e-9 relative: AVG and decimal division are
// float64 here, numeric in PostgreSQL).
#[test]
fn tpch_answers_equal_postgres() -> anyhow::Result<()> {
    let postgres = Postgres::start()?;
    let engine = Engine::new(EngineSettings::default())?;
    common::load_tpch_both(&engine, &postgres, 0.1)?;
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
