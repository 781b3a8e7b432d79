//! `DeviceGemm` (cuBLAS and CUTLASS) on `cuda:0` against the f64 reference of
//! `gemm_host`, on random bf16 (and f16, f32) inputs, several shapes including m = 1 and
//! odd m. Where no device is usable each test says "skipped, no GPU here: <why>" and
//! passes, unless `PAGODA_REQUIRE_DEVICE` is set (scripts/device-check.sh), where that is a
//! failure. Without the `cuda` feature the file is empty.
//!
//! Tolerance: tensor cores and cuBLAS sum in f32 in an order we do not know, so the bound
//! is the worst case of any order, `(k + 2) · 2^-24 · Σ|x_t·w_t|`, plus the output's
//! rounding `U · |value|` (U = 2^-8 bf16, 2^-11 f16, 0 f32). A layout or indexing bug is
//! off by O(|value|), far beyond it.
#![cfg(feature = "cuda")]

use pagoda_core::{
    bf16, f16, open_device, DType, Device, DeviceRuntime, HostSlice, HostSliceMut, Shape, Storage,
};
use pagoda_cuda::gemm::{gemm_host_ref, DeviceGemm, Dtype, GemmError, GemmImpl};
use std::sync::Arc;

const REQUIRE_DEVICE_ENV: &str = "PAGODA_REQUIRE_DEVICE";

/// The GEMM and the device runtime, or `None` after saying why (a failure where the
/// device is required).
fn setup(imp: GemmImpl) -> Option<(DeviceGemm, Arc<dyn DeviceRuntime>)> {
    let opened = DeviceGemm::new(0, imp).and_then(|g| {
        open_device(Device::Cuda(0))
            .map(|rt| (g, rt))
            .map_err(|e| GemmError::Operand {
                what: "runtime",
                reason: e.to_string(),
            })
    });
    match opened {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(
                std::env::var_os(REQUIRE_DEVICE_ENV).is_none(),
                "{imp:?}: {e}, but {REQUIRE_DEVICE_ENV} is set"
            );
            println!("skipped, no GPU here: {e}");
            None
        }
    }
}

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `v` rounded to `d`, as a device buffer and as the exact f32 values it holds.
fn upload(rt: &dyn DeviceRuntime, v: &[f32], d: Dtype) -> (Storage, Vec<f32>) {
    let (dt, exact): (DType, Vec<f32>) = match d {
        Dtype::F32 => (DType::F32, v.to_vec()),
        Dtype::Bf16 => (
            DType::BF16,
            v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
        ),
        Dtype::F16 => (
            DType::F16,
            v.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
        ),
    };
    let mut s = rt
        .alloc_zeroed(dt, Shape::flat(v.len()))
        .expect("device memory");
    match d {
        Dtype::F32 => rt.upload(s.view_mut(), HostSlice::F32(&exact)),
        Dtype::Bf16 => {
            let h: Vec<bf16> = exact.iter().map(|&x| bf16::from_f32(x)).collect();
            rt.upload(s.view_mut(), HostSlice::BF16(&h))
        }
        Dtype::F16 => {
            let h: Vec<f16> = exact.iter().map(|&x| f16::from_f32(x)).collect();
            rt.upload(s.view_mut(), HostSlice::F16(&h))
        }
    }
    .expect("upload");
    (s, exact)
}

fn download(rt: &dyn DeviceRuntime, s: &Storage) -> Vec<f32> {
    match s.dtype() {
        DType::F32 => {
            let mut h = vec![0.0f32; s.len()];
            rt.download(s.view(), HostSliceMut::F32(&mut h))
                .expect("download");
            h
        }
        DType::BF16 => {
            let mut h = vec![bf16::ZERO; s.len()];
            rt.download(s.view(), HostSliceMut::BF16(&mut h))
                .expect("download");
            h.iter().map(|x| x.to_f32()).collect()
        }
        DType::F16 => {
            let mut h = vec![f16::ZERO; s.len()];
            rt.download(s.view(), HostSliceMut::F16(&mut h))
                .expect("download");
            h.iter().map(|x| x.to_f32()).collect()
        }
        DType::F8E4M3 => {
            let mut h = vec![pagoda_core::F8E4M3::ZERO; s.len()];
            rt.download(s.view(), HostSliceMut::F8E4M3(&mut h))
                .expect("download");
            h.iter().map(|x| x.to_f32()).collect()
        }
    }
}

fn unit_roundoff(d: Dtype) -> f64 {
    match d {
        Dtype::F32 => 0.0,
        Dtype::Bf16 => 2f64.powi(-8),
        Dtype::F16 => 2f64.powi(-11),
    }
}

/// Runs one GEMM on the device and checks every element against the f64 reference.
fn check(
    g: &DeviceGemm,
    rt: &dyn DeviceRuntime,
    (m, n, k): (usize, usize, usize),
    input: Dtype,
    out_dtype: Dtype,
) -> Result<(), String> {
    let seed = (m * 1_000_003 + n * 1009 + k) as u64;
    let (x, xv) = upload(rt, &values(m * k, seed), input);
    let (w, wv) = upload(rt, &values(n * k, seed + 1), input);
    let (mut out, _) = upload(rt, &vec![f32::NAN; m * n], out_dtype);
    g.gemm(&x.view(), &w.view(), &mut out.view_mut(), m, n, k)
        .map_err(|e| e.to_string())?;
    rt.synchronize().map_err(|e| e.to_string())?;
    let got = download(rt, &out);
    let want = gemm_host_ref(&xv, &wv, m, n, k).map_err(|e| e.to_string())?;
    for i in 0..m {
        for j in 0..n {
            let abs: f64 = (0..k)
                .map(|t| f64::from(xv[i * k + t] * wv[j * k + t]).abs())
                .sum();
            let (v, e) = (f64::from(got[i * n + j]), want[i * n + j]);
            let f32_err = (k as f64 + 2.0) * 2f64.powi(-24) * abs;
            let tol = f32_err + unit_roundoff(out_dtype) * (e.abs() + f32_err) + 1e-30;
            // False for NaN too (out starts as NaN: an unwritten element fails).
            let within = (v - e).abs() <= tol;
            if !within {
                return Err(format!(
                    "{:?} {input:?}->{out_dtype:?} m={m} n={n} k={k}: out[{i},{j}] = {v}, exact {e}, tol {tol}",
                    g.implementation()
                ));
            }
        }
    }
    Ok(())
}

