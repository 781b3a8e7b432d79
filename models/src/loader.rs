//! One entry point for loading a model: a GGUF file or a Hugging Face directory
//! becomes dense f32 [`LlamaWeights`], a [`LlamaConfig`], a [`Tokenizer`], the chat
//! template and the EOS ids.
//!
//! GGUF specifics live here (config from `<arch>.*` metadata for the architectures
//! llama.cpp writes: `llama` (also Mistral, and Mixtral with experts), `qwen2`,
//! `qwen3`, `gemma2`; tensor names; undoing llama.cpp's Q/K row permutation, which
//! its converter applies to `llama` only); HF directories are handled in [`crate::hf`].
//! What both share is in [`crate::loaded`] and [`crate::config`], so `hf` does not
//! import this module (no import cycle).

use crate::arch::{Activation, ArchConfig, Architecture, MoeConfig, SlidingLayers};
use crate::chat::ChatTemplate;
use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::gguf::{has_gguf_magic, GgufFile};
use crate::loaded::{display_name, LoadedModel, Progress};
use crate::tokenizer::Tokenizer;
use crate::weights::{
    ExpertWeights, LayerExtras, LayerWeights, LlamaWeights, Mat, MoeWeights, QuantBlocks,
};
use std::path::Path;

/// Loads a GGUF file or an HF model directory.
pub fn load_model(path: &Path) -> Result<LoadedModel, ModelError> {
    match classify(path)? {
        Format::Gguf => load_gguf(path),
        Format::HfDir => crate::hf::load_hf_dir(path),
    }
}

/// Reads only metadata: the config and display name, without touching the weights.
pub fn inspect_model(path: &Path) -> Result<(LlamaConfig, String), ModelError> {
    match classify(path)? {
        Format::Gguf => {
            let file = GgufFile::open(path)?;
            Ok((gguf_config(&file)?, display_name(path)))
        }
        Format::HfDir => Ok((crate::hf::read_config(path)?.0, display_name(path))),
    }
}

enum Format {
    Gguf,
    HfDir,
}

fn classify(path: &Path) -> Result<Format, ModelError> {
    if !path.exists() {
        return Err(ModelError::NotFound {
            path: path.to_path_buf(),
        });
    }
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(Format::HfDir);
        }
        return Err(ModelError::UnknownFormat {
            path: path.to_path_buf(),
            reason: "directory has no config.json".into(),
        });
    }
    if has_gguf_magic(path)? {
        Ok(Format::Gguf)
    } else {
        Err(ModelError::UnknownFormat {
            path: path.to_path_buf(),
            reason: "file does not start with the GGUF magic".into(),
        })
    }
}

/// llama.cpp's converter reorders each head's rows of Q and K from HF's rotate-half
/// pairing (`[2, head_dim/2]`) to adjacent pairing (`[head_dim/2, 2]`). This undoes it:
/// rows viewed as `[n_heads, head_dim/2, 2]` get their last two axes swapped.
pub fn unpermute_qk(m: &Mat, n_heads: usize) -> Result<Mat, ModelError> {
    reorder_rows(m, n_heads, |hd, r| {
        let (i, p) = (r / 2, r % 2); // GGUF row r within a head = 2i + p ...
        (p * (hd / 2) + i, r) // ... holds HF row p*half + i.
    })
}

/// The converter's permutation (HF -> GGUF order), the inverse of [`unpermute_qk`].
pub fn permute_qk(m: &Mat, n_heads: usize) -> Result<Mat, ModelError> {
    reorder_rows(m, n_heads, |hd, r| {
        let (i, p) = (r / 2, r % 2);
        (r, p * (hd / 2) + i)
    })
}

