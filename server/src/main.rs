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
    Serve(Box<args::ServeArgs>),
    /// Generate continuations of prompts, all submitted together.
    Generate(generate::GenerateArgs),
    /// List the attention backends, and for a model, each one's verdict and the choice.
    Backends(backends_cmd::BackendsArgs),
    /// Benchmarks (load generator against an OpenAI-compatible server).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_from(args::expand_vllm_short_flags(std::env::args_os()));
    // `RUST_LOG` wins; otherwise info, with `serve --uvicorn-log-level` for the HTTP layer.
    let default_filter = match &cli.command {
        Command::Serve(a) => format!(
            "info,pagoda_server::serve={}",
            a.uvicorn_log_level.tracing_level()
        ),
        _ => "info".to_string(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Serve(a) => serve::run(*a),
        Command::Generate(a) => generate::run(a),
        Command::Backends(a) => backends_cmd::run(a),
        Command::Bench(c) => bench::run(c),
    }
}
