//! The quantized matmul (`kernels::quant`) against slow references.
//!
//! - Repacking: `QuantMatrix::from_gguf(..).dequantize()` equals (as numbers) a
//!   per-element decoder written here from each format's definition.
//! - The matmul against the f64 dot product of the dequantized weights with the
//!   dequantized int8 activations (`d·a`, what the kernel multiplies by): the only
//!   differences are f32 roundings, bounded by `(8 + 2·blocks)·ε·Σ mag·|x̂|`, where
//!   `mag` bounds each element's `|s·u| + |mn|` (the terms the kernel adds).
//! - Every kernel this CPU runs (portable, AVX2, AVX-512 VNNI) gives bit-identical
//!   outputs; each row alone gives the same bits as in its batch.
//! - The activation rounding: `|x - d·a| <= d/2 + 2ε|x|` per element (`d/2` from the
//!   integer, `2ε|x|` bounding f32's roundings of `1/d`, `x·(1/d)` and `d·a`).
//!
//! Block headers include the extreme f16 scales (0, ±65504, the smallest normal
//! and subnormal).

use half::f16;
use pagoda_kernels::quant::{matmul_quant_acts, QuantActs, QB, QP};
use pagoda_kernels::{matmul_quant, QuantFormat, QuantKernel, QuantMatrix};
use proptest::prelude::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    /// A block scale: mostly ordinary, sometimes extreme.
    fn scale(&mut self) -> f16 {
        let v = match self.next() % 10 {
            0 => 0.0,
            1 => 65504.0,
            2 => -65504.0,
            3 => 6.1035156e-5,
            4 => 5.96e-8,
            _ => self.f32() * 0.05,
        };
        f16::from_f32(v)
    }
}

/// Random GGUF blocks of `fmt` for `n` rows of `k`, scale fields from [`Rng::scale`].
fn blocks(fmt: QuantFormat, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let (be, bb) = fmt.block_layout();
    let mut data: Vec<u8> = (0..n * k / be * bb).map(|_| rng.next() as u8).collect();
    let fields: &[usize] = match fmt {
        QuantFormat::Q4_0 | QuantFormat::Q8_0 => &[0],
        QuantFormat::Q4_1 | QuantFormat::Q4K | QuantFormat::Q5K => &[0, 2],
        QuantFormat::Q6K => &[208],
    };
    for b in data.chunks_exact_mut(bb) {
        for &o in fields {
            b[o..o + 2].copy_from_slice(&rng.scale().to_le_bytes());
        }
    }
    data
}

