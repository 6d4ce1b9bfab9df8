//! `bypass bench engine` without building the whole `bypass` binary:
//! `cargo run --release -p bypass-engine --example bench_engine -- [--quick] …` (same flags).

use clap::Parser;

#[derive(Parser)]
struct Arguments {
    #[command(flatten)]
    bench: bypass_engine::cli::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    bypass_engine::cli::bench(Arguments::parse().bench)
}
