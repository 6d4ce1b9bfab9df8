//! Compiled columnar engine in a specialized runtime, served over the PostgreSQL protocol (NautDB). Work in progress: see the issue tracker.

pub mod cli {
    //! The `bypass engine` subcommands and `bypass bench engine`, owned by this crate.

    /// Subcommands of `bypass engine`.
    #[derive(clap::Subcommand)]
    pub enum Command {
        /// Report what this part can do so far.
        Status,
    }

    /// Arguments of `bypass bench engine`.
    #[derive(clap::Args)]
    pub struct BenchArgs {}

    pub fn run(command: Command) -> anyhow::Result<()> {
        match command {
            Command::Status => {
                println!("bypass engine: not built yet");
                Ok(())
            }
        }
    }

    pub fn bench(_args: BenchArgs) -> anyhow::Result<()> {
        anyhow::bail!("bypass bench engine is not built yet")
    }
}
