//! The portable (non-AVX-512) paths, forced on with `PAGODA_DISABLE_AVX512=1`, so
//! they are tested on the AVX-512 machines too: packed GEMMs (f32, bf16, int8)
//! against the reference and batch-invariant, no dtype on scalar code, SiLU, argmax and the NaN scan against plain
//! loops. One test per binary: the switch is read once per process.

mod common;

use common::{fixed, round_bf16};
use pagoda_kernels::*;

fn assert_ref(out: &[f32], x: &[f32], w: &[f32], shape: (usize, usize, usize)) {
    common::check_ref(out, x, w, shape).unwrap();
}

#[test]
fn portable_paths_match_references() {
    std::env::set_var("PAGODA_DISABLE_AVX512", "1");
    assert!(!Isa::detect().avx512() && !Isa::detect().avx512_bf16());
    for (m, k, n) in [(1, 5, 3), (7, 33, 70), (13, 576, 130)] {
        let (x, w) = fixed(m, k, n);
        let pw = PackedMatrix::pack(&w, n, k).unwrap();
        let mut out = vec![f32::NAN; m * n];
        matmul_packed(&x, &pw, &mut out, m).unwrap();
        assert_ref(&out, &x, &w, (m, k, n));
        let pb = PackedMatrixBf16::pack(&w, n, k).unwrap();
        let mut outb = vec![f32::NAN; m * n];
        matmul_packed_bf16(&x, &pb, &mut outb, m).unwrap();
        // The fallback widens the bf16 weights and keeps x as it is.
        assert_ref(&outb, &x, &round_bf16(&w), (m, k, n));
        for i in 0..m {
            let mut alone = vec![0.0; n];
            matmul_packed(&x[i * k..(i + 1) * k], &pw, &mut alone, 1).unwrap();
            assert_eq!(&out[i * n..(i + 1) * n], &alone[..], "f32 row {i} of {m}");
            matmul_packed_bf16(&x[i * k..(i + 1) * k], &pb, &mut alone, 1).unwrap();
            assert_eq!(&outb[i * n..(i + 1) * n], &alone[..], "bf16 row {i} of {m}");
        }
    }

    let g: Vec<f32> = (0..300).map(|i| i as f32 * 0.37 - 60.0).collect();
    let u: Vec<f32> = (0..300).map(|i| (i % 7) as f32 - 3.0).collect();
    let (mut a, mut b) = (vec![0.0; 300], vec![0.0; 300]);
    silu_mul(&g, &u, &mut a).unwrap();
    silu_mul_ref(&g, &u, &mut b).unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * y.abs() + 1e-6, "{x} vs {y}");
    }

    let mut row: Vec<f32> = (0..1000).map(|i| ((i * 31) % 997) as f32).collect();
    row[3] = f32::NEG_INFINITY;
    // 31 i = 996 (mod 997) first at i = 804.
    assert_eq!(max_index(&row), (804, 996.0));
    assert_eq!(first_nan_or_inf(&row), None);
    row[600] = f32::INFINITY;
    row[700] = f32::NAN;
    assert_eq!(first_nan_or_inf(&row), Some(600));
}

/// Without AVX-512, no weight dtype falls to scalar code on an AVX2 machine, and
/// the AVX2 quantized kernel is the one that runs (checked against the portable
/// kernel, bit for bit).
#[test]
fn no_dtype_falls_to_scalar_code_without_avx512() {
    std::env::set_var("PAGODA_DISABLE_AVX512", "1");
    let paths = gemm_paths();
    if Isa::detect().avx2_fma() {
        assert_eq!(paths.f32, GemmPath::Avx2);
        assert_eq!(paths.bf16, GemmPath::Avx2);
        assert_eq!(paths.quant, GemmPath::Avx2);
    }
    let (m, k, n) = (5, 64, 40);
    let (x, w) = fixed(m, k, n);
    let q = QuantMatrix::quantize_q8_0(&w, n, k).unwrap();
    let mut out = vec![0.0; m * n];
    matmul_quant(&x, &q, &mut out, m).unwrap();
    let mut acts = quant::QuantActs::default();
    acts.quantize(&x, m, k).unwrap();
    let mut slow = vec![0.0; m * n];
    quant::matmul_quant_acts(&acts, &q, &mut slow, n, QuantKernel::Portable).unwrap();
    assert_eq!(out, slow);
}