/// Copies rows within each head: `map(head_dim, r) = (dst_row, src_row)`.
fn reorder_rows(
    m: &Mat,
    n_heads: usize,
    map: impl Fn(usize, usize) -> (usize, usize),
) -> Result<Mat, ModelError> {
    if n_heads == 0 || !m.rows.is_multiple_of(n_heads) || !(m.rows / n_heads).is_multiple_of(2) {
        return Err(ModelError::TensorShape {
            name: format!("Q/K matrix with {n_heads} heads (rows must be n_heads * even head_dim)"),
            expected: vec![n_heads, m.cols],
            actual: vec![m.rows, m.cols],
        });
    }
    let hd = m.rows / n_heads;
    // Blocks-only matrices (`Mat::quantized`) have no f32 rows to move.
    let has_data = !m.data.is_empty();
    let mut out = vec![0f32; m.data.len()];
    // The GGUF blocks move with their rows (each row is whole blocks).
    let mut quant = m.quant.clone();
    for h in 0..n_heads {
        for r in 0..hd {
            let (dst, src) = map(hd, r);
            let (dst, src) = (h * hd + dst, h * hd + src);
            if has_data {
                out[dst * m.cols..(dst + 1) * m.cols]
                    .copy_from_slice(&m.data[src * m.cols..(src + 1) * m.cols]);
            }
            if let (Some(q), Some(from)) = (&mut quant, &m.quant) {
                let rb = from.bytes.len() / m.rows;
                q.bytes[dst * rb..(dst + 1) * rb]
                    .copy_from_slice(&from.bytes[src * rb..(src + 1) * rb]);
            }
        }
    }
    Ok(Mat {
        rows: m.rows,
        cols: m.cols,
        data: out,
        quant,
    })
}

fn meta_err(key: &str, reason: &str) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

/// The GGUF architectures we load (llama.cpp's names).
const GGUF_ARCHS: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma2"];

/// The model config from GGUF `<arch>.*` metadata.
pub fn gguf_config(f: &GgufFile) -> Result<LlamaConfig, ModelError> {
    let arch = f
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| meta_err("general.architecture", "missing"))?;
    if !GGUF_ARCHS.contains(&arch) {
        return Err(ModelError::UnsupportedArchitecture {
            arch: arch.to_string(),
        });
    }
    let key = |k: &str| format!("{arch}.{k}");
    let opt_u = |k: &str| -> Result<Option<usize>, ModelError> {
        match f.get(&key(k)) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| meta_err(&key(k), "not an integer")),
        }
    };
    let req_u = |k: &str| {
        opt_u(k)?
            .filter(|&x| x > 0)
            .ok_or_else(|| meta_err(&key(k), "missing or zero"))
    };
    let opt_f = |k: &str| -> Result<Option<f32>, ModelError> {
        match f.get(&key(k)) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| meta_err(&key(k), "not a number")),
        }
    };
    let hidden = req_u("embedding_length")?;
    let heads = req_u("attention.head_count")?;
    let kv_heads = opt_u("attention.head_count_kv")?.unwrap_or(heads);
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(meta_err(
            &key("attention.head_count_kv"),
            &format!("{kv_heads} does not divide {heads} heads"),
        ));
    }
    let head_dim = match opt_u("attention.key_length")? {
        Some(d) => d,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(meta_err(
                &key("embedding_length"),
                "not divisible by the head count",
            ))
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(meta_err(
            &key("attention.key_length"),
            &format!("head dim {head_dim} must be even"),
        ));
    }
    let vocab = match opt_u("vocab_size")? {
        Some(v) => v,
        None => f
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map(|a| a.len())
            .ok_or_else(|| {
                meta_err(
                    "tokenizer.ggml.tokens",
                    "missing (needed for the vocab size)",
                )
            })?,
    };
    // Our RoPE knows plain RoPE and per-frequency divisors (`rope_freqs.weight`, how
    // GGUF stores llama3 scaling); other scaling types (linear, yarn) are refused.
    if let Some(t) = f.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
        if t != "none" {
            return Err(meta_err(
                &key("rope.scaling.type"),
                &format!("rope scaling `{t}` is not supported"),
            ));
        }
    }
    if let Some(d) = opt_u("rope.dimension_count")? {
        if d != head_dim {
            return Err(meta_err(
                &key("rope.dimension_count"),
                &format!("partial RoPE ({d} of {head_dim} dims) is not supported"),
            ));
        }
    }
    // llama.cpp divides each RoPE frequency by this tensor's entry (`freq_factors`).
    let rope_freq_factors = match f.tensor("rope_freqs.weight") {
        None => None,
        Some(t) => {
            let half = head_dim / 2;
            if t.dims != [half as u64] {
                return Err(ModelError::TensorShape {
                    name: "rope_freqs.weight".into(),
                    expected: vec![half],
                    actual: t.dims.iter().map(|&d| d as usize).collect(),
                });
            }
            let v = f.dequantize(t)?;
            if !v.iter().all(|x| x.is_finite() && *x > 0.0) {
                return Err(meta_err(
                    "rope_freqs.weight",
                    "RoPE frequency factors must be finite and positive",
                ));
            }
            Some(v)
        }
    };
    LlamaConfig::check_bounds(LlamaConfig {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: req_u("feed_forward_length")?,
        num_layers: req_u("block_count")?,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        rms_norm_eps: opt_f("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| meta_err(&key("attention.layer_norm_rms_epsilon"), "missing"))?,
        rope_theta: opt_f("rope.freq_base")?.unwrap_or(10_000.0),
        rope_scaling: None,
        rope_freq_factors,
        max_position_embeddings: req_u("context_length")?,
        tie_word_embeddings: f.tensor("output.weight").is_none(),
        arch: gguf_arch(arch, &opt_u, &opt_f, head_dim)?,
    })
}

