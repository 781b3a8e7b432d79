//! `--load-format dummy` (vLLM's): random weights generated from a `config.json`,
//! no weight file read, for benchmarks and device checks at real model shapes.
//!
//! As vLLM's dummy init, every matrix and bias is uniform in `[-1e-3, 1e-3]`;
//! norm weights are 1.0 so activations keep a sane scale through the layers.
//! Each tensor has its own stream: element `i` of tensor `t` is a hash of
//! `(seed, t, i)`, so the weights depend on the seed only (not on the thread
//! count) and any one layer can be generated alone ([`dummy_layer`]), e.g. lazily
//! by a loader that uploads layer by layer. Generation runs in parallel (rayon).
//!
//! The tokenizer: `tokenizer.json` beside the config when there is one, otherwise
//! [`Tokenizer::ids_only`] (token-id prompts only; a text prompt is a clear error).

use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::hf::{ids_of, read_config_file};
use crate::loaded::{display_name, LoadedModel};
use crate::tokenizer::Tokenizer;
use crate::weights::{ExpertWeights, LayerExtras, LayerWeights, LlamaWeights, Mat, MoeWeights};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// Half-width of the uniform range of dummy weights (vLLM's `initialize_dummy_weights`).
pub const DUMMY_RANGE: f32 = 1e-3;

/// Elements per parallel task: large enough to amortise it, small enough to balance.
const CHUNK: usize = 1 << 16;

/// SplitMix64's finaliser: a bijective 64-bit mix with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of tensor `tensor` under `seed` (distinct tensors, distinct streams).
fn tensor_key(seed: u64, tensor: u64) -> u64 {
    mix(mix(seed ^ 0x5047_4441_4455_4d4d).wrapping_add(tensor))
}

/// Element `i` of the stream `key`, uniform in `[-DUMMY_RANGE, DUMMY_RANGE)`.
fn uniform(key: u64, i: u64) -> f32 {
    // Counter mode: the golden-ratio increment of SplitMix64, then its finaliser;
    // the top 24 bits give a uniform f32 in [0, 1) exactly.
    let bits = mix(key.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))) >> 40;
    let u = bits as f32 * (1.0 / (1u64 << 24) as f32);
    (2.0 * u - 1.0) * DUMMY_RANGE
}

/// `n` values of stream `key`, filled in parallel.
fn values(key: u64, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let base = (c * CHUNK) as u64;
        for (j, x) in out.iter_mut().enumerate() {
            *x = uniform(key, base + j as u64);
        }
    });
    v
}

/// Numbers the tensors of a model so each gets its own stream: the model-wide ones
/// below `LAYER_BASE`, then a block of `PER_LAYER` per layer.
const EMBED: u64 = 0;
const LM_HEAD: u64 = 1;
const LAYER_BASE: u64 = 16;
/// Room per layer: 16 dense tensors, then 3 per MoE expert.
const PER_LAYER: u64 = 1 << 20;

struct Gen {
    seed: u64,
    layer: usize,
}

impl Gen {
    fn key(&self, slot: u64) -> u64 {
        tensor_key(self.seed, LAYER_BASE + self.layer as u64 * PER_LAYER + slot)
    }
    fn mat(&self, slot: u64, rows: usize, cols: usize) -> Mat {
        Mat::new(rows, cols, values(self.key(slot), rows * cols))
    }
    fn vec(&self, slot: u64, n: usize) -> Vec<f32> {
        values(self.key(slot), n)
    }
}

/// Checks the products of the config's sizes (elements of the largest tensors)
/// fit, so generation never overflows or tries an absurd allocation silently.
fn check_sizes(c: &LlamaConfig) -> Result<(), ModelError> {
    let q = c.num_heads.checked_mul(c.head_dim);
    let big = [
        c.vocab_size.checked_mul(c.hidden_size),
        c.intermediate_size.checked_mul(c.hidden_size),
        q.and_then(|q| q.checked_mul(c.hidden_size)),
    ];
    if big
        .iter()
        .any(|x| x.is_none_or(|n| n > isize::MAX as usize / 4))
    {
        return Err(ModelError::Config {
            message: "the config's tensor sizes overflow".into(),
        });
    }
    Ok(())
}