fn h(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q4_K's and Q5_K's 6-bit (scale, min) of sub-block `sb` (llama.cpp's
/// `get_scale_min_k4`) from the block's 12 bytes at 4.
fn scale_min(b: &[u8], sb: usize) -> (u8, u8) {
    let s = &b[4..16];
    if sb < 4 {
        (s[sb] & 63, s[sb + 4] & 63)
    } else {
        (
            (s[sb + 4] & 0xF) | ((s[sb - 4] >> 6) << 4),
            (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4),
        )
    }
}

/// Q5_K's 5-bit `u` of element `i` (i = 64c + 32h + l): the low 4 bits at bits
/// 4h.. of qs[32c + l] (qs at 48), the high bit at bit 2c + h of qh[l] (qh at 16).
fn q5k_u(b: &[u8], i: usize) -> u8 {
    let (c, hh, l) = (i / 64, i / 32 % 2, i % 32);
    let lo = (b[48 + 32 * c + l] >> (4 * hh)) & 0xF;
    let hi = (b[16 + l] >> (2 * c + hh)) & 1;
    lo | (hi << 4)
}

/// Element `i` of one block, from the format's definition: `(value, mag)` with
/// `mag >= |s·u| + |mn|` of the kernel's decomposition.
fn element(fmt: QuantFormat, b: &[u8], i: usize) -> (f32, f32) {
    // Q4_0/Q4_1: byte j holds element j (low nibble) and j + 16 (high).
    let nib16 = |qs: &[u8]| ((qs[i % 16] >> (4 * (i / 16))) & 0xF) as f32;
    match fmt {
        QuantFormat::Q4_0 => {
            let d = h(b, 0);
            ((nib16(&b[2..]) - 8.0) * d, 23.0 * d.abs())
        }
        QuantFormat::Q4_1 => {
            let (d, m) = (h(b, 0), h(b, 2));
            (nib16(&b[4..]) * d + m, 15.0 * d.abs() + m.abs())
        }
        QuantFormat::Q8_0 => {
            let d = h(b, 0);
            (b[2 + i] as i8 as f32 * d, 383.0 * d.abs())
        }
        QuantFormat::Q4K => {
            // 8 sub-blocks of 32, 6-bit scale/min each; 64 elements per 32 bytes.
            let sb = i / 32;
            let (sc, mi) = scale_min(b, sb);
            let q = (b[16 + 32 * (sb / 2) + i % 32] >> (4 * (sb % 2))) & 0xF;
            let (d, dm) = (h(b, 0) * sc as f32, h(b, 2) * mi as f32);
            (d * q as f32 - dm, 15.0 * d.abs() + dm.abs())
        }
        QuantFormat::Q5K => {
            // llama.cpp: y = d1·u - m1, d1 = d·sc, m1 = dmin·m.
            let (sc, mi) = scale_min(b, i / 32);
            let (d1, m1) = (h(b, 0) * sc as f32, h(b, 2) * mi as f32);
            (d1 * q5k_u(b, i) as f32 - m1, 31.0 * d1.abs() + m1.abs())
        }
        QuantFormat::Q6K => {
            let (half, r) = (i / 128, i % 128);
            let (quarter, l) = (r / 32, r % 32);
            let lo = (b[64 * half + l + 32 * (quarter % 2)] >> (4 * (quarter / 2))) & 0xF;
            let hi = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
            let q = (lo | (hi << 4)) as i32 - 32;
            let s = h(b, 208) * (b[192 + i / 16] as i8) as f32;
            (s * q as f32, 95.0 * s.abs())
        }
    }
}

/// Element `i` of one block as the kernels' decomposition `(u, s, mn)`, each by
/// the f32 operations of the GGUF dequantizer (`w = s·u + mn`).
fn canon(fmt: QuantFormat, b: &[u8], i: usize) -> (u8, f32, f32) {
    let nib16 = |qs: &[u8]| (qs[i % 16] >> (4 * (i / 16))) & 0xF;
    match fmt {
        QuantFormat::Q4_0 => (nib16(&b[2..]), h(b, 0), -8.0 * h(b, 0)),
        QuantFormat::Q4_1 => (nib16(&b[4..]), h(b, 0), h(b, 2)),
        QuantFormat::Q8_0 => (
            (b[2 + i] as i8 as i16 + 128) as u8,
            h(b, 0),
            -128.0 * h(b, 0),
        ),
        QuantFormat::Q4K => {
            let sb = i / 32;
            let (sc, mi) = scale_min(b, sb);
            let q = (b[16 + 32 * (sb / 2) + i % 32] >> (4 * (sb % 2))) & 0xF;
            (q, h(b, 0) * sc as f32, -(h(b, 2) * mi as f32))
        }
        QuantFormat::Q5K => {
            let (sc, mi) = scale_min(b, i / 32);
            (q5k_u(b, i), h(b, 0) * sc as f32, -(h(b, 2) * mi as f32))
        }
        QuantFormat::Q6K => {
            let (half, r) = (i / 128, i % 128);
            let (quarter, l) = (r / 32, r % 32);
            let lo = (b[64 * half + l + 32 * (quarter % 2)] >> (4 * (quarter / 2))) & 0xF;
            let hi = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
            let s = h(b, 208) * (b[192 + i / 16] as i8) as f32;
            (lo | (hi << 4), s, -32.0 * s)
        }
    }
}

/// The quantized matmul as the kernels define it, straight from the GGUF blocks:
/// per block of 32 (per 16 for Q6_K) `acc = fma(Σu·a, s·d, acc)` then
/// `acc = fma(mn, d·Σa, acc)`, in block order. Every kernel must give these bits
/// (the layout in memory is free; this arithmetic is fixed).
fn reference(fmt: QuantFormat, data: &[u8], n: usize, k: usize, acts: &QuantActs) -> Vec<f32> {
    let (be, bb) = fmt.block_layout();
    let sub = if fmt == QuantFormat::Q6K { 16 } else { 32 };
    let mut out = vec![0.0f32; acts.m() * n];
    for i in 0..acts.m() {
        let (a, ds): (&[i8], Vec<f32>) = (acts.row(i), acts.scales(i).collect());
        for j in 0..n {
            let mut acc = 0.0f32;
            for e0 in (0..k).step_by(sub) {
                let blk = &data[(j * k + e0) / be * bb..][..bb];
                let d = ds[e0 / QB];
                let (mut isum, mut asum) = (0i32, 0i32);
                let (_, s, mn) = canon(fmt, blk, e0 % be);
                for (e, &av) in a.iter().enumerate().skip(e0).take(sub) {
                    let (u, _, _) = canon(fmt, blk, e % be);
                    isum += u as i32 * av as i32;
                    asum += av as i32;
                }
                acc = (isum as f32).mul_add(s * d, acc);
                acc = mn.mul_add(d * asum as f32, acc);
            }
            out[i * n + j] = acc;
        }
    }
    out
}

/// `(values, mags)` of `n` rows of `k`, row-major.
fn decode(fmt: QuantFormat, data: &[u8], n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let (be, bb) = fmt.block_layout();
    (0..n * k)
        .map(|e| element(fmt, &data[e / be * bb..][..bb], e % be))
        .unzip()
}

fn acts_for(m: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    (0..m * k)
        .map(|i| {
            let v = rng.f32();
            // Rows of very different magnitudes, and a few outliers.
            let row_scale = [1.0, 1e3, 1e-20, 30.0][(i / k) % 4];
            if rng.next().is_multiple_of(61) {
                v * 1e4 * row_scale
            } else {
                v * row_scale
            }
        })
        .collect()
}

fn check(fmt: QuantFormat, n: usize, kb: usize, m: usize, seed: u64) -> Result<(), TestCaseError> {
    let mut rng = Rng(seed);
    let k = kb * fmt.block_layout().0;
    let data = blocks(fmt, n, k, &mut rng);
    let w = QuantMatrix::from_gguf(fmt, &data, n, k).unwrap();
    let (want, mags) = decode(fmt, &data, n, k);
    let got = w.dequantize();
    for (e, (a, b)) in got.iter().zip(&want).enumerate() {
        // Equal as numbers (`0.0 == -0.0`: `128·d - 128·d` is +0 where `0·d` may be -0).
        prop_assert!(a == b, "{} element {}: {} vs {}", fmt.name(), e, a, b);
    }

    let x = acts_for(m, k, &mut rng);
    let mut acts = QuantActs::default();
    acts.quantize(&x, m, k).unwrap();
    for i in 0..m {
        let xd = acts.dequantize_row(i);
        let ds: Vec<f32> = acts.scales(i).collect();
        for (e, (&a, &b)) in x[i * k..(i + 1) * k].iter().zip(&xd).enumerate() {
            let d = ds[e / QB];
            // d/2 from rounding to an integer, plus f32's roundings of 1/d, x·(1/d)
            // and d·a: at most 3 units of roundoff of |x| (1.5 ε|x|).
            prop_assert!(
                (a - b).abs() <= d * 0.5 + 2.0 * f32::EPSILON * a.abs(),
                "act {a} vs {b}, d {d}"
            );
        }
    }

    let mut outs = Vec::new();
    for kernel in [
        QuantKernel::Portable,
        QuantKernel::Avx2,
        QuantKernel::Avx512Vnni,
    ] {
        if !kernel.available() {
            continue;
        }
        let mut out = vec![f32::NAN; m * n];
        matmul_quant_acts(&acts, &w, &mut out, n, kernel).unwrap();
        outs.push((kernel, out));
    }
    let want_bits = reference(fmt, &data, n, k, &acts);
    for (kernel, o) in &outs {
        for (a, b) in o.iter().zip(&want_bits) {
            prop_assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{:?} vs the reference: {} vs {}",
                kernel,
                a,
                b
            );
        }
    }
    let (_, out) = &outs[0];
    for (kernel, o) in &outs[1..] {
        for (a, b) in o.iter().zip(out) {
            prop_assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{:?} vs portable: {} vs {}",
                kernel,
                a,
                b
            );
        }
    }
    for i in 0..m {
        let xd = acts.dequantize_row(i);
        for j in 0..n {
            let (wr, mr) = (&got[j * k..(j + 1) * k], &mags[j * k..(j + 1) * k]);
            let exact: f64 = wr.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = mr
                .iter()
                .zip(&xd)
                .map(|(&a, &b)| 2.0 * (a * b).abs() as f64)
                .sum();
            let tol = (8.0 + 2.0 * (k / QB) as f64) * f32::EPSILON as f64 * mag;
            let o = out[i * n + j] as f64;
            prop_assert!(
                (o - exact).abs() <= tol,
                "{} ({i}, {j}): {o} vs {exact} (tol {tol})",
                fmt.name()
            );
        }
    }

    // Batch invariance: each row alone, through the public entry point.
    let mut all = vec![0.0; m * n];
    matmul_quant(&x, &w, &mut all, m).unwrap();
    let mut alone = vec![0.0; n];
    for i in 0..m {
        matmul_quant(&x[i * k..(i + 1) * k], &w, &mut alone, 1).unwrap();
        prop_assert_eq!(&all[i * n..(i + 1) * n], &alone[..], "row {} of {}", i, m);
    }
    Ok(())
}

