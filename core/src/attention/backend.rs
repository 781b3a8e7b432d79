//! The trait a backend implements, [`AttentionBackend`], and the buffers of one
//! layer's call, [`LayerIo`].

use super::{AttentionConfig, BatchDescriptor};
use crate::CoreError;

/// An attention implementation: **the trait a backend implements**. Created for one
/// [`AttentionConfig`] by its registration ([`super::BackendRegistration::create`]).
///
/// The [`BatchDescriptor`] that `plan` receives is valid by construction; `plan`
/// checks only what depends on the backend ([`super::Capabilities::check_batch`]),
/// and `run` only the buffers ([`LayerIo::validate_batch`]). Bad input is an error,
/// never a panic.
pub trait AttentionBackend: Send {
    /// The registered name.
    fn name(&self) -> &str;

    /// Builds this backend's metadata for a step. Called once per step, before any `run`.
    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError>;

    /// Attention of one layer over the paged cache for the planned batch. The new
    /// tokens' K/V must already be in the cache (see [`AttentionBackend::write_kv`]).
    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError>;

    /// Writes new K/V rows by slot mapping (negative slots skipped).
    fn write_kv(
        &mut self,
        k_pool: &mut [f32],
        v_pool: &mut [f32],
        k: &[f32],
        v: &[f32],
        slot_mapping: &[i64],
        slot_elems: usize,
    ) -> Result<(), CoreError> {
        crate::write_kv(k_pool, v_pool, k, v, slot_mapping, slot_elems)
    }
}

/// Buffers of one layer's attention call.
pub struct LayerIo<'a> {
    /// `[num_tokens, num_heads, head_dim]`
    pub q: &'a [f32],
    /// This layer's K pool, `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub k_cache: &'a [f32],
    /// This layer's V pool, same shape.
    pub v_cache: &'a [f32],
    /// `[num_tokens, num_heads, head_dim]`
    pub out: &'a mut [f32],
    /// `[num_tokens, num_heads]`, natural-log log-sum-exp of the scaled scores, if wanted.
    pub lse: Option<&'a mut [f32]>,
}

impl LayerIo<'_> {
    /// Checks the buffer lengths every backend's `run` needs for a batch of
    /// `num_tokens` tokens under `cfg`, in this order: `q` and `out` hold
    /// `[num_tokens, num_heads, head_dim]`, `lse` (if asked for) `[num_tokens, num_heads]`,
    /// the K pool is whole blocks and the V pool is as long. Returns the pool's
    /// number of blocks (block ids must be below it); the first bad buffer is a
    /// [`CoreError::ShapeMismatch`] (for a K pool of partial blocks, `expected` is
    /// its length rounded down to whole blocks).
    pub fn validate(&self, num_tokens: usize, cfg: &AttentionConfig) -> Result<usize, CoreError> {
        let check = |name: &'static str, actual: usize, expected: usize| {
            if actual == expected {
                Ok(())
            } else {
                Err(CoreError::ShapeMismatch {
                    name,
                    expected,
                    actual,
                })
            }
        };
        let tok_elems = num_tokens * cfg.num_heads * cfg.head_dim;
        check("q", self.q.len(), tok_elems)?;
        check("out", self.out.len(), tok_elems)?;
        if let Some(l) = self.lse.as_deref() {
            check("lse", l.len(), num_tokens * cfg.num_heads)?;
        }
        let block_elems = cfg.block_size * cfg.num_kv_heads * cfg.head_dim;
        let num_blocks = self.k_cache.len().checked_div(block_elems).unwrap_or(0);
        check("k_cache", self.k_cache.len(), num_blocks * block_elems)?;
        check("v_cache", self.v_cache.len(), self.k_cache.len())?;
        Ok(num_blocks)
    }

    /// [`LayerIo::validate`] for `batch`'s tokens, then that every block the batch
    /// uses exists in the pool ([`CoreError::BlockOutOfRange`] otherwise). Together
    /// with the descriptor's own validity this is every check a `run` needs.
    pub fn validate_batch(
        &self,
        batch: &BatchDescriptor,
        cfg: &AttentionConfig,
    ) -> Result<usize, CoreError> {
        let num_blocks = self.validate(batch.num_tokens(), cfg)?;
        match batch.max_block() {
            Some(block) if block as usize >= num_blocks => {
                Err(CoreError::BlockOutOfRange { block, num_blocks })
            }
            _ => Ok(num_blocks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_io_validate_names_the_first_bad_buffer() {
        // 2 tokens, 4 heads of dim 2, 2 KV heads, blocks of 3: a block is 12 floats.
        let cfg = AttentionConfig::cpu_f32(4, 2, 2, 3);
        let (q, kv) = (vec![0.0; 16], vec![0.0; 36]);
        let (mut out, mut lse) = (vec![0.0; 16], vec![0.0; 8]);
        let run = |q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], lse: Option<&mut [f32]>| {
            LayerIo {
                q,
                k_cache: k,
                v_cache: v,
                out,
                lse,
            }
            .validate(2, &cfg)
        };
        assert_eq!(run(&q, &kv, &kv, &mut out, Some(&mut lse)), Ok(3));
        assert_eq!(run(&q, &kv, &kv, &mut out, None), Ok(3));
        assert_eq!(run(&q, &[], &[], &mut out, None), Ok(0));
        let name = |r: Result<usize, CoreError>| match r {
            Err(CoreError::ShapeMismatch {
                name,
                expected,
                actual,
            }) => (name, expected, actual),
            other => panic!("expected a shape mismatch, got {other:?}"),
        };
        assert_eq!(name(run(&q[1..], &kv, &kv, &mut out, None)), ("q", 16, 15));
        assert_eq!(
            name(run(&q, &kv, &kv, &mut out[1..], None)),
            ("out", 16, 15)
        );
        assert_eq!(
            name(run(&q, &kv, &kv, &mut out, Some(&mut lse[1..]))),
            ("lse", 8, 7)
        );
        assert_eq!(
            name(run(&q, &kv[1..], &kv[1..], &mut out, None)),
            ("k_cache", 24, 35)
        );
        assert_eq!(
            name(run(&q, &kv, &kv[12..], &mut out, None)),
            ("v_cache", 36, 24)
        );
        // The first bad buffer wins.
        assert_eq!(
            name(run(&q[1..], &kv[1..], &kv, &mut out[1..], None)).0,
            "q"
        );
    }

    #[test]
    fn validate_batch_checks_the_blocks_against_the_pool() {
        // One KV head of dim 2, blocks of 2: a block is 4 floats; a pool of 3 blocks.
        let cfg = AttentionConfig::cpu_f32(1, 1, 2, 2);
        let kv = vec![0.0; 12];
        let mut out = vec![0.0; 2];
        for (block, want) in [
            (2, Ok(3)),
            (
                3,
                Err(CoreError::BlockOutOfRange {
                    block: 3,
                    num_blocks: 3,
                }),
            ),
        ] {
            let batch = BatchDescriptor::new(2, &[1], &[1], &[&[block]]).unwrap();
            let got = LayerIo {
                q: &[0.0; 2],
                k_cache: &kv,
                v_cache: &kv,
                out: &mut out,
                lse: None,
            }
            .validate_batch(&batch, &cfg);
            assert_eq!(got, want);
        }
    }
}
