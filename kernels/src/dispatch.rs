//! Which code each weight dtype's GEMM runs on this CPU: what the server logs at
//! start, what BENCHMARKS.md names, and what `tests/dispatch.rs` checks (on an
//! AVX2 or AVX-512 machine no dtype may fall to scalar code; a fallback must be
//! at least as fast as the f32 path for the same work).

use crate::quant::QuantKernel;
use crate::Isa;

/// One GEMM's code path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmPath {
    /// Plain loops (the compiler's baseline vectoriser: SSE2 on x86-64).
    Portable,
    /// 8-lane AVX2 + FMA (for int8: `vpmaddubsw` + `vpmaddwd`).
    Avx2,
    /// 16-lane AVX-512 F (for bf16: weights widened to f32 in registers).
    Avx512,
    /// `vdpbf16ps`.
    Avx512Bf16,
    /// `vpdpbusd`.
    Avx512Vnni,
}

impl GemmPath {
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
            Self::Avx512Bf16 => "avx512-bf16 (vdpbf16ps)",
            Self::Avx512Vnni => "avx512-vnni (vpdpbusd)",
        }
    }
}

/// The path of each weight dtype's GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmPaths {
    /// [`crate::matmul_packed`].
    pub f32: GemmPath,
    /// [`crate::matmul_packed_bf16`].
    pub bf16: GemmPath,
    /// [`crate::matmul_quant`] (every quantized format; Q5_K runs the AVX2 form on an
    /// AVX-512 CPU unless [`crate::quant::Q5K_VNNI_ENV`] is `1`).
    pub quant: GemmPath,
}

/// The paths on this CPU, under `PAGODA_DISABLE_AVX512`.
pub fn gemm_paths() -> GemmPaths {
    let isa = Isa::detect();
    GemmPaths {
        f32: if isa.avx512() {
            GemmPath::Avx512
        } else if isa.avx2_fma() {
            GemmPath::Avx2
        } else {
            GemmPath::Portable
        },
        bf16: bf16_path(),
        quant: match QuantKernel::detect() {
            QuantKernel::Avx512Vnni => GemmPath::Avx512Vnni,
            QuantKernel::Avx2 => GemmPath::Avx2,
            QuantKernel::Portable => GemmPath::Portable,
        },
    }
}

/// The code [`crate::matmul_packed_bf16`] runs on this CPU (under `PAGODA_DISABLE_AVX512`).
pub fn bf16_path() -> GemmPath {
    let isa = Isa::detect();
    if isa.avx512_bf16() {
        GemmPath::Avx512Bf16
    } else if isa.avx512() {
        GemmPath::Avx512
    } else if isa.avx2_fma() {
        GemmPath::Avx2
    } else {
        GemmPath::Portable
    }
}
