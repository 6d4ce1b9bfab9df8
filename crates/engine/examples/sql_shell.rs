//! Development shell: loads TPC-H at a scale factor, then runs each argument (or each
//! `;`-separated statement of stdin) and prints rows, timing and errors with their SQLSTATE.
//! `cargo run --release -p bypass-engine --example sql_shell -- SF [SQL...]`

// See tpch_profile.rs for why the stand-alone examples set the allocator themselves.
#[cfg(not(feature = "global-mimalloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Read;
use std::time::Instant;

use bypass_engine::{tpch, Engine, EngineSettings};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sf: f64 = args.first().map_or(Ok(0.0), |s| s.parse())?;
    let engine = Engine::new(EngineSettings::default())?;
    if sf > 0.0 {
        tpch::load(&engine, sf)?;
    }
    let mut statements: Vec<String> = args.iter().skip(1).cloned().collect();
    if statements.is_empty() {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        statements = text.split(";\n").map(str::to_string).filter(|s| !s.trim().is_empty()).collect();
    }
    for sql in statements {
        let started = Instant::now();
        match engine.execute(&sql) {
            Ok(results) => {
                for result in results {
                    for row in result.rows().iter().take(50) {
                        println!(
                            "{}",
                            row.iter()
                                .map(|v| if v.is_null() { "NULL".into() } else { v.to_string() })
                                .collect::<Vec<_>>()
                                .join("|")
                        );
                    }
                    println!("({}; {:.1} ms)", result.tag, started.elapsed().as_secs_f64() * 1000.0);
                }
            }
            Err(e) => println!("ERROR {}: {e}", e.sqlstate()),
        }
    }
    Ok(())
}
