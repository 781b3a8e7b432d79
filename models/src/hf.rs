//! Loading a Hugging Face model directory: `config.json`, one or sharded
//! `*.safetensors` (memory-mapped), `tokenizer.json`, `tokenizer_config.json` (chat
//! template, BOS) and `generation_config.json` (EOS ids). The family switches of
//! `config.json` are read in [`crate::hf_arch`]; the tensor names of each family
//! are here.

use crate::arch::Architecture;
use crate::chat::ChatTemplate;
use crate::config::{LlamaConfig, RopeScaling};
use crate::error::ModelError;
use crate::hf_arch::{arch_config, architecture_of};
use crate::loaded::{display_name, LoadedModel, Progress};
use crate::tokenizer::Tokenizer;
use crate::weights::{ExpertWeights, LayerExtras, LayerWeights, LlamaWeights, Mat, MoeWeights};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

fn cfg_err(message: String) -> ModelError {
    ModelError::Config { message }
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    serde_json::from_str(&text).map_err(|e| cfg_err(format!("{}: {e}", path.display())))
}

fn read_json_opt(path: &Path) -> Result<Option<Value>, ModelError> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// Token ids from a JSON int or list of ints.
pub(crate) fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// Parses `config.json` of a directory; also returns the raw JSON.
pub fn read_config(dir: &Path) -> Result<(LlamaConfig, Value), ModelError> {
    read_config_file(&dir.join("config.json"))
}

/// Parses an HF config file (any name: `--load-format dummy` takes one directly);
/// also returns the raw JSON.
pub fn read_config_file(file: &Path) -> Result<(LlamaConfig, Value), ModelError> {
    let j = read_json(file)?;
    let family = architecture_of(&j)?;
    let arch = arch_config(&j, family)?;
    let u = |k: &str| j.get(k).and_then(|v| v.as_u64()).map(|x| x as usize);
    let req = |k: &str| {
        u(k).filter(|&x| x > 0)
            .ok_or_else(|| cfg_err(format!("`{k}` missing or not a positive integer")))
    };
    let f = |k: &str| j.get(k).and_then(|v| v.as_f64()).map(|x| x as f32);
    let hidden = req("hidden_size")?;
    let heads = req("num_attention_heads")?;
    let kv_heads = u("num_key_value_heads").unwrap_or(heads);
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(cfg_err(format!(
            "num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}"
        )));
    }
    let head_dim = match u("head_dim") {
        Some(d) => d,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(cfg_err(
                "hidden_size not divisible by num_attention_heads and no head_dim".into(),
            ))
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(cfg_err(format!("head_dim {head_dim} must be even")));
    }
    // transformers 5 writes `rope_parameters` (theta and type together); older
    // configs `rope_theta` and `rope_scaling`.
    let rope_params = j.get("rope_parameters").filter(|v| v.is_object());
    let rope_theta = rope_params
        .and_then(|r| r.get("rope_theta"))
        .and_then(|v| v.as_f64())
        .map(|x| x as f32)
        .or_else(|| f("rope_theta"));
    let rope_scaling = match j.get("rope_scaling").or(rope_params) {
        None | Some(Value::Null) => None,
        Some(rs) => {
            let ty = rs
                .get("rope_type")
                .or_else(|| rs.get("type"))
                .and_then(|v| v.as_str())
                .unwrap_or("");
            match ty {
                "default" => None,
                "llama3" => {
                    let g = |k: &str| {
                        rs.get(k)
                            .and_then(|v| v.as_f64())
                            .ok_or_else(|| cfg_err(format!("rope_scaling.{k} missing")))
                    };
                    Some(RopeScaling {
                        factor: g("factor")? as f32,
                        low_freq_factor: g("low_freq_factor")? as f32,
                        high_freq_factor: g("high_freq_factor")? as f32,
                        original_max_position_embeddings: g("original_max_position_embeddings")?
                            as usize,
                    })
                }
                other => {
                    return Err(cfg_err(format!(
                        "rope_scaling type `{other}` is not supported (supported: llama3)"
                    )))
                }
            }
        }
    };
    let cfg = LlamaConfig::check_bounds(LlamaConfig {
        vocab_size: req("vocab_size")?,
        hidden_size: hidden,
        intermediate_size: req("intermediate_size")?,
        num_layers: req("num_hidden_layers")?,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        rms_norm_eps: f("rms_norm_eps").unwrap_or(1e-6),
        rope_theta: rope_theta.unwrap_or(10_000.0),
        rope_scaling,
        rope_freq_factors: None,
        max_position_embeddings: u("max_position_embeddings").unwrap_or(2048),
        tie_word_embeddings: j
            .get("tie_word_embeddings")
            .and_then(|v| v.as_bool())
            .unwrap_or(family == Architecture::Gemma2),
        arch,
    })?;
    Ok((cfg, j))
}

