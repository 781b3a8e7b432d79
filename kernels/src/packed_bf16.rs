//! `out = x · wᵀ` with bf16 weights packed into column panels: the `--dtype bf16`
//! serving path, the broadcast-form GEMM of [`crate::packed`] on `vdpbf16ps`.
//!
//! Panels hold [`PANEL`] rows of `w` (output columns); line `q` of a panel holds,
//! per column `c`, the pair `(w[c][2q], w[c][2q+1])` as two bf16 in one 32-bit
//! lane (zero past `k` and past `n`). `vdpbf16ps` multiplies such a line with a
//! broadcast pair `(x[i][2q], x[i][2q+1])` (rounded to bf16, nearest even) and adds
//! both products to the f32 accumulator lane: twice the multiply-adds per
//! instruction of f32 and half the bytes per weight. Lines are as long as the f32
//! kernel's (256 bytes), so the same 6 × 64 register tile and driver serve both.
//!
//! As in the f32 kernel, each output is one lane accumulated over `q` in order,
//! so a row's result does not depend on the rows it is batched with.
//!
//! Without AVX-512 BF16 (Intel before Cooper Lake, AVX2-only CPUs) the same
//! panels run through fallbacks that widen each weight to f32 in registers
//! (see [`bf16_path`](crate::dispatch::bf16_path)): never the per-element
//! scalar loop, which ran ~10x slower than f32 on such a CPU.

use crate::error::{check_len, KernelError};
use crate::packed::{check_row, run_panels, PanelTask, Prefetch, MR, PANEL};
use half::bf16;

/// One panel line: `PANEL` pairs of bf16, cache-line aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u32; PANEL]);

/// A weight matrix `[n, k]` rounded to bf16 and packed for [`matmul_packed_bf16`].
#[derive(Clone)]
pub struct PackedMatrixBf16 {
    n: usize,
    k: usize,
    /// `panels * k.div_ceil(2)` lines.
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrixBf16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrixBf16")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish_non_exhaustive()
    }
}

