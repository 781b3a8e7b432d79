//! On an AVX2 or AVX-512 machine no weight dtype's GEMM runs scalar code, by the
//! paths the kernels report (`gemm_paths`), not by timing. The same with
//! AVX-512 off is in `portable.rs`, with AVX-512 BF16 off in `no_bf16.rs`.

use pagoda_kernels::{gemm_paths, GemmPath, Isa};

#[test]
fn no_dtype_falls_to_scalar_code() {
    let (isa, paths) = (Isa::detect(), gemm_paths());
    println!("{isa:?}: {paths:?}");
    if isa.avx2_fma() {
        for (dtype, path) in [
            ("f32", paths.f32),
            ("bf16", paths.bf16),
            ("int8", paths.quant),
        ] {
            assert_ne!(path, GemmPath::Portable, "{dtype} on {isa:?}");
        }
    }
    if isa.avx512() {
        assert_eq!(paths.f32, GemmPath::Avx512);
        assert!(matches!(
            paths.bf16,
            GemmPath::Avx512 | GemmPath::Avx512Bf16
        ));
    }
    if isa.avx512_bf16() {
        assert_eq!(paths.bf16, GemmPath::Avx512Bf16);
    }
}