/// The safetensors files of a directory: from the index's weight map, else every
/// `*.safetensors` file, sorted.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let j = read_json(&index)?;
        let map = j
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| cfg_err(format!("{}: no weight_map", index.display())))?;
        let files: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::Io {
            path: dir.to_path_buf(),
            source: e,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::UnknownFormat {
            path: dir.to_path_buf(),
            reason: "no *.safetensors files".into(),
        });
    }
    Ok(files)
}

/// Memory-mapped shards with a name -> shard index.
struct Shards {
    maps: Vec<(PathBuf, Mmap)>,
    by_name: HashMap<String, usize>,
}

impl Shards {
    fn open(files: Vec<PathBuf>) -> Result<Self, ModelError> {
        let mut maps = Vec::new();
        let mut by_name = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(|e| ModelError::Io {
                path: path.clone(),
                source: e,
            })?;
            // SAFETY: read-only map; we assume the file is not truncated while loading.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::Io {
                path: path.clone(),
                source: e,
            })?;
            let st = SafeTensors::deserialize(&mmap).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                message: e.to_string(),
            })?;
            for name in st.names() {
                by_name.insert(name.to_string(), maps.len());
            }
            maps.push((path, mmap));
        }
        Ok(Shards { maps, by_name })
    }

    fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The tensor `name` as f32, checking its shape.
    fn get(&self, name: &str, shape: &[usize], p: &mut Progress) -> Result<Vec<f32>, ModelError> {
        let &i = self
            .by_name
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        let (path, mmap) = &self.maps[i];
        let st_err = |e: safetensors::SafeTensorError| ModelError::Safetensors {
            path: path.clone(),
            message: e.to_string(),
        };
        let st = SafeTensors::deserialize(mmap).map_err(st_err)?;
        let t = st.tensor(name).map_err(st_err)?;
        if t.shape() != shape {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: t.shape().to_vec(),
            });
        }
        let d = t.data();
        let out = match t.dtype() {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::UnsupportedTensorType {
                    tensor: name.to_string(),
                    ggml_type: format!("safetensors {other:?}"),
                })
            }
        };
        p.tick();
        Ok(out)
    }

    fn mat(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        p: &mut Progress,
    ) -> Result<Mat, ModelError> {
        Ok(Mat::new(rows, cols, self.get(name, &[rows, cols], p)?))
    }
}

