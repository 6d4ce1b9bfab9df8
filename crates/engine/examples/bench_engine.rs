//! `bypass bench engine` without building the whole `bypass` binary:
//! `cargo run --release -p bypass-engine --example bench_engine -- [--quick] …` (same flags).

// The engine's global allocator is mimalloc (NautDB's workload-specific allocator); the
// `bypass` binary enables the feature `global-mimalloc`; this stand-alone binary sets it unless
// the feature already did (cargo unifies features when the whole workspace builds).
#[cfg(not(feature = "global-mimalloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

#[derive(Parser)]
struct Arguments {
    #[command(flatten)]
    bench: bypass_engine::cli::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    bypass_engine::cli::bench(Arguments::parse().bench)
}
