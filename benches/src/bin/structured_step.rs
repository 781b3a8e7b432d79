//! Structured outputs' cost per engine step on the real model: decode steps of 32
//! rows constrained by a JSON schema against 32 free rows (two engines stepped
//! alternately), plus the per-row mask time and how much of the mask work the
//! forward pass did not hide.
//!
//! ```sh
//! cargo run --release -p pagoda-benches --bin structured_step [-- STEPS ROWS]
//! ```
//!
//! The model is `$PAGODA_MODEL`, else `~/.cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf`.

use pagoda_core::{Constraint, SamplingParams, StructuredOutputs};
use pagoda_engine::{EngineConfig, LLMEngine, PromptInput};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

// Inventory only sees linked crates: link every backend.
use pagoda_backends as _;

fn model_path() -> PathBuf {
    std::env::var_os("PAGODA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
                .join(".cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

/// An array of people never completes within the measured steps, so every row
/// keeps a live JSON mask (objects, strings, integers) for the whole run.
fn schema() -> serde_json::Value {
    json!({
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "email": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["name", "age", "email", "tags"]
        }
    })
}

/// Queues `rows` requests (JSON-schema constrained or free) and runs their
/// prefills, so that every following step decodes all of them.
fn start(e: &mut LLMEngine, rows: usize, steps: usize, constrained: bool) {
    let params = SamplingParams {
        temperature: 0.8,
        seed: Some(7),
        max_tokens: Some(steps + 8),
        ignore_eos: true,
        structured_outputs: constrained
            .then(|| StructuredOutputs::new(Constraint::Json(schema())).into()),
        ..SamplingParams::default()
    };
    for r in 0..rows {
        let prompt = format!(
            "<|im_start|>user\nList some people (batch row {r}) as JSON.<|im_end|>\n<|im_start|>assistant\n"
        );
        e.add_request(
            format!("bench-{constrained}-{r}"),
            PromptInput::Text(prompt),
            params.clone(),
            None,
        )
        .expect("add_request");
    }
    let mut started = std::collections::HashSet::new();
    while started.len() < rows {
        for o in e.step().expect("step") {
            if !o.new_token_ids.is_empty() {
                started.insert(o.request_id);
            }
        }
    }
}

fn timed_step(e: &mut LLMEngine, rows: usize) -> Duration {
    let t0 = Instant::now();
    let outs = e.step().expect("step");
    let t = t0.elapsed();
    assert_eq!(outs.len(), rows, "every row decodes every step");
    t
}

fn median<T: Copy + PartialOrd>(v: &mut [T]) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("STEPS ROWS are numbers"))
        .collect();
    let steps = args.first().copied().unwrap_or(64);
    let rows = args.get(1).copied().unwrap_or(32);
    let engine = || {
        let mut config = EngineConfig::new(model_path());
        config.kv_cache_bytes = 512 << 20;
        config.max_num_seqs = config.max_num_seqs.max(rows);
        LLMEngine::new(config).expect("starting the engine")
    };
    // Two engines, one batch each, stepped alternately (F C, C F, ...): on a shared,
    // noisy machine only measurements taken this close together compare.
    let (mut free, mut cons) = (engine(), engine());
    start(&mut free, rows, steps, false);
    start(&mut cons, rows, steps, true);
    // Warm-up steps, unmeasured (lexer caches, buffers).
    for _ in 0..4 {
        timed_step(&mut free, rows);
        timed_step(&mut cons, rows);
    }
    let before = cons.core().mask_stats();
    let (mut f, mut c, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..steps {
        let (tf, tc) = if i % 2 == 0 {
            let tf = timed_step(&mut free, rows);
            (tf, timed_step(&mut cons, rows))
        } else {
            let tc = timed_step(&mut cons, rows);
            (timed_step(&mut free, rows), tc)
        };
        f.push(tf);
        c.push(tc);
        ratios.push(tc.as_secs_f64() / tf.as_secs_f64());
    }
    let m = cons.core().mask_stats();
    let (masks, compute, wait, apply) = (
        m.num_masks - before.num_masks,
        m.compute - before.compute,
        m.wait - before.wait,
        m.apply - before.apply,
    );
    let per_step = |d: Duration| ms(d) / steps as f64;
    let (mf, mc) = (median(&mut f), median(&mut c));
    let ratio = median(&mut ratios);
    println!("{rows} rows, {steps} decode steps each, free and constrained stepped alternately");
    println!("| free step (ms, median) | constrained step (ms, median) | paired ratio (median) | mask per row (us, worker) | mask work per step (ms, worker, overlapped) | wait for the worker per step (ms) | apply + advance per step (ms, engine thread) |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {:.2} | {:.2} | {ratio:.3} ({:+.1} %) | {:.1} | {:.3} | {:.4} | {:.3} |",
        ms(mf),
        ms(mc),
        (ratio - 1.0) * 100.0,
        compute.as_secs_f64() * 1e6 / masks.max(1) as f64,
        per_step(compute),
        per_step(wait),
        per_step(apply),
    );
    println!(
        "not hidden by the forward pass: {:.3} ms per step = {:.2} % of the free step",
        per_step(wait + apply),
        100.0 * per_step(wait + apply) / ms(mf)
    );
}
