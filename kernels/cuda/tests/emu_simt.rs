//! The emulator itself: shuffles (down, width), votes, atomics, dynamic shared memory,
//! 2-D blocks, and its bf16/f16 conversions against the `half` crate (round to nearest
//! even, subnormals, overflow, NaN).

use half::{bf16, f16};
use pagoda_cuda_kernels::selftest;
use proptest::prelude::*;

#[test]
fn primitives() {
    let (out, f) = selftest::run();
    // Each thread contributes dyn[(tid + 1) % 64] = (tid + 1) % 64; lane 0 holds the warp sum.
    let warp_sum = |w: i32| (0..32).map(|l| (w * 32 + l + 1) % 64).sum::<i32>();
    assert_eq!(out[0], warp_sum(0));
    assert_eq!(out[32], warp_sum(1));
    for tid in 0..64 {
        assert_eq!(
            out[64 + tid],
            (tid as i32 % 32) / 8 * 8 + 3,
            "shfl width 8, lane {tid}"
        );
    }
    assert_eq!(out[128] as u32, 0xaaaa_aaaa, "ballot of odd lanes");
    assert_eq!(
        (out[129], out[130]),
        (1, 0),
        "any(lane == 5), all(lane < 31)"
    );
    assert_eq!(out[131], (0..64).sum::<i32>(), "atomicAdd int");
    assert_eq!(out[132], 0, "2-D threadIdx");
    assert_eq!(out[133], 63 * 3, "atomicMax int");
    assert_eq!(f[0], 32.0, "atomicAdd f32");
    assert_eq!(f[1], 53.0, "atomic_max_f32");
}

#[test]
fn conversions_round_trip_every_16_bit_pattern() {
    for bits in 0..=u16::MAX {
        let b = bf16::from_bits(bits);
        let h = f16::from_bits(bits);
        let (eb, eh) = (selftest::bf16_to_f32(bits), selftest::f16_to_f32(bits));
        assert!(
            eb.to_bits() == b.to_f32().to_bits() || (eb.is_nan() && b.is_nan()),
            "bf16 {bits:#x}"
        );
        assert!(
            eh.to_bits() == h.to_f32().to_bits() || (eh.is_nan() && h.is_nan()),
            "f16 {bits:#x}"
        );
    }
}

fn check_from_f32(x: f32) -> Result<(), TestCaseError> {
    let (b, h) = (selftest::f32_to_bf16(x), selftest::f32_to_f16(x));
    if x.is_nan() {
        prop_assert!(bf16::from_bits(b).is_nan() && f16::from_bits(h).is_nan());
    } else {
        prop_assert_eq!(b, bf16::from_f32(x).to_bits(), "bf16 of {}", x);
        prop_assert_eq!(h, f16::from_f32(x).to_bits(), "f16 of {}", x);
    }
    Ok(())
}

#[test]
fn conversion_edges() {
    for x in [
        0.0,
        -0.0,
        65504.0,
        65519.99,
        65520.0,
        1e-8,
        5.96e-8,
        2.98e-8,
        6.1e-5,
        f32::INFINITY,
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::NAN,
    ] {
        check_from_f32(x).unwrap();
        check_from_f32(-x).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, ..ProptestConfig::default() })]
    #[test]
    fn from_f32_matches_half(bits in any::<u32>()) {
        check_from_f32(f32::from_bits(bits))?;
    }
}
