//! `pagoda bench`: load generators against OpenAI-compatible servers.

use clap::Subcommand;

/// Subcommands of `pagoda bench`.
#[derive(Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// Load-test a serving endpoint (not written yet).
    Serve,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Serve => anyhow::bail!("pagoda bench serve is not implemented yet"),
    }
}
