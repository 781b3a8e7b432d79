//! Dequantization against tiny encoders written here: a known f32 vector is quantized
//! per format, and `dequantize` must reproduce it within that format's step size.

use half::{bf16, f16};
use pagoda_models::dequant::dequantize;
use proptest::prelude::*;

fn h(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}
fn hq(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Q8_0: d = amax/127, q = round(x/d). Returns (bytes, per-element tolerance).
fn enc_q8_0(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let (mut out, mut tol) = (Vec::new(), Vec::new());
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = hq(amax / 127.0);
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(h(d));
        out.extend(
            b.iter()
                .map(|v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8),
        );
        tol.extend(std::iter::repeat_n(0.5 * d + 1e-6, 32));
    }
    (out, tol)
}

/// Q4_0/Q5_0 (symmetric, `bits` = 4 or 5): d = signed max / -2^(bits-1).
fn enc_sym(x: &[f32], bits: u32) -> (Vec<u8>, Vec<f32>) {
    let half = (1 << (bits - 1)) as f32;
    let (mut out, mut tol) = (Vec::new(), Vec::new());
    for b in x.chunks(32) {
        let max = b
            .iter()
            .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        let d = hq(max / -half);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<u32> = b
            .iter()
            .map(|v| (v * id + half).round().clamp(0.0, 2.0 * half - 1.0) as u32)
            .collect();
        out.extend(h(d));
        if bits == 5 {
            let qh: u32 = (0..32).map(|j| ((q[j] >> 4) & 1) << j).sum();
            out.extend(qh.to_le_bytes());
        }
        out.extend((0..16).map(|j| ((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4)) as u8));
        // Like llama.cpp, the code range is [-half, half-1]*d with d signed so the largest
        // magnitude is exact; a value near -max lands one step outside and is clamped.
        tol.extend(std::iter::repeat_n(d.abs() + 1e-3 * max.abs() + 1e-6, 32));
    }
    (out, tol)
}

/// Q4_1/Q5_1 (affine): x ≈ q*d + m with m = min.
fn enc_affine(x: &[f32], bits: u32) -> (Vec<u8>, Vec<f32>) {
    let levels = ((1 << bits) - 1) as f32;
    let (mut out, mut tol) = (Vec::new(), Vec::new());
    for b in x.chunks(32) {
        let (lo, hi) = b
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, u), &v| (l.min(v), u.max(v)));
        let (d, m) = (hq((hi - lo) / levels), hq(lo));
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<u32> = b
            .iter()
            .map(|v| ((v - m) * id).round().clamp(0.0, levels) as u32)
            .collect();
        out.extend(h(d));
        out.extend(h(m));
        if bits == 5 {
            let qh: u32 = (0..32).map(|j| ((q[j] >> 4) & 1) << j).sum();
            out.extend(qh.to_le_bytes());
        }
        out.extend((0..16).map(|j| ((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4)) as u8));
        tol.extend(std::iter::repeat_n(
            0.5 * d + 2e-3 * (hi.abs() + lo.abs()) + 1e-6,
            32,
        ));
    }
    (out, tol)
}

