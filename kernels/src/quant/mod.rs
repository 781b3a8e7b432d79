//! Quantized linear layers: `out = x · wᵀ` with `w` kept at the bits of its GGUF
//! file and `x` quantized to int8 per block of 32 on the fly.
//!
//! **Storage.** Every supported GGUF format (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K;
//! see [`QuantFormat`]) is repacked at load, bit for bit and without widening, into
//! its [`Storage`] kind. All share one formula: each weight is an unsigned integer
//! `u` (4, 5, 6 or 8 bits) with a per-sub-block scale `s` and offset `mn`,
//! `w = s·u + mn` (Q4_0: `mn = -8s`; Q8_0: `u = q + 128`, `mn = -128s`; Q4_K and
//! Q5_K: `s = d·sc`, `mn = -(dmin·m)`; Q6_K: its raw 6-bit `u`, `s = d·sc`,
//! `mn = -32s`, sub-blocks of 16). The kernels derive `s` and `mn` from the
//! stored fields (f16 super-block scales, 6-bit sub-block scales as u8) with the
//! same f32 operations the GGUF dequantizer uses, so the values are those of the
//! file exactly. Rows are grouped into panels of [`QP`] = 16 (one 16-lane vector
//! of outputs); a panel holds the scale fields of every unit as 16-lane vectors,
//! then the integers in groups of 4 elements per lane (`vpdpbusd`'s shape): the
//! broadcast form of `crate::packed`, with no horizontal sums.
//!
//! **Arithmetic.** With `x ≈ d·a` (`a` int8 per block of 32, see [`QuantActs`]),
//! `Σ w·x ≈ Σ_blocks (s·d)·Σ u·a + mn·(d·Σ a)`. The integer sums are exact on every
//! path (`vpdpbusd` on AVX-512 VNNI, `vpmaddubsw`/`vpmaddwd` on AVX2, plain
//! integers in the portable code) and the float steps are the same fused
//! multiply-adds in the same order, so all three paths give bit-identical
//! results, and a row's result never depends on the rows beside it.
//! The only error against the f32 path on the same (dequantized) weights is the
//! activation rounding: at most `d/2 = max|x_block|/254` per element.

mod act;
mod layout;
mod matrix;
mod pack;
mod portable;
#[cfg(target_arch = "x86_64")]
mod rows;
mod tile;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use act::QuantActs;
pub use layout::{QuantFormat, Storage, QB, QP};
pub use matrix::QuantMatrix;
pub use tile::{QuantKernel, Q5K_VNNI_ENV};

use crate::error::{check_len, KernelError};
use crate::matmul::OutPtr;
use tile::{Tile, MAX_PASS_ROWS};

/// `out[m, n] = x[m, k] · wᵀ`: quantizes `x` (into a per-thread buffer reused
/// across calls) and runs [`matmul_quant_acts`] with the detected kernel.
pub fn matmul_quant(
    x: &[f32],
    w: &QuantMatrix,
    out: &mut [f32],
    m: usize,
) -> Result<(), KernelError> {
    matmul_quant_fused(x, std::slice::from_ref(w), out, m)
}

/// [`matmul_quant`] for a matrix stored as consecutive row ranges `parts` (a
/// fused projection whose parts have different formats): `x` is quantized once,
/// each part writes its columns of `out[m, Σ n]`.
pub fn matmul_quant_fused(
    x: &[f32],
    parts: &[QuantMatrix],
    out: &mut [f32],
    m: usize,
) -> Result<(), KernelError> {
    thread_local! {
        static ACTS: std::cell::RefCell<QuantActs> = std::cell::RefCell::new(QuantActs::default());
    }
    let n: usize = parts.iter().map(|p| p.n).sum();
    let k = parts.first().map_or(0, |p| p.k);
    check_len("out", out.len(), m * n)?;
    if let Some(p) = parts.iter().find(|p| p.k != k) {
        return Err(KernelError::ShapeMismatch {
            name: "parts",
            expected: k,
            actual: p.k,
        });
    }
    if m == 0 {
        return Ok(());
    }
    let kernel = QuantKernel::detect();
    ACTS.with_borrow_mut(|acts| {
        acts.quantize(x, m, k)?;
        let mut col = 0;
        for p in parts {
            // Rows at stride n from column `col`: the last row ends at col + p.n.
            let end = (m - 1) * n + col + p.n;
            matmul_quant_acts(acts, p, &mut out[col..end], n, kernel)?;
            col += p.n;
        }
        Ok(())
    })
}

/// Most rows of activations per register-kernel call (each row's arithmetic is the
/// same whatever the tile height, so this is a speed choice only); longer runs of
/// rows go to `rows` on x86, 4 at a time in the portable kernel.
fn tile_rows(kernel: QuantKernel) -> usize {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        QuantKernel::Avx512Vnni => x86::MR_VNNI,
        #[cfg(target_arch = "x86_64")]
        QuantKernel::Avx2 => x86::MR_AVX2,
        _ => 4,
    }
}

/// Rows per pass for rows of `k` elements: a pass's int8 rows and block scalars
/// (`h · k · (1 + 24/32)` bytes) are re-read for every panel, so they stay within
/// about a quarter of a 2 MiB L2.
fn pass_rows(k: usize) -> usize {
    (256 * 1024 / k.max(1)).clamp(8, MAX_PASS_ROWS)
}

