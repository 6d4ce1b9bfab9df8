//! Benchmarks.
pub mod pooler {
    #[derive(clap::Args)]
    pub struct PoolerBenchArgs {}
    pub fn run(_args: PoolerBenchArgs, _bypass: &std::path::Path) -> anyhow::Result<()> {
        anyhow::bail!("not yet")
    }
}
