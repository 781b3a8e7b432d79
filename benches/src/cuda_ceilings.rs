//! The device ceilings the CUDA benches compare against (feature `cuda`), measured in the
//! bench's own process: device-to-device copy bandwidth and the cuBLAS bf16 GEMM rate.

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use std::time::Instant;

/// Seconds per call of `f` (after a warm-up call), synchronizing `stream` once per batch
/// of `reps` calls.
pub fn time(stream: &CudaStream, reps: u32, mut f: impl FnMut()) -> f64 {
    f();
    stream.synchronize().expect("synchronize");
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    stream.synchronize().expect("synchronize");
    t.elapsed().as_secs_f64() / f64::from(reps)
}

/// The device's measured ceilings.
#[derive(Debug, Clone, Copy)]
pub struct DeviceCeilings {
    /// Device-to-device copy, bytes read + written per second (1 GiB buffers).
    pub copy_bytes_per_s: f64,
    /// cuBLAS bf16 GEMM (8192³, f32 accumulation), FLOP/s.
    pub gemm_flops: f64,
}

/// Measures [`DeviceCeilings`] on `stream` (panics if the device or cuBLAS fails: a
/// bench's setup).
pub fn ceilings(stream: &Arc<CudaStream>) -> DeviceCeilings {
    try_ceilings(stream).expect("measuring the device ceilings")
}

/// The ceilings of CUDA device `ordinal`, or why they could not be measured. The caller
/// must have checked that a driver is present (cudarc panics without libcuda): open the
/// device through `pagoda_core::open_device` first.
pub fn for_ordinal(ordinal: usize) -> Result<DeviceCeilings, String> {
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("CUDA context: {e}"))?;
    try_ceilings(&ctx.default_stream())
}

/// Seconds per call of a fallible `f` after one warm-up call.
fn try_time(
    stream: &CudaStream,
    reps: u32,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let sync = |s: &CudaStream| s.synchronize().map_err(|e| format!("synchronize: {e}"));
    f()?;
    sync(stream)?;
    let t = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    sync(stream)?;
    Ok(t.elapsed().as_secs_f64() / f64::from(reps))
}

/// A device buffer of `len` bf16 values in [-1, 1) (a repeated pseudo-random block of
/// 1 Mi values: zeros would understate the tensor cores' power draw).
pub fn filled_bf16(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<bf16>, String> {
    const BLOCK: usize = 1 << 20;
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let pattern: Vec<bf16> = (0..BLOCK.min(len))
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            bf16::from_f32((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect();
    let mut buf = stream
        .alloc_zeros::<bf16>(len)
        .map_err(|e| format!("allocation: {e}"))?;
    let mut at = 0;
    while at < len {
        let n = pattern.len().min(len - at);
        let mut dst = buf.slice_mut(at..at + n);
        stream
            .memcpy_htod(&pattern[..n], &mut dst)
            .map_err(|e| format!("upload: {e}"))?;
        at += n;
    }
    Ok(buf)
}

/// [`ceilings`], reporting failures instead of panicking.
pub fn try_ceilings(stream: &Arc<CudaStream>) -> Result<DeviceCeilings, String> {
    let alloc = |e| format!("allocation: {e}");
    let bytes = 1usize << 30;
    let src = stream.alloc_zeros::<u8>(bytes).map_err(alloc)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes).map_err(alloc)?;
    let copy = try_time(stream, 10, || {
        stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| format!("copy: {e}"))
    })?;
    let n = 8192usize;
    // Random operands: on zeros the tensor cores draw less power and clock higher, so
    // the "ceiling" would be ~13 % above what real data reaches.
    let a = filled_bf16(stream, n * n)?;
    let b = filled_bf16(stream, n * n)?;
    let mut c = stream.alloc_zeros::<bf16>(n * n).map_err(alloc)?;
    let blas = CudaBlas::new(stream.clone())
        .map_err(|e| format!("cuBLAS (libcublas on the library path?): {e}"))?;
    let d = n as i32;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: d,
        n: d,
        k: d,
        alpha: bf16::ONE,
        lda: d,
        ldb: d,
        beta: bf16::ZERO,
        ldc: d,
    };
    let gemm = try_time(stream, 5, || {
        // SAFETY: a, b and c are n x n device matrices of this stream's context,
        // matching the dimensions and leading dimensions of `cfg`.
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }.map_err(|e| format!("gemm: {e}"))
    })?;
    Ok(DeviceCeilings {
        copy_bytes_per_s: 2.0 * bytes as f64 / copy,
        gemm_flops: 2.0 * (n as f64).powi(3) / gemm,
    })
}