impl PackedMatrixBf16 {
    /// Rounds `w[n, k]` (row-major f32) to bf16 (nearest even) and packs it.
    pub fn pack(w: &[f32], n: usize, k: usize) -> Result<Self, KernelError> {
        check_len("w", w.len(), n * k)?;
        let (panels, pairs) = (n.div_ceil(PANEL), k.div_ceil(2));
        let mut lines = vec![Line([0; PANEL]); panels * pairs];
        for (j, row) in w.chunks_exact(k.max(1)).enumerate().take(n) {
            let (panel, col) = (j / PANEL, j % PANEL);
            for (p, &v) in row.iter().enumerate() {
                let bits = bf16::from_f32(v).to_bits() as u32;
                lines[panel * pairs + p / 2].0[col] |= bits << (16 * (p % 2));
            }
        }
        Ok(PackedMatrixBf16 { n, k, lines })
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Row `r` of `w` as stored (bf16 widened to f32, exactly) into `dst` (`k`
    /// elements): the embedding lookup of a table tied to a packed LM head.
    pub fn row_into(&self, r: usize, dst: &mut [f32]) -> Result<(), KernelError> {
        check_row(r, self.n, self.k, dst)?;
        let pairs = self.k.div_ceil(2);
        let (panel, col) = (r / PANEL, r % PANEL);
        for (p, d) in dst.iter_mut().enumerate() {
            let lane = self.lines[panel * pairs + p / 2].0[col];
            *d = bf16::from_bits((lane >> (16 * (p % 2))) as u16).to_f32();
        }
        Ok(())
    }
}

/// `out[m, n] = x[m, k] · wᵀ` for a packed bf16 `w`, products accumulated in f32.
/// With AVX-512 BF16 `x` is rounded to bf16 as it is used (`vdpbf16ps`); the
/// fallbacks ([`crate::dispatch::GemmPath`]) widen the weights to f32 instead (a 16-bit shift) and
/// multiply them with `x` as it is, at the f32 kernel's FMA count on half its
/// bytes, so no CPU runs bf16 slower than f32.
pub fn matmul_packed_bf16(
    x: &[f32],
    w: &PackedMatrixBf16,
    out: &mut [f32],
    m: usize,
) -> Result<(), KernelError> {
    let path = crate::dispatch::bf16_path();
    run_panels(x, out, m, w.k, w.n, &w.lines, w.k.div_ceil(2), |t| {
        // SAFETY: `path` comes from `Isa::detect`; run_panels checked the shapes
        // and hands out tasks whose `out` is valid for `rows` x `cols` at `ldo`
        // (disjoint blocks of `out`).
        unsafe { block_rows(path, t) }
    })
}

/// Pairs of `x` converted per chunk (a stack buffer of `MR` rows).
const CHUNK_PAIRS: usize = 256;

/// One [`PanelTask`] of bf16 lines.
///
/// # Safety
/// `path` runs on this CPU; the task's `out` is valid for `rows` rows of `cols`
/// elements at stride `ldo`.
unsafe fn block_rows(path: crate::GemmPath, t: PanelTask<'_, Line>) {
    use crate::GemmPath;
    let PanelTask {
        x,
        rows,
        k,
        lines,
        next,
        out,
        ldo,
        cols,
    } = t;
    #[cfg(target_arch = "x86_64")]
    if matches!(path, GemmPath::Avx512 | GemmPath::Avx512Bf16) {
        let tiles = rows.div_ceil(MR);
        let lp = lines.as_ptr() as *const u32;
        let mut i = 0;
        while i < rows {
            let h = MR.min(rows - i);
            let xr = &x[i * k..(i + h) * k];
            // SAFETY: i < rows: row i of `out` at `ldo` (the caller's contract).
            let o = unsafe { out.add(i * ldo) };
            let pf = Prefetch::share(next, i / MR, tiles);
            // SAFETY: AVX-512 F/BW/BF16 are available (the caller's contract for
            // `path`; F only for `ukr_widen`); `xr` holds h rows of k floats; `lp` points at the panel's
            // k.div_ceil(2) `Line`s (64-byte aligned by `repr(align(64))`); `o` has
            // h rows of `cols` at `ldo` (caller's contract); `pf` lies inside `next`.
            unsafe {
                if path == GemmPath::Avx512Bf16 {
                    match h {
                        6 => ukr::<6>(xr, k, lp, o, ldo, cols, pf),
                        5 => ukr::<5>(xr, k, lp, o, ldo, cols, pf),
                        4 => ukr::<4>(xr, k, lp, o, ldo, cols, pf),
                        3 => ukr::<3>(xr, k, lp, o, ldo, cols, pf),
                        2 => ukr::<2>(xr, k, lp, o, ldo, cols, pf),
                        _ => ukr::<1>(xr, k, lp, o, ldo, cols, pf),
                    }
                } else {
                    // AVX-512 F only: at most 4 rows, as each line widens to 8
                    // vectors (4 x 4 accumulators + 8 weights + a broadcast).
                    match h {
                        6 => {
                            ukr_widen::<4>(xr, k, lp, o, ldo, cols, pf);
                            ukr_widen::<2>(&xr[4 * k..], k, lp, o.add(4 * ldo), ldo, cols, pf);
                        }
                        5 => {
                            ukr_widen::<4>(xr, k, lp, o, ldo, cols, pf);
                            ukr_widen::<1>(&xr[4 * k..], k, lp, o.add(4 * ldo), ldo, cols, pf);
                        }
                        4 => ukr_widen::<4>(xr, k, lp, o, ldo, cols, pf),
                        3 => ukr_widen::<3>(xr, k, lp, o, ldo, cols, pf),
                        2 => ukr_widen::<2>(xr, k, lp, o, ldo, cols, pf),
                        _ => ukr_widen::<1>(xr, k, lp, o, ldo, cols, pf),
                    }
                }
            }
            i += h;
        }
        return;
    }
    let _ = next;
    #[cfg(target_arch = "x86_64")]
    if path == GemmPath::Avx2 {
        // SAFETY: AVX2 + FMA available (`path`); the rest is the caller's contract.
        return unsafe { widen_rows_avx2(t) };
    }
    // SAFETY: the caller's contract.
    unsafe { widen_rows::<false>(t) }
}

/// # Safety
/// As [`block_rows`], and AVX2 + FMA available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn widen_rows_avx2(t: PanelTask<'_, Line>) {
    // SAFETY: the caller's contract.
    unsafe { widen_rows::<true>(t) }
}

/// Without AVX-512: weights widened to f32 (bf16 is the top half of an f32) and
/// multiplied with `x` as it is; one accumulator per output, summed over `k` in
/// order, left to the compiler's vectoriser (8-wide FMAs under AVX2). `FMA`:
/// fused multiply-adds, only where the CPU has them.
///
/// # Safety
/// As [`block_rows`].
#[inline(always)]
unsafe fn widen_rows<const FMA: bool>(t: PanelTask<'_, Line>) {
    let k = t.k;
    for i in 0..t.rows {
        let x = &t.x[i * k..(i + 1) * k];
        let mut acc = [0.0f32; PANEL];
        for (q, line) in t.lines.iter().enumerate() {
            let a0 = x[2 * q];
            let a1 = x.get(2 * q + 1).copied().unwrap_or(0.0);
            for (s, &lane) in acc.iter_mut().zip(&line.0) {
                let (w0, w1) = (
                    f32::from_bits(lane << 16),
                    f32::from_bits(lane & 0xFFFF_0000),
                );
                *s = if FMA {
                    a1.mul_add(w1, a0.mul_add(w0, *s))
                } else {
                    *s + a0 * w0 + a1 * w1
                };
            }
        }
        // SAFETY: the caller's contract: row i of `out` has `cols` elements.
        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), t.out.add(i * t.ldo), t.cols) };
    }
}

