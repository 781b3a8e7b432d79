//! Every model family on the device forward (`DeviceLlama`, every op a kernel of
//! `cu/*.cu` on the `emu` device, GEMMs on the CPU), in f32, against transformers'
//! reference (the fixtures of `tests/data/families/`, see `families.rs`) and the CPU
//! decoder:
//!
//! * the model alone, from its HF directory and its GGUF: all prompts in one step,
//!   then decodes of all of them together; the last prompt token's logits and the last
//!   greedy step's within [`TOL`] of transformers' and of the CPU path's, every greedy
//!   token transformers', and every logits row the CPU's within [`CPU_TOL`];
//! * the engine on `emu` (scheduler, runner, chunked prefill, decode steps replayed
//!   from CUDA graphs): transformers' greedy ids and the CPU engine's.
//!
//! Tolerances: transformers' f32 logits against ours is the bound `families.rs` sets
//! (1e-4); between our two paths the difference is only the order of f32 sums (block
//! reductions, the attention kernels' accumulation), well under that: 5e-5.

use pagoda_core::{
    open_device, open_model_ops, AttentionBackend, BatchDescriptor, DType, Device, KvCache,
    KvCacheSpec, SamplingParams, StepBatch,
};
use pagoda_engine::{EngineConfig, LLMEngine, PromptInput};
use pagoda_models::{
    load_model, merge_attention_configs, DeviceLlama, DeviceOutput, DeviceRun, DeviceScratch,
    ForwardScratch, Llama, WeightDtype,
};
use pagoda_selector::{select, BackendOverride};
use serde::Deserialize;
use std::path::{Path, PathBuf};

// Inventory only sees linked crates: link every backend and the device kernels.
use pagoda_backends as _;

const FAMILIES: [&str; 5] = ["qwen2", "qwen3", "mistral", "gemma2", "mixtral"];
const BLOCK: usize = 4;
/// Our f32 logits against transformers'.
const TOL: f32 = 1e-4;
/// The device path's f32 logits against the CPU path's.
const CPU_TOL: f32 = 5e-5;

#[derive(Deserialize)]
struct Prompt {
    text: String,
    ids: Vec<u32>,
    last_logits: Vec<f32>,
    greedy: Vec<u32>,
    greedy_last_logits: Vec<f32>,
}

#[derive(Deserialize)]
struct Reference {
    prompts: Vec<Prompt>,
}

fn dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data/families")
        .join(family)
}

