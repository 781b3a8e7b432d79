//! `out = x · wᵀ` with bf16 weights (`[n, k]`, `nn.Linear` layout) and f32
//! activations and output: half the bytes of f32 weights for memory-bound decode,
//! twice the multiply rate for prefill.
//!
//! With AVX-512 BF16 the activations are rounded to bf16 as they are loaded (no
//! buffer, so no allocation) and multiplied with `vdpbf16ps`, accumulating in f32,
//! through the same tiles as the f32 kernels (see `avx512.rs`). Elsewhere a
//! portable kernel widens the weights to f32. [`matmul_t_bf16_ref`] is the f64
//! reference (exact bf16 weights, unrounded f32 activations): the AVX-512 paths
//! differ from it by the rounding of `x` to bf16, at most 2⁻⁸ of Σ|x·w|.

use crate::unpacked::{check, trivial};
use half::bf16;
use pagoda_kernels::KernelError;
use rayon::prelude::*;

/// Which implementation [`matmul_t_bf16_with`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Path {
    /// Pick per shape and CPU (what [`matmul_t_bf16`] does).
    Auto,
    /// The portable kernel (weights widened to f32; any CPU).
    Portable,
    /// AVX-512 BF16 GEMV tiles (groups of 8 rows); portable without AVX-512 BF16.
    Avx512Gemv,
    /// AVX-512 BF16 GEMM tiles; portable without AVX-512 BF16.
    Avx512Gemm,
}

/// Rounds to bf16, to nearest even (what the model stores as weights).
pub fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with bf16 `w`, choosing the path.
pub fn matmul_t_bf16(
    x: &[f32],
    w: &[bf16],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    matmul_t_bf16_with(Bf16Path::Auto, x, w, out, m, k, n)
}

/// [`matmul_t_bf16`] with an explicit path (benches and tests compare them).
pub fn matmul_t_bf16_with(
    path: Bf16Path,
    x: &[f32],
    w: &[bf16],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    check(x, w, out, m, k, n)?;
    if trivial(out, m, k, n) {
        return Ok(());
    }
    let avx = pagoda_kernels::Isa::detect().avx512_bf16();
    let path = match path {
        // As for f32 (see matmul.rs): GEMV tiles up to m = 4, GEMM tiles above.
        Bf16Path::Auto if avx && m <= crate::unpacked::AVX512_GEMV_MAX_M => Bf16Path::Avx512Gemv,
        Bf16Path::Auto if avx => Bf16Path::Avx512Gemm,
        Bf16Path::Auto => Bf16Path::Portable,
        _ if !avx => Bf16Path::Portable,
        p => p,
    };
    match path {
        #[cfg(target_arch = "x86_64")]
        Bf16Path::Avx512Gemv | Bf16Path::Avx512Gemm => {
            avx512(path == Bf16Path::Avx512Gemv, x, w, out, m, k, n)
        }
        _ => portable(x, w, out, m, k, n),
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
fn avx512(gemv: bool, x: &[f32], w: &[bf16], out: &mut [f32], m: usize, k: usize, n: usize) {
    use crate::unpacked::avx512::{drive, gemm_tiles_bf16, gemv_tiles, gemv_tiles_bf16, Args};
    let par = crate::unpacked::parallel(m, k, n);
    // bf16 is a transparent u16.
    let wp = w.as_ptr() as *const u16;
    if gemv {
        for i0 in (0..m).step_by(8) {
            let mg = (m - i0).min(8);
            let a = Args {
                x: x[i0 * k..].as_ptr(),
                w: wp,
                out: out[i0 * n..].as_mut_ptr(),
                k,
                n,
            };
            // SAFETY: AVX-512 BF16 detected by the caller; mg rows of x and out
            // from i0, n rows of w (lengths checked); tiles has kernels for mg.
            unsafe { drive(a, mg, &gemv_tiles(mg, gemv_tiles_bf16), 2, par) };
        }
    } else {
        let a = Args {
            x: x.as_ptr(),
            w: wp,
            out: out.as_mut_ptr(),
            k,
            n,
        };
        // SAFETY: as above; the GEMM tiles cover every row count 1..=GEMM_MT.
        unsafe { drive(a, m, &gemm_tiles_bf16(), 2, par) };
    }
}

/// Portable: each task owns a chunk of output columns; weights widened to f32.
fn portable(x: &[f32], w: &[bf16], out: &mut [f32], m: usize, k: usize, n: usize) {
    // Parallel over rows of out (each reads all of w): simple, fine for a fallback.
    let body = |(i, o): (usize, &mut [f32])| {
        let xr = &x[i * k..(i + 1) * k];
        for (j, o) in o.iter_mut().enumerate() {
            let wr = &w[j * k..(j + 1) * k];
            let mut acc = [0.0f32; 8];
            let full = k / 8 * 8;
            for c in (0..full).step_by(8) {
                for l in 0..8 {
                    acc[l] += xr[c + l] * wr[c + l].to_f32();
                }
            }
            let mut s: f32 = acc.iter().sum();
            for c in full..k {
                s += xr[c] * wr[c].to_f32();
            }
            *o = s;
        }
    };
    if crate::unpacked::parallel(m, k, n) {
        out.par_chunks_mut(n).enumerate().for_each(body);
    } else {
        out.chunks_mut(n).enumerate().for_each(body);
    }
}

/// Slow reference: f64 sums of f32 `x` times the exact bf16 weights.
pub fn matmul_t_bf16_ref(
    x: &[f32],
    w: &[bf16],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    check(x, w, out, m, k, n)?;
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for c in 0..k {
                s += x[i * k + c] as f64 * w[j * k + c].to_f64();
            }
            out[i * n + j] = s as f32;
        }
    }
    Ok(())
}
