//! `bypass dispatch …`, `bypass agent`, `bypass lab …` and `bypass bench dispatch`.

use crate::lab::{Lab, LabSpec};

/// Subcommands of `bypass dispatch`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Report what this part can do so far.
    Status,
}

/// Arguments of `bypass agent`.
#[derive(clap::Args)]
pub struct AgentArgs {}

/// Which lab to act on.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Prefix of the lab's network namespaces (a-z, 0-9).
    #[arg(long, default_value = "bypass")]
    pub name: String,
    /// Rate of every shaped server link, in Mbit/s.
    #[arg(long, default_value_t = 1000)]
    pub link_rate_mbit: u32,
}

/// Subcommands of `bypass lab`.
#[derive(clap::Subcommand)]
pub enum LabCommand {
    /// Build the namespaces, links and services of the lab (reuses a complete one).
    Up(LabArgs),
    /// Tear the lab down (every namespace named `<name>-…`).
    Down(LabArgs),
}

/// Arguments of `bypass bench dispatch`.
#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Status => {
            println!("bypass dispatch: lab ready; routing and hand-over not built yet");
            Ok(())
        }
    }
}

pub fn agent(_args: AgentArgs) -> anyhow::Result<()> {
    anyhow::bail!("bypass agent is not built yet")
}

pub fn lab(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Up(args) => {
            let spec = LabSpec { name: args.name, link_rate_mbit: args.link_rate_mbit, ..LabSpec::default() };
            let lab = Lab::up(spec)?;
            for host in lab.hosts() {
                println!("{:<5} {:<16} {}", host.short, host.namespace, host.address);
            }
            Ok(())
        }
        LabCommand::Down(args) => {
            Lab::down(&args.name)?;
            println!("lab {} is down", args.name);
            Ok(())
        }
    }
}

pub fn bench(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("bypass bench dispatch is not built yet")
}