fn format() -> impl Strategy<Value = QuantFormat> {
    prop::sample::select(QuantFormat::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn quant_matmul_matches_reference(fmt in format(), n in 1usize..40, kb in 1usize..4, m in 1usize..20, seed in any::<u64>()) {
        // K formats have 256-element blocks: fewer of them keep cases fast.
        // Odd counts too: Q4_0, Q8_0 and Q6_K pack units in pairs.
        let kb = if fmt.block_layout().0 == 256 { kb } else { 2 * kb - (seed % 2) as usize };
        check(fmt, n, kb, m, seed)?;
    }

    #[test]
    fn q8_0_quantization_rounds_to_nearest(n in 1usize..20, kb in 1usize..4, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let k = kb * QB;
        let w: Vec<f32> = (0..n * k).map(|i| rng.f32() * [1.0, 1e-3, 1e4][i % 3]).collect();
        let q = QuantMatrix::quantize_q8_0(&w, n, k).unwrap().dequantize();
        for (blk, qb) in w.chunks_exact(QB).zip(q.chunks_exact(QB)) {
            let d = blk.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
            for (a, b) in blk.iter().zip(qb) {
                // f32 roundoff of the scale and of d·q adds up to 2ε|a|.
                prop_assert!((a - b).abs() <= d * 0.5 * (1.0 + 1e-5) + 2.0 * f32::EPSILON * a.abs() + f32::MIN_POSITIVE, "{a} vs {b}, d {d}");
            }
        }
    }
}

#[test]
fn batches_past_one_pass_of_rows_match_the_reference() {
    // AVX-512 runs more than 5 rows in passes of up to 64 (`rows`): 67 is a
    // full pass then 3 rows for the register kernel, 70 a pass then a pass of 6;
    // each row must stay the reference's bits (and its own bits alone).
    for (i, fmt) in QuantFormat::ALL.into_iter().enumerate() {
        let kb = if fmt.block_layout().0 == 256 { 1 } else { 3 };
        for m in [6, 67, 70] {
            check(fmt, 20, kb, m, 100 + i as u64).unwrap();
        }
    }
}

/// Every integer at its format's extreme `u` (Q8_0: `q = -128`) against activations
/// all at ±127: the largest integer sums the kernels form (AVX2's i16 partial sums,
/// 8 groups of 4-bit `u`, 4 of Q5_K's 5-bit, 2 of Q6_K's 6-bit) stay exact.
#[test]
fn the_largest_integer_sums_stay_exact() {
    let d = f16::from_f32(0.01).to_le_bytes();
    for fmt in QuantFormat::ALL {
        let (be, bb) = fmt.block_layout();
        let (n, k) = (QP, 2 * be);
        let fill = if fmt == QuantFormat::Q8_0 { 0x80 } else { 0xFF };
        let mut data = vec![fill; n * k / be * bb];
        let fields: &[usize] = match fmt {
            QuantFormat::Q4_0 | QuantFormat::Q8_0 => &[0],
            QuantFormat::Q6K => &[208],
            _ => &[0, 2],
        };
        for b in data.chunks_exact_mut(bb) {
            for &o in fields {
                b[o..o + 2].copy_from_slice(&d);
            }
        }
        let w = QuantMatrix::from_gguf(fmt, &data, n, k).unwrap();
        // 1 row: the register tiles; 7: the passes on AVX-512 and AVX2.
        for m in [1, 7] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| if (i / k) % 2 == 0 { 1.0 } else { -1.0 })
                .collect();
            let mut acts = QuantActs::default();
            acts.quantize(&x, m, k).unwrap();
            assert!(acts.row(0).iter().all(|&a| a == 127));
            let want = reference(fmt, &data, n, k, &acts);
            for kernel in QuantKernel::ALL.into_iter().filter(|q| q.available()) {
                let mut out = vec![f32::NAN; m * n];
                matmul_quant_acts(&acts, &w, &mut out, n, kernel).unwrap();
                let same = out
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{} {:?} m {m}: {:?} vs {:?}",
                    fmt.name(),
                    kernel,
                    &out[..2],
                    &want[..2]
                );
            }
        }
    }
}

