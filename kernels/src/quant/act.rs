//! Activations quantized to int8 per block of 32, the `x` side of the quantized
//! matmul: `x ≈ d·a` with `d = max|x_block| / 127` and `a = round(x / d)` in
//! `[-127, 127]` (ties to even), so each element is off by at most `d/2` (plus f32's
//! roundings of `1/d` and `x·(1/d)`, under `1.5 ε|x|`). Per block it also keeps
//! the sums the offset term of the weights needs (`d·Σa` over 32 and over each
//! half, and the integer half sums for the AVX2 path).
//!
//! Each row is quantized alone, so a row's integers never depend on the batch.

use super::layout::QB;
use crate::error::{check_len, KernelError};

/// Per (row, block) scalars, laid out for one load per block.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub(crate) struct ActBlock {
    /// The block's scale `d`.
    pub d: f32,
    /// `d · Σa` over the 32 elements.
    pub a32: f32,
    /// `d · Σa` over elements 0..16 and 16..32.
    pub a16: [f32; 2],
    /// `Σa` over elements 0..16 and 16..32.
    pub s16: [i32; 2],
}

/// `m` rows of `k` activations, quantized (see the module doc). Reusable: a new
/// [`QuantActs::quantize`] keeps the buffers.
#[derive(Clone, Debug, Default)]
pub struct QuantActs {
    m: usize,
    k: usize,
    /// `m` rows of `k` int8, row `i` at `i * q_stride`.
    q: Vec<i8>,
    /// `m` rows of `k / QB` blocks, row `i` at `i * block_stride`.
    blocks: Vec<ActBlock>,
    q_stride: usize,
    block_stride: usize,
}

/// Bytes after each row's int8 values: one cache line. Why: the pass kernels
/// (`rows.rs`) read block `b` of up to 64 rows in turn; at a power-of-two `k`
/// (2048, 8192) rows `k` bytes apart fall in 1 or 2 of L1's 64 sets, so the pass's
/// rows evicted each other and every read went to L2. A stride of an odd number
/// of lines (or near it) spreads them over the sets: 1.1-1.2x on the 1B shapes'
/// passes on AVX2 (BENCHMARKS.md, "Bursts").
const Q_PAD: usize = 64;

/// Blocks after each row's blocks: 8 x 24 bytes, three cache lines, so a row's
/// stride in lines is odd at every `k` a multiple of 512 (`3 k / 256 + 3`), for
/// the same reason as [`Q_PAD`].
const BLOCK_PAD: usize = 8;

impl QuantActs {
    /// Quantizes `x[m, k]`; `k` must be a multiple of 32.
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize) -> Result<(), KernelError> {
        check_len("x", x.len(), m * k)?;
        if !k.is_multiple_of(QB) {
            return Err(KernelError::InvalidArgument {
                name: "k",
                message: format!("{k} is not a multiple of the block size {QB}"),
            });
        }
        let kb = k / QB;
        self.m = m;
        self.k = k;
        self.q_stride = k + Q_PAD;
        self.block_stride = kb + BLOCK_PAD;
        self.q.resize(m * self.q_stride, 0);
        self.blocks
            .resize(m * self.block_stride, ActBlock::default());
        let quantize = block_quantizer();
        let rows = x
            .chunks_exact(k.max(1))
            .zip(self.q.chunks_exact_mut(self.q_stride))
            .zip(self.blocks.chunks_exact_mut(self.block_stride));
        for ((xr, qr), br) in rows {
            let blocks = xr.chunks_exact(QB).zip(qr.chunks_exact_mut(QB)).zip(br);
            for ((xb, qb), blk) in blocks {
                *blk = quantize(xb, qb);
            }
        }
        Ok(())
    }

    /// Rows.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Elements per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Row `i`'s int8 values.
    pub fn row(&self, i: usize) -> &[i8] {
        &self.q[i * self.q_stride..][..self.k]
    }

    /// Row `i`'s block scales `d`.
    pub fn scales(&self, i: usize) -> impl Iterator<Item = f32> + '_ {
        self.row_blocks(i).iter().map(|b| b.d)
    }

    /// Row `i` as the values the kernels multiply by: `d·a`.
    pub fn dequantize_row(&self, i: usize) -> Vec<f32> {
        self.row(i)
            .chunks_exact(QB)
            .zip(self.row_blocks(i))
            .flat_map(|(q, b)| q.iter().map(move |&a| b.d * a as f32))
            .collect()
    }

    /// Rows `r0..r0 + h` (`h >= 1`) as one slab: their int8 values and blocks,
    /// row `i` of the slab at `i * q_stride` and `i * block_stride` (the third and
    /// fourth values; `k` and `k / QB` are valid there).
    pub(crate) fn rows_slab(&self, r0: usize, h: usize) -> (&[i8], &[ActBlock], usize, usize) {
        let (qs, bs) = (self.q_stride, self.block_stride);
        (
            &self.q[r0 * qs..(r0 + h - 1) * qs + self.k],
            &self.blocks[r0 * bs..(r0 + h - 1) * bs + self.k / QB],
            qs,
            bs,
        )
    }

    pub(crate) fn row_blocks(&self, i: usize) -> &[ActBlock] {
        &self.blocks[i * self.block_stride..][..self.k / QB]
    }
}

