//! `bypass bench engine` as a stand-alone example (the command some results in bench/results name):
//! `cargo run --release -p bypass-cli --example bench_engine -- [--quick] …` (same flags).

// mimalloc is the global allocator: bypass-cli links bypass-engine with `global-mimalloc`.

use clap::Parser;

#[derive(Parser)]
struct Arguments {
    #[command(flatten)]
    bench: bypass_cli::engine::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    bypass_cli::engine::bench(Arguments::parse().bench)
}