#[test]
fn a_large_matrix_in_parallel_matches_the_portable_kernel() {
    // Big enough for the parallel split (and ragged: n is not a multiple of 16).
    let (n, m) = (1000, 9);
    let mut rng = Rng(7);
    for fmt in [QuantFormat::Q4_1, QuantFormat::Q8_0, QuantFormat::Q5K] {
        let k = if fmt.block_layout().0 == 256 {
            768
        } else {
            576
        };
        let data = blocks(fmt, n, k, &mut rng);
        let w = QuantMatrix::from_gguf(fmt, &data, n, k).unwrap();
        let x = acts_for(m, k, &mut rng);
        let mut acts = QuantActs::default();
        acts.quantize(&x, m, k).unwrap();
        let mut fast = vec![0.0; m * n];
        matmul_quant(&x, &w, &mut fast, m).unwrap();
        let mut slow = vec![0.0; m * n];
        matmul_quant_acts(&acts, &w, &mut slow, n, QuantKernel::Portable).unwrap();
        assert!(fast
            .iter()
            .zip(&slow)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn bad_shapes_are_refused() {
    let data = vec![0u8; 20 * 2];
    assert!(QuantMatrix::from_gguf(QuantFormat::Q4_1, &data, 1, 48).is_err());
    assert!(QuantMatrix::from_gguf(QuantFormat::Q4_1, &data, 2, 32).is_ok());
    assert!(QuantMatrix::from_gguf(QuantFormat::Q4_1, &data, 3, 32).is_err());
    assert!(QuantMatrix::quantize_q8_0(&[0.0; 40], 1, 40).is_err());
    let w = QuantMatrix::from_gguf(QuantFormat::Q4_1, &data, 2, 32).unwrap();
    let mut out = vec![0.0; 3];
    assert!(matmul_quant(&[0.0; 32], &w, &mut out, 1).is_err());
    assert!(matmul_quant(&[0.0; 31], &w, &mut out[..2], 1).is_err());
}

/// Bits per weight held, against the file's: the repacking never widens.
#[test]
fn matrices_are_held_at_their_files_bits_per_weight() {
    let mut rng = Rng(11);
    let (n, k) = (64, 2048);
    // (format, held bits per weight): the file's, except Q4_K's and Q5_K's 6-bit
    // sub-block scales and mins held as bytes (4.625 against 4.5, 5.625 against 5.5).
    for (fmt, bits) in [
        (QuantFormat::Q4_0, 4.5),
        (QuantFormat::Q4_1, 5.0),
        (QuantFormat::Q8_0, 8.5),
        (QuantFormat::Q4K, 4.625),
        (QuantFormat::Q5K, 5.625),
        (QuantFormat::Q6K, 6.5625),
    ] {
        let (be, bb) = fmt.block_layout();
        let file = (bb * 8) as f64 / be as f64;
        let data = blocks(fmt, n, k, &mut rng);
        let w = QuantMatrix::from_gguf(fmt, &data, n, k).unwrap();
        let held = (w.num_bytes() * 8) as f64 / (n * k) as f64;
        // Up to 63 bytes of padding per panel.
        let pad = (63 * 8) as f64 / (QP * k) as f64;
        assert!(
            held >= bits && held <= bits + pad,
            "{}: {held} bits",
            fmt.name()
        );
        assert!(
            held <= file * 1.05,
            "{}: {held} vs the file's {file}",
            fmt.name()
        );
    }
    // Q4_0 with d = 65504: its offset -8·d is no f16, and needs none (it is derived).
    let mut data = blocks(QuantFormat::Q4_0, QP, 64, &mut rng);
    data[0..2].copy_from_slice(&f16::from_f32(65504.0).to_le_bytes());
    let big = QuantMatrix::from_gguf(QuantFormat::Q4_0, &data, QP, 64).unwrap();
    assert_eq!(big.num_bytes(), 2 * (32 + 256));
    assert_eq!(
        big.dequantize()[0],
        65504.0 * (data[2] & 0xF) as f32 - 8.0 * 65504.0
    );
    // Q8_0 quantized at load keeps f32 scales unless each is an f16 exactly.
    let w: Vec<f32> = (0..QP * 64).map(|_| rng.f32()).collect();
    assert!(!QuantMatrix::quantize_q8_0(&w, QP, 64).unwrap().f16_scales());
    let ones = vec![127.0f32; QP * 64];
    assert!(QuantMatrix::quantize_q8_0(&ones, QP, 64)
        .unwrap()
        .f16_scales());
}

/// Batch invariance at serving sizes: each row of an m = 256 call (in parallel, in pools of 1 and 3 threads) has the bits of the same row
/// alone (m = 1): activations are quantized per row and each output is one
/// accumulator over the blocks in order, whatever the tiling and the thread split.
#[test]
fn rows_of_a_large_batch_equal_rows_alone_in_any_pool() {
    // k a multiple of the K formats' 256-element blocks.
    let (n, k, m) = (1000, 768, 256);
    let mut rng = Rng(11);
    for fmt in [QuantFormat::Q4_1, QuantFormat::Q5K, QuantFormat::Q6K] {
        let data = blocks(fmt, n, k, &mut rng);
        let w = QuantMatrix::from_gguf(fmt, &data, n, k).unwrap();
        let x = acts_for(m, k, &mut rng);
        let mut alone = vec![0.0; m * n];
        for i in 0..m {
            matmul_quant(
                &x[i * k..(i + 1) * k],
                &w,
                &mut alone[i * n..(i + 1) * n],
                1,
            )
            .unwrap();
        }
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut all = vec![0.0; m * n];
            pool.install(|| matmul_quant(&x, &w, &mut all, m).unwrap());
            let bad = (0..m * n).find(|&e| all[e].to_bits() != alone[e].to_bits());
            assert_eq!(bad, None, "{} with {threads} threads", fmt.name());
        }
    }
}