/// The dummy weights of layer `layer` of `config` (the same values as that layer of
/// [`dummy_weights`] with the same seed).
pub fn dummy_layer(config: &LlamaConfig, seed: u64, layer: usize) -> LayerWeights {
    let c = config;
    let g = Gen { seed, layer };
    let (h, hd) = (c.hidden_size, c.head_dim);
    let (q_dim, kv_dim, inter) = (c.num_heads * hd, c.num_kv_heads * hd, c.intermediate_size);
    let a = &c.arch;
    let ones = |n: usize| vec![1.0f32; n];
    let moe = a.moe.as_ref().map(|m| MoeWeights {
        router: g.mat(10, m.num_experts, h),
        experts: (0..m.num_experts as u64)
            .map(|e| ExpertWeights {
                w_gate: g.mat(16 + 3 * e, inter, h),
                w_up: g.mat(17 + 3 * e, inter, h),
                w_down: g.mat(18 + 3 * e, h, inter),
            })
            .collect(),
    });
    // A MoE layer has empty dense MLP matrices (the experts replace them).
    let dense = |slot, rows, cols| {
        if moe.is_some() {
            Mat::empty()
        } else {
            g.mat(slot, rows, cols)
        }
    };
    LayerWeights {
        attn_norm: ones(h),
        wq: g.mat(0, q_dim, h),
        wk: g.mat(1, kv_dim, h),
        wv: g.mat(2, kv_dim, h),
        wo: g.mat(3, h, q_dim),
        ffn_norm: ones(h),
        w_gate: dense(4, inter, h),
        w_up: dense(5, inter, h),
        w_down: dense(6, h, inter),
        extra: LayerExtras {
            q_bias: a.qkv_bias.then(|| g.vec(7, q_dim)),
            k_bias: a.qkv_bias.then(|| g.vec(8, kv_dim)),
            v_bias: a.qkv_bias.then(|| g.vec(9, kv_dim)),
            q_norm: a.qk_norm.then(|| ones(hd)),
            k_norm: a.qk_norm.then(|| ones(hd)),
            post_attn_norm: a.post_norms.then(|| ones(h)),
            post_ffn_norm: a.post_norms.then(|| ones(h)),
            moe,
        },
    }
}

/// Random weights of `config`'s shapes (vLLM's dummy init), deterministic per `seed`.
/// Host f32: 4 bytes per parameter (32 GB for Llama-3-8B).
pub fn dummy_weights(config: &LlamaConfig, seed: u64) -> Result<LlamaWeights, ModelError> {
    check_sizes(config)?;
    let c = config;
    let (v, h) = (c.vocab_size, c.hidden_size);
    let embed = Mat::new(v, h, values(tensor_key(seed, EMBED), v * h));
    let lm_head =
        (!c.tie_word_embeddings).then(|| Mat::new(v, h, values(tensor_key(seed, LM_HEAD), v * h)));
    let layers = (0..c.num_layers).map(|l| dummy_layer(c, seed, l)).collect();
    Ok(LlamaWeights {
        embed,
        layers,
        norm: vec![1.0; h],
        lm_head,
    })
}

/// The `config.json` that `path` names: the file itself, or `config.json` in the
/// directory.
pub fn dummy_config_path(path: &Path) -> Result<PathBuf, ModelError> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if !file.is_file() {
        return Err(ModelError::NotFound { path: file });
    }
    Ok(file)
}

/// `--load-format dummy`: the model `path` (a `config.json`, or a directory holding
/// one) with [`dummy_weights`] of `seed`. The tokenizer is the directory's
/// `tokenizer.json` if it has one, else [`Tokenizer::ids_only`]; EOS ids come from
/// the config's `eos_token_id`. No chat template.
pub fn load_dummy(path: &Path, seed: u64) -> Result<LoadedModel, ModelError> {
    let start = std::time::Instant::now();
    let file = dummy_config_path(path)?;
    let dir = file.parent().unwrap_or(Path::new("."));
    let (config, json) = read_config_file(&file)?;
    let tok_file = dir.join("tokenizer.json");
    let bos = ids_of(json.get("bos_token_id")).first().copied();
    let tokenizer = if tok_file.is_file() {
        Tokenizer::from_file(&tok_file)?.with_bos(bos, false)
    } else {
        tracing::warn!(
            "--load-format dummy: no tokenizer.json beside {}: token-id prompts only \
             (text prompts are refused; outputs decode to [id] placeholders)",
            file.display()
        );
        Tokenizer::ids_only(config.vocab_size)?
    };
    let weights = dummy_weights(&config, seed)?;
    tracing::info!(
        "dummy weights (seed {seed}) for {} in {:.1?}",
        file.display(),
        start.elapsed()
    );
    Ok(LoadedModel {
        config,
        weights,
        tokenizer,
        chat_template: None,
        eos_token_ids: ids_of(json.get("eos_token_id")),
        name: display_name(if path.is_dir() { path } else { dir }),
    })
}

/// vLLM's `--load-format`, the values Pagoda implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadFormat {
    /// The model's own weights (GGUF file or HF directory).
    #[default]
    Auto,
    /// [`load_dummy`]: random weights from the config, no weight file read.
    Dummy,
}

impl LoadFormat {
    /// The values `--load-format` accepts.
    pub const VALID: &'static str = "auto, dummy";

    /// Loads `path` in this format (`seed` drives the dummy weights).
    pub fn load(self, path: &Path, seed: u64) -> Result<LoadedModel, ModelError> {
        match self {
            LoadFormat::Auto => crate::loader::load_model(path),
            LoadFormat::Dummy => load_dummy(path, seed),
        }
    }
}

impl std::str::FromStr for LoadFormat {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, ModelError> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(LoadFormat::Auto),
            "dummy" => Ok(LoadFormat::Dummy),
            other => Err(ModelError::Config {
                message: format!(
                    "--load-format `{other}` is not supported; valid values: {}",
                    LoadFormat::VALID
                ),
            }),
        }
    }
}