fn hf_weights(dir: &Path, cfg: &LlamaConfig) -> Result<LlamaWeights, ModelError> {
    let s = Shards::open(shard_files(dir)?)?;
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (q_out, kv_out) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let has_head = s.has("lm_head.weight");
    if !has_head && !cfg.tie_word_embeddings {
        return Err(ModelError::MissingTensor {
            name: "lm_head.weight".into(),
        });
    }
    let per_layer = 9
        + 3 * usize::from(cfg.arch.qkv_bias)
        + 2 * usize::from(cfg.arch.qk_norm)
        + 2 * usize::from(cfg.arch.post_norms)
        + cfg.arch.moe.map_or(0, |m| 3 * m.num_experts - 2);
    let mut p = Progress::new(
        2 + per_layer * cfg.num_layers + usize::from(!cfg.tie_word_embeddings),
        dir.display().to_string(),
    );
    let embed = s.mat("model.embed_tokens.weight", cfg.vocab_size, h, &mut p)?;
    let a = &cfg.arch;
    let mut layers = Vec::new();
    for i in 0..cfg.num_layers {
        let n = |s: &str| format!("model.layers.{i}.{s}.weight");
        let bias = |proj: &str, len, p: &mut Progress| {
            let name = format!("model.layers.{i}.self_attn.{proj}.bias");
            a.qkv_bias.then(|| s_get(&s, &name, len, p)).transpose()
        };
        let mlp_in_norm = if a.post_norms {
            "pre_feedforward_layernorm"
        } else {
            "post_attention_layernorm"
        };
        let norm = |name: &str, len, p: &mut Progress| s_get(&s, &n(name), len, p);
        let mut extra = LayerExtras {
            q_bias: bias("q_proj", q_out, &mut p)?,
            k_bias: bias("k_proj", kv_out, &mut p)?,
            v_bias: bias("v_proj", kv_out, &mut p)?,
            ..LayerExtras::default()
        };
        if a.qk_norm {
            extra.q_norm = Some(norm("self_attn.q_norm", cfg.head_dim, &mut p)?);
            extra.k_norm = Some(norm("self_attn.k_norm", cfg.head_dim, &mut p)?);
        }
        if a.post_norms {
            extra.post_attn_norm = Some(norm("post_attention_layernorm", h, &mut p)?);
            extra.post_ffn_norm = Some(norm("post_feedforward_layernorm", h, &mut p)?);
        }
        let (w_gate, w_up, w_down) = match a.moe {
            None => (
                s.mat(&n("mlp.gate_proj"), inter, h, &mut p)?,
                s.mat(&n("mlp.up_proj"), inter, h, &mut p)?,
                s.mat(&n("mlp.down_proj"), h, inter, &mut p)?,
            ),
            Some(moe) => {
                let e = |k: usize, w: &str| n(&format!("block_sparse_moe.experts.{k}.{w}"));
                let experts = (0..moe.num_experts)
                    .map(|k| {
                        Ok(ExpertWeights {
                            w_gate: s.mat(&e(k, "w1"), inter, h, &mut p)?,
                            w_up: s.mat(&e(k, "w3"), inter, h, &mut p)?,
                            w_down: s.mat(&e(k, "w2"), h, inter, &mut p)?,
                        })
                    })
                    .collect::<Result<_, ModelError>>()?;
                let router = s.mat(&n("block_sparse_moe.gate"), moe.num_experts, h, &mut p)?;
                extra.moe = Some(MoeWeights { router, experts });
                (Mat::empty(), Mat::empty(), Mat::empty())
            }
        };
        layers.push(LayerWeights {
            attn_norm: norm("input_layernorm", h, &mut p)?,
            wq: s.mat(&n("self_attn.q_proj"), q_out, h, &mut p)?,
            wk: s.mat(&n("self_attn.k_proj"), kv_out, h, &mut p)?,
            wv: s.mat(&n("self_attn.v_proj"), kv_out, h, &mut p)?,
            wo: s.mat(&n("self_attn.o_proj"), h, q_out, &mut p)?,
            ffn_norm: norm(mlp_in_norm, h, &mut p)?,
            w_gate,
            w_up,
            w_down,
            extra,
        });
    }
    let norm = s_get(&s, "model.norm.weight", h, &mut p)?;
    // A tied checkpoint may still ship a copy of lm_head; the embedding is used then.
    let lm_head = match cfg.tie_word_embeddings {
        false => Some(s.mat("lm_head.weight", cfg.vocab_size, h, &mut p)?),
        true => None,
    };
    let mut w = LlamaWeights {
        embed,
        layers,
        norm,
        lm_head,
    };
    if a.post_norms {
        gemma_norms_plus_one(&mut w);
    }
    Ok(w)
}

