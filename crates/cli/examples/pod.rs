//! The same commands as `bypass pod …` and `bypass bench pod`, runnable without building the
//! whole `bypass` binary: `cargo run --release -p bypass-cli --example pod -- run --help`.

use clap::Parser;

#[derive(Parser)]
enum Cli {
    #[command(flatten)]
    Pod(bypass_cli::pod::Command),
    /// `bypass bench pod`.
    Bench(bypass_cli::pod::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Pod(command) => bypass_cli::pod::run(command),
        Cli::Bench(args) => bypass_cli::pod::bench(args),
    }
}
