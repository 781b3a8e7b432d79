//! The three vector primitives of decode attention (dot product, `y += a * x`,
//! `y *= a`) for AVX-512, AVX2+FMA and portable code.
//!
//! Callers are generic over [`Simd`] and are instantiated inside
//! `#[target_feature]` functions, so the `#[inline(always)]` intrinsics below are
//! compiled into the kernel body; the ISA is picked once at runtime ([`Isa::detect`])
//! because the crate is built without `-C target-cpu`.
//!
//! Every length must be a multiple of 16 (the supported head dims are).

/// The instruction set a backend instance uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    /// The best ISA this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2 => Isa::detect() != Isa::Portable,
            Isa::Avx512 => Isa::detect() == Isa::Avx512,
        }
    }
}

/// Vector primitives over raw f32 pointers.
///
/// # Safety
/// Pointers must be valid for `n` elements and `n % 16 == 0`; the implementing ISA
/// must be available on the running CPU.
pub trait Simd {
    unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32;
    unsafe fn axpy(y: *mut f32, a: f32, x: *const f32, n: usize);
    unsafe fn scale(y: *mut f32, a: f32, n: usize);
}

/// Plain Rust in chunks of 16 that the compiler vectorises with the baseline ISA.
/// Uses `a * b + c` rather than `mul_add`, which would be a libm call without FMA.
pub struct Portable;

impl Simd for Portable {
    #[inline(always)]
    unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
        let a = std::slice::from_raw_parts(a, n);
        let b = std::slice::from_raw_parts(b, n);
        let mut acc = [0f32; 16];
        for (ca, cb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
            for i in 0..16 {
                acc[i] += ca[i] * cb[i];
            }
        }
        acc.iter().sum()
    }
    #[inline(always)]
    unsafe fn axpy(y: *mut f32, a: f32, x: *const f32, n: usize) {
        let y = std::slice::from_raw_parts_mut(y, n);
        let x = std::slice::from_raw_parts(x, n);
        for (cy, cx) in y.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
            for i in 0..16 {
                cy[i] += a * cx[i];
            }
        }
    }
    #[inline(always)]
    unsafe fn scale(y: *mut f32, a: f32, n: usize) {
        for v in std::slice::from_raw_parts_mut(y, n) {
            *v *= a;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Simd;
    use std::arch::x86_64::*;

    /// 16 lanes, `vfmadd`; four accumulators hide the FMA latency.
    pub struct Avx512;

    impl Simd for Avx512 {
        #[inline(always)]
        unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            while i + 64 <= n {
                for (j, s) in acc.iter_mut().enumerate() {
                    let o = i + 16 * j;
                    *s = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(o)), _mm512_loadu_ps(b.add(o)), *s);
                }
                i += 64;
            }
            while i < n {
                acc[0] =
                    _mm512_fmadd_ps(_mm512_loadu_ps(a.add(i)), _mm512_loadu_ps(b.add(i)), acc[0]);
                i += 16;
            }
            let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            _mm512_reduce_add_ps(s)
        }
        #[inline(always)]
        unsafe fn axpy(y: *mut f32, a: f32, x: *const f32, n: usize) {
            let av = _mm512_set1_ps(a);
            let mut i = 0;
            while i < n {
                let r = _mm512_fmadd_ps(av, _mm512_loadu_ps(x.add(i)), _mm512_loadu_ps(y.add(i)));
                _mm512_storeu_ps(y.add(i), r);
                i += 16;
            }
        }
        #[inline(always)]
        unsafe fn scale(y: *mut f32, a: f32, n: usize) {
            let av = _mm512_set1_ps(a);
            let mut i = 0;
            while i < n {
                _mm512_storeu_ps(y.add(i), _mm512_mul_ps(av, _mm512_loadu_ps(y.add(i))));
                i += 16;
            }
        }
    }

    /// 8 lanes, two per 16-element step.
    pub struct Avx2;

    impl Simd for Avx2 {
        #[inline(always)]
        unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
            let mut s0 = _mm256_setzero_ps();
            let mut s1 = _mm256_setzero_ps();
            let mut i = 0;
            while i < n {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), s0);
                s1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.add(i + 8)),
                    _mm256_loadu_ps(b.add(i + 8)),
                    s1,
                );
                i += 16;
            }
            let s = _mm256_add_ps(s0, s1);
            let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
            _mm_cvtss_f32(h)
        }
        #[inline(always)]
        unsafe fn axpy(y: *mut f32, a: f32, x: *const f32, n: usize) {
            let av = _mm256_set1_ps(a);
            let mut i = 0;
            while i < n {
                let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(y.add(i)));
                _mm256_storeu_ps(y.add(i), r);
                i += 8;
            }
        }
        #[inline(always)]
        unsafe fn scale(y: *mut f32, a: f32, n: usize) {
            let av = _mm256_set1_ps(a);
            let mut i = 0;
            while i < n {
                _mm256_storeu_ps(y.add(i), _mm256_mul_ps(av, _mm256_loadu_ps(y.add(i))));
                i += 8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<S: Simd>() {
        let n = 48;
        let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        let got = unsafe { S::dot(a.as_ptr(), b.as_ptr(), n) };
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        let mut y = b.clone();
        unsafe { S::axpy(y.as_mut_ptr(), 0.5, a.as_ptr(), n) };
        unsafe { S::scale(y.as_mut_ptr(), 2.0, n) };
        for i in 0..n {
            assert!((y[i] - 2.0 * (b[i] + 0.5 * a[i])).abs() < 1e-5);
        }
    }

    #[test]
    fn every_available_isa_matches_scalar_math() {
        check::<Portable>();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2() {
                    check::<Avx2>()
                }
                unsafe { avx2() };
            }
            if std::is_x86_feature_detected!("avx512f") {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512() {
                    check::<Avx512>()
                }
                unsafe { avx512() };
            }
        }
    }
}
