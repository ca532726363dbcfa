//! `ipsan target` (placeholder until the target runtime lands in this session).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the target runtime is not wired in yet")
}
