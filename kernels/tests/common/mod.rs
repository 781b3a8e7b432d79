//! Helpers shared by the matmul test binaries.

#![allow(dead_code)] // each test binary uses a subset

use pagoda_kernels::matmul_t_ref;

/// `out` against the f64 product of `x` and `w` (pass the bf16-rounded operands for
/// a bf16 kernel): each element within 1e-4 of Σ|x·w| + 1e-6 (elementwise relative
/// error is meaningless under cancellation). The first miss, described.
pub fn check_ref(
    out: &[f32],
    x: &[f32],
    w: &[f32],
    (m, k, n): (usize, usize, usize),
) -> Result<(), String> {
    let mut reference = vec![0.0; m * n];
    matmul_t_ref(x, w, &mut reference, m, k, n).map_err(|e| e.to_string())?;
    for i in 0..m {
        for j in 0..n {
            let scale: f64 = (0..k)
                .map(|c| (x[i * k + c] as f64 * w[j * k + c] as f64).abs())
                .sum();
            let (a, b) = (out[i * n + j], reference[i * n + j]);
            if ((a - b) as f64).abs() > 1e-4 * scale + 1e-6 {
                return Err(format!(
                    "m={m} k={k} n={n} at ({i},{j}): {a} vs {b} (scale {scale})"
                ));
            }
        }
    }
    Ok(())
}

/// Deterministic operands for fixed-shape tests.
pub fn fixed(m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..m * k)
        .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
        .collect();
    let w = (0..n * k)
        .map(|i| ((i * 3) % 17) as f32 * 0.01 - 0.08)
        .collect();
    (x, w)
}

/// bf16 rounding as the kernels do it (nearest even).
pub fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}

/// `x` as the bf16 GEMM multiplies it on this CPU: rounded to bf16 by
/// `vdpbf16ps`, as it is on the fallbacks (which widen the weights instead).
pub fn bf16_x(x: &[f32]) -> Vec<f32> {
    if pagoda_kernels::gemm_paths().bf16 == pagoda_kernels::GemmPath::Avx512Bf16 {
        round_bf16(x)
    } else {
        x.to_vec()
    }
}
