//! The `pagoda` command: `serve` (OpenAI-compatible server), `generate` (offline
//! batch generation) and `backends` (the attention-backend registry and the choice).

use clap::{Parser, Subcommand};
use pagoda_loadgen as bench;
use pagoda_server::{args, backends_cmd, generate, serve};

// Inventory only sees linked crates: link every backend.
use pagoda_backends as _;

#[derive(Parser)]
#[command(
    name = "pagoda",
    version,
    about = "Pagoda: an LLM serving engine with pluggable attention backends"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API.
    Serve(args::ServeArgs),
    /// Generate continuations of prompts, all submitted together.
    Generate(generate::GenerateArgs),
    /// List the attention backends, and for a model, each one's verdict and the choice.
    Backends(backends_cmd::BackendsArgs),
    /// Benchmarks (load generator against an OpenAI-compatible server).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Backends(a) => backends_cmd::run(a),
        Command::Bench(c) => bench::run(c),
    }
}
