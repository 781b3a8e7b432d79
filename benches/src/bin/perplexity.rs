//! Quality of each weight dtype on a fixed text: perplexity, mean KL divergence
//! from the f32 path's next-token distributions, and top-1 agreement with it.
//!
//! ```sh
//! cargo run --release -p pagoda-benches --bin perplexity -- [--model GGUF] [--text FILE]
//!     [--ctx 512] [--dtypes f32,bf16,auto,q8_0] [--chunks N]
//! ```
//!
//! The text (default `tests/data/perplexity.txt`, public domain) is tokenized
//! whole (with BOS when the model's tokenizer adds one) and cut into chunks of
//! `--ctx` tokens; each chunk runs as one prefill and only the predictions of its
//! second half are scored (each with at least `ctx/2` tokens of context), the
//! method of llama.cpp's `llama-perplexity`, so its `[1]...` estimate on the same
//! GGUF, text and `-c` compares directly (see `scripts/bench/perplexity.sh`).
//! `auto` is `--dtype auto` (a GGUF's quantized blocks as stored), `q8_0` is
//! `--quantization q8_0`.

use pagoda_backends as _;
use pagoda_core::{
    registered_backends, AttentionConfig, BatchDescriptor, KvCache, KvCacheSpec, StepBatch,
};
use pagoda_kernels::log_softmax;
use pagoda_models::{load_model, ForwardScratch, Llama, WeightDtype};
use std::path::PathBuf;

