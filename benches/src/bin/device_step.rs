//! The engine's forward step on a device, timed: decode steps at several batch sizes
//! (each sequence with a context already in the KV cache) and the prefill of one long
//! prompt chunked by the step budget, for a model file or a `config.json` with
//! `--load-format dummy` (random weights at real shapes, e.g. Llama-3-8B's).
//!
//! ```sh
//! cargo run --release -p pagoda-benches --bin device_step -- \
//!     --model tests/data/tiny-dummy --load-format dummy --device cpu
//! # on a GPU (feature cuda): the issue-13 figures at Llama-3-8B shapes
//! device_step --model tests/data/llama3-8b-shape --load-format dummy --device cuda:0
//! ```
//!
//! It builds the model as the engine does (`build_device_model` on a device, the CPU
//! `Llama` on `cpu`), the attention backends the selector picks and a KV cache sized
//! for the largest case, then drives `RunnerModel::forward_greedy` (or `forward` with
//! `--logits`) with batch descriptors built directly (no scheduler, no sampler);
//! decode steps replay CUDA graphs captured for the batch sizes unless
//! `--enforce-eager`, as in the engine. The cached context is the cache's zeros: attention reads it all the
//! same. On `cuda` it also measures the device's ceilings (copy bandwidth, cuBLAS
//! bf16 GEMM) and prints each case's share: bytes a step must stream (the linear
//! weights and the LM head, plus the KV context read) over the copy bandwidth, and its
//! matmul FLOPs (linear layers, LM head rows, attention) over the GEMM rate.

use pagoda_core::{
    AttentionBackend, BatchDescriptor, DType, Device, GraphLimits, KvCache, KvCacheSpec, StepBatch,
};
use pagoda_engine::engine_core::{build_device_model, device_compute_dtype, open_engine_device};
use pagoda_engine::runner_model::RunnerModel;
use pagoda_engine::{EngineConfig, StepPool};
use pagoda_models::{
    device_unsupported, merge_attention_configs, Llama, LlamaConfig, LoadFormat, WeightDtype,
};
use pagoda_selector::{select, BackendOverride};
use std::path::PathBuf;
use std::time::Instant;

// Inventory only sees linked crates: link every backend (and the device ops).
use pagoda_backends as _;

type BoxError = Box<dyn std::error::Error>;

const USAGE: &str = "\
device_step: times the engine's forward step on a device

usage: device_step [flags]
  --model PATH                 GGUF / HF directory, or with --load-format dummy a config.json
                               (or a directory holding one)      [tests/data/tiny-dummy]
  --load-format auto|dummy     [dummy]
  --device cpu|emu|cuda[:N]    [cpu]
  --dtype auto|bfloat16|float32  weights (device compute dtype: auto = bf16) [auto]
  --seed N                     dummy weights' seed               [0]
  --batch-sizes 1,32,128       decode batch sizes                [1,32,128]
  --context N                  tokens already cached per sequence [512]
  --prefill-tokens N           one prompt of N tokens (0: none)  [8192]
  --max-num-batched-tokens N   prefill chunk                     [8192]
  --warmup N                   untimed steps per case            [3]
  --steps N                    timed decode steps per case       [20]
  --prefill-reps N             timed prefills (after one warm-up) [2]
  --block-size N               KV block size                     [16]
  --attention-backend SPEC     NAME or decode=NAME,prefill=NAME  [automatic]
  --enforce-eager              no CUDA graphs (by default a device replays decode steps
                               from graphs captured for the batch sizes, as the engine)
  --logits                     copy every logits row to the host (by default greedy ids
                               come back, argmax on the device, as for temperature-0
                               requests in the engine)
";

/// The flags.
struct Args {
    model: PathBuf,
    load_format: LoadFormat,
    device: Device,
    dtype: WeightDtype,
    seed: u64,
    batch_sizes: Vec<usize>,
    context: usize,
    prefill_tokens: usize,
    max_num_batched_tokens: usize,
    warmup: usize,
    steps: usize,
    prefill_reps: usize,
    block_size: usize,
    attention_backend: Option<String>,
    enforce_eager: bool,
    logits: bool,
}

fn parse_num(flag: &str, v: &str) -> Result<usize, BoxError> {
    v.parse()
        .map_err(|_| format!("{flag} `{v}` is not a non-negative integer").into())
}

