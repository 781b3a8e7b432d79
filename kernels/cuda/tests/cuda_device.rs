//! The kernels on a real GPU (feature `cuda`) against the same f64 references and
//! tolerances as the emulator tests, plus the tensor cores against the emulator's mma.
//! Without a driver or a device the test says why and passes: that is the CPU
//! machines' case, and `probe` must report it as an error, never panic.
#![cfg(feature = "cuda")]

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use pagoda_cuda_kernels::cuda::{probe, CudaKernels, PTXAS_REPORT};
use pagoda_cuda_kernels::{
    emu, AttnParams, Dtype, Element, Error, MmaProbeParams, SplitPlan, WriteKvParams, PAGED,
};
use pagoda_cuda_testkit::*;
use std::sync::Arc;

fn device() -> Option<CudaKernels> {
    match CudaKernels::new(0) {
        Ok(k) => Some(k),
        Err(e @ (Error::NoDriver | Error::NoDevice(_))) => {
            eprintln!("skipped, no GPU here: {e}");
            None
        }
        Err(e) => panic!("CUDA error other than no driver/no device: {e}"),
    }
}

#[test]
fn probe_never_panics() {
    match probe(0) {
        Ok(n) => assert!(n >= 1),
        Err(Error::NoDriver | Error::NoDevice(_)) => {}
        Err(e) => panic!("unexpected: {e}"),
    }
    assert!(probe(1 << 20).is_err());
}

#[test]
fn ptxas_report_has_every_hot_kernel_without_spills() {
    for k in [
        "pg_paged_bf16_d128",
        "pg_merge_states_bf16",
        "pg_write_kv_bf16",
        "pg_rms_norm_bf16_bf16",
        "pg_add_rms_norm_bf16_bf16",
        "pg_rope_kv_bf16_bf16",
        "pg_silu_mul_bf16",
        "pg_argmax_f32",
    ] {
        let lines: Vec<&str> = PTXAS_REPORT
            .lines()
            .filter(|l| l.starts_with(&format!("{k} ")))
            .collect();
        assert_eq!(
            lines.len(),
            2,
            "{k}: one line per arch (sm_80, sm_90) in\n{PTXAS_REPORT}"
        );
        for l in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!((f[3], f[4]), ("0", "0"), "{k} spills: {l}");
        }
    }
}

fn up<T: cudarc::driver::DeviceRepr>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    s.clone_htod(v).expect("upload")
}

/// Device copies of a case's buffers and the params that point at them.
struct Dev<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    out: CudaSlice<T>,
    lse: CudaSlice<f32>,
    qsl: CudaSlice<u32>,
    seq_lens: CudaSlice<u32>,
    table: CudaSlice<u32>,
}

fn params<T: Conv>(
    s: &Arc<CudaStream>,
    d: &mut Dev<T>,
    case: &Case<T>,
    seqs: std::ops::Range<usize>,
) -> AttnParams {
    let ptr = |p: u64| p as usize as *const std::ffi::c_void;
    let (q, _a) = d.q.device_ptr(s);
    let (k, _b) = d.k.device_ptr(s);
    let (v, _c) = d.v.device_ptr(s);
    let (qsl, _d) = d.qsl.device_ptr(s);
    let (sl, _e) = d.seq_lens.device_ptr(s);
    let (bt, _f) = d.table.device_ptr(s);
    let (out, _g) = d.out.device_ptr_mut(s);
    let out = ptr(out) as *mut _;
    let (lse, _h) = d.lse.device_ptr_mut(s);
    let lse = ptr(lse) as *mut f32;
    let rows = (case.qsl[seqs.end] - case.qsl[seqs.start]) as i32;
    let max_q = seqs
        .clone()
        .map(|i| case.qsl[i + 1] - case.qsl[i])
        .max()
        .unwrap_or(0) as i32;
    AttnParams {
        q: ptr(q),
        key_cache: ptr(k),
        value_cache: ptr(v),
        out,
        lse,
        query_start_loc: ptr(qsl).cast(),
        seq_lens: ptr(sl).cast(),
        block_table: ptr(bt).cast(),
        seq_begin: seqs.start as i32,
        seq_end: seqs.end as i32,
        num_heads: case.shape.num_heads as i32,
        num_kv_heads: case.shape.num_kv_heads as i32,
        head_dim: case.shape.head_dim as i32,
        block_size: case.shape.block_size as i32,
        max_blocks_per_seq: case.max_blocks as i32,
        max_q_len: max_q,
        num_rows: rows,
        scale: case.shape.scale,
        ..AttnParams::default()
    }
}

