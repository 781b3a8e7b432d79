//! The one CPU-feature probe: [`Isa`], the instruction set the CPU kernels use.
//!
//! The crates are built without `-C target-cpu`, so every fast kernel is compiled
//! inside `#[target_feature]` functions and chosen at runtime. [`Isa::detect`] is
//! the only place that asks the CPU (once per process), and it honours
//! `PAGODA_DISABLE_AVX512=1`: with it, every AVX-512 path is off (the GEMMs, the
//! activations, and the attention backends, which take their [`Isa`] from here),
//! so the portable and AVX2 paths can be tested and compared on an AVX-512
//! machine (`kernels/tests/portable.rs`, `backends/*/tests/portable.rs`).

use std::sync::OnceLock;

/// The environment variable that turns the AVX-512 paths off when set to `1`.
pub const DISABLE_AVX512_ENV: &str = "PAGODA_DISABLE_AVX512";

/// The environment variable that turns only AVX-512 BF16 off when set to `1`: an
/// Intel Xeon without `avx512_bf16` (Skylake-X, Cascade Lake) on this machine, so
/// the bf16 GEMM's AVX-512 F fallback can be tested and measured.
pub const DISABLE_AVX512_BF16_ENV: &str = "PAGODA_DISABLE_AVX512_BF16";

/// An instruction-set level, each one a superset of the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Whatever the baseline target gives (SSE2 on x86-64); any CPU.
    Portable,
    /// AVX2 with FMA and F16C: 8-lane f32 vectors (F16C widens f16 KV caches; every
    /// AVX2 CPU has it).
    Avx2,
    /// AVX-512 F (with AVX2 and FMA): 16-lane f32 vectors.
    Avx512,
    /// [`Isa::Avx512`] plus AVX-512 BW and BF16 (`vdpbf16ps`), for the bf16 GEMMs.
    Avx512Bf16,
}

impl Isa {
    /// Every level, slowest first.
    pub const ALL: [Isa; 4] = [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16];

    /// The best level this CPU supports, capped below [`Isa::Avx512`] when
    /// `PAGODA_DISABLE_AVX512=1`, below [`Isa::Avx512Bf16`] when
    /// `PAGODA_DISABLE_AVX512_BF16=1`. Probed once per process (so the variable must be
    /// set before the first call; later changes are not seen).
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let set = |var: &str| std::env::var_os(var).is_some_and(|v| v == "1");
            let (avx2, avx512, bf16) = probe();
            let bf16 = bf16 && !set(DISABLE_AVX512_BF16_ENV);
            Isa::from_features((avx2, avx512, bf16), set(DISABLE_AVX512_ENV))
        })
    }

    /// The level for the CPU features `(avx2 + fma, avx512f, avx512bw + avx512bf16)`,
    /// capped below AVX-512 with `disable_avx512`.
    pub(crate) fn from_features(
        (avx2_fma, avx512f, avx512_bf16): (bool, bool, bool),
        disable_avx512: bool,
    ) -> Isa {
        match (avx2_fma, avx512f && !disable_avx512, avx512_bf16) {
            (false, _, _) => Isa::Portable,
            (true, false, _) => Isa::Avx2,
            (true, true, false) => Isa::Avx512,
            (true, true, true) => Isa::Avx512Bf16,
        }
    }

    /// Whether this CPU (under `PAGODA_DISABLE_AVX512`) can run `self`.
    pub fn available(self) -> bool {
        self <= Isa::detect()
    }

    /// Whether AVX2, FMA and F16C can be used.
    pub fn avx2_fma(self) -> bool {
        self >= Isa::Avx2
    }

    /// Whether the AVX-512 F paths can be used.
    pub fn avx512(self) -> bool {
        self >= Isa::Avx512
    }

    /// Whether the AVX-512 BF16 paths can be used.
    pub fn avx512_bf16(self) -> bool {
        self >= Isa::Avx512Bf16
    }
}

/// Whether the CPU has AVX-512 BW and VNNI (`vpdpbusd`), for the int8 kernels of
/// [`crate::quant`]; false under `PAGODA_DISABLE_AVX512=1`. Not an [`Isa`] level:
/// VNNI and BF16 come in either order (Intel Cascade Lake has VNNI only).
pub fn avx512_vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    Isa::detect().avx512() && *VNNI.get_or_init(probe_vnni)
}

#[cfg(target_arch = "x86_64")]
fn probe_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn probe_vnni() -> bool {
    false
}

/// The CPU's `(avx2 + fma + f16c, avx512f, avx512bw + avx512bf16)`.
#[cfg(target_arch = "x86_64")]
fn probe() -> (bool, bool, bool) {
    use std::arch::is_x86_feature_detected as has;
    (
        has!("avx2") && has!("fma") && has!("f16c"),
        has!("avx512f"),
        has!("avx512f") && has!("avx512bw") && has!("avx512bf16"),
    )
}

#[cfg(not(target_arch = "x86_64"))]
fn probe() -> (bool, bool, bool) {
    (false, false, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_the_features_and_the_switch() {
        assert_eq!(
            Isa::from_features((false, false, false), false),
            Isa::Portable
        );
        assert_eq!(Isa::from_features((true, false, false), false), Isa::Avx2);
        assert_eq!(Isa::from_features((true, true, false), false), Isa::Avx512);
        assert_eq!(
            Isa::from_features((true, true, true), false),
            Isa::Avx512Bf16
        );
        assert_eq!(Isa::from_features((true, true, true), true), Isa::Avx2);
        // AVX-512 without AVX2/FMA does not exist; it would count as portable.
        assert_eq!(
            Isa::from_features((false, true, true), false),
            Isa::Portable
        );
    }

    #[test]
    fn levels_are_ordered_and_the_detected_one_is_available() {
        assert!(Isa::ALL.windows(2).all(|w| w[0] < w[1]));
        assert!(Isa::Portable.available() && Isa::detect().available());
        let d = Isa::detect();
        assert_eq!(d.avx512(), d >= Isa::Avx512);
        assert!(!d.avx512_bf16() || d.avx512() && d.avx2_fma());
    }
}
