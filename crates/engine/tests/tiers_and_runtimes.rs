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