fn parse_args(argv: &[String]) -> Result<Option<Args>, BoxError> {
    let mut a = Args {
        model: PathBuf::from("tests/data/tiny-dummy"),
        load_format: LoadFormat::Dummy,
        device: Device::Cpu,
        dtype: WeightDtype::Native,
        seed: 0,
        batch_sizes: vec![1, 32, 128],
        context: 512,
        prefill_tokens: 8192,
        max_num_batched_tokens: 8192,
        warmup: 3,
        steps: 20,
        prefill_reps: 2,
        block_size: 16,
        attention_backend: None,
        enforce_eager: false,
        logits: false,
    };
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--help" | "-h" => return Ok(None),
            "--enforce-eager" => {
                a.enforce_eager = true;
                continue;
            }
            "--logits" => {
                a.logits = true;
                continue;
            }
            _ => {}
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n\n{USAGE}"))?;
        match flag.as_str() {
            "--model" => a.model = PathBuf::from(v),
            "--load-format" => a.load_format = v.parse()?,
            "--device" => a.device = v.parse()?,
            "--dtype" => {
                a.dtype = match v.to_ascii_lowercase().as_str() {
                    "auto" => WeightDtype::Native,
                    "bf16" | "bfloat16" => WeightDtype::Bf16,
                    "f32" | "float32" | "float" => WeightDtype::F32,
                    _ => {
                        return Err(
                            format!("--dtype `{v}`: valid values: auto, bfloat16, float32").into(),
                        )
                    }
                }
            }
            "--seed" => a.seed = parse_num(flag, v)? as u64,
            "--batch-sizes" => {
                a.batch_sizes = v
                    .split(',')
                    .map(|b| parse_num(flag, b.trim()))
                    .collect::<Result<_, _>>()?
            }
            "--context" => a.context = parse_num(flag, v)?,
            "--prefill-tokens" => a.prefill_tokens = parse_num(flag, v)?,
            "--max-num-batched-tokens" => a.max_num_batched_tokens = parse_num(flag, v)?,
            "--warmup" => a.warmup = parse_num(flag, v)?,
            "--steps" => a.steps = parse_num(flag, v)?,
            "--prefill-reps" => a.prefill_reps = parse_num(flag, v)?,
            "--block-size" => a.block_size = parse_num(flag, v)?,
            "--attention-backend" => a.attention_backend = Some(v.clone()),
            other => return Err(format!("unknown flag `{other}`\n\n{USAGE}").into()),
        }
    }
    if a.batch_sizes.contains(&0) || a.steps == 0 || a.block_size == 0 {
        return Err("--batch-sizes, --steps and --block-size must be positive".into());
    }
    if a.max_num_batched_tokens == 0 {
        return Err("--max-num-batched-tokens must be positive".into());
    }
    Ok(Some(a))
}

/// One measured case, and what a step of it must move and compute.
struct Row {
    case: String,
    tokens_per_step: usize,
    secs_per_step: f64,
    /// Tokens produced (decode) or consumed (prefill) per second.
    tok_s: f64,
    stream_bytes: f64,
    flops: f64,
    /// Process CPU time over wall time while the case ran (how many cores it kept busy).
    cores: f64,
}

/// This process's CPU time so far (user + system), from `/proc/self/stat`; 0 where
/// there is no procfs.
fn cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): utime and stime are
    // the 12th and 13th, in clock ticks (100 a second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum::<f64>() / 100.0
}

/// Elements of the linear layers a token goes through (all layers), and of the LM head.
fn linear_elems(c: &LlamaConfig) -> (f64, f64) {
    let (h, hd) = (c.hidden_size as f64, c.head_dim as f64);
    let (q, kv) = (c.num_heads as f64 * hd, c.num_kv_heads as f64 * hd);
    let per_layer = (q + 2.0 * kv) * h + h * q + 3.0 * c.intermediate_size as f64 * h;
    (c.num_layers as f64 * per_layer, c.vocab_size as f64 * h)
}

/// Attention FLOPs (QKᵀ and PV) of a query attending to `keys` keys, all layers.
fn attn_flops(c: &LlamaConfig, keys: f64) -> f64 {
    4.0 * c.num_layers as f64 * c.num_heads as f64 * c.head_dim as f64 * keys
}

/// The model, its attention backends and its KV cache, ready to step.
struct Bench {
    model: RunnerModel,
    attn: Vec<Box<dyn AttentionBackend>>,
    kv: KvCache,
    config: LlamaConfig,
    block_size: usize,
    /// Copy logits rows (else greedy ids on a device).
    logits: bool,
    out: Vec<f32>,
    ids: Vec<u32>,
    /// The engine's step pool: steps run on it as `EngineCore::step`'s do.
    pool: StepPool,
}