/// Q4_K (`bits` 4) and Q5_K (`bits` 5): 8 sub-blocks of 32 with 6-bit scales/mins
/// under f16 super-scales; Q5_K adds each element's 5th bit in `qh[32]` (bit
/// `i / 32` of `qh[i % 32]`) before the 4-bit values.
fn enc_k(x: &[f32], bits: u32) -> (Vec<u8>, Vec<f32>) {
    let levels = ((1 << bits) - 1) as f32;
    let (mut out, mut tol) = (Vec::new(), Vec::new());
    for b in x.chunks(256) {
        let subs: Vec<(f32, f32)> = b
            .chunks(32)
            .map(|s| {
                let (lo, hi) = s
                    .iter()
                    .fold((0f32, f32::MIN), |(l, u), &v| (l.min(v), u.max(v)));
                ((hi - lo) / levels, -lo)
            })
            .collect();
        let d = hq(subs.iter().fold(0f32, |a, s| a.max(s.0)) / 63.0);
        let dmin = hq(subs.iter().fold(0f32, |a, s| a.max(s.1)) / 63.0);
        let sc: Vec<u8> = subs
            .iter()
            .map(|s| {
                if d > 0.0 {
                    (s.0 / d).ceil().min(63.0) as u8
                } else {
                    0
                }
            })
            .collect();
        let mn: Vec<u8> = subs
            .iter()
            .map(|s| {
                if dmin > 0.0 {
                    (s.1 / dmin).ceil().min(63.0) as u8
                } else {
                    0
                }
            })
            .collect();
        let mut packed = [0u8; 12];
        for j in 0..8 {
            if j < 4 {
                packed[j] |= sc[j] & 63;
                packed[j + 4] |= mn[j] & 63;
            } else {
                packed[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
                packed[j - 4] |= (sc[j] >> 4) << 6;
                packed[j] |= (mn[j] >> 4) << 6;
            }
        }
        let mut q = [0u8; 256];
        for (i, &v) in b.iter().enumerate() {
            let j = i / 32;
            let step = d * sc[j] as f32;
            let qv = if step > 0.0 {
                ((v + dmin * mn[j] as f32) / step)
                    .round()
                    .clamp(0.0, levels)
            } else {
                0.0
            };
            q[i] = qv as u8;
            tol.push(0.5 * step + 1e-5 + 2e-3 * v.abs());
        }
        out.extend(h(d));
        out.extend(h(dmin));
        out.extend(packed);
        if bits == 5 {
            out.extend((0..32).map(|l| (0..8).map(|j| (q[32 * j + l] >> 4) << j).sum::<u8>()));
        }
        for g in 0..4 {
            out.extend((0..32).map(|l| (q[64 * g + l] & 0xF) | ((q[64 * g + 32 + l] & 0xF) << 4)));
        }
    }
    (out, tol)
}

/// Q6_K: 16 sub-blocks of 16 with i8 scales under an f16 super-scale.
fn enc_q6_k(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let (mut out, mut tol) = (Vec::new(), Vec::new());
    for b in x.chunks(256) {
        let scales: Vec<f32> = b
            .chunks(16)
            .map(|s| s.iter().fold(0f32, |a, v| a.max(v.abs())) / 31.0)
            .collect();
        let d = hq(scales.iter().fold(0f32, |a, &s| a.max(s)) / 127.0);
        let sc: Vec<i8> = scales
            .iter()
            .map(|s| {
                if d > 0.0 {
                    (s / d).ceil().min(127.0) as i8
                } else {
                    0
                }
            })
            .collect();
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for (i, &v) in b.iter().enumerate() {
            let step = d * sc[i / 16] as f32;
            let q = if step > 0.0 {
                (v / step).round().clamp(-32.0, 31.0)
            } else {
                0.0
            };
            let q = (q as i32 + 32) as u8;
            tol.push(0.5 * step + 1e-5 + 2e-3 * v.abs());
            let (hh, k, l) = (i / 128, (i % 128) / 32, i % 32);
            let qi = 64 * hh + l + 32 * (k % 2);
            ql[qi] |= if k < 2 { q & 0xF } else { (q & 0xF) << 4 };
            qh[32 * hh + l] |= (q >> 4) << (2 * k);
        }
        out.extend(ql);
        out.extend(qh);
        out.extend(sc.iter().map(|&s| s as u8));
        out.extend(h(d));
    }
    (out, tol)
}

fn enc_q8_k(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let (mut out, mut tol) = (Vec::new(), Vec::new());
    for b in x.chunks(256) {
        let d = b.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        out.extend(d.to_le_bytes());
        out.extend(b.iter().map(|v| {
            if d > 0.0 {
                (v / d).round() as i8 as u8
            } else {
                0
            }
        }));
        // Block sums (unused by dequantization) are part of the layout.
        out.extend(std::iter::repeat_n(0u8, 32));
        tol.extend(std::iter::repeat_n(0.5 * d + 1e-6, 256));
    }
    (out, tol)
}

fn check(id: u32, x: &[f32], enc: (Vec<u8>, Vec<f32>)) -> Result<(), TestCaseError> {
    let (bytes, tol) = enc;
    let y = dequantize("t", id, &bytes, x.len()).unwrap();
    for (i, ((a, b), t)) in x.iter().zip(&y).zip(&tol).enumerate() {
        prop_assert!(
            (a - b).abs() <= *t,
            "type {id} element {i}: {a} decoded as {b} (tolerance {t})"
        );
    }
    Ok(())
}

fn vec_strategy(n: usize) -> impl Strategy<Value = Vec<f32>> {
    (0.01f32..10.0, proptest::collection::vec(-1.0f32..1.0, n))
        .prop_map(|(s, v)| v.into_iter().map(|x| x * s).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn block32_formats_reproduce_encoded_vectors(x in vec_strategy(96)) {
        check(8, &x, enc_q8_0(&x))?;
        check(2, &x, enc_sym(&x, 4))?;
        check(6, &x, enc_sym(&x, 5))?;
        check(3, &x, enc_affine(&x, 4))?;
        check(7, &x, enc_affine(&x, 5))?;
    }

    #[test]
    fn k_formats_reproduce_encoded_vectors(x in vec_strategy(512)) {
        check(12, &x, enc_k(&x, 4))?;
        check(13, &x, enc_k(&x, 5))?;
        check(14, &x, enc_q6_k(&x))?;
        check(15, &x, enc_q8_k(&x))?;
    }

    #[test]
    fn float_formats(x in vec_strategy(40)) {
        let f32b: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        prop_assert_eq!(dequantize("t", 0, &f32b, 40).unwrap(), x.clone());
        let f16b: Vec<u8> = x.iter().flat_map(|&v| h(v)).collect();
        let bf16b: Vec<u8> = x.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
        check(1, &x, (f16b, x.iter().map(|v| v.abs() * 1e-3 + 1e-7).collect()))?;
        check(30, &x, (bf16b, x.iter().map(|v| v.abs() * 8e-3 + 1e-30).collect()))?;
    }
}

/// A hand-made Q4_1 block with known nibbles decodes to exactly q*d + m.
#[test]
fn q4_1_known_block() {
    let mut b = Vec::new();
    b.extend(h(0.5));
    b.extend(h(-1.0));
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let y = dequantize("t", 3, &b, 32).unwrap();
    for j in 0..16 {
        assert_eq!(y[j], j as f32 * 0.5 - 1.0);
        assert_eq!(y[j + 16], (15 - j) as f32 * 0.5 - 1.0);
    }
}

/// The quantized kernels' repacking (`QuantMatrix::from_gguf`) holds exactly the
/// values the loader's dequantizer gives, for random blocks of every format they
/// run (scale fields finite; `-0.0 == 0.0`).
#[test]
fn quantized_repacking_matches_the_dequantizer() {
    use pagoda_kernels::{QuantFormat, QuantMatrix};
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (fmt, id, scales) in [
        (QuantFormat::Q4_0, 2u32, &[0usize][..]),
        (QuantFormat::Q4_1, 3, &[0, 2]),
        (QuantFormat::Q8_0, 8, &[0]),
        (QuantFormat::Q4K, 12, &[0, 2]),
        (QuantFormat::Q5K, 13, &[0, 2]),
        (QuantFormat::Q6K, 14, &[208]),
    ] {
        let (be, bb) = fmt.block_layout();
        let (n, k) = (19, 2 * be);
        let mut data: Vec<u8> = (0..n * k / be * bb).map(|_| next() as u8).collect();
        for b in data.chunks_exact_mut(bb) {
            for &o in scales {
                let v = (next() % 2000) as f32 / 1000.0 - 1.0;
                b[o..o + 2].copy_from_slice(&h(v));
            }
        }
        let want = dequantize("t", id, &data, n * k).unwrap();
        let got = QuantMatrix::from_gguf(fmt, &data, n, k)
            .unwrap()
            .dequantize();
        assert!(want.iter().zip(&got).all(|(a, b)| a == b), "{}", fmt.name());
    }
}