/// [`ukr`] on AVX-512 F without BF16: each line's pairs widened to two f32
/// vectors (shift, mask) and multiplied with `x` unrounded, two FMAs per pair.
///
/// # Safety
/// AVX-512 F available; otherwise as [`ukr`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)]
unsafe fn ukr_widen<const H: usize>(
    x: &[f32],
    k: usize,
    lp: *const u32,
    out: *mut f32,
    ldo: usize,
    cols: usize,
    pf: Prefetch,
) {
    use std::arch::x86_64::*;
    const NV: usize = PANEL / 16;
    let pairs = k.div_ceil(2);
    let mut pf_issued = 0usize;
    let mut acc = [[_mm512_setzero_ps(); NV]; H];
    let hi_mask = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    for q in 0..pairs {
        // SAFETY: `pf` lies inside the next panel (caller's contract).
        unsafe { pf.step(q, pairs, &mut pf_issued) };
        // SAFETY: line q < pairs of the panel at `lp`, 64-byte aligned, PANEL lanes.
        let line = unsafe { lp.add(q * PANEL) };
        let mut w0 = [_mm512_setzero_ps(); NV];
        let mut w1 = [_mm512_setzero_ps(); NV];
        for v in 0..NV {
            // SAFETY: as above; each vector is 16 of the line's PANEL lanes.
            let b = unsafe { _mm512_load_si512(line.add(v * 16) as *const _) };
            w0[v] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
            w1[v] = _mm512_castsi512_ps(_mm512_and_si512(b, hi_mask));
        }
        for i in 0..H {
            let a0 = _mm512_set1_ps(x[i * k + 2 * q]);
            let a1 = _mm512_set1_ps(if 2 * q + 1 < k {
                x[i * k + 2 * q + 1]
            } else {
                0.0
            });
            for v in 0..NV {
                acc[i][v] = _mm512_fmadd_ps(a1, w1[v], _mm512_fmadd_ps(a0, w0[v], acc[i][v]));
            }
        }
    }
    for i in 0..H {
        // SAFETY: `out` has H rows of `cols` at `ldo` (caller's contract).
        let o = unsafe { out.add(i * ldo) };
        for v in 0..NV {
            let c0 = v * 16;
            if c0 < cols {
                let mask = if c0 + 16 <= cols {
                    u16::MAX
                } else {
                    ((1u32 << (cols - c0)) - 1) as u16
                };
                // SAFETY: the mask keeps the store inside the row's `cols`.
                unsafe { _mm512_mask_storeu_ps(o.add(c0), mask, acc[i][v]) };
            }
        }
    }
}

