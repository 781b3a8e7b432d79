//! `pagoda bench serve`: drives N streamed completions at each concurrency level
//! (at most C in flight) and reports TTFT, ITL, end-to-end latency and throughput.

use super::client::{BenchClient, RequestResult};
use super::prompts::{parse_range, PromptGen, PromptSpec};
use super::report::{self, BenchReport, LevelResult};
use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flags of `pagoda bench serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeBenchArgs {
    /// Server to load, e.g. `http://127.0.0.1:8000` (plain http).
    #[arg(long)]
    pub base_url: String,
    /// Model name sent in requests (default: the first id of GET /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Concurrency levels, run in order.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub concurrency: Vec<usize>,
    /// Requests per level (default: max(2 x concurrency, 8)).
    #[arg(long)]
    pub num_prompts: Option<usize>,
    /// Distinct prompt tokens per request (after the shared prefix).
    #[arg(long, default_value_t = 64)]
    pub input_len: usize,
    /// Tokens generated per request (`max_tokens`, with `ignore_eos`).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Tokens common to every prompt, in front of the distinct part.
    #[arg(long, default_value_t = 0)]
    pub shared_prefix_len: usize,
    /// Seed of the prompt generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prompt token ids are drawn from this half-open range of ordinary tokens.
    #[arg(long, default_value = "1000..10000", value_parser = parse_range)]
    pub token_id_range: (u32, u32),
    /// Write every result (summaries and per-request timings) to this JSON file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw output throughput and TTFT p50/p99 against concurrency into this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Dial a new connection for every request (llama-server closes streamed ones).
    #[arg(long)]
    pub new_connection_per_request: bool,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "OPENAI_API_KEY")]
    pub api_key: Option<String>,
    /// Per-request timeout in seconds (a timed-out request counts as failed).
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout_s: f64,
    /// Untimed requests (16 output tokens each) sent before the first level.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Free-form label stored in the JSON (e.g. the server's name).
    #[arg(long)]
    pub label: Option<String>,
    /// Print only the summary table, not the per-level blocks.
    #[arg(long)]
    pub quiet: bool,
    /// Sampling temperature of every request (0: greedy). Above 0 each request also
    /// carries its own `seed` (`--seed` plus its index), so a run is reproducible:
    /// the sampled workload where speculative drafts are rarely accepted.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
}

pub fn run(a: ServeBenchArgs) -> anyhow::Result<()> {
    // One thread: the load generator must steal as little CPU as possible from a
    // server under test on the same machine.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(run_async(&a))?;
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        let levels: Vec<_> = report.levels.iter().map(|l| l.summary.clone()).collect();
        super::plot::draw(p, &levels, report.label.as_deref().unwrap_or(&report.model))
            .with_context(|| format!("drawing {}", p.display()))?;
    }
    let failed: usize = report.levels.iter().map(|l| l.summary.failed).sum();
    let total: usize = report.levels.iter().map(|l| l.summary.num_prompts).sum();
    anyhow::ensure!(failed < total || total == 0, "every request failed");
    Ok(())
}

/// How every request of a run samples: greedy, or `temperature` with a seed per
/// request (`seed` plus the request's index).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub temperature: f64,
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding (the default workload).
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        seed: 0,
    };
}

/// The request body for prompt number `index`.
pub fn completion_body(
    model: &str,
    prompt: &[u32],
    output_len: usize,
    sampling: Sampling,
    index: usize,
) -> Value {
    let mut body = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": sampling.temperature,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if sampling.temperature > 0.0 {
        body["seed"] = json!(sampling.seed.wrapping_add(index as u64));
    }
    body
}

