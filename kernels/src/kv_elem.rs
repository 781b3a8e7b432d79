//! The element types of a KV cache as the CPU attention kernels read them:
//! [`KvElem`], implemented for `f32`, `bf16`, `f16` and FP8 E4M3 ([`E4M3`]).
//!
//! A bf16, f16 or fp8 cache is read at its own width and widened to f32 in registers
//! ([`KvElem::load`] on a [`Simd`] vector) or in a small row buffer ([`widen`]);
//! the arithmetic is the f32 kernels' own. Widening is exact, so a kernel reading a
//! 16-bit or fp8 cache computes exactly what its f32 twin computes on the widened
//! values.

use crate::fp8::E4M3;
use crate::simd::{Portable, Simd};
use crate::Isa;
use half::{bf16, f16};

/// A KV cache element: loads into f32 vectors, widens to f32.
///
/// # Calling [`KvElem::load`]
/// As for every [`Simd`] method: `p` must be valid for `S::LANES` elements and
/// `S`'s instruction set available on this CPU.
pub trait KvElem: Copy + Send + Sync + 'static + sealed::Sealed {
    /// `S::LANES` elements at `p`, widened to f32 (exact).
    ///
    /// # Safety
    /// See the trait's "Calling [`KvElem::load`]".
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
    /// One element widened to f32 (exact).
    fn to_f32(self) -> f32;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for crate::fp8::E4M3 {}
}

impl KvElem for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { S::load(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { S::load_bf16(p as *const u16) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

impl KvElem for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { S::load_f16(p as *const u16) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl KvElem for E4M3 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { S::load_e4m3(p as *const u8) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        E4M3::to_f32(self)
    }
}

/// `dst[i] = src[i]` widened to f32, `S::LANES` at a time, the tail one by one.
///
/// # Safety
/// `S`'s instruction set is available on this CPU.
#[inline(always)]
pub unsafe fn widen_with<S: Simd, E: KvElem>(src: &[E], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + S::LANES <= n {
        // SAFETY: i + LANES <= n, within both slices.
        unsafe { S::store(dst.as_mut_ptr().add(i), E::load::<S>(src.as_ptr().add(i))) };
        i += S::LANES;
    }
    for j in i..n {
        dst[j] = src[j].to_f32();
    }
}

/// `dst[i] = src[i]` widened to f32 for `i < min(len)`, with the widest vectors `isa`
/// allows (the slow obviously-correct twin is `x.to_f32()` per element; tested
/// bit for bit).
///
/// # Panics
/// If `isa` is not available on this CPU.
pub fn widen<E: KvElem>(isa: Isa, src: &[E], dst: &mut [f32]) {
    assert!(isa.available(), "{isa:?} is not available on this CPU");
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512<E: KvElem>(src: &[E], dst: &mut [f32]) {
            // SAFETY: the caller checked AVX-512 F.
            unsafe { widen_with::<crate::simd::Avx512, E>(src, dst) }
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2<E: KvElem>(src: &[E], dst: &mut [f32]) {
            // SAFETY: the caller checked AVX2, FMA and F16C.
            unsafe { widen_with::<crate::simd::Avx2, E>(src, dst) }
        }
        match isa {
            // SAFETY: `isa` is available (asserted above).
            Isa::Avx512 | Isa::Avx512Bf16 => return unsafe { avx512(src, dst) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { avx2(src, dst) },
            Isa::Portable => {}
        }
    }
    // SAFETY: the portable vectors need no CPU feature.
    unsafe { widen_with::<Portable, E>(src, dst) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widen_is_exact_on_every_isa_and_length() {
        let vals: Vec<f32> = (0..67)
            .map(|i| ((i as f32) * 0.731).sin() * 10f32.powi(i % 9 - 4))
            .collect();
        let b: Vec<bf16> = vals.iter().map(|&x| bf16::from_f32(x)).collect();
        let h: Vec<f16> = vals.iter().map(|&x| f16::from_f32(x)).collect();
        // Every code, NaNs included, and again in a shifted order.
        let e: Vec<E4M3> = (0..67u32).map(|i| E4M3((i * 37 % 256) as u8)).collect();
        let e_all: Vec<E4M3> = (0..=255).map(E4M3).collect();
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            for n in [0, 1, 7, 8, 16, 17, 33, 67] {
                let mut out = vec![f32::NAN; n];
                widen(isa, &b[..n], &mut out);
                let want: Vec<u32> = b[..n].iter().map(|x| x.to_f32().to_bits()).collect();
                assert_eq!(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
                widen(isa, &h[..n], &mut out);
                let want: Vec<u32> = h[..n].iter().map(|x| x.to_f32().to_bits()).collect();
                assert_eq!(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
                widen(isa, &vals[..n], &mut out);
                assert_eq!(out, vals[..n]);
                widen(isa, &e[..n], &mut out);
                let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan();
                assert!(out.iter().zip(&e[..n]).all(|(o, x)| same(*o, x.to_f32())));
            }
            let mut out = vec![f32::NAN; 256];
            widen(isa, &e_all, &mut out);
            for (o, x) in out.iter().zip(&e_all) {
                let want = crate::fp8::e4m3_ref(x.0);
                assert!(*o as f64 == want || o.is_nan() && want.is_nan(), "{x:?}");
            }
        }
    }

    #[test]
    fn bf16_to_f32_is_the_shift() {
        for bits in [0u16, 0x8000, 0x3f80, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x1234] {
            let x = bf16::from_bits(bits);
            let got = KvElem::to_f32(x);
            let want = x.to_f32();
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
        }
    }
}
