//! The packed GEMM against the reference, its batch invariance (a row's output is
//! bit-identical whatever rows share its call), packing round trips and bad input.
//!
//! Tolerance: within 1e-4 relative to Σ|x·w| plus 1e-6 (as for the other matmuls
//! in props.rs: elementwise relative error is meaningless under cancellation).

mod common;

use common::{fixed, round_bf16};
use pagoda_kernels::*;
use proptest::prelude::*;

/// [`common::check_ref`] as a proptest failure.
fn check_ref(
    out: &[f32],
    x: &[f32],
    w: &[f32],
    shape: (usize, usize, usize),
) -> Result<(), TestCaseError> {
    common::check_ref(out, x, w, shape).map_err(TestCaseError::fail)
}

fn vals(n: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-2.0f32..2.0, n)
}

/// m spans the micro-kernel's ragged tails (1..=6) and several row blocks; n
/// spans partial and several panels.
fn case() -> impl Strategy<Value = (usize, usize, usize, Vec<f32>, Vec<f32>)> {
    (
        prop_oneof![1usize..=7, 1usize..70],
        1usize..90,
        prop_oneof![1usize..=64, 1usize..300],
    )
        .prop_flat_map(|(m, k, n)| (Just(m), Just(k), Just(n), vals(m * k), vals(n * k)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn packed_matches_reference((m, k, n, x, w) in case()) {
        let pw = PackedMatrix::pack(&w, n, k).unwrap();
        let mut out = vec![f32::NAN; m * n];
        matmul_packed(&x, &pw, &mut out, m).unwrap();
        check_ref(&out, &x, &w, (m, k, n))?;
    }

    #[test]
    fn packed_rows_do_not_depend_on_the_batch((m, k, n, x, w) in case()) {
        let pw = PackedMatrix::pack(&w, n, k).unwrap();
        let mut out = vec![0.0; m * n];
        matmul_packed(&x, &pw, &mut out, m).unwrap();
        for i in 0..m {
            let mut alone = vec![0.0; n];
            matmul_packed(&x[i * k..(i + 1) * k], &pw, &mut alone, 1).unwrap();
            prop_assert_eq!(&out[i * n..(i + 1) * n], &alone[..], "row {} of {}", i, m);
        }
    }

    #[test]
    fn pack_round_trips((_m, k, n, _x, w) in case()) {
        let pw = PackedMatrix::pack(&w, n, k).unwrap();
        prop_assert_eq!(pw.unpack(), w.clone());
        let mut row = vec![0.0; k];
        for r in [0, n / 2, n - 1] {
            pw.row_into(r, &mut row).unwrap();
            prop_assert_eq!(&row[..], &w[r * k..(r + 1) * k]);
        }
    }
}

#[test]
fn big_shapes_match_reference() {
    // Several row blocks and panels at once, as the model runs them.
    let (m, k, n) = (37, 576, 200);
    let (x, w) = fixed(m, k, n);
    let pw = PackedMatrix::pack(&w, n, k).unwrap();
    let mut out = vec![0.0; m * n];
    matmul_packed(&x, &pw, &mut out, m).unwrap();
    common::check_ref(&out, &x, &w, (m, k, n)).unwrap();
}

#[test]
fn bad_shapes_are_errors() {
    assert!(PackedMatrix::pack(&[0.0; 5], 2, 3).is_err());
    let pw = PackedMatrix::pack(&[1.0; 6], 2, 3).unwrap();
    let mut out = vec![0.0; 4];
    assert!(matmul_packed(&[0.0; 5], &pw, &mut out, 2).is_err());
    assert!(matmul_packed(&[0.0; 6], &pw, &mut out[..3], 2).is_err());
    assert!(pw.row_into(2, &mut [0.0; 3]).is_err());
    assert!(pw.row_into(1, &mut [0.0; 2]).is_err());
    // Empty shapes: nothing to do, zeros for an empty k.
    let empty = PackedMatrix::pack(&[], 3, 0).unwrap();
    let mut z = vec![f32::NAN; 6];
    matmul_packed(&[], &empty, &mut z, 2).unwrap();
    assert_eq!(z, vec![0.0; 6]);
    matmul_packed(&[], &pw, &mut [], 0).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Against the f64 product of the bf16-rounded weights and `x` as the kernel
    /// takes it (rounded on `vdpbf16ps`, not on the fallbacks): what remains is
    /// the f32 accumulation error.
    #[test]
    fn packed_bf16_matches_reference((m, k, n, x, w) in case()) {
        let pw = PackedMatrixBf16::pack(&w, n, k).unwrap();
        let mut out = vec![f32::NAN; m * n];
        matmul_packed_bf16(&x, &pw, &mut out, m).unwrap();
        let (xr, wr) = (common::bf16_x(&x), round_bf16(&w));
        check_ref(&out, &xr, &wr, (m, k, n))?;
        let mut row = vec![0.0; k];
        pw.row_into(n - 1, &mut row).unwrap();
        prop_assert_eq!(&row[..], &wr[(n - 1) * k..]);
    }

    #[test]
    fn packed_bf16_rows_do_not_depend_on_the_batch((m, k, n, x, w) in case()) {
        let pw = PackedMatrixBf16::pack(&w, n, k).unwrap();
        let mut out = vec![0.0; m * n];
        matmul_packed_bf16(&x, &pw, &mut out, m).unwrap();
        for i in 0..m {
            let mut alone = vec![0.0; n];
            matmul_packed_bf16(&x[i * k..(i + 1) * k], &pw, &mut alone, 1).unwrap();
            prop_assert_eq!(&out[i * n..(i + 1) * n], &alone[..], "row {} of {}", i, m);
        }
    }
}

#[test]
fn bf16_long_k_crosses_conversion_chunks() {
    // k = 1537: several 256-pair chunks and an odd tail.
    let (m, k, n) = (7, 1537, 70);
    let (x, w) = fixed(m, k, n);
    let pw = PackedMatrixBf16::pack(&w, n, k).unwrap();
    let mut out = vec![0.0; m * n];
    matmul_packed_bf16(&x, &pw, &mut out, m).unwrap();
    common::check_ref(&out, &common::bf16_x(&x), &round_bf16(&w), (m, k, n)).unwrap();
}