impl Bench {
    /// One forward step over `query_lens`/`seq_lens` (decode rows first), the
    /// sequences' blocks laid out one after another from block 1.
    fn step(
        &mut self,
        query_lens: &[usize],
        seq_lens: &[usize],
        blocks_per_seq: usize,
        logits_rows: &[usize],
    ) -> Result<(), BoxError> {
        let table: Vec<Vec<u32>> = (0..query_lens.len())
            .map(|r| {
                let first = 1 + r * blocks_per_seq;
                (first as u32..(first + blocks_per_seq) as u32).collect()
            })
            .collect();
        let rows: Vec<&[u32]> = table.iter().map(Vec::as_slice).collect();
        let batch = BatchDescriptor::new(self.block_size, query_lens, seq_lens, &rows)?;
        let vocab = self.config.vocab_size as u32;
        let mut ids = Vec::with_capacity(batch.num_tokens());
        let mut positions = Vec::with_capacity(batch.num_tokens());
        for (&q, &s) in query_lens.iter().zip(seq_lens) {
            for p in s - q..s {
                positions.push(p as u32);
                // Arbitrary ids spread over the vocabulary.
                ids.push((p as u32).wrapping_mul(2_654_435_761) % vocab);
            }
        }
        let Self {
            model,
            attn,
            kv,
            logits,
            out,
            ids: greedy,
            pool,
            ..
        } = self;
        let step = StepBatch {
            input_ids: &ids,
            positions: &positions,
            batch: &batch,
            logits_rows,
        };
        pool.install(|| {
            if *logits {
                model.forward(&step, attn, kv, out)
            } else {
                model
                    .forward_greedy(&step, attn, kv, out, greedy)
                    .map(|_| ())
            }
        })?;
        Ok(())
    }
}

