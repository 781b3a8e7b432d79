//! CUDA graphs of decode steps, on the `emu` device, where a graph is the recording of
//! the step's launches (their parameter structs, pointers and scalars as captured) and
//! a replay runs them again. A replay is right only if every kernel reads the step's
//! values from the buffers at fixed addresses (ids, positions, slots, logits rows, the
//! attention metadata) and nothing of the step is baked into a launch: these tests
//! compare replayed steps with eager ones.
//!
//! * The engine with graphs and with `--enforce-eager` gives the same greedy ids, bit
//!   for bit, over a run with chunked prefills, mixed steps and decode batches of every
//!   size from 6 rows down to 1 (padded to the buckets 1, 2, 4, 8). The context limit
//!   is 256 tokens there, so both plan paged attention as one split: the same
//!   arithmetic, and any difference is a replay bug.
//! * With a 2048-token limit a graph plans `paged`'s split-KV for the longest context
//!   allowed (4 partitions on the emulator's 2 "SMs"), so short sequences have empty
//!   partitions; random decode batches over random caches must give the eager step's
//!   logits within the tolerance of a different split (f32 merge, bf16 outputs).

use pagoda_core::{
    open_device, open_model_ops, AttentionBackend, BatchDescriptor, DType, Device, GraphLimits,
    HostSliceMut, KvCache, KvCacheSpec, SamplingParams, StepBatch,
};
use pagoda_engine::{EngineConfig, LLMEngine, PromptInput};
use pagoda_models::{
    capture_sizes, load_dummy, DeviceLlama, DeviceOutput, DeviceRun, DeviceScratch, LoadFormat,
    WeightDtype,
};
use pagoda_selector::{select, BackendOverride};
use std::collections::HashMap;
use std::path::PathBuf;

// Inventory only sees linked crates: link every backend and the device kernels.
use pagoda_backends as _;

/// head_dim 64 (paged decode and flash prefill serve it in bf16), 2 layers, vocab 512.
fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/graph-dummy")
}

/// A deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn engine_config(enforce_eager: bool) -> EngineConfig {
    let mut c = EngineConfig::new(fixture());
    c.load_format = LoadFormat::Dummy;
    c.device = Device::Emu;
    c.weight_dtype = WeightDtype::Bf16;
    c.max_model_len = Some(256);
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 64;
    c.kv_cache_bytes = 8 << 20;
    c.enforce_eager = enforce_eager;
    c
}

/// Six requests of different prompt and output lengths, all submitted at once: the
/// decode batches shrink from 6 rows to 1 as they finish.
/// Each request's ids, and the engine's graph buckets and replays.
type Run = (HashMap<String, Vec<u32>>, Option<(Vec<usize>, usize)>);

fn run(enforce_eager: bool) -> Run {
    let mut e = LLMEngine::new(engine_config(enforce_eager)).expect("engine on emu");
    let mut rng = Rng(7);
    for (i, (prompt_len, max_tokens)) in [(9, 12), (70, 30), (3, 5), (130, 20), (40, 40), (17, 9)]
        .into_iter()
        .enumerate()
    {
        let ids: Vec<u32> = (0..prompt_len).map(|_| 3 + rng.below(500) as u32).collect();
        let mut p = SamplingParams::greedy(max_tokens);
        p.ignore_eos = true;
        e.add_request(format!("r{i}"), PromptInput::Tokens(ids), p, None)
            .expect("add request");
    }
    let mut out: HashMap<String, Vec<u32>> = HashMap::new();
    while e.has_unfinished_requests() {
        for o in e.step().expect("step") {
            out.entry(o.request_id.clone())
                .or_default()
                .extend_from_slice(&o.new_token_ids);
        }
    }
    assert_eq!(
        e.core().num_device_allocations(),
        Some(1),
        "no device buffer is allocated after start-up"
    );
    (out, e.core().graph_stats())
}

#[test]
fn graphs_replay_the_eager_steps_bit_for_bit() {
    let (eager, none) = run(true);
    assert_eq!(none, None, "--enforce-eager captures nothing");
    let (graphs, stats) = run(false);
    let (buckets, replays) = stats.expect("graphs captured on emu");
    assert_eq!(buckets, [1, 2, 4, 8]);
    // Decode-only steps: at least the 40-token request's tail, alone.
    assert!(replays >= 10, "only {replays} steps replayed a graph");
    assert_eq!(eager.len(), 6);
    for (id, ids) in &eager {
        assert_eq!(graphs.get(id), Some(ids), "request {id}: graphs vs eager");
    }
}

/// A device model with its kernels, backends, KV cache and buffers on `emu`.
struct Rig {
    model: DeviceLlama,
    ops: Box<dyn pagoda_core::ModelOps>,
    attn: Vec<Box<dyn AttentionBackend>>,
    kv: KvCache,
    scratch: DeviceScratch,
    vocab: usize,
}

