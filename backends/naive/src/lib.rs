//! The reference attention backend: exact, f64-accumulated, any shape.
//!
//! `naive` is the yardstick every other backend is tested against (see the
//! `pagoda-backend-testkit` crate), so it favours obviousness over speed: for every
//! query token and head it gathers the keys it may see through the block table,
//! computes max-subtracted softmax weights in `f64` and accumulates `V` in `f64`.
//!
//! Semantics (shared by every backend):
//! * query token `i` of request `r` sits at position `context_len(r) + i` and sees key
//!   positions `0..=context_len(r) + i` (causal with the context offset);
//! * query head `h` reads KV head `h / (num_heads / num_kv_heads)` (GQA);
//! * score `s = scale * q·k`, then `s = cap * tanh(s / cap)` with a logits soft-cap;
//! * with a sliding window `w`, only key positions `> query_pos - w` are seen;
//! * the optional LSE output is `ln(sum_j exp(s_j))` over the seen keys, `-inf` when
//!   no key is seen (then the output row is zero).

use pagoda_core::{
    no_runtime_reasons, AttentionBackend, AttentionConfig, BackendRegistration, BatchDescriptor,
    Capabilities, CoreError, DType, HostSlice, HostSliceMut, LayerIo, Role, TensorRef,
};

/// The registered name.
pub const NAME: &str = "naive";

/// What `naive` supports: CPU memory of any dtype (f32, f16, bf16, and fp8 E4M3 for
/// the KV cache: read widened to f64, so it is the oracle of the f16/bf16/fp8 backends
/// too), any head dim, block size and GQA ratio, both roles, sliding window, soft-cap
/// and LSE.
pub fn capabilities() -> Capabilities {
    Capabilities {
        q_dtypes: vec![DType::F32, DType::F16, DType::BF16],
        kv_dtypes: vec![DType::F32, DType::F16, DType::BF16, DType::F8E4M3],
        sliding_window: true,
        logits_soft_cap: true,
        ..Capabilities::cpu_f32()
    }
}

fn create(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Ok(Box::new(NaiveBackend::new(cfg)?))
}

pagoda_core::register_backend!(BackendRegistration {
    name: NAME,
    // Lowest useful priority: automatic selection picks it only when nothing faster fits.
    priority: 0,
    description: "exact f64-accumulated reference attention (slow, any shape)",
    capabilities,
    runtime_reasons: no_runtime_reasons,
    create,
});

/// The reference backend. See the crate docs for the exact semantics.
pub struct NaiveBackend {
    cfg: AttentionConfig,
    batch: BatchDescriptor,
    planned: bool,
    /// Scores of one query row, reused across rows (sized in `plan`).
    scores: Vec<f64>,
    acc: Vec<f64>,
}

impl NaiveBackend {
    /// Creates the backend; errors if the configuration is outside [`capabilities`]
    /// (or has zero heads, head dim or block size).
    pub fn new(cfg: &AttentionConfig) -> Result<Self, CoreError> {
        capabilities().require(NAME, cfg, Role::Both)?;
        if cfg.num_heads == 0 || cfg.head_dim == 0 || cfg.block_size == 0 {
            return Err(CoreError::BackendFailed {
                backend: NAME.into(),
                message: format!(
                    "degenerate config: {} heads, head dim {}, block size {}",
                    cfg.num_heads, cfg.head_dim, cfg.block_size
                ),
            });
        }
        Ok(NaiveBackend {
            cfg: cfg.clone(),
            batch: BatchDescriptor::default(),
            planned: false,
            scores: Vec::new(),
            acc: vec![0.0; cfg.head_dim],
        })
    }

    /// The configuration this backend was built for.
    pub fn config(&self) -> &AttentionConfig {
        &self.cfg
    }
}

impl AttentionBackend for NaiveBackend {
    fn name(&self) -> &str {
        NAME
    }

    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        self.planned = false;
        capabilities().check_batch(NAME, &self.cfg, batch)?;
        self.batch.clone_from(batch);
        self.scores.resize(batch.max_seq_len(), 0.0);
        self.planned = true;
        Ok(())
    }

    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        if !self.planned {
            return Err(CoreError::NotPlanned {
                backend: NAME.into(),
            });
        }
        let cfg = &self.cfg;
        let b = &self.batch;
        let (h, kvh, d, bs) = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.block_size,
        );
        io.validate_batch(b, cfg)?;
        fn host<'a>(t: TensorRef<'a>, name: &'static str) -> Result<HostSlice<'a>, CoreError> {
            t.host_slice().ok_or(CoreError::NotOnHost {
                name,
                device: t.device_of(),
            })
        }
        let q_all = host(io.q, "q")?;
        let k_all = host(io.k_cache, "k_cache")?;
        let v_all = host(io.v_cache, "v_cache")?;
        let mut out: HostSliceMut<'_> = io.out.into_host_slice().ok_or(CoreError::NotOnHost {
            name: "out",
            device: cfg.device,
        })?;
        let mut lse = io.lse.map(|l| l.into_f32("lse")).transpose()?;
        let group = h / kvh;
        let scale = cfg.scale as f64;
        let cap = cfg.logits_soft_cap.map(|c| c as f64);
        for r in 0..b.num_reqs() {
            let blocks = b.blocks(r);
            let ctx = b.context_len(r);
            let t0 = b.tokens(r).start;
            for i in 0..b.query_len(r) {
                let t = t0 + i;
                let pos = ctx + i;
                // Visible keys: [lo, pos]; a window of w keeps the last w positions.
                let lo = match cfg.sliding_window {
                    Some(w) => (pos + 1).saturating_sub(w),
                    None => 0,
                };
                for head in 0..h {
                    let kv_head = head / group;
                    let q0 = (t * h + head) * d;
                    let slot_off = |p: usize| {
                        let blk = blocks[p / bs] as usize;
                        ((blk * bs + p % bs) * kvh + kv_head) * d
                    };
                    let mut max = f64::NEG_INFINITY;
                    let n_keys = (pos + 1).saturating_sub(lo);
                    for (j, p) in (lo..=pos).enumerate() {
                        let k0 = slot_off(p);
                        let dot: f64 = (0..d)
                            .map(|e| q_all.at(q0 + e) as f64 * k_all.at(k0 + e) as f64)
                            .sum();
                        let mut s = dot * scale;
                        if let Some(c) = cap {
                            s = c * (s / c).tanh();
                        }
                        self.scores[j] = s;
                        // f64::max skips NaN, but a NaN score still poisons its weight
                        // below, so stray reads of NaN-filled slots stay visible.
                        max = max.max(s);
                    }
                    self.acc.iter_mut().for_each(|x| *x = 0.0);
                    let mut sum = 0.0f64;
                    if n_keys > 0 {
                        for (j, p) in (lo..=pos).enumerate() {
                            let w = (self.scores[j] - max).exp();
                            sum += w;
                            let v0 = slot_off(p);
                            for (e, a) in self.acc.iter_mut().enumerate() {
                                *a += w * v_all.at(v0 + e) as f64;
                            }
                        }
                        for (e, a) in self.acc.iter().enumerate() {
                            out.set(q0 + e, (a / sum) as f32);
                        }
                    } else {
                        (0..d).for_each(|e| out.set(q0 + e, 0.0));
                    }
                    if let Some(l) = lse.as_deref_mut() {
                        l[t * h + head] = if n_keys > 0 {
                            (max + sum.ln()) as f32
                        } else {
                            f32::NEG_INFINITY
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
