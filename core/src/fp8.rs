//! The OCP FP8 E4M3 ("e4m3fn") element type, [`F8E4M3`]: 1 sign bit, 4 exponent
//! bits (bias 7), 3 mantissa bits; no infinities, one NaN pattern per sign
//! (`S.1111.111`), largest finite value ±448, smallest subnormal 2⁻⁹. What vLLM
//! stores for `--kv-cache-dtype fp8` / `fp8_e4m3`.
//!
//! Conversion from f32 rounds to nearest, ties to even, and saturates: a value (or
//! an infinity) beyond ±448 becomes ±448, as the CUDA `satfinite` conversion vLLM
//! uses does; NaN stays NaN. Widening to f32 is exact. No scale is applied here:
//! vLLM's per-tensor KV scale defaults to 1.0 when a checkpoint gives none, and
//! Pagoda has no checkpoint scales, so the cache stores the values themselves.

use std::fmt;

/// One FP8 E4M3 value (its bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

impl F8E4M3 {
    /// Largest finite value, 448.
    pub const MAX: F8E4M3 = F8E4M3(0x7e);
    /// The positive NaN.
    pub const NAN: F8E4M3 = F8E4M3(0x7f);
    pub const ZERO: F8E4M3 = F8E4M3(0);

    pub fn from_bits(b: u8) -> Self {
        F8E4M3(b)
    }
    pub fn to_bits(self) -> u8 {
        self.0
    }

    /// The bits of a slice of values, without a copy (what the CPU kernels read:
    /// `pagoda-kernels` knows no core types).
    pub fn slice_to_bits(x: &[F8E4M3]) -> &[u8] {
        // SAFETY: `F8E4M3` is `repr(transparent)` over `u8`: same size, alignment and
        // validity (every bit pattern is a value), so the slice reinterprets as is;
        // the lifetime is kept.
        unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), x.len()) }
    }

    /// Widens to f32 (exact).
    pub fn to_f32(self) -> f32 {
        let b = self.0;
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let e = (b >> 3) & 0xf;
        let m = (b & 7) as f32;
        if e == 0xf && b & 7 == 7 {
            return f32::NAN.copysign(sign);
        }
        let mag = if e == 0 {
            // Subnormal: m / 8 * 2^-6.
            m * (1.0 / 512.0)
        } else {
            (1.0 + m / 8.0) * f32::from_bits(((e as u32 + 127 - 7) & 0xff) << 23)
        };
        sign * mag
    }

    /// Rounds `x` to nearest (ties to even), saturating at ±448; NaN stays NaN.
    pub fn from_f32(x: f32) -> Self {
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs();
        if a.is_nan() {
            return F8E4M3(sign | 0x7f);
        }
        if a >= 448.0 {
            return F8E4M3(sign | 0x7e);
        }
        if a < 1.0 / 64.0 {
            // Subnormal range (and the rounding up into the smallest normal, code 8):
            // steps of 2^-9; the scaling by 512 is exact.
            return F8E4M3(sign | (a * 512.0).round_ties_even() as u8);
        }
        // Normal: keep the top 3 of f32's 23 mantissa bits, rounding the 20 others
        // to nearest even; a carry out of the mantissa bumps the exponent, which the
        // concatenated (exponent, mantissa) code absorbs.
        let bits = a.to_bits();
        let e = (bits >> 23) as i32 - 127 + 7;
        let m = bits & 0x7f_ffff;
        let mut q = ((e as u32) << 3) | (m >> 20);
        let rem = m & 0xf_ffff;
        if rem > 0x8_0000 || (rem == 0x8_0000 && q & 1 == 1) {
            q += 1;
        }
        F8E4M3(sign | q as u8)
    }
}

impl fmt::Debug for F8E4M3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_f32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The slow, obviously correct rounding: the nearest of all finite codes (ties to
    /// the even code), saturating at ±448.
    fn nearest(x: f32) -> u8 {
        if x.is_nan() {
            return if x.is_sign_negative() { 0xff } else { 0x7f };
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs() as f64;
        if a >= 448.0 {
            return sign | 0x7e;
        }
        let mut best = (f64::INFINITY, 0u8);
        for c in 0u8..=0x7e {
            let d = (F8E4M3(c).to_f32() as f64 - a).abs();
            if d < best.0 || (d == best.0 && c & 1 == 0) {
                best = (d, c);
            }
        }
        sign | best.1
    }

    #[test]
    fn every_code_widens_as_the_format_says_and_round_trips() {
        assert_eq!(F8E4M3(0x7e).to_f32(), 448.0);
        assert_eq!(F8E4M3(0xfe).to_f32(), -448.0);
        assert_eq!(F8E4M3(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(F8E4M3(0x08).to_f32(), 2f32.powi(-6));
        assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
        assert_eq!(F8E4M3(0x3c).to_f32(), 1.5);
        assert!(F8E4M3(0x7f).to_f32().is_nan() && F8E4M3(0xff).to_f32().is_nan());
        for c in 0..=255u8 {
            let x = F8E4M3(c).to_f32();
            if x.is_nan() {
                assert_eq!(F8E4M3::from_f32(x).0 & 0x7f, 0x7f);
                continue;
            }
            assert_eq!(F8E4M3::from_f32(x).0, c, "code {c:#x} = {x}");
        }
    }

    #[test]
    fn slice_to_bits_keeps_every_code() {
        let x: Vec<F8E4M3> = (0..=255u8).map(F8E4M3).collect();
        let b = F8E4M3::slice_to_bits(&x);
        assert_eq!(b.len(), 256);
        assert!(b.iter().enumerate().all(|(i, &c)| c as usize == i));
    }

    #[test]
    fn saturates_and_rounds_ties_to_even() {
        assert_eq!(F8E4M3::from_f32(f32::INFINITY), F8E4M3::MAX);
        assert_eq!(F8E4M3::from_f32(f32::NEG_INFINITY).0, 0xfe);
        assert_eq!(F8E4M3::from_f32(1e9), F8E4M3::MAX);
        assert_eq!(F8E4M3::from_f32(464.0), F8E4M3::MAX);
        // 1.0625 lies halfway between 1.0 (even) and 1.125: to 1.0.
        assert_eq!(F8E4M3::from_f32(1.0625).to_f32(), 1.0);
        // 1.1875 halfway between 1.125 (odd) and 1.25: to 1.25.
        assert_eq!(F8E4M3::from_f32(1.1875).to_f32(), 1.25);
        // Half the smallest subnormal rounds to zero, a bit more to it.
        assert_eq!(F8E4M3::from_f32(2f32.powi(-10)).0, 0);
        assert_eq!(F8E4M3::from_f32(2f32.powi(-10) * 1.01).0, 1);
        assert_eq!(F8E4M3::from_f32(-0.0).0, 0x80);
    }

    proptest! {
        #[test]
        fn rounding_matches_the_nearest_code(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            prop_assert_eq!(F8E4M3::from_f32(x).0, nearest(x), "{}", x);
        }

        #[test]
        fn rounding_matches_in_range(x in -500.0f32..500.0) {
            prop_assert_eq!(F8E4M3::from_f32(x).0, nearest(x), "{}", x);
        }

        #[test]
        fn rounding_matches_near_zero(x in -0.02f32..0.02) {
            prop_assert_eq!(F8E4M3::from_f32(x).0, nearest(x), "{}", x);
        }
    }
}
