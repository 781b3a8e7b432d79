//! The unpacked matmul baseline (`pagoda_benches::unpacked`): every path against
//! `pagoda_kernels::matmul_t_ref`.
//!
//! Tolerance: within 1e-4 relative to Σ|x·w| (the scale of the dot product —
//! elementwise relative error is meaningless under cancellation); bf16 weights
//! within 5e-3.

use pagoda_benches::unpacked::*;
use pagoda_kernels::{matmul_t_ref, KernelError};
use proptest::prelude::*;

fn vals(n: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-2.0f32..2.0, n)
}

fn matmul_case() -> impl Strategy<Value = (usize, usize, usize, Vec<f32>, Vec<f32>)> {
    (prop_oneof![1usize..=5, 1usize..40], 1usize..70, 1usize..150)
        .prop_flat_map(|(m, k, n)| (Just(m), Just(k), Just(n), vals(m * k), vals(n * k)))
}

fn check_matmul(
    path: MatmulPath,
    m: usize,
    k: usize,
    n: usize,
    x: &[f32],
    w: &[f32],
) -> Result<(), TestCaseError> {
    let mut out = vec![f32::NAN; m * n];
    matmul_t_with(path, x, w, &mut out, m, k, n).unwrap();
    let mut reference = vec![0.0; m * n];
    matmul_t_ref(x, w, &mut reference, m, k, n).unwrap();
    for i in 0..m {
        for j in 0..n {
            let scale: f64 = (0..k)
                .map(|c| (x[i * k + c] as f64 * w[j * k + c] as f64).abs())
                .sum();
            let (a, b) = (out[i * n + j], reference[i * n + j]);
            prop_assert!(
                ((a - b) as f64).abs() <= 1e-4 * scale + 1e-6,
                "{path:?} m={m} k={k} n={n} at ({i},{j}): {a} vs {b} (scale {scale})"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matmul_paths_match_reference((m, k, n, x, w) in matmul_case()) {
        check_matmul(MatmulPath::Auto, m, k, n, &x, &w)?;
        check_matmul(MatmulPath::Gemm, m, k, n, &x, &w)?;
        check_matmul(MatmulPath::Gemv, m, k, n, &x, &w)?;
        check_matmul(MatmulPath::Avx512Gemv, m, k, n, &x, &w)?;
        check_matmul(MatmulPath::Avx512Gemm, m, k, n, &x, &w)?;
    }
}

#[test]
fn shape_errors_are_errors_not_panics() {
    let mut out = vec![0.0; 4];
    assert!(matches!(
        matmul_t(&[1.0; 3], &[1.0; 4], &mut out, 2, 2, 2),
        Err(KernelError::ShapeMismatch { name: "x", .. })
    ));
}

#[test]
fn large_shapes_take_the_parallel_paths() {
    // Big enough to cross every parallel threshold; compared to the reference.
    let (m, k, n) = (67, 300, 513);
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
        .collect();
    let paths = [
        MatmulPath::Auto,
        MatmulPath::Gemm,
        MatmulPath::Gemv,
        MatmulPath::Avx512Gemv,
        MatmulPath::Avx512Gemm,
    ];
    for mm in [1, 3, 8, 9, m] {
        for path in paths {
            let mut out = vec![0.0; mm * n];
            let mut r = vec![0.0; mm * n];
            matmul_t_with(path, &x[..mm * k], &w, &mut out, mm, k, n).unwrap();
            matmul_t_ref(&x[..mm * k], &w, &mut r, mm, k, n).unwrap();
            for (a, b) in out.iter().zip(&r) {
                assert!(
                    (a - b).abs() <= 1e-4 * (k as f32),
                    "{path:?} m={mm}: {a} vs {b}"
                );
            }
        }
    }
}

/// bf16 weights: every path against the f64 reference over the exact bf16 weights.
/// Tolerance 5e-3 · Σ|x·w| + 1e-6: the AVX-512 paths round `x` to bf16 (relative
/// error ≤ 2⁻⁹ per product) and accumulate in f32.
fn check_matmul_bf16(
    path: Bf16Path,
    m: usize,
    k: usize,
    n: usize,
    x: &[f32],
    w: &[half::bf16],
) -> Result<(), TestCaseError> {
    let mut out = vec![f32::NAN; m * n];
    matmul_t_bf16_with(path, x, w, &mut out, m, k, n).unwrap();
    let mut reference = vec![0.0; m * n];
    matmul_t_bf16_ref(x, w, &mut reference, m, k, n).unwrap();
    for i in 0..m {
        for j in 0..n {
            let scale: f64 = (0..k)
                .map(|c| (x[i * k + c] as f64 * w[j * k + c].to_f64()).abs())
                .sum();
            let (a, b) = (out[i * n + j], reference[i * n + j]);
            prop_assert!(
                ((a - b) as f64).abs() <= 5e-3 * scale + 1e-6,
                "{path:?} m={m} k={k} n={n} at ({i},{j}): {a} vs {b} (scale {scale})"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bf16_matmul_paths_match_reference((m, k, n, x, w) in matmul_case()) {
        let w = to_bf16(&w);
        for path in [Bf16Path::Auto, Bf16Path::Portable, Bf16Path::Avx512Gemv, Bf16Path::Avx512Gemm] {
            check_matmul_bf16(path, m, k, n, &x, &w)?;
        }
    }
}

#[test]
fn bf16_large_shapes_take_the_parallel_paths() {
    let (m, k, n) = (67, 300, 513);
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
        .collect();
    let w = to_bf16(&w);
    for mm in [1, 3, 8, 9, m] {
        for path in [
            Bf16Path::Auto,
            Bf16Path::Portable,
            Bf16Path::Avx512Gemv,
            Bf16Path::Avx512Gemm,
        ] {
            let mut out = vec![0.0; mm * n];
            let mut r = vec![0.0; mm * n];
            matmul_t_bf16_with(path, &x[..mm * k], &w, &mut out, mm, k, n).unwrap();
            matmul_t_bf16_ref(&x[..mm * k], &w, &mut r, mm, k, n).unwrap();
            for (a, b) in out.iter().zip(&r) {
                assert!(
                    (a - b).abs() <= 5e-3 * (k as f32),
                    "{path:?} m={mm}: {a} vs {b}"
                );
            }
        }
    }
    assert!(matches!(
        matmul_t_bf16(&[1.0; 3], &w[..4], &mut [0.0; 4], 2, 2, 2),
        Err(KernelError::ShapeMismatch { name: "x", .. })
    ));
}