/// The family switches of GGUF architecture `arch` from its metadata.
fn gguf_arch(
    arch: &str,
    opt_u: &dyn Fn(&str) -> Result<Option<usize>, ModelError>,
    opt_f: &dyn Fn(&str) -> Result<Option<f32>, ModelError>,
    head_dim: usize,
) -> Result<ArchConfig, ModelError> {
    let window = opt_u("attention.sliding_window")?.filter(|&w| w > 0);
    let mut a = ArchConfig::default();
    match arch {
        "qwen2" => {
            a.architecture = Architecture::Qwen2;
            a.qkv_bias = true;
        }
        "qwen3" => {
            a.architecture = Architecture::Qwen3;
            a.qk_norm = true;
        }
        "gemma2" => {
            a.architecture = Architecture::Gemma2;
            a.sliding_window = window;
            a.sliding_layers = SlidingLayers::Even;
            a.attn_logit_softcap = opt_f("attn_logit_softcapping")?.filter(|&c| c > 0.0);
            a.final_logit_softcap = opt_f("final_logit_softcapping")?.filter(|&c| c > 0.0);
            // GGUF has no query_pre_attn_scalar; llama.cpp scales by the key length
            // (all Gemma 2 sizes but 27B, whose scalar is hidden / heads).
            a.query_pre_attn_scalar = Some(head_dim as f32);
            a.scale_embedding = true;
            a.post_norms = true;
            a.activation = Activation::GeluTanh;
        }
        // `llama`: Llama, Mistral (a sliding window, which llama.cpp's converter does
        // not write but `<arch>.attention.sliding_window` carries when present) and
        // Mixtral (experts).
        _ => {
            a.sliding_window = window;
            a.architecture = if window.is_some() {
                Architecture::Mistral
            } else {
                Architecture::Llama
            };
            if let Some(num_experts) = opt_u("expert_count")?.filter(|&e| e > 0) {
                let top_k = opt_u("expert_used_count")?
                    .filter(|&k| k > 0 && k <= num_experts)
                    .ok_or_else(|| {
                        meta_err("llama.expert_used_count", "missing or above expert_count")
                    })?;
                a.architecture = Architecture::Mixtral;
                a.moe = Some(MoeConfig { num_experts, top_k });
            }
        }
    }
    Ok(a)
}

/// `name`'s tensor info, its GGUF dims checked to equal `shape` (outermost first).
fn gguf_info<'f>(
    f: &'f GgufFile,
    name: &str,
    shape: &[usize],
) -> Result<&'f crate::gguf::GgufTensorInfo, ModelError> {
    let t = f.tensor(name).ok_or_else(|| ModelError::MissingTensor {
        name: name.to_string(),
    })?;
    let actual: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
    if actual != shape {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            expected: shape.to_vec(),
            actual,
        });
    }
    Ok(t)
}