struct Args {
    model: PathBuf,
    text: PathBuf,
    ctx: usize,
    dtypes: Vec<(String, WeightDtype)>,
    chunks: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut a = Args {
        model: PathBuf::from(home).join(".cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        text: repo.join("tests/data/perplexity.txt"),
        ctx: 512,
        dtypes: Vec::new(),
        chunks: None,
    };
    let mut dtypes = "f32,bf16,auto,q8_0".to_string();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = PathBuf::from(val()?),
            "--text" => a.text = PathBuf::from(val()?),
            "--ctx" => a.ctx = val()?.parse().map_err(|e| format!("--ctx: {e}"))?,
            "--chunks" => a.chunks = Some(val()?.parse().map_err(|e| format!("--chunks: {e}"))?),
            "--dtypes" => dtypes = val()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    for d in dtypes.split(',') {
        let dtype = match d {
            "f32" => WeightDtype::F32,
            "bf16" => WeightDtype::Bf16,
            "auto" => WeightDtype::Native,
            "q8_0" => WeightDtype::Q8_0,
            other => return Err(format!("unknown dtype {other} (f32, bf16, auto, q8_0)")),
        };
        a.dtypes.push((d.to_string(), dtype));
    }
    if a.ctx < 4 || !a.ctx.is_multiple_of(16) {
        return Err("--ctx must be a multiple of 16, at least 16".into());
    }
    Ok(a)
}

/// One dtype's model and its running sums.
struct Run {
    name: String,
    model: Llama,
    nll: f64,
    kl: f64,
    top1_agree: usize,
    summary: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let text = std::fs::read_to_string(&args.text)?;
    let loaded = load_model(&args.model)?;
    let tok = &loaded.tokenizer;
    let mut ids = tok.encode(&text, false)?;
    let bos = tok.bos_token_id().filter(|_| tok.add_bos());
    if let Some(b) = bos {
        ids.insert(0, b);
    }
    let ctx = args.ctx;
    let chunks = (ids.len() / ctx).min(args.chunks.unwrap_or(usize::MAX));
    if chunks == 0 {
        return Err(format!("{} tokens: fewer than one chunk of {ctx}", ids.len()).into());
    }
    let mut runs: Vec<Run> = Vec::new();
    for (name, dtype) in &args.dtypes {
        let model = Llama::new_with_dtype(loaded.config.clone(), loaded.weights.clone(), *dtype)?;
        let summary = model
            .weight_summary()
            .iter()
            .map(|(k, b)| format!("{k} {:.1} MiB", *b as f64 / (1 << 20) as f64))
            .collect::<Vec<_>>()
            .join(", ");
        runs.push(Run {
            name: name.clone(),
            model,
            nll: 0.0,
            kl: 0.0,
            top1_agree: 0,
            summary,
        });
    }
    let c = &loaded.config;
    let spec = KvCacheSpec {
        num_layers: c.num_layers,
        num_blocks: ctx / 16,
        block_size: 16,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        dtype: pagoda_core::DType::F32,
    };
    let cfg = AttentionConfig::cpu_f32(c.num_heads, c.num_kv_heads, c.head_dim, 16);
    let reg = registered_backends()
        .into_iter()
        .find(|r| r.name == "flash")
        .ok_or("the flash backend is not registered")?;
    let mut attn = (reg.create)(&cfg)?;
    let mut kv = KvCache::new(spec);
    let table: Vec<u32> = (0..spec.num_blocks as u32).collect();
    let first = ctx / 2;
    let rows: Vec<usize> = (first..ctx - 1).collect();
    let positions: Vec<u32> = (0..ctx as u32).collect();
    let batch = BatchDescriptor::new(16, &[ctx], &[ctx], &[&table[..]])?;
    let (mut scratch, mut logits) = (ForwardScratch::default(), Vec::new());
    let vocab = c.vocab_size;
    let mut scored = 0usize;
    let start = std::time::Instant::now();
    for chunk in 0..chunks {
        let mut toks = ids[chunk * ctx..(chunk + 1) * ctx].to_vec();
        if let Some(b) = bos {
            toks[0] = b; // as llama-perplexity: every chunk starts at BOS
        }
        let mut reference: Vec<f32> = Vec::new();
        for (ri, run) in runs.iter_mut().enumerate() {
            attn.plan(&batch)?;
            run.model.forward(
                &StepBatch {
                    input_ids: &toks,
                    positions: &positions,
                    batch: &batch,
                    logits_rows: &rows,
                },
                attn.as_mut(),
                &mut kv,
                &mut logits,
                &mut scratch,
            )?;
            for (i, row) in logits.chunks_exact_mut(vocab).enumerate() {
                log_softmax(row);
                let target = toks[rows[i] + 1] as usize;
                run.nll -= row[target] as f64;
                let top = pagoda_kernels::argmax(row).unwrap_or(0);
                if ri == 0 {
                    reference.extend_from_slice(row);
                    run.top1_agree += 1;
                    continue;
                }
                let r = &reference[i * vocab..(i + 1) * vocab];
                // KL(P_ref || P_run) = Σ p_ref (log p_ref - log p_run).
                run.kl += r
                    .iter()
                    .zip(row.iter())
                    .map(|(&a, &b)| (a as f64).exp() * (a as f64 - b as f64))
                    .sum::<f64>();
                if pagoda_kernels::argmax(r) == Some(top) {
                    run.top1_agree += 1;
                }
            }
        }
        scored += rows.len();
        let ppl: Vec<String> = runs
            .iter()
            .map(|r| format!("{} {:.4}", r.name, (r.nll / scored as f64).exp()))
            .collect();
        eprintln!("[{}/{chunks}] {}", chunk + 1, ppl.join(", "));
    }
    println!(
        "{} tokens of {}, {chunks} chunks of {ctx}, {scored} predictions scored (second half of each chunk), {:.1?}",
        ids.len(),
        args.text.display(),
        start.elapsed()
    );
    println!("KL and top-1 against `{}`.", runs[0].name);
    println!("| dtype | perplexity | mean KL (nats) | top-1 agreement | weights (kernel) |");
    println!("|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {:.4} | {:.5} | {:.2} % | {} |",
            r.name,
            (r.nll / scored as f64).exp(),
            r.kl / scored as f64,
            100.0 * r.top1_agree as f64 / scored as f64,
            r.summary
        );
    }
    Ok(())
}
