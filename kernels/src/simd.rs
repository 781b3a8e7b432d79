//! A minimal f32 vector abstraction ([`Simd`]) with AVX-512, AVX2+FMA and portable
//! implementations, so a kernel (the `paged` backend's decode kernel) is written once.
//!
//! Kernels are generic over [`Simd`] and instantiated inside `#[target_feature]`
//! functions, so the `#[inline(always)]` intrinsics below compile into the kernel
//! body; which instantiation runs is chosen from [`crate::Isa::detect`] (the crates
//! are built without `-C target-cpu`). Lengths handed to kernels are multiples of 16.
//!
//! Besides f32, a vector can be loaded from 16-bit floats ([`Simd::load_bf16`],
//! [`Simd::load_f16`]) or FP8 E4M3 bytes ([`Simd::load_e4m3`]), widened to f32 in
//! registers: how the attention kernels read a bf16, f16 or fp8 KV cache without an
//! f32 copy of it ([`crate::kv_elem`]).

/// f32 vectors of `LANES` lanes (`LANES` divides 16).
///
/// # Calling the methods
/// Every method is `unsafe`: pointers must be valid for `LANES` elements (no
/// alignment needed), and the implementing ISA must be available on the running
/// CPU (checked through [`crate::Isa`]).
#[allow(clippy::missing_safety_doc)] // covered by the trait's "Calling the methods"
pub trait Simd {
    type V: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    /// Loads `LANES` bf16 values (their bits) widened to f32: exact, the 16 bits
    /// shifted into the top of each lane.
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    /// Loads `LANES` IEEE binary16 values (their bits) widened to f32 (exact).
    unsafe fn load_f16(p: *const u16) -> Self::V;
    /// Loads `LANES` FP8 E4M3 values (their bits) widened to f32 (exact; NaN codes
    /// give NaN). The x86 vectors place the 7 magnitude bits in an f16 (E4M3's
    /// exponent and mantissa fields line up with f16's, bias 7 against 15), widen it
    /// with `vcvtph2ps`, which handles subnormals in hardware, and scale by 2⁸;
    /// the portable one reads [`crate::fp8::E4M3_TO_F32`].
    unsafe fn load_e4m3(p: *const u8) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c`
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn reduce(v: Self::V) -> f32;
    /// `[reduce(a[0]), .., reduce(a[3])]`, bit for bit: the same pairs of lanes
    /// added in the same order, but transposed so that the four trees share their
    /// shuffles and adds (about half the instructions of four `reduce`s).
    #[inline(always)]
    unsafe fn reduce4(a: [Self::V; 4]) -> [f32; 4] {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { a.map(|v| Self::reduce(v)) }
    }
    /// The sum of the 16 floats at `p` by the fixed tree `x[i] + x[i + w]`,
    /// w = 8, 4, 2, 1 (the attention chunk's probability sum): the portable
    /// version is the tree in scalars, the x86 ones the same adds in vectors.
    #[inline(always)]
    unsafe fn sum16(p: *const f32) -> f32 {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let mut t = std::ptr::read_unaligned(p as *const [f32; 16]);
            let mut w = 8;
            while w > 0 {
                for i in 0..w {
                    t[i] += t[i + w];
                }
                w /= 2;
            }
            t[0]
        }
    }
    /// The maximum of the 16 floats at `p` by the same tree, each step
    /// `if x[i + w] > x[i] { x[i + w] } else { x[i] }` (`maxps` of the upper half
    /// and the lower: one result for `-0.0` against `0.0` whatever the ISA).
    #[inline(always)]
    unsafe fn max16(p: *const f32) -> f32 {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let mut t = std::ptr::read_unaligned(p as *const [f32; 16]);
            let mut w = 8;
            while w > 0 {
                for i in 0..w {
                    t[i] = if t[i + w] > t[i] { t[i + w] } else { t[i] };
                }
                w /= 2;
            }
            t[0]
        }
    }
    /// `[reduce(a[0]), reduce(a[1])]`, bit for bit (see [`Simd::reduce4`]).
    #[inline(always)]
    unsafe fn reduce2(a: [Self::V; 2]) -> [f32; 2] {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { a.map(|v| Self::reduce(v)) }
    }
    /// Hints that the cache line at `p` will be read soon, into L2 (no-op where
    /// unsupported). L2, not L1: a Llama-8B chunk is 128 KiB of K and V, and
    /// prefetching it into a 48 KiB L1 evicted the lines in use (measured: slower).
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        let _ = p;
    }
}

/// Plain Rust on 8-lane arrays that the compiler vectorises with the baseline ISA.
/// Uses `a * b + c` rather than `mul_add`, which would be a libm call without FMA.
pub struct Portable;

impl Simd for Portable {
    type V = [f32; 8];
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { std::ptr::read_unaligned(p as *const [f32; 8]) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let b = std::ptr::read_unaligned(p as *const [u16; 8]);
            std::array::from_fn(|i| f32::from_bits((b[i] as u32) << 16))
        }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let b = std::ptr::read_unaligned(p as *const [u16; 8]);
            std::array::from_fn(|i| half::f16::from_bits(b[i]).to_f32())
        }
    }
    #[inline(always)]
    unsafe fn load_e4m3(p: *const u8) -> Self::V {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let b = std::ptr::read_unaligned(p as *const [u8; 8]);
            std::array::from_fn(|i| crate::fp8::E4M3_TO_F32[b[i] as usize])
        }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { std::ptr::write_unaligned(p as *mut [f32; 8], v) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i])
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    unsafe fn reduce(v: Self::V) -> f32 {
        ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Simd;
    use std::arch::x86_64::*;

    /// 16 lanes.
    pub struct Avx512;

    impl Simd for Avx512 {
        type V = __m512;
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe {
                let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
            }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
        }
        /// AVX-512 F implies AVX2, whose 256-bit integer ops build the f16s.
        #[inline(always)]
        unsafe fn load_e4m3(p: *const u8) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe {
                let w = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
                _mm512_mul_ps(_mm512_cvtph_ps(e4m3_to_f16_256(w)), _mm512_set1_ps(256.0))
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self::V) {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn reduce(v: Self::V) -> f32 {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe {
                // An explicit tree, not `_mm512_reduce_add_ps` (an unordered reduction
                // that the compiler may associate differently in different callers):
                // both attention backends must add a score's lanes in one order.
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
                let h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
                let h = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
                let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
                _mm_cvtss_f32(h)
            }
        }
        #[inline(always)]
        unsafe fn sum16(p: *const f32) -> f32 {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { sum16_sse(p) }
        }
        #[inline(always)]
        unsafe fn max16(p: *const f32) -> f32 {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { max16_sse(p) }
        }
        /// `reduce`'s tree on four vectors at once: step 1 adds lanes `i`, `i + 8`
        /// of two vectors in one add (their 256-bit halves regrouped), step 2 lanes
        /// `i`, `i + 4` of all four, leaving vector `j`'s 4 partial sums in quarter
        /// `j`; steps 3 and 4 (`i + 2`, then `i + 1`) run inside each quarter.
        #[inline(always)]
        unsafe fn reduce4(a: [Self::V; 4]) -> [f32; 4] {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe {
                let h01 = _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0b01_00_01_00>(a[0], a[1]),
                    _mm512_shuffle_f32x4::<0b11_10_11_10>(a[0], a[1]),
                );
                let h23 = _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0b01_00_01_00>(a[2], a[3]),
                    _mm512_shuffle_f32x4::<0b11_10_11_10>(a[2], a[3]),
                );
                let g = _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0b10_00_10_00>(h01, h23),
                    _mm512_shuffle_f32x4::<0b11_01_11_01>(h01, h23),
                );
                let f = _mm512_add_ps(g, _mm512_permute_ps::<0b01_00_11_10>(g));
                let e = _mm512_add_ps(f, _mm512_permute_ps::<0b10_11_00_01>(f));
                let mut out = [0f32; 16];
                _mm512_storeu_ps(out.as_mut_ptr(), e);
                [out[0], out[4], out[8], out[12]]
            }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) }
        }
    }

    /// `Simd::sum16`'s tree on four 128-bit loads (x86_64's baseline SSE): step 1
    /// (`i + 8`) adds quarters 0 + 2 and 1 + 3, step 2 (`i + 4`) those two, then
    /// `i + 2` and `i + 1` inside the last. 128-bit loads, not one 512-bit one, so
    /// that they are forwarded from the 128-bit stores the scores were written with
    /// (a wide load over several narrower stores waits for them to reach L1).
    #[inline(always)]
    pub(super) unsafe fn sum16_sse(p: *const f32) -> f32 {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let a = _mm_add_ps(_mm_loadu_ps(p), _mm_loadu_ps(p.add(8)));
            let b = _mm_add_ps(_mm_loadu_ps(p.add(4)), _mm_loadu_ps(p.add(12)));
            let h = _mm_add_ps(a, b);
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)))
        }
    }

    /// `Simd::max16`'s tree the same way; `_mm_max_ps(upper, lower)` is
    /// `if upper > lower { upper } else { lower }`.
    #[inline(always)]
    pub(super) unsafe fn max16_sse(p: *const f32) -> f32 {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let a = _mm_max_ps(_mm_loadu_ps(p.add(8)), _mm_loadu_ps(p));
            let b = _mm_max_ps(_mm_loadu_ps(p.add(12)), _mm_loadu_ps(p.add(4)));
            let h = _mm_max_ps(b, a);
            let h = _mm_max_ps(_mm_movehl_ps(h, h), h);
            _mm_cvtss_f32(_mm_max_ss(_mm_shuffle_ps(h, h, 1), h))
        }
    }

    /// 16 E4M3 codes (zero-extended to u16 lanes) as the f16s of their values
    /// times 2⁻⁸: magnitude bits shifted up by 7 (exponent field onto f16's, the 3
    /// mantissa bits onto the top of f16's 10), sign onto bit 15, and the NaN code
    /// `x.1111.111` given an all-ones exponent (f16 NaN).
    #[inline(always)]
    unsafe fn e4m3_to_f16_256(w: __m256i) -> __m256i {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7f));
            let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(w, _mm256_set1_epi16(0x80)));
            let nan = _mm256_and_si256(
                _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f)),
                _mm256_set1_epi16(0x7c00),
            );
            _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16::<7>(mag), sign), nan)
        }
    }

    /// 8 lanes with FMA (and F16C for [`Simd::load_f16`] and [`Simd::load_e4m3`]).
    pub struct Avx2;

    impl Simd for Avx2 {
        type V = __m256;
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe {
                let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
            }
        }
        /// Needs F16C, which [`crate::Isa::Avx2`] includes (every AVX2 CPU has it).
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn load_e4m3(p: *const u8) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe {
                let w = _mm_cvtepu8_epi16(_mm_loadl_epi64(p as *const __m128i));
                // The same bit moves as `e4m3_to_f16_256`, on 8 lanes.
                let mag = _mm_and_si128(w, _mm_set1_epi16(0x7f));
                let sign = _mm_slli_epi16::<8>(_mm_and_si128(w, _mm_set1_epi16(0x80)));
                let nan = _mm_and_si128(
                    _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)),
                    _mm_set1_epi16(0x7c00),
                );
                let h = _mm_or_si128(_mm_or_si128(_mm_slli_epi16::<7>(mag), sign), nan);
                _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0))
            }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self::V) {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn reduce(v: Self::V) -> f32 {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe {
                let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
                _mm_cvtss_f32(h)
            }
        }
        #[inline(always)]
        unsafe fn sum16(p: *const f32) -> f32 {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { sum16_sse(p) }
        }
        #[inline(always)]
        unsafe fn max16(p: *const f32) -> f32 {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { max16_sse(p) }
        }
        /// `reduce`'s tree on two vectors: step 1 (lanes `i`, `i + 4`) in one add of
        /// the regrouped 128-bit halves, steps 2 and 3 inside each half.
        #[inline(always)]
        unsafe fn reduce2(a: [Self::V; 2]) -> [f32; 2] {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe {
                let g = _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(a[0], a[1]),
                    _mm256_permute2f128_ps::<0x31>(a[0], a[1]),
                );
                let f = _mm256_add_ps(g, _mm256_permute_ps::<0b01_00_11_10>(g));
                let e = _mm256_add_ps(f, _mm256_permute_ps::<0b10_11_00_01>(f));
                let mut out = [0f32; 8];
                _mm256_storeu_ps(out.as_mut_ptr(), e);
                [out[0], out[4]]
            }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Isa;

    unsafe fn check<S: Simd>() {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let a: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..16).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut out = vec![0f32; 16];
            let mut i = 0;
            while i < 16 {
                let v = S::fma(
                    S::load(a.as_ptr().add(i)),
                    S::load(b.as_ptr().add(i)),
                    S::splat(1.0),
                );
                S::store(
                    out.as_mut_ptr().add(i),
                    S::add(S::mul(v, S::splat(2.0)), S::zero()),
                );
                i += S::LANES;
            }
            for i in 0..16 {
                assert!((out[i] - 2.0 * (a[i] * b[i] + 1.0)).abs() < 1e-6);
            }
            let want: f32 = a[..S::LANES].iter().sum();
            assert!((S::reduce(S::load(a.as_ptr())) - want).abs() < 1e-6);
            // 16-bit loads widen exactly, specials and subnormals included.
            let specials = [
                0.0,
                -0.0,
                1.0,
                -2.5,
                65504.0,
                6.0e-8,
                -1.0e-5,
                f32::INFINITY,
            ];
            let wide: Vec<f32> = (0..16)
                .map(|i| specials.get(i).copied().unwrap_or(a[i] * 100.0))
                .collect();
            let bf: Vec<u16> = wide
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect();
            let hf: Vec<u16> = wide
                .iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect();
            let mut i = 0;
            while i < 16 {
                S::store(out.as_mut_ptr().add(i), S::load_bf16(bf.as_ptr().add(i)));
                i += S::LANES;
            }
            for (o, b) in out.iter().zip(&bf) {
                assert_eq!(o.to_bits(), half::bf16::from_bits(*b).to_f32().to_bits());
            }
            let mut i = 0;
            while i < 16 {
                S::store(out.as_mut_ptr().add(i), S::load_f16(hf.as_ptr().add(i)));
                i += S::LANES;
            }
            for (o, h) in out.iter().zip(&hf) {
                assert_eq!(o.to_bits(), half::f16::from_bits(*h).to_f32().to_bits());
            }
            let nan = [half::f16::NAN.to_bits(); 16];
            assert!(S::reduce(S::load_f16(nan.as_ptr())).is_nan());
            // Every E4M3 code widens to the table's value (which is tested against the
            // format's definition), NaN codes to NaN.
            let codes: Vec<u8> = (0..=255).collect();
            let mut all = [0f32; 256];
            let mut i = 0;
            while i < 256 {
                S::store(all.as_mut_ptr().add(i), S::load_e4m3(codes.as_ptr().add(i)));
                i += S::LANES;
            }
            for (b, got) in all.iter().enumerate() {
                let want = crate::fp8::E4M3_TO_F32[b];
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "code {b:#x}: {got} != {want}"
                );
            }
        }
    }

    /// `reduce4`/`reduce2` give `reduce`'s bits: values of mixed magnitudes and
    /// signs, so that a different pairing of lanes would round differently.
    unsafe fn check_transposed<S: Simd>() {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let m = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                m * [1.0, 1e-3, 3e4, 7.0][(x & 3) as usize]
            };
            for _ in 0..200 {
                let v: Vec<f32> = (0..4 * S::LANES).map(|_| next()).collect();
                let a: [S::V; 4] = std::array::from_fn(|j| S::load(v.as_ptr().add(j * S::LANES)));
                let want = a.map(|x| S::reduce(x).to_bits());
                assert_eq!(S::reduce4(a).map(f32::to_bits), want);
                assert_eq!(
                    S::reduce2([a[0], a[1]]).map(f32::to_bits),
                    [want[0], want[1]]
                );
                let mut w: Vec<f32> = (0..16).map(|_| next()).collect();
                assert_eq!(
                    S::sum16(w.as_ptr()).to_bits(),
                    Portable::sum16(w.as_ptr()).to_bits()
                );
                let r = next().to_bits() as usize;
                w[3] = f32::NEG_INFINITY;
                w[r % 16] = 0.0;
                w[r / 16 % 16] = -0.0;
                assert_eq!(
                    S::max16(w.as_ptr()).to_bits(),
                    Portable::max16(w.as_ptr()).to_bits()
                );
                w.iter_mut().for_each(|v| *v = -v.abs());
                assert_eq!(
                    S::max16(w.as_ptr()).to_bits(),
                    Portable::max16(w.as_ptr()).to_bits()
                );
            }
        }
    }

    #[test]
    fn every_available_isa_matches_scalar_math() {
        // SAFETY: `Portable` needs no CPU feature; `check` reads and writes
        // 16-element vectors at offsets that are multiples of LANES below 16.
        unsafe { check::<Portable>() };
        // SAFETY: as above.
        unsafe { check_transposed::<Portable>() };
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::Avx2.available() {
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn avx2() {
                    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
                    unsafe {
                        check::<Avx2>();
                        check_transposed::<Avx2>()
                    }
                }
                // SAFETY: AVX2 and FMA are available (`Isa::Avx2.available()`).
                unsafe { avx2() };
            }
            if Isa::Avx512.available() {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512() {
                    // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
                    unsafe {
                        check::<Avx512>();
                        check_transposed::<Avx512>()
                    }
                }
                // SAFETY: AVX-512 F is available (`Isa::Avx512.available()`).
                unsafe { avx512() };
            }
        }
    }
}
