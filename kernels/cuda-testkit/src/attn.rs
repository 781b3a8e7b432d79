//! The test kit of a CUDA attention kernel: random paged batches in vLLM's layout
//! ([`Case`]: q, the pools, the block table, as the kernel's element type and as their
//! f64 images), the f64 reference attention over them ([`Case::reference`]: causal with
//! the context offset, GQA, sliding windows, soft caps), the tolerance of each dtype
//! (derived next to [`tolerance`]), and proptest strategies for the batch shapes.
//!
//! A kernel's test builds a [`Case`], runs the kernel on the emulator through
//! `pagoda_cuda_kernels::emu::attn` (or on a GPU with the case's buffers uploaded), and
//! compares with [`max_err`] and [`check_lse`].

use half::{bf16, f16};
use pagoda_cuda_kernels::emu::{Batch, Io, Shape};
use pagoda_cuda_kernels::Element;
use proptest::prelude::*;

/// Host conversions of the kernel element types.
pub trait Conv: Element {
    /// `x` rounded to the type.
    fn from_f32(x: f32) -> Self;
    /// The value, exactly.
    fn to_f64(self) -> f64;
    /// Unit roundoff of the format (half an ulp at 1.0).
    const U: f64;
}
impl Conv for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    const U: f64 = 1.0 / 16_777_216.0; // 2^-24
}
impl Conv for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
    const U: f64 = 1.0 / 256.0; // 2^-8 (8 significant bits)
}
impl Conv for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
    const U: f64 = 1.0 / 2048.0; // 2^-11
}

/// Output tolerance (absolute; V and therefore every output lies in [-1, 1]).
///
/// Inputs are quantized before the reference sees them, so the only errors are:
/// the output's rounding to T (<= U), f32 accumulation (~1e-6 at these sizes), and for
/// tensor-core kernels (`rounds_p`) P rounded to T before P V: each p_j gets a relative
/// error <= U, so |O error| <= U * sum p_j |v_j| / l <= U. Hence U (+U) + 1e-5, with a
/// 25% margin for the f32 terms; never widened to make a test pass.
pub fn tolerance<T: Conv>(rounds_p: bool) -> f64 {
    let u = if rounds_p { 2.0 * T::U } else { T::U };
    1.25 * u + 1e-5
}

/// LSE tolerance: scores are exact products summed in f32, the log-sum-exp in f32.
pub fn lse_tolerance(lse: f64) -> f64 {
    1e-4 * (1.0 + lse.abs())
}

/// One sequence: `ctx` cached tokens then `q_len` new ones.
#[derive(Debug, Clone, Copy)]
pub struct SeqSpec {
    /// New tokens (1: a decode row).
    pub q_len: usize,
    /// Tokens already in the cache before them.
    pub ctx: usize,
}

/// A random paged batch with its tensors (as T) and their f64 images.
#[derive(Debug)]
pub struct Case<T> {
    /// Heads, dims, scale and options.
    pub shape: Shape,
    /// `[num_seqs + 1]` query token offsets.
    pub qsl: Vec<u32>,
    /// `[num_seqs]` context + new tokens.
    pub seq_lens: Vec<u32>,
    /// `[num_seqs, max_blocks]` block ids (shuffled: sequences' blocks interleave).
    pub block_table: Vec<u32>,
    /// Row stride of `block_table`.
    pub max_blocks: usize,
    /// `[num_tokens, num_heads, head_dim]`.
    pub q: Vec<T>,
    /// The key pool, `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub k: Vec<T>,
    /// The value pool, as `k`.
    pub v: Vec<T>,
    /// Query tokens of all sequences.
    pub num_tokens: usize,
}

/// xorshift: tests must be reproducible from the proptest seed alone.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);
impl Rng {
    /// The next 64 random bits (the state must not be 0).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

impl<T: Conv> Case<T> {
    /// A random case of `seqs` with these heads, head dim and block size, from `seed`.
    pub fn new(
        seqs: &[SeqSpec],
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        seed: u64,
    ) -> Self {
        let mut rng = Rng(seed | 1);
        let blocks_per: Vec<usize> = seqs
            .iter()
            .map(|s| (s.ctx + s.q_len).div_ceil(block_size))
            .collect();
        let max_blocks = blocks_per.iter().copied().max().unwrap_or(0) + 1;
        let num_blocks = blocks_per.iter().sum::<usize>() + 3;
        // A shuffled pool: sequences get scattered, non-contiguous blocks.
        let mut pool: Vec<u32> = (0..num_blocks as u32).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let mut block_table = vec![0u32; seqs.len() * max_blocks];
        let mut next = 0;
        for (s, &n) in blocks_per.iter().enumerate() {
            for b in 0..n {
                block_table[s * max_blocks + b] = pool[next];
                next += 1;
            }
        }
        let mut qsl = vec![0u32];
        for s in seqs {
            qsl.push(qsl.last().unwrap() + s.q_len as u32);
        }
        let num_tokens = *qsl.last().unwrap() as usize;
        let seq_lens = seqs.iter().map(|s| (s.ctx + s.q_len) as u32).collect();
        let mut rand = |n: usize| (0..n).map(|_| T::from_f32(rng.unit())).collect::<Vec<T>>();
        let q = rand(num_tokens * num_heads * head_dim);
        let pool_len = num_blocks * block_size * num_kv_heads * head_dim;
        let k = rand(pool_len);
        let v = rand(pool_len);
        let shape = Shape::new(
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            1.0 / (head_dim as f32).sqrt(),
        );
        Case {
            shape,
            qsl,
            seq_lens,
            block_table,
            max_blocks,
            q,
            k,
            v,
            num_tokens,
        }
    }

