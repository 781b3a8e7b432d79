//! The example backend crate that docs/new-backend.md walks through.
//!
//! `example` is a small but real CPU attention backend: one pass over the keys of
//! each (token, head) with an online softmax in f32 (running max and running sum,
//! rescaling the accumulator when the max grows). It serves decode and prefill rows,
//! any head dim and block size, returns the LSE, and refuses sliding windows and
//! soft-capping with reasons, so the selector can explain why it was not chosen.

use pagoda_core::{
    no_runtime_reasons, AttentionBackend, AttentionConfig, BackendRegistration, BatchDescriptor,
    Capabilities, CoreError, DType, DeviceKind, LayerIo, Role,
};

/// The registered name (what `--attention-backend example` selects).
pub const NAME: &str = "example";

/// Step 1: what the backend supports. `None` means "any".
pub fn capabilities() -> Capabilities {
    Capabilities {
        devices: vec![DeviceKind::Cpu],
        q_dtypes: vec![DType::F32],
        kv_dtypes: vec![DType::F32],
        head_dims: None,
        block_sizes: None,
        max_gqa_ratio: None,
        sliding_window: false,
        logits_soft_cap: false,
        decode: true,
        prefill: true,
        returns_lse: true,
    }
}

// Step 2: registration. `inventory` collects it when this crate is linked.
pagoda_core::register_backend!(BackendRegistration {
    name: NAME,
    // Above `naive` (0), below the optimized CPU backends.
    priority: 1,
    description: "example: per-row online-softmax f32 attention (docs/new-backend.md)",
    capabilities,
    runtime_reasons: no_runtime_reasons,
    create,
});

fn create(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Ok(Box::new(ExampleBackend::new(cfg)?))
}

/// Per-token metadata built once per step by `plan`.
#[derive(Debug, Clone, Copy)]
struct TokenPlan {
    /// Row (request) of the token.
    req: u32,
    /// Its position in the sequence: `context_len + i`.
    pos: u32,
}

/// Step 3: the backend.
pub struct ExampleBackend {
    cfg: AttentionConfig,
    batch: BatchDescriptor,
    tokens: Vec<TokenPlan>,
    /// Accumulator of one (token, head), allocated once.
    acc: Vec<f32>,
    planned: bool,
}

impl ExampleBackend {
    /// Fails with every reason when `cfg` is outside [`capabilities`].
    pub fn new(cfg: &AttentionConfig) -> Result<Self, CoreError> {
        let reasons = capabilities().reasons(cfg, Role::Both);
        if !reasons.is_empty() {
            return Err(CoreError::BackendInvalid {
                backend: NAME.into(),
                reasons,
            });
        }
        Ok(ExampleBackend {
            cfg: cfg.clone(),
            batch: BatchDescriptor::default(),
            tokens: Vec::new(),
            acc: vec![0.0; cfg.head_dim],
            planned: false,
        })
    }
}

fn invalid(message: String) -> CoreError {
    CoreError::InvalidBatch { message }
}

impl AttentionBackend for ExampleBackend {
    fn name(&self) -> &str {
        NAME
    }

