//! Quick TPC-H timing probe: `cargo run --release -p bypass-engine --example tpch_times -- SF [tier] [runtime]`.
//! `TPCH_QUERIES=4,21` runs only those queries; `TPCH_RUNS=n` times each n times (default 5,
//! the best is printed).

// The engine's global allocator is mimalloc (NautDB's workload-specific allocator); the
// `bypass` binary enables the feature `global-mimalloc`; this stand-alone binary sets it unless
// the feature already did (cargo unifies features when the whole workspace builds).
#[cfg(not(feature = "global-mimalloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use bypass_engine::{tpch, Engine, EngineSettings, RuntimeKind, RuntimeSettings, Tier};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let sf: f64 = args.get(1).map_or(Ok(1.0), |s| s.parse())?;
    let tier = if args.get(2).is_some_and(|t| t == "interpreted") { Tier::Interpreted } else { Tier::Compiled };
    let kind = if args.get(3).is_some_and(|t| t == "plain") { RuntimeKind::Plain } else { RuntimeKind::Specialized };
    let settings = EngineSettings {
        runtime: RuntimeSettings { kind, ..RuntimeSettings::default() },
        tier,
        ..EngineSettings::default()
    };
    let engine = Engine::new(settings)?;
    let started = Instant::now();
    tpch::load(&engine, sf)?;
    println!("load SF {sf}: {:.2} s", started.elapsed().as_secs_f64());
    let only: Option<Vec<u8>> = std::env::var("TPCH_QUERIES")
        .ok()
        .map(|list| list.split(',').map(|q| q.trim().parse()).collect::<Result<_, _>>())
        .transpose()?;
    let runs: usize = std::env::var("TPCH_RUNS").map_or(Ok(5), |r| r.parse())?;
    for q in tpch::SUPPORTED_QUERIES {
        if only.as_ref().is_some_and(|only| !only.contains(&q)) {
            continue;
        }
        let sql = tpch::query(q).expect("supported");
        let mut best = f64::MAX;
        for _ in 0..runs {
            let started = Instant::now();
            engine.query(sql)?;
            best = best.min(started.elapsed().as_secs_f64() * 1000.0);
        }
        println!("Q{q}: {best:.1} ms");
    }
    Ok(())
}