/// Dequantizes `name`, checking its GGUF dims equal `shape` (outermost first).
fn gguf_tensor(
    f: &GgufFile,
    name: &str,
    shape: &[usize],
    progress: &mut Progress,
) -> Result<Vec<f32>, ModelError> {
    let t = gguf_info(f, name, shape)?;
    let data = f.dequantize(t)?;
    f.release(t);
    progress.tick();
    Ok(data)
}

/// A matrix: its blocks as stored when a quantized kernel runs their format (no
/// f32 copy, see [`Mat::quantized`]), else dequantized. Either way the file's
/// pages it read are handed back (`GgufFile::release`), so the mapped file never
/// adds to the resident memory beyond the tensor being read.
fn gguf_mat(
    f: &GgufFile,
    name: &str,
    rows: usize,
    cols: usize,
    p: &mut Progress,
) -> Result<Mat, ModelError> {
    let t = gguf_info(f, name, &[rows, cols])?;
    let format = crate::dequant::GgmlType::from_id(t.ggml_type).and_then(|g| g.quant_format());
    let Some(format) = format else {
        return Ok(Mat::new(
            rows,
            cols,
            gguf_tensor(f, name, &[rows, cols], p)?,
        ));
    };
    let bytes = f.tensor_data(t).to_vec();
    f.release(t);
    p.tick();
    Ok(Mat::quantized(rows, cols, QuantBlocks { format, bytes }))
}

/// Loads all weights of a GGUF Llama model into f32.
pub fn gguf_weights(f: &GgufFile, cfg: &LlamaConfig) -> Result<LlamaWeights, ModelError> {
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (q_out, kv_out) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let a = &cfg.arch;
    let total = 2 + 9 * cfg.num_layers + usize::from(!cfg.tie_word_embeddings);
    let mut p = Progress::new(total, f.path.display().to_string());
    let embed = gguf_mat(f, "token_embd.weight", cfg.vocab_size, h, &mut p)?;
    // llama.cpp permutes Q/K rows for the `llama` architecture only.
    let permuted = matches!(
        a.architecture,
        Architecture::Llama | Architecture::Mistral | Architecture::Mixtral
    );
    let qk = |m: Mat, heads: usize| {
        if permuted {
            unpermute_qk(&m, heads)
        } else {
            Ok(m)
        }
    };
    let mut layers = Vec::new();
    for i in 0..cfg.num_layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let vec = |name: &str, len: usize, p: &mut Progress| gguf_tensor(f, name, &[len], p);
        let mut extra = LayerExtras::default();
        if a.qkv_bias {
            let b = |s: &str| format!("blk.{i}.{s}.bias");
            extra.q_bias = Some(vec(&b("attn_q"), q_out, &mut p)?);
            extra.k_bias = Some(vec(&b("attn_k"), kv_out, &mut p)?);
            extra.v_bias = Some(vec(&b("attn_v"), kv_out, &mut p)?);
        }
        if a.qk_norm {
            extra.q_norm = Some(vec(&n("attn_q_norm"), cfg.head_dim, &mut p)?);
            extra.k_norm = Some(vec(&n("attn_k_norm"), cfg.head_dim, &mut p)?);
        }
        if a.post_norms {
            extra.post_attn_norm = Some(vec(&n("post_attention_norm"), h, &mut p)?);
            extra.post_ffn_norm = Some(vec(&n("post_ffw_norm"), h, &mut p)?);
        }
        let (w_gate, w_up, w_down) = match a.moe {
            None => (
                gguf_mat(f, &n("ffn_gate"), inter, h, &mut p)?,
                gguf_mat(f, &n("ffn_up"), inter, h, &mut p)?,
                gguf_mat(f, &n("ffn_down"), h, inter, &mut p)?,
            ),
            Some(moe) => {
                extra.moe = Some(gguf_moe(f, i, moe, h, inter, &mut p)?);
                (Mat::empty(), Mat::empty(), Mat::empty())
            }
        };
        layers.push(LayerWeights {
            attn_norm: vec(&n("attn_norm"), h, &mut p)?,
            wq: qk(gguf_mat(f, &n("attn_q"), q_out, h, &mut p)?, cfg.num_heads)?,
            wk: qk(
                gguf_mat(f, &n("attn_k"), kv_out, h, &mut p)?,
                cfg.num_kv_heads,
            )?,
            wv: gguf_mat(f, &n("attn_v"), kv_out, h, &mut p)?,
            wo: gguf_mat(f, &n("attn_output"), h, q_out, &mut p)?,
            ffn_norm: vec(&n("ffn_norm"), h, &mut p)?,
            w_gate,
            w_up,
            w_down,
            extra,
        });
    }
    let norm = gguf_tensor(f, "output_norm.weight", &[h], &mut p)?;
    let lm_head = match cfg.tie_word_embeddings {
        true => None,
        false => Some(gguf_mat(f, "output.weight", cfg.vocab_size, h, &mut p)?),
    };
    Ok(LlamaWeights {
        embed,
        layers,
        norm,
        lm_head,
    })
}

