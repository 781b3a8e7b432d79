//! The attention benchmark shapes and their inputs.
//!
//! Cases use shuffled physical blocks. The KV pool is capped (`max_kv_bytes`):
//! when a batch needs more, requests share physical blocks (request `r`'s logical
//! block `j` maps to pool block `perm[(first_r + j) % pool_blocks]`). Every
//! request still reads its own full context, so the bytes moved are unchanged, and
//! with a cap far above the last-level cache those reads still come from DRAM.
//!
//! The pools hold f32 ([`build`]) or another KV cache dtype ([`build_with_kv`]:
//! bf16 or f16, the `--kv-cache-dtype` A/B).

use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, CoreError, DType, Device, HostVec, LayerIo,
    Shape, Storage, TensorMut, TensorRef,
};
use thiserror::Error;

/// Errors building or running a benchmark case.
#[derive(Debug, Error)]
pub enum BenchError {
    #[error("backend error: {0}")]
    Backend(#[from] CoreError),
}

/// A model's attention shape.
#[derive(Debug, Clone, Copy)]
pub struct ModelShape {
    pub name: &'static str,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// SmolLM2-135M: 9 query heads, 3 KV heads, dim 64.
pub const SMOLLM2: ModelShape = ModelShape {
    name: "smollm2",
    num_heads: 9,
    num_kv_heads: 3,
    head_dim: 64,
};
/// Llama-3-8B-like: 32 query heads, 8 KV heads, dim 128.
pub const LLAMA8B: ModelShape = ModelShape {
    name: "llama8b",
    num_heads: 32,
    num_kv_heads: 8,
    head_dim: 128,
};
/// Block size of every case.
pub const BLOCK_SIZE: usize = 16;
/// Default cap on one layer's K + V pools (2 GiB: far above a 32 MiB L3).
pub const DEFAULT_MAX_KV_BYTES: usize = 2 << 30;

impl ModelShape {
    pub fn config(&self) -> AttentionConfig {
        AttentionConfig::cpu_f32(self.num_heads, self.num_kv_heads, self.head_dim, BLOCK_SIZE)
    }
}

/// One benchmark input: batch, cache and buffers.
pub struct Case {
    pub cfg: AttentionConfig,
    pub batch: BatchDescriptor,
    pub q: Vec<f32>,
    /// The K and V pools, host memory of `cfg.kv_dtype`.
    pub k_cache: Storage,
    pub v_cache: Storage,
    pub out: Vec<f32>,
    /// Physical blocks in the pool (less than the batch needs if blocks are shared).
    pub pool_blocks: usize,
}

/// A cheap deterministic fill in [-0.5, 0.5).
fn fill(buf: &mut [f32], salt: usize) {
    use rayon::prelude::*;
    buf.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (i, x) in chunk.iter_mut().enumerate() {
                let h = ((c << 16) + i + salt).wrapping_mul(2_654_435_761) % 1_000_003;
                *x = h as f32 / 1_000_003.0 - 0.5;
            }
        });
}

/// Builds a case with an f32 cache; `rows` = (query_len, seq_len) per request,
/// decode rows first.
pub fn build(
    shape: ModelShape,
    rows: &[(usize, usize)],
    max_kv_bytes: usize,
) -> Result<Case, BenchError> {
    build_with_kv(shape, rows, max_kv_bytes, DType::F32)
}

/// `data` rounded to `dtype`, as a flat CPU buffer.
fn pool(dtype: DType, data: Vec<f32>) -> Result<Storage, CoreError> {
    let n = data.len();
    let v = match dtype {
        DType::F32 => HostVec::F32(data),
        DType::BF16 => HostVec::BF16(
            data.iter()
                .map(|&x| pagoda_core::bf16::from_f32(x))
                .collect(),
        ),
        DType::F16 => HostVec::F16(
            data.iter()
                .map(|&x| pagoda_core::f16::from_f32(x))
                .collect(),
        ),
        DType::F8E4M3 => HostVec::F8E4M3(
            data.iter()
                .map(|&x| pagoda_core::F8E4M3::from_f32(x))
                .collect(),
        ),
    };
    Storage::from_host(Device::Cpu, v, Shape::flat(n))
}

