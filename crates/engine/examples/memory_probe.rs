//! Where a TPC-H database's memory goes: resident set and chunk-pool bytes after loading and
//! after Q6 (`cargo run --release -p bypass-engine --example memory_probe -- SF`).

// As in the other stand-alone examples: mimalloc unless the feature already set it.
#[cfg(not(feature = "global-mimalloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use bypass_engine::{tpch, Engine, EngineSettings};

/// VmRSS and VmHWM of this process, as /proc/self/status prints them.
fn resident() -> anyhow::Result<String> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let lines: Vec<&str> =
        status.lines().filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM")).map(str::trim).collect();
    Ok(lines.join(", ").replace('\t', " "))
}

fn report(engine: &Engine, moment: &str) -> anyhow::Result<()> {
    let pool_mib = engine.runtime().pool().mapped_bytes() >> 20;
    println!("{moment}: {}; chunk pool mapped {pool_mib} MiB", resident()?);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let sf: f64 = std::env::args().nth(1).map_or(Ok(1.0), |s| s.parse())?;
    let engine = Engine::new(EngineSettings::default())?;
    report(&engine, "start")?;
    tpch::load(&engine, sf)?;
    report(&engine, &format!("TPC-H SF {sf} loaded"))?;
    engine.query(tpch::query(6).ok_or_else(|| anyhow::anyhow!("Q6 is supported"))?)?;
    report(&engine, "after Q6")?;
    Ok(())
}
