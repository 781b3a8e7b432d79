//! `pagoda bench`: load generators against OpenAI-compatible servers.
//!
//! Its own crate (`pagoda-loadgen`): a client, not part of the server, so the
//! server library links neither it nor `plotters`; the `pagoda` binary dispatches
//! `pagoda bench ...` here.
//!
//! `pagoda bench serve` streams `/v1/completions` requests (token-id prompts,
//! `ignore_eos`, greedy) at fixed concurrency levels against any OpenAI-compatible
//! server (ours, llama.cpp's `llama-server`, vLLM) and reports vLLM-style latency
//! and throughput statistics, optionally as JSON and a PNG plot.

pub mod client;
mod error;
pub mod plot;
pub mod prompts;
pub mod report;
pub mod serve;
pub mod stats;

use clap::Subcommand;

pub use error::BenchError;
pub use serve::ServeBenchArgs;

/// Subcommands of `pagoda bench`.
#[derive(Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// Load-test an OpenAI-compatible serving endpoint at several concurrency levels.
    Serve(ServeBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Serve(a) => serve::run(a),
    }
}