impl Rig {
    /// The model and what a step runs on, borrowed apart.
    fn parts(&mut self) -> (&DeviceLlama, DeviceRun<'_, Box<dyn AttentionBackend>>) {
        let run = DeviceRun {
            ops: self.ops.as_mut(),
            attn: &mut self.attn,
            kv: &mut self.kv,
            scratch: &mut self.scratch,
        };
        (&self.model, run)
    }
}

const BLOCK: usize = 16;
const MAX_LEN: usize = 2048;

fn rig() -> Rig {
    let loaded = load_dummy(&fixture(), 0).expect("dummy weights");
    let rt = open_device(Device::Emu).expect("emu runtime");
    let ops = open_model_ops(rt.clone()).expect("emu kernels");
    let vocab = loaded.config.vocab_size;
    let model = DeviceLlama::new(
        loaded.config,
        loaded.weights,
        DType::BF16,
        rt.as_ref(),
        |_, _| {},
    )
    .expect("weights on emu");
    let mut cfgs = model.attention_configs(BLOCK);
    for c in &mut cfgs {
        c.device = Device::Emu;
        c.kv_dtype = DType::BF16;
    }
    let sel = select(&cfgs[0], &BackendOverride::default()).expect("a backend");
    assert_eq!(
        sel.decode.name, "cuda-paged",
        "the split-KV kernel is under test"
    );
    let attn = cfgs.iter().map(|c| sel.build(c).expect("build")).collect();
    let c = model.config();
    let spec = KvCacheSpec {
        num_layers: c.num_layers,
        num_blocks: 1 + 8 * MAX_LEN / BLOCK,
        block_size: BLOCK,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        dtype: DType::BF16,
    };
    let mut kv = KvCache::allocate(spec, rt.as_ref()).expect("KV cache");
    // Random keys and values: attention over long contexts without prefilling them.
    let mut rng = Rng(11);
    for l in &mut kv.layers {
        for pool in [&mut l.k, &mut l.v] {
            let Some(HostSliceMut::BF16(x)) = pool.view_mut().into_host_slice() else {
                panic!("a bf16 host pool on emu");
            };
            for v in x {
                *v = pagoda_core::bf16::from_f32(rng.below(2001) as f32 / 1000.0 - 1.0);
            }
        }
    }
    let scratch = DeviceScratch::new(&rt, model.config(), DType::BF16, 64, 64).expect("buffers");
    Rig {
        model,
        ops,
        attn,
        kv,
        scratch,
        vocab,
    }
}

/// Error allowed between a graph step and an eager one whose split plans differ,
/// relative to the largest logit: the partial outputs are merged in f32 in another
/// grouping, and the attention output is rounded to bf16 (relative 2^-9) before
/// o_proj; a stale input (ids, positions, block tables captured by value) moves the
/// logits by their own order of magnitude.
const SPLIT_TOL: f32 = 0.02;

