//! Multi-host transactional store over an emulated CXL pod (Tigon's Pasha architecture), with 2PL+2PC and OCC baselines. Work in progress: see the issue tracker.

pub mod alloc;
pub mod coherence;
pub mod error;
pub mod region;
pub mod ring;
pub mod rng;
pub mod word;

pub use error::{PodError, Result};

pub mod cli {
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
                println!("bypass pod: not built yet");
                Ok(())
            }
        }
    }

    pub fn bench(_args: BenchArgs) -> anyhow::Result<()> {
        anyhow::bail!("bypass bench pod is not built yet")
    }
}