fn build(args: &Args) -> Result<Bench, BoxError> {
    let runtime = open_engine_device(args.device)?;
    let t = Instant::now();
    let loaded = args.load_format.load(&args.model, args.seed)?;
    let config = loaded.config.clone();
    eprintln!(
        "device_step: {} loaded ({:?}) in {:.1} s",
        args.model.display(),
        args.load_format,
        t.elapsed().as_secs_f64()
    );
    let on_device = args.device != Device::Cpu;
    let compute = if on_device {
        if let Some(why) = device_unsupported(&config) {
            return Err(why.into());
        }
        device_compute_dtype(args.dtype)?
    } else {
        DType::F32
    };
    let bs = args.block_size;
    let max_batch = args.batch_sizes.iter().copied().max().unwrap_or(1);
    let decode_blocks = max_batch * (args.context + 1).div_ceil(bs);
    let prefill_blocks = args.prefill_tokens.div_ceil(bs);
    let mut attn_configs = config.attention_configs(bs);
    for c in &mut attn_configs {
        c.device = args.device;
        c.q_dtype = compute;
        c.kv_dtype = compute;
    }
    let merged = merge_attention_configs(&attn_configs);
    let over = BackendOverride::parse(args.attention_backend.as_deref().unwrap_or(""))?;
    let selection = select(&merged, &over)?;
    eprintln!("device_step: attention {selection}");
    let mut attn = attn_configs
        .iter()
        .map(|c| selection.build(c))
        .collect::<Result<Vec<_>, _>>()?;
    let spec = KvCacheSpec {
        num_layers: config.num_layers,
        num_blocks: 1 + decode_blocks.max(prefill_blocks),
        block_size: bs,
        num_kv_heads: config.num_kv_heads,
        head_dim: config.head_dim,
        dtype: compute,
    };
    let mut kv = KvCache::allocate(spec, runtime.as_ref())?;
    let t = Instant::now();
    let model = if on_device {
        let mut ec = EngineConfig::new(&args.model);
        ec.max_num_batched_tokens = args.max_num_batched_tokens.max(max_batch);
        ec.max_num_seqs = max_batch;
        let mut m = build_device_model(&ec, &runtime, config.clone(), loaded.weights, compute)?;
        if !args.enforce_eager {
            // As the engine: the decode batch sizes' graphs, for the longest context here.
            let max_len = (args.context + 1).max(args.prefill_tokens);
            let limits = GraphLimits {
                max_seq_len: max_len,
                max_num_reqs: max_batch,
                max_num_tokens: ec.max_num_batched_tokens,
                max_blocks_per_seq: max_len.div_ceil(bs),
            };
            let t = Instant::now();
            let sizes = m.capture_graphs(&mut attn, &mut kv, limits, &args.batch_sizes)?;
            eprintln!(
                "device_step: CUDA graphs for batch sizes {sizes:?} captured in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
        m
    } else {
        RunnerModel::host(Llama::new_with_dtype(
            config.clone(),
            loaded.weights,
            args.dtype,
        )?)
    };
    eprintln!(
        "device_step: model on {} ({compute}) in {:.1} s; KV cache {} blocks",
        args.device,
        t.elapsed().as_secs_f64(),
        spec.num_blocks
    );
    Ok(Bench {
        model,
        attn,
        kv,
        config,
        block_size: bs,
        logits: args.logits,
        out: Vec::new(),
        ids: Vec::new(),
        pool: StepPool::new()?,
    })
}

fn decode_case(b: &mut Bench, args: &Args, batch: usize) -> Result<Row, BoxError> {
    let bps = (args.context + 1).div_ceil(args.block_size);
    let q = vec![1; batch];
    let s = vec![args.context + 1; batch];
    let rows: Vec<usize> = (0..batch).collect();
    for _ in 0..args.warmup {
        b.step(&q, &s, bps, &rows)?;
    }
    let (t, cpu) = (Instant::now(), cpu_secs());
    for _ in 0..args.steps {
        b.step(&q, &s, bps, &rows)?;
    }
    let wall = t.elapsed().as_secs_f64();
    let cores = (cpu_secs() - cpu) / wall;
    let secs = wall / args.steps as f64;
    let c = &b.config;
    let (lin, head) = linear_elems(c);
    let elem = if args.device == Device::Cpu { 4.0 } else { 2.0 };
    let kv_token = 2.0 * (c.num_layers * c.num_kv_heads * c.head_dim) as f64 * elem;
    let keys = (args.context + 1) as f64;
    Ok(Row {
        case: format!("decode b{batch} ctx{}", args.context),
        tokens_per_step: batch,
        secs_per_step: secs,
        tok_s: batch as f64 / secs,
        stream_bytes: (lin + head) * elem + batch as f64 * keys * kv_token,
        flops: batch as f64 * (2.0 * (lin + head) + attn_flops(c, keys)),
        cores,
    })
}

fn prefill_case(b: &mut Bench, args: &Args) -> Result<Row, BoxError> {
    let (p, m) = (args.prefill_tokens, args.max_num_batched_tokens);
    let bps = p.div_ceil(args.block_size);
    let run = |b: &mut Bench| -> Result<usize, BoxError> {
        let (mut done, mut steps) = (0, 0);
        while done < p {
            let q = m.min(p - done);
            // Logits only for the last prompt token, as the engine asks.
            let last = [q - 1];
            let rows: &[usize] = if done + q == p { &last } else { &[] };
            b.step(&[q], &[done + q], bps, rows)?;
            done += q;
            steps += 1;
        }
        Ok(steps)
    };
    if args.warmup > 0 {
        run(&mut *b)?;
    }
    let (t, cpu) = (Instant::now(), cpu_secs());
    let mut steps = 0;
    for _ in 0..args.prefill_reps.max(1) {
        steps = run(&mut *b)?;
    }
    let wall = t.elapsed().as_secs_f64();
    let cores = (cpu_secs() - cpu) / wall;
    let secs = wall / args.prefill_reps.max(1) as f64;
    let c = &b.config;
    let (lin, head) = linear_elems(c);
    // Causal: token i attends to i + 1 keys.
    let keys = p as f64 * (p as f64 + 1.0) / 2.0;
    let steps = steps.max(1) as f64;
    Ok(Row {
        case: format!("prefill {p} (chunks of {m})"),
        tokens_per_step: p.div_ceil(steps as usize),
        secs_per_step: secs / steps,
        tok_s: p as f64 / secs,
        // Compute-bound: no bandwidth floor.
        stream_bytes: f64::NAN,
        // Per step (the average chunk), to compare with a step's time.
        flops: (2.0 * (lin * p as f64 + head) + attn_flops(c, keys)) / steps,
        cores,
    })
}

/// The device's ceilings: (copy bytes/s, read + write; GEMM FLOP/s), where measured.
fn ceilings(device: Device) -> Option<(f64, f64)> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(ordinal) = device {
        return match pagoda_benches::cuda_ceilings::for_ordinal(ordinal) {
            Ok(c) => Some((c.copy_bytes_per_s, c.gemm_flops)),
            Err(e) => {
                eprintln!("device_step: no ceilings: {e}");
                None
            }
        };
    }
    let _ = device;
    None
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}%", 100.0 * x)
    } else {
        "-".into()
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("device_step: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("device_step: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), BoxError> {
    let mut b = build(args)?;
    let mut rows = Vec::new();
    for &batch in &args.batch_sizes {
        rows.push(decode_case(&mut b, args, batch)?);
        eprintln!("device_step: {} done", rows[rows.len() - 1].case);
    }
    if args.prefill_tokens > 0 {
        rows.push(prefill_case(&mut b, args)?);
    }
    let ceil = ceilings(args.device);
    if let Some((bw, gemm)) = ceil {
        println!(
            "ceilings: copy {:.0} GB/s (read + write), GEMM {:.1} TFLOP/s",
            bw / 1e9,
            gemm / 1e12
        );
    }
    println!(
        "{:<30} {:>8} {:>10} {:>12} {:>10} {:>8} {:>6}",
        "case", "tok/step", "ms/step", "tok/s", "%BW floor", "%GEMM", "cores"
    );
    for r in &rows {
        let (bw, gemm) = ceil.map_or((f64::NAN, f64::NAN), |(bw, g)| {
            (
                r.stream_bytes / bw / r.secs_per_step,
                r.flops / r.secs_per_step / g,
            )
        });
        println!(
            "{:<30} {:>8} {:>10.3} {:>12.1} {:>10} {:>8} {:>6.2}",
            r.case,
            r.tokens_per_step,
            r.secs_per_step * 1e3,
            r.tok_s,
            pct(bw),
            pct(gemm),
            r.cores
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Option<Args>, BoxError> {
        parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn flags() {
        let a = args(&["--batch-sizes", "2,4", "--device", "emu", "--context", "8"])
            .unwrap()
            .unwrap();
        assert_eq!(a.batch_sizes, [2, 4]);
        assert_eq!(a.device, Device::Emu);
        assert_eq!(a.context, 8);
        assert!(args(&["--help"]).unwrap().is_none());
        for bad in [
            &["--batch-sizes", "0"][..],
            &["--steps", "x"],
            &["--load-format", "pt"],
            &["--bogus", "1"],
            &["--steps"],
        ] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tiny_model_steps_on_the_cpu() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tiny-dummy");
        let a = args(&[
            "--model",
            dir,
            "--batch-sizes",
            "1,3",
            "--context",
            "20",
            "--prefill-tokens",
            "40",
            "--max-num-batched-tokens",
            "16",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--prefill-reps",
            "1",
        ])
        .unwrap()
        .unwrap();
        let mut b = build(&a).unwrap();
        let d = decode_case(&mut b, &a, 3).unwrap();
        assert_eq!(d.tokens_per_step, 3);
        assert!(d.secs_per_step > 0.0 && d.stream_bytes > 0.0);
        // The CPU model hands back logits whatever the sampling.
        assert_eq!(b.out.len(), 3 * 256, "one logits row per decode row");
        let p = prefill_case(&mut b, &a).unwrap();
        assert_eq!(p.tokens_per_step, 14, "40 tokens in 3 chunks of at most 16");
        assert_eq!(b.out.len(), 256, "the last chunk asks for one row");
        assert!(b.out.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn tiny_model_replays_graphs_on_emu() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tiny-dummy");
        let a = args(&[
            "--model",
            dir,
            "--device",
            "emu",
            "--batch-sizes",
            "1,2",
            "--context",
            "20",
            "--prefill-tokens",
            "0",
            "--warmup",
            "1",
            "--steps",
            "2",
        ])
        .unwrap()
        .unwrap();
        let mut b = build(&a).unwrap();
        decode_case(&mut b, &a, 2).unwrap();
        assert_eq!(b.ids.len(), 2, "greedy ids, one per decode row");
        assert!(b.ids.iter().all(|&t| t < 256));
        let (buckets, replays) = b.model.graph_stats().expect("graphs on emu");
        assert_eq!(buckets, [1, 2]);
        assert_eq!(replays, 3, "warm-up and timed steps replay the b2 graph");
    }
}
