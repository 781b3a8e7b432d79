//! `pagoda generate`: offline generation. All prompts go into the engine at once,
//! so they are batched continuously like server traffic.

use crate::args::EngineArgs;
use anyhow::Context;
use clap::Args;
use pagoda_core::SamplingParams;
use pagoda_engine::{LLMEngine, PromptInput};

/// Flags of `pagoda generate`.
#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// A prompt (repeat the flag for several).
    #[arg(long = "prompt", required_unless_present = "prompt_ids")]
    pub prompts: Vec<String>,
    /// A prompt given as token ids, comma-separated (repeat for several; after the
    /// --prompt ones): what a model without a tokenizer takes (`--load-format dummy`).
    #[arg(long = "prompt-ids")]
    pub prompt_ids: Vec<String>,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    /// Keep generating after EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object per prompt, in prompt order.
    #[arg(long)]
    pub json: bool,
}

/// `--prompt-ids 1,2,3`.
fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse()
                .map_err(|_| format!("--prompt-ids: `{t}` is not a token id"))
        })
        .collect()
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    args.engine.log_compat_notes();
    let config = args.engine.engine_config();
    let mut engine = LLMEngine::new(config).context("starting the engine")?;
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        max_tokens: Some(args.max_tokens),
        ignore_eos: args.ignore_eos,
        ..SamplingParams::default()
    };
    params.validate().context("invalid sampling flags")?;
    let id_prompts = args
        .prompt_ids
        .iter()
        .map(|s| parse_ids(s).map(PromptInput::Tokens))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let prompts: Vec<PromptInput> = args
        .prompts
        .iter()
        .cloned()
        .map(PromptInput::Text)
        .chain(id_prompts)
        .collect();
    let t0 = std::time::Instant::now();
    let results = engine.generate(&prompts, &params)?;
    let secs = t0.elapsed().as_secs_f64();
    let total: usize = results.iter().map(|r| r.token_ids.len()).sum();
    for r in &results {
        if args.json {
            let obj = serde_json::json!({
                "prompt": r.prompt,
                "prompt_token_ids": r.prompt_token_ids,
                "token_ids": r.token_ids,
                "text": r.text,
                "finish_reason": r.finish_reason.map(|f| f.as_str()),
            });
            println!("{obj}");
        } else {
            println!(
                "=== {:?}\n{}{}\n[{} tokens, finish: {}]",
                r.prompt,
                r.prompt,
                r.text,
                r.token_ids.len(),
                r.finish_reason.map_or("none", |f| f.as_str())
            );
        }
    }
    let stats = engine.stats();
    tracing::info!(
        "generated {total} tokens for {} prompts in {secs:.2}s ({:.1} tok/s); {} engine steps, {} preemptions, prefix cache hits {}/{} tokens",
        results.len(),
        total as f64 / secs.max(1e-9),
        stats.num_steps,
        stats.num_preemptions,
        stats.prefix_cache_hits,
        stats.prefix_cache_queries
    );
    Ok(())
}
