//! One decoder layer as the forward pass holds it: projections fused and packed
//! ([`FusedLayer`]), built from a loader's [`LayerWeights`] after every shape is
//! checked against the config, including the family extras the config asks for
//! (a weight the config does not ask for is refused, so no tensor is silently
//! ignored).

use crate::arch::ArchConfig;
use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::linear::{Linear, WeightDtype};
use crate::moe::{check_moe, Expert, MoeMlp};
use crate::weights::{LayerExtras, LayerWeights, Mat};

/// The MLP of a layer.
#[derive(Debug, Clone)]
pub(crate) enum Mlp {
    Dense {
        /// `[2 * intermediate, hidden]`: rows of w_gate, then w_up.
        w_gate_up: Linear,
        /// `[hidden, intermediate]`
        w_down: Linear,
    },
    Moe(MoeMlp),
}

/// One decoder layer with fused projection matrices (row-major, `nn.Linear` layout).
#[derive(Debug, Clone)]
pub(crate) struct FusedLayer {
    pub(crate) attn_norm: Vec<f32>,
    /// `[(num_heads + 2 * num_kv_heads) * head_dim, hidden]`: rows of wq, then wk, then wv.
    pub(crate) wqkv: Linear,
    /// `[q | k | v]` bias of the fused projection (Qwen2).
    pub(crate) qkv_bias: Option<Vec<f32>>,
    /// Per-head norm weights of Q and K (Qwen3).
    pub(crate) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// `[hidden, num_heads * head_dim]`
    pub(crate) wo: Linear,
    /// Norm of the attention output before its residual add (Gemma 2).
    pub(crate) post_attn_norm: Option<Vec<f32>>,
    /// The MLP's input norm.
    pub(crate) ffn_norm: Vec<f32>,
    pub(crate) mlp: Mlp,
    /// Norm of the MLP output before its residual add (Gemma 2).
    pub(crate) post_ffn_norm: Option<Vec<f32>>,
}

pub(crate) fn check_mat(name: String, m: &Mat, rows: usize, cols: usize) -> Result<(), ModelError> {
    if !m.has_shape(rows, cols) {
        return Err(ModelError::TensorShape {
            name,
            expected: vec![rows, cols],
            actual: vec![m.rows, m.cols],
        });
    }
    Ok(())
}

pub(crate) fn check_vec(name: String, v: &[f32], len: usize) -> Result<(), ModelError> {
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
pub(crate) fn extra(
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

impl FusedLayer {
    /// Checks layer `i`'s weights against `c` and fuses and packs them.
    pub(crate) fn build(
        i: usize,
        l: LayerWeights,
        c: &LlamaConfig,
        dtype: WeightDtype,
    ) -> Result<Self, ModelError> {
        let (hidden, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_heads * hd, c.num_kv_heads * hd);
        let a: &ArchConfig = &c.arch;
        let n = |s: &str| format!("blk.{i}.{s}");
        let lin = |s: &str, parts: Vec<Mat>, k: usize, dtype: WeightDtype| {
            Linear::from_parts(&n(s), parts, k, dtype)
        };
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
                Some(q)
            }
            _ => None,
        };
        let q_norm = extra(n("attn_q_norm"), q_norm, hd, a.qk_norm)?;
        let k_norm = extra(n("attn_k_norm"), k_norm, hd, a.qk_norm)?;
        let post_attn_norm = extra(
            n("post_attention_norm"),
            post_attn_norm,
            hidden,
            a.post_norms,
        )?;
        let post_ffn_norm = extra(n("post_ffw_norm"), post_ffn_norm, hidden, a.post_norms)?;
        let mlp = match (a.moe, moe) {
            (None, None) => {
                check_mat(n("w_gate"), &l.w_gate, inter, hidden)?;
                check_mat(n("w_up"), &l.w_up, inter, hidden)?;
                check_mat(n("w_down"), &l.w_down, hidden, inter)?;
                Mlp::Dense {
                    w_gate_up: lin("w_gate_up", vec![l.w_gate, l.w_up], hidden, dtype)?,
                    w_down: lin("w_down", vec![l.w_down], inter, dtype)?,
                }
            }
            (Some(cfg), Some(w)) => {
                check_moe(&cfg, w.experts.len())?;
                check_mat(n("ffn_gate_inp"), &w.router, cfg.num_experts, hidden)?;
                let mut experts = Vec::with_capacity(w.experts.len());
                for (e, x) in w.experts.into_iter().enumerate() {
                    check_mat(n(&format!("ffn_gate.{e}")), &x.w_gate, inter, hidden)?;
                    check_mat(n(&format!("ffn_up.{e}")), &x.w_up, inter, hidden)?;
                    check_mat(n(&format!("ffn_down.{e}")), &x.w_down, hidden, inter)?;
                    experts.push(Expert {
                        w_gate_up: lin(
                            &format!("ffn_gate_up.{e}"),
                            vec![x.w_gate, x.w_up],
                            hidden,
                            dtype,
                        )?,
                        w_down: lin(&format!("ffn_down.{e}"), vec![x.w_down], inter, dtype)?,
                    });
                }
                Mlp::Moe(MoeMlp {
                    // The router stays f32: its scores pick the experts.
                    router: lin("ffn_gate_inp", vec![w.router], hidden, WeightDtype::F32)?,
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
        Ok(FusedLayer {
            attn_norm: l.attn_norm,
            wqkv: lin("wqkv", vec![l.wq, l.wk, l.wv], hidden, dtype)?,
            qkv_bias,
            qk_norm: q_norm.zip(k_norm),
            wo: lin("wo", vec![l.wo], q_dim, dtype)?,
            post_attn_norm,
            ffn_norm: l.ffn_norm,
            mlp,
            post_ffn_norm,
        })
    }
}
