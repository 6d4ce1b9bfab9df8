//! `bypass bench pod` (work in progress).

/// Arguments of `bypass bench pod`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("bypass bench pod is not built yet")
}
