//! The FP8 E4M3 ("e4m3fn") KV cache element as the CPU kernels read it: [`E4M3`]
//! (the bits of one value; `pagoda-kernels` knows no core types, so a core
//! `F8E4M3` slice reaches it as bytes, [`E4M3::from_bits_slice`]) and its exact
//! widening to f32, by a 256-entry table ([`E4M3_TO_F32`], built at compile time)
//! or in registers ([`crate::simd::Simd::load_e4m3`]).
//!
//! Format: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities,
//! `S.1111.111` is NaN; every value is exactly an f32 (and an f16 times 2⁸, which
//! the vector widening uses).

/// One FP8 E4M3 value, its bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct E4M3(pub u8);

impl E4M3 {
    /// A byte slice seen as E4M3 values, without a copy.
    pub fn from_bits_slice(x: &[u8]) -> &[E4M3] {
        // SAFETY: `E4M3` is `repr(transparent)` over `u8` (same size, alignment and
        // validity), so the bytes reinterpret as values; the lifetime is kept.
        unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<E4M3>(), x.len()) }
    }

    /// Widens to f32 (exact), through [`E4M3_TO_F32`].
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        E4M3_TO_F32[self.0 as usize]
    }
}

/// The value of E4M3 code `b`, built from the format's fields (what the table holds).
const fn decode(b: u8) -> f32 {
    let e = ((b >> 3) & 0xf) as u32;
    let m = (b & 7) as u32;
    let mag = if e == 0xf && m == 7 {
        f32::NAN
    } else if e == 0 {
        // Subnormal: m · 2⁻⁹ (exact in f32).
        m as f32 * (1.0 / 512.0)
    } else {
        // Normal: the f32 with exponent e - 7 and the 3 mantissa bits on top.
        f32::from_bits(((e + 127 - 7) << 23) | (m << 20))
    };
    if b & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

const fn table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode(i as u8);
        i += 1;
    }
    t
}

/// `E4M3_TO_F32[b]` is the value of E4M3 code `b` (NaN for `0x7f` and `0xff`).
pub static E4M3_TO_F32: [f32; 256] = table();

/// The slow, obviously correct decoding of the format's definition, in f64:
/// `(-1)^s · 2^(e-7) · (1 + m/8)`, subnormals `(-1)^s · 2^-6 · m/8`.
pub fn e4m3_ref(b: u8) -> f64 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f64;
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        s * 2f64.powi(-6) * (m / 8.0)
    } else {
        s * 2f64.powi(e - 7) * (1.0 + m / 8.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_formats_definition() {
        for b in 0..=255u8 {
            let (got, want) = (E4M3(b).to_f32(), e4m3_ref(b));
            if want.is_nan() {
                assert!(got.is_nan(), "{b:#x}");
                assert_eq!(b & 0x7f, 0x7f);
            } else {
                assert_eq!(got as f64, want, "{b:#x}");
                assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "{b:#x}");
            }
        }
        assert_eq!(E4M3(0x7e).to_f32(), 448.0);
        assert_eq!(E4M3(0x01).to_f32(), 2f32.powi(-9));
    }

    #[test]
    fn from_bits_slice_keeps_every_code() {
        let b: Vec<u8> = (0..=255).collect();
        let x = E4M3::from_bits_slice(&b);
        assert!(x.iter().enumerate().all(|(i, v)| v.0 as usize == i));
    }
}