/// [`build`] with a KV cache of `kv_dtype` (the pool cap counts its element size).
pub fn build_with_kv(
    shape: ModelShape,
    rows: &[(usize, usize)],
    max_kv_bytes: usize,
    kv_dtype: DType,
) -> Result<Case, BenchError> {
    let cfg = AttentionConfig {
        kv_dtype,
        ..shape.config()
    };
    let bs = BLOCK_SIZE;
    let block_bytes = bs * shape.num_kv_heads * shape.head_dim * kv_dtype.size();
    let need: usize = rows.iter().map(|&(_, s)| s.div_ceil(bs)).sum();
    let pool_blocks = need.min((max_kv_bytes / (2 * block_bytes)).max(1));
    // A fixed pseudo-random permutation of the pool (xorshift Fisher-Yates).
    let mut perm: Vec<u32> = (0..pool_blocks as u32).collect();
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..perm.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        perm.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let mut tables = Vec::with_capacity(rows.len());
    let mut first = 0;
    for &(_, seq) in rows {
        let nb = seq.div_ceil(bs);
        tables.push(
            (0..nb)
                .map(|j| perm[(first + j) % pool_blocks])
                .collect::<Vec<u32>>(),
        );
        first += nb;
    }
    let qlens: Vec<usize> = rows.iter().map(|r| r.0).collect();
    let slens: Vec<usize> = rows.iter().map(|r| r.1).collect();
    let refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    let batch = BatchDescriptor::new(bs, &qlens, &slens, &refs)?;
    let pool_elems = pool_blocks * block_bytes / kv_dtype.size();
    let mut k_cache = vec![0f32; pool_elems];
    let mut v_cache = vec![0f32; pool_elems];
    fill(&mut k_cache, 1);
    fill(&mut v_cache, 2);
    let (k_cache, v_cache) = (pool(kv_dtype, k_cache)?, pool(kv_dtype, v_cache)?);
    let tok_elems = batch.num_tokens() * shape.num_heads * shape.head_dim;
    let mut q = vec![0f32; tok_elems];
    fill(&mut q, 3);
    Ok(Case {
        cfg,
        batch,
        q,
        k_cache,
        v_cache,
        out: vec![0f32; tok_elems],
        pool_blocks,
    })
}

/// `batch` decode rows with `context` cached keys each (the new token included).
pub fn decode_rows(batch: usize, context: usize) -> Vec<(usize, usize)> {
    vec![(1, context); batch]
}

/// One prefill request of `tokens` new tokens after `prefix` cached ones.
pub fn prefill_rows(tokens: usize, prefix: usize) -> Vec<(usize, usize)> {
    vec![(tokens, tokens + prefix)]
}

impl Case {
    /// Bytes a decode step must move: Q and O once (at q's element size), every
    /// request's K and V rows (at the cache's).
    pub fn decode_bytes(&self) -> u64 {
        let c = &self.cfg;
        let qo = 2 * self.batch.num_tokens() * c.num_heads * c.head_dim * c.q_dtype.size();
        let e = c.kv_dtype.size();
        let kv: usize = self
            .batch
            .seq_lens()
            .iter()
            .map(|&s| 2 * s as usize * c.num_kv_heads * c.head_dim * e)
            .sum();
        (qo + kv) as u64
    }

    /// FLOPs of the attention products (QKᵀ and PV, 2 per multiply-add) under the causal mask.
    pub fn flops(&self) -> u64 {
        let c = &self.cfg;
        let b = &self.batch;
        let pairs: u64 = (0..b.num_reqs())
            .map(|r| {
                let (ctx, q) = (b.context_len(r) as u64, b.query_len(r) as u64);
                q * ctx + q * (q + 1) / 2
            })
            .sum();
        4 * (c.head_dim * c.num_heads) as u64 * pairs
    }

    /// One layer: `run` on the planned batch.
    pub fn run(&mut self, be: &mut dyn AttentionBackend) -> Result<(), BenchError> {
        be.run(LayerIo {
            q: TensorRef::cpu(&self.q),
            k_cache: self.k_cache.view(),
            v_cache: self.v_cache.view(),
            out: TensorMut::cpu(&mut self.out),
            lse: None,
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_pool_shares_blocks_but_keeps_bytes() {
        let small = build(SMOLLM2, &decode_rows(4, 64), 1 << 30).unwrap();
        let capped = build(
            SMOLLM2,
            &decode_rows(4, 64),
            2 * 2 * BLOCK_SIZE * 3 * 64 * 4,
        )
        .unwrap();
        assert_eq!(small.pool_blocks, 16);
        assert_eq!(capped.pool_blocks, 2);
        assert_eq!(small.decode_bytes(), capped.decode_bytes());
        let bf = build_with_kv(SMOLLM2, &decode_rows(4, 64), 1 << 30, DType::BF16).unwrap();
        assert_eq!(bf.k_cache.dtype(), DType::BF16);
        assert_eq!(
            bf.decode_bytes(),
            (2 * 4 * 9 * 64 * 4 + 4 * 2 * 64 * 3 * 64 * 2) as u64
        );
        assert_eq!(
            small.decode_bytes(),
            (2 * 4 * 9 * 64 * 4 + 4 * 2 * 64 * 3 * 64 * 4) as u64
        );
    }

    #[test]
    fn prefill_flops_count_the_causal_triangle() {
        let c = build(SMOLLM2, &prefill_rows(4, 2), 1 << 30).unwrap();
        // rows see 3, 4, 5, 6 keys.
        assert_eq!(c.flops(), 4 * 9 * 64 * 18);
    }
}
