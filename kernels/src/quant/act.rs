//! Activations quantized to int8 per block of 32, the `x` side of the quantized
//! matmul: `x ≈ d·a` with `d = max|x_block| / 127` and `a = round(x / d)` in
//! `[-127, 127]`, so each element is off by at most `d/2`. Per block it also keeps
//! the sums the offset term of the weights needs (`d·Σa` over 32 and over each
//! half, and the integer half sums for the AVX2 path).
//!
//! Each row is quantized alone, so a row's integers never depend on the batch.

use super::QB;
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
    /// `m * k` int8.
    q: Vec<i8>,
    /// `m * k / QB` blocks.
    blocks: Vec<ActBlock>,
}

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
        self.m = m;
        self.k = k;
        self.q.resize(m * k, 0);
        self.blocks.resize(m * k / QB, ActBlock::default());
        for ((xb, qb), blk) in x
            .chunks_exact(QB)
            .zip(self.q.chunks_exact_mut(QB))
            .zip(&mut self.blocks)
        {
            *blk = quantize_block(xb, qb);
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
        &self.q[i * self.k..(i + 1) * self.k]
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

    pub(crate) fn row_blocks(&self, i: usize) -> &[ActBlock] {
        let kb = self.k / QB;
        &self.blocks[i * kb..(i + 1) * kb]
    }
}

/// One block: `q` gets the int8 values; returns its scalars. A block of zeros
/// (or of non-finite values only) gets `d = 0`.
fn quantize_block(x: &[f32], q: &mut [i8]) -> ActBlock {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut s16 = [0i32; 2];
    for (j, (o, &v)) in q.iter_mut().zip(x).enumerate() {
        // The clamp only guards rounding at the edge (|v·id| <= 127 up to one ulp).
        let a = (v * id).round().clamp(-127.0, 127.0) as i8;
        *o = a;
        s16[j / 16] += a as i32;
    }
    ActBlock {
        d,
        a32: d * (s16[0] + s16[1]) as f32,
        a16: [d * s16[0] as f32, d * s16[1] as f32],
        s16,
    }
}