fn reference(family: &str) -> Reference {
    let p = dir(family).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn max_diff(got: &[f32], want: &[f32], what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: vocab");
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// One step of the batched schedule: rows `(request, first position, query length)`.
struct Step {
    ids: Vec<u32>,
    positions: Vec<u32>,
    batch: BatchDescriptor,
    /// Per request: its last row.
    logits_rows: Vec<usize>,
}

/// Step `s` of: every prompt at once (`s == 0`), then one decode row per request.
fn step(seqs: &[Vec<u32>], lens: &[usize], tables: &[Vec<u32>], s: usize) -> Step {
    let (mut ids, mut positions, mut qlens, mut slens, mut rows, mut last) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (r, seq) in seqs.iter().enumerate() {
        let (start, q) = if s == 0 {
            (0, lens[r])
        } else {
            (lens[r] + s - 1, 1)
        };
        ids.extend_from_slice(&seq[start..start + q]);
        positions.extend((start..start + q).map(|p| p as u32));
        last.push(ids.len() - 1);
        qlens.push(q);
        slens.push(start + q);
        rows.push(&tables[r][..(start + q).div_ceil(BLOCK)]);
    }
    Step {
        ids,
        positions,
        batch: BatchDescriptor::new(BLOCK, &qlens, &slens, &rows).unwrap(),
        logits_rows: last,
    }
}

/// The family from `path` on the device and on the CPU, step by step (see the module
/// docs); returns the largest logit difference to transformers' seen.
fn check_model(family: &str, path: &Path) -> f32 {
    let refs = reference(family);
    let what = format!("{family} {}", path.display());
    let m = load_model(path).unwrap_or_else(|e| panic!("{what}: {e}"));
    let cpu = Llama::new(m.config.clone(), m.weights.clone()).unwrap();
    let rt = open_device(Device::Emu).unwrap();
    let mut ops = open_model_ops(rt.clone()).unwrap();
    let model = DeviceLlama::new(m.config, m.weights, DType::F32, rt.as_ref(), |_, _| {})
        .unwrap_or_else(|e| panic!("{what}: on emu: {e}"));
    let c = model.config().clone();
    let mut cfgs = model.attention_configs(BLOCK);
    for a in &mut cfgs {
        a.device = Device::Emu;
        a.kv_dtype = DType::F32;
    }
    let sel = select(&merge_attention_configs(&cfgs), &BackendOverride::default()).unwrap();
    let mut attn: Vec<Box<dyn AttentionBackend>> =
        cfgs.iter().map(|a| sel.build(a).unwrap()).collect();
    let cpu_cfgs = cpu.attention_configs(BLOCK);
    let cpu_sel = select(
        &merge_attention_configs(&cpu_cfgs),
        &BackendOverride::default(),
    )
    .unwrap();
    let mut cpu_attn: Vec<Box<dyn AttentionBackend>> =
        cpu_cfgs.iter().map(|a| cpu_sel.build(a).unwrap()).collect();

    let seqs: Vec<Vec<u32>> = refs
        .prompts
        .iter()
        .map(|p| [&p.ids[..], &p.greedy[..p.greedy.len() - 1]].concat())
        .collect();
    let lens: Vec<usize> = refs.prompts.iter().map(|p| p.ids.len()).collect();
    let mut next = 0u32;
    let tables: Vec<Vec<u32>> = seqs
        .iter()
        .map(|s| {
            (0..s.len().div_ceil(BLOCK))
                .map(|_| {
                    next += 1;
                    next
                })
                .collect()
        })
        .collect();
    let spec = KvCacheSpec {
        num_layers: c.num_layers,
        num_blocks: next as usize + 1,
        block_size: BLOCK,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        dtype: DType::F32,
    };
    let mut kv = KvCache::allocate(spec, rt.as_ref()).unwrap();
    let mut cpu_kv = KvCache::filled(spec, f32::NAN);
    let tokens: usize = lens.iter().sum();
    let mut scratch = DeviceScratch::new(&rt, &c, DType::F32, tokens, seqs.len()).unwrap();
    let (mut cpu_scratch, mut cpu_logits, mut logits) =
        (ForwardScratch::default(), Vec::new(), Vec::new());
    let (v, mut worst) = (c.vocab_size, 0.0f32);
    for s in 0..refs.prompts[0].greedy.len() {
        let st = step(&seqs, &lens, &tables, s);
        for a in attn.iter_mut().chain(cpu_attn.iter_mut()) {
            a.plan(&st.batch).unwrap();
        }
        let out = DeviceOutput::Logits(&mut logits);
        let (ids, pos, rows) = (&st.ids, &st.positions, &st.logits_rows);
        model
            .forward_kinds(
                &StepBatch {
                    input_ids: ids,
                    positions: pos,
                    batch: &st.batch,
                    logits_rows: rows,
                },
                &mut DeviceRun {
                    ops: &mut *ops,
                    attn: &mut attn,
                    kv: &mut kv,
                    scratch: &mut scratch,
                },
                out,
            )
            .unwrap_or_else(|e| panic!("{what}: step {s}: {e}"));
        let step_batch = StepBatch {
            input_ids: ids,
            positions: pos,
            batch: &st.batch,
            logits_rows: rows,
        };
        cpu.forward_kinds(
            &step_batch,
            &mut cpu_attn,
            &mut cpu_kv,
            &mut cpu_logits,
            &mut cpu_scratch,
        )
        .unwrap();
        for (r, p) in refs.prompts.iter().enumerate() {
            let (row, cpu_row) = (&logits[r * v..(r + 1) * v], &cpu_logits[r * v..(r + 1) * v]);
            let at = format!("{what}: prompt {:?} step {s}", p.text);
            let d = max_diff(row, cpu_row, &at);
            assert!(
                d <= CPU_TOL,
                "{at}: {d} from the CPU path's logits (> {CPU_TOL})"
            );
            assert_eq!(argmax(row), p.greedy[s], "{at}: greedy token");
            assert_eq!(argmax(cpu_row), p.greedy[s], "{at}: the CPU's greedy token");
            let want = match s {
                0 => Some(&p.last_logits),
                _ if s + 1 == p.greedy.len() => Some(&p.greedy_last_logits),
                _ => None,
            };
            if let Some(want) = want {
                let d = max_diff(row, want, &at);
                assert!(d <= TOL, "{at}: {d} from transformers' logits (> {TOL})");
                worst = worst.max(d);
            }
        }
    }
    worst
}

fn check_family(family: &str) {
    for path in [dir(family), dir(family).join(format!("{family}.gguf"))] {
        let d = check_model(family, &path);
        eprintln!(
            "{family} {}: max |logit - transformers'| {d:.2e}",
            path.display()
        );
    }
}

#[test]
fn qwen2_on_emu_matches_transformers_and_the_cpu() {
    check_family("qwen2");
}

#[test]
fn qwen3_on_emu_matches_transformers_and_the_cpu() {
    check_family("qwen3");
}

#[test]
fn mistral_on_emu_matches_transformers_and_the_cpu() {
    check_family("mistral");
}

#[test]
fn gemma2_on_emu_matches_transformers_and_the_cpu() {
    check_family("gemma2");
}

#[test]
fn mixtral_on_emu_matches_transformers_and_the_cpu() {
    check_family("mixtral");
}

/// Each prompt's generated ids, and the engine's graph buckets and replays.
type EngineRun = (Vec<Vec<u32>>, Option<(Vec<usize>, usize)>);

fn engine_ids(family: &str, device: Device) -> EngineRun {
    let refs = reference(family);
    let mut c = EngineConfig::new(dir(family));
    c.device = device;
    c.weight_dtype = WeightDtype::F32;
    c.kv_cache_bytes = 8 << 20;
    c.block_size = BLOCK;
    c.max_num_batched_tokens = 16;
    c.max_num_seqs = 4;
    c.disable_log_stats = true;
    let mut engine = LLMEngine::new(c).unwrap_or_else(|e| panic!("{family} on {device}: {e}"));
    let prompts: Vec<PromptInput> = refs
        .prompts
        .iter()
        .map(|p| PromptInput::Text(p.text.clone()))
        .collect();
    // transformers generated past EOS (the fixtures are random models).
    let mut params = SamplingParams::greedy(refs.prompts[0].greedy.len());
    params.ignore_eos = true;
    let outs = engine.generate(&prompts, &params).unwrap();
    let stats = engine.core().graph_stats();
    (outs.into_iter().map(|o| o.token_ids).collect(), stats)
}

/// The engine on `emu` (f32, chunked prefill: 16 tokens a step; decode steps from CUDA
/// graphs) gives transformers' greedy ids and the CPU engine's, for every family.
#[test]
fn engine_on_emu_gives_transformers_and_cpu_greedy_ids() {
    for family in FAMILIES {
        let refs = reference(family);
        let (emu, graphs) = engine_ids(family, Device::Emu);
        let (cpu, _) = engine_ids(family, Device::Cpu);
        let (_, replays) = graphs.unwrap_or_else(|| panic!("{family}: no graphs on emu"));
        assert!(replays > 0, "{family}: no decode step replayed a graph");
        for ((p, e), c) in refs.prompts.iter().zip(&emu).zip(&cpu) {
            assert_eq!(e, &p.greedy, "{family}: emu vs transformers, {:?}", p.text);
            assert_eq!(e, c, "{family}: emu vs cpu, {:?}", p.text);
        }
    }
}
