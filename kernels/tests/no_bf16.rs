//! The bf16 GEMM on an AVX-512 CPU without AVX-512 BF16 (Intel Skylake-X, Cascade
//! Lake), forced with `PAGODA_DISABLE_AVX512_BF16=1`: it runs the AVX-512 F
//! fallback (weights widened in registers; the issue's ~10x cliff was a scalar
//! loop), matches the reference on the bf16 weights and unrounded `x`, and is
//! batch-invariant. One test per binary: the switch is read once per process.

mod common;

use common::{fixed, round_bf16};
use pagoda_kernels::*;

#[test]
fn bf16_without_avx512_bf16_runs_the_avx512_fallback() {
    std::env::set_var("PAGODA_DISABLE_AVX512_BF16", "1");
    assert!(!Isa::detect().avx512_bf16());
    let paths = gemm_paths();
    if Isa::detect().avx512() {
        assert_eq!(paths.bf16, GemmPath::Avx512);
        assert_eq!(paths.f32, GemmPath::Avx512);
    }
    for (m, k, n) in [(1, 5, 3), (13, 33, 70), (6, 576, 130), (5, 64, 64)] {
        let (x, w) = fixed(m, k, n);
        let pb = PackedMatrixBf16::pack(&w, n, k).unwrap();
        let mut out = vec![f32::NAN; m * n];
        matmul_packed_bf16(&x, &pb, &mut out, m).unwrap();
        common::check_ref(&out, &x, &round_bf16(&w), (m, k, n)).unwrap();
        let mut alone = vec![0.0; n];
        for i in 0..m {
            matmul_packed_bf16(&x[i * k..(i + 1) * k], &pb, &mut alone, 1).unwrap();
            assert_eq!(&out[i * n..(i + 1) * n], &alone[..], "row {i} of {m}");
        }
    }
}
