//! What one micro-kernel call gets: the kernel this CPU runs ([`QuantKernel`]) and
//! one [`Tile`] (rows of activations times one panel). Below the dispatch in
//! `mod.rs`, which builds tiles, and the kernels (portable, x86 register tiles and
//! passes), which take them.

use super::act::QuantActs;
use super::layout::Layout;

/// Which code runs [`matmul_quant`](super::matmul_quant) on this CPU (under
/// `PAGODA_DISABLE_AVX512`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuantKernel {
    /// Plain integer loops; any CPU.
    Portable,
    /// `vpmaddubsw` + `vpmaddwd` on 8-lane vectors (AVX2 + FMA).
    Avx2,
    /// `vpdpbusd` on 16-lane vectors (AVX-512 F/BW/VNNI).
    Avx512Vnni,
}

impl QuantKernel {
    /// Every kernel, slowest first.
    pub const ALL: [QuantKernel; 3] = [Self::Portable, Self::Avx2, Self::Avx512Vnni];

    /// The best kernel this CPU runs.
    pub fn detect() -> QuantKernel {
        let isa = crate::Isa::detect();
        if isa.avx512() && crate::isa::avx512_vnni() {
            QuantKernel::Avx512Vnni
        } else if isa.avx2_fma() {
            QuantKernel::Avx2
        } else {
            QuantKernel::Portable
        }
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        self <= QuantKernel::detect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2 (vpmaddubsw)",
            Self::Avx512Vnni => "avx512-vnni (vpdpbusd)",
        }
    }
}

/// Most rows per pass of the x86 pass kernels (`rows.rs`; their accumulators: 64 x
/// 64 bytes on the stack).
pub(super) const MAX_PASS_ROWS: usize = 64;

/// One micro-kernel call: `h` rows of `acts` from `r0` times one panel `recs` (of
/// `layout`, for `acts.k()` columns), into `h` rows of `cols <= QP` elements at
/// stride `ldo` from `out`.
#[derive(Clone, Copy)]
pub(crate) struct Tile<'a> {
    pub layout: Layout,
    pub recs: &'a [u8],
    pub acts: &'a QuantActs,
    pub r0: usize,
    pub h: usize,
    pub out: *mut f32,
    pub ldo: usize,
    pub cols: usize,
}
