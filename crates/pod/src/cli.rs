//! The `bypass pod` subcommands and `bypass bench pod`, owned by this crate.

/// Subcommands of `bypass pod`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Report what this part can do so far.
    Status,
}

/// Arguments of `bypass bench pod`.
#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Status => {
            println!("bypass pod: see `bypass pod --help`");
            Ok(())
        }
    }
}

pub fn bench(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("bypass bench pod is not built yet")
}