/// Below this many multiply-adds a call runs on the calling thread only.
const PARALLEL_MIN_MACS: usize = 1 << 16;

/// `out[i * ldo + j] = acts[i] · w[j]` for `j < w.n()`, with `kernel` (refused when
/// this CPU cannot run it). `ldo >= w.n()` lets several matrices write side by side
/// into one output (a fused projection whose parts have different formats).
pub fn matmul_quant_acts(
    acts: &QuantActs,
    w: &QuantMatrix,
    out: &mut [f32],
    ldo: usize,
    kernel: QuantKernel,
) -> Result<(), KernelError> {
    let (m, k, n) = (acts.m(), w.k, w.n);
    if acts.k() != k {
        return Err(KernelError::ShapeMismatch {
            name: "acts",
            expected: k,
            actual: acts.k(),
        });
    }
    if m > 0 && (ldo < n || out.len() < (m - 1) * ldo + n) {
        return Err(KernelError::InvalidArgument {
            name: "out",
            message: format!("{} elements at stride {ldo} for {m} x {n}", out.len()),
        });
    }
    if !kernel.available() {
        return Err(KernelError::InvalidArgument {
            name: "kernel",
            message: format!("{} is not available on this CPU", kernel.name()),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        for i in 0..m {
            out[i * ldo..i * ldo + n].fill(0.0);
        }
        return Ok(());
    }
    let panels = n.div_ceil(QP);
    let threads = rayon::current_num_threads();
    let parallel = threads > 1 && m * k * n >= PARALLEL_MIN_MACS;
    let per_task = if parallel {
        panels.div_ceil(threads * 8).max(1)
    } else {
        panels
    };
    let kernel = tile::verified_for(kernel, w.layout.storage);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let mr = tile_rows(kernel);
    // Past the register kernel's tile, the x86 kernels run passes of many rows (each
    // block decoded once per pass); the portable one takes the rest in one call when
    // it fits, else in calls of 4 rows.
    let pass = cfg!(target_arch = "x86_64") && kernel != QuantKernel::Portable;
    // Rows a sweep over the panels covers: one pass's worth, so that its activations
    // stay in L2 while every panel is multiplied into them. A sweep of all rows
    // re-read them from L3 or DRAM for every panel (a 1B prefill step of 900 rows:
    // 3 MB of activations for each of gate_up's 1024 panels), which made big steps
    // ~1.5x slower per row than small ones; the panels are re-read once per sweep
    // instead, a small stream beside a pass's arithmetic.
    let sweep = if pass { pass_rows(k).max(mr) } else { m };
    let task = |t: usize, rows: std::ops::Range<usize>| {
        for p in t * per_task..((t + 1) * per_task).min(panels) {
            let cols = QP.min(n - p * QP);
            let recs = w.panel(p);
            let mut r0 = rows.start;
            while r0 < rows.end {
                let rest = rows.end - r0;
                let h = if rest <= mr {
                    rest
                } else if pass {
                    rest.min(pass_rows(k))
                } else {
                    4
                };
                let t = Tile {
                    layout: w.layout,
                    recs,
                    acts,
                    r0,
                    h,
                    // SAFETY: rows r0..r0+h < m and columns p*QP..p*QP+cols < n lie
                    // inside `out` (checked above); tasks write disjoint panels.
                    out: unsafe { out_ptr.get().add(r0 * ldo + p * QP) },
                    ldo,
                    cols,
                };
                // SAFETY: `kernel` is available (checked above); `recs` is the
                // panel of `w.layout` for `k` columns; `t.out` is valid for h rows
                // of `cols` at `ldo`.
                unsafe {
                    if h > mr {
                        run_pass(kernel, t)
                    } else {
                        run_tile(kernel, t)
                    }
                };
                r0 += h;
            }
        }
    };
    let tasks = panels.div_ceil(per_task);
    for r0 in (0..m).step_by(sweep) {
        let rows = r0..(r0 + sweep).min(m);
        if parallel {
            use rayon::prelude::*;
            (0..tasks)
                .into_par_iter()
                .for_each(|t| task(t, rows.clone()));
        } else {
            (0..tasks).for_each(|t| task(t, rows.clone()));
        }
    }
    Ok(())
}

/// A tile of `h <= tile_rows(kernel)` rows.
///
/// # Safety
/// `kernel` is available; `t.recs` is one panel of `t.layout` for `t.acts.k()`
/// columns; `t.out` is valid for `t.h` rows of `t.cols` elements at stride `t.ldo`.
unsafe fn run_tile(kernel: QuantKernel, t: Tile<'_>) {
    #[cfg(target_arch = "x86_64")]
    match kernel {
        QuantKernel::Avx512Vnni => {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { x86::tile_vnni(t) };
        }
        QuantKernel::Avx2 => {
            // SAFETY: the caller's contract, forwarded.
            return unsafe { x86::tile_avx2(t) };
        }
        QuantKernel::Portable => {}
    }
    let _ = kernel;
    // SAFETY: the caller's contract, forwarded.
    unsafe { portable::tile(t) }
}

/// A pass of more rows than `tile_rows(kernel)` (x86 kernels only; elsewhere
/// never called).
///
/// # Safety
/// As [`run_tile`], and `kernel` is not the portable one.
unsafe fn run_pass(kernel: QuantKernel, t: Tile<'_>) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        rows::tile_rows(kernel, t)
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("{} has no pass form ({} rows)", kernel.name(), t.h);
}
