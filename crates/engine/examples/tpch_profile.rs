//! Profiling probe: loads TPC-H, then runs one query many times (`perf record` friendly).
//! `cargo run --release -p bypass-engine --example tpch_profile -- SF QUERY REPEATS [interpreted]`

// The engine's global allocator is mimalloc (NautDB's workload-specific allocator); the
// `bypass` binary enables the feature `global-mimalloc`; this stand-alone binary sets it unless
// the feature already did (cargo unifies features when the whole workspace builds).
#[cfg(not(feature = "global-mimalloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use bypass_engine::{tpch, Engine, EngineSettings, Tier};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let sf: f64 = args.get(1).map_or(Ok(1.0), |s| s.parse())?;
    let query: u8 = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let repeats: usize = args.get(3).map_or(Ok(20), |s| s.parse())?;
    let engine = Engine::new(EngineSettings::default())?;
    if args.get(4).is_some_and(|t| t == "interpreted") {
        engine.set_tier(Tier::Interpreted);
    }
    tpch::load(&engine, sf)?;
    eprintln!("loaded");
    let sql = tpch::query(query).ok_or_else(|| anyhow::anyhow!("unsupported query"))?;
    for row in engine.query(&format!("explain {sql}"))?.rows() {
        eprintln!("{}", row.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "));
    }
    let started = std::time::Instant::now();
    for _ in 0..repeats {
        engine.query(sql)?;
    }
    eprintln!("Q{query}: {:.1} ms per run", started.elapsed().as_secs_f64() * 1000.0 / repeats as f64);
    Ok(())
}
