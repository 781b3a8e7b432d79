//! A [`Decoder`] from a loader's weights, for any device: every shape is checked
//! against the config (a family extra the config does not ask for is refused, so no
//! tensor is silently ignored), the projections are stacked (`[wq; wk; wv]`,
//! `[w_gate; w_up]`) so each is one GEMM, and a [`Place`] puts each tensor where
//! its device keeps it (packed or quantized panels on the CPU, uploads on a device).

use super::{Decoder, Expert, Layer, Mlp, Moe, Weights};
use crate::arch::MoeConfig;
use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::weights::{LayerExtras, LayerWeights, LlamaWeights, Mat};
use pagoda_kernels::{Llama3Scaling, RopeCache};

/// How a device holds a decoder's tensors.
pub(crate) trait Place {
    type W: Weights;

    /// The rows of `parts` (each `[_, k]`) stacked into one matrix named `name`;
    /// `router`: an MoE router, whose scores pick the experts.
    fn mat(
        &mut self,
        name: &str,
        parts: Vec<Mat>,
        k: usize,
        router: bool,
    ) -> Result<<Self::W as Weights>::Mat, ModelError>;

    /// A norm weight or a bias.
    fn vec(&mut self, v: Vec<f32>) -> Result<<Self::W as Weights>::Vec, ModelError>;

    /// The embedding table `[vocab, hidden]` and the LM head, `None` when tied to the
    /// embedding.
    #[allow(clippy::type_complexity)]
    fn embed_and_head(
        &mut self,
        embed: Mat,
        lm_head: Option<Mat>,
        hidden: usize,
    ) -> Result<
        (
            <Self::W as Weights>::Embed,
            Option<<Self::W as Weights>::Mat>,
        ),
        ModelError,
    >;

    /// The RoPE tables.
    fn rope(&mut self, rope: RopeCache) -> Result<<Self::W as Weights>::Rope, ModelError>;

    /// Called after each layer with (layers done, layers).
    fn progress(&mut self, _done: usize, _total: usize) {}
}

fn config_err(message: String) -> ModelError {
    ModelError::Config { message }
}

/// Checks every weight shape against `config`, stacks the projections and places
/// every tensor with `place`.
pub(crate) fn build_decoder<P: Place>(
    config: LlamaConfig,
    weights: LlamaWeights,
    place: &mut P,
) -> Result<Decoder<P::W>, ModelError> {
    super::validate_config(&config)?;
    let c = &config;
    let hidden = c.hidden_size;
    check_mat("token_embd".into(), &weights.embed, c.vocab_size, hidden)?;
    if weights.layers.len() != c.num_layers {
        return Err(config_err(format!(
            "{} layers in weights, config says {}",
            weights.layers.len(),
            c.num_layers
        )));
    }
    check_vec("output_norm".into(), &weights.norm, hidden)?;
    if let Some(head) = &weights.lm_head {
        check_mat("lm_head".into(), head, c.vocab_size, hidden)?;
    }
    let mut layers = Vec::with_capacity(c.num_layers);
    for (i, l) in weights.layers.into_iter().enumerate() {
        layers.push(build_layer(i, l, c, place)?);
        place.progress(i + 1, c.num_layers);
    }
    let scaling = c.rope_scaling.map(|s| Llama3Scaling {
        factor: s.factor,
        low_freq_factor: s.low_freq_factor,
        high_freq_factor: s.high_freq_factor,
        original_max_position_embeddings: s.original_max_position_embeddings,
    });
    let rope = RopeCache::with_freq_factors(
        c.head_dim,
        c.max_position_embeddings,
        c.rope_theta,
        scaling.as_ref(),
        c.rope_freq_factors.as_deref(),
    )
    .map_err(|e| config_err(format!("rope: {e}")))?;
    let rope = place.rope(rope)?;
    let (embed, lm_head) = place.embed_and_head(weights.embed, weights.lm_head, hidden)?;
    let norm = place.vec(weights.norm)?;
    let (attn_kinds, kind_of_layer) = config.attention_kinds();
    let embed_scale = if config.arch.scale_embedding {
        // Gemma multiplies by sqrt(hidden) rounded to the activations' dtype.
        (hidden as f32).sqrt()
    } else {
        1.0
    };
    Ok(Decoder {
        config,
        attn_kinds,
        kind_of_layer,
        embed,
        layers,
        norm,
        lm_head,
        rope,
        embed_scale,
    })
}