    /// The same case with a sliding window and/or a logit soft cap.
    pub fn with_options(mut self, sliding_window: Option<usize>, soft_cap: Option<f32>) -> Self {
        self.shape.sliding_window = sliding_window;
        self.shape.soft_cap = soft_cap;
        self
    }

    /// The emulator's batch metadata, launching `seqs`.
    pub fn batch(&self, seqs: std::ops::Range<usize>) -> Batch<'_> {
        Batch {
            query_start_loc: &self.qsl,
            seq_lens: &self.seq_lens,
            block_table: &self.block_table,
            max_blocks_per_seq: self.max_blocks,
            seqs,
        }
    }

    /// The emulator's tensors over the case's q and pools, into `out` and `lse`.
    pub fn io<'a>(&'a self, out: &'a mut [T], lse: &'a mut [f32]) -> Io<'a, T> {
        Io {
            q: &self.q,
            key_cache: &self.k,
            value_cache: &self.v,
            out,
            lse: Some(lse),
        }
    }

    /// f64 attention of every row of `seqs`: (out, lse), NaN for rows outside. The
    /// query at position `pos` sees keys `pos + 1 - w..=pos` under a window `w` (else
    /// `0..=pos`); a soft cap `c` maps each scaled score `s` to `c * tanh(s / c)`.
    pub fn reference(&self, seqs: std::ops::Range<usize>) -> (Vec<f64>, Vec<f64>) {
        let Shape {
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
            block_size: bs,
            scale,
            sliding_window,
            soft_cap,
        } = self.shape;
        let mut out = vec![f64::NAN; self.num_tokens * h * d];
        let mut lse = vec![f64::NAN; self.num_tokens * h];
        for s in seqs {
            let (q0, q1) = (self.qsl[s] as usize, self.qsl[s + 1] as usize);
            let seq_len = self.seq_lens[s] as usize;
            let ctx = seq_len - (q1 - q0);
            for row in q0..q1 {
                let pos = ctx + (row - q0);
                let lo = sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let keys = lo..pos + 1;
                for head in 0..h {
                    let kv = head / (h / kvh);
                    let qv = &self.q[(row * h + head) * d..][..d];
                    let at = |j: usize| {
                        ((self.block_table[s * self.max_blocks + j / bs] as usize * bs + j % bs)
                            * kvh
                            + kv)
                            * d
                    };
                    let scores: Vec<f64> = keys
                        .clone()
                        .map(|j| {
                            let kr = &self.k[at(j)..][..d];
                            let s = qv
                                .iter()
                                .zip(kr)
                                .map(|(a, b)| a.to_f64() * b.to_f64())
                                .sum::<f64>()
                                * f64::from(scale);
                            soft_cap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh())
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let l: f64 = w.iter().sum();
                    for dd in 0..d {
                        out[(row * h + head) * d + dd] = keys
                            .clone()
                            .enumerate()
                            .map(|(i, j)| w[i] * self.v[at(j) + dd].to_f64())
                            .sum::<f64>()
                            / l;
                    }
                    lse[row * h + head] = m + l.ln();
                }
            }
        }
        (out, lse)
    }
}

/// Largest |got - want| over the rows the reference computed.
pub fn max_err<T: Conv>(got: &[T], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .filter(|(_, w)| !w.is_nan())
        .map(|(g, w)| (g.to_f64() - w).abs())
        .fold(0.0, f64::max)
}

/// Every LSE the reference computed within [`lse_tolerance`], or the first that is not.
pub fn check_lse(got: &[f32], want: &[f64]) -> Result<(), String> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if !w.is_nan() && (f64::from(*g) - w).abs() > lse_tolerance(*w) {
            return Err(format!("lse[{i}] = {g}, reference {w}"));
        }
    }
    Ok(())
}

/// A sliding window (sometimes) for proptests: none, or 1..=max keys.
pub fn windows(max: usize) -> impl Strategy<Value = Option<usize>> {
    prop_oneof![2 => Just(None), 1 => (1..=max).prop_map(Some)]
}

/// A logit soft cap (sometimes) for proptests: none, a tight one, or Gemma 2's 50.
pub fn soft_caps() -> impl Strategy<Value = Option<f32>> {
    prop_oneof![2 => Just(None), 1 => Just(Some(0.5f32)), 1 => Just(Some(50.0f32))]
}

/// Sequences for proptests: a few rows, short contexts (the emulator is slow).
pub fn seq_specs(
    max_seqs: usize,
    max_q: usize,
    max_ctx: usize,
) -> impl Strategy<Value = Vec<SeqSpec>> {
    prop::collection::vec(
        (1..=max_q, 0..=max_ctx).prop_map(|(q_len, ctx)| SeqSpec { q_len, ctx }),
        1..=max_seqs,
    )
}
