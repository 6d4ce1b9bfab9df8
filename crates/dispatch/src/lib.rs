//! Per-query routing across backends and TCP connection hand-over for large results (Prism).
//! Work in progress: see the issue tracker.

pub mod cli {
    //! `bypass dispatch …`, `bypass agent`, `bypass lab …` and `bypass bench dispatch`, owned by this crate.

    /// Subcommands of `bypass dispatch`.
    #[derive(clap::Subcommand)]
    pub enum Command {
        /// Report what this part can do so far.
        Status,
    }

    /// Arguments of `bypass agent`.
    #[derive(clap::Args)]
    pub struct AgentArgs {}

    /// Subcommands of `bypass lab`.
    #[derive(clap::Subcommand)]
    pub enum LabCommand {
        /// Build the namespaces, links and services of the lab.
        Up,
        /// Tear the lab down.
        Down,
    }

    /// Arguments of `bypass bench dispatch`.
    #[derive(clap::Args)]
    pub struct BenchArgs {}

    pub fn run(command: Command) -> anyhow::Result<()> {
        match command {
            Command::Status => {
                println!("bypass dispatch: not built yet");
                Ok(())
            }
        }
    }

    pub fn agent(_args: AgentArgs) -> anyhow::Result<()> {
        anyhow::bail!("bypass agent is not built yet")
    }

    pub fn lab(_command: LabCommand) -> anyhow::Result<()> {
        anyhow::bail!("bypass lab is not built yet")
    }

    pub fn bench(_args: BenchArgs) -> anyhow::Result<()> {
        anyhow::bail!("bypass bench dispatch is not built yet")
    }
}