    /// Once per step: check the descriptor and flatten it to per-token metadata.
    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        self.planned = false;
        if batch.block_size != self.cfg.block_size {
            return Err(invalid(format!(
                "block size {} (configured {})",
                batch.block_size, self.cfg.block_size
            )));
        }
        let n = batch.seq_lens.len();
        if batch.query_start_loc.len() != n + 1
            || batch.block_table.len() < n * batch.block_table_stride
        {
            return Err(invalid(
                "query_start_loc or block_table does not match seq_lens".into(),
            ));
        }
        self.tokens.clear();
        for r in 0..n {
            let (start, end) = (batch.query_start_loc[r], batch.query_start_loc[r + 1]);
            let seq = batch.seq_lens[r];
            if end < start
                || end - start > seq
                || (seq as usize).div_ceil(batch.block_size) > batch.block_table_stride
            {
                return Err(invalid(format!("request {r} is inconsistent")));
            }
            let ctx = seq - (end - start);
            self.tokens.extend((0..end - start).map(|i| TokenPlan {
                req: r as u32,
                pos: ctx + i,
            }));
        }
        self.batch.clone_from(batch);
        self.planned = true;
        Ok(())
    }

    /// Once per layer: attention of every planned token and head.
    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        if !self.planned {
            return Err(CoreError::BackendFailed {
                backend: NAME.into(),
                message: "run before plan".into(),
            });
        }
        let (h, kvh, d, bs) = (
            self.cfg.num_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.block_size,
        );
        // Buffer lengths (q, out, lse, whole-block K/V pools of equal size).
        let pool_blocks = io.validate(self.tokens.len(), &self.cfg)?;
        let mut lse = io.lse;
        // Every block the batch names must exist in this layer's pool.
        for r in 0..self.batch.num_reqs() {
            if let Some(b) = self
                .batch
                .blocks(r)
                .iter()
                .find(|&&b| b as usize >= pool_blocks)
            {
                return Err(invalid(format!(
                    "request {r}: block {b} outside a pool of {pool_blocks}"
                )));
            }
        }
        let group = h / kvh;
        for (ti, tok) in self.tokens.iter().enumerate() {
            let blocks = self.batch.blocks(tok.req as usize);
            for head in 0..h {
                let kv = head / group;
                let q = &io.q[(ti * h + head) * d..][..d];
                let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
                self.acc.fill(0.0);
                // Causal: position `pos` sees keys 0..=pos.
                for p in 0..=tok.pos as usize {
                    let at = ((blocks[p / bs] as usize * bs + p % bs) * kvh + kv) * d;
                    let k = &io.k_cache[at..at + d];
                    let s = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * self.cfg.scale;
                    if s > max {
                        // Rescale what was accumulated under the old max.
                        let c = (max - s).exp();
                        sum *= c;
                        self.acc.iter_mut().for_each(|a| *a *= c);
                        max = s;
                    }
                    let w = (s - max).exp();
                    sum += w;
                    for (a, v) in self.acc.iter_mut().zip(&io.v_cache[at..at + d]) {
                        *a += w * v;
                    }
                }
                for (o, a) in io.out[(ti * h + head) * d..][..d].iter_mut().zip(&self.acc) {
                    *o = a / sum;
                }
                if let Some(l) = lse.as_deref_mut() {
                    l[ti * h + head] = max + sum.ln();
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_it_does_not_support_with_reasons() {
        let mut cfg = AttentionConfig::cpu_f32(8, 2, 64, 16);
        cfg.sliding_window = Some(128);
        let err = ExampleBackend::new(&cfg)
            .err()
            .expect("sliding window is unsupported");
        assert!(err.to_string().contains("sliding-window"), "{err}");
        assert!(ExampleBackend::new(&AttentionConfig::cpu_f32(8, 2, 64, 16)).is_ok());
    }

    #[test]
    fn one_key_returns_its_value() {
        let cfg = AttentionConfig::cpu_f32(1, 1, 2, 4);
        let mut be = ExampleBackend::new(&cfg).unwrap();
        be.plan(&BatchDescriptor::new(4, &[1], &[1], &[&[1]]).unwrap())
            .unwrap();
        let mut k = vec![f32::NAN; 2 * 4 * 2];
        let mut v = k.clone();
        k[8..10].copy_from_slice(&[1.0, 0.0]);
        v[8..10].copy_from_slice(&[3.0, -2.0]);
        let mut out = vec![0.0; 2];
        be.run(LayerIo {
            q: &[1.0, 1.0],
            k_cache: &k,
            v_cache: &v,
            out: &mut out,
            lse: None,
        })
        .unwrap();
        assert_eq!(out, vec![3.0, -2.0]);
    }
}