/// paged (decode rows, split-KV + `merge_states`) against the f64 reference. The
/// backend crates' kernels (`naive.cu`, `flash.cu`) run on a GPU in their crates'
/// conformance suites (`--features cuda`).
fn device_case<T: Conv + DeviceRepr + ValidAsZeroBits>(kern: &CudaKernels, d: usize, bs: usize) {
    let s = kern.context().default_stream();
    let seqs = [
        SeqSpec { q_len: 1, ctx: 700 },
        SeqSpec { q_len: 1, ctx: 5 },
        SeqSpec {
            q_len: 1,
            ctx: 2000,
        },
    ];
    let case = Case::<T>::new(&seqs, 8, 2, d, bs, 11);
    let mut dev = Dev {
        q: up(&s, &case.q),
        k: up(&s, &case.k),
        v: up(&s, &case.v),
        out: s.alloc_zeros::<T>(case.q.len()).unwrap(),
        lse: s.alloc_zeros::<f32>(case.num_tokens * 8).unwrap(),
        qsl: up(&s, &case.qsl),
        seq_lens: up(&s, &case.seq_lens),
        table: up(&s, &case.block_table),
    };
    let (want, want_lse) = case.reference(0..3);
    let what = format!("{:?} d{d} bs{bs}", T::DTYPE);
    let plan = SplitPlan::choose(2001, bs, 3 * 2, 132);
    let (wo, wl) = plan.workspace_len(3, 8, d);
    let mut split_out = s.alloc_zeros::<f32>(wo.max(1)).unwrap();
    let mut split_lse = s.alloc_zeros::<f32>(wl.max(1)).unwrap();
    let mut p = params(&s, &mut dev, &case, 0..3);
    p.num_splits = plan.num_splits as i32;
    p.partition_size = plan.partition_size as i32;
    let (so, _x) = split_out.device_ptr_mut(&s);
    let (sl, _y) = split_lse.device_ptr_mut(&s);
    p.split_out = so as usize as *mut f32;
    p.split_lse = sl as usize as *mut f32;
    assert!(plan.num_splits > 1, "{plan:?}: the merge must run");
    // SAFETY: every pointer is a live allocation of this context sized for `case`; the
    // split buffers hold workspace_len floats, written by `paged` before the merge.
    unsafe {
        kern.attn(&s, &PAGED, &p, T::DTYPE).unwrap();
        kern.merge_states(&s, &p, T::DTYPE).unwrap();
    }
    let err = max_err(&s.clone_dtoh(&dev.out).unwrap(), &want);
    assert!(
        err <= tolerance::<T>(false),
        "paged {what} ({plan:?}): {err}"
    );
    check_lse(&s.clone_dtoh(&dev.lse).unwrap(), &want_lse).unwrap();
}

#[test]
fn kernels_on_the_device_match_the_reference() {
    let Some(kern) = device() else { return };
    kern.preload().expect("load fatbins");
    for (d, bs) in [(128usize, 16usize), (64, 32)] {
        device_case::<bf16>(&kern, d, bs);
        device_case::<f16>(&kern, d, bs);
        device_case::<f32>(&kern, d, bs);
    }
}

#[test]
fn write_kv_on_the_device_matches_the_emulator() {
    let Some(kern) = device() else { return };
    let s = kern.context().default_stream();
    let (kvh, d, bs, blocks) = (2usize, 64usize, 16usize, 4usize);
    let slots: Vec<i64> = vec![5, -1, 63, 0, 17];
    let mut rng = Rng(5);
    let key: Vec<f32> = (0..slots.len() * kvh * d).map(|_| rng.unit()).collect();
    let value: Vec<f32> = (0..key.len()).map(|_| rng.unit()).collect();
    let mut kc = vec![bf16::ZERO; blocks * bs * kvh * d];
    let mut vc = kc.clone();
    let shape = emu::Shape::new(kvh, kvh, d, bs, 1.0);
    emu::write_kv(&key, &value, &mut kc, &mut vc, &slots, &shape).unwrap();
    let (dk, dv, ds) = (up(&s, &key), up(&s, &value), up(&s, &slots));
    let mut dkc = s.alloc_zeros::<bf16>(kc.len()).unwrap();
    let mut dvc = s.alloc_zeros::<bf16>(kc.len()).unwrap();
    {
        let (a, _a) = dk.device_ptr(&s);
        let (b, _b) = dv.device_ptr(&s);
        let (c, _c) = dkc.device_ptr_mut(&s);
        let (e, _e) = dvc.device_ptr_mut(&s);
        let (f, _f) = ds.device_ptr(&s);
        let p = WriteKvParams {
            key: a as usize as *const _,
            value: b as usize as *const _,
            key_cache: c as usize as *mut _,
            value_cache: e as usize as *mut _,
            slot_mapping: f as usize as *const i64,
            num_tokens: slots.len() as i32,
            num_kv_heads: kvh as i32,
            head_dim: d as i32,
            block_size: bs as i32,
            src_dtype: Dtype::F32 as i32,
            pad: 0,
        };
        // SAFETY: live allocations of the sizes `p` states; slots inside the pools.
        unsafe { kern.write_kv(&s, &p, bf16::DTYPE) }.unwrap();
    }
    assert_eq!(s.clone_dtoh(&dkc).unwrap(), kc);
    assert_eq!(s.clone_dtoh(&dvc).unwrap(), vc);
}

#[test]
fn tensor_cores_match_the_emulated_mma() {
    let Some(kern) = device() else { return };
    let s = kern.context().default_stream();
    let mut rng = Rng(9);
    let a: Vec<bf16> = (0..256).map(|_| bf16::from_f32(rng.unit())).collect();
    let b: Vec<bf16> = (0..128).map(|_| bf16::from_f32(rng.unit())).collect();
    let c: Vec<f32> = (0..128).map(|_| rng.unit()).collect();
    let want = emu::mma_probe(&a, &b, &c).unwrap();
    let (da, db, dc) = (up(&s, &a), up(&s, &b), up(&s, &c));
    let mut dd = s.alloc_zeros::<f32>(128).unwrap();
    {
        let (pa, _a) = da.device_ptr(&s);
        let (pb, _b) = db.device_ptr(&s);
        let (pc, _c) = dc.device_ptr(&s);
        let (pd, _d) = dd.device_ptr_mut(&s);
        let p = MmaProbeParams {
            a: pa as usize as *const _,
            b: pb as usize as *const _,
            c: pc as usize as *const f32,
            d: pd as usize as *mut f32,
        };
        // SAFETY: the four buffers have the probe's fixed sizes.
        unsafe { kern.mma_probe(&s, &p, bf16::DTYPE) }.unwrap();
    }
    let got = s.clone_dtoh(&dd).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        // Same exact products; only the f32 summation order/rounding may differ.
        assert!(
            (g - w).abs() < 1e-5,
            "D[{i}]: tensor cores {g}, emulator {w}"
        );
    }
}