/// `H` rows of `x` (row stride `k`) times one panel (`k.div_ceil(2)` lines at `lp`).
///
/// # Safety
/// AVX-512 F/BW/BF16 available; `x` holds `H` rows of `k`; `lp` has the panel's
/// 64-byte aligned lines; `out` has `H` rows of `cols` at stride `ldo`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::needless_range_loop)]
unsafe fn ukr<const H: usize>(
    x: &[f32],
    k: usize,
    lp: *const u32,
    out: *mut f32,
    ldo: usize,
    cols: usize,
    pf: Prefetch,
) {
    // SAFETY: every unsafe operation below is covered by this function's `# Safety`
    // contract, which its callers uphold.
    unsafe {
        use std::arch::x86_64::*;
        const NV: usize = PANEL / 16;
        let pairs = k.div_ceil(2);
        let mut pf_issued = 0usize;
        let mut acc = [[_mm512_setzero_ps(); NV]; H];
        // x rows as bf16 pairs (u32 lanes), a chunk at a time.
        let mut xb = [[0u32; CHUNK_PAIRS]; H];
        let mut q0 = 0;
        while q0 < pairs {
            let qn = CHUNK_PAIRS.min(pairs - q0);
            for i in 0..H {
                let row = &x[i * k..(i + 1) * k];
                let (p0, p1) = (2 * q0, (2 * (q0 + qn)).min(k));
                convert_pairs(&row[p0..p1], &mut xb[i][..qn]);
            }
            for q in 0..qn {
                pf.step(q0 + q, pairs, &mut pf_issued);
                let line = lp.add((q0 + q) * PANEL);
                let mut b = [_mm512_setzero_si512(); NV];
                for v in 0..NV {
                    b[v] = _mm512_load_si512(line.add(v * 16) as *const _);
                }
                for i in 0..H {
                    let a = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        xb[i][q] as i32,
                    ));
                    for v in 0..NV {
                        acc[i][v] = _mm512_dpbf16_ps(
                            acc[i][v],
                            a,
                            std::mem::transmute::<__m512i, __m512bh>(b[v]),
                        );
                    }
                }
            }
            q0 += qn;
        }
        for i in 0..H {
            let o = out.add(i * ldo);
            for v in 0..NV {
                let c0 = v * 16;
                if c0 + 16 <= cols {
                    _mm512_storeu_ps(o.add(c0), acc[i][v]);
                } else if c0 < cols {
                    let mask = ((1u32 << (cols - c0)) - 1) as u16;
                    _mm512_mask_storeu_ps(o.add(c0), mask, acc[i][v]);
                }
            }
        }
    }
}

/// `src` (up to `2 * dst.len()` floats, an odd tail padded with 0) to bf16 pairs,
/// nearest even: 32 floats per `vcvtne2ps2bf16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn convert_pairs(src: &[f32], dst: &mut [u32]) {
    // SAFETY: every unsafe operation below is covered by this function's `# Safety`
    // contract, which its callers uphold.
    unsafe {
        use std::arch::x86_64::*;
        let mut p = 0;
        while p + 32 <= src.len() {
            let lo = _mm512_loadu_ps(src.as_ptr().add(p));
            let hi = _mm512_loadu_ps(src.as_ptr().add(p + 16));
            // The second argument fills the low 16 bf16 lanes: pairs stay in order.
            let v = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(dst.as_mut_ptr().add(p / 2) as *mut _, v);
            p += 32;
        }
        while p < src.len() {
            let lo = half::bf16::from_f32(src[p]).to_bits() as u32;
            let hi = src
                .get(p + 1)
                .map_or(0, |&v| half::bf16::from_f32(v).to_bits() as u32);
            dst[p / 2] = lo | (hi << 16);
            p += 2;
        }
    }
}