#[test]
fn a_graph_planned_for_the_longest_context_matches_eager_steps() {
    let mut r = rig();
    let limits = GraphLimits {
        max_seq_len: MAX_LEN,
        max_num_reqs: 8,
        max_num_tokens: 64,
        max_blocks_per_seq: MAX_LEN / BLOCK,
    };
    let sizes = capture_sizes(8, 64);
    let (model, mut run) = r.parts();
    let mut g = model
        .capture_decode_graphs(&mut run, limits, &sizes, |_, _| {})
        .expect("capture");
    let mut rng = Rng(3);
    let num_blocks = r.kv.spec.num_blocks;
    let (mut eager, mut replayed) = (Vec::new(), Vec::new());
    // (rows, lengths): short = far under one partition (the graph's other partitions
    // are empty), mid = across the eager plan's partitions (which then differ from the
    // graph's: another merge grouping), max = the longest allowed (same plan both ways).
    let trials = [
        (1, "short"),
        (1, "mid"),
        (3, "mid"),
        (5, "short+mid"),
        (8, "all"),
        (2, "max"),
        (7, "mid"),
        (1, "short"),
    ];
    for (trial, &(n, kind)) in trials.iter().enumerate() {
        let seq_lens: Vec<usize> = (0..n)
            .map(|i| {
                let pick = match kind {
                    "short" => 0,
                    "mid" => 1,
                    "max" => 2,
                    "short+mid" => i % 2,
                    _ => i % 3,
                };
                match pick {
                    0 => 1 + rng.below(40),
                    1 => 300 + rng.below(400),
                    _ => MAX_LEN - rng.below(8),
                }
            })
            .collect();
        let rows: Vec<Vec<u32>> = seq_lens
            .iter()
            .map(|&s| {
                (0..s.div_ceil(BLOCK))
                    .map(|_| 1 + rng.below(num_blocks - 1) as u32)
                    .collect()
            })
            .collect();
        let row_refs: Vec<&[u32]> = rows.iter().map(|v| v.as_slice()).collect();
        let batch = BatchDescriptor::new(BLOCK, &vec![1; n], &seq_lens, &row_refs).unwrap();
        let ids: Vec<u32> = (0..n).map(|_| rng.below(r.vocab) as u32).collect();
        let positions: Vec<u32> = seq_lens.iter().map(|&s| s as u32 - 1).collect();
        let logits_rows: Vec<usize> = (0..n).collect();
        for a in &mut r.attn {
            a.plan(&batch).unwrap();
        }
        let step = StepBatch {
            input_ids: &ids,
            positions: &positions,
            batch: &batch,
            logits_rows: &logits_rows,
        };
        let (model, mut run) = r.parts();
        model
            .forward_kinds(&step, &mut run, DeviceOutput::Logits(&mut eager))
            .expect("eager step");
        let ran = model
            .forward_graph(&mut g, &step, &mut run, DeviceOutput::Logits(&mut replayed))
            .expect("graph step");
        assert!(
            ran,
            "trial {trial}: a decode step of {n} rows replays a graph"
        );
        assert_eq!(replayed.len(), n * r.vocab);
        let scale = eager.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let worst = eager
            .iter()
            .zip(&replayed)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!(
            "trial {trial} ({kind}): {n} rows, max |graph - eager| {worst:.2e}, logit scale \
             {scale:.2e}"
        );
        assert!(
            scale > 0.0 && worst <= SPLIT_TOL * scale,
            "trial {trial} ({n} rows, seq lens {seq_lens:?}): logits differ by {worst} \
             (scale {scale})"
        );
    }
    assert_eq!(g.num_replays(), trials.len());
    // A step the graphs do not take runs eagerly: a prefill row.
    let batch = BatchDescriptor::new(BLOCK, &[2], &[2], &[&[5]]).unwrap();
    let step = StepBatch {
        input_ids: &[1, 2],
        positions: &[0, 1],
        batch: &batch,
        logits_rows: &[1],
    };
    let (model, mut run) = r.parts();
    let ran = model
        .forward_graph(&mut g, &step, &mut run, DeviceOutput::Logits(&mut replayed))
        .unwrap();
    assert!(!ran, "prefill steps are not replayed");
}

/// A prefill step asking for every row's logits (prompt log-probabilities) with buffers
/// for 2 rows at a time: the LM head runs in chunks of 2, 2, 2, 1 and must give the
/// logits of one big chunk, bit for bit (the GEMM is batch-invariant); greedy ids are
/// their argmax.
#[test]
fn the_lm_head_runs_in_chunks_when_a_step_has_more_rows_than_its_buffers() {
    let mut r = rig();
    let rt = r.ops.runtime().clone();
    let mut small = DeviceScratch::new(&rt, r.model.config(), DType::BF16, 64, 2).unwrap();
    let n = 7;
    let batch = BatchDescriptor::new(BLOCK, &[n], &[n], &[&[3]]).unwrap();
    let ids: Vec<u32> = (0..n as u32).map(|i| 5 + 11 * i).collect();
    let positions: Vec<u32> = (0..n as u32).collect();
    let rows: Vec<usize> = (0..n).collect();
    let (mut big, mut chunked, mut greedy) = (Vec::new(), Vec::new(), Vec::new());
    let step = |r: &mut Rig, scratch: &mut DeviceScratch, out: DeviceOutput<'_>| {
        for a in &mut r.attn {
            a.plan(&batch).unwrap();
        }
        r.model
            .forward_kinds(
                &StepBatch {
                    input_ids: &ids,
                    positions: &positions,
                    batch: &batch,
                    logits_rows: &rows,
                },
                &mut DeviceRun {
                    ops: r.ops.as_mut(),
                    attn: &mut r.attn,
                    kv: &mut r.kv,
                    scratch,
                },
                out,
            )
            .unwrap();
    };
    let mut one = std::mem::replace(
        &mut r.scratch,
        DeviceScratch::new(&rt, r.model.config(), DType::BF16, 1, 1).unwrap(),
    );
    step(&mut r, &mut one, DeviceOutput::Logits(&mut big));
    step(&mut r, &mut small, DeviceOutput::Logits(&mut chunked));
    step(&mut r, &mut small, DeviceOutput::Greedy(&mut greedy));
    assert_eq!(big.len(), n * r.vocab);
    assert!(big == chunked, "chunked LM head differs");
    let want: Vec<u32> = big
        .chunks(r.vocab)
        .map(|row| {
            let mut best = 0;
            for (i, &x) in row.iter().enumerate() {
                if x > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect();
    assert_eq!(greedy, want);
    assert_eq!(small.num_allocations(), 1, "chunks, not a larger buffer");
}