/// [`quantize_block_avx2`] where the CPU has AVX2 and FMA, else [`quantize_block`]
/// (the same bits).
fn block_quantizer() -> fn(&[f32], &mut [i8]) -> ActBlock {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::detect().avx2_fma() {
        // SAFETY: AVX2 and FMA are available (checked); the callers pass chunks
        // of exactly QB.
        return |x, q| unsafe { quantize_block_avx2(x, q) };
    }
    quantize_block
}

/// One block: `q` gets the int8 values; returns its scalars. A block of zeros (or
/// of NaNs only) gets `d = 0`; NaN elements quantize to 0. The reference of
/// [`quantize_block_avx2`], which must give the same bits.
fn quantize_block(x: &[f32], q: &mut [i8]) -> ActBlock {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut s16 = [0i32; 2];
    for (j, (o, &v)) in q.iter_mut().zip(x).enumerate() {
        // The clamp only guards rounding at the edge (|v·id| <= 127 up to one ulp);
        // a NaN casts to 0.
        let a = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        *o = a;
        s16[j / 16] += a as i32;
    }
    block_scalars(d, s16)
}

fn block_scalars(d: f32, s16: [i32; 2]) -> ActBlock {
    ActBlock {
        d,
        a32: d * (s16[0] + s16[1]) as f32,
        a16: [d * s16[0] as f32, d * s16[1] as f32],
        s16,
    }
}

/// [`quantize_block`] in AVX2 registers (it was a libm `roundf` call per element, 5 %
/// of a one-stream Q4_1 decode): the same max, the same products, rounding to nearest
/// even (`vroundps`), NaN to 0, so the same bits.
///
/// # Safety
/// AVX2 and FMA available; `x` and `q` hold exactly [`QB`] (32) elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block_avx2(x: &[f32], q: &mut [i8]) -> ActBlock {
    use std::arch::x86_64::*;
    debug_assert!(x.len() == QB && q.len() == QB);
    // SAFETY: x holds 32 f32s: four unaligned 8-lane loads.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // maxps returns its second operand when either is NaN: NaNs are skipped, as
    // f32::max does in the scalar fold.
    let mut m = _mm256_setzero_ps();
    for vi in v {
        m = _mm256_max_ps(_mm256_and_ps(vi, abs_mask), m);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds the 8 floats stored.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let amax = lanes.iter().fold(0.0f32, |a, &l| a.max(l));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let ints: [__m256i; 4] = std::array::from_fn(|i| {
        let t = _mm256_mul_ps(v[i], idv);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        // NaN lanes to +0 (the scalar cast's 0), then the clamp.
        let t = _mm256_and_ps(t, _mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
        _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi))
    });
    let hsum = |a: __m256i| {
        let mut l = [0i32; 8];
        // SAFETY: 8 i32 lanes into an 8-element array.
        unsafe { _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, a) };
        l.iter().sum::<i32>()
    };
    let s16 = [
        hsum(_mm256_add_epi32(ints[0], ints[1])),
        hsum(_mm256_add_epi32(ints[2], ints[3])),
    ];
    // i32 -> i16 -> i8 (values are within [-127, 127]: no saturation), then undo the
    // packs' per-128-bit-lane interleave.
    let p01 = _mm256_packs_epi32(ints[0], ints[1]);
    let p23 = _mm256_packs_epi32(ints[2], ints[3]);
    let p = _mm256_packs_epi16(p01, p23);
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: q holds 32 bytes.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, p) };
    block_scalars(d, s16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn both(x: &[f32]) -> ((Vec<i8>, ActBlock), (Vec<i8>, ActBlock)) {
        let mut q = vec![0i8; QB];
        let b = quantize_block(x, &mut q);
        let mut qv = vec![0i8; QB];
        #[cfg(target_arch = "x86_64")]
        let bv = if crate::Isa::detect().avx2_fma() {
            // SAFETY: AVX2 checked; 32 elements each.
            unsafe { quantize_block_avx2(x, &mut qv) }
        } else {
            quantize_block(x, &mut qv)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let bv = quantize_block(x, &mut qv);
        ((q, b), (qv, bv))
    }

    fn special() -> impl Strategy<Value = f32> {
        prop_oneof![
            6 => -1e3f32..1e3,
            1 => Just(0.0f32),
            1 => Just(-0.0f32),
            1 => Just(f32::NAN),
            1 => (-4i32..4).prop_map(|k| k as f32 * 0.5), // ties after scaling
            1 => Just(f32::MIN_POSITIVE),
        ]
    }

    proptest! {
        #[test]
        fn avx2_quantization_is_the_scalar_one_bit_for_bit(
            x in proptest::collection::vec(special(), QB)
        ) {
            let ((q, b), (qv, bv)) = both(&x);
            prop_assert_eq!(q, qv);
            prop_assert_eq!(b.d.to_bits(), bv.d.to_bits());
            prop_assert_eq!(b.s16, bv.s16);
            prop_assert_eq!(b.a32.to_bits(), bv.a32.to_bits());
        }
    }

    #[test]
    fn ties_go_to_even_and_nan_to_zero() {
        // amax 127 gives d = 1: the values are the products themselves.
        let mut x = [0.0f32; QB];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        x[3] = f32::NAN;
        x[4] = 0.5;
        let ((q, b), (qv, _)) = both(&x);
        assert_eq!(b.d, 1.0);
        assert_eq!(&q[..5], &[127, 2, -4, 0, 0]);
        assert_eq!(q, qv);
    }
}