/// Runs every level and returns the report (also printing the tables).
pub async fn run_async(a: &ServeBenchArgs) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(
        !a.concurrency.is_empty(),
        "--concurrency needs at least one level"
    );
    anyhow::ensure!(
        a.concurrency.iter().all(|&c| c > 0),
        "concurrency levels must be >= 1"
    );
    anyhow::ensure!(a.output_len > 0, "--output-len must be at least 1");
    anyhow::ensure!(
        a.request_timeout_s > 0.0,
        "--request-timeout-s must be positive"
    );
    let client = Arc::new(BenchClient::new(
        &a.base_url,
        a.api_key.clone().filter(|k| !k.is_empty()),
        a.new_connection_per_request,
        Duration::from_secs_f64(a.request_timeout_s),
    )?);
    let model = match &a.model {
        Some(m) => m.clone(),
        None => {
            let v = client
                .get_json("/v1/models")
                .await
                .context("GET /v1/models (pass --model to skip)")?;
            v.pointer("/data/0/id")
                .and_then(Value::as_str)
                .context("GET /v1/models listed no model; pass --model")?
                .to_string()
        }
    };
    anyhow::ensure!(
        a.temperature >= 0.0 && a.temperature.is_finite(),
        "--temperature must be a finite number >= 0"
    );
    let sampling = Sampling {
        temperature: a.temperature,
        seed: a.seed,
    };
    let (lo, hi) = a.token_id_range;
    let mut gen = PromptGen::new(PromptSpec {
        input_len: a.input_len,
        shared_prefix_len: a.shared_prefix_len,
        lo,
        hi,
        seed: a.seed,
    })?;
    let prompt_len = a.shared_prefix_len + a.input_len;
    eprintln!(
        "bench serve: {} model={model} prompt={prompt_len} tokens ({} shared) output={} levels={:?}",
        a.base_url, a.shared_prefix_len, a.output_len, a.concurrency
    );

    if a.warmup > 0 {
        let t = Instant::now();
        for p in gen.take(a.warmup)? {
            let r = client
                .stream_completion(
                    &completion_body(&model, &p, a.output_len.min(16), sampling, 0),
                    t,
                )
                .await;
            if let Some(e) = r.error {
                anyhow::bail!("warm-up request failed: {e}");
            }
        }
    }

    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut levels = Vec::new();
    for &c in &a.concurrency {
        let n = a.num_prompts.unwrap_or((2 * c).max(8));
        let prompts = gen.take(n)?;
        let (duration_s, reqs) =
            run_level(&client, &model, prompts, c, a.output_len, sampling).await;
        let summary = report::summarize(c, duration_s, prompt_len, &reqs);
        if !a.quiet {
            print!("{}", report::level_block(&summary));
        }
        for e in reqs.iter().filter_map(|r| r.error.as_deref()).take(3) {
            eprintln!("  failed request: {e}");
        }
        levels.push(LevelResult {
            summary,
            requests: reqs,
        });
    }
    let sums: Vec<_> = levels.iter().map(|l| l.summary.clone()).collect();
    print!("{}", report::summary_table(&sums));
    Ok(BenchReport {
        base_url: a.base_url.clone(),
        model,
        input_len: a.input_len,
        output_len: a.output_len,
        shared_prefix_len: a.shared_prefix_len,
        seed: a.seed,
        new_connection_per_request: a.new_connection_per_request,
        label: a.label.clone(),
        started_unix_s,
        levels,
    })
}

/// Sends all `prompts` with at most `c` in flight; returns the wall time from the
/// first send to the last completion, and the results in prompt order.
async fn run_level(
    client: &Arc<BenchClient>,
    model: &str,
    prompts: Vec<Vec<u32>>,
    c: usize,
    output_len: usize,
    sampling: Sampling,
) -> (f64, Vec<RequestResult>) {
    let sem = Arc::new(tokio::sync::Semaphore::new(c));
    let start = Instant::now();
    let mut handles = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.into_iter().enumerate() {
        let body = completion_body(model, &p, output_len, sampling, i);
        let client = client.clone();
        // Acquire before spawning so requests start in order as slots free up.
        let permit = sem
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        handles.push(tokio::spawn(async move {
            let r = client.stream_completion(&body, start).await;
            drop(permit);
            r
        }));
    }
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap_or_else(|e| RequestResult {
            error: Some(format!("task failed: {e}")),
            ..Default::default()
        }));
    }
    (start.elapsed().as_secs_f64(), out)
}
