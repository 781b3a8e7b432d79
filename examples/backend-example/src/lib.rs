//! The example backend crate that docs/new-backend.md walks through.
//!
//! `example` is a small but real CPU attention backend: one pass over the keys of
//! each (token, head) with an online softmax in f32 (running max and running sum,
//! rescaling the accumulator when the max grows). It serves decode and prefill rows,
//! any head dim and block size, returns the LSE, and refuses sliding windows and
//! soft-capping with reasons, so the selector can explain why it was not chosen.

use pagoda_core::{
    no_runtime_reasons, AttentionBackend, AttentionConfig, BackendRegistration, BatchDescriptor,
    Capabilities, CoreError, LayerIo, Role,
};

/// The registered name (what `--attention-backend example` selects).
pub const NAME: &str = "example";

/// Step 1: what the backend supports: the common CPU f32 case (any head dim, block
/// size and GQA ratio, decode and prefill rows, LSE), so no sliding window and no
/// soft-cap, which the selector reports as reasons.
pub fn capabilities() -> Capabilities {
    Capabilities::cpu_f32()
}

// Step 2: registration. `inventory` collects it when this crate is linked.
pagoda_core::register_backend!(BackendRegistration {
    name: NAME,
    // Below `naive` (0): linked into every binary through `pagoda-backends`, an
    // example is used only when asked for (`--attention-backend example`).
    priority: -1,
    description: "example: per-row online-softmax f32 attention (docs/new-backend.md)",
    capabilities,
    runtime_reasons: no_runtime_reasons,
    create,
});

fn create(cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> {
    Ok(Box::new(ExampleBackend::new(cfg)?))
}

/// Step 3: the backend.
pub struct ExampleBackend {
    cfg: AttentionConfig,
    /// The planned batch (valid by construction: no need to re-check it).
    batch: BatchDescriptor,
    planned: bool,
    /// Accumulator of one (token, head), allocated once.
    acc: Vec<f32>,
}

impl ExampleBackend {
    /// Fails with every reason when `cfg` is outside [`capabilities`].
    pub fn new(cfg: &AttentionConfig) -> Result<Self, CoreError> {
        capabilities().require(NAME, cfg, Role::Both)?;
        Ok(ExampleBackend {
            cfg: cfg.clone(),
            batch: BatchDescriptor::default(),
            planned: false,
            acc: vec![0.0; cfg.head_dim],
        })
    }
}

impl AttentionBackend for ExampleBackend {
    fn name(&self) -> &str {
        NAME
    }

    /// Once per step: check what depends on this backend (block size, kinds of
    /// rows) and keep the batch.
    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        self.planned = false;
        capabilities().check_batch(NAME, &self.cfg, batch)?;
        self.batch.clone_from(batch);
        self.planned = true;
        Ok(())
    }

    /// Once per layer: attention of every planned token and head.
    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        if !self.planned {
            return Err(CoreError::NotPlanned {
                backend: NAME.into(),
            });
        }
        let (h, kvh, d, bs) = (
            self.cfg.num_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.block_size,
        );
        // Device, dtype and length of every buffer, and every block the batch names
        // exists in the pool; then the buffers as the f32 slices this backend reads.
        io.validate_batch(&self.batch, &self.cfg)?;
        let io = io.into_f32()?;
        let mut lse = io.lse;
        let b = &self.batch;
        let group = h / kvh;
        for r in 0..b.num_reqs() {
            let blocks = b.blocks(r);
            // Token t of the batch sits at position pos of its sequence.
            for (t, pos) in b.tokens(r).zip(b.context_len(r)..) {
                for head in 0..h {
                    let kv = head / group;
                    let q = &io.q[(t * h + head) * d..][..d];
                    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
                    self.acc.fill(0.0);
                    // Causal: position `pos` sees keys 0..=pos.
                    for p in 0..=pos {
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
                    for (o, a) in io.out[(t * h + head) * d..][..d].iter_mut().zip(&self.acc) {
                        *o = a / sum;
                    }
                    if let Some(l) = lse.as_deref_mut() {
                        l[t * h + head] = max + sum.ln();
                    }
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
        be.run(LayerIo::cpu(&[1.0, 1.0], &k, &v, &mut out, None))
            .unwrap();
        assert_eq!(out, vec![3.0, -2.0]);
    }
}
