//! `gemm_host` against its f64 reference (fixed cases and proptests), its batch
//! invariance, and its refusals of bad input.
//!
//! Tolerance (per element, stated once in `tol`): the f32 sum is a depth `k/8 + 10`
//! summation of exactly-representable products' f32 roundings, so
//! `|f32 sum - exact| <= 1.01 · (k/8 + 11) · 2^-24 · Σ|x_t·w_t|`; rounding to a 16-bit
//! out adds `U · |value|` (U = 2^-8 bf16, 2^-11 f16), or in the subnormal range half
//! the subnormal spacing (2^-25 f16, 2^-134 bf16). Inputs are exact in their dtype,
//! so the f64 reference is exact to ~2^-53 relative.

use half::{bf16, f16};
use pagoda_cuda::gemm::{gemm_host, gemm_host_ref, Dtype, Element, GemmError};
use proptest::prelude::*;

fn to<T: Element>(v: &[f32]) -> Vec<T> {
    v.iter()
        .map(|&f| {
            let any: Box<dyn std::any::Any> = match T::DTYPE {
                Dtype::F32 => Box::new(f),
                Dtype::Bf16 => Box::new(bf16::from_f32(f)),
                Dtype::F16 => Box::new(f16::from_f32(f)),
            };
            *any.downcast::<T>().expect("dtype matches type")
        })
        .collect()
}

fn as_f64<T: Element>(v: &[T]) -> Vec<f64> {
    to_f32(v).into_iter().map(f64::from).collect()
}

fn to_f32<T: Element>(v: &[T]) -> Vec<f32> {
    v.iter()
        .map(|x| {
            let a: &dyn std::any::Any = x;
            a.downcast_ref::<f32>()
                .copied()
                .or_else(|| a.downcast_ref::<bf16>().map(|b| b.to_f32()))
                .or_else(|| a.downcast_ref::<f16>().map(|h| h.to_f32()))
                .expect("an Element")
        })
        .collect()
}

fn unit_roundoff(d: Dtype) -> f64 {
    match d {
        Dtype::F32 => 0.0, // the f32 sum is the value: no second rounding
        Dtype::Bf16 => 2f64.powi(-8),
        Dtype::F16 => 2f64.powi(-11),
    }
}

/// Half the spacing of `d`'s subnormals: the absolute rounding error of a result in
/// the subnormal range, where the relative bound `unit_roundoff` does not hold (an f16
/// output of -7.6e-6 is off by up to 3e-8).
fn underflow(d: Dtype) -> f64 {
    match d {
        Dtype::F32 => 0.0,
        Dtype::Bf16 => 2f64.powi(-134),
        Dtype::F16 => 2f64.powi(-25),
    }
}

/// The bound of the module doc, for one element.
fn tol(k: usize, abs_sum: f64, exact: f64, out: Dtype) -> f64 {
    let f32_err = 1.01 * (k as f64 / 8.0 + 11.0) * 2f64.powi(-24) * abs_sum;
    f32_err + unit_roundoff(out) * (exact.abs() + f32_err) + underflow(out) + 1e-30
}