/// Layer `i`'s weights checked against `c`, stacked and placed.
fn build_layer<P: Place>(
    i: usize,
    l: LayerWeights,
    c: &LlamaConfig,
    place: &mut P,
) -> Result<Layer<P::W>, ModelError> {
    let (hidden, hd) = (c.hidden_size, c.head_dim);
    let (q_dim, kv_dim) = (c.num_heads * hd, c.num_kv_heads * hd);
    let a = &c.arch;
    let n = |s: &str| format!("blk.{i}.{s}");
    check_vec(n("attn_norm"), &l.attn_norm, hidden)?;
    check_mat(n("wq"), &l.wq, q_dim, hidden)?;
    check_mat(n("wk"), &l.wk, kv_dim, hidden)?;
    check_mat(n("wv"), &l.wv, kv_dim, hidden)?;
    check_mat(n("wo"), &l.wo, hidden, q_dim)?;
    check_vec(n("ffn_norm"), &l.ffn_norm, hidden)?;
    let LayerExtras {
        q_bias,
        k_bias,
        v_bias,
        q_norm,
        k_norm,
        post_attn_norm,
        post_ffn_norm,
        moe,
    } = l.extra;
    let q_bias = extra(n("attn_q.bias"), q_bias, q_dim, a.qkv_bias)?;
    let k_bias = extra(n("attn_k.bias"), k_bias, kv_dim, a.qkv_bias)?;
    let v_bias = extra(n("attn_v.bias"), v_bias, kv_dim, a.qkv_bias)?;
    let qkv_bias = match (q_bias, k_bias, v_bias) {
        (Some(mut q), Some(k), Some(v)) => {
            q.extend_from_slice(&k);
            q.extend_from_slice(&v);
            Some(place.vec(q)?)
        }
        _ => None,
    };
    let q_norm = extra(n("attn_q_norm"), q_norm, hd, a.qk_norm)?;
    let k_norm = extra(n("attn_k_norm"), k_norm, hd, a.qk_norm)?;
    let qk_norm = match (q_norm, k_norm) {
        (Some(q), Some(k)) => Some((place.vec(q)?, place.vec(k)?)),
        _ => None,
    };
    let post_attn_norm = extra(
        n("post_attention_norm"),
        post_attn_norm,
        hidden,
        a.post_norms,
    )?;
    let post_ffn_norm = extra(n("post_ffw_norm"), post_ffn_norm, hidden, a.post_norms)?;
    let mlp = match (a.moe, moe) {
        (None, None) => Mlp::Dense(build_expert(
            place,
            c,
            &n(""),
            "",
            (l.w_gate, l.w_up, l.w_down),
        )?),
        (Some(cfg), Some(w)) => {
            check_moe(&cfg, w.experts.len())?;
            check_mat(n("ffn_gate_inp"), &w.router, cfg.num_experts, hidden)?;
            let mut experts = Vec::with_capacity(w.experts.len());
            for (e, x) in w.experts.into_iter().enumerate() {
                let suffix = format!(".{e}");
                experts.push(build_expert(
                    place,
                    c,
                    &n(""),
                    &suffix,
                    (x.w_gate, x.w_up, x.w_down),
                )?);
            }
            Mlp::Moe(Moe {
                router: place.mat(&n("ffn_gate_inp"), vec![w.router], hidden, true)?,
                experts,
                top_k: cfg.top_k,
            })
        }
        (Some(_), None) => {
            return Err(ModelError::MissingTensor {
                name: n("ffn_gate_inp"),
            })
        }
        (None, Some(_)) => {
            return Err(ModelError::Config {
                message: format!("layer {i} has MoE experts but the config has none"),
            })
        }
    };
    Ok(Layer {
        attn_norm: place.vec(l.attn_norm)?,
        wqkv: place.mat(&n("wqkv"), vec![l.wq, l.wk, l.wv], hidden, false)?,
        qkv_bias,
        qk_norm,
        wo: place.mat(&n("wo"), vec![l.wo], q_dim, false)?,
        post_attn_norm: post_attn_norm.map(|v| place.vec(v)).transpose()?,
        ffn_norm: place.vec(l.ffn_norm)?,
        mlp,
        post_ffn_norm: post_ffn_norm.map(|v| place.vec(v)).transpose()?,
    })
}

