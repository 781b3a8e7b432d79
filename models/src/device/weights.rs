//! A layer's weights on the device: checked against the config exactly as the CPU
//! decoder checks them (`crate::layer`: a family extra the config does not ask for is
//! refused, so no tensor is silently ignored), then uploaded, the projections stacked
//! (`[wq; wk; wv]`, `[w_gate; w_up]`) so each is one GEMM.

use super::bufs::upload;
use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::layer::{check_mat, check_vec, extra};
use crate::moe::check_moe;
use crate::weights::{LayerWeights, Mat};
use pagoda_core::{DType, DeviceRuntime, Storage};

/// Rows of several matrices stacked (`[wq; wk; wv]`, `[w_gate; w_up]`) as one.
fn stack(rt: &dyn DeviceRuntime, dtype: DType, mats: &[&Mat]) -> Result<Storage, ModelError> {
    let cols = mats[0].cols;
    let rows: usize = mats.iter().map(|m| m.rows).sum();
    let mut data = Vec::with_capacity(rows * cols);
    for m in mats {
        data.extend_from_slice(&m.values()?);
    }
    upload(rt, dtype, &[rows, cols], &data)
}

/// One expert's (or a dense MLP's) projections.
pub(super) struct DeviceMlpWeights {
    /// `[2 inter, hidden]`
    pub(super) w_gate_up: Storage,
    /// `[hidden, inter]`
    pub(super) w_down: Storage,
}

/// A Mixtral-style sparse MLP on the device.
pub(super) struct DeviceMoe {
    /// `[experts, hidden]` in the compute dtype (its GEMM's output is f32: the scores
    /// that pick the experts).
    pub(super) router: Storage,
    pub(super) experts: Vec<DeviceMlpWeights>,
    pub(super) top_k: usize,
}

/// The MLP of a layer.
pub(super) enum DeviceMlp {
    Dense(DeviceMlpWeights),
    Moe(DeviceMoe),
}

/// One layer's weights on the device.
pub(super) struct DeviceLayer {
    pub(super) attn_norm: Storage,
    /// `[q + 2 kv, hidden]`
    pub(super) wqkv: Storage,
    /// `[q + 2 kv]` f32 (Qwen2).
    pub(super) qkv_bias: Option<Storage>,
    /// `[head_dim]` f32 each: Q's and K's per-head norms (Qwen3).
    pub(super) qk_norm: Option<(Storage, Storage)>,
    /// `[hidden, q]`
    pub(super) wo: Storage,
    /// `[hidden]` f32: o_proj's output norm before its residual add (Gemma 2).
    pub(super) post_attn_norm: Option<Storage>,
    pub(super) ffn_norm: Storage,
    pub(super) mlp: DeviceMlp,
    /// `[hidden]` f32: the MLP output's norm before its residual add (Gemma 2).
    pub(super) post_ffn_norm: Option<Storage>,
}

/// Uploads, adding each storage's bytes to a running count.
struct Uploader<'a> {
    rt: &'a dyn DeviceRuntime,
    dtype: DType,
    bytes: &'a mut usize,
}

impl Uploader<'_> {
    fn count(&mut self, s: Storage) -> Storage {
        *self.bytes += s.size_bytes();
        s
    }

    /// An f32 vector (norms, biases).
    fn vec(&mut self, v: &[f32]) -> Result<Storage, ModelError> {
        let s = upload(self.rt, DType::F32, &[v.len()], v)?;
        Ok(self.count(s))
    }

    /// Matrices stacked by rows, in the compute dtype.
    fn mats(&mut self, mats: &[&Mat]) -> Result<Storage, ModelError> {
        let s = stack(self.rt, self.dtype, mats)?;
        Ok(self.count(s))
    }

    fn opt_vec(&mut self, v: Option<Vec<f32>>) -> Result<Option<Storage>, ModelError> {
        v.map(|v| self.vec(&v)).transpose()
    }
}

