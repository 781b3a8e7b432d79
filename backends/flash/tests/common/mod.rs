//! Test support: random paged batches (shuffled physical blocks, NaN in every
//! unused slot) and a slow, obviously correct f64 reference attention.
#![allow(dead_code)]

use pagoda_core::{AttentionConfig, BatchDescriptor};
use rand::{seq::SliceRandom, Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A batch with its cache and query, ready for `plan` + `run`.
pub struct Case {
    pub cfg: AttentionConfig,
    pub batch: BatchDescriptor,
    pub q: Vec<f32>,
    pub k_cache: Vec<f32>,
    pub v_cache: Vec<f32>,
}

/// Builds a case: `rows` = (query_len, seq_len) per request, decode rows first.
/// Physical blocks are a random permutation (plus spare blocks); every slot that
/// no request owns, and every owned slot past a request's length, stays NaN.
pub fn make_case(cfg: AttentionConfig, rows: &[(usize, usize)], seed: u64) -> Case {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let bs = cfg.block_size;
    let slot_elems = cfg.num_kv_heads * cfg.head_dim;
    let need: usize = rows.iter().map(|&(_, s)| s.div_ceil(bs)).sum();
    let num_blocks = need + 3;
    let mut perm: Vec<u32> = (0..num_blocks as u32).collect();
    perm.shuffle(&mut rng);
    let mut k_cache = vec![f32::NAN; num_blocks * bs * slot_elems];
    let mut v_cache = vec![f32::NAN; num_blocks * bs * slot_elems];
    let mut rows_blocks = Vec::new();
    let mut next = 0;
    for &(_, s) in rows {
        let nb = s.div_ceil(bs);
        let blocks = perm[next..next + nb].to_vec();
        next += nb;
        for pos in 0..s {
            let slot = blocks[pos / bs] as usize * bs + pos % bs;
            for e in 0..slot_elems {
                k_cache[slot * slot_elems + e] = rng.gen_range(-1.0..1.0);
                v_cache[slot * slot_elems + e] = rng.gen_range(-1.0..1.0);
            }
        }
        rows_blocks.push(blocks);
    }
    let qlens: Vec<usize> = rows.iter().map(|r| r.0).collect();
    let slens: Vec<usize> = rows.iter().map(|r| r.1).collect();
    let brefs: Vec<&[u32]> = rows_blocks.iter().map(|b| b.as_slice()).collect();
    let batch = BatchDescriptor::new(bs, &qlens, &slens, &brefs).expect("valid batch");
    let q = (0..batch.num_tokens() * cfg.num_heads * cfg.head_dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    Case {
        cfg,
        batch,
        q,
        k_cache,
        v_cache,
    }
}

/// f64 attention over the paged cache, causal aligned bottom-right.
/// Returns (out `[tokens, heads, dim]`, lse `[tokens, heads]`).
pub fn reference(c: &Case) -> (Vec<f32>, Vec<f32>) {
    let (nh, nkv, hd, bs) = (
        c.cfg.num_heads,
        c.cfg.num_kv_heads,
        c.cfg.head_dim,
        c.cfg.block_size,
    );
    let g = nh / nkv;
    let b = &c.batch;
    let mut out = vec![0f32; b.num_tokens() * nh * hd];
    let mut lse = vec![0f32; b.num_tokens() * nh];
    for r in 0..b.num_reqs() {
        let ctx = b.context_len(r);
        let blocks = b.blocks(r);
        for i in 0..b.query_len(r) {
            let t = b.query_start_loc[r] as usize + i;
            for h in 0..nh {
                let kvh = h / g;
                let qv = &c.q[(t * nh + h) * hd..(t * nh + h + 1) * hd];
                let keys = ctx + i + 1;
                let addr = |p: usize| ((blocks[p / bs] as usize * bs + p % bs) * nkv + kvh) * hd;
                let scores: Vec<f64> = (0..keys)
                    .map(|p| {
                        let k = &c.k_cache[addr(p)..addr(p) + hd];
                        qv.iter()
                            .zip(k)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * c.cfg.scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                for d in 0..hd {
                    let acc: f64 = (0..keys)
                        .map(|p| w[p] * c.v_cache[addr(p) + d] as f64)
                        .sum();
                    out[(t * nh + h) * hd + d] = (acc / sum) as f32;
                }
                lse[t * nh + h] = (m + sum.ln()) as f32;
            }
        }
    }
    (out, lse)
}

/// `|got - want| <= atol + rtol * |want|` everywhere (NaN fails).
pub fn assert_close(name: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= atol + rtol * w.abs(),
            "{name}[{i}]: got {g}, want {w}"
        );
    }
}
