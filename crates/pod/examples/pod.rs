//! The same commands as `bypass pod …` and `bypass bench pod`, runnable without building the
//! whole `bypass` binary: `cargo run --release -p bypass-pod --example pod -- run --help`.

use clap::Parser;

#[derive(Parser)]
enum Cli {
    #[command(flatten)]
    Pod(bypass_pod::cli::Command),
    /// `bypass bench pod`.
    Bench(bypass_pod::cli::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Pod(command) => bypass_pod::cli::run(command),
        Cli::Bench(args) => bypass_pod::cli::bench(args),
    }
}