/// Layer `i`'s router and experts: llama.cpp stores each expert projection of a
/// layer as one 3-D tensor, `ffn_{gate,up,down}_exps` (`[experts, rows, cols]`).
fn gguf_moe(
    f: &GgufFile,
    i: usize,
    moe: MoeConfig,
    h: usize,
    inter: usize,
    p: &mut Progress,
) -> Result<MoeWeights, ModelError> {
    let e = moe.num_experts;
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let router = gguf_mat(f, &n("ffn_gate_inp"), e, h, p)?;
    let gate = gguf_tensor(f, &n("ffn_gate_exps"), &[e, inter, h], p)?;
    let up = gguf_tensor(f, &n("ffn_up_exps"), &[e, inter, h], p)?;
    let down = gguf_tensor(f, &n("ffn_down_exps"), &[e, h, inter], p)?;
    let part = |v: &[f32], k: usize, rows: usize, cols: usize| {
        Mat::new(
            rows,
            cols,
            v[k * rows * cols..(k + 1) * rows * cols].to_vec(),
        )
    };
    let experts = (0..e)
        .map(|k| ExpertWeights {
            w_gate: part(&gate, k, inter, h),
            w_up: part(&up, k, inter, h),
            w_down: part(&down, k, h, inter),
        })
        .collect();
    Ok(MoeWeights { router, experts })
}

/// EOS ids from GGUF metadata: EOS plus end-of-turn / end-of-message ids, deduplicated.
pub fn gguf_eos_ids(f: &GgufFile) -> Vec<u32> {
    let mut ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = f.get(key).and_then(|v| v.as_u64()) {
            if !ids.contains(&(id as u32)) {
                ids.push(id as u32);
            }
        }
    }
    ids
}

fn load_gguf(path: &Path) -> Result<LoadedModel, ModelError> {
    let start = std::time::Instant::now();
    let f = GgufFile::open(path)?;
    let config = gguf_config(&f)?;
    let tokenizer = Tokenizer::from_gguf(&f)?;
    if tokenizer.vocab_size() != config.vocab_size {
        return Err(meta_err(
            "tokenizer.ggml.tokens",
            &format!(
                "tokenizer has {} tokens, model vocab is {}",
                tokenizer.vocab_size(),
                config.vocab_size
            ),
        ));
    }
    let token_str = |key: &str| {
        f.get(key)
            .and_then(|v| v.as_u64())
            .and_then(|id| tokenizer.id_to_token(id as u32))
    };
    let chat_template = match f.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
        Some(src) => Some(ChatTemplate::new(
            src.to_string(),
            token_str("tokenizer.ggml.bos_token_id"),
            token_str("tokenizer.ggml.eos_token_id"),
        )?),
        None => None,
    };
    let eos_token_ids = gguf_eos_ids(&f);
    let weights = gguf_weights(&f, &config)?;
    tracing::info!("loaded {} in {:.1?}", path.display(), start.elapsed());
    Ok(LoadedModel {
        config,
        weights,
        tokenizer,
        chat_template,
        eos_token_ids,
        name: display_name(path),
    })
}