/// A 1-D tensor of `len` elements.
fn s_get(s: &Shards, name: &str, len: usize, p: &mut Progress) -> Result<Vec<f32>, ModelError> {
    s.get(name, &[len], p)
}

/// Gemma's RMSNorm multiplies by `1 + w`; the decoder multiplies by its weight, so
/// HF weights get the 1 added here (GGUF files already carry `1 + w`: llama.cpp's
/// converter adds it).
fn gemma_norms_plus_one(w: &mut LlamaWeights) {
    let add = |v: &mut Vec<f32>| v.iter_mut().for_each(|x| *x += 1.0);
    add(&mut w.norm);
    for l in &mut w.layers {
        add(&mut l.attn_norm);
        add(&mut l.ffn_norm);
        for v in [&mut l.extra.post_attn_norm, &mut l.extra.post_ffn_norm]
            .into_iter()
            .flatten()
        {
            add(v);
        }
    }
}

/// A special-token string from `tokenizer_config.json` (plain string or AddedToken object).
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// Loads an HF Llama directory.
pub fn load_hf_dir(dir: &Path) -> Result<LoadedModel, ModelError> {
    let start = std::time::Instant::now();
    let (config, cfg_json) = read_config(dir)?;
    let tok_cfg = read_json_opt(&dir.join("tokenizer_config.json"))?;
    let gen_cfg = read_json_opt(&dir.join("generation_config.json"))?;
    let tok_cfg_get = |k: &str| tok_cfg.as_ref().and_then(|t| t.get(k));
    let mut tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let bos_str = token_string(tok_cfg_get("bos_token"));
    let eos_str = token_string(tok_cfg_get("eos_token"));
    let bos_id = bos_str
        .as_deref()
        .and_then(|s| tokenizer.token_to_id(s))
        .or_else(|| ids_of(cfg_json.get("bos_token_id")).first().copied());
    let add_bos = tok_cfg_get("add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    tokenizer = tokenizer.with_bos(bos_id, add_bos);
    // transformers 5 saves the template as its own file; older models keep it in
    // tokenizer_config.json.
    let jinja = dir.join("chat_template.jinja");
    let jinja = if jinja.is_file() {
        Some(Value::String(std::fs::read_to_string(&jinja).map_err(
            |e| ModelError::Io {
                path: jinja.clone(),
                source: e,
            },
        )?))
    } else {
        None
    };
    let chat_template = match jinja.as_ref().or(tok_cfg_get("chat_template")) {
        Some(Value::String(src)) => Some(ChatTemplate::new(src.clone(), bos_str, eos_str.clone())?),
        // The list form holds named templates; use the one called "default".
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template").and_then(|s| s.as_str()))
            .map(|src| ChatTemplate::new(src.to_string(), bos_str.clone(), eos_str.clone()))
            .transpose()?,
        _ => None,
    };
    let mut eos_token_ids = ids_of(gen_cfg.as_ref().and_then(|g| g.get("eos_token_id")));
    if eos_token_ids.is_empty() {
        eos_token_ids = ids_of(cfg_json.get("eos_token_id"));
    }
    if eos_token_ids.is_empty() {
        eos_token_ids.extend(eos_str.as_deref().and_then(|s| tokenizer.token_to_id(s)));
    }
    let weights = hf_weights(dir, &config)?;
    tracing::info!("loaded {} in {:.1?}", dir.display(), start.elapsed());
    Ok(LoadedModel {
        config,
        weights,
        tokenizer,
        chat_template,
        eos_token_ids,
        name: display_name(dir),
    })
}