impl DeviceLayer {
    /// Checks layer `i`'s weights against `c` and uploads them as `dtype` (norms and
    /// biases f32), adding their bytes to `bytes`.
    pub(super) fn upload(
        i: usize,
        l: &LayerWeights,
        c: &LlamaConfig,
        dtype: DType,
        rt: &dyn DeviceRuntime,
        bytes: &mut usize,
    ) -> Result<Self, ModelError> {
        let (hidden, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_heads * hd, c.num_kv_heads * hd);
        let a = &c.arch;
        let name = |w: &str| format!("blk.{i}.{w}");
        check_vec(name("attn_norm"), &l.attn_norm, hidden)?;
        check_vec(name("ffn_norm"), &l.ffn_norm, hidden)?;
        check_mat(name("attn_q"), &l.wq, q_dim, hidden)?;
        check_mat(name("attn_k"), &l.wk, kv_dim, hidden)?;
        check_mat(name("attn_v"), &l.wv, kv_dim, hidden)?;
        check_mat(name("attn_output"), &l.wo, hidden, q_dim)?;
        // The extras are small vectors: cloned for the CPU's checks (the MoE experts are
        // read in place).
        let e = &l.extra;
        let q_bias = extra(name("attn_q.bias"), e.q_bias.clone(), q_dim, a.qkv_bias)?;
        let k_bias = extra(name("attn_k.bias"), e.k_bias.clone(), kv_dim, a.qkv_bias)?;
        let v_bias = extra(name("attn_v.bias"), e.v_bias.clone(), kv_dim, a.qkv_bias)?;
        let q_norm = extra(name("attn_q_norm"), e.q_norm.clone(), hd, a.qk_norm)?;
        let k_norm = extra(name("attn_k_norm"), e.k_norm.clone(), hd, a.qk_norm)?;
        let post_attn = e.post_attn_norm.clone();
        let post_attn = extra(name("post_attention_norm"), post_attn, hidden, a.post_norms)?;
        let post_ffn = e.post_ffn_norm.clone();
        let post_ffn = extra(name("post_ffw_norm"), post_ffn, hidden, a.post_norms)?;
        let mut up = Uploader { rt, dtype, bytes };
        let qkv_bias = match (q_bias, k_bias, v_bias) {
            (Some(mut q), Some(k), Some(v)) => {
                q.extend_from_slice(&k);
                q.extend_from_slice(&v);
                Some(up.vec(&q)?)
            }
            _ => None,
        };
        let qk_norm = match (q_norm, k_norm) {
            (Some(q), Some(k)) => Some((up.vec(&q)?, up.vec(&k)?)),
            _ => None,
        };
        let mlp = match (a.moe, &e.moe) {
            (None, None) => {
                check_mat(name("ffn_gate"), &l.w_gate, inter, hidden)?;
                check_mat(name("ffn_up"), &l.w_up, inter, hidden)?;
                check_mat(name("ffn_down"), &l.w_down, hidden, inter)?;
                DeviceMlp::Dense(DeviceMlpWeights {
                    w_gate_up: up.mats(&[&l.w_gate, &l.w_up])?,
                    w_down: up.mats(&[&l.w_down])?,
                })
            }
            (Some(cfg), Some(w)) => {
                check_moe(&cfg, w.experts.len())?;
                check_mat(name("ffn_gate_inp"), &w.router, cfg.num_experts, hidden)?;
                let mut experts = Vec::with_capacity(w.experts.len());
                for (x, ex) in w.experts.iter().enumerate() {
                    check_mat(name(&format!("ffn_gate.{x}")), &ex.w_gate, inter, hidden)?;
                    check_mat(name(&format!("ffn_up.{x}")), &ex.w_up, inter, hidden)?;
                    check_mat(name(&format!("ffn_down.{x}")), &ex.w_down, hidden, inter)?;
                    experts.push(DeviceMlpWeights {
                        w_gate_up: up.mats(&[&ex.w_gate, &ex.w_up])?,
                        w_down: up.mats(&[&ex.w_down])?,
                    });
                }
                DeviceMlp::Moe(DeviceMoe {
                    router: up.mats(&[&w.router])?,
                    experts,
                    top_k: cfg.top_k,
                })
            }
            (Some(_), None) => {
                return Err(ModelError::MissingTensor {
                    name: name("ffn_gate_inp"),
                })
            }
            (None, Some(_)) => {
                return Err(ModelError::Config {
                    message: format!("layer {i} has MoE experts but the config has none"),
                })
            }
        };
        Ok(DeviceLayer {
            attn_norm: up.vec(&l.attn_norm)?,
            wqkv: up.mats(&[&l.wq, &l.wk, &l.wv])?,
            qkv_bias,
            qk_norm,
            wo: up.mats(&[&l.wo])?,
            post_attn_norm: up.opt_vec(post_attn)?,
            ffn_norm: up.vec(&l.ffn_norm)?,
            mlp,
            post_ffn_norm: up.opt_vec(post_ffn)?,
        })
    }
}