/// Runs gemm_host on `xs`/`ws` (f32 values, rounded to X/W first) and checks every
/// element against the reference; returns the output as f32.
fn check<X: Element, W: Element, O: Element>(
    xs: &[f32],
    ws: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<Vec<f32>, String> {
    let (x, w) = (to::<X>(xs), to::<W>(ws));
    let mut out = vec![O::default(); m * n];
    gemm_host(&x, &w, &mut out, m, n, k).map_err(|e| e.to_string())?;
    let want = gemm_host_ref(&x, &w, m, n, k).map_err(|e| e.to_string())?;
    let (xf, wf) = (as_f64(&x), as_f64(&w));
    let got = to_f32(&out);
    for i in 0..m {
        for j in 0..n {
            let abs: f64 = (0..k).map(|t| (xf[i * k + t] * wf[j * k + t]).abs()).sum();
            let (g, e) = (f64::from(got[i * n + j]), want[i * n + j]);
            let t = tol(k, abs, e, O::DTYPE);
            if (g - e).abs() > t {
                return Err(format!(
                    "{:?}x{:?}->{:?} m={m} n={n} k={k} out[{i},{j}] = {g}, exact {e}, |err| {} > tol {t}",
                    X::DTYPE,
                    W::DTYPE,
                    O::DTYPE,
                    (g - e).abs()
                ));
            }
        }
    }
    Ok(got)
}

#[test]
fn a_hand_computed_case_in_the_pytorch_layout() {
    // x [2, 2], w [3, 2] (out_features x in_features): out = x · wᵀ, [2, 3].
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let w = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
    let mut out = [0.0f32; 6];
    gemm_host(&x, &w, &mut out, 2, 3, 2).unwrap();
    assert_eq!(out, [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
}

#[test]
fn k_zero_writes_zeros_and_empty_shapes_are_no_ops() {
    let mut out = [bf16::ONE; 6];
    gemm_host::<bf16, bf16, bf16>(&[], &[], &mut out, 2, 3, 0).unwrap();
    assert!(out.iter().all(|v| *v == bf16::ZERO));
    gemm_host::<f32, f32, f32>(&[], &[1.0; 4], &mut [], 0, 2, 2).unwrap();
    gemm_host::<f32, f32, f32>(&[1.0; 4], &[], &mut [], 2, 0, 2).unwrap();
}

#[test]
fn bad_input_is_an_error() {
    let x = vec![bf16::ONE; 6];
    let w = vec![bf16::ONE; 6];
    let mut o = vec![bf16::ZERO; 4];
    // Dtype rule: x and w alike, out x's or f32.
    let e = gemm_host(&x, &[f16::ONE; 6], &mut o, 2, 2, 3).unwrap_err();
    assert!(matches!(e, GemmError::Dtypes { .. }), "{e}");
    let e = gemm_host(&x, &w, &mut [f16::ZERO; 4], 2, 2, 3).unwrap_err();
    assert!(matches!(e, GemmError::Dtypes { .. }), "{e}");
    gemm_host(&x, &w, &mut [0.0f32; 4], 2, 2, 3).unwrap();
    // Lengths, each named.
    for (xl, wl, ol, what) in [(5, 6, 4, "x"), (6, 7, 4, "w"), (6, 6, 5, "out")] {
        let e = gemm_host(
            &x[..xl.min(6)],
            &vec![bf16::ONE; wl],
            &mut vec![bf16::ZERO; ol],
            2,
            2,
            3,
        )
        .unwrap_err();
        assert!(
            matches!(e, GemmError::Length { what: w, .. } if w == what),
            "{e}"
        );
    }
    // Overflowing shapes.
    let e = gemm_host::<f32, f32, f32>(&[], &[], &mut [], usize::MAX, 2, 2).unwrap_err();
    assert!(matches!(e, GemmError::TooLarge { .. }), "{e}");
}

#[test]
fn smollm2_shapes_match_the_reference() {
    // The LM head's and MLP's shapes of SmolLM2-135M, a few tokens, bf16 (a slice of the
    // vocabulary keeps the f64 reference quick).
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    for (m, n, k) in [(5, 1536, 576), (3, 576, 1536), (7, 2048, 576)] {
        let xs: Vec<f32> = (0..m * k).map(|_| next()).collect();
        let ws: Vec<f32> = (0..n * k).map(|_| next()).collect();
        check::<bf16, bf16, bf16>(&xs, &ws, m, n, k).unwrap();
        check::<bf16, bf16, f32>(&xs, &ws, m, n, k).unwrap();
    }
}

fn values(len: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-2.0f32..2.0, len)
}

fn problem() -> impl Strategy<Value = (usize, usize, usize, Vec<f32>, Vec<f32>)> {
    // n crosses the 4-row kernel and 32-row blocks; m crosses the 64-row passes.
    (1usize..80, 1usize..70, 0usize..90)
        .prop_flat_map(|(m, n, k)| (Just(m), Just(n), Just(k), values(m * k), values(n * k)))
}

proptest! {
    // Failing seeds persist beside this file (tests/gemm_host.proptest-regressions).
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_dtype_combination_matches_the_f64_reference((m, n, k, xs, ws) in problem()) {
        check::<f32, f32, f32>(&xs, &ws, m, n, k).map_err(TestCaseError::fail)?;
        check::<bf16, bf16, bf16>(&xs, &ws, m, n, k).map_err(TestCaseError::fail)?;
        check::<bf16, bf16, f32>(&xs, &ws, m, n, k).map_err(TestCaseError::fail)?;
        check::<f16, f16, f16>(&xs, &ws, m, n, k).map_err(TestCaseError::fail)?;
        check::<f16, f16, f32>(&xs, &ws, m, n, k).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn a_rows_result_does_not_depend_on_the_batch((m, n, k, xs, ws) in problem(), pick in 0usize..1000) {
        let (x, w) = (to::<bf16>(&xs), to::<bf16>(&ws));
        let mut all = vec![0.0f32; m * n];
        gemm_host(&x, &w, &mut all, m, n, k).unwrap();
        // Each row alone (m = 1) and the picked row inside a batch with other rows.
        for i in 0..m {
            let mut solo = vec![0.0f32; n];
            gemm_host(&x[i * k..(i + 1) * k], &w, &mut solo, 1, n, k).unwrap();
            prop_assert_eq!(&solo[..], &all[i * n..(i + 1) * n], "row {} of {}", i, m);
        }
        let i = pick % m;
        let mut batch = x.clone();
        batch.extend_from_slice(&x[i * k..(i + 1) * k]); // the row again, last, at index m
        let mut out = vec![0.0f32; (m + 1) * n];
        gemm_host(&batch, &w, &mut out, m + 1, n, k).unwrap();
        prop_assert_eq!(&out[m * n..], &all[i * n..(i + 1) * n]);
    }
}
