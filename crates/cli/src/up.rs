//! `bypass up`: the embedded default.
use clap::Args;

#[derive(Args)]
pub struct UpArgs {}

pub fn run(_args: UpArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