/// A dense MLP's (`suffix` empty) or expert `suffix`'s projections, checked and placed;
/// `prefix` is the layer's `blk.{i}.`.
fn build_expert<P: Place>(
    place: &mut P,
    c: &LlamaConfig,
    prefix: &str,
    suffix: &str,
    (gate, up, down): (Mat, Mat, Mat),
) -> Result<Expert<P::W>, ModelError> {
    let (hidden, inter) = (c.hidden_size, c.intermediate_size);
    // A dense layer's tensors are named as the CPU decoder always named them, an
    // expert's as the GGUF does.
    let (g, u, dn, gu) = if suffix.is_empty() {
        ("w_gate", "w_up", "w_down", "w_gate_up")
    } else {
        ("ffn_gate", "ffn_up", "ffn_down", "ffn_gate_up")
    };
    let name = |s: &str| format!("{prefix}{s}{suffix}");
    check_mat(name(g), &gate, inter, hidden)?;
    check_mat(name(u), &up, inter, hidden)?;
    check_mat(name(dn), &down, hidden, inter)?;
    Ok(Expert {
        w_gate_up: place.mat(&name(gu), vec![gate, up], hidden, false)?,
        w_down: place.mat(&name(dn), vec![down], inter, false)?,
    })
}

fn check_mat(name: String, m: &Mat, rows: usize, cols: usize) -> Result<(), ModelError> {
    if !m.has_shape(rows, cols) {
        return Err(ModelError::TensorShape {
            name,
            expected: vec![rows, cols],
            actual: vec![m.rows, m.cols],
        });
    }
    Ok(())
}

fn check_vec(name: String, v: &[f32], len: usize) -> Result<(), ModelError> {
    if v.len() != len {
        return Err(ModelError::TensorShape {
            name,
            expected: vec![len],
            actual: vec![v.len()],
        });
    }
    Ok(())
}

/// `v` checked to have `len` elements when `want`, refused when present but not
/// wanted (the config and the weights disagree), `None` when neither.
fn extra(
    name: String,
    v: Option<Vec<f32>>,
    len: usize,
    want: bool,
) -> Result<Option<Vec<f32>>, ModelError> {
    match (v, want) {
        (Some(v), true) => {
            check_vec(name, &v, len)?;
            Ok(Some(v))
        }
        (None, false) => Ok(None),
        (None, true) => Err(ModelError::MissingTensor { name }),
        (Some(_), false) => Err(ModelError::Config {
            message: format!("tensor `{name}` is present but the config does not use it"),
        }),
    }
}

/// Checks a MoE config against the experts loaded.
fn check_moe(cfg: &MoeConfig, n_experts: usize) -> Result<(), ModelError> {
    if cfg.num_experts == 0 || cfg.top_k == 0 || cfg.top_k > cfg.num_experts {
        return Err(ModelError::Config {
            message: format!(
                "MoE with {} experts and top {} is not valid",
                cfg.num_experts, cfg.top_k
            ),
        });
    }
    if n_experts != cfg.num_experts {
        return Err(ModelError::Config {
            message: format!(
                "{n_experts} experts in the weights, config says {}",
                cfg.num_experts
            ),
        });
    }
    Ok(())
}
