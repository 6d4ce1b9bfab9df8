//! Both tiers (compiled, interpreted) and both runtimes (specialized, plain) give identical
//! results on every supported TPC-H query.

use bypass_engine::{tpch, Engine, EngineSettings, RuntimeKind, RuntimeSettings, Tier};

fn rows(engine: &Engine, sql: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let result = engine.query(sql)?;
    let mut rows: Vec<Vec<String>> = result.rows().iter().map(|r| r.iter().map(|v| v.to_string()).collect()).collect();
    rows.sort();
    Ok(rows)
}

fn engine(kind: RuntimeKind) -> anyhow::Result<Engine> {
    let runtime = RuntimeSettings { kind, workers: 2, ..RuntimeSettings::default() };
    let engine = Engine::new(EngineSettings { runtime, ..EngineSettings::default() })?;
    tpch::load(&engine, 0.05)?;
    Ok(engine)
}

// Goal: the compiled tier and the interpreter agree exactly, in both runtimes, and the
// runtimes agree with each other; method: SF 0.05, every supported query under the four
// combinations, rows compared as exact text (sorted, since group order may differ).
#[test]
fn tiers_and_runtimes_agree() -> anyhow::Result<()> {
    let specialized = engine(RuntimeKind::Specialized)?;
    let plain = engine(RuntimeKind::Plain)?;
    for number in tpch::SUPPORTED_QUERIES {
        let sql = tpch::query(number).expect("supported");
        let mut answers = Vec::new();
        for engine in [&specialized, &plain] {
            for tier in [Tier::Compiled, Tier::Interpreted] {
                engine.set_tier(tier);
                answers.push(rows(engine, sql)?);
            }
        }
        assert!(!answers[0].is_empty(), "Q{number} has rows");
        for (index, answer) in answers.iter().enumerate().skip(1) {
            assert_eq!(answer, &answers[0], "Q{number}: combination {index} differs from specialized+compiled");
        }
    }
    Ok(())
}

// Goal: the compiled tier really runs the aggregate pipelines it claims (so the agreement
// test above is not vacuous); method: EXPLAIN of Q1 and Q6 names the compiled tier, and the
// interpreted setting turns it off.
#[test]
fn explain_shows_pipelines_and_tiers() -> anyhow::Result<()> {
    let engine = Engine::new(EngineSettings::default())?;
    tpch::load(&engine, 0.01)?;
    for number in [1, 6] {
        let plan = engine.query(&format!("explain {}", tpch::query(number).expect("supported")))?;
        let text: Vec<String> = plan.rows().iter().map(|r| r[0].to_string()).collect();
        let text = text.join("\n");
        assert!(text.contains("compiled"), "Q{number} plan:\n{text}");
        assert!(text.contains("pipeline 2"), "Q{number} has an aggregate pipeline:\n{text}");
    }
    let plan = engine.query(&format!("explain {}", tpch::query(3).expect("supported")))?;
    let text: Vec<String> = plan.rows().iter().map(|r| r[0].to_string()).collect();
    assert!(text.iter().any(|l| l.contains("HashJoin")), "Q3 joins:\n{}", text.join("\n"));
    engine.set_tier(Tier::Interpreted);
    let plan = engine.query(&format!("explain {}", tpch::query(6).expect("supported")))?;
    let text: Vec<String> = plan.rows().iter().map(|r| r[0].to_string()).collect();
    assert!(!text.join("\n").contains("compiled"), "interpreted tier only");
    Ok(())
}

/// Rows of the zone-map table: chunk c's values span 10^(c mod 4 + 1) from 1000·c + shift, so
/// chunks get one-byte, two-byte and no narrow copies.
fn zone_map_rows(first: i64, count: i64, shift: i64) -> String {
    let rows: Vec<String> = (first..first + count)
        .map(|i| {
            let chunk = i / 64;
            let span = 10i64.pow((chunk % 4) as u32 + 1);
            let wide = 1000 * chunk + shift + (i * 7919) % span;
            format!("({wide}, {}, {}.{:02}, date '2020-01-01' + {})", i % 50, i % 11, i % 100, (i * 13) % 300)
        })
        .collect();
    rows.join(", ")
}

// Goal: range filters answered from zone maps and one/two-byte narrow copies give exactly the
// interpreter's answers, also after an INSERT grows the last chunk beyond its old zone map;
// method: 64-row chunks whose ranges fit u8, u16 and neither, a sweep of ranges that skip,
// keep or split chunks, each query run in both tiers (EXPLAIN confirms the compiled tier).
#[test]
fn zone_maps_and_narrow_copies_agree_with_interpreter() -> anyhow::Result<()> {
    let engine = Engine::new(EngineSettings { chunk_rows: 64, ..EngineSettings::default() })?;
    engine.execute("create table z (w bigint, q bigint, d numeric(12,2), s date)")?;
    engine.execute(&format!("insert into z values {}", zone_map_rows(0, 1000, 0)))?;
    let bounds: [(i64, i64); 8] =
        [(-5, 3), (0, 9), (950, 2100), (3000, 3099), (5000, 5000), (2500, 1_000_000), (7777, 100), (100_000, 200_000)];
    let mut checked = 0;
    for round in 0..2 {
        if round == 1 {
            // Grows the last (partly filled) chunk with values outside its zone map.
            engine.execute(&format!("insert into z values {}", zone_map_rows(1000, 40, 90_000)))?;
        }
        for (lo, hi) in bounds {
            for sql in [
                format!("select count(*), sum(d * (1 - d)) from z where w >= {lo} and w <= {hi}"),
                format!(
                    "select count(*), sum(w) from z where q < {} and d between {}.5 and 7 and s < date '2020-06-01'",
                    lo.rem_euclid(50),
                    hi.rem_euclid(5)
                ),
            ] {
                engine.set_tier(Tier::Compiled);
                let plan = engine.query(&format!("explain {sql}"))?;
                let plan: Vec<String> = plan.rows().iter().map(|r| r[0].to_string()).collect();
                assert!(plan.iter().any(|l| l.contains("compiled")), "{sql}\n{}", plan.join("\n"));
                let compiled = rows(&engine, &sql)?;
                engine.set_tier(Tier::Interpreted);
                let interpreted = rows(&engine, &sql)?;
                assert_eq!(compiled, interpreted, "{sql}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 32);
    let all = rows(&engine, "select count(*) from z where w >= -1000000000 and w <= 1000000000")?;
    assert_eq!(all, vec![vec!["1040".to_string()]], "a range covering every zone map keeps every row");
    Ok(())
}
