//! What one micro-kernel call gets: the kernel this CPU runs ([`QuantKernel`]) and
//! one [`Tile`] (rows of activations times one panel). Below the dispatch in
//! `mod.rs`, which builds tiles, and the kernels (portable, x86 register tiles and
//! passes), which take them.

use super::act::QuantActs;
use super::layout::{Layout, Storage};
use std::sync::OnceLock;

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

/// `PAGODA_Q5K_VNNI=1` turns on the AVX-512 VNNI form of the Q5_K kernels.
pub const Q5K_VNNI_ENV: &str = "PAGODA_Q5K_VNNI";

/// The kernel that runs `storage` when `kernel` was asked for: `kernel`, except
/// Q5_K on AVX-512 VNNI, which runs the AVX2 kernels (every AVX-512 CPU has AVX2;
/// the bits are the same, every kernel being bit-identical to the portable one)
/// unless [`Q5K_VNNI_ENV`] is `1`. Why: the VNNI form of Q5_K was written on a
/// machine without AVX-512 and has not run yet; a wrong result served by default
/// is worse than a slower right one. Running `PAGODA_Q5K_VNNI=1 cargo test -p
/// pagoda-kernels --test quant` on an AVX-512 VNNI CPU checks it bit for bit
/// against the reference (and then this gate can go).
pub(super) fn verified_for(kernel: QuantKernel, storage: Storage) -> QuantKernel {
    static ON: OnceLock<bool> = OnceLock::new();
    let vnni_on = || *ON.get_or_init(|| std::env::var(Q5K_VNNI_ENV).is_ok_and(|v| v == "1"));
    if kernel == QuantKernel::Avx512Vnni && storage == Storage::K5 && !vnni_on() {
        QuantKernel::Avx2
    } else {
        kernel
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q5_k_runs_avx2_on_vnni_unless_switched_on() {
        let on = std::env::var(Q5K_VNNI_ENV).is_ok_and(|v| v == "1");
        let vnni = QuantKernel::Avx512Vnni;
        let want = if on { vnni } else { QuantKernel::Avx2 };
        assert_eq!(verified_for(vnni, Storage::K5), want);
        for s in [Storage::K4, Storage::K6, Storage::Nibbles0, Storage::Bytes] {
            assert_eq!(verified_for(vnni, s), vnni, "{s:?}");
        }
        for k in [QuantKernel::Avx2, QuantKernel::Portable] {
            assert_eq!(verified_for(k, Storage::K5), k);
        }
    }
}