/// Shapes: m = 1 (decode), odd m, a tile edge in every dimension, and a larger one.
const SHAPES: [(usize, usize, usize); 7] = [
    (1, 64, 64),
    (1, 4096, 576),
    (3, 136, 72),
    (7, 264, 1536),
    (33, 512, 256),
    (131, 200, 520),
    (256, 512, 2048),
];

#[test]
fn cublas_matches_the_reference() {
    let Some((g, rt)) = setup(GemmImpl::Cublas) else {
        return;
    };
    for shape in SHAPES {
        for (input, out) in [
            (Dtype::Bf16, Dtype::Bf16),
            (Dtype::Bf16, Dtype::F32),
            (Dtype::F16, Dtype::F16),
            (Dtype::F16, Dtype::F32),
            (Dtype::F32, Dtype::F32),
        ] {
            check(&g, &*rt, shape, input, out).unwrap();
        }
    }
    // Shapes CUTLASS refuses are fine here: k and n not multiples of 8.
    check(&g, &*rt, (5, 13, 7), Dtype::Bf16, Dtype::Bf16).unwrap();
}

#[test]
fn cutlass_matches_the_reference() {
    let Some((g, rt)) = setup(GemmImpl::Cutlass) else {
        return;
    };
    for shape in SHAPES {
        for d in [Dtype::Bf16, Dtype::F16] {
            check(&g, &*rt, shape, d, d).unwrap();
        }
    }
}

#[test]
fn what_cutlass_cannot_run_is_a_clear_error() {
    let Some((g, rt)) = setup(GemmImpl::Cutlass) else {
        return;
    };
    for (shape, input, out) in [
        ((4, 64, 64), Dtype::F32, Dtype::F32),
        ((4, 64, 64), Dtype::Bf16, Dtype::F32),
        ((4, 64, 60), Dtype::Bf16, Dtype::Bf16),
        ((4, 60, 64), Dtype::F16, Dtype::F16),
    ] {
        let e = check(&g, &*rt, shape, input, out).unwrap_err();
        assert!(e.contains("Cutlass"), "{e}");
    }
    // Views on another device, or of the wrong length, are refused before any launch.
    let (x, _) = upload(&*rt, &values(8 * 64, 1), Dtype::Bf16);
    let (w, _) = upload(&*rt, &values(64 * 64, 2), Dtype::Bf16);
    let (mut out, _) = upload(&*rt, &values(8 * 64, 3), Dtype::Bf16);
    let e = g
        .gemm(&x.view(), &w.view(), &mut out.view_mut(), 8, 64, 63)
        .unwrap_err();
    assert!(matches!(e, GemmError::Length { what: "x", .. }), "{e}");
    let host = vec![bf16::ZERO; 8 * 64];
    let hv = pagoda_core::TensorRef::host(Device::Emu, &host).unwrap();
    let e = g
        .gemm(&hv, &w.view(), &mut out.view_mut(), 8, 64, 64)
        .unwrap_err();
    assert!(matches!(e, GemmError::Operand { what: "x", .. }), "{e}");
}

#[test]
fn k_zero_zeroes_the_output_and_empty_shapes_do_nothing() {
    let Some((g, rt)) = setup(GemmImpl::Cublas) else {
        return;
    };
    let (x, _) = upload(&*rt, &[0.0], Dtype::Bf16);
    let (out, _) = upload(&*rt, &values(3 * 8, 4), Dtype::Bf16);
    let addr = |s: &Storage| s.view().device_ptr().unwrap().addr;
    // SAFETY: k = 0 reads neither x nor w (addresses only checked non-null and aligned);
    // out holds 3·8 bf16 elements.
    unsafe {
        g.gemm_raw(
            (addr(&x), addr(&x), addr(&out)),
            (3, 8, 0),
            Dtype::Bf16,
            Dtype::Bf16,
            Dtype::Bf16,
        )
    }
    .unwrap();
    rt.synchronize().unwrap();
    assert!(download(&*rt, &out).iter().all(|&v| v == 0.0));
    // SAFETY: m = 0 launches nothing and reads nothing.
    unsafe {
        g.gemm_raw(
            (addr(&x), addr(&x), addr(&out)),
            (0, 8, 8),
            Dtype::Bf16,
            Dtype::Bf16,
            Dtype::Bf16,
        )
    }
    .unwrap();
}

#[test]
fn without_a_device_the_reason_is_given() {
    // Runs everywhere: where cuda:0 is unusable, both implementations say why (the same
    // reason the device runtime gives), never panic.
    let Some(why) = pagoda_core::device_unavailable(Device::Cuda(0)) else {
        return;
    };
    for imp in [GemmImpl::Cublas, GemmImpl::Cutlass] {
        match DeviceGemm::new(0, imp) {
            Err(GemmError::Unavailable { reason, .. }) => {
                assert!(
                    reason.contains(why.split(' ').next().unwrap_or("")),
                    "{reason} / {why}"
                )
            }
            other => panic!("{imp:?} on a machine where cuda:0 is unusable ({why}): {other:?}"),
        }
    }
}
